"""What the finished-index entry costs a claim+fulfil, on the filesystem of ``--dir``.

    python bench/index_entry.py --dir /tmp          # ext4 here
    python bench/index_entry.py --dir /dev/shm      # tmpfs

Every final job gets an entry in ``finished/<B>/`` (FORMAT.md, "the finished index"), made just
before the commit's rename: a hard link to the job's own file (``link``: a name, no new inode).
Retention, listings of final jobs and the final counts of ``statistics()`` all walk that index,
so none of them lists the final directories.

Each round runs, in fresh processes and in turn, ``--batches`` batches of ``--jobs`` claim+fulfils
in one process and one store (``durable=False``, as ``bench/ab.py``; later batches show a cost
that grows with the disk's recent history), in three ways: the entry made as the store makes it
(``link``); as an empty file made by ``mknod`` (a new inode per final job, the other way an entry
can be made, and what entries were before they were links); and with ``Tree.index_final``
replaced by a no-op (what the commit would cost without the index: not a store anyone should
run, since retention would never see those jobs). Printed: the medians of the rounds per batch,
and the cost of the system calls alone in a fresh directory of the same filesystem (``mknod`` of
an empty file, ``rename`` of one, ``link`` to one, and ``append``: an entry's line written to a log
held open with O_APPEND, what an entry in a log per process would cost), microseconds each.
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
from fsjobstore._os import _syscalls
root, jobs, mode, batches = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if mode == "skip":
    _tree.Tree.index_final = lambda self, record, state, finished_at, source: True
elif mode == "mknod":
    link = _syscalls.link
    def entry(src, dst):
        if "/finished/" not in dst:
            return link(src, dst)
        _syscalls.mknod(dst, 0o600)
    _syscalls.link = entry
with JobStore(root, durable=False) as s:
    rates = []
    for _ in range(batches):
        for i in range(jobs):
            s.create({"i": i})
        os.sync()
        t = time.perf_counter()
        for _ in range(jobs):
            s.pull_work(timeout=0).fulfill(b"")
        rates.append(jobs / (time.perf_counter() - t))
    print(" ".join(map(str, rates)))
"""


def _probe(base: str, jobs: int, mode: str, batches: int) -> list[float]:
    root = tempfile.mkdtemp(dir=base)
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE, os.path.join(root, "s"), str(jobs), mode,
                              str(batches)], check=True, capture_output=True, text=True)
        return [float(x) for x in out.stdout.split()]
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
        log = os.open(f"{d}/b/log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            t = time.perf_counter()
            for i in range(n):
                os.write(log, b"%017d.%017d.fulfilled.default.%032x\n" % (i, i, i))
            out["append"] = (time.perf_counter() - t) / n * 1e6
        finally:
            os.close(log)
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where to make the stores (default: a temp dir)")
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    base = tempfile.mkdtemp(dir=args.dir, prefix="index-entry-")
    try:
        rates: dict[str, list[list[float]]] = {"link": [], "mknod": [], "skip": []}
        calls: list[dict[str, float]] = []
        for _ in range(args.rounds):
            for mode in rates:
                rates[mode].append(_probe(base, args.jobs, mode, args.batches))
            calls.append(_calls(base))
        started = time.strftime("%Y-%m-%d %H:%M")
        print(f"claim+fulfil/s, one process, {args.batches} batches of {args.jobs} jobs in one store, "
              f"median of {args.rounds} rounds, in {base} ({started})")
        labels = {"link": "entry a link (the store)", "mknod": "entry an empty file (mknod)",
                  "skip": "no entry (index_final a no-op)"}
        for mode, label in labels.items():
            per_batch = [statistics.median(r[b] for r in rates[mode]) for b in range(args.batches)]
            print(f"  {label:32} " + "  ".join(f"{v:8,.0f}" for v in per_batch))
        for op in ("mknod", "rename", "link", "append"):
            print(f"  {op:6} alone, us: median {statistics.median(c[op] for c in calls):7.1f}"
                  f"  (rounds: {', '.join(f'{c[op]:.1f}' for c in calls)})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
