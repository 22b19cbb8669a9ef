"""Argument plumbing shared by every subcommand: the store directory (a positional, or
``FSJOBSTORE_DIR``), options accepted before or after the subcommand, and exit codes."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

from .. import InvalidRequest, JobStore, StoreNotFound, parse_duration
from ._exit_codes import (  # re-exported: the commands take their exit codes from here
    FAILED as FAILED,
)
from ._exit_codes import (
    INTERRUPTED as INTERRUPTED,
)
from ._exit_codes import (
    NOT_FOUND as NOT_FOUND,
)
from ._exit_codes import (
    OK as OK,
)
from ._exit_codes import (
    REFUSED as REFUSED,
)
from ._exit_codes import (
    TIMED_OUT as TIMED_OUT,
)
from ._exit_codes import (
    USAGE as USAGE,
)

ENV_DIR = "FSJOBSTORE_DIR"


EXIT_CODES = f"""exit codes:
  {OK}    success
  {FAILED}    the operation failed (a storage error, a corrupt file; verify: the mount is unsafe;
       wait: the job failed or was cancelled)
  {USAGE}    bad arguments or input; nothing was changed
  {NOT_FOUND}    not found: no such job, or no store at DIR
  {REFUSED}    refused: the id is taken, the job is in the wrong state, a lease was lost, or
       init or create --init was pointed at a file, a directory that holds other files, or
       a path among another store's own directories
  {TIMED_OUT}    wait: the job did not end within --timeout
  {INTERRUPTED}  interrupted (Ctrl-C); the commands that run until stopped (worker, notify,
       scheduler, web, status --watch) stop cleanly on it and exit 0
"""

Handler = Callable[[argparse.Namespace], int]

SECONDS_MAX = 999_999_999  # the store takes fewer than 1e9 seconds for any delay or time limit (about 31 years)
MIN_LEASE = 0.5  # below it a heartbeat (lease / 4) would be due every few scheduler ticks of a busy host
EPOCH_MAX = 99_999_999_999  # the store's bound on run_at (the year 5138)


def number(*, low: float, high: float, integer: bool = False, above: bool = False,
           unit: str = "") -> Callable[[str], Any]:
    """The one check of every numeric option: argparse's ``type=``. A finite number (an integer
    when ``integer``) from ``low`` (or ``above`` it) to ``high``; anything else is a usage error
    that argparse prefixes with the option's name, and that says the range.

    Every option goes through here so that no ``nan``, ``inf`` or out-of-range value reaches the
    store or the runtime, where ``nan`` compares false to everything and would run forever."""
    kind = ("an integer" if integer else "a number") + (f" of {unit}" if unit else "")
    span = f"above {_show(low)} and at most {_show(high)}" if above else f"from {_show(low)} to {_show(high)}"

    if unit == "seconds" and not integer:  # a length of time: also as the library reads one (90s, 1h30m)
        span += " (or a duration: 90s, 15m, 1h30m)"

    def check(text: str) -> int | float:
        value: int | float
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            try:
                if unit != "seconds" or integer:
                    raise ValueError(text) from None
                value = parse_duration(text)
            except (ValueError, InvalidRequest):
                raise argparse.ArgumentTypeError(f"must be {kind} {span}, got {text!r}") from None
        if not math.isfinite(value) or not (value > low if above else value >= low) or value > high:
            raise argparse.ArgumentTypeError(f"must be {kind} {span}, got {text!r}")
        return value

    check.__name__ = "number"  # what argparse would name in an error of its own
    return check


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"  # 999999999, not 1e+09


def moment(text: str) -> float | datetime:
    """``--run-at``: epoch seconds (checked by :func:`number`), or an ISO-8601 time that says its
    timezone. A naive time is refused, as the API refuses one: which zone it meant is a guess."""
    try:
        float(text)
    except ValueError:
        pass
    else:
        seconds: float = number(low=0, high=EPOCH_MAX, unit="epoch seconds")(text)
        return seconds
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an ISO-8601 time with a timezone (2026-12-01T09:30:00+01:00, or ...Z for UTC) "
            f"or epoch seconds, got {text!r}") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no timezone, so it is ambiguous: add one (+01:00, or Z for UTC)")
    return when


def duration(text: str) -> float:
    """``--older-than``: a duration as the store reads every one (``parse_duration``: ``90s``,
    ``15m``, ``1h30m``, ``7d``, ``2w``, plain seconds); anything else is a usage error that
    argparse prefixes with the option's name."""
    try:
        return parse_duration(text)
    except InvalidRequest as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def delay(text: str) -> float:
    """``create --delay``: a duration as the library's ``create(delay=)`` takes it (``90s``,
    ``1h30m``, plain seconds), up to the store's limit for any delay."""
    seconds = duration(text)
    if seconds > SECONDS_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {SECONDS_MAX} seconds, got {text!r}")
    return seconds


