"""Several real processes on one store, killed and stopped at awkward moments."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from fsjobstore import JobState, JobStore

HELPER = os.path.join(os.path.dirname(__file__), "_proc.py")
pytestmark = pytest.mark.slow


def spawn(role: str, root: str, logpath: str, *args: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, HELPER, role, root, logpath, *map(str, args)])


def read_log(path: str) -> list[str]:
    try:
        with open(path) as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def wait_for_line(path: str, prefix: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in read_log(path):
            if line.startswith(prefix):
                return line
        time.sleep(0.02)
    raise AssertionError(f"{prefix!r} never appeared in {path}: {read_log(path)}")


def assert_each_job_fulfilled_exactly_once(root: str, ids: set[str], logs: list[str]) -> None:
    with JobStore(root) as store:
        store.recover()
        stats = store.statistics()
        assert (stats.pending, stats.scheduled, stats.active, stats.failed) == (0, 0, 0, 0), stats
        assert stats.fulfilled == len(ids)
        oks = [line.split() for line in logs if line.startswith("ok ")]
        counts = Counter(job_id for _, job_id, _ in oks)
        assert not [j for j, n in counts.items() if n > 1], "a job was committed twice"
        for _, job_id, token in oks:
            got = store.get(job_id)
            assert got.state is JobState.FULFILLED and got.value == token
        for job_id in ids:
            assert store.get(job_id).state is JobState.FULFILLED


def test_several_processes_drain_one_store_and_each_job_is_fulfilled_once(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        ids = {store.create(i).id for i in range(400)}
    logs = [str(tmp_path / f"w{i}.log") for i in range(4)]
    procs = [spawn("drain", root, log, 0, 30) for log in logs]
    for p in procs:
        assert p.wait(120) == 0
    lines = [line for log in logs for line in read_log(log)]
    assert len([x for x in lines if x.startswith("ok ")]) == 400
    assert_each_job_fulfilled_exactly_once(root, ids, lines)


def test_workers_killed_repeatedly_lose_nothing_and_commit_nothing_twice(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        ids = {store.create(i, max_attempts=1000).id for i in range(300)}
    rng = random.Random(1234)
    logs = [str(tmp_path / f"w{i}.log") for i in range(3)]
    procs = [spawn("drain", root, log, 0.01, 2) for log in logs]
    kills = 0
    deadline = time.monotonic() + 60
    while kills < 40 and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.05, 0.3))
        i = rng.randrange(len(procs))
        if procs[i].poll() is None:
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait()
            kills += 1
        procs[i] = spawn("drain", root, logs[i], 0.01, 2)
    for p in procs:
        assert p.wait(120) == 0
    # Whatever the last kills left behind, one more worker finishes.
    final = str(tmp_path / "final.log")
    assert spawn("drain", root, final, 0, 2).wait(120) == 0
    lines = [line for log in [*logs, final] for line in read_log(log)]
    assert kills >= 10
    assert_each_job_fulfilled_exactly_once(root, ids, lines)


def test_a_worker_stopped_past_its_lease_is_fenced_out(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    log = str(tmp_path / "hold.log")
    with JobStore(root, lease_duration=1.0, heartbeat_interval=0.25, backoff=lambda a: 0.0) as store:
        job = store.create("contested")
        worker = spawn("hold", root, log, 1.0)
        try:
            wait_for_line(log, "claimed")
            worker.send_signal(signal.SIGSTOP)
            # Our background recovery must see the stopped worker's heartbeat freeze, then requeue.
            lease = store.pull_work(timeout=30)
            assert lease is not None and lease.id == job.id and lease.attempt == 2
            lease.fulfill(b"by the second worker")
        finally:
            worker.send_signal(signal.SIGCONT)
        Path(log + ".go").touch()
        assert worker.wait(60) == 0
        lines = read_log(log)
        assert any(line.startswith("compromised") for line in lines), lines
        assert "LeaseLost" in lines and "fulfilled" not in lines
        assert store.get(job.id).value == b"by the second worker"


def test_a_dead_workers_job_is_requeued_at_once_with_the_attempt_counted(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    log = str(tmp_path / "die.log")
    with JobStore(root, lease_duration=3600) as store:
        job = store.create("x")
        assert spawn("claim_and_die", root, log).wait(30) == 9
        assert store.get(job.id).state is JobState.ACTIVE
        report = store.recover()
        assert report.requeued == 1
        got = store.get(job.id)
        assert got.state is JobState.PENDING and got.attempts == 1 and "exited" in (got.error or "")


def test_a_notifier_killed_mid_delivery_frees_the_notification_at_once(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    log = str(tmp_path / "n.log")
    with JobStore(root, lease_duration=3600) as store:
        job = store.create("x")
        store.queue(job.id, "target")
        lease = store.pull_work()
        assert lease is not None
        lease.fulfill(b"v")
        child = spawn("notify_hold", root, log)
        try:
            wait_for_line(log, "claimed")
            assert store.pull_notification() is None
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        note = store.pull_notification()
        assert note is not None and note.waiting == ("target",) and note.value == b"v"
        note.done(["target"])
        assert store.pull_notification() is None


def test_a_fresh_process_gets_a_dead_workers_job_on_its_first_pull(tmp_path: Path) -> None:
    root, log = str(tmp_path / "s"), str(tmp_path / "log")
    for round_ in range(5):  # it was 5 out of 5 misses before the fix
        with JobStore(root) as store:
            job = store.create({"round": round_})
        assert spawn("claim_and_die", root, log).wait(30) == 9  # SIGKILL-like: os._exit holding the lease
        assert spawn("pull_once", root, log).wait(30) == 0
        assert read_log(log)[-1] == f"got {job.id} attempt 2"
        with JobStore(root) as store:
            assert store.get(job.id).value == "by the one-shot worker"
