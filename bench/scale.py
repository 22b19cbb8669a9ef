"""What a store's backlog costs: the same operations at several backlog sizes, as ratios in one run.

    python bench/scale.py                          # 10,000 / 300,000 / 1,000,000 pending
    python bench/scale.py --sizes 10000,100000 --fillers 2
    python bench/scale.py --finished 100000        # 100,000 finished jobs retained, against none

For each size a fresh store (durable=False, one queue) is filled with that many pending jobs by
``--fillers`` processes in parallel (each creating through the public API), then, each in a fresh
process so nothing is warm that a user's process would not have warm:

- **cold first lease**: ``python -c`` that imports fsjobstore, opens the store and leases one job
  (``pull_work(timeout=0)``); wall time from before the interpreter starts to the lease;
- **claim+fulfil/s** with 1 and with 2 worker processes, ``--claims`` jobs each, and the **slowest
  single pull** any of them saw;
- **get, fulfill(id), queue(id)** of a pending job picked at random (median of ``--lookups``);
- **statistics()**: the store's first count ever (it lists every bucket), the first call of a
  fresh process once that count is kept, and the median of 5 calls after it; and the **RSS** of
  the 1-worker process after its claims. The **first pull** of a worker process (a recovery pass,
  its threads started) is shown apart from the **slowest later pull**.

Every figure is printed with its ratio to the first (smallest) size of the same run, which is what
issue 24's targets are stated in. With ``--finished N`` the comparison is instead a store with N
finished jobs (created and fulfilled, kept) against a store with none, each with 10,000 pending
left after its claims; both stores are made first, and the claim+fulfil rates are the medians of
``--rounds`` drains that alternate between them, so the disk's moods (file creation on this
machine's ext4 moved between 41 and 628 us a file within a minute, 2026-11-25) fall on both.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from fsjobstore import JobStore

_COLD = r"""
import sys, time
t0 = float(sys.argv[2])
from fsjobstore import JobStore
s = JobStore(sys.argv[1], durable=False)
lease = s.pull_work(timeout=0)
assert lease is not None, "no job to lease"
t1 = time.time()
lease.release()
s.close()
print(t1 - t0)
"""


def _fill(root: str, n: int, tag: int) -> None:
    with JobStore(root, durable=False) as s:
        for i in range(n):
            s.create({"n": i, "filler": tag, "pad": "x" * 40})


def fill(root: str, n: int, fillers: int) -> float:
    """Create ``n`` pending jobs with ``fillers`` processes; returns the seconds it took."""
    JobStore(root, durable=False).close()
    t = time.perf_counter()
    ctx = mp.get_context("fork")
    share = [n // fillers + (1 if k < n % fillers else 0) for k in range(fillers)]
    procs = [ctx.Process(target=_fill, args=(root, share[k], k)) for k in range(fillers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a filler process failed with exit code {p.exitcode}")
    took = time.perf_counter() - t
    # The fill's dirty pages are written back before anything is measured: right after a fill of
    # a million files, creating one file took 380 us on this ext4 disk instead of ~20 (2026-11-24),
    # which would bill the bigger store for its own fill's writeback.
    os.sync()
    time.sleep(2)
    return took


def _worker(root: str, claims: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    with JobStore(root, durable=False) as s:
        first = worst = 0.0
        t = time.perf_counter()
        for k in range(claims):
            p0 = time.perf_counter()
            lease = s.pull_work(timeout=0)
            took = time.perf_counter() - p0
            if k == 0:
                first = took  # a process's first pull makes a recovery pass and starts its threads
            else:
                worst = max(worst, took)
            if lease is None:
                break
            lease.fulfill(b"")
        elapsed = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    out.put((claims / elapsed, worst, rss, first))


def drain(root: str, workers: int, claims: int) -> tuple[float, float, float, float]:
    """claim+fulfil/s summed over ``workers`` processes, the slowest single pull after each
    process's first, max RSS, the slowest first pull."""
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_worker, args=(root, claims, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return (sum(r[0] for r in results), max(r[1] for r in results), max(r[2] for r in results),
            max(r[3] for r in results))


def cold_first_lease(root: str) -> float:
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", _COLD, root, repr(t0)], check=True, capture_output=True,
                         text=True)
    return float(out.stdout.strip())


