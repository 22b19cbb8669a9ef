"""W7 and W8: fsjobstore's worker runtime, measured the way a user runs it.

Each cell fills a store, settles the disk (``os.sync()``), then forks a fresh process that opens
the store, runs ``fsjobstore.Worker(store, {"default": handler}, ...).run(burst=True)`` and
closes it. A cell's time runs from just before that fork to ``run()``'s return. The handler is
empty but for one byte of shared memory it counts each job's runs in (the bare loop of W2 also
reads ``request["i"]`` and keeps it), so the exactly-once check sees every run:

* W7 runtime cost (fsync off): the runtime in both modes at 1, 2 and 4, against W2's bare loop
  (``pull_work`` + ``fulfill(b"")`` in as many processes), and the threads mode also against the
  same bare loop in as many threads of one process (what threads can do under the GIL). An empty
  run (0 jobs) is measured beside each, so start-up (and shut-down) shows apart from the cost per
  job.
* W8 durable throughput: the runtime on stores made with durable=True at 1 .. 16, in both modes,
  beside the durable peers drained by W4's code at as many worker processes.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import queue
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import _raw
from _adapters import Adapter, FsJobStore, fill, has_durable_mode, take_until_idle, tally
from _report import checks, ratio, table

from fsjobstore import JobContext, JobStore, Worker

CTX = mp.get_context("fork")
MODES = ("processes", "threads")
W7_WORKERS = (1, 2, 4)
W8_WORKERS = (1, 2, 4, 8, 16)
W7_TARGET = 0.8  # of the bare loop's rate
W8_NO_FSYNC = "reference: Worker (processes), durable=False"
W8_FLOOR = "reference: floor, bare syscalls with fsync"
W8_REFERENCES = (W8_NO_FSYNC, W8_FLOOR)

Handler = Callable[[JobContext], Any]
Drain = Callable[[type[Adapter], str, int, int, bool], tuple[float, int, int, int]]


class Rotating(Protocol):
    repeat: int

    def rotate(self, fns: dict[Any, Callable[[str], Any]]) -> dict[Any, list[Any]]: ...


# == one cell =====================================================================================
_SEEN: mmap.mmap | None = None  # one byte per job: how often a handler ran it (MAP_SHARED, inherited)


def mark(ctx: JobContext) -> None:
    """Count one run of this job where the exactly-once check reads it (every process of the
    cell shares the map)."""
    assert _SEEN is not None
    i = ctx.request["i"]
    _SEEN[i] = min(_SEEN[i] + 1, 255)


def empty(ctx: JobContext) -> bytes:
    """The measured handler: it does nothing but be counted."""
    mark(ctx)
    return b""


class Drained(NamedTuple):
    seconds: float  # from just before the fork of the fresh process to run()'s return
    dups: int  # extra runs of a job
    lost: int  # jobs never run, or not fulfilled
    left: int  # jobs still pending, scheduled or active after the run


def exactly_once(counts: bytes, runs: int, fulfilled: int, left: int) -> tuple[int, int, int]:
    """(duplicates, losses, left) of a drain of ``len(counts)`` jobs. ``counts[i]``: how often a
    handler ran job i; ``runs``: the attempts the worker reported (RunSummary.attempts: it
    catches a duplicate whose two runs raced on one counter); ``fulfilled`` and ``left``: what the
    store holds afterwards."""
    n = len(counts)
    ran = sum(1 for c in counts if c)
    dups = max(sum(c - 1 for c in counts if c > 1), runs - ran)
    return dups, max(n - ran, n - fulfilled), left


def runtime_drain(d: str, n: int, concurrency: int, mode: str, durable: bool, handler: Handler = empty) -> Drained:
    """Fill a store made with ``durable`` with ``n`` jobs (0: an empty store), settle the disk,
    and time a fresh process's ``Worker(...).run(burst=True)`` on it."""
    global _SEEN
    if n:
        fill(FsJobStore, d, n, durable)
    else:
        JobStore(d, durable=durable).close()
    os.sync()  # the fill's write-back must not land inside the drain
    _SEEN = mmap.mmap(-1, max(n, 1))
    out = CTX.Queue()
    try:
        t0 = time.monotonic()
        p = CTX.Process(target=_run_worker, args=(d, concurrency, mode, durable, handler, out))
        p.start()
        while True:
            try:
                ended, runs, fulfilled, left, was_durable = out.get(timeout=1.0)
                break
            except queue.Empty:
                if not p.is_alive():
                    raise RuntimeError(f"the worker process exited with {p.exitcode} before reporting") from None
        p.join()
        if was_durable != durable:
            raise RuntimeError(f"the store was opened durable={was_durable}, not {durable}")
        return Drained(ended - t0, *exactly_once(_SEEN[:n], runs, fulfilled, left))
    finally:
        _SEEN.close()
        _SEEN = None


