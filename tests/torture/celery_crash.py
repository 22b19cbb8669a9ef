"""Crash test of Celery on a broker: a real ``celery worker`` SIGKILLed at random while it runs
``acks_late`` tasks, restarted each time; every task sent must have left its side effect.

    python tests/torture/celery_crash.py                                   # fsjobstore, 2000 tasks, 10 kills
    python tests/torture/celery_crash.py --tasks 300 --kills 3 --seed 1    # the CI form (tests/contrib)
    python tests/torture/celery_crash.py --transport filesystem --expect-loss   # kombu's filesystem://

The one task is declared ``acks_late=True, reject_on_worker_lost=True``, as a user who wants a
task to survive a worker's death declares it. It sleeps 0-20 ms and then appends its task id to
``effects.log`` (O_APPEND, one short ``write``, fsync): the side effect, recorded whole or not at
all whenever the process dies. A producer sends ``--tasks`` tasks up front; then a ``celery -A
celery_crash:app worker`` (prefork pool, concurrency 2, in a session of its own) is started, and
``--kills`` times, once it has recorded a side effect since it started and after a random pause,
its whole process group (the pool's children too) is SIGKILLed and a new worker started. After
the last start the worker drains until every id is recorded, or until ``--idle-timeout`` seconds
pass with no new side effect; then it is stopped (SIGTERM, a warm shutdown), and what the broker
still holds is counted.

Transports: ``fsjobstore`` (broker and result backend ``fsjobstore://DIR/store``: an unacked
message is a lease of the worker's, taken over when it dies) and ``filesystem`` (kombu's own,
``data_folder_in`` = ``data_folder_out``, no result backend: a message is removed from its folder
when the worker reads it, so what a killed worker had prefetched or was running is gone).

Prints one line of JSON: tasks sent, ids recorded, lost (sent, never recorded), duplicates (ids
recorded more than once: allowed under at-least-once, counted), executions (lines recorded), kills
done, what the broker still held once the worker stopped, with fsjobstore the tasks without a
stored SUCCESS result, and times: ``send_s`` (sending every task), ``drain_s`` (from the first send
until every id was recorded, or the drain gave up) and ``wall_s`` (the whole run). Exits 1 if a
task was lost (or, with fsjobstore, has no result), unless ``--expect-loss`` is given.

The worker imports this file as the module ``celery_crash`` (its directory is the worker's working
directory) and builds the app from the environment (``CELERY_CRASH_TRANSPORT``, ``CELERY_CRASH_DIR``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))  # _celery_app.group_alive

from _celery_app import group_alive  # noqa: E402
from celery import Celery  # noqa: E402

# Names the fsjobstore:// URL in kombu (an installed wheel's .pth does it; an editable install does not).
import fsjobstore.contrib.kombu  # noqa: E402, F401

TRANSPORTS = ("fsjobstore", "filesystem")
ENV_TRANSPORT, ENV_DIR = "CELERY_CRASH_TRANSPORT", "CELERY_CRASH_DIR"
TASK = "celery_crash.touch"
QUEUE = "celery"
EFFECTS = "effects.log"
WORKER_PGID = "worker-groups.txt"  # the process group of every worker started, one a line


def record(root: str, task_id: str) -> None:
    """Append the task's id: one write of a short line to an O_APPEND file lands whole or not at
    all when the process is killed, and the fsync makes it outlive the machine too."""
    fd = os.open(os.path.join(root, EFFECTS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{task_id}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def make_app(transport: str, root: str) -> Celery:
    """The app, for the producer, the checker and the worker alike."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}: one of {', '.join(TRANSPORTS)}")
    app = Celery("celery_crash")
    if transport == "fsjobstore":
        url = f"fsjobstore://{os.path.join(root, 'store')}"
        app.conf.update(broker_url=url, result_backend=url)
    else:
        data, control = os.path.join(root, "broker"), os.path.join(root, "control")
        for folder in (data, control):  # kombu's filesystem transport makes neither
            os.makedirs(folder, exist_ok=True)
        app.conf.update(broker_url="filesystem://", broker_transport_options={
            "data_folder_in": data, "data_folder_out": data, "control_folder": control})
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)

    @app.task(bind=True, name=TASK, acks_late=True, reject_on_worker_lost=True)
    def touch(self: Any, seconds: float) -> str:
        time.sleep(seconds)
        record(root, self.request.id)
        return str(self.request.id)

    return app


