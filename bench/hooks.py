"""A worker's drain rate with two hooks registered against none, in one run.

    python bench/hooks.py [--jobs 2000] [--rounds 5] [--dir /tmp]

Each round, for each mode (threads, processes; concurrency 2) and each of "no hooks" and "two
hooks" (one on ``started``, one on ``finished``, each adding to a counter, as a metrics hook
does), fills a fresh non-durable store with ``--jobs`` jobs and times ``Worker.run(burst=True)``
draining it with a handler that returns at once: the runtime's own cost per job, which is where
hooks would show. The two variants alternate within each round, so slow and fast moments of the
machine fall on both. Prints the median jobs/s of each and the ratio (two hooks / none).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from typing import Any

from fsjobstore import JobStore
from fsjobstore.worker import JobEvent, Worker


def handle(job: Any) -> str:
    return "ok"


def drain(base: str, mode: str, hooks: bool, jobs: int) -> float:
    root = tempfile.mkdtemp(dir=base)
    with JobStore(os.path.join(root, "s"), durable=False) as store:
        for i in range(jobs):
            store.create(i)
        worker = Worker(store, {"default": handle}, concurrency=2, mode=mode)  # type: ignore[arg-type]
        counts = {"started": 0, "finished": 0}
        if hooks:
            def started(event: JobEvent) -> None:
                counts["started"] += 1

            def finished(event: JobEvent) -> None:
                counts["finished"] += 1

            worker.on("started", started)
            worker.on("finished", finished)
        t = time.perf_counter()
        summary = worker.run(burst=True)
        seconds = time.perf_counter() - t
        assert summary.fulfilled == jobs, summary
        if hooks and mode == "threads":  # (in processes mode each child counts its own)
            assert counts == {"started": jobs, "finished": jobs}, counts
    return jobs / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the stores are made (default: the system's temp dir)")
    args = ap.parse_args()
    logging.getLogger("fsjobstore").setLevel(logging.WARNING)
    rates: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as base:
        print(f"drain of {args.jobs} jobs, concurrency 2, median of {args.rounds} rounds, in {base} "
              f"({time.strftime('%Y-%m-%d %H:%M')})")
        for r in range(args.rounds):
            for mode in ("threads", "processes"):
                order = (False, True) if r % 2 == 0 else (True, False)
                for hooks in order:
                    rates.setdefault((mode, hooks), []).append(drain(base, mode, hooks, args.jobs))
    for mode in ("threads", "processes"):
        none, two = (statistics.median(rates[(mode, h)]) for h in (False, True))
        print(f"  {mode:<10} no hooks {none:8,.0f} jobs/s   two hooks {two:8,.0f} jobs/s   ratio {two / none:.2f}x")


if __name__ == "__main__":
    main()
