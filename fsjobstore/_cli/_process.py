"""Commands that run: ``worker`` (handlers from a module of yours) and ``notify`` (deliveries)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from typing import Any

from .. import JobStore
from ..worker import Deliverer, Worker
from ._args import OK, UsageError, subcommand


def add(subparsers: Any) -> None:
    p = subcommand(subparsers, "worker", worker, help="run handlers for jobs (threads or processes) until stopped",
                   example="fsjobstore worker ./jobs --handler myapp.tasks:resize --queue images --concurrency 4",
                   description="Run a handler (a function of yours, taking a job context and returning its "
                               "value) for the jobs of some queues. SIGTERM or Ctrl-C stops it gracefully (a "
                               "second Ctrl-C: at once); SIGUSR1 pauses it, SIGUSR2 resumes it.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--handler", metavar="MODULE:FUNCTION", help="the handler for the --queue(s)")
    which.add_argument("--handlers", metavar="MODULE:OBJECT",
                       help="a Worker (its handlers) or a dict {queue: function} in your module")
    p.add_argument("--queue", action="append", dest="queues", metavar="QUEUE",
                   help="a queue to serve (repeat it; default with --handler: 'default'); with --handlers "
                        "it narrows and orders their queues")
    p.add_argument("--concurrency", type=int, default=1, help="jobs at once (default 1)")
    p.add_argument("--threads", action="store_true", help="run handlers in threads, not child processes")
    p.add_argument("--burst", action="store_true", help="stop as soon as no job is due (for cron)")
    p.add_argument("--max-jobs", type=int, default=None, metavar="N", help="stop after N jobs")
    p.add_argument("--max-seconds", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--grace", type=float, default=30.0, metavar="S",
                   help="seconds running jobs get to finish when stopping (default 30); then they are given back")
    p.add_argument("--name", default=None, help="the name `fsjobstore workers` shows (default host:pid)")
    _lease_duration(p)
    _log_level(p)

    p = subcommand(subparsers, "notify", notify, help="deliver results to the targets that asked for them",
                   example="fsjobstore notify ./jobs --handler myapp.hooks:deliver --burst",
                   description="Call your deliver(target, note) for every target waiting on a final job; "
                               "a target whose call raises is offered again after a backoff. Runs until "
                               "stopped, or with --burst until nothing is due (for cron).")
    p.add_argument("--handler", required=True, metavar="MODULE:FUNCTION", help="deliver(target, note)")
    p.add_argument("--burst", action="store_true", help="stop as soon as nothing is due")
    _lease_duration(p)
    _log_level(p)


def _lease_duration(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lease-duration", type=float, default=30.0, metavar="S",
                   help="seconds without heartbeats before another process may take over this one's jobs "
                        "(default 30; across hosts at least what `fsjobstore verify --peer` reports, MULTIHOST.md)")


def _log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO: one line per job")


def load(spec: str) -> Any:
    """``package.module:name`` of the user's code, importable from the current directory."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{spec!r} is not MODULE:NAME (for example myapp.tasks:resize)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the project you run it from
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself raised while it was imported: say where
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
        raise UsageError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}{where}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)


def worker(args: argparse.Namespace) -> int:
    handlers: dict[str, Any]
    if args.handler:
        fn = load(args.handler)
        if not callable(fn):
            raise UsageError(f"{args.handler} is not callable")
        handlers = {q: fn for q in (args.queues or ["default"])}
        queues = None
    else:
        obj = load(args.handlers)
        handlers = dict(obj.handlers) if isinstance(obj, Worker) else obj
        if not isinstance(handlers, dict) or not handlers:
            raise UsageError(f"{args.handlers} is neither a Worker with handlers nor a non-empty dict of them")
        queues = args.queues
    _configure_logging(args.log_level)
    with JobStore(args.dir, create=False, durable=False if getattr(args, "no_fsync", False) else None,
                  lease_duration=args.lease_duration) as store:
        run = Worker(store, handlers, concurrency=args.concurrency, mode="threads" if args.threads else "processes",
                     queues=queues, grace=args.grace, name=args.name)
        run.run(count=args.max_jobs, duration=args.max_seconds, burst=args.burst)
    return OK


def notify(args: argparse.Namespace) -> int:
    deliver = load(args.handler)
    _configure_logging(args.log_level)
    with JobStore(args.dir, create=False, lease_duration=args.lease_duration) as store:
        runner = Deliverer(store, deliver)
        delivered, failed = runner.run(burst=args.burst)
    logging.getLogger("fsjobstore.worker").info("delivered %d, will retry %d", delivered, failed)
    return OK
