"""fsjobstore on a replicated GlusterFS volume (three bricks, replica 3, three mounts as three
hosts): jobs made and run while a brick is down and after it heals, and verify between the hosts.
The chaos with brick kills is tests/distfs/chaos_three_hosts.py (MULTIHOST.md, "One server down")."""

from __future__ import annotations

import json
import time

import pytest

from distfs import gluster, replica
from distfs.chaos_three_hosts import differing_copies
from fsjobstore import JobStore

pytestmark = pytest.mark.slow


def test_jobs_made_and_run_on_three_hosts_while_a_brick_is_down_are_all_there_once_it_has_healed(
        gluster_bed: gluster.GlusterBed) -> None:
    volume = replica.Replicated(gluster_bed, name="fsjs3b")
    names = [f"b-{n}" for n in "abc"]
    roots = [str(gluster_bed.mount(name, volume=volume.name).path / "store") for name in names]
    try:
        JobStore(roots[0]).close()
        time.sleep(1.5)
        stores = [JobStore(root, lease_duration=5) for root in roots]
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
        assert differing_copies(volume, "store") == []
        for store in stores:
            store.close()
    finally:
        for name in names:
            gluster_bed.drop_mount(name)
        volume.remove()


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
