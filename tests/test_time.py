"""Wall-clock jumps of an hour either way, on a worker or on a recovering process, never cause an
early take-over or a double commit: leases are judged on each observer's monotonic clock, and
wall time only says when scheduled jobs are due."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from conftest import FakeWall, freeze

from fsjobstore import JobState, JobStore


@pytest.mark.parametrize("jump", [3600.0, -3600.0], ids=["forward", "back"])
@pytest.mark.parametrize("who", ["worker", "rescuer"])
def test_a_wall_clock_jump_causes_no_take_over_and_no_double_commit(open_store: Callable[..., JobStore],
                                                                    jump: float, who: str) -> None:
    worker_wall, rescuer_wall = FakeWall(), FakeWall()
    worker = open_store(wall_clock=worker_wall, lease_duration=1.0)
    rescuer = open_store(wall_clock=rescuer_wall, lease_duration=1.0)
    job = worker.create("x")
    lease = worker.pull_work()
    assert lease is not None
    (worker_wall if who == "worker" else rescuer_wall).advance(jump)
    for _ in range(15):  # 1.5 s: longer than the lease, with the worker beating all along
        report = rescuer.recover()
        assert report.requeued == report.failed == report.commits_finished == 0
        time.sleep(0.1)
    assert lease.compromised is None
    lease.fulfill(b"once")
    got = rescuer.get(job.id)
    assert got.state is JobState.FULFILLED and got.value == b"once" and got.attempts == 1
    assert rescuer.statistics().pending == 0


def test_a_hung_worker_is_taken_over_only_after_a_full_lease_on_the_rescuers_own_clock(
    open_store: Callable[..., JobStore],
) -> None:
    mono = FakeWall(100.0)
    worker = open_store(lease_duration=30.0)
    rescuer = open_store(lease_duration=30.0, clock=mono, wall_clock=FakeWall(0.0))  # wall far in the past
    job = worker.create("x")
    lease = worker.pull_work()
    assert lease is not None
    freeze(worker)  # the worker hangs: no more heartbeats
    rescuer.recover()  # first sight of its heartbeat
    mono.advance(29.9)
    assert rescuer.recover().requeued == 0
    mono.advance(0.2)
    assert rescuer.recover().requeued == 1
    assert rescuer.get(job.id).state is JobState.PENDING
