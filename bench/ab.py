"""Compare fsjobstore at several git revisions, interleaved, on this machine's weather.

    python bench/ab.py 461059a HEAD            # before/after of an optimisation
    python bench/ab.py --rounds 5 REV1 REV2 REV3
    python bench/ab.py --instructions b3b3556 HEAD   # CPU instructions per operation (callgrind)
    python bench/ab.py --syscalls 466ed34 HEAD       # system calls per operation (strace)
    python bench/ab.py --drain --peer dirq 466ed34 HEAD   # bench/peers.py's W2 drain, revisions interleaved
    python bench/ab.py --drain --durable --threads 4 REV1 REV2   # the same, fsync on, 4 threads a process

``--instructions`` counts the instructions one create, and one claim+fulfil, execute in user
space (valgrind's callgrind, on tmpfs, durable=False), by running 0 and 1,000 operations and
dividing the difference: the same count on every run, whatever else the machine is doing, so
small changes show where wall-clock rates on a busy disk are too noisy to. ``--syscalls`` counts,
the same way, the system calls one operation makes (strace -f -c; on the filesystem of the current
directory, durable and not), by name: what a busy disk charges for, counted instead of timed.

``--drain`` runs bench/peers.py's W2 for each revision (and each ``--peer`` of bench/_adapters.py,
from this tree) in turn in every round: ``--jobs`` items put by a producer, ``os.sync()``, then
1, 2 and 4 fresh worker processes drain them (durable=False, or fsync on with ``--durable``),
items/s over the drain with the exactly-once check; the harness is this tree's, the fsjobstore
each revision's. ``--threads T`` (fsjobstore only): each worker process runs the loop in T
threads sharing one store, as bench/w8_ceiling.py does.

Each revision is checked out into a temporary git worktree. For every round, each revision
runs in a fresh process, in turn, so slow and fast moments of the disk fall on all of them
alike; figures are medians over the rounds. Printed per revision: create/s and one-process
claim+fulfil/s, durable and not, and the cross-process wake-up latency p50/p99 (ms).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

_PROBE = r"""
import json, multiprocessing as mp, os, sys, tempfile, time
import fsjobstore
assert fsjobstore.__file__.startswith(os.environ["PYTHONPATH"]), fsjobstore.__file__
from fsjobstore import JobStore

def rate(fn, n):
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t)

def drain(s):
    lease = s.pull_work()
    lease.fulfill(b"")

def waiter(root, n, q):
    with JobStore(root, durable=False, poll_interval=5.0) as s:
        s.pull_work()
        q.put("ready")
        lat = []
        for _ in range(n):
            lease = s.pull_work(timeout=10)
            lat.append(time.monotonic() - lease.request["t"])
            lease.fulfill(b"")
        q.put(sorted(lat))

base = tempfile.mkdtemp(dir=sys.argv[1])
out = {}
for durable, n in ((False, 2000), (True, 400)):
    with JobStore(os.path.join(base, f"s{durable}"), durable=durable) as s:
        out[f"create/s durable={durable}"] = rate(lambda i: s.create({"i": i, "payload": "x" * 50}), n)
        out[f"claim+fulfil/s durable={durable}"] = rate(lambda i: drain(s), n)
ctx = mp.get_context("fork")
q = ctx.Queue()
root = os.path.join(base, "w")
JobStore(root, durable=False).close()  # format 2 records durability in the store
p = ctx.Process(target=waiter, args=(root, 100, q))
p.start()
q.get(timeout=30)
time.sleep(0.3)
with JobStore(root, durable=False) as s:
    for _ in range(100):
        s.create({"t": time.monotonic()})
        time.sleep(0.02)
