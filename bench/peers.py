"""fsjobstore against the embedded Python queues a user would pick instead, side by side.

    pip install -e ".[bench]"
    python bench/peers.py                 # the full run (about 65 minutes on 2 cores: W1-W6 40, W7+W8 24)
    python bench/peers.py --quick         # small counts, one repeat: a smoke run
    python bench/peers.py --peers fsjobstore,huey-sqlite --workloads W2,W4
    python bench/peers.py --workloads RAW,W1,W2,W3,W4 --json bench/last_peers_run.json   # the figures as JSON

``--json FILE`` also writes every figure of the run, with the run's date, commit and settings, as
JSON (``bench/charts.py`` draws the documentation's charts from it).

Every figure is the median of --repeat runs, each in a fresh directory under --dir (default: a
temp directory in the current one, so every queue sees the same filesystem). File creation
rates on this kind of machine swing several-fold between runs: compare figures from one run.
Workloads (see PERFORMANCE.md): W1 enqueue, W2 drain by 1/2/4 processes with an exactly-once
check, W3 wake-up latency and idle CPU, W4 = W1 and W2 with fsync on, W5 claim cost by depth,
W6 a worker's memory; plus the raw limits of this machine. W7 and W8 measure fsjobstore's worker
runtime (fsjobstore.Worker in a fresh process, bench/_runtime_cells.py): W7 its cost against W2's
bare loop at 1/2/4 in both modes (fsync off), with the empty run's time (start-up) apart; W8 its
durable drain at 1/2/4/8/16 in both modes beside the durable peers at as many processes.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _raw
import _runtime_cells
from _adapters import ADAPTERS, Adapter, fill, has_durable_mode, take_until_idle, tally
from _report import checks, commit, ratio, table

import fsjobstore

CTX = mp.get_context("fork")
WORKLOADS = ("RAW", "W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8")


# == workloads ====================================================================================
def w1_enqueue(cls: type[Adapter], d: str, n: int, durable: bool) -> float:
    q = cls(d, durable)
    try:
        t = time.perf_counter()
        for i in range(n):
            q.put(i)
        return n / (time.perf_counter() - t)
    finally:
        q.close()


def paired_create(d: str, n: int, durable: bool, block: int = 250) -> tuple[float, float]:
    """(raw, fsjobstore) creates/s, interleaved in blocks so that both see the same disk weather
    (file creation here swings several-fold within seconds): raw is create+write+close+rename,
    with ``durable`` the same plus the file and directory fsyncs."""
    store = ADAPTERS["fsjobstore"](d, durable)
    # The raw files go through the store's own tmp/ and a queue directory beside its own: on
    # ext4 a fresh directory can sit in a block group whose inode table is still being
    # initialised, which made a raw run in a directory of its own 2x slower *or* faster.
    a, b = os.path.join(d, "tmp"), os.path.join(d, "jobs", "pending", "raw")
    os.makedirs(b)
    raw_s = ours_s = 0.0
    try:
        for start in range(0, n, block):
            raw_s += _raw.create_block(a, b, start, block, then_rename=True, durable=durable)
            t = time.perf_counter()
            for i in range(start, start + block):
                store.put(i)
            ours_s += time.perf_counter() - t
    finally:
        store.close()
    return n / raw_s, n / ours_s


def _drain_worker(cls: type[Adapter], d: str, durable: bool, start: Any, out: Any) -> None:
    q = cls(d, durable)
    taken, finished, errors = take_until_idle(q, start)
    q.close()
    out.put((taken, finished, errors))


def w2_drain(cls: type[Adapter], d: str, n: int, workers: int, durable: bool) -> tuple[float, int, int, int]:
    """(items/s, duplicates, losses, worker errors) for ``workers`` processes draining ``n`` items."""
    fill(cls, d, n, durable)
    os.sync()  # the fill's write-back must not land inside the drain
    t0, results = _raw.run_together(_drain_worker, [(cls, d, durable)] * workers)
    return tally(results, n, t0)


def _wake_worker(cls: type[Adapter], d: str, n: int, durable: bool, idle_for: float, poll: float, ready: Any,
                 out: Any) -> None:
    q = cls(d, durable if cls.records_durability else False)  # the producer's setting, where the store records it
    q.take()  # open everything a worker opens
    wait = getattr(q, "wait_take", None)
    # Idle CPU: a worker waiting with nothing to do, over idle_for seconds.
    c0, t0 = os.times(), time.monotonic()
    if wait is not None:
        while time.monotonic() - t0 < idle_for:
            wait(idle_for - (time.monotonic() - t0))
    else:
        while time.monotonic() - t0 < idle_for:
            q.take()
            time.sleep(poll)
    c1, t1 = os.times(), time.monotonic()
    cpu = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100
    ready.set()
    got: dict[int, float] = {}
    while len(got) < n:
        i = wait(30.0) if wait is not None else q.take()
        if i is None:
            if wait is None:
                time.sleep(poll)
            continue
        got[i] = q.claimed_at
    q.close()
    out.put((got, cpu))


def w3_wakeup(cls: type[Adapter], d: str, n: int, durable: bool, poll: float,
              idle_for: float) -> tuple[float, float, float, float, float]:
    """(p50, p99, max) ms from just before the producer's put to the worker holding the item,
    the idle worker's CPU in % of one core, and p50 ms from the put's *return* (the item is
    visible) to the worker holding it: the wake-up without the cost of creating the item."""
    ready, out = CTX.Event(), CTX.Queue()
    p = CTX.Process(target=_wake_worker, args=(cls, d, n, durable, idle_for, poll, ready, out))
    p.start()
    if not ready.wait(idle_for + 60):
        raise RuntimeError("wake-up worker did not start")
    q = cls(d, durable)
    sent, visible = {}, {}
    try:
        for i in range(n):
            sent[i] = time.monotonic()  # CLOCK_MONOTONIC is system-wide on Linux
            q.put(i)
            visible[i] = time.monotonic()
            time.sleep(0.02)
    finally:
        q.close()
    got, cpu = out.get(timeout=120)
    p.join()
    lat = sorted((got[i] - sent[i]) * 1000 for i in range(n))
    after = sorted((got[i] - visible[i]) * 1000 for i in range(n))
    return lat[len(lat) // 2], lat[min(n - 1, round(n * 0.99) - 1)], lat[-1], cpu, after[len(after) // 2]


def w5_depth(cls: type[Adapter], d: str, depth: int, ops: int) -> float:
    """Microseconds per claim+complete with ``depth`` items queued behind."""
    fill(cls, d, depth + ops + 1, False)
    q = cls(d, False)
    try:
        q.take()  # warm: a running worker has already listed its queue once
        t = time.perf_counter()
        for _ in range(ops):
            if q.take() is None:
                raise RuntimeError("queue ran dry")
        return (time.perf_counter() - t) / ops * 1e6
    finally:
        q.close()


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _rss_worker(cls: type[Adapter], d: str, marks: tuple[int, ...], out: Any) -> None:
    q = cls(d, False)
    seen, rss = 0, []
    for mark in marks:
        while seen < mark:
            if q.take() is None:
                raise RuntimeError("queue ran dry")
            seen += 1
        rss.append(_rss_mb())
    q.close()
    out.put(rss)


def w6_memory(cls: type[Adapter], d: str, small: int, big: int) -> tuple[float, float]:
    """A fresh worker's RSS (MB) after ``small`` and after ``big`` items."""
    fill(cls, d, big, False)
    out = CTX.Queue()
    p = CTX.Process(target=_rss_worker, args=(cls, d, (small, big), out))
    p.start()
    rss = out.get(timeout=1800)
    p.join()
    return rss[0], rss[1]


