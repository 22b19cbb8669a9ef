"""Fan-out on a directory two hosts share (the GlusterFS bed's two mounts): a subscription made on
one host gets its copies of jobs created on the other, while its worker is down, and a pattern puller
on one host takes what the other host created."""

from __future__ import annotations

import time

import pytest

from fsjobstore import JobState, JobStore

pytestmark = pytest.mark.slow



def test_a_subscription_made_on_one_host_gets_copies_of_what_the_other_creates(stores: tuple[str, str]) -> None:
    a, b = stores
    with JobStore(b) as host_b:
        host_b.subscribe("emails", "order-*")
        host_b.subscribe("audit", "order-*")
    time.sleep(1.2)  # a subscription applies to another process's creates within a second
    with JobStore(a) as host_a:
        made = [host_a.create({"order": i}, queue="order-eu") for i in range(5)]
        assert all(j.topic == "order-eu" for j in made)
    with JobStore(b) as host_b:  # the subscriber's worker starts only now
        got = []
        while len(got) < 5:
            lease = host_b.pull_work(queues="emails", timeout=30)
            assert lease is not None, got
            got.append(lease.request["order"])
            lease.fulfill("mailed")
        assert sorted(got) == list(range(5))
        assert host_b.statistics().pending_by_queue.get("audit") == 5  # its own copies, untouched
        for job in made:
            states = {j.queue: j.state for j in host_b.get_group(job.group or "").jobs}
            assert states == {"emails": JobState.FULFILLED, "audit": JobState.PENDING}


def test_a_pattern_puller_on_one_host_takes_what_the_other_host_created(stores: tuple[str, str]) -> None:
    a, b = stores
    with JobStore(a) as host_a, JobStore(b) as host_b:
        ids = {host_a.create(i, queue=f"img-{i}").id for i in range(3)}
        host_a.create("not mine", queue="video")
        taken = set()
        while len(taken) < 3:
            lease = host_b.pull_work(queues="img-*", timeout=30)
            assert lease is not None, taken
            taken.add(lease.id)
            lease.fulfill(None)
        assert taken == ids
        assert host_b.pull_work(queues="img-*", timeout=1) is None