lat = q.get(timeout=60)
p.join()
out["wake-up p50 ms"] = lat[50] * 1000
out["wake-up p99 ms"] = lat[98] * 1000
print(json.dumps(out))
"""


_COUNT = r"""
import os, sys, tempfile, shutil
import fsjobstore
assert fsjobstore.__file__.startswith(os.environ["PYTHONPATH"]), fsjobstore.__file__
from fsjobstore import JobStore
phase, n = sys.argv[1], int(sys.argv[2])
durable = len(sys.argv) > 3 and sys.argv[3] == "durable"
where = sys.argv[4] if len(sys.argv) > 4 else ("/dev/shm" if os.path.isdir("/dev/shm") else None)
base = tempfile.mkdtemp(dir=where)
s = JobStore(os.path.join(base, "s"), durable=durable)
for i in range(n):
    s.create({"i": i, "payload": "x" * 50})
if phase == "claim":
    for i in range(n):
        s.pull_work().fulfill(b"")
s.close()
shutil.rmtree(base)
"""


_DRAIN = r"""
import json, os, sys
durable = sys.argv[5] == "durable"
import fsjobstore  # first, so the revision's own (PYTHONPATH) is the one the harness uses
assert fsjobstore.__file__.startswith(os.environ["PYTHONPATH"]), fsjobstore.__file__
sys.path.insert(0, sys.argv[1])
import peers
from _adapters import ADAPTERS
cls = ADAPTERS[sys.argv[2]]
threads = int(sys.argv[6])
out = {}
for workers in (1, 2, 4):
    d = os.path.join(sys.argv[3], f"{sys.argv[2]}-{workers}")
    os.makedirs(d)
    if threads == 1:
        rate, dup, lost, errors = peers.w2_drain(cls, d, int(sys.argv[4]), workers, durable)
    else:
        import _raw
        from _adapters import fill, tally
        from _runtime_cells import bare_threads
        fill(cls, d, int(sys.argv[4]), durable)
        os.sync()
        t0, results = _raw.run_together(bare_threads, [(d, threads, durable)] * workers)
        rate, dup, lost, errors = tally(results, int(sys.argv[4]), t0)
    if dup or lost:
        sys.exit(f"{sys.argv[2]}: {dup} duplicates, {lost} lost at {workers} workers")
    each = f" x {threads} threads" if threads > 1 else ""
    out[f"drain/s {workers} worker{'s' if workers > 1 else ''}{each}"] = rate
