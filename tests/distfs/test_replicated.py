"""fsjobstore on a replicated GlusterFS volume (three bricks, replica 3, three mounts as three
hosts): a short chaos run with one brick killed and healed (the long one, with two, is
tests/distfs/chaos_three_hosts.py: MULTIHOST.md, "One server down"), jobs made and run while a
brick is down and after it heals, and verify between the hosts."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest

from distfs import gluster, replica
from distfs.chaos_three_hosts import differing_copies, failed, run
from fsjobstore import JobStore

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)  # a client that hangs after the brick's restart (MULTIHOST.md, "Still open") fails it
def test_a_short_chaos_run_on_three_hosts_loses_nothing_while_a_brick_dies_and_heals(
        gluster_bed: gluster.GlusterBed, tmp_path: Path) -> None:
    report = run(gluster_bed, jobs=300, kills=30, seed=7, brick_kills=1, down=10.0, workdir=str(tmp_path),
                 workers=4, lease=2.0, retention=True, relations=True, limits=True)
    print(json.dumps(report))
    assert len(report["brick_kills"]) == 1 and "healed_after_s" in report["brick_kills"][0], report
    assert (report["lost"], report["unexpected"], report["duplicate_commits"]) == (0, 0, 0), report
    assert (report["early_children"], report["over_limit"], report["left_pending_or_active"]) == (0, 0, 0), report
    assert not failed(report, 300, 1), report


def test_jobs_made_and_run_on_three_hosts_while_a_brick_is_down_are_all_there_once_it_has_healed(
        gluster_bed: gluster.GlusterBed) -> None:
    volume = replica.Replicated(gluster_bed, name="fsjs3b")
    names = [f"b-{n}" for n in "abc"]
    roots = [str(gluster_bed.mount(name, volume=volume.name).path / "store") for name in names]
    try:
        JobStore(roots[0]).close()
        time.sleep(1.5)
        # Closed on any failure too: a store left open keeps its threads working on a mount
        # that is dropped below, for the rest of the test process.
        with contextlib.ExitStack() as opened:
            stores = [opened.enter_context(JobStore(root, lease_duration=5)) for root in roots]
            _make_and_run_through_an_outage(volume, stores)
        # Compared once closed: an open store writes its counters now and then (a temporary file
        # in control/metrics/), and a walk of the bricks during such a write sees it on some only.
        assert differing_copies(volume, "store") == []
    finally:
        for name in names:
            gluster_bed.drop_mount(name)
        volume.remove()


def _make_and_run_through_an_outage(volume: replica.Replicated, stores: list[JobStore]) -> None:
    """Jobs made on three hosts before and while brick 1 is down, run while it is down and once
    it has healed: every one ran once, and every host counts them all."""
    before = [stores[i % 3].create({"n": i}).id for i in range(30)]
    volume.kill_brick(1)
    during = [stores[i % 3].create({"n": i}).id for i in range(30, 60)]
    done = []
    for i in range(40):  # every host runs jobs while the brick is down
        lease = stores[i % 3].pull_work(timeout=5)
        assert lease is not None
        lease.fulfill(lease.request["n"])
        done.append(lease.id)
    volume.start_bricks()
    state = volume.wait_healed(120)
    assert state.healed, state
    for i in range(20):  # and once it is back
        lease = stores[i % 3].pull_work(timeout=5)
        assert lease is not None
        lease.fulfill(lease.request["n"])
        done.append(lease.id)
    assert sorted(done) == sorted(before + during)
    for store in stores:
        assert store.statistics().fulfilled == 60 and store.statistics().pending == 0


def test_verify_passes_between_a_leader_and_each_other_host_of_a_replicated_volume(
        gluster_bed: gluster.GlusterBed) -> None:
    from distfs.test_multihost import _verify_pair

    volume = replica.Replicated(gluster_bed, name="fsjs3v")
    names = [f"v-{n}" for n in "abc"]
    a, b, c = (gluster_bed.mount(name, volume=volume.name).path for name in names)
    try:
        (a / "verify").mkdir()
        time.sleep(1.5)
        for peer in (b, c):  # MULTIHOST.md: the leader on one host, --peer on each of the others
            code, out = _verify_pair(a / "verify", peer / "verify")
            report = json.loads(out)
            assert code == 0 and report["safe"] and report["lock_takeover"] is False, out
    finally:
        for name in names:
            gluster_bed.drop_mount(name)
        volume.remove()
