"""Wake-up latency of an async ``pull_work`` against the blocking one, in one run.

    python bench/aio_wakeup.py [--jobs 200] [--rounds 3] [--dir /tmp]

A waiter process pulls with ``timeout=10`` (``JobStore.pull_work``, or
``AsyncJobStore.pull_work`` on an event loop); this process creates one job every 20 ms, each
carrying ``time.monotonic()`` (one clock for every process of a host); the waiter records how
long after each create its pull returned the job. Rounds alternate the two waiters, each on a
fresh store; figures are p50 and p99 over every job of every round, and the ratio async / sync.
The issue's target: within 1.5x.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from typing import Any

from fsjobstore import JobStore
from fsjobstore.aio import AsyncJobStore


def _sync_waiter(root: str, n: int, q: Any) -> None:
    with JobStore(root, durable=False, poll_interval=5.0) as s:
        s.pull_work()
        q.put("ready")
        lat = []
        for _ in range(n):
            lease = s.pull_work(timeout=10)
            assert lease is not None
            lat.append(time.monotonic() - lease.request["t"])
            lease.fulfill(b"")
        q.put(lat)


def _async_waiter(root: str, n: int, q: Any) -> None:
    async def main() -> None:
        async with AsyncJobStore(root, durable=False, poll_interval=5.0) as s:
            await s.pull_work()
            q.put("ready")
            lat = []
            for _ in range(n):
                lease = await s.pull_work(timeout=10)
                assert lease is not None
                lat.append(time.monotonic() - lease.request["t"])
                lease.fulfill(b"")
            q.put(lat)

    asyncio.run(main())


def one_round(base: str, waiter: Any, n: int) -> list[float]:
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    root = tempfile.mkdtemp(dir=base)
    JobStore(root, durable=False).close()
    p = ctx.Process(target=waiter, args=(root, n, q))
    p.start()
    q.get(timeout=30)
    time.sleep(0.3)  # the waiter is asleep in its pull
    with JobStore(root, durable=False) as s:
        for _ in range(n):
            s.create({"t": time.monotonic()})
            time.sleep(0.02)
    lat: list[float] = q.get(timeout=60)
    p.join()
    return lat


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    lat: dict[str, list[float]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as base:
        print(f"wake-up of a waiting pull_work, {args.jobs} jobs x {args.rounds} rounds, in {base} "
              f"({time.strftime('%Y-%m-%d %H:%M')})")
        for r in range(args.rounds):
            order = ("sync", "async") if r % 2 == 0 else ("async", "sync")
            for kind in order:
                lat[kind] += one_round(base, _sync_waiter if kind == "sync" else _async_waiter, args.jobs)
    for kind in ("sync", "async"):
        print(f"  {kind:<6} p50 {pct(lat[kind], 50):6.2f} ms   p99 {pct(lat[kind], 99):6.2f} ms")
    print(f"  async / sync: p50 {pct(lat['async'], 50) / pct(lat['sync'], 50):.2f}x   "
          f"p99 {pct(lat['async'], 99) / pct(lat['sync'], 99):.2f}x")


if __name__ == "__main__":
    main()
