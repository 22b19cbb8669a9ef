"""fsjobstore benchmark: python bench/bench.py [--dir DIR] [--quick]

Prints create/s, claim+fulfil/s with 1, 2 and 4 worker processes, wake-up latency p50/p99, and
claim cost at 100 and 100,000 pending jobs, for durable on and off, next to this machine's raw
limits measured in the same run. File-creation rates swing widely between runs on this kind of
machine: compare figures from one run only. Each figure is the median of --repeat runs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fsjobstore import JobStore


def raw_rename(base: str, n: int) -> float:
    a, b = os.path.join(base, "ra"), os.path.join(base, "rb")
    os.makedirs(a)
    os.makedirs(b)
    for i in range(n):
        with open(os.path.join(a, str(i)), "wb") as fh:
            fh.write(b"x" * 200)
    t = time.perf_counter()
    for i in range(n):
        os.rename(os.path.join(a, str(i)), os.path.join(b, str(i)))
    return n / (time.perf_counter() - t)


def raw_durable_create(base: str, n: int) -> float:
    tmp, dst = os.path.join(base, "dt"), os.path.join(base, "dd")
    os.makedirs(tmp)
    os.makedirs(dst)
    dfd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    t = time.perf_counter()
    for i in range(n):
        p = os.path.join(tmp, str(i))
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"x" * 200)
        os.fsync(fd)
        os.close(fd)
        os.rename(p, os.path.join(dst, str(i)))
        os.fsync(dfd)
    rate = n / (time.perf_counter() - t)
    os.close(dfd)
    return rate


def bench_create(root: str, n: int, durable: bool) -> float:
    with JobStore(root, durable=durable) as s:
        t = time.perf_counter()
        for i in range(n):
            s.create({"i": i, "payload": "x" * 50})
        return n / (time.perf_counter() - t)


def _drain_worker(root: str, durable: bool, start: mp.synchronize.Event, counter: mp.sharedctypes.Synchronized) -> None:  # type: ignore[name-defined]
    with JobStore(root, durable=durable) as s:
        start.wait()
        done = 0
        while (lease := s.pull_work()) is not None:
            lease.fulfill(b"ok")
            done += 1
        with counter.get_lock():
            counter.value += done


def bench_drain(root: str, n: int, workers: int, durable: bool) -> float:
    with JobStore(root, durable=False) as s:
        for i in range(n):
            s.create(i)
    ctx = mp.get_context("fork")
    start, counter = ctx.Event(), ctx.Value("i", 0)
    procs = [ctx.Process(target=_drain_worker, args=(root, durable, start, counter)) for _ in range(workers)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # let every worker open the store
    t = time.perf_counter()
    start.set()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - t
    assert counter.value == n, f"drained {counter.value} of {n}"
    return n / elapsed


def _wake_worker(root: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    with JobStore(root, poll_interval=5.0) as s:
        s.pull_work()
        out.put("ready")
        lat = []
        for _ in range(n):
            lease = s.pull_work(timeout=10)
            got = time.monotonic()  # CLOCK_MONOTONIC is system-wide on Linux
            assert lease is not None
            lat.append(got - lease.request["t"])
            lease.fulfill(b"")
        out.put(lat)


def bench_wakeup(root: str, n: int, durable: bool) -> tuple[float, float]:
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    p = ctx.Process(target=_wake_worker, args=(root, n, out))
    p.start()
    assert out.get(timeout=30) == "ready"
    time.sleep(0.3)
    with JobStore(root, durable=durable) as s:
        for _ in range(n):
            s.create({"t": time.monotonic()})
            time.sleep(0.02)
    lat = sorted(out.get(timeout=60))
    p.join()
    return lat[len(lat) // 2] * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000


def bench_depth(root: str, depth: int, claims: int, durable: bool) -> tuple[float, float]:
    """Microseconds per claim, and per claim+fulfil, with `depth` jobs pending."""
    with JobStore(root, durable=False) as s:
        for i in range(depth + 2 * claims):
            s.create(i)
    with JobStore(root, durable=durable) as s:
        s.pull_work().release()  # type: ignore[union-attr]  # warm the index, as a running worker has
        t = time.perf_counter()
        leases = [s.pull_work() for _ in range(claims)]
        claim_us = (time.perf_counter() - t) / claims * 1e6
        for lease in leases:
            lease.fulfill(b"")  # type: ignore[union-attr]
        t = time.perf_counter()
        for _ in range(claims):
            s.pull_work().fulfill(b"")  # type: ignore[union-attr]
        both_us = (time.perf_counter() - t) / claims * 1e6
    return claim_us, both_us


def median(fn, repeat: int, base: str) -> float | tuple[float, ...]:  # type: ignore[no-untyped-def]
    results = []
    for _ in range(repeat):
        d = tempfile.mkdtemp(dir=base)
        try:
            results.append(fn(d))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    if isinstance(results[0], tuple):
        return tuple(statistics.median(r[i] for r in results) for i in range(len(results[0])))
    return statistics.median(results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="where to run (default: a temp dir under the cwd)")
    ap.add_argument("--quick", action="store_true", help="smaller counts (for a smoke run)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="fsjobstore-bench-", dir=".")
    os.makedirs(base, exist_ok=True)
    q = args.quick
    n_create, n_drain, n_wake = (500, 1000, 50) if q else (3000, 5000, 200)
    deep = 10_000 if q else 100_000
    r = 1 if q else args.repeat
    rows: list[tuple[str, str, str]] = []

    def row(name: str, on: str, off: str) -> None:
        rows.append((name, on, off))
        print(f"{name:44} {on:>14} {off:>14}", flush=True)

    print(f"fsjobstore bench in {os.path.abspath(base)} (median of {r}; {os.cpu_count()} cores)")
    print(f"{'':44} {'durable=True':>14} {'durable=False':>14}")
    row("raw rename between two dirs /s", "", f"{median(lambda d: raw_rename(d, 20000), r, base):,.0f}")
    row("raw write+fsync+rename+dir-fsync /s",
        f"{median(lambda d: raw_durable_create(d, 2000), r, base):,.0f}", "")
    row("create /s", *(f"{median(lambda d, x=x: bench_create(d, n_create if x else 4 * n_create, x), r, base):,.0f}"
                       for x in (True, False)))
    for w in (1, 2, 4):
        row(f"claim+fulfil /s, {w} worker process(es)",
            *(f"{median(lambda d, x=x, w=w: bench_drain(d, n_drain if x else 2 * n_drain, w, x), r, base):,.0f}"
              for x in (True, False)))
    for x in (True, False):
        p50, p99 = median(lambda d, x=x: bench_wakeup(d, n_wake, x), r, base)  # type: ignore[misc]
        rows.append((f"wake-up p50 / p99 ms (durable={x})", f"{p50:.2f} / {p99:.2f}", ""))
        print(f"wake-up latency p50 / p99, durable={x!s:5}: {p50:.2f} ms / {p99:.2f} ms", flush=True)
    for depth in (100, deep):
        on = median(lambda d, depth=depth: bench_depth(d, depth, 300, True), 1, base)
        off = median(lambda d, depth=depth: bench_depth(d, depth, 300, False), 1, base)
        row(f"claim us / claim+fulfil us at {depth:,} pending", f"{on[0]:.0f} / {on[1]:.0f}",  # type: ignore[index]
            f"{off[0]:.0f} / {off[1]:.0f}")  # type: ignore[index]
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