def _run_worker(d: str, concurrency: int, mode: Any, durable: bool, handler: Handler, out: Any) -> None:
    store = JobStore(d, durable=durable)
    summary = Worker(store, {"default": handler}, concurrency=concurrency, mode=mode).run(burst=True)
    ended = time.monotonic()
    s = store.statistics()
    out.put((ended, summary.attempts, s.fulfilled, s.pending + s.scheduled + s.active,
             store.durable))
    store.close()


def bare_threads(d: str, threads: int, durable: bool, start: Any, out: Any) -> None:
    """W2's bare loop (``take_until_idle``), in ``threads`` threads of this one process sharing
    one store opened with ``durable``; puts one result for them all, as one worker of W2 would.
    A target of ``_raw.run_together`` (bench/w8_ceiling.py runs it in several processes)."""
    q = FsJobStore(d, durable)
    results: list[tuple[list[int], float, int]] = []
    pool = [threading.Thread(target=lambda: results.append(take_until_idle(q, start))) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    q.close()
    out.put(([i for taken, _, _ in results for i in taken], max(f for _, f, _ in results),
             sum(e for _, _, e in results)))


def bare_threads_drain(d: str, n: int, threads: int) -> tuple[float, int, int, int]:
    """(jobs/s, duplicates, losses, errors): W2's bare loop in ``threads`` threads of one
    process, timed as W2 times its processes (from the start signal to the last thread's end)."""
    fill(FsJobStore, d, n, False)
    os.sync()
    t0, results = _raw.run_together(bare_threads, [(d, threads, False)])
    return tally(results, n, t0)


def summarise(results: list[tuple[float, int, int, int]]) -> tuple[float, int, int, int]:
    """The median rate of the repeats, and the *largest* of each of their check counts."""
    return statistics.median(r[0] for r in results), *(max(r[k] for r in results) for k in (1, 2, 3))


# == W7 ===========================================================================================
class RuntimeRate(NamedTuple):
    with_startup: float  # jobs / median seconds of the run
    per_job: float  # jobs / (median seconds of the run - median seconds of the empty run)
    empty: float  # median seconds of the empty run (0 jobs): start-up and shut-down
    dups: int  # the largest counts of any repeat, empty runs included
    lost: int
    left: int


def w7(run: Rotating, n: int, drain: Drain, figures: dict[str, Any]) -> str:
    """The W7 table; its figures go to ``figures["W7-bare"]`` and ``figures["W7-runtime"]``."""
    bare: dict[int, tuple[float, int, int, int]] = {}
    bare_thr: dict[int, tuple[float, int, int, int]] = {}
    rt: dict[tuple[str, int], RuntimeRate] = {}
    for w in W7_WORKERS:  # one worker count at a time; the bare loops and both modes in rotation
        fns: dict[Any, Callable[[str], Any]] = {"bare": lambda d, w=w: drain(FsJobStore, d, n, w, False),
                                                "bare-threads": lambda d, w=w: bare_threads_drain(d, n, w)}
        for mode in MODES:
            for jobs in (n, 0):
                fns[(mode, jobs)] = lambda d, w=w, mode=mode, jobs=jobs: runtime_drain(d, jobs, w, mode, False)
        res = run.rotate(fns)
        bare[w] = summarise(res["bare"])
        bare_thr[w] = summarise(res["bare-threads"])
        for mode in MODES:
            full, zero = res[(mode, n)], res[(mode, 0)]
            busy, idle = statistics.median(r.seconds for r in full), statistics.median(r.seconds for r in zero)
            rt[(mode, w)] = RuntimeRate(n / busy, n / max(busy - idle, 1e-9), idle,
                                        *(max(getattr(r, k) for r in full + zero) for k in ("dups", "lost", "left")))
    figures["W7-bare"] = {w: v[0] for w, v in bare.items()}
    figures["W7-bare-threads"] = {w: v[0] for w, v in bare_thr.items()}
    figures["W7-runtime"] = rt
    rows = []
    for w in W7_WORKERS:
        row = [str(w), f"{bare[w][0]:,.0f} {checks(*bare[w][1:])}", f"{bare_thr[w][0]:,.0f} {checks(*bare_thr[w][1:])}"]
        for mode in MODES:
            r = rt[(mode, w)]
            row.append(f"{r.with_startup:,.0f} / {r.per_job:,.0f} {checks(r.dups, r.lost, r.left, ' left')}")
        for mode in MODES:
            r = rt[(mode, w)]
            row.append(f"{r.with_startup / bare[w][0]:.0%} / {r.per_job / bare[w][0]:.0%}")
        r = rt[("threads", w)]
        row.append(f"{r.with_startup / bare_thr[w][0]:.0%} / {r.per_job / bare_thr[w][0]:.0%}")
        row.append(" / ".join(f"{rt[(mode, w)].empty * 1000:,.0f}" for mode in MODES))
        rows.append(row)
    return table(f"W7 runtime cost (fsync off): {n:,} jobs, empty handler, jobs/s with start-up / per job without it "
                 "(duplicates/losses)", ["workers", "bare loop (W2's)", "bare loop, threads", "Worker processes",
                                         "Worker threads", "processes / bare", "threads / bare",
                                         "threads / bare threads", "empty run ms (proc / thr)"], rows) + (
        "\n\nWorker: a fresh process forked per run opens the store and calls Worker(...).run(burst=True); timed "
        "from just before the fork to run()'s return. The empty run (0 jobs) is that with no job: its time is "
        "the start-up (and shut-down); \"per job\" is jobs / (run - empty run). The bare loop is W2's: workers "
        "that opened the store start at one signal, and the last one's end after two empty pulls is its end. "
        "\"bare loop, threads\" is that loop in as many threads of one process on one store: the most a "
        "single process gets under the GIL, and what threads mode is measured against in its last column. "
        "Each row's cells ran in rotation, each store filled and then synced to disk before it was drained.")


# == W8 ===========================================================================================
def w8(run: Rotating, n: int, peers: dict[str, type[Adapter]], drain: Drain, figures: dict[str, Any]) -> str:
    """The W8 table; ``figures["W8"]`` maps (queue, workers) to (jobs/s, dups, lost, errors or left)."""
    durable_peers = {p: c for p, c in peers.items() if p != "fsjobstore" and has_durable_mode(c)}
    labels = [f"fsjobstore Worker ({mode})" for mode in MODES] + list(durable_peers) + list(W8_REFERENCES)
    rates: dict[tuple[str, int], tuple[float, int, int, int]] = {}
    for w in W8_WORKERS:
        fns: dict[Any, Callable[[str], Any]] = {
            f"fsjobstore Worker ({mode})": lambda d, w=w, mode=mode: runtime_drain(d, n, w, mode, True)
            for mode in MODES}
        fns.update({p: (lambda d, cls=cls, w=w: drain(cls, d, n, w, True))
                    for p, cls in durable_peers.items() if w == 1 or cls.mp_safe})
        # The two references that say where the time goes: the same runtime with no fsync at
        # all, and this design's durable claim+commit in bare syscalls (no Python logic).
        fns[W8_NO_FSYNC] = lambda d, w=w: runtime_drain(d, n, w, "processes", False)
        fns[W8_FLOOR] = lambda d, w=w: (_raw.drain_floor(_mkdir(d), n, w, durable=True), 0, 0, 0)
        for key, results in run.rotate(fns).items():
            if isinstance(results[0], Drained):
                results = [(n / r.seconds, r.dups, r.lost, r.left) for r in results]
            rates[(key, w)] = summarise(results)
    figures["W8"] = {k: v for k, v in rates.items() if k[0] not in W8_REFERENCES}
    figures["W8-references"] = {k: v for k, v in rates.items() if k[0] in W8_REFERENCES}
    ours = max(v[0] for k, v in rates.items() if k[0].startswith("fsjobstore"))
    rows = []
    for label in labels:
        cls = durable_peers.get(label)
        row = [label, "yes" if cls is None or cls.mp_safe else "no: 1 process only"]
        for w in W8_WORKERS:
            r = rates.get((label, w))
            row.append("n/a" if r is None else
                       f"{r[0]:,.0f} {checks(*r[1:], suffix=' left' if cls is None else 'e')}")
        best = max((rates[(label, w)][0] for w in W8_WORKERS if (label, w) in rates), default=None)
        row.append(f"{best:,.0f}" if best else "")
        row.append(ratio(ours, best) if cls or label == W8_FLOOR else "")
        rows.append(row)
    return table(f"W8 durable drain (fsync on): {n:,} jobs, empty handler, jobs/s (duplicates/losses[/worker errors])",
                 ["queue", "multi-process", *(f"{w} worker{'s' if w > 1 else ''}" for w in W8_WORKERS), "best",
                  "fsjobstore best / this best"], rows) + (
        "\n\nfsjobstore: stores made with durable=True (every commit fsyncs the file and its directory), drained by "
        "Worker(...).run(burst=True) in a fresh process, timed from the fork to run()'s return (start-up "
        "included). Peers: W4's drain, workers that opened the queue start at one signal (start-up excluded). "
        "Each column's cells ran in rotation, each store filled and then synced to disk before it was drained.\n"
        f"References (not peers, not counted in the target): \"{W8_NO_FSYNC}\" is the same runtime cell on a "
        "store made with durable=False: how fast it goes when no commit waits for the disk. "
        f"\"{W8_FLOOR}\" is bench/_raw.py drain_floor with fsync: per job rename, open, read, append, fsync, "
        "close, rename, directory fsync, in bare syscalls, each process with its own share of the names: the "
        "least this design's durable commit costs, with none of the store's parsing, checks or fencing.")


def _mkdir(d: str) -> str:
    os.makedirs(d)
    return d


# == targets ======================================================================================
def verdict_lines(f: dict[str, Any]) -> list[tuple[bool, str]]:
    """(met, text) for W7 and W8, from this run's figures."""
    out: list[tuple[bool, str]] = []
    bare, rt = f.get("W7-bare", {}), f.get("W7-runtime", {})
    for (mode, w), r in sorted(rt.items(), key=lambda kv: (MODES.index(kv[0][0]), kv[0][1])):
        b = bare.get(w)
        if not b:
            continue
        bad = f"; {r.dups} duplicates, {r.lost} losses, {r.left} left" if r.dups or r.lost or r.left else ""
        out.append((r.per_job >= W7_TARGET * b and not bad,
                    f"W7 Worker ({mode}), {w} worker(s): {r.per_job:,.0f} jobs/s per job = {r.per_job / b:.0%} of "
                    f"the bare loop's {b:,.0f}/s (target {W7_TARGET:.0%}); with start-up {r.with_startup:,.0f}/s = "
                    f"{r.with_startup / b:.0%}; the empty run takes {r.empty * 1000:,.0f} ms{bad}"))
        bt = f.get("W7-bare-threads", {}).get(w)
        if mode == "threads" and bt:
            out.append((r.per_job >= W7_TARGET * bt and not bad,
                        f"W7 Worker (threads), {w} worker(s), against the bare loop in {w} thread(s) of one "
                        f"process ({bt:,.0f}/s): {r.per_job / bt:.0%} (target {W7_TARGET:.0%}){bad}"))
    rates = f.get("W8")
    if rates:
        clean = {k: v[0] for k, v in rates.items() if not any(v[1:3])}  # cells that lost or doubled jobs don't count
        ours = max(((v, k) for k, v in clean.items() if k[0].startswith("fsjobstore")), default=None)
        theirs = max(((v, k) for k, v in clean.items() if not k[0].startswith("fsjobstore")), default=None)
        if ours and theirs:
            mode = ours[1][0].split("(")[1].rstrip(")")
            ok = ours[0] >= theirs[0]
            out.append((ok, f"W8 fsjobstore worker best: {ours[0]:,.0f} jobs/s ({mode}, {ours[1][1]}) vs best durable "
                            f"peer: {theirs[0]:,.0f} jobs/s ({theirs[1][0]}, {theirs[1][1]}): "
                            f"{'met' if ok else 'not met'}"))
    return out


def w8_script(doc: str | None, prefix: str) -> tuple[argparse.Namespace, str]:
    """The command line bench/w8_ceiling.py and bench/w8_budget.py share (--jobs, --rounds,
    --dir, --no-peer, with a clear error when huey is missing), and the fresh directory under
    --dir that a run works in: (the arguments, that directory)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="where to run (default: a temp dir under the current directory)")
    ap.add_argument("--no-peer", action="store_true", help="fsjobstore's cells only (no huey-sqlite)")
    args = ap.parse_args()
    if not args.no_peer:
        try:
            import huey  # noqa: F401
        except ImportError:
            ap.error("huey is not installed: pip install -e '.[bench]', or run with --no-peer")
    return args, tempfile.mkdtemp(prefix=prefix, dir=args.dir or ".")