def lookups(root: str, count: int) -> dict[str, float]:
    with JobStore(root, durable=False) as s:
        ids = [j.id for j in _sample_pending(s, count)]
        out: dict[str, list[float]] = {"get": [], "queue(id)": [], "fulfill(id)": []}
        for job_id in ids:
            t = time.perf_counter()
            s.get(job_id)
            out["get"].append(time.perf_counter() - t)
            t = time.perf_counter()
            s.queue(job_id, {"to": "bench"})
            out["queue(id)"].append(time.perf_counter() - t)
            t = time.perf_counter()
            s.fulfill(job_id, None)
            out["fulfill(id)"].append(time.perf_counter() - t)
    # statistics(): the store's first count ever lists every bucket; it keeps what it counted
    # (control/counts.json), so a fresh process's first call, once the lookups' changes are
    # 2.5 s old, lists only the buckets that changed since (a bucket changed less than 2 s
    # before it was counted is counted again: _stats.DirCounts); later calls list only those
    # that changed since the call before.
    with JobStore(root, durable=False) as s:
        t = time.perf_counter()
        s.statistics()
        ever = time.perf_counter() - t
    time.sleep(2.5)
    with JobStore(root, durable=False) as s:
        t = time.perf_counter()
        s.statistics()
        first = time.perf_counter() - t
        stats = []
        for _ in range(5):
            t = time.perf_counter()
            s.statistics()
            stats.append(time.perf_counter() - t)
    result = {k: statistics.median(v) for k, v in out.items()}
    result["statistics() first count ever"] = ever
    result["statistics() fresh process"] = first
    result["statistics()"] = statistics.median(stats)
    return result


def _sample_pending(s: JobStore, count: int) -> list:  # type: ignore[type-arg]
    """``count`` pending jobs spread over the backlog, read from the queue directory's names."""
    directory = os.path.join(s.path, "jobs", "pending", "default")
    names = []
    for dirpath, _dirs, files in os.walk(directory):
        names += [os.path.join(dirpath, f) for f in files if f.endswith(".json")]
    picks = random.Random(7).sample(names, min(count, len(names)))
    return [s.get(os.path.basename(p).split(".")[2]) for p in picks]


def measure(root: str, args: argparse.Namespace) -> dict[str, float]:
    row: dict[str, float] = {}
    row["cold first lease s"] = statistics.median(cold_first_lease(root) for _ in range(3))
    for name, seconds in lookups(root, args.lookups).items():
        row[f"{name} ms"] = seconds * 1000
    rate1, worst1, rss, first1 = drain(root, 1, args.claims)
    rate2, worst2, _, first2 = drain(root, 2, args.claims)
    row["claim+fulfil/s 1 worker"] = rate1
    row["claim+fulfil/s 2 workers"] = rate2
    row["first pull ms (slowest)"] = max(first1, first2) * 1000
    row["slowest later pull ms"] = max(worst1, worst2) * 1000
    row["worker RSS MiB"] = rss
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,300000,1000000", help="pending backlogs, comma-separated")
    ap.add_argument("--finished", type=int, default=0, help="compare N finished jobs retained against none")
    ap.add_argument("--fillers", type=int, default=2, help="processes that fill each store")
    ap.add_argument("--claims", type=int, default=3000, help="claim+fulfils per worker process")
    ap.add_argument("--lookups", type=int, default=20, help="jobs looked up by id")
    ap.add_argument("--dir", default=None, help="where to make the stores (default: a temp dir)")
    ap.add_argument("--rounds", type=int, default=4, help="with --finished: alternating drains per store")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="fsjobstore-scale-", dir=args.dir)
    rows: dict[str, dict[str, float]] = {}
    try:
        if args.finished:
            pending = 10_000 + (args.rounds + 1) * 3 * args.claims  # what every drain takes, and 10,000 left
            plan = [("none finished", pending, 0), (f"{args.finished:,} finished", pending, args.finished)]
        else:
            plan = [(f"{n:,} pending", n, 0) for n in (int(x) for x in args.sizes.split(","))]
        roots = {}
        for label, pending, finished in plan:
            root = os.path.join(base, label.split()[0].replace(",", ""))
            fill_s = fill(root, finished + pending, args.fillers)
            if finished:
                drain(root, args.fillers, (finished + args.fillers - 1) // args.fillers)
                # As after a fill: the drain's write-back would be billed to the measurements.
                os.sync()
                time.sleep(2)
            rows[label] = measure(root, args)
            rows[label]["fill s"] = fill_s
            print(f"{label}: done", file=sys.stderr, flush=True)
            if args.finished:
                roots[label] = root  # kept for the alternating rounds below
            else:
                shutil.rmtree(root)
        if roots:
            rates: dict[str, list[tuple[float, float]]] = {
                label: [(rows[label]["claim+fulfil/s 1 worker"], rows[label]["claim+fulfil/s 2 workers"])]
                for label in roots}
            for _ in range(args.rounds):
                for label, root in roots.items():
                    rates[label].append((drain(root, 1, args.claims)[0], drain(root, 2, args.claims)[0]))
            for label in roots:
                rows[label]["claim+fulfil/s 1 worker"] = statistics.median(r[0] for r in rates[label])
                rows[label]["claim+fulfil/s 2 workers"] = statistics.median(r[1] for r in rates[label])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(rows))
        return
    labels = list(rows)
    first = rows[labels[0]]
    print(f"{'':28}" + "".join(f"{label:>26}" for label in labels))
    for key in first:
        cells = []
        for label in labels:
            v = rows[label][key]
            ratio = v / first[key] if first[key] else float("nan")
            cells.append(f"{v:>14.3f} ({ratio:5.2f}x)")
        print(f"{key:28}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
