"""How far from first-in, first-out several claimers take one queue's jobs, and how fast.

    python bench/claim_order.py                        # 4,000 jobs, 8 and 16 processes
    python bench/claim_order.py --jobs 10000 --workers 2,4

Fills a store (``durable=False``) with jobs of one priority, then P processes drain it with
``pull_work`` + ``fulfill(b"")`` from one start signal. Each claim is stamped with the monotonic
clock; sorted by that, claim k took job j, and ``k - j`` is how many places late job j ran (one
claimer: 0 for every job). Prints the rate (jobs over the time from the start signal to the
last claim), and the median, p99 and largest lateness.
One claimer is exact; several can only be roughly in order (FORMAT.md, "Names"), and this
measures how roughly. Used on 2026-11-24 to choose the policy after a lost claim race
(PERFORMANCE.md, "W8 blocked").
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from typing import Any

from fsjobstore import JobStore


def _drain(root: str, go: Any, out: Any) -> None:
    store = JobStore(root, durable=False, watch=False, poll_interval=3600.0)
    go.wait()
    stamps = []
    while (lease := store.pull_work()) is not None:
        stamps.append((time.monotonic_ns(), lease.request))
        lease.fulfill(b"")
    store.close()
    out.put(stamps)


def measure(n: int, workers: int, base: str) -> tuple[float, int, int, int]:
    """(jobs/s, median, p99 and largest lateness in places) of one drain."""
    root = tempfile.mkdtemp(dir=base)
    with JobStore(root, durable=False, watch=False) as store:
        for i in range(n):
            store.create(i)
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_drain, args=(root, go, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every process has opened the store
    t0 = time.monotonic_ns()
    go.set()
    stamps = [s for _ in procs for s in out.get(timeout=600)]
    for p in procs:
        p.join()
    shutil.rmtree(root, ignore_errors=True)
    stamps.sort()
    order = [i for _, i in stamps]
    if sorted(order) != list(range(n)):
        raise RuntimeError(f"{len(order)} claims for {n} jobs, or a job claimed twice")
    late = sorted(k - i for k, i in enumerate(order))
    seconds = (stamps[-1][0] - t0) / 1e9
    return n / seconds, late[n // 2], late[int(0.99 * n)], late[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--workers", default="8,16", help="comma-separated process counts")
    ap.add_argument("--dir", default=".", help="where to make the stores")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="claimorder-", dir=args.dir)
    try:
        for w in (int(x) for x in args.workers.split(",")):
            rate, median, p99, worst = measure(args.jobs, w, base)
            print(f"{args.jobs:,} jobs, {w} processes: {rate:,.0f} jobs/s; places late: median {median}, "
                  f"p99 {p99}, largest {worst}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
