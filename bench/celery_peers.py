"""Celery through a real worker process, per transport: fsjobstore against kombu's ``filesystem``
transport and Redis.

    python bench/celery_peers.py                                   # 3 rounds (about 4 minutes on 2 cores)
    python bench/celery_peers.py --quick                           # small counts, one round: that it runs
    python bench/celery_peers.py --transports fsjobstore,redis --rounds 5 --json bench/last_celery_run.json

Transports (``--transports``, comma-separated; default ``fsjobstore,filesystem,redis``):

- ``fsjobstore``: broker and result backend ``fsjobstore://CELL/store``, a durable store (the
  default: every create and fulfil fsynced).
- ``fsjobstore-nosync``: the same store made with ``durable=False`` (not in the default set): what
  the fsyncs cost.
- ``filesystem``: kombu's own, ``data_folder_in`` = ``data_folder_out``; no result backend. It
  fsyncs nothing, and a worker waiting for work looks again every second (kombu's default
  ``polling_interval``).
- ``redis``: a ``redis-server`` started for the run on a loopback port, in memory only (no
  snapshots, no append-only file), broker database 0, results database 1; skipped, saying so, when
  ``redis-server`` or the ``redis`` package is missing (``apt-get install redis-server``,
  ``pip install redis``).

Each cell (one transport in one round) runs in a fresh directory with a fresh ``celery worker``
(prefork pool, ``--concurrency``, default 2, Celery's default prefetch) in a session of its own,
and a fresh client process forked for it. Once one task has gone through (the worker is up), the
client measures:

- **tasks/s**: ``--tasks`` trivial tasks (each appends its number to a file with one O_APPEND
  write, no fsync) sent with ``ignore_result=True``, timed from the first send until the file holds
  all of them (polled every 10 ms): the broker alone, sending included.
- **tasks/s, results stored** (transports with a result backend): the same again with results
  stored: the broker and the result backend.
- **round trip**: ``--trips`` calls of ``add.delay(1, 1).get()``, one at a time, after 5 not
  counted: p50 and p90 in ms (transports with a result backend).

Every task must have run: the file is checked for a number missing or run twice (the table shows
them as (duplicates/losses), which must be (0/0): no worker is killed here). The worker is stopped
(SIGTERM) and the cell's directory removed. The order of the transports rotates between rounds
(each round starts one later), so a slow spell of the machine does not always fall on the same one;
the table shows medians over the rounds and each round's figure. Other processes on the machine
move these figures: compare transports within one run. ``--json FILE`` writes every cell's figures
with the run's date, commit and settings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from importlib.metadata import version
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # the repository, from a clone
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _celery_app import ENV_DIR, ENV_REDIS, ENV_TRANSPORT, LINE, TRANSPORTS, WITH_RESULTS, group_alive, make_app
from _report import checks, commit, table

import fsjobstore

HERE = os.path.dirname(os.path.realpath(__file__))

CTX = mp.get_context("fork")
DEFAULT = ("fsjobstore", "filesystem", "redis")
WARM_TRIPS = 5
# The worker's command: Celery's own entry point with this directory on sys.path, for _celery_app.
# Python puts the working directory (the cell's) first for -c.
BOOT = "import sys; sys.path.append(sys.argv.pop(1)); from celery.__main__ import main; main()"


# == the processes ================================================================================
def start_worker(transport: str, root: str, concurrency: int, redis_url: str | None) -> subprocess.Popen[bytes]:
    # The checkout's fsjobstore, as this process imports it (it holds no module named celery).
    path = os.pathsep.join(p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, ENV_TRANSPORT: transport, ENV_DIR: root, "PYTHONPATH": path}
    if redis_url:
        env[ENV_REDIS] = redis_url
    with open(os.path.join(root, "worker.log"), "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", BOOT, HERE, "-A", "_celery_app:app", "worker", "--pool", "prefork",
             "--concurrency", str(concurrency), "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "--hostname", f"bench-{transport}@%h"],
            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)


def stop_group(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM (a warm shutdown), then SIGKILL to whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)


class RedisServer:
    """A redis-server of the run's own on a free loopback port, in memory only."""

    def __init__(self, base: str) -> None:
        import redis

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        folder = tempfile.mkdtemp(prefix="redis-", dir=base)
        with open(os.path.join(folder, "redis.log"), "wb") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                 "--dir", folder], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.url = f"redis://127.0.0.1:{self.port}"
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start (see {folder}/redis.log)") from None
                time.sleep(0.05)
        self.version = str(self.client.info("server").get("redis_version"))

    def flush(self) -> None:
        self.client.flushall()

    def stop(self) -> None:
        self.client.close()
        stop_group(self.proc, grace=10)


