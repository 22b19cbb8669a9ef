"""W8's ceiling: how fast fsjobstore's durable drain could go if its commits flushed the directory
less often, against huey-sqlite's durable drain, in one run.

    python bench/w8_ceiling.py                       # 6,000 jobs a cell, 3 rounds, about 8 minutes
    python bench/w8_ceiling.py --jobs 2000 --rounds 1 --no-peer

Each fsjobstore cell fills a store made with durable=True, syncs the disk, then forks P
processes of T threads, each running W2's bare loop (``pull_work`` + ``fulfill(b"")``) until
the queue is empty, as W4 times it. Two variants, in rotation with huey-sqlite (W4's drain, in as
many processes):

* ``as is``: what the store does: every commit fsyncs its file, then its directory.
* ``no directory fsync``: the same with the directory fsync after a commit's rename left out
  (``_fsops.sync_applied`` made a no-op in the draining processes). **Not safe**: a power cut can
  undo such a commit's rename. It is the ceiling of any scheme that flushes the directory less
  often than once a commit (group commit across threads or processes, a background flusher),
  since none of them can flush less than never.

If the ceiling's best stays near the peer's best, no such scheme meets W8 on this machine; what
is left is the CPU each job costs (bench/w8_cpu.py).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _raw
from _adapters import FsJobStore, HueySqlite, fill, tally
from _runtime_cells import bare_threads, w8_script
from peers import w2_drain

LAYOUTS = ((1, 1), (4, 1), (8, 1), (16, 1), (2, 4), (4, 4))  # (processes, threads in each)
HUEY_WORKERS = (1, 2, 4, 8, 16)


def _worker(d: str, threads: int, no_dir_fsync: bool, start: Any, out: Any) -> None:
    if no_dir_fsync:
        from fsjobstore._os import _files as _fsops

        _fsops.sync_applied = lambda path, *, durable: None  # type: ignore[assignment]  # the unsafe variant
    bare_threads(d, threads, True, start, out)


def fsjobstore_drain(d: str, n: int, processes: int, threads: int, no_dir_fsync: bool) -> tuple[float, int, int]:
    """(jobs/s, duplicates, losses) of a durable store's drain by processes x threads."""
    fill(FsJobStore, d, n, True)
    os.sync()
    t0, results = _raw.run_together(_worker, [(d, threads, no_dir_fsync)] * processes)
    rate, dups, lost, _ = tally(results, n, t0)
    return rate, dups, lost


def main() -> int:
    args, base = w8_script(__doc__, "w8ceil-")
    cells: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
    k = 0
    try:
        for _ in range(args.rounds):
            for p, t in LAYOUTS:
                for variant, off in (("as is", False), ("no directory fsync (unsafe)", True)):
                    k += 1
                    cells.setdefault((f"fsjobstore bare loop, {variant}", f"{p}x{t}"), []).append(
                        fsjobstore_drain(os.path.join(base, str(k)), args.jobs, p, t, off))
            for w in () if args.no_peer else HUEY_WORKERS:
                k += 1
                rate, dups, lost, _ = w2_drain(HueySqlite, os.path.join(base, str(k)), args.jobs, w, True)
                cells.setdefault(("huey-sqlite (fsync=True)", f"{w}x1"), []).append((rate, dups, lost))
            shutil.rmtree(base, ignore_errors=True)
            os.makedirs(base)
        print(f"{args.jobs:,} jobs a cell, median of {args.rounds} round(s); processes x threads; "
              "jobs/s (duplicates/losses, the largest of any round)")
        best: dict[str, float] = {}
        for (queue, layout), runs in cells.items():
            rate = statistics.median(r for r, _, _ in runs)
            best[queue] = max(best.get(queue, 0.0), rate)
            dups, lost = max(d for _, d, _ in runs), max(x for _, _, x in runs)
            print(f"  {queue:<52} {layout:>5}: {rate:7,.0f} ({dups}/{lost})")
        for queue, rate in best.items():
            print(f"best of {queue}: {rate:,.0f} jobs/s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
