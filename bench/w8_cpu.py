"""Where W8's durable drain spends its time: CPU per job of the worker runtime, by worker count.

    python bench/w8_cpu.py                       # 4,000 jobs, processes, durable, 1,2,4,8,16 workers
    python bench/w8_cpu.py --jobs 2000 --workers 1,4 --mode threads --not-durable

Each cell is W8's (bench/_runtime_cells.runtime_drain: fill, sync, a fresh process runs
Worker(...).run(burst=True)); the CPU is the user and system time of that process and its children
(getrusage of the children), divided by the jobs, with the voluntary and involuntary context
switches per job. "busy cores" is that CPU over the cell's wall time: below 2 on this 2-core
machine, the workers wait (on fsync) more than they compute.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _runtime_cells as rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--workers", default="1,2,4,8,16", help="comma-separated worker counts")
    ap.add_argument("--mode", choices=rc.MODES, default="processes")
    ap.add_argument("--not-durable", action="store_true", help="stores made with durable=False")
    ap.add_argument("--dir", help="where to run (default: a temp dir under the current directory)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="w8cpu-", dir=args.dir or ".")
    try:
        for w in (int(x) for x in args.workers.split(",")):
            d = os.path.join(base, f"w{w}")
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            r = rc.runtime_drain(d, args.jobs, w, args.mode, not args.not_durable)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            n = args.jobs
            user = (after.ru_utime - before.ru_utime) / n * 1e6
            system = (after.ru_stime - before.ru_stime) / n * 1e6
            busy = (user + system) * n / 1e6 / r.seconds
            print(f"{w:>2} {args.mode}, durable={not args.not_durable}: {n / r.seconds:,.0f} jobs/s; per job "
                  f"user {user:.0f} us, system {system:.0f} us; busy cores {busy:.2f}; "
                  f"context switches per job {(after.ru_nvcsw - before.ru_nvcsw) / n:.1f} voluntary, "
                  f"{(after.ru_nivcsw - before.ru_nivcsw) / n:.1f} involuntary; "
                  f"{r.dups} duplicates, {r.lost} lost", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
