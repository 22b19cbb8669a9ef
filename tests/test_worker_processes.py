"""``fsjobstore worker`` and ``fsjobstore notify`` as real processes, stopped, paused and killed
with real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fsjobstore import JobState, JobStore

TESTS = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.slow


def start_worker(root: str, *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """A worker process run from the tests directory, so ``worker_tasks`` imports as a user's
    module would from their project."""
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115  (closed by the process)
    return subprocess.Popen([sys.executable, "-m", "fsjobstore", "worker", root, *args], cwd=TESTS, text=True,
                            stdout=out, stderr=subprocess.STDOUT)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("the condition never held")


def test_sigterm_lets_running_jobs_finish_then_the_worker_exits(tmp_path: Path) -> None:
    root, trace, out = str(tmp_path / "s"), tmp_path / "trace", tmp_path / "out"
    with JobStore(root) as store:
        ids = [store.create({"seconds": 1.0, "log": str(trace)}, queue="slow").id for _ in range(4)]
    worker = start_worker(root, "--handler", "worker_tasks:slow", "--queue", "slow", "--concurrency", "2",
                          log=out)
    wait_until(lambda: sum(x.startswith("started") for x in lines(trace)) >= 2)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, out.read_text()
    with JobStore(root) as store:
        states = [store.get(i).state for i in ids]
        assert states.count(JobState.FULFILLED) >= 2 and JobState.ACTIVE not in states
        assert all(store.get(i).attempts == (1 if s is JobState.FULFILLED else 0) for i, s in zip(ids, states,
                                                                                                 strict=True))
        assert store.workers() == []
    log_lines = [x for x in lines(out) if "fsjobstore.worker: job " in x]
    assert log_lines and all(" queue=slow attempt=1 fulfilled (ran " in x for x in log_lines), lines(out)


def test_a_second_sigint_stops_at_once_and_gives_the_job_back(tmp_path: Path) -> None:
    root, trace = str(tmp_path / "s"), tmp_path / "trace"
    with JobStore(root) as store:
        job = store.create({"seconds": 60, "log": str(trace)}, queue="slow")
    worker = start_worker(root, "--handler", "worker_tasks:slow", "--queue", "slow")
    wait_until(lambda: any(x.startswith("started") for x in lines(trace)))
    worker.send_signal(signal.SIGINT)
    time.sleep(0.5)
    worker.send_signal(signal.SIGINT)
    assert worker.wait(20) == 0
    with JobStore(root) as store:
        got = store.get(job.id)
        assert got.state is JobState.PENDING and got.attempts == 0  # given back: no attempt counted


def test_sigkill_of_a_worker_with_four_children_loses_nothing(tmp_path: Path) -> None:
    root, trace = str(tmp_path / "s"), tmp_path / "trace"
    with JobStore(root) as store:
        ids = {store.create({"seconds": 0.3, "log": str(trace)}, queue="slow").id for _ in range(40)}
    worker = start_worker(root, "--handler", "worker_tasks:slow", "--queue", "slow", "--concurrency", "4")
    wait_until(lambda: sum(x.startswith("finished") for x in lines(trace)) >= 8)
    children = {int(x.split()[3]) for x in lines(trace)}
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(lambda: all(gone(pid) for pid in children), timeout=10)  # they die with their supervisor
    finisher = start_worker(root, "--handler", "worker_tasks:slow", "--queue", "slow", "--concurrency", "4",
                            "--burst")
    assert finisher.wait(120) == 0
    with JobStore(root) as store:
        assert {j for j in ids if store.get(j).state is JobState.FULFILLED} == ids
        stats = store.statistics()
        assert (stats.pending, stats.active, stats.failed) == (0, 0, 0)
    finished = [x.split()[1] for x in lines(trace) if x.startswith("finished")]
    assert set(finished) >= ids  # every job ran to the end at least once (a killed one again)


def test_pause_stops_every_worker_on_the_directory_from_taking_that_queue(tmp_path: Path) -> None:
    root, trace = str(tmp_path / "s"), tmp_path / "trace"
    JobStore(root).close()
    common = ("--handler", "worker_tasks:echo", "--queue", "echo")
    workers = [start_worker(root, *common), start_worker(root, *common, "--threads", "--concurrency", "2")]
    try:
        done = subprocess.run([sys.executable, "-m", "fsjobstore", "pause", root, "echo"], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0 and "paused" in done.stdout
        with JobStore(root) as store:
            ids = [store.create({"n": i, "log": str(trace)}, queue="echo").id for i in range(6)]
        time.sleep(2.0)
        assert lines(trace) == []  # nobody took them
        assert subprocess.run([sys.executable, "-m", "fsjobstore", "resume", root, "echo"],
                              capture_output=True, timeout=30).returncode == 0
        wait_until(lambda: len(lines(trace)) >= 6)
        with JobStore(root) as store:
            wait_until(lambda: all(store.get(i).state is JobState.FULFILLED for i in ids))
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            assert w.wait(30) == 0


def test_sigusr1_pauses_a_worker_and_sigusr2_resumes_it(tmp_path: Path) -> None:
    root, trace = str(tmp_path / "s"), tmp_path / "trace"
    JobStore(root).close()
    worker = start_worker(root, "--handler", "worker_tasks:echo", "--queue", "echo", "--threads")
    try:
        with JobStore(root) as store:
            wait_until(lambda: bool(store.workers()))
            worker.send_signal(signal.SIGUSR1)
            wait_until(lambda: store.workers()[0].paused)
            job = store.create({"n": 1, "log": str(trace)}, queue="echo")
            time.sleep(1.5)
            assert store.get(job.id).state is JobState.PENDING
            worker.send_signal(signal.SIGUSR2)
            wait_until(lambda: store.get(job.id).state is JobState.FULFILLED)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0


def test_notify_burst_delivers_what_is_due_and_exits(tmp_path: Path) -> None:
    root, out = str(tmp_path / "s"), tmp_path / "delivered.txt"
    with JobStore(root) as store:
        job = store.create({"n": 1})
        store.queue(job.id, {"file": str(out)})
        store.fulfill(job.id, {"answer": 42})
    done = subprocess.run([sys.executable, "-m", "fsjobstore", "notify", root, "--handler", "worker_tasks:deliver",
                           "--burst"], cwd=TESTS, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == f"{job.id} fulfilled {{'answer': 42}}\n"
    assert "delivered 1, will retry 0" in done.stderr


def test_worker_and_notify_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    JobStore(root).close()
    (tmp_path / "raises_on_import.py").write_text("x = 1\nraise RuntimeError('config missing')\n")
    for args, expect in (
        (("worker", root, "--handler", "raises_on_import:f"),
         f"importing 'raises_on_import' raised RuntimeError: config missing ({tmp_path}/raises_on_import.py, line 2)"),
        (("worker", root, "--handler", "worker_tasks:echo", "--queue", "my.queue"), "'my.queue' is not a queue name"),
        (("worker", root, "--handler", "no_such_module:fn"), "cannot import 'no_such_module'"),
        (("worker", root, "--handler", "worker_tasks:nope"), "has no 'nope'"),
        (("worker", root, "--handler", "worker_tasks"), "is not MODULE:NAME"),
        (("worker", str(tmp_path / "typo"), "--handler", "worker_tasks:echo"), "there is no store at"),
        (("notify", root, "--handler", "worker_tasks:HANDLERS"), ""),
    ):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-m", "fsjobstore", *args, "--burst"], cwd=TESTS,
                              capture_output=True, text=True, timeout=60, env=env)
        assert "Traceback" not in done.stderr, done.stderr
        assert expect in done.stderr, (args, done.stderr)


def test_workers_lists_a_running_worker_as_json(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    JobStore(root).close()
    worker = start_worker(root, "--handler", "worker_tasks:echo", "--queue", "echo", "--name", "listed")
    try:
        def listed() -> bool:
            out = subprocess.run([sys.executable, "-m", "fsjobstore", "workers", root, "--json"],
                                 capture_output=True, text=True, timeout=30).stdout
            return any(w["name"] == "listed" and w["pid"] == worker.pid for w in json.loads(out or "[]"))

        wait_until(listed)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