def time_limit(text: str) -> float:
    """``create --timeout``: how long one attempt may run, a duration as ``delay``, above 0."""
    seconds = delay(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 (90s, 15m, 1h or plain seconds), got {text!r}")
    return seconds


def retention(text: str) -> float | str:
    """``--retain``: how long finished jobs are kept, a duration (``0``: removed as soon as they
    are final) or ``forever``; returned as ``JobStore``/``create`` take it."""
    try:
        seconds = parse_duration(text, forever=True)
    except InvalidRequest as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return "forever" if math.isinf(seconds) else seconds


def kept(seconds: float) -> str:
    """``store.retain`` as a person reads it: "kept 7 days", "kept forever", "removed at once"."""
    if math.isinf(seconds):
        return "kept forever"
    if seconds == 0:
        return "removed as soon as they are final"
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"kept {n} {unit}{'' if n == 1 else 's'}"
    return f"kept {seconds:g} second{'' if seconds == 1 else 's'}"


def retain_doc(seconds: float) -> float | str:
    """``store.retain`` in JSON: seconds, or "forever" (JSON has no infinity)."""
    return "forever" if math.isinf(seconds) else seconds


class Parser(argparse.ArgumentParser):
    """Usage errors exit with :data:`USAGE` and one line, as argparse does, but say which command."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: `--que x` taken for `--queue x` hides a typo.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

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
    environment when exactly it was left out. A command whose positionals depend on its options
    (``retry DIR ID`` or ``retry DIR --state S``) sets ``shape`` to choose them, or to refuse."""
    shape = getattr(ns, "shape", None)
    names: tuple[str, ...] = shape(ns, parser) if shape else ns.positionals
    ns.positionals = names
    given: list[str] = list(ns.args)
    if len(given) == len(names) - 1 and os.environ.get(ENV_DIR):
        given.insert(0, os.environ[ENV_DIR])
    if len(given) != len(names):
        wanted = " ".join(names)
        hint = "" if os.environ.get(ENV_DIR) else f" (or set {ENV_DIR} and leave DIR out)"
        parser.error(f"expected {wanted}{hint}; got {len(ns.args)} argument(s)")
    for name, value in zip(names, given, strict=True):
        setattr(ns, name.lower(), value)


def no_lock_takeover(p: argparse.ArgumentParser) -> None:
    """For the commands that take over dead holders' work (worker, notify, recover): what
    `fsjobstore verify` recommends where locks do not reach every host."""
    p.add_argument("--no-lock-takeover", dest="lock_takeover", action="store_const", const=False, default=None,
                   help="open with lock_takeover=False: a free lock does not prove its holder dead, so a holder's "
                        "work is taken over only after --lease-duration without heartbeats (what `fsjobstore "
                        "verify` recommends where locks do not reach every host; default: trust locks on local "
                        "filesystems only)")


def store_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``JobStore`` options a command line asked for; None leaves the store's own choice."""
    return {"durable": False if getattr(args, "no_fsync", False) else None,
            "lock_takeover": getattr(args, "lock_takeover", None)}


def open_store(args: argparse.Namespace, **more: Any) -> JobStore:
    """The store at DIR; a missing one is :class:`StoreNotFound` (exit 3), never made: a typo in
    DIR must not start a store where no worker looks (``init``, or ``create --init``, makes one)."""
    return JobStore(args.dir, create=False, **{**store_options(args), **more})


def make_store(path: str, **options: Any) -> JobStore:
    """Open the store at ``path``, making it if needed; a file or a directory of other files
    there is :class:`Refused` (exit 4), not "not found" (3), since the user named it, and so is
    a path among another store's own directories. A store made in another's root is made, with
    a warning: nothing of the outer store's is touched, but the two are easy to confuse."""
    outer = _enclosing_store(path)
    if outer is not None:
        root, inside = outer
        if inside:
            raise Refused(f"{path} is inside the store at {root}, among its own directories: "
                          "choose a path outside it")
        logging.getLogger("fsjobstore").warning(
            "%s is made inside the root of the store at %s: two stores in one tree are easy to confuse",
            path, root)
    try:
        return JobStore(path, create=True, **options)
    except StoreNotFound as exc:
        raise Refused(str(exc)) from None


MARKER = "fsjobstore.json"  # what makes a directory a store's root (FORMAT.md, "Files")


def _enclosing_store(path: str) -> tuple[str, bool] | None:
    """The store whose tree ``path`` would be made in, and whether it would be among that
    store's own entries (deeper than its root, or a name its root holds already) rather than a
    new name in its root."""
    here = os.path.abspath(path)
    parts: list[str] = []
    while True:
        parent = os.path.dirname(here)
        if parent == here:
            return None
        parts.insert(0, os.path.basename(here))
        here = parent
        if os.path.isfile(os.path.join(here, MARKER)):
            return here, len(parts) > 1 or os.path.lexists(os.path.join(here, parts[0]))

def log_level(p: argparse.ArgumentParser, default: str = "default INFO: one line per job") -> None:
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help=f"{default}; DEBUG adds tracebacks (of a module that cannot be imported, say)")
