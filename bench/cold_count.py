"""What a fresh process's first count costs on a deep store: ``statistics()`` and ``fsjobstore status``.

    python bench/cold_count.py --size 1000000          # fills a store of a million pending first
    python bench/cold_count.py --store /tmp/big        # an existing store (it is changed: claims, creates, a purge)

In one process: ``--claims`` claim+fulfils, ``--creates`` creates and ``purge()`` of the final
jobs (what a store sees between two looks at it); then, ``--settle`` seconds later, each in a fresh
process: the first ``statistics()`` (timed inside the process, after the store is open), and
``fsjobstore status DIR`` (wall time from before the interpreter starts to its exit). Then the
count kept in ``control/counts.v2.json`` is deleted and a fresh process counts again: what a store
nobody ever counted costs once. ``--rounds`` rounds, each printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsjobstore import JobStore

_FIRST = r"""
import sys, time
from fsjobstore import JobStore
with JobStore(sys.argv[1], durable=False) as s:
    t = time.perf_counter()
    n = s.statistics().pending
    print(time.perf_counter() - t, n)
"""


def first_count(root: str) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-P", "-c", _FIRST, root], check=True, capture_output=True, text=True)
    took, n = out.stdout.split()
    return float(took), int(n)


def status(root: str) -> float:
    cli = os.path.join(os.path.dirname(sys.executable), "fsjobstore")
    t = time.perf_counter()
    subprocess.run([cli, "status", root], check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="an existing store to use (changed by the run)")
    ap.add_argument("--size", type=int, default=1_000_000, help="pending jobs of the store made without --store")
    ap.add_argument("--claims", type=int, default=3000)
    ap.add_argument("--creates", type=int, default=1000)
    ap.add_argument("--settle", type=float, default=2.5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    made = None
    root = args.store
    if root is None:
        import scale

        made = tempfile.mkdtemp(prefix="cold-count-", dir=".")
        root = os.path.join(made, "s")
        print(f"filled {args.size:,} in {scale.fill(root, args.size, 2):.0f} s")
    try:
        for k in range(args.rounds):
            with JobStore(root, durable=False) as s:
                for _ in range(args.claims):
                    lease = s.pull_work(timeout=0)
                    if lease is not None:
                        lease.fulfill(b"")
                for i in range(args.creates):
                    s.create({"i": i})
                purged = s.purge()
            time.sleep(args.settle)
            took, pending = first_count(root)
            st = status(root)
            os.unlink(os.path.join(root, "control", "counts.v2.json"))
            ever, _ = first_count(root)
            print(f"round {k + 1} ({time.strftime('%H:%M:%S')}): {pending:,} pending, {purged:,} purged; "
                  f"fresh process's first statistics() {took * 1000:.1f} ms; fsjobstore status {st:.2f} s; "
                  f"first count ever {ever * 1000:.0f} ms")
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


if __name__ == "__main__":
    main()
