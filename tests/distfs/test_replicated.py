"""fsjobstore on a replicated GlusterFS volume (three bricks, replica 3) while a brick dies: the
short version of tests/distfs/chaos_three_hosts.py, with one brick killed and healed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from distfs import gluster, replica
from distfs.chaos_three_hosts import failed, run

pytestmark = pytest.mark.slow


def test_a_short_chaos_run_on_three_hosts_loses_nothing_while_a_brick_dies_and_heals(
        gluster_bed: gluster.GlusterBed, tmp_path: Path) -> None:
    report = run(gluster_bed, jobs=200, kills=20, seed=7, brick_kills=1, down=5.0, workdir=str(tmp_path),
                 workers=4, lease=2.0, retention=True, relations=True, limits=True)
    print(report)
    assert len(report["brick_kills"]) == 1 and "healed_after_s" in report["brick_kills"][0], report
    assert (report["lost"], report["unexpected"], report["duplicate_commits"]) == (0, 0, 0), report
    assert (report["early_children"], report["over_limit"], report["left_pending_or_active"]) == (0, 0, 0), report
    assert not failed(report, 200, 1), report


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