# The worker's app: this file imported as ``celery_crash`` by ``celery -A celery_crash:app``.
app = make_app(os.environ[ENV_TRANSPORT], os.environ[ENV_DIR]) if ENV_DIR in os.environ else None


# == the worker process ===========================================================================
class Worker:
    """One ``celery worker`` at a time, each in a session (and process group) of its own."""

    def __init__(self, transport: str, root: str, concurrency: int) -> None:
        self.transport, self.root, self.concurrency = transport, root, concurrency
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0

    def start(self) -> None:
        self.started += 1
        env = {**os.environ, ENV_TRANSPORT: self.transport, ENV_DIR: self.root}
        log = open(os.path.join(self.root, f"worker-{self.started}.log"), "wb")  # noqa: SIM115 (the child keeps it)
        with log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "celery_crash:app", "worker", "--pool", "prefork",
                 "--concurrency", str(self.concurrency), "--loglevel", "WARNING", "--without-gossip",
                 "--without-mingle", "--without-heartbeat", "--hostname", "crash@%h"],
                cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        # For whoever runs this script and must not leave a worker behind if the script itself is
        # killed (the worker's group is not the script's): tests/contrib/test_celery_crash.py.
        with open(os.path.join(self.root, WORKER_PGID), "a") as fh:
            fh.write(f"{self.proc.pid}\n")

    def kill(self) -> None:
        """SIGKILL the whole group (the pool's children with the main process) and wait for it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 10
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.proc = None

    def stop(self, timeout: float) -> bool:
        """A warm shutdown (SIGTERM): running tasks finish and are acknowledged. False if it had
        to be killed."""
        if self.proc is None:
            return True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return False
        self.kill()  # the group's stragglers, if any
        return True

    def died(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


# == side effects =================================================================================
class Effects:
    """The ids recorded so far, read as ``effects.log`` grows (whole lines only)."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, EFFECTS)
        self.seen: Counter[str] = Counter()
        self._offset = 0
        self._partial = b""

    def poll(self) -> int:
        """Reads what was appended; returns how many lines were new."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return 0
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        self.seen.update(line.decode() for line in lines if line)
        return len(lines)


def broker_holds(transport: str, root: str) -> int:
    """Messages the broker still holds for the task queue (pending or delivered, unacknowledged)."""
    if transport == "fsjobstore":
        from fsjobstore import JobStore

        with JobStore(os.path.join(root, "store"), create=False) as store:
            by_queue = store.statistics().by_queue.get(QUEUE, {})
            return int(by_queue.get("pending", 0)) + int(by_queue.get("active", 0))
    folder = os.path.join(root, "broker")
    return sum(1 for name in os.listdir(folder) if name.endswith(".msg")) if os.path.isdir(folder) else 0


def missing_results(celery_app: Celery, ids: list[str]) -> int:
    return sum(1 for task_id in ids if celery_app.AsyncResult(task_id).state != "SUCCESS")


# == the run ======================================================================================
def run(transport: str, tasks: int, kills: int, seed: int, root: str, idle_timeout: float,
        concurrency: int = 2, max_pause: float = 1.5) -> dict[str, Any]:
    rng = random.Random(seed)
    os.makedirs(root, exist_ok=True)
    if os.path.exists(os.path.join(root, "sent.txt")):
        raise SystemExit(f"{root} holds a run already: give a new directory")
    t0 = time.monotonic()
    producer_app = make_app(transport, root)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(tasks)]
    with producer_app.producer_or_acquire() as producer:
        for task_id in ids:
            producer_app.send_task(TASK, args=(rng.uniform(0.0, 0.02),), task_id=task_id, producer=producer,
                                   ignore_result=transport != "fsjobstore")
    sent_s = time.monotonic() - t0
    with open(os.path.join(root, "sent.txt"), "w") as fh:
        fh.write("\n".join(ids) + "\n")

    effects, worker = Effects(root), Worker(transport, root, concurrency)
    wanted = set(ids)
    killed = restarts_after_exit = 0
    stopped_warm = True

    def all_done() -> bool:
        effects.poll()
        return wanted <= effects.seen.keys()

    try:
        worker.start()
        for _ in range(kills):
            # A moment while tasks run: once this worker has recorded something, after a pause.
            before = sum(effects.seen.values())
            deadline = time.monotonic() + idle_timeout
            while not all_done() and sum(effects.seen.values()) == before and time.monotonic() < deadline:
                if worker.died() is not None:  # it died by itself: say so, and start another
                    restarts_after_exit += 1
                    worker.kill()
                    worker.start()
                time.sleep(0.02)
            if all_done() or time.monotonic() >= deadline:
                break
            time.sleep(rng.uniform(0.0, max_pause))
            if all_done():
                break
            worker.kill()
            killed += 1
            worker.start()
        last_new = time.monotonic()
        while not all_done() and time.monotonic() - last_new < idle_timeout:
            if effects.poll():
                last_new = time.monotonic()
            if worker.died() is not None:
                restarts_after_exit += 1
                worker.kill()
                worker.start()
            time.sleep(0.05)
        drained_s = time.monotonic() - t0
        stopped_warm = worker.stop(timeout=30)
    finally:
        worker.kill()
    effects.poll()

    recorded = wanted & effects.seen.keys()
    summary: dict[str, Any] = {
        "transport": transport, "tasks": tasks, "kills": killed, "seed": seed,
        "recorded": len(recorded), "lost": len(wanted - recorded),
        "duplicates": sum(1 for n in effects.seen.values() if n > 1),
        "executions": sum(effects.seen.values()),
        "unexpected": len(effects.seen.keys() - wanted),
        "left_in_broker": broker_holds(transport, root),
        "worker_starts": worker.started, "worker_exits": restarts_after_exit, "stopped_warm": stopped_warm,
        "send_s": round(sent_s, 2), "drain_s": round(drained_s, 2), "wall_s": round(time.monotonic() - t0, 2),
    }
    if transport == "fsjobstore":
        summary["results_missing"] = missing_results(producer_app, ids)
    return summary


def failed(summary: dict[str, Any]) -> bool:
    return bool(summary["lost"] or summary["unexpected"] or summary.get("results_missing"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=TRANSPORTS, default="fsjobstore")
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    ap.add_argument("--dir", help="where the run's files go (kept); default: a temp dir, removed unless it failed")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--idle-timeout", type=float, default=60.0,
                    help="seconds without a new side effect after which the drain gives up (default 60)")
    ap.add_argument("--expect-loss", action="store_true",
                    help="report losses but exit 0 (for a transport known to lose messages)")
    args = ap.parse_args(argv)
    # SIGTERM unwinds as an exception, so the worker's group is killed on the way out (run's finally).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    root = os.path.abspath(args.dir) if args.dir else tempfile.mkdtemp(prefix="celery-crash-")
    summary = run(args.transport, args.tasks, args.kills, seed, root, args.idle_timeout, args.concurrency)
    summary["dir"] = root
    bad = failed(summary)
    if not args.dir and not bad:
        shutil.rmtree(root, ignore_errors=True)
        summary["dir"] = None
    print(json.dumps(summary), flush=True)
    return 1 if bad and not args.expect_loss else 0


if __name__ == "__main__":
    sys.exit(main())
