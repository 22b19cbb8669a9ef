"""Limits on a directory two hosts share (the GlusterFS bed's two mounts): a key's limit holds for
processes on both hosts at once, and a holder killed on one host frees its slot for the other
(after a lease: across hosts a free lock proves nothing, FORMAT.md "Limits")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fsjobstore import JobState, JobStore

pytestmark = pytest.mark.slow



RUNNER = textwrap.dedent("""
    import json, sys, time
    from fsjobstore import JobStore
    root, out = sys.argv[1], sys.argv[2]
    spans = []
    with JobStore(root, lease_duration=5) as store:
        while True:
            lease = store.pull_work(timeout=8)
            if lease is None:
                break
            start = time.time()  # one machine: both mounts' processes read one clock
            time.sleep(0.3)
            spans.append((start, time.time()))
            lease.fulfill(None)
    with open(out, "w") as fh:
        json.dump(spans, fh)
""")


def test_a_key_limit_holds_for_processes_on_both_hosts(stores: tuple[str, str], tmp_path: Path) -> None:
    a, _ = stores
    with JobStore(a) as store:
        store.set_limit(key="shared-api", concurrency=2)
        ids = [store.create({"i": i}, concurrency_key="shared-api").id for i in range(10)]
    procs = [subprocess.Popen([sys.executable, "-c", RUNNER, root, str(tmp_path / f"{i}.json")])
             for i, root in enumerate([*stores, *stores])]
    assert [p.wait(240) for p in procs] == [0, 0, 0, 0]
    spans = [s for i in range(4) for s in json.loads((tmp_path / f"{i}.json").read_text())]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most <= 2, f"{most} jobs of a key limited to 2 ran at once"
    # Every job ran once: none was left claimed by nobody (the parked names' tokens, FORMAT.md
    # "Limits"; before them 2 runs in 10 left one in active/ until a recovery after its parker).
    assert len(spans) == 10, spans
    with JobStore(stores[1]) as store:
        assert {store.get(i).state for i in ids} == {JobState.FULFILLED}


HOLDER = textwrap.dedent("""
    import sys, time
    from fsjobstore import JobStore
    store = JobStore(sys.argv[1], lease_duration=3)
    lease = store.pull_work(timeout=30)
    print(lease.id, flush=True)
    time.sleep(600)
""")


def test_a_holder_killed_on_one_host_frees_its_slot_for_the_other(stores: tuple[str, str]) -> None:
    a, b = stores
    with JobStore(a) as host_a:
        first = host_a.create("first", concurrency_key="one-at-a-time").id
        second = host_a.create("second", concurrency_key="one-at-a-time").id
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, a], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == first
        with JobStore(b, lease_duration=3) as host_b:
            assert host_b.pull_work(timeout=1) is None  # the second waits for the slot A holds
            assert host_b.get(second).state is JobState.PENDING
            proc.kill()
            proc.wait()
            killed = time.monotonic()
            got = []
            while len(got) < 2 and time.monotonic() - killed < 60:
                lease = host_b.pull_work(timeout=5)
                if lease is not None:
                    got.append(lease.id)
                    lease.fulfill(None)
            assert sorted(got) == sorted([first, second]), got  # A's job taken over, then the second
            assert host_b.get(second).attempts == 1
    finally:
        proc.kill()
        proc.wait()


def test_a_job_parked_again_by_a_host_that_saw_it_parked_before_is_parked_not_left_claimed(
        stores: tuple[str, str]) -> None:
    # The sequence that left a job in active/ with no holder when a park reused the job's old
    # waiting/ name (FORMAT.md, "Limits"): A parks J and looks at the line; B's release promotes J
    # into its queue; B takes the slot again; A claims J and parks it again while its client
    # still caches J under its old waiting/ name. B works another queue, whose jobs share J's key:
    # had B's client cached J's pending name, its promotion would do nothing for a few seconds
    # (Gate.promote sees that and leaves J for later), which is not this test's case.
    a, b = stores
    with JobStore(a, lease_duration=5) as host_a, JobStore(b, lease_duration=5) as host_b:
        host_b.set_limit(key="k", concurrency=1)
        first = host_b.create("first", queue="other", concurrency_key="k")
        job = host_a.create("J", concurrency_key="k")
        holding = host_b.pull_work(queues="other")
        assert holding is not None and holding.id == first.id
        assert host_a.pull_work(queues="default") is None  # parked
        waiting = Path(a) / "jobs" / "waiting"
        for name in os.listdir(waiting):  # A looks at the line, as a promotion reading its head does
            os.stat(waiting / name)
        second = host_b.create("second", queue="other", concurrency_key="k")
        holding.fulfill(None)  # B lets go and promotes J into its queue
        assert not os.listdir(Path(b) / "jobs" / "waiting")
        holding = host_b.pull_work(queues="other")
        assert holding is not None and holding.id == second.id
        assert host_a.pull_work(queues="default") is None  # J claimed by A again, and parked again
        assert [j.id for j in host_b.jobs(state="active")] == [second.id]
        assert [n.split(".")[4] for n in os.listdir(Path(b) / "jobs" / "waiting")] == [job.id]
        holding.fulfill(None)
        lease = host_a.pull_work(timeout=10)
        assert lease is not None and lease.id == job.id
        lease.fulfill(None)
