"""Purge rate, and a worker's drain rate while a purge runs against without (issue 24).

    python bench/purge.py [--finished 20000] [--pending 20000] [--durable] [--no-logs]

1. Fills a fresh store with ``--finished`` fulfilled jobs (each with a run log line, as a worker
   leaves them) and times ``store.purge()`` of them all in this process: jobs/s.
2. Fills ``--pending`` pending jobs and times one worker process draining them (claim + fulfil)
   alone: jobs/s.
3. Fills ``--finished`` fulfilled jobs and ``--pending`` pending ones again, starts the same
   worker, and runs the purge at the same time in this process: the worker's drain rate while
   the purge runs (the jobs it fulfils in the time the purge takes, over that time), and the
   purge rate beside it.

Prints one line per figure and the ratio (drain during a purge / drain alone). Both rates are
wall-clock rates on this machine; run it alone (2 cores here).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fsjobstore import JobStore

WORKER = """
import sys, time
from fsjobstore import JobStore
root, out = sys.argv[1], sys.argv[2]
with JobStore(root, durable=None) as store, open(out, "w") as log:
    print("ready", flush=True)
    sys.stdin.readline()
    idle = 0
    while idle < 2:
        lease = store.pull_work(timeout=0.2)
        if lease is None:
            idle += 1
            continue
        idle = 0
        lease.fulfill(None)
        log.write(f"{time.monotonic()}\\n")
"""


def fill_finished(store: JobStore, n: int, logs: bool = True) -> None:
    for i in range(n):
        store.create(i)
    while (lease := store.pull_work()) is not None:
        if logs:
            lease.log("one line, as a handler leaves")  # a runs/<id>/ directory: removal rmdirs it
        lease.fulfill({"i": 1})


def fill_pending(store: JobStore, n: int) -> None:
    for i in range(n):
        store.create(i, queue="work")


def start_worker(root: str, out: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", WORKER, root, out], text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def fulfil_times(out: str) -> list[float]:
    with open(out) as fh:
        return [float(line) for line in fh if line.strip()]


def run(finished: int, pending: int, durable: bool, logs: bool) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        # 1. purge alone
        root = os.path.join(scratch, "alone")
        with JobStore(root, durable=durable) as store:
            fill_finished(store, finished, logs)
            t0 = time.perf_counter()
            removed = store.purge()
            took = time.perf_counter() - t0
        assert removed == finished, removed
        print(f"purge alone: {removed} finished jobs in {took:.2f} s = {removed / took:,.0f} jobs/s")

        # 2. drain alone
        root = os.path.join(scratch, "drain")
        with JobStore(root, durable=durable) as store:
            fill_pending(store, pending)
        out = os.path.join(scratch, "drain.log")
        worker = start_worker(root, out)
        assert worker.stdin is not None
        t0 = time.monotonic()
        worker.stdin.write("go\n")
        worker.stdin.flush()
        worker.wait()
        times = fulfil_times(out)
        alone = len(times) / (times[-1] - t0)
        print(f"drain alone: {len(times)} jobs in {times[-1] - t0:.2f} s = {alone:,.0f} jobs/s")

        # 3. both at once
        root = os.path.join(scratch, "both")
        with JobStore(root, durable=durable) as store:
            fill_finished(store, finished, logs)
            fill_pending(store, pending)
            out = os.path.join(scratch, "both.log")
            worker = start_worker(root, out)
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
            t0 = time.monotonic()
            removed = store.purge(states="fulfilled")
            t1 = time.monotonic()
            worker.wait()
        times = fulfil_times(out)
        during = sum(1 for t in times if t <= t1) / (t1 - t0)
        print(f"purge beside a draining worker: {removed} jobs in {t1 - t0:.2f} s = {removed / (t1 - t0):,.0f} jobs/s")
        print(f"drain during the purge: {sum(1 for t in times if t <= t1)} jobs in {t1 - t0:.2f} s = "
              f"{during:,.0f} jobs/s = {during / alone:.2f}x of the drain alone")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=20_000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--durable", action="store_true", help="fsync (default: durable=False)")
    parser.add_argument("--no-logs", action="store_true", help="jobs that wrote no log line (no runs/<id>/)")
    args = parser.parse_args()
    print(f"fsjobstore purge bench: {args.finished} finished, {args.pending} pending, durable={args.durable}, "
          f"logs={not args.no_logs}, commit {_commit()}, {time.strftime('%Y-%m-%d %H:%M')}")
    run(args.finished, args.pending, args.durable, not args.no_logs)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