# == running ======================================================================================
class Runner:
    """Runs each measurement in a fresh directory, on a settled disk: ``os.sync()`` first, so
    that the write-back of what an earlier measurement left behind (it can take seconds after a
    drain of 10,000 files) does not land inside the next one."""

    def __init__(self, base: str, repeat: int) -> None:
        self.base = base
        self.repeat = repeat

    def once(self, fn: Callable[[str], Any]) -> Any:
        d = tempfile.mkdtemp(dir=self.base)
        try:
            os.sync()
            return fn(os.path.join(d, "q"))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def median(self, fn: Callable[[str], Any], repeat: int | None = None) -> Any:
        results = [self.once(fn) for _ in range(repeat or self.repeat)]
        if isinstance(results[0], tuple):
            return tuple(statistics.median(r[k] for r in results) for k in range(len(results[0])))
        return statistics.median(results)

    def rotate(self, fns: dict[Any, Callable[[str], Any]]) -> dict[Any, list[Any]]:
        """Every function ``repeat`` times, round by round (one run of each per round, starting
        one later each round), each in a fresh directory: a slow spell of the disk then falls
        on all of them alike instead of on whichever ran first."""
        keys = list(fns)
        results: dict[Any, list[Any]] = {k: [] for k in keys}
        for r in range(self.repeat):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                results[k].append(self.once(fns[k]))
        return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="where to run (default: a temp dir under the current directory)")
    ap.add_argument("--quick", action="store_true", help="small counts and one repeat (a smoke run)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peers", default=",".join(ADAPTERS), help="comma-separated; fsjobstore is always included")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {','.join(WORKLOADS)}")
    ap.add_argument("--json", metavar="FILE", help="also write every figure of the run to FILE as JSON")
    ap.add_argument("--poll", type=float, default=0.005,
                    help="W3: how often peers with no wake-up mechanism poll (seconds)")
    args = ap.parse_args()
    names = ["fsjobstore", *[p for p in args.peers.split(",") if p and p != "fsjobstore"]]
    for p in names:
        if p not in ADAPTERS:
            ap.error(f"unknown peer {p!r}; choose from {', '.join(ADAPTERS)}")
    peers = {p: ADAPTERS[p] for p in names}
    work = set(args.workloads.upper().split(","))
    if work - set(WORKLOADS):
        ap.error(f"unknown workload(s) {', '.join(sorted(work - set(WORKLOADS)))}; choose from {', '.join(WORKLOADS)}")
    q = args.quick
    n = 1000 if q else 10_000
    n_wake = 50 if q else 200
    depths = (100, 1000) if q else (100, 10_000, 100_000)
    mem = (1000, 5000) if q else (1000, 100_000)
    n_w7, n_w8 = (1000, 300) if q else (20_000, 10_000)
    base = os.path.abspath(args.dir or tempfile.mkdtemp(prefix="fsjobstore-peers-", dir="."))
    os.makedirs(base, exist_ok=True)
    run = Runner(base, 1 if q else args.repeat)
    out: list[str] = []

    def emit(text: str) -> None:
        out.append(text)
        print(text, flush=True)

    started = time.strftime("%Y-%m-%d %H:%M")
    emit(f"fsjobstore vs peers in {base}: {os.cpu_count()} cores, median of {run.repeat}, "
         f"{n:,} jobs per W1/W2/W4 run, started {started}")
    figures: dict[str, Any] = {}

    if "RAW" in work:
        raw = {
            "rename between two directories /s": run.median(lambda d: _raw.rename(_mk(d), 20_000)),
            "create+write+close /s": run.median(lambda d: _raw.create(_mk(d), n, then_rename=False)),
            "create+write+close+rename /s": run.median(lambda d: _raw.create(_mk(d), n, then_rename=True)),
            "create+write+fsync+close+rename+dir-fsync /s": run.median(lambda d: _raw.durable_create(_mk(d), 2000)),
            "inotify round trip between processes, p50 ms": run.median(lambda d: _raw.inotify_round_trip(_mk(d))),
        }
        figures["raw"] = raw
        emit(table("Raw limits of this machine", ["operation", "rate"],
                   [[k, f"{v:,.0f}" if v > 100 else f"{v:.3f}"] for k, v in raw.items()]))

    def safe(cls: type[Adapter]) -> str:
        return "yes" if cls.mp_safe else "no: 1 process only"

    for durable, label, key in ((False, "W1 enqueue (fsync off)", "W1"), (True, "W4 enqueue (fsync on)", "W4")):
        if key not in work:
            continue
        rows = []
        runs = run.rotate({p: (lambda d, cls=cls, durable=durable: w1_enqueue(cls, d, n, durable))
                           for p, cls in peers.items() if not durable or has_durable_mode(cls)})
        rates = {p: statistics.median(r) for p, r in runs.items()}
        for p, cls in peers.items():
            if p not in rates:
                rows.append([p, "n/a: no fsync option", "", cls.put_note])
                continue
            mode = "always fsyncs" if not durable and cls.fsync is True else ""
            rows.append([p, f"{rates[p]:,.0f}" + (f" ({mode})" if mode else ""),
                         ratio(rates["fsjobstore"], rates[p]), cls.put_note])
        figures[f"{key}-create"] = rates
        pairs = [run.once(lambda d, durable=durable: paired_create(d, n if not durable else n // 5, durable))
                 for _ in range(run.repeat)]
        figures[f"{key}-paired"] = (statistics.median(r for r, _ in pairs), statistics.median(o for _, o in pairs),
                                    statistics.median(o / r for r, o in pairs))
        emit(table(f"{label}: {n:,} small JSON jobs from one process, jobs/s", ["queue", "jobs/s",
                   "fsjobstore / this", "how"], rows))
        raw_rate, ours, share = figures[f"{key}-paired"]
        emit(f"\nInterleaved with the raw limit (blocks of 250, median of {run.repeat}): raw "
             f"{'create+write+fsync+close+rename+dir-fsync' if durable else 'create+write+close+rename'} "
             f"{raw_rate:,.0f}/s, fsjobstore {ours:,.0f}/s: {share:.0%} of raw")

    for durable, label, key in ((False, "W2 drain (fsync off)", "W2"), (True, "W4 drain (fsync on)", "W4")):
        if key not in work:
            continue
        rows, rates = [], {}
        for w in (1, 2, 4):  # one worker count at a time, the queues (and the floor) in rotation
            fns: dict[Any, Callable[[str], Any]] = {
                p: (lambda d, cls=cls, w=w, durable=durable: w2_drain(cls, d, n, w, durable))
                for p, cls in peers.items() if (not durable or has_durable_mode(cls)) and (w == 1 or cls.mp_safe)}
            fns["floor"] = lambda d, w=w, durable=durable: (
                _raw.drain_floor(_mk(d), n if not durable else n // 3, w, durable=durable), 0, 0, 0)
            for p, results in run.rotate(fns).items():
                # the median rate, but the *largest* duplicate/loss/error counts of any repeat
                rates[(p, w)] = (statistics.median(r[0] for r in results),
                                 *(max(r[k] for r in results) for k in (1, 2, 3)))
        for p, cls in peers.items():
            if durable and not has_durable_mode(cls):
                rows.append([p, "n/a: no fsync option", "", "", "", ""])
                continue
            row = [p, safe(cls)]
            for w in (1, 2, 4):
                if (p, w) not in rates:
                    row.append("n/a")
                    continue
                rate, dups, lost, errs = rates[(p, w)]
                row.append(f"{rate:,.0f} {checks(dups, lost, errs)}")
            row.append("yes" if cls.acks else "no: dequeue deletes")
            rows.append(row)
        floor = {w: rates.pop(("floor", w))[0] for w in (1, 2, 4)}
        rates = {k: v[0] for k, v in rates.items()}
        figures[f"{key}-floor"] = floor
        for row in rows:
            if row[0] != "fsjobstore" and (row[0], 1) in rates:
                row.append(" / ".join(ratio(rates.get(("fsjobstore", w)), rates.get((row[0], w))) or "-"
                                      for w in (1, 2, 4)))
            else:
                row.append("")
        rows.append(["floor: bare syscalls", "(see note)", *(f"{floor[w]:,.0f}" for w in (1, 2, 4)), "",
                     " / ".join(ratio(rates.get(("fsjobstore", w)), floor[w]) or "-" for w in (1, 2, 4))])
        figures[f"{key}-drain"] = rates
        emit(table(f"{label}: {n:,} jobs, jobs/s (duplicates/losses[/worker errors])",
                   ["queue", "multi-process", "1 worker", "2 workers", "4 workers", "item safe while worked on",
                    "fsjobstore / this (1/2/4)"], rows))
        emit(f"\nfloor: the least a claim+complete costs when a job is claimed by renaming its file and "
             f"published by renaming it again: rename, open, read, append{', fsync' if durable else ''}, close, "
             f"rename{', directory fsync' if durable else ''}, in bare syscalls, no checks, no contention "
             "(bench/_raw.py drain_floor).")

    if "W3" in work:
        rows = []
        idle_for = 2.0 if q else 5.0
        for p, cls in peers.items():
            for durable in ((False, True) if p == "fsjobstore" else (False,)):
                p50, p99, mx, cpu, after = run.median(lambda d, cls=cls, durable=durable: w3_wakeup(
                    cls, d, n_wake, durable, args.poll, idle_for))
                how = ("inotify" if p == "fsjobstore" else f"polls every {args.poll * 1000:g} ms")
                label = f"{p} (producer durable={durable})" if p == "fsjobstore" else p
                rows.append([label, f"{p50:.2f}", f"{p99:.2f}", f"{mx:.2f}", f"{after:.2f}", f"{cpu:.2f}%", how])
                figures[f"W3-{label}"] = (p50, p99, mx, cpu, after)
        emit(table(f"W3 wake-up: one idle worker, one job every 20 ms from another process, {n_wake} jobs",
                   ["queue", "p50 ms", "p99 ms", "max ms", "p50 ms from put's return", "idle CPU",
                    "how the worker waits"], rows))

    if "W5" in work:
        rows = []
        for p, cls in peers.items():
            cells = []
            for depth in depths:
                if depth >= 100_000 and p in ("huey-file", "dirq"):
                    cells.append("skipped: fill/drain too slow")
                    continue
                us = run.median(lambda d, cls=cls, depth=depth: w5_depth(cls, d, depth, 300 if q else 1000), 1)
                figures[f"W5-{p}-{depth}"] = us
                cells.append(f"{us:,.0f}")
            first, last = figures.get(f"W5-{p}-{depths[0]}"), figures.get(f"W5-{p}-{depths[-1]}")
            rows.append([p, *cells, f"{last / first:.2f}x" if first and last else ""])
        emit(table("W5 depth: microseconds per claim+complete (fsync off, one process)",
                   ["queue", *[f"{d:,} pending" for d in depths], f"{depths[-1]:,} / {depths[0]:,}"], rows))

    if "W6" in work:
        rows = []
        for p, cls in peers.items():
            if mem[1] >= 100_000 and p in ("huey-file", "dirq", "litequeue"):
                rows.append([p, "skipped: drain too slow (see W5)", "", ""])
                continue
            a, b = run.median(lambda d, cls=cls: w6_memory(cls, d, *mem), 1)
            figures[f"W6-{p}"] = (a, b)
            rows.append([p, f"{a:.1f}", f"{b:.1f}", f"{b - a:+.1f}"])
        emit(table(f"W6 memory: one worker's RSS in MB after {mem[0]:,} and {mem[1]:,} jobs",
                   ["queue", f"after {mem[0]:,}", f"after {mem[1]:,}", "growth"], rows))

    if "W7" in work:
        emit(_runtime_cells.w7(run, n_w7, w2_drain, figures))
    if "W8" in work:
        emit(_runtime_cells.w8(run, n_w8, peers, w2_drain, figures))

    emit(verdicts(figures, peers, depths, mem))
    if args.json:
        measured = commit(os.path.dirname(fsjobstore.__file__))  # the fsjobstore this run imported
        write_json(args.json, figures, {
            "started": started, "finished": time.strftime("%Y-%m-%d %H:%M"), "commit": measured,
            "cores": os.cpu_count(), "jobs": n, "repeat": run.repeat, "workloads": sorted(work),
            "peers": list(peers), "dir": base, "command": " ".join(["python", "bench/peers.py", *sys.argv[1:]])})
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)


def _jsonable(value: Any) -> Any:
    """Figures as JSON: a (queue, workers) key becomes "queue/workers", tuples become lists."""
    if isinstance(value, dict):
        return {("/".join(map(str, k)) if isinstance(k, tuple) else str(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write_json(path: str, figures: dict[str, Any], run: dict[str, Any]) -> None:
    import json

    with open(path, "w") as fh:
        json.dump({"run": run, "figures": _jsonable(figures)}, fh, indent=1, sort_keys=True)
        fh.write("\n")


def _mk(d: str) -> str:
    os.makedirs(d)
    return d


def verdicts(f: dict[str, Any], peers: dict[str, type[Adapter]], depths: tuple[int, ...],
             mem: tuple[int, int]) -> str:
    """The issue's targets, each computed from this run's figures."""
    lines = ["\n### Targets (from this run)"]

    def say(ok: bool, text: str) -> None:
        lines.append(f"- [{'x' if ok else ' '}] {text}")

    safe_peers = [p for p, c in peers.items() if p != "fsjobstore" and c.mp_safe]
    for key, what in (("W2-drain", "W2 drain"), ("W4-drain", "W4 durable drain")):
        rates = f.get(key)
        if not rates:
            continue
        for w in (1, 2, 4):
            ours = rates.get(("fsjobstore", w))
            pool = safe_peers if w > 1 else [p for p in peers if p != "fsjobstore"]
            if key == "W2-drain":
                pool = safe_peers
            best = max(((rates[(p, w)], p) for p in pool if (p, w) in rates), default=None)
            if ours is None or best is None:
                continue
            need = 1.2 if key == "W2-drain" else 1.0
            target = need * best[0]
            floor = f.get(f"{key[:2]}-floor", {}).get(w)
            reach = ""
            if floor:
                # CPU a job may cost above the bare syscalls and still make the target: the busy
                # cores (at most one per worker) over the target rate, minus the same over the floor.
                cores = min(w, os.cpu_count() or 1)
                spare = (cores / target - cores / floor) * 1e6
                reach = (f"; floor {floor:,.0f}/s, fsjobstore at {ours / floor:.0%} of it; the target "
                         f"{target:,.0f}/s " + ("is above the floor: out of reach of any design that "
                         "renames a job file to claim it and again to complete it" if spare <= 0 else
                         f"leaves {spare:.1f} us of CPU per job for everything above the bare syscalls"))
            say(ours >= target, f"{what}, {w} worker(s): fsjobstore {ours:,.0f}/s vs fastest "
                f"{'multi-process-safe ' if key == 'W2-drain' else 'durable '}peer {best[1]} {best[0]:,.0f}/s "
                f"= {ours / best[0]:.2f}x (target {need}x){reach}")
    if "W1-paired" in f:
        limit, create, share = f["W1-paired"]
        say(share >= 0.5, f"W1 create {create:,.0f}/s = {share:.0%} of raw create+write+close+rename "
            f"{limit:,.0f}/s interleaved (target 50%)")
    if "W4-paired" in f:
        limit, create, share = f["W4-paired"]
        say(share >= 0.6, f"W4 durable create {create:,.0f}/s = {share:.0%} of raw durable create "
            f"{limit:,.0f}/s interleaved (target 60%)")
    for key, val in f.items():
        if key.startswith("W3-fsjobstore"):
            p50, p99, _, cpu, after = val
            say(p50 <= 1.0 and p99 <= 3.0, f"W3 {key[3:]}: p50 {p50:.2f} ms, p99 {p99:.2f} ms (targets 1 / 3 ms); "
                f"p50 {after:.2f} ms from the put's return")
            say(cpu < 1.0, f"W3 {key[3:]}: idle worker CPU {cpu:.2f}% of a core (target < 1%)")
    a, b = f.get(f"W5-fsjobstore-{depths[0]}"), f.get(f"W5-fsjobstore-{depths[-1]}")
    if a and b:
        say(b <= 2 * a, f"W5 claim+complete {b:,.0f} us at {depths[-1]:,} pending vs {a:,.0f} us at "
            f"{depths[0]:,} = {b / a:.2f}x (target 2x)")
    m = f.get("W6-fsjobstore")
    if m:
        say(m[1] - m[0] < 10,
            f"W6 RSS growth {m[1] - m[0]:+.1f} MB from {mem[0]:,} to {mem[1]:,} jobs (target < 10 MB)")
    for ok, text in _runtime_cells.verdict_lines(f):
        say(ok, text)
    return "\n".join(lines)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
