"""Periodic jobs from the shell: ``scheduler`` (run a Schedule of yours) and ``schedules`` (what
a store knows of its schedules: last and next tick)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from typing import Any

from .. import InvalidRequest, ScheduleInfo
from . import _render as render
from ._args import OK, UsageError, log_level, open_store, store_options, subcommand
from ._process import load
from ._terminal import configure_logging

log = logging.getLogger("fsjobstore.schedule")


def add(subparsers: Any) -> None:
    p = subcommand(subparsers, "scheduler", scheduler,
                   help="make the jobs of periodic schedules (every N seconds, cron) as they fall due",
                   example="fsjobstore scheduler ./jobs --schedule myapp.jobs:schedule",
                   description="Run the periodic schedules declared in your code (a fsjobstore.schedule.Schedule, "
                               "or a Worker whose every()/cron() declared them): each tick becomes one job, "
                               "however many schedulers and workers run the same schedules on the directory. "
                               "Runs until SIGTERM or Ctrl-C; --once makes what is due and exits (for cron).")
    p.add_argument("--schedule", required=True, metavar="MODULE:OBJECT",
                   help="a Schedule in your module, or a Worker (its schedule)")
    p.add_argument("--once", action="store_true", help="one pass: make the ticks due now, then exit")
    log_level(p, "default INFO: one line per tick made")

    subcommand(subparsers, "schedules", schedules, reads=True,
               help="list the periodic schedules of a store with their last and next tick",
               example="fsjobstore schedules ./jobs --json")


def scheduler(args: argparse.Namespace) -> int:
    from .. import JobStore, Worker
    from ..schedule import Schedule

    configure_logging(args.log_level)
    obj = load(args.schedule)
    schedule = obj.schedule if isinstance(obj, Worker) else obj
    if not isinstance(schedule, Schedule):
        raise UsageError(f"{args.schedule} is neither a fsjobstore.schedule.Schedule nor a Worker "
                         f"(it is a {type(obj).__name__})")
    if not len(schedule):
        raise UsageError(f"{args.schedule} declares no periodic jobs: add some with every() or cron()")
    with JobStore(args.dir, create=False, **store_options(args)) as store:
        if args.once:
            schedule.declare(store)
            wait = schedule.run_pending(store)
            # Said even when nothing was due, so that a quiet run does not look like a failure.
            log.info("pass done; the next tick of these schedules is due in %.0fs", wait)
            return OK
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        schedule.run(store, stop=stop)
    return OK


def schedules(args: argparse.Namespace) -> int:
    now = time.time()
    with open_store(args) as store:
        found = store.schedules()
    rows = [_row(info, now) for info in found]
    if args.json:
        render.print_json(rows)
    elif not rows:
        print("no schedules: none was ever run on this store (fsjobstore scheduler, or a Worker's every()/cron())")
    else:
        for r in rows:
            print(f"{r['name']}  {r['spec']}  queue {r['queue']}  last {render.when(r['last_tick'])}"
                  f"{' (' + r['last_job'] + ')' if r['last_job'] else ''}  next {render.when(r['next_tick'])}"
                  f"{'' if r['next_tick'] is not None else ' (' + r['next_unknown'] + ')'}")
    return OK


def _row(info: ScheduleInfo, now: float) -> dict[str, Any]:
    from ..schedule import timing_of

    row: dict[str, Any] = {"name": info.name, "spec": info.spec, "queue": info.queue, "since": info.since,
                           "last_tick": info.last_tick, "last_job": info.last_job, "next_tick": None}
    try:
        row["next_tick"] = timing_of(info.spec).next_after(max(now, info.last_tick or 0))
    except (InvalidRequest, ModuleNotFoundError) as exc:  # a spec of a later version; cron without cronsim
        row["next_unknown"] = str(exc)
    return row
