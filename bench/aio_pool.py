"""Async handlers on the asyncio pool against the same work in threads mode, in one run.

    python bench/aio_pool.py [--jobs 2000] [--concurrency 100] [--rounds 3] [--dir /tmp]

Each job's handler waits 10 ms (``await asyncio.sleep(0.01)`` in ``mode="asyncio"``,
``time.sleep(0.01)`` in ``mode="threads"``), as a handler that calls a network service does.
Each round fills a fresh non-durable store with ``--jobs`` jobs per mode and times
``Worker.run(burst=True)`` draining it at ``--concurrency``; the modes alternate in each round.
Prints the median jobs/s of each mode, their ratio, and the threads each run had at its peak.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import threading
import time
from typing import Any

from fsjobstore import JobStore
from fsjobstore.worker import Worker


async def async_wait(job: Any) -> str:
    await asyncio.sleep(0.01)
    return "ok"


def thread_wait(job: Any) -> str:
    time.sleep(0.01)
    return "ok"


def drain(base: str, mode: str, jobs: int, concurrency: int) -> tuple[float, int]:
    root = tempfile.mkdtemp(dir=base)
    with JobStore(os.path.join(root, "s"), durable=False) as store:
        for i in range(jobs):
            store.create(i)
        handler = async_wait if mode == "asyncio" else thread_wait
        worker = Worker(store, {"default": handler}, concurrency=concurrency, mode=mode)  # type: ignore[arg-type]
        peak = [threading.active_count()]
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], threading.active_count())

        threading.Thread(target=watch, daemon=True).start()
        t = time.perf_counter()
        summary = worker.run(burst=True)
        seconds = time.perf_counter() - t
        done.set()
        assert summary.fulfilled == jobs, summary
    return jobs / seconds, peak[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    logging.getLogger("fsjobstore").setLevel(logging.WARNING)
    rates: dict[str, list[float]] = {"asyncio": [], "threads": []}
    peaks: dict[str, int] = {"asyncio": 0, "threads": 0}
    with tempfile.TemporaryDirectory(dir=args.dir) as base:
        print(f"{args.jobs} jobs of 10 ms waits, concurrency {args.concurrency}, median of {args.rounds} rounds, "
              f"in {base} ({time.strftime('%Y-%m-%d %H:%M')})")
        for r in range(args.rounds):
            for mode in (("asyncio", "threads") if r % 2 == 0 else ("threads", "asyncio")):
                rate, peak = drain(base, mode, args.jobs, args.concurrency)
                rates[mode].append(rate)
                peaks[mode] = max(peaks[mode], peak)
    for mode in ("asyncio", "threads"):
        print(f"  {mode:<8} {statistics.median(rates[mode]):8,.0f} jobs/s   peak threads {peaks[mode]}")
    print(f"  asyncio / threads: {statistics.median(rates['asyncio']) / statistics.median(rates['threads']):.2f}x")


if __name__ == "__main__":
    main()
