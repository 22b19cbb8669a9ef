"""Disk and drain rate under retention: a real measurement, not a test (issue 24, "Disk").

    python bench/retention.py [--jobs 100000] [--procs 2] [--drain 20000] [--dir DIR]

Part 1 (disk): ``--procs`` processes each create, claim and fulfil their share of ``--jobs``
jobs (``durable=False``) in one store made with ``retain=0``, logging one line per job (so each
job has a ``runs/`` file too); then ``recover()`` passes run until nothing is left to remove. It
prints ``du -sb`` of that store against a fresh, empty store's.

Part 2 (drain rate): ``--drain`` jobs are queued, and a worker (one process, claim + fulfil)
drains them once in a store whose retention has a backlog of ``--drain`` expired final jobs to
remove in its background thread, and once in one with no backlog (``retain="forever"``). It
prints both rates and their ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import tempfile
import time
from pathlib import Path

from fsjobstore import JobStore


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def run_jobs(root: str, count: int) -> None:
    with JobStore(root, durable=False) as store:
        for i in range(count):
            store.create({"n": i})
            lease = store.pull_work()
            assert lease is not None
            lease.log("one line")
            lease.fulfill(b"done")


def disk(base: Path, jobs: int, procs: int) -> None:
    fresh, used = base / "fresh", base / "used"
    JobStore(fresh, retain=0, durable=False).close()
    JobStore(used, retain=0, durable=False).close()
    began = time.monotonic()
    workers = [multiprocessing.Process(target=run_jobs, args=(str(used), jobs // procs)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    ran = time.monotonic() - began
    with JobStore(used, durable=False) as store:
        idle = 0
        while idle < 3:  # a pass may remove nothing while another holds the lock: a few in a row
            idle = 0 if store.recover(deep=False).removed else idle + 1
        left = store.statistics()
    print(f"disk: {jobs} jobs run by {procs} processes in {ran:.1f} s; left: {left.fulfilled} fulfilled; "
          f"du -sb fresh {du(fresh)} B, after {du(used)} B, difference {du(used) - du(fresh)} B")


def drain(base: Path, count: int, backlog: bool) -> float:
    root = base / ("backlog" if backlog else "none")
    retain: float | str = 0 if backlog else "forever"
    with JobStore(root, durable=False, retain=retain) as store:
        for i in range(count):  # the backlog: final jobs, already expired when the drain starts
            store.create({"old": i})
        while (lease := store.pull_work()) is not None:
            lease.fulfill(b"old")
    with JobStore(root, durable=False, retain=retain) as store:
        for i in range(count):
            store.create({"n": i})
        began = time.monotonic()
        done = 0
        while (lease := store.pull_work()) is not None:  # the first pull starts the retention thread
            lease.fulfill(b"v")
            done += 1
        rate = done / (time.monotonic() - began)
        left = store.statistics().fulfilled
    print(f"drain: {count} jobs, {'with' if backlog else 'without'} a retention backlog of {count}: "
          f"{rate:.0f} claim+fulfil/s; {left} final jobs left at the end")
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--drain", type=int, default=20_000)
    ap.add_argument("--dir", default=".", help="where to make the stores (default: here; not a git worktree)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fsjs-retention-", dir=args.dir) as tmp:
        base = Path(tmp)
        disk(base, args.jobs, args.procs)
        without = drain(base, args.drain, backlog=False)
        with_backlog = drain(base, args.drain, backlog=True)
        print(f"drain ratio, with a retention backlog / without: {with_backlog / without:.2f}x")


if __name__ == "__main__":
    main()
