"""The ``fsjobstore`` command: operate a store from the shell or cron.

It is built on fsjobstore's public API only (a test walks its imports). Every error a user can
cause ends as one line on stderr and a documented exit code, never a traceback, in one shape:
``fsjobstore COMMAND: KIND: message``. KIND is ``error`` for an error of the arguments, whoever
finds it (after the command's usage line, as argparse's own read; exit 2), ``refused`` for what
the command itself declines, and otherwise the exception's name (``JobNotFound``,
``InvalidState``, ``StorageError``), so a script can match it.
"""

from __future__ import annotations

import re
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

# The exit code of a Ctrl-C (128 + SIGINT, what a shell shows for a program it killed), from a
# module of constants alone, so that this one imports nothing a Ctrl-C could interrupt: the
# script `fsjobstore` imports it before main() runs, and everything else loads inside main().
from ._exit_codes import INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    import argparse

    from .. import __version__ as version
    from . import _interest, _jobs, _limit_commands, _ops, _process, _schedules, _status, _web
    from ._args import ENV_DIR, EXIT_CODES, Parser

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
    _ops.add(subparsers)
    _status.add(subparsers)
    _process.add(subparsers)
    _schedules.add(subparsers)
    _limit_commands.add(subparsers)
    _interest.add(subparsers)
    _web.add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The program (the ``fsjobstore`` script and ``python -m fsjobstore``): returns its exit code.

    A Ctrl-C ends as one line and :data:`INTERRUPTED` whenever it comes: while the command's
    modules load (they are imported in here, not at the top, for that reason), while arguments
    are parsed, while the store opens or the command runs. It leaves SIGINT ignored when it
    returns, since what follows is the interpreter's exit: call it as a program's last act."""
    # RACE: a Ctrl-C in the few instructions between the script's import of this module and the
    # try below (a pending signal is raised as soon as this function's frame starts) escapes as
    # Python's own KeyboardInterrupt: no code of ours runs there to catch it.
    try:
        try:
            return _main(argv)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
            print("fsjobstore: interrupted", file=sys.stderr)
            return INTERRUPTED
        finally:
            # The command is over and its exit code chosen: a Ctrl-C from here on (the
            # interpreter's own shutdown) must neither change it nor print a traceback.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        # RACE: a second Ctrl-C in the few bytecodes before either signal.signal() above
        # escapes them; it lands here, before anything was printed, so it is said once.
        print("fsjobstore: interrupted", file=sys.stderr)
        return INTERRUPTED


# The commands that run the user's handlers or delivery code: what that code prints is its own
# (colours included), so their streams are left as they are; their own lines are log records,
# which the log formatter escapes. Every other command's output goes through SafeText.
_RUNS_USER_CODE = frozenset({"worker", "notify", "scheduler", "web"})


def _main(argv: Sequence[str] | None) -> int:
    import contextlib
    import logging
    import os

    from ._args import OK, REFUSED, USAGE, Refused, UsageError, bind
    from ._terminal import SafeText, log_to_terminal, printable

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sub: argparse.ArgumentParser = args.parser
    if extra:
        # Positionals typed after options (`create DIR --queue q REQUEST`): argparse took the ones
        # before the options only. They are the command's, in the order typed; what is left is
        # an option the command does not have.
        args.args = [*args.args, *(e for e in extra if not e.startswith("-"))]
        extra = [e for e in extra if e.startswith("-")]
    if extra:  # argparse would blame the top-level parser: show the usage of the command that was typed
        typed = list(sys.argv[1:] if argv is None else argv)
        before = typed[:typed.index(args.command)] if args.command in typed else []
        misplaced = [e for e in extra if e in before and e.split("=", 1)[0] in sub._option_string_actions]
        if misplaced:  # `fsjobstore --json stats DIR`: the command has it, typed before the command
            sub.error(f"{misplaced[0]} goes after the command: fsjobstore {args.command} {misplaced[0]} ...")
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    bind(args, sub)
    if not logging.getLogger().handlers:
        # A warning reads as an error line does, the command first and the level as its KIND.
        log_to_terminal(logging.WARNING, f"fsjobstore {args.command}: %(levelname)s: %(message)s")
    if args.command == "verify" and signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN,
                                                                              signal.default_int_handler):
        # fsjobstore's import ends a Ctrl-C at once (fsjobstore/__init__.py says why), and it stays
        # so for every command: what they do on disk is safe at any instant, as under SIGKILL, and
        # a KeyboardInterrupt can be discarded by Python (a trial saw `wait` go on, 1 run in 250).
        # worker and notify install their own graceful handlers when they run. verify removes
        # its scratch files on the way out, so for it Ctrl-C is a KeyboardInterrupt again.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if args.command in _RUNS_USER_CODE:
            code: int = args.run_command(args)
        else:
            with contextlib.redirect_stdout(SafeText(sys.stdout)), contextlib.redirect_stderr(SafeText(sys.stderr)):
                code = args.run_command(args)
        return code
    except BrokenPipeError:
        # The reader went away (`fsjobstore get ... --json | head -1`): nothing is wrong with
        # the store. Point stdout at /dev/null so the interpreter's final flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return OK
    except Refused as exc:
        print(f"fsjobstore {args.command}: refused: {printable(str(exc))}", file=sys.stderr)
        return REFUSED
    except Exception as exc:  # every other error: one line, and its exit code
        code = USAGE if isinstance(exc, UsageError) else exit_code(exc)
        if code == USAGE:
            # What the arguments caused (a bad queue name, a weaker durability, a handler module
            # that cannot be imported) reads as argparse's own errors do, whoever found it.
            sub.print_usage(sys.stderr)
            print(f"fsjobstore {args.command}: error: {printable(_as_typed(sub, str(exc)))}", file=sys.stderr)
        else:
            print(f"fsjobstore {args.command}: {type(exc).__name__}: {printable(str(exc))}", file=sys.stderr)
        logging.getLogger("fsjobstore").debug("details", exc_info=True)
        return code


def _as_typed(sub: argparse.ArgumentParser, message: str) -> str:
    """The library names its keywords ("unique_key must be ...", "so job_id and unique_key cannot
    be given"); the shell's user typed options: name those ("--unique-key must be ..."). A
    keyword leads the message, or has an underscore (no English word has one: "queue" and
    "priority" elsewhere in a message are words, not options)."""
    for action in sub._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if not long:
            continue
        if message.split(" ", 1)[0] == action.dest:
            message = long[0] + message[len(action.dest):]
        if "_" in action.dest:
            message = re.sub(rf"(?<![\w-]){re.escape(action.dest)}\b", long[0], message)
    return message


def exit_code(exc: BaseException) -> int:
    from .. import InvalidJobId, InvalidRequest, InvalidState, JobExists, JobNotFound, LeaseLost, StoreNotFound
    from ._args import FAILED, NOT_FOUND, REFUSED, USAGE

    if isinstance(exc, JobNotFound | StoreNotFound):
        return NOT_FOUND
    if isinstance(exc, JobExists | InvalidState | LeaseLost):
        return REFUSED
    if isinstance(exc, InvalidRequest | InvalidJobId):
        return USAGE
    return FAILED