print(json.dumps(out))
"""


def drain(tree: str | None, peer: str, work: str, jobs: int, durable: bool, threads: int = 1) -> dict[str, float]:
    """One round of W2 for ``peer`` (fsjobstore from ``tree``, or a peer from this tree)."""
    here = os.path.dirname(os.path.abspath(__file__))
    d = tempfile.mkdtemp(dir=work)
    try:
        env = dict(os.environ, PYTHONPATH=tree or os.path.dirname(here))
        done = subprocess.run([sys.executable, "-P", "-c", _DRAIN, here, peer, d, str(jobs),
                               "durable" if durable else "-", str(threads)], env=env, cwd=work, capture_output=True,
                              text=True, check=True)
        return {k: float(v) for k, v in json.loads(done.stdout).items()}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def instructions(tree: str, phase: str, n: int) -> int:
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                           "-P", "-c", _COUNT, phase, str(n)], env=dict(os.environ, PYTHONPATH=tree),
                          capture_output=True, text=True, check=True)
    line = next(x for x in done.stderr.splitlines() if "Collected :" in x)
    return int(line.split()[-1])


def per_op(tree: str) -> dict[str, float]:
    n = 1000
    base, created, claimed = (instructions(tree, p, k) for p, k in (("create", 0), ("create", n), ("claim", n)))
    return {"create, instructions": (created - base) / n, "claim+fulfil, instructions": (claimed - created) / n}


def syscalls(tree: str, phase: str, n: int, durable: bool, where: str) -> dict[str, int]:
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        subprocess.run(["strace", "-f", "-c", "-o", out.name, sys.executable, "-P", "-c", _COUNT, phase, str(n),
                        "durable" if durable else "-", where], env=dict(os.environ, PYTHONPATH=tree),
                       capture_output=True, check=True)
        calls: dict[str, int] = {}
        for line in out.read().splitlines():
            parts = line.split()
            # "% time  seconds  usecs/call  calls  [errors]  syscall"
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                calls[parts[-1]] = int(parts[3])
        return calls


def per_op_calls(tree: str, where: str) -> dict[str, float]:
    n, out = 500, {}
    for durable in (False, True):
        base, created, claimed = (syscalls(tree, p, k, durable, where)
                                  for p, k in (("create", 0), ("create", n), ("claim", n)))
        for op, hi, lo in (("create", created, base), ("claim+fulfil", claimed, created)):
            diff = {c: (hi.get(c, 0) - lo.get(c, 0)) / n for c in hi}
            out[f"{op} durable={durable}, syscalls"] = sum(diff.values())
            for call, k in sorted(diff.items(), key=lambda kv: -kv[1]):
                if k >= 0.05:
                    out[f"  {op} durable={durable}: {call}"] = k
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("revs", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instructions", action="store_true", help="count instructions per operation instead")
    ap.add_argument("--syscalls", action="store_true", help="count system calls per operation instead")
    ap.add_argument("--drain", action="store_true", help="bench/peers.py's W2 drain at 1/2/4 workers instead")
    ap.add_argument("--peer", action="append", default=[], help="with --drain: a peer of bench/_adapters.py too")
    ap.add_argument("--jobs", type=int, default=3000, help="with --drain: items per drain")
    ap.add_argument("--durable", action="store_true", help="with --drain: fsync on")
    ap.add_argument("--threads", type=int, default=1, help="with --drain: threads in each fsjobstore worker process")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    repo = subprocess.run(["git", "-C", here, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    # In the current directory, so it measures the filesystem it is run on; ignored by git (.gitignore).
    # Absolute: git -C repo reads a relative worktree path from the repository, while PYTHONPATH
    # is read from here. Every probe runs with -P (no current directory on sys.path: run from the
    # repository, it would import the checkout there at every revision) and checks where its
    # fsjobstore came from.
    work = os.path.abspath(tempfile.mkdtemp(prefix="fsjobstore-ab-", dir="."))
    trees = {}
    try:
        for rev in args.revs:
            tree = os.path.join(work, f"tree-{len(trees)}")
            subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", "-q", tree, rev], check=True)
            trees[rev] = tree
        results: dict[str, list[dict[str, float]]] = {rev: [] for rev in [*args.revs, *args.peer]}
        for _ in range(1 if args.instructions or args.syscalls else args.rounds):
            if args.drain:
                for rev, tree in trees.items():
                    results[rev].append(drain(tree, "fsjobstore", work, args.jobs, args.durable, args.threads))
                for peer in args.peer:
                    results[peer].append(drain(None, peer, work, args.jobs, args.durable))
                continue
            for rev, tree in trees.items():
                if args.instructions:
                    results[rev].append(per_op(tree))
                    continue
                if args.syscalls:
                    results[rev].append(per_op_calls(tree, work))
                    continue
                env = dict(os.environ, PYTHONPATH=tree)
                done = subprocess.run([sys.executable, "-P", "-c", _PROBE, work], env=env, capture_output=True,
                                      text=True, check=True)
                results[rev].append(json.loads(done.stdout))
        cols = list(results)
        keys = list(dict.fromkeys(k for col in cols for k in results[col][0]))
        print(f"{'':32}" + "".join(f"{col:>14}" for col in cols))
        for key in keys:
            cells = [statistics.median(r.get(key, 0.0) for r in results[col]) for col in cols]
            print(f"{key:32}" + "".join(f"{c:>14,.2f}" if c < 100 else f"{c:>14,.0f}" for c in cells))
        if args.drain:
            print("rounds:")
            for col in cols:
                for key in keys:
                    print(f"  {col:>14} {key:24}" + "".join(f"{x[key]:>10,.0f}" for x in results[col]))
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", tree], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
