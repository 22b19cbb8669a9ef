"""The ``fsjobstore`` command: operate a store from the shell or cron.

It is built on fsjobstore's public API only (a test walks its imports). Every error a user can
cause ends as one line on stderr and a documented exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .. import InvalidJobId, InvalidRequest, InvalidState, JobExists, JobNotFound, LeaseLost, StoreNotFound
from .. import __version__ as version
from . import _jobs, _process
from ._args import (
    ENV_DIR,
    EXIT_CODES,
    FAILED,
    INTERRUPTED,
    NOT_FOUND,
    OK,
    REFUSED,
    USAGE,
    Parser,
    Refused,
    UsageError,
    bind,
)

log = logging.getLogger("fsjobstore")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fsjobstore",
        description="Operate an fsjobstore directory: a job store that lives in a directory.",
        epilog=f"{EXIT_CODES}\nDIR may be left out of any command when {ENV_DIR} is set. "
               "Run 'fsjobstore COMMAND --help' for a command's options and an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fsjobstore {version}")
    parser.add_argument("--no-fsync", action="store_true", default=False,
                        help="open with durable=False (refused by a store created durable)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    _jobs.add(subparsers)
    _process.add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sub: argparse.ArgumentParser = args.parser
    if extra:  # argparse would blame the top-level parser: show the usage of the command that was typed
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    bind(args, sub)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="fsjobstore: %(levelname)s: %(message)s")
    try:
        code: int = args.run_command(args)
        return code
    except KeyboardInterrupt:
        print("fsjobstore: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`fsjobstore get ... --json | head -1`): nothing is wrong with
        # the store. Point stdout at /dev/null so the interpreter's final flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return OK
    except Refused as exc:
        print(f"fsjobstore {args.command}: refused: {exc}", file=sys.stderr)
        return REFUSED
    except UsageError as exc:
        sub.print_usage(sys.stderr)
        print(f"fsjobstore {args.command}: error: {exc}", file=sys.stderr)
        return USAGE
    except Exception as exc:  # every other error: one line, and its exit code
        print(f"fsjobstore: {type(exc).__name__}: {exc}", file=sys.stderr)
        log.debug("details", exc_info=True)
        return exit_code(exc)


def exit_code(exc: BaseException) -> int:
    if isinstance(exc, JobNotFound | StoreNotFound):
        return NOT_FOUND
    if isinstance(exc, JobExists | InvalidState | LeaseLost):
        return REFUSED
    if isinstance(exc, InvalidRequest | InvalidJobId):
        return USAGE
    return FAILED