def redis_or_why_not(base: str) -> tuple[RedisServer | None, str]:
    if shutil.which("redis-server") is None:
        return None, "redis-server not found (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return None, "the redis package is missing (pip install redis)"
    return RedisServer(base), ""


# == one cell =====================================================================================
def _lines(path: str) -> int:
    try:
        return os.stat(path).st_size // LINE
    except FileNotFoundError:
        return 0


def wait_lines(path: str, want: int, idle: float = 60.0) -> float:
    """Wait until the effects file holds ``want`` lines; the time it did (perf_counter)."""
    seen, last = _lines(path), time.monotonic()
    while seen < want:
        time.sleep(0.01)
        now = _lines(path)
        if now != seen:
            seen, last = now, time.monotonic()
        elif time.monotonic() - last > idle:
            raise RuntimeError(f"no task ran for {idle:.0f} s: {seen} of {want} done")
    return time.perf_counter()


def client(transport: str, root: str, tasks: int, trips: int, redis_url: str | None) -> dict[str, Any]:
    """The client's measurements of one cell (run in a process of its own)."""
    app = make_app(transport, root, redis_url)
    bump, add = app.tasks["bench.bump"], app.tasks["bench.add"]
    effects = os.path.join(root, "effects.log")
    t = time.perf_counter()
    bump.apply_async((10**8 - 1,), ignore_result=True)  # through once: the worker is up and consuming
    out: dict[str, Any] = {"first_s": wait_lines(effects, 1, idle=120) - t}
    done = 1
    batches = [("rate", True), ("rate_results", False)] if transport in WITH_RESULTS else [("rate", True)]
    for key, ignore in batches:
        with app.producer_or_acquire() as producer:
            t0 = time.perf_counter()
            for i in range(done, done + tasks):
                bump.apply_async((i,), ignore_result=ignore, producer=producer)
            sent = time.perf_counter()
        done += tasks
        t1 = wait_lines(effects, done)
        out[key], out[f"{key}_send"] = tasks / (t1 - t0), tasks / (sent - t0)
    if transport in WITH_RESULTS and trips:
        lat = []
        for k in range(WARM_TRIPS + trips):
            t = time.perf_counter()
            if add.delay(1, 1).get(timeout=60) != 2:
                raise RuntimeError("1 + 1 came back wrong")
            if k >= WARM_TRIPS:
                lat.append((time.perf_counter() - t) * 1000)
        lat.sort()
        out["p50_ms"], out["p90_ms"] = statistics.median(lat), lat[min(len(lat) - 1, round(len(lat) * 0.9) - 1)]
    out["expected"] = done
    app.close()
    return out


def _client(transport: str, root: str, tasks: int, trips: int, redis_url: str | None, q: Any) -> None:
    try:
        q.put(client(transport, root, tasks, trips, redis_url))
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})


def cell(transport: str, base: str, tasks: int, trips: int, concurrency: int, redis: RedisServer | None,
         keep: bool = False) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix=f"{transport}-", dir=base)
    if redis is not None:
        redis.flush()
    os.sync()  # the last cell's write-back must not land in this one
    redis_url = redis.url if redis is not None else None
    worker = start_worker(transport, root, concurrency, redis_url)
    try:
        q = CTX.Queue()
        p = CTX.Process(target=_client, args=(transport, root, tasks, trips, redis_url, q))
        p.start()
        try:
            got: dict[str, Any] = q.get(timeout=1800)
        finally:
            p.join(10)
            if p.is_alive():
                p.kill()
    finally:
        stop_group(worker)
    if "error" in got:
        with open(os.path.join(root, "worker.log"), errors="replace") as fh:
            tail = fh.read()[-3000:]
        raise RuntimeError(f"{transport}: {got['error']} (in {root}); the worker's log ends:\n{tail}")
    with open(os.path.join(root, "effects.log")) as fh:
        ran = Counter(fh.read().split())
    got["duplicates"] = sum(1 for n in ran.values() if n > 1)
    got["lost"] = got.pop("expected") - len(ran)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return got


# == the run ======================================================================================
def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _median(cells: list[dict[str, Any]], key: str) -> float | None:
    values = [c[key] for c in cells if key in c]
    return statistics.median(values) if values else None


