"""Jobs that know about each other, on a directory two hosts share (the GlusterFS bed's two mounts):
a unique key taken from both hosts at once makes one job, a child waits for a parent ended on the
other host, a group made on one host is read and waited for on the other, and a chaos run with
relations and concurrency keys loses nothing and runs no key past its limit while host B's mount
hangs and dies."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distfs import gluster
from distfs.gluster import SharedDir
from fsjobstore import JobState, JobStore

pytestmark = pytest.mark.slow



CREATOR = textwrap.dedent("""
    import json, os, sys, time
    from fsjobstore import JobStore
    root, start, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    with JobStore(root) as store:
        while time.time() < start:
            time.sleep(0.001)
        ids = [store.create({"by": os.getpid()}, unique_key="one-report").id for _ in range(10)]
    with open(out, "w") as fh:
        json.dump(ids, fh)
""")


def test_a_unique_key_taken_from_both_hosts_at_once_makes_one_job(stores: tuple[str, str], tmp_path: Path) -> None:
    start = time.time() + 3.0  # every process ready, then all at once
    procs = [subprocess.Popen([sys.executable, "-c", CREATOR, root, str(start), str(tmp_path / f"{i}.json")])
             for i, root in enumerate([*stores, *stores])]
    assert [p.wait(120) for p in procs] == [0, 0, 0, 0]
    ids = {job_id for i in range(4) for job_id in json.loads((tmp_path / f"{i}.json").read_text())}
    assert len(ids) == 1, ids
    with JobStore(stores[1]) as store:
        assert [j.id for j in store.jobs(state="pending")] == list(ids)


def test_a_child_on_one_host_runs_once_its_parent_is_fulfilled_on_the_other(stores: tuple[str, str]) -> None:
    a, b = stores
    with JobStore(a) as host_a, JobStore(b) as host_b:
        parent = host_a.create({"step": 1})
        child = host_b.create({"step": 2}, after=[parent.id])
        assert child.state is JobState.DEFERRED
        lease = host_a.pull_work(timeout=10)
        assert lease is not None and lease.id == parent.id
        assert host_b.pull_work(timeout=0.5) is None  # the child waits: nothing for B yet
        lease.fulfill("done")
        taken = host_b.pull_work(timeout=30)  # B polls: it hears nothing of A's rename
        assert taken is not None and taken.id == child.id
        taken.fulfill("after")
        failing = host_a.create({"step": 3})
        orphan = host_b.create({"step": 4}, after=[failing.id])
        claim = host_a.pull_work(timeout=10)
        assert claim is not None and claim.id == failing.id
        claim.fail("broken", retry=False)
        gone = host_b.wait(orphan.id, timeout=30)
        assert gone.state is JobState.CANCELLED and failing.id in (gone.error or "")


def test_a_group_made_on_one_host_is_read_and_waited_for_on_the_other(stores: tuple[str, str]) -> None:
    a, b = stores
    with JobStore(a) as host_a, JobStore(b) as host_b:
        group = host_a.create_group([{"request": i} for i in range(3)] + [{"request": "last", "after": [0, 1, 2]}])
        seen = host_b.get_group(group.id)
        assert seen.ids == group.ids and [j.state for j in seen.jobs][-1] is JobState.DEFERRED
        for _ in range(4):
            lease = host_b.pull_work(timeout=30)
            assert lease is not None
            lease.fulfill(lease.request)
        done = host_a.wait_group(group.id, timeout=30)
        assert done.done and [j.state for j in done.jobs] == [JobState.FULFILLED] * 4


def test_a_short_chaos_run_with_relations_on_both_hosts_loses_nothing_and_runs_no_child_early(
        gluster_bed: gluster.GlusterBed, shared_dir: SharedDir, tmp_path: Path) -> None:
    from distfs.chaos_two_hosts import run_on

    a, b = str(shared_dir.a / "store"), str(shared_dir.b / "store")
    report = run_on(a, b, shared_dir.mount_b, kill_every=15, workdir=str(tmp_path),
                    jobs=150, workers=4, kills=20, lease=2.0, seed=13, relations=True, limits=True)
    print(report)
    assert report["created_ok"] >= 150, report
    assert (report["lost"], report["unexpected"], report["duplicate_commits"]) == (0, 0, 0), report
    assert report["early_children"] == 0 and report["left_pending_or_active"] == 0, report
    assert report["over_limit"] == 0, report
    assert report["fulfilled"] == report["created_ok"], report
