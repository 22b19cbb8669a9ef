"""Commands that run: ``worker`` (handlers from a module of yours) and ``notify`` (deliveries).

The worker runtime is imported inside the commands that run it, not here: the other commands
(``get``, ``stats``, ...) never load it."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any

from ._args import (
    MIN_LEASE,
    OK,
    SECONDS_MAX,
    UsageError,
    log_level,
    no_lock_takeover,
    number,
    store_options,
    subcommand,
)
from ._terminal import configure_logging

log = logging.getLogger("fsjobstore.worker")

# What a Worker does when neither it nor an option says otherwise (Worker's own defaults).
WORKER_DEFAULTS: dict[str, Any] = {"concurrency": 1, "mode": "processes", "grace": 30.0}


def add(subparsers: Any) -> None:
    p = subcommand(subparsers, "worker", worker, help="run handlers for jobs (threads or processes) until stopped",
                   example="fsjobstore worker ./jobs --handler myapp.tasks:resize --queue images --concurrency 4",
                   description="Run a handler (a function of yours, taking a job context and returning its "
                               "value) for the jobs of some queues. SIGTERM or Ctrl-C stops it gracefully (a "
                               "second Ctrl-C: at once); SIGUSR1 pauses it, SIGUSR2 resumes it.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--handler", metavar="MODULE:FUNCTION", help="the handler for the --queue(s)")
    which.add_argument("--handlers", metavar="MODULE:OBJECT",
                       help="a dict {queue: function} in your module, or a Worker: then its handlers, hooks and "
                            "periodic jobs, and its concurrency, mode, grace and name unless the options below are "
                            "given (not its queues=: narrow them with --queue)")
    p.add_argument("--queue", action="append", dest="queues", metavar="QUEUE",
                   help="a queue to serve (repeat it; default with --handler: 'default'); with --handlers "
                        "it narrows and orders their queues")
    p.add_argument("--concurrency", type=number(low=1, high=1024, integer=True), default=None, metavar="N",
                   help="jobs at once, 1 to 1024 (default 1)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--threads", dest="mode", action="store_const", const="threads", default=None,
                      help="run handlers in threads, not child processes")
    mode.add_argument("--processes", dest="mode", action="store_const", const="processes",
                      help="run handlers in child processes (the default; overrides a Worker's mode)")
    mode.add_argument("--asyncio", dest="mode", action="store_const", const="asyncio",
                      help="run async def handlers as tasks on one event loop")
    p.add_argument("--burst", action="store_true", help="stop as soon as no job is due (for cron)")
    p.add_argument("--max-jobs", type=number(low=1, high=SECONDS_MAX, integer=True), default=None, metavar="N",
                   help="stop after N jobs")
    p.add_argument("--max-seconds", type=number(low=0, high=SECONDS_MAX, above=True, unit="seconds"),
                   default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--grace", type=number(low=0, high=SECONDS_MAX, unit="seconds"), default=None, metavar="S",
                   help="seconds running jobs get to finish when stopping (default 30); then they are given back")
    p.add_argument("--name", default=None, help="the name `fsjobstore workers` shows (default host:pid)")
    p.add_argument("--metrics-port", type=number(low=1, high=65535, integer=True), default=None, metavar="N",
                   help="serve the store's Prometheus metrics at http://HOST:N/metrics (needs fsjobstore[web]; "
                        "every endpoint shows the whole directory: scrape one)")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="the address --metrics-port listens on (default 127.0.0.1)")
    _lease_duration(p)
    no_lock_takeover(p)
    log_level(p)

    p = subcommand(subparsers, "notify", notify, help="deliver results to the targets that asked for them",
                   example="fsjobstore notify ./jobs --handler myapp.hooks:deliver --queue 'mail-*' --burst",
                   description="Call your deliver(target, note) for every target waiting on a final job; "
                               "a target whose call raises is offered again after a backoff. Runs until "
                               "stopped, or with --burst until nothing is due (for cron). SIGTERM or Ctrl-C "
                               "stops it once the delivery under way is done.")
    p.add_argument("--handler", required=True, metavar="MODULE:FUNCTION", help="deliver(target, note)")
    p.add_argument("--queue", action="append", dest="queues", metavar="QUEUE",
                   help="deliver only results of jobs in this queue, or in the queues a pattern such as "
                        "'mail-*' matches (repeat it; default: every queue)")
    p.add_argument("--burst", action="store_true", help="stop as soon as nothing is due")
    _lease_duration(p)
    no_lock_takeover(p)
    log_level(p)


def _lease_duration(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lease-duration", type=number(low=MIN_LEASE, high=SECONDS_MAX, unit="seconds"), default=30.0,
                   metavar="S",
                   help=f"seconds without heartbeats before another process may take over this one's jobs "
                        f"(default 30, at least {MIN_LEASE:g}; across hosts at least what `fsjobstore verify "
                        f"--peer` reports: the many-hosts guide)")


def load(spec: str) -> Any:
    """``package.module:name`` of the user's code, importable from the current directory."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{spec!r} is not MODULE:NAME (for example myapp.tasks:resize)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the project you run it from
    try:
        module = importlib.import_module(module_name)
    except SystemExit as exc:  # the module called sys.exit() while it was imported: it did not load
        log.debug("importing %r exited:", module_name, exc_info=exc)
        raise UsageError(f"importing {module_name!r} called sys.exit({exc.code!r}){_where(exc)}") from None
    except KeyboardInterrupt as exc:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            raise  # it may be a real Ctrl-C (main() called from Python, not the fsjobstore command)
        # Not a Ctrl-C: under the command line that ends the process at once (fsjobstore/__init__.py).
        # The module raised it itself, so it did not load.
        log.debug("importing %r raised KeyboardInterrupt:", module_name, exc_info=exc)
        raise UsageError(f"importing {module_name!r} raised KeyboardInterrupt{_where(exc)}") from None
    except Exception as exc:
        log.debug("importing %r failed:", module_name, exc_info=exc)  # the whole story, at DEBUG
        missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise UsageError(f"cannot import {module_name!r}: {exc} (run it from your project's directory, "
                             "or put the project on PYTHONPATH)") from None
        # The module itself raised while it was imported (or imported something that is not
        # there): say where in the user's code, not in the library frame that raised.
        said = exc.msg if isinstance(exc, SyntaxError) else exc  # its str() repeats the place
        raise UsageError(f"importing {module_name!r} raised {type(exc).__name__}: {said}{_where(exc)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def _where(exc: BaseException) -> str:
    """`` (file, line N)``: the last frame of the traceback that is the user's code, or failing
    that the last outside the standard library and fsjobstore, or the last one at all."""
    if isinstance(exc, SyntaxError) and exc.filename:  # the file never ran: no frame of it
        return f" ({exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    paths = sysconfig.get_paths()
    library = [paths["stdlib"], paths["platstdlib"], str(Path(__file__).resolve().parent.parent)]
    installed = [paths["purelib"], paths["platlib"]]

    def outside(frame: traceback.FrameSummary, dirs: list[str]) -> bool:
        if frame.filename.startswith("<"):  # <frozen os>, <frozen importlib._bootstrap>
            return False
        path = os.path.realpath(frame.filename)
        return not any(path.startswith(os.path.realpath(d) + os.sep) for d in dirs)

    for dirs in (library + installed, library):  # installed packages are the user's only if nothing else is
        for frame in reversed(frames):
            if outside(frame, dirs):
                return f" ({frame.filename}, line {frame.lineno})"
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def worker(args: argparse.Namespace) -> int:
    from .. import JobStore, check_queues
    from ..worker import Worker  # the runtime: loaded only by the commands that run it

    check_queues(args.queues, "--queue")  # named as the user typed it, before anything starts
    configure_logging(args.log_level)  # first: an import error of the handler module is logged at DEBUG
    given = {"concurrency": args.concurrency, "mode": args.mode, "grace": args.grace}
    base, source = dict(WORKER_DEFAULTS), "default"
    handlers: dict[str, Any]
    name = args.name
    loaded: Worker | None = None
    if args.handler:
        fn = load(args.handler)
        if not callable(fn):
            raise UsageError(f"{args.handler} is not callable")
        handlers = {q: fn for q in (args.queues or ["default"])}
        queues = None
    else:
        obj = load(args.handlers)
        if isinstance(obj, Worker):
            loaded = obj
            handlers = dict(obj.handlers)
            base = {"concurrency": obj.concurrency, "mode": obj.mode, "grace": obj.grace}
            source = f"the Worker {args.handlers}"
            name = name or obj.name
        else:
            handlers = obj
        if not isinstance(handlers, dict) or not handlers:
            raise UsageError(f"{args.handlers} is neither a Worker with handlers nor a non-empty dict of them")
        queues = args.queues
    used = {key: base[key] if value is None else value for key, value in given.items()}
    if source != "default":  # say what is used, and whence: an option given overrides the Worker's setting
        shown = {key: value if isinstance(value, str) else f"{value:g}" for key, value in used.items()}
        log.info("worker settings: %s", ", ".join(
            f"{key} {shown[key]} ({'--' + key if key != 'mode' else '--' + used[key]} given)"
            if given[key] is not None else f"{key} {shown[key]} (from {source})" for key in used))
    with JobStore(args.dir, create=False, lease_duration=args.lease_duration, **store_options(args)) as store:
        if loaded is not None and os.path.realpath(loaded.store.path) != os.path.realpath(store.path):
            log.info("the Worker %s was made on the store %s; its jobs come from %s (DIR)", args.handlers,
                     loaded.store.path, store.path)
        run = Worker(store, handlers, concurrency=used["concurrency"], mode=used["mode"], queues=queues,
                     grace=used["grace"], name=name, max_hung=loaded.max_hung if loaded else None)
        for event, hook in loaded.hooks if loaded else ():  # a Worker's hooks come with it
            run.on(event, hook)
        if loaded is not None:
            run.schedule = loaded.schedule  # and its periodic jobs (every(), cron())
        if args.metrics_port is not None:
            from ._web import serve_metrics

            serve_metrics(store, args.metrics_host, args.metrics_port)
        run.run(count=args.max_jobs, duration=args.max_seconds, burst=args.burst)
    return OK


def notify(args: argparse.Namespace) -> int:
    from .. import JobStore, check_queues
    from ..worker import Deliverer  # the runtime: loaded only by the commands that run it

    check_queues(args.queues, "--queue")
    configure_logging(args.log_level)
    deliver = load(args.handler)
    # The same store options as `worker`: a durable store refuses --no-fsync here too.
    with JobStore(args.dir, create=False, lease_duration=args.lease_duration, **store_options(args)) as store:
        runner = Deliverer(store, deliver, queues=args.queues)
        delivered, failed = runner.run(burst=args.burst)
    # Of this run only: what waits from earlier runs (in a backoff) the burst says above.
    log.info("delivered %d, will retry %d (this run's targets)", delivered, failed)
    return OK