def report(results: dict[str, list[dict[str, Any]]], skipped: dict[str, str], title: str) -> str:
    rows = []
    for transport, cells in results.items():
        if not cells:
            continue
        rounds = " / ".join(_f(c["rate"]) for c in cells)
        rows.append([transport, _f(_median(cells, "rate")), _f(_median(cells, "rate_results")),
                     _f(_median(cells, "rate_send")), _f(_median(cells, "p50_ms"), 1), _f(_median(cells, "p90_ms"), 1),
                     checks(sum(c["duplicates"] for c in cells), sum(c["lost"] for c in cells)), rounds])
    text = table(title, ["transport", "tasks/s", "tasks/s, results stored", "sends/s", "round trip p50 ms",
                         "p90 ms", "(dup/lost)", "tasks/s by round"], rows)
    for transport, why in skipped.items():
        text += f"\n{transport}: skipped: {why}"
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transports", default=",".join(DEFAULT), help=f"comma-separated, of {','.join(TRANSPORTS)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=2000, help="tasks per throughput batch (default 2000)")
    ap.add_argument("--trips", type=int, default=200, help="round trips timed per cell (default 200)")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--dir", help="where the cells run (default: a temp dir under the current directory)")
    ap.add_argument("--keep", action="store_true", help="keep each cell's directory (its worker's log)")
    ap.add_argument("--quick", action="store_true", help="100 tasks, 10 round trips, one round: that it runs")
    ap.add_argument("--json", metavar="FILE", help="also write every cell's figures to FILE as JSON")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.trips, args.rounds = 100, 10, 1
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    unknown = set(transports) - set(TRANSPORTS)
    if unknown:
        ap.error(f"unknown transports: {', '.join(sorted(unknown))} (of {', '.join(TRANSPORTS)})")
    os.makedirs(os.path.abspath(args.dir or os.curdir), exist_ok=True)
    base = tempfile.mkdtemp(prefix="bench-celery-", dir=os.path.abspath(args.dir or os.curdir))
    measured = commit(os.path.dirname(fsjobstore.__file__))  # the fsjobstore this run imported
    started = time.strftime("%Y-%m-%d %H:%M")
    redis, skipped = None, {}
    try:
        if "redis" in transports:
            redis, why = redis_or_why_not(base)
            if redis is None:
                transports.remove("redis")
                skipped["redis"] = why
        versions = {"celery": version("celery"), "kombu": version("kombu"), "fsjobstore": fsjobstore.__version__,
                    **({"redis-server": redis.version, "redis-py": version("redis")} if redis else {})}
        print(f"# bench/celery_peers.py at {measured or 'no commit'}, {started}; {os.cpu_count()} cores, load "
              f"{os.getloadavg()[0]:.2f}; {args.tasks} tasks a batch, {args.trips} round trips, concurrency "
              f"{args.concurrency}, {args.rounds} rounds; " + ", ".join(f"{k} {v}" for k, v in versions.items()),
              flush=True)
        for why in skipped.values():
            print(f"# redis: skipped: {why}", flush=True)
        results: dict[str, list[dict[str, Any]]] = {t: [] for t in transports}
        for r in range(args.rounds):
            for transport in transports[r % len(transports):] + transports[:r % len(transports)]:
                got = cell(transport, base, args.tasks, args.trips, args.concurrency,
                           redis if transport == "redis" else None, args.keep)
                results[transport].append(got)
                print(f"round {r + 1} {transport:<18} {_f(got['rate'])} tasks/s, results stored "
                      f"{_f(got.get('rate_results'))}, sends/s {_f(got['rate_send'])}, round trip p50 "
                      f"{_f(got.get('p50_ms'), 1)} p90 {_f(got.get('p90_ms'), 1)} ms, first task "
                      f"{got['first_s']:.2f} s {checks(got['duplicates'], got['lost'])}", flush=True)
    finally:
        if redis is not None:
            redis.stop()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(report(results, skipped, f"Celery through a worker process, medians of {args.rounds} rounds "
                                   f"(load now {os.getloadavg()[0]:.2f})"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"run": {"started": started, "finished": time.strftime("%Y-%m-%d %H:%M"), "commit": measured,
                               "cores": os.cpu_count(), "tasks": args.tasks, "trips": args.trips,
                               "rounds": args.rounds, "concurrency": args.concurrency, "versions": versions,
                               "skipped": skipped},
                       "cells": results}, fh, indent=1, sort_keys=True)
    bad = sum(c["duplicates"] + c["lost"] for cells in results.values() for c in cells)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
