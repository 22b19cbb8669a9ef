"""What the finished-index entry costs a claim+fulfil, on the filesystem of ``--dir``.

    python bench/index_entry.py --dir /tmp          # ext4 here
    python bench/index_entry.py --dir /dev/shm      # tmpfs

Every final job gets an entry in ``finished/<B>/`` (FORMAT.md, "the finished index"): one new,
empty file made by ``mknod`` just before the commit's rename. Retention, listings of final jobs
and the final counts of ``statistics()`` all walk that index, so none of them lists the final
directories. It is the one new inode a claim+fulfil makes (466ed34, before issue 24, made none).

Each round runs, in fresh processes and in turn, ``--jobs`` claim+fulfils of one process
(``durable=False``, as ``bench/ab.py``) with the entry made as the store makes it, and with
``Tree.index_final`` replaced by a no-op (what the commit would cost without the index: not a
store anyone should run, since retention would never see those jobs). Printed: the medians of
the rounds, and the cost of the system calls alone in a fresh directory of the same filesystem
(``mknod`` of an empty file, ``rename`` of one, ``link`` to one), microseconds each.
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
from fsjobstore._core import _tree
root, jobs, skip = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "skip"
if skip:
    _tree.Tree.index_final = lambda self, record, state, finished_at: True
with JobStore(root, durable=False) as s:
    for i in range(jobs):
        s.create({"i": i})
    os.sync()
    t = time.perf_counter()
    for _ in range(jobs):
        s.pull_work(timeout=0).fulfill(b"")
    print(jobs / (time.perf_counter() - t))
"""


def _probe(base: str, jobs: int, mode: str) -> float:
    root = tempfile.mkdtemp(dir=base)
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE, os.path.join(root, "s"), str(jobs), mode],
                             check=True, capture_output=True, text=True)
        return float(out.stdout)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _calls(base: str, n: int = 2000) -> dict[str, float]:
    d = tempfile.mkdtemp(dir=base)
    try:
        os.mkdir(f"{d}/a")
        os.mkdir(f"{d}/b")
        open(f"{d}/a/x0", "wb").close()
        out = {}
        t = time.perf_counter()
        for i in range(n):
            os.mknod(f"{d}/b/m{i}", 0o600)
        out["mknod"] = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for i in range(n):
            os.rename(f"{d}/a/x{i}", f"{d}/a/x{i + 1}")
        out["rename"] = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for i in range(n):
            os.link(f"{d}/a/x{n}", f"{d}/b/l{i}")
        out["link"] = (time.perf_counter() - t) / n * 1e6
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where to make the stores (default: a temp dir)")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    base = tempfile.mkdtemp(dir=args.dir, prefix="index-entry-")
    try:
        rates: dict[str, list[float]] = {"entry": [], "skip": []}
        calls: list[dict[str, float]] = []
        for _ in range(args.rounds):
            for mode in rates:
                rates[mode].append(_probe(base, args.jobs, mode))
            calls.append(_calls(base))
        started = time.strftime("%Y-%m-%d %H:%M")
        print(f"claim+fulfil/s, one process, {args.jobs} jobs, median of {args.rounds} rounds, in {base} ({started})")

        def rounds(values: list[float]) -> str:
            return ", ".join(f"{v:,.0f}" for v in values)

        with_entry, without = statistics.median(rates["entry"]), statistics.median(rates["skip"])
        print(f"  with the finished-index entry    {with_entry:8,.0f}   (rounds: {rounds(rates['entry'])})")
        print(f"  without it (index_final a no-op) {without:8,.0f}   (rounds: {rounds(rates['skip'])})")
        extra = 1e6 / with_entry - 1e6 / without
        print(f"  ratio {with_entry / without:.2f}x; per job {extra:,.1f} us more with the entry")
        for op in ("mknod", "rename", "link"):
            print(f"  {op:6} alone, us: median {statistics.median(c[op] for c in calls):7.1f}"
                  f"  (rounds: {', '.join(f'{c[op]:.1f}' for c in calls)})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
