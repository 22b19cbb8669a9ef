"""Argument plumbing shared by every subcommand: the store directory (a positional, or
``FSJOBSTORE_DIR``), options accepted before or after the subcommand, and exit codes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

ENV_DIR = "FSJOBSTORE_DIR"

# Exit codes (also listed in ``fsjobstore --help``).
OK = 0
FAILED = 1  # the operation failed: a storage error, a corrupt file, verify found the mount unsafe
USAGE = 2  # bad arguments or input: nothing was changed
NOT_FOUND = 3  # no such job, or no store at that directory
REFUSED = 4  # the store refused: the id is taken, the job is in the wrong state, the lease was lost
TIMED_OUT = 5  # wait gave up before the job ended
INTERRUPTED = 130

EXIT_CODES = f"""exit codes:
  {OK}    success
  {FAILED}    the operation failed (a storage error, a corrupt file; verify: the mount is unsafe;
       wait: the job failed or was cancelled)
  {USAGE}    bad arguments or input; nothing was changed
  {NOT_FOUND}    not found: no such job, or no store at DIR
  {REFUSED}    refused: the id is taken, the job is in the wrong state, a lease was lost, or
       init or create was pointed at a file or a directory that holds other files
  {TIMED_OUT}    wait: the job did not end within --timeout
  {INTERRUPTED}  interrupted (Ctrl-C)
"""

Handler = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """Usage errors exit with :data:`USAGE` and one line, as argparse does, but say which command."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


class UsageError(Exception):
    """Bad input found after parsing (a JSON argument that is not JSON, say)."""


class Refused(Exception):
    """A command that makes a store was pointed at a file, or at a directory of other files:
    :data:`REFUSED`, not "not found", since the user named it on purpose."""


def subcommand(subparsers: Any, name: str, handler: Handler, *, help: str, example: str,
               positionals: tuple[str, ...] = (), reads: bool = False, store_options: bool = True,
               description: str | None = None) -> argparse.ArgumentParser:
    """Add a subcommand whose positionals are ``[DIR] *positionals`` (DIR may come from
    FSJOBSTORE_DIR). ``reads``: it prints something, so it takes ``--json``."""
    names = ("DIR", *positionals)
    p: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description or help[:1].upper() + help[1:] + ".",
        epilog=f"example:\n  {example}\n\nDIR may be left out when {ENV_DIR} is set.",
        formatter_class=argparse.RawDescriptionHelpFormatter, usage=_usage(name, names),
    )
    p.add_argument("args", nargs="*", metavar="ARG", help=argparse.SUPPRESS)
    if store_options:
        p.add_argument("--no-fsync", action="store_true", default=argparse.SUPPRESS,
                       help="open with durable=False (refused by a store created durable)")
    if reads:
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run_command=handler, positionals=names, parser=p)
    return p


def _usage(name: str, names: tuple[str, ...]) -> str:
    shown = " ".join(["[DIR]" if n == "DIR" else n for n in names])
    return f"fsjobstore {name} [options] {shown}"


def bind(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Give each positional its name on ``ns`` (``dir``, ``job_id``, ...), taking DIR from the
    environment when exactly it was left out."""
    names: tuple[str, ...] = ns.positionals
    given: list[str] = list(ns.args)
    if len(given) == len(names) - 1 and os.environ.get(ENV_DIR):
        given.insert(0, os.environ[ENV_DIR])
    if len(given) != len(names):
        wanted = " ".join(names)
        hint = "" if os.environ.get(ENV_DIR) else f" (or set {ENV_DIR} and leave DIR out)"
        parser.error(f"expected {wanted}{hint}; got {len(ns.args)} argument(s)")
    for name, value in zip(names, given, strict=True):
        setattr(ns, name.lower(), value)
