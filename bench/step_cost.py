"""What each step of a plain claim+fulfil costs, by taking it out: the store as it is, then with
one step replaced by a no-op, in turn, interleaved in fresh processes.

    python bench/step_cost.py --dir /tmp              # claim+fulfil/s in one process, ext4 here
    python bench/step_cost.py --instructions          # callgrind instructions per claim+fulfil (tmpfs)

The steps: ``entry``, the finished-index entry (``Tree.index_final``, FORMAT.md, "the finished
index"); ``count``, counting the commit (``Work._count``, the ``ended`` point); ``questions``, the
four questions to the name watch (is the queue paused, is a cancel asked for, are targets or
children waiting); ``all``, the three at once. A store without them is not one anyone should run
(retention would never see its final jobs, counters would miss them, a cancel or a pause would go
unheard): they are taken out only to measure what they cost. ``--jobs`` jobs are created, the
store closed and the disk synced, then claimed and fulfilled in a fresh store of the same process
(``durable=False``, as ``bench/ab.py``); medians of ``--rounds``. With ``--instructions``, each
variant runs under valgrind's callgrind at 0 and ``--jobs`` claims, and the difference is divided.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_PROBE = r"""
import os, sys, time
from fsjobstore import JobStore
from fsjobstore._core import _control, _tree
from fsjobstore._relations import _dependencies
from fsjobstore._transitions import _notify, _work

root, jobs, variant, claims = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "claim"
steps = {"entry", "count", "questions"} if variant == "all" else {variant}
if "entry" in steps:
    _tree.Tree.index_final = lambda self, record, state, finished_at, source: True
if "count" in steps:
    _work.Work._count = lambda self, claim, what: None
if "questions" in steps:
    _control.Control.paused_for_claim = lambda self: frozenset()
    _control.Control.cancel_reason = lambda self, job_id: None
    _notify.has_targets = lambda core, job_id: False
    _dependencies.Deps.resolve_children = lambda self, parent: None
with JobStore(root, durable=False) as s:
    for i in range(jobs):
        s.create({"i": i, "payload": "x" * 50})
os.sync()
with JobStore(root, durable=False) as s:
    t = time.perf_counter()
    for _ in range(jobs if claims else 0):
        s.pull_work(timeout=0).fulfill(b"")
    print(jobs / (time.perf_counter() - t))
"""

VARIANTS = ("as is", "entry", "count", "questions", "all")


def _run(base: str, jobs: int, variant: str, phase: str, valgrind: bool) -> tuple[float, int]:
    root = tempfile.mkdtemp(dir=base)
    try:
        cmd = [sys.executable, "-P", "-c", _PROBE, os.path.join(root, "s"), str(jobs), variant, phase]
        if valgrind:
            cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        counted = next((int(x.split()[-1]) for x in done.stderr.splitlines() if "Collected :" in x), 0)
        return float(done.stdout.split()[-1]), counted
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where to make the stores (default: a temp dir; /dev/shm "
                    "with --instructions)")
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    args = ap.parse_args()
    where = args.dir or ("/dev/shm" if args.instructions else None)
    base = tempfile.mkdtemp(dir=where, prefix="step-cost-")
    try:
        started = time.strftime("%Y-%m-%d %H:%M")
        if args.instructions:
            print(f"instructions per claim+fulfil, {args.jobs} jobs, in {base} ({started})")
            first = None
            for variant in VARIANTS:
                none = _run(base, args.jobs, variant, "none", True)[1]
                claimed = _run(base, args.jobs, variant, "claim", True)[1]
                per = (claimed - none) / args.jobs
                first = per if first is None else first
                label = "as is" if variant == "as is" else f"without {variant}"
                print(f"  {label:22} {per:10,.0f}  ({per - first:+,.0f})")
            return
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                rates[variant].append(_run(base, args.jobs, variant, "claim", False)[0])
        print(f"claim+fulfil/s, one process, {args.jobs} jobs, median of {args.rounds} rounds, in {base} ({started})")
        first = statistics.median(rates["as is"])
        for variant in VARIANTS:
            med = statistics.median(rates[variant])
            label = "as is" if variant == "as is" else f"without {variant}"
            print(f"  {label:22} {med:10,.0f}  {med / first:5.2f}x  (rounds: "
                  f"{', '.join(f'{r:,.0f}' for r in rates[variant])})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
