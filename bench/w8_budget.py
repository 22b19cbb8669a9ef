"""W8's CPU budget: how much CPU a durable job may cost and still drain as fast as huey-sqlite.

    python bench/w8_budget.py                         # 6,000 jobs a cell, 3 rounds, about 9 minutes
    python bench/w8_budget.py --jobs 2000 --rounds 1 --no-peer

Three things in rotation, in one run, so they share the disk's mood:

* **floor + X us**: bench/_raw.py drain_floor with fsync (per job: rename, open, read, append,
  fsync, close, rename, directory fsync, in bare syscalls) with X microseconds of CPU spun in
  each job, at 4, 8 and 16 processes. Every fsync of fsjobstore's durable commit is there, so
  this is what a claim+commit that costs X us of CPU more than its syscalls can reach.
* **lean sketch** (bench/_lean_sketch.py): the least Python a durable claim+commit on
  fsjobstore's layout does (parse and check the record, a token, the paused, cancel and targets
  stats, the result line), with every fsync, each process owning its share of the names. A
  bound, not a store: what the store could reach if it were that lean and never contended.
  Three more rows put back, with the store's own code, what no store can leave out: **+ shared
  names** (every process claims from the one directory through the store's pending index, so
  some claims are lost to others, as in any queue whose workers do not know each other), **+
  strict parse** (the claimed file read as the store reads it, every field checked), and both.
* **fsjobstore Worker**: W8's cell (bench/_runtime_cells.runtime_drain, processes) at the same
  counts, with its CPU per job (user + system of the worker and its children).
* **huey-sqlite**: W4's durable drain at 1, 2, 4, 8 and 16 processes (skipped with --no-peer).

Read it as: the largest X whose best rate still reaches huey's best is the budget; the CPU the
floor itself costs (X = 0) plus that budget is what a job may cost in all. W8 needs the runtime's
CPU per job under that. bench/w8_cpu.py breaks the runtime's CPU down by worker count.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lean_sketch
import _raw
import _runtime_cells as rc
from _adapters import HueySqlite
from peers import w2_drain

BURNS = (0, 50, 100, 150, 200, 300)  # microseconds of CPU added to each job of the floor
SKETCHES = (("lean sketch (a bound)", False, False), ("sketch + shared names", True, False),
            ("sketch + strict parse", False, True), ("sketch + shared + strict", True, True))
WORKERS = (4, 8, 16)
HUEY_WORKERS = (1, 2, 4, 8, 16)


def _cpu_per_job(run: Callable[[], float], n: int) -> tuple[float, float]:
    """(jobs/s, microseconds of CPU a job) of ``run``, which drains ``n`` jobs in child processes
    and returns its rate: the children's user + system time (getrusage) over the jobs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rate = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return rate, cpu / n * 1e6


def main() -> int:
    args, base = rc.w8_script(__doc__, "w8budget-")
    n, k = args.jobs, 0
    cells: dict[tuple[str, int], list[tuple[float, float]]] = {}

    def cell(row: str, workers: int, run: Callable[[str], float]) -> None:
        nonlocal k
        k += 1
        d = os.path.join(base, str(k))
        os.makedirs(d)
        cells.setdefault((row, workers), []).append(_cpu_per_job(lambda: run(d), n))
        shutil.rmtree(d, ignore_errors=True)

    try:
        for _ in range(args.rounds):
            for w in WORKERS:
                for burn in BURNS:
                    cell(f"floor + {burn} us", w,
                         lambda d, w=w, burn=burn: _raw.drain_floor(d, n, w, durable=True, burn_us=burn))
                for label, shared, strict in SKETCHES:
                    cell(label, w, lambda d, w=w, shared=shared, strict=strict: _lean_sketch.drain(
                        os.path.join(d, "store"), n, w, shared=shared, strict=strict))
                cell("fsjobstore Worker (processes)", w, lambda d, w=w: _runtime(d, n, w))
            for w in () if args.no_peer else HUEY_WORKERS:
                cell("huey-sqlite (fsync=True)", w, lambda d, w=w: w2_drain(HueySqlite, d, n, w, True)[0])
        print(f"{n:,} jobs a cell, median of {args.rounds} round(s); jobs/s, then CPU a job in us "
              "(user + system of the draining processes)")
        best: dict[str, tuple[float, int]] = {}
        for (row, w), runs in cells.items():
            rate = statistics.median(r for r, _ in runs)
            cpu = statistics.median(c for _, c in runs)
            if rate > best.get(row, (0.0, 0))[0]:
                best[row] = (rate, w)
            print(f"  {row:<32} {w:>2} processes: {rate:7,.0f} jobs/s, {cpu:5.0f} us a job")
        for row, (rate, w) in best.items():
            print(f"best of {row}: {rate:,.0f} jobs/s ({w} processes)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def _runtime(d: str, n: int, workers: int) -> float:
    r = rc.runtime_drain(os.path.join(d, "store"), n, workers, "processes", True)
    if r.dups or r.lost:
        raise RuntimeError(f"the runtime cell ran {r.dups} duplicates and lost {r.lost}")
    return n / r.seconds


if __name__ == "__main__":
    sys.exit(main())
