"""A long drain: does the claim+commit rate decay as the store's history builds up?

    python bench/long_drain.py                        # 200,000 jobs, 2 workers, retain=60, a purge from the start
    python bench/long_drain.py --jobs 50000 --dir /tmp
    python bench/long_drain.py --backlog 50000          # the purge has final jobs to remove from its first pass

A producer fills the store with ``--jobs`` jobs (``retain=--retain`` seconds, durable=False), the
fill's writes are flushed (``os.sync``), then ``--workers`` fresh worker processes drain it
(``pull_work(timeout=0)`` + ``fulfill``) while another process purges final jobs older than
``--purge-after`` seconds (default 0: from the start, so that every stretch of the drain shares
the two cores with it alike) every half second, and retention runs in the workers as it does in
any store (its pass removes jobs once their ``retain`` has passed). With ``--backlog N``, N jobs of
another queue are made and run to their end before the drain, so the purge removes jobs from its
first pass on (without it, the first stretch is the only one whose two cores the purge does not
share, and the last against the first is the purge's share of the CPU). Each worker notes when it finished
each of its jobs; printed: the drain rate of every ``--every`` jobs in the order they finished,
and the last one as a ratio to the first (a rate that falls as the disk's free-inode history
builds up shows as a ratio well below 1). Run from a revision's tree (``PYTHONPATH=tree python -P
bench/long_drain.py``) to measure that revision.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from typing import Any

import fsjobstore
from fsjobstore import JobStore

CTX = mp.get_context("fork")


def _fill(root: str, first: int, n: int, retain: float) -> None:
    with JobStore(root, durable=False) as s:
        for i in range(first, first + n):
            s.create({"i": i}, retain=retain)


def _backlog(root: str, n: int, retain: float) -> None:
    with JobStore(root, durable=False) as s:
        for i in range(n):
            s.create({"backlog": i}, queue="backlog", retain=retain)
        while (lease := s.pull_work(queues="backlog")) is not None:
            lease.fulfill(b"")


def _work(root: str, start: Any, out: Any) -> None:
    done: list[tuple[float, int]] = []
    with JobStore(root, durable=False) as s:
        start.wait()
        idle = 0
        while idle < 2:
            lease = s.pull_work(timeout=0)
            if lease is None:
                idle += 1
                continue
            idle = 0
            lease.fulfill(b"")
            done.append((time.monotonic(), lease.request["i"]))
    out.put(done)


def _purge(root: str, after: float, stop: Any, out: Any) -> None:
    removed = 0
    with JobStore(root, durable=False) as s:
        while not stop.is_set():
            removed += s.purge(older_than=after)
            time.sleep(0.5)
    out.put(removed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--retain", type=float, default=60.0)
    ap.add_argument("--purge-after", type=float, default=0.0)
    ap.add_argument("--every", type=int, default=10_000)
    ap.add_argument("--backlog", type=int, default=0, help="final jobs made before the drain, for the purge")
    ap.add_argument("--dir", default=None, help="where to make the store (default: a temp dir here)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="long-drain-", dir=args.dir or ".")
    root = os.path.join(base, "s")
    try:
        JobStore(root, durable=False).close()
        t = time.perf_counter()
        half = args.jobs // 2
        fillers = [CTX.Process(target=_fill, args=(root, k * half, half + k * (args.jobs % 2), args.retain))
                   for k in range(2)]
        for p in fillers:
            p.start()
        for p in fillers:
            p.join()
        if args.backlog:
            _backlog(root, args.backlog, args.retain)
        fill = time.perf_counter() - t
        os.sync()
        start, stop, out, purged = CTX.Event(), CTX.Event(), CTX.Queue(), CTX.Queue()
        workers = [CTX.Process(target=_work, args=(root, start, out)) for _ in range(args.workers)]
        purger = CTX.Process(target=_purge, args=(root, args.purge_after, stop, purged))
        for p in [*workers, purger]:
            p.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        start.set()
        done = sorted(x for _ in workers for x in out.get())
        times = [t for t, _ in done]
        taken = [i for _, i in done]
        stop.set()
        removed = purged.get()
        for p in [*workers, purger]:
            p.join()
        print(f"fsjobstore from {os.path.dirname(fsjobstore.__file__)}, in {base}, {time.strftime('%Y-%m-%d %H:%M')}")
        print(f"{len(times):,} of {args.jobs:,} jobs drained by {args.workers} workers (filled in {fill:.0f} s, "
              f"{args.backlog:,} final jobs before it); {removed:,} purged meanwhile")
        dup, lost = len(taken) - len(set(taken)), args.jobs - len(set(taken))
        if dup or lost:
            raise SystemExit(f"not exactly once: {dup} duplicates, {lost} lost")
        rates = []
        prev = t0
        for k in range(args.every - 1, len(times), args.every):
            rates.append(args.every / (times[k] - prev))
            prev = times[k]
        for k, r in enumerate(rates):
            print(f"  jobs {k * args.every + 1:>9,}-{(k + 1) * args.every:<9,} {r:9,.0f} jobs/s")
        if rates:
            print(f"last {args.every:,} against the first: {rates[-1] / rates[0]:.2f}x; "
                  f"slowest against the first: {min(rates) / rates[0]:.2f}x")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
