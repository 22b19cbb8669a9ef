"""Purge rate, and a worker's drain rate while a purge runs against without (issue 24).

    python bench/purge.py [--finished 20000] [--pending 20000] [--durable] [--no-logs] [--rounds 2]

1. Fills a fresh store with ``--finished`` fulfilled jobs (each with a run log line, as a worker
   leaves them) and times ``store.purge()`` of them all in this process: jobs/s.
2. Fills ``--pending`` pending jobs and times one worker process draining them (claim + fulfil)
   alone: jobs/s.
3. Fills ``--finished`` fulfilled jobs and ``--pending`` pending ones again, starts the same
   worker, and runs the purge at the same time in this process: the worker's drain rate while
   the purge runs (the jobs it fulfils while both run, over that time), and the purge rate
   beside it.

2 and 3 are repeated ``--rounds`` times in turn. Prints one line per figure. Both rates are
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import commit

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


def run(finished: int, pending: int, durable: bool, logs: bool, rounds: int) -> None:
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

        for round_ in range(rounds):  # alone and beside a purge in turn: the disk's weather changes
            drain_alone(scratch, pending, durable, round_)
            drain_beside_purge(scratch, finished, pending, durable, logs, round_)


def drain_alone(scratch: str, pending: int, durable: bool, round_: int) -> float:
    root = os.path.join(scratch, f"drain{round_}")
    with JobStore(root, durable=durable) as store:
        fill_pending(store, pending)
    out = os.path.join(scratch, f"drain{round_}.log")
    worker = start_worker(root, out)
    assert worker.stdin is not None
    t0 = time.monotonic()
    worker.stdin.write("go\n")
    worker.stdin.flush()
    worker.wait()
    times = fulfil_times(out)
    alone = len(times) / (times[-1] - t0)
    print(f"round {round_}: drain alone: {len(times)} jobs in {times[-1] - t0:.2f} s = {alone:,.0f} jobs/s")
    return alone


def drain_beside_purge(scratch: str, finished: int, pending: int, durable: bool, logs: bool, round_: int) -> float:
    root = os.path.join(scratch, f"both{round_}")
    with JobStore(root, durable=durable) as store:
        fill_finished(store, finished, logs)
        fill_pending(store, pending)
        out = os.path.join(scratch, f"both{round_}.log")
        worker = start_worker(root, out)
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
        t0 = time.monotonic()
        removed = store.purge(states="fulfilled")
        t1 = time.monotonic()
        worker.wait()
    times = fulfil_times(out)
    # Both ran from t0 until the first of them ended: the drain rate over that stretch.
    end = min(t1, times[-1])
    ran = sum(1 for t in times if t <= end)
    during = ran / (end - t0)
    print(f"round {round_}: purge beside a draining worker: {removed} jobs in {t1 - t0:.2f} s = "
          f"{removed / (t1 - t0):,.0f} jobs/s; the drain meanwhile: {ran} jobs in {end - t0:.2f} s = "
          f"{during:,.0f} jobs/s")
    return during


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=20_000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--durable", action="store_true", help="fsync (default: durable=False)")
    parser.add_argument("--rounds", type=int, default=2, help="drain alone / beside a purge, in turn")
    parser.add_argument("--no-logs", action="store_true", help="jobs that wrote no log line (no runs/<id>/)")
    args = parser.parse_args()
    measured = commit(os.path.dirname(os.path.abspath(__file__))) or "?"
    print(f"fsjobstore purge bench: {args.finished} finished, {args.pending} pending, durable={args.durable}, "
          f"logs={not args.no_logs}, commit {measured}, {time.strftime('%Y-%m-%d %H:%M')}")
    run(args.finished, args.pending, args.durable, not args.no_logs, args.rounds)


if __name__ == "__main__":
    main()
