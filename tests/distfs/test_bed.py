"""The GlusterFS bed stands in for two hosts sharing one directory: what holds across its two mounts, and what
does not (facts fsjobstore must cope with on a shared filesystem). See README.md for the measured figures."""

from __future__ import annotations

import errno
import os
import time

import pytest

from distfs.gluster import SharedDir
from distfs.probes import (
    LockHolder,
    answers_within,
    inotify_names,
    links_onto_a_name_moved_away,
    rename_noreplace,
    rename_race,
    renames_onto_a_cached_name,
    seconds_until_lockable,
)
from distfs.probes import try_lock as lock_is_free

pytestmark = pytest.mark.slow


def test_a_file_created_through_mount_a_is_visible_through_mount_b(shared_dir: SharedDir) -> None:
    (shared_dir.a / "job.json").write_text('{"from": "A"}')
    assert os.listdir(shared_dir.b) == ["job.json"]
    assert (shared_dir.b / "job.json").read_text() == '{"from": "A"}'


def test_a_rename_race_between_the_mounts_has_exactly_one_winner(shared_dir: SharedDir) -> None:
    race = rename_race(shared_dir.a, shared_dir.b, rounds=300)
    assert race["one_winner"] == 300, race
    assert race["loser_errors"] == {"ENOENT": 300}, race


@pytest.mark.parametrize("kind", ["flock", "lockf"])
def test_a_lock_taken_through_mount_a_excludes_the_same_lock_through_mount_b(shared_dir: SharedDir, kind: str) -> None:
    with LockHolder(shared_dir.a / "lease", kind):
        assert not lock_is_free(shared_dir.b / "lease", kind)
    assert lock_is_free(shared_dir.b / "lease", kind)


@pytest.mark.parametrize("kind", ["flock", "lockf"])
def test_sigkill_of_the_lock_holder_on_mount_a_frees_the_lock_for_mount_b_quickly(shared_dir: SharedDir,
                                                                                   kind: str) -> None:
    with LockHolder(shared_dir.a / "lease", kind) as holder:
        holder.kill()
        freed_after = seconds_until_lockable(shared_dir.b / "lease", kind, timeout=10.0)
    assert freed_after is not None and freed_after < 1.0  # measured: about 1-5 ms


def test_inotify_on_mount_b_does_not_see_a_create_made_through_mount_a(shared_dir: SharedDir) -> None:
    """A fact the store must cope with: on a shared filesystem inotify reports only what this host did.
    A waiter on host B is never woken by a job created on host A; it has to poll (or be told otherwise)."""
    seen_from_a = inotify_names(shared_dir.b, lambda: (shared_dir.a / "from-a").write_text("x"))
    seen_from_b = inotify_names(shared_dir.b, lambda: (shared_dir.b / "from-b").write_text("x"))
    assert "from-a" not in seen_from_a
    assert "from-b" in seen_from_b  # inotify itself works on the mount: only the other host's events are missing


def test_a_hung_client_keeps_its_locks_until_it_resumes(shared_dir: SharedDir) -> None:
    """A fact the store must cope with: a frozen host's locks are not broken by the server (the kernel keeps
    answering for its TCP connection), so lock-based leases need a timeout of their own."""
    with LockHolder(shared_dir.a / "lease") as holder:
        shared_dir.mount_a.stop()
        holder.kill(wait=False)  # the holder is gone, but its unlock cannot get through the stopped client
        time.sleep(3.0)
        assert not lock_is_free(shared_dir.b / "lease")
        shared_dir.mount_a.cont()
        assert seconds_until_lockable(shared_dir.b / "lease", "flock", timeout=10.0) is not None


def test_sigstop_of_mount_a_client_hangs_a_while_b_keeps_working_and_sigcont_brings_a_back(
        shared_dir: SharedDir) -> None:
    shared_dir.mount_a.stop()
    assert not answers_within(shared_dir.a / "never-looked-up", timeout=2.0)  # a lookup the cache cannot answer
    (shared_dir.b / "while-a-hangs").write_text("B works")
    assert (shared_dir.b / "while-a-hangs").read_text() == "B works"
    shared_dir.mount_a.cont()
    assert answers_within(shared_dir.a / "never-looked-up", timeout=5.0)
    assert (shared_dir.a / "while-a-hangs").read_text() == "B works"


def test_sigkill_of_mount_a_client_breaks_a_with_enotconn_until_remount(shared_dir: SharedDir) -> None:
    (shared_dir.b / "kept").write_text("on the volume")
    old_pid = shared_dir.mount_a.pid
    shared_dir.mount_a.kill()
    with pytest.raises(OSError) as dead:
        os.listdir(shared_dir.a)
    assert dead.value.errno == errno.ENOTCONN
    shared_dir.mount_a.remount()
    assert shared_dir.mount_a.pid != old_pid
    assert (shared_dir.a / "kept").read_text() == "on the volume"


def test_renameat2_noreplace_fails_with_einval_so_link_then_unlink_is_the_fallback(shared_dir: SharedDir) -> None:
    (shared_dir.a / "temp").write_text("result")
    assert rename_noreplace(shared_dir.a / "temp", shared_dir.a / "final") == errno.EINVAL
    os.link(shared_dir.a / "temp", shared_dir.a / "final")
    os.unlink(shared_dir.a / "temp")
    (shared_dir.b / "other").write_text("a second result")
    with pytest.raises(FileExistsError):
        os.link(shared_dir.b / "other", shared_dir.b / "final")  # the other host loses, the first result stays
    assert (shared_dir.a / "final").read_text() == "result"


def test_a_rename_back_to_a_name_the_client_still_caches_for_that_file_does_nothing(shared_dir: SharedDir) -> None:
    # Why a parked job's name carries its claim's token (FORMAT.md, "Network filesystems"): within
    # the entry timeout (1 s) mount A's rename "succeeds" and the file stays where B put it.
    assert renames_onto_a_cached_name(shared_dir.a, shared_dir.b, 10) == 10
    assert renames_onto_a_cached_name(shared_dir.a / "later", shared_dir.b / "later", 3, age=1.2) == 0


def test_a_link_onto_a_name_the_other_mount_just_moved_away_says_eexist(shared_dir: SharedDir) -> None:
    # Why a final publish on GlusterFS believes EEXIST only once it lasts (Tree._rename_final).
    # Nearly every round says EEXIST; on a loaded machine a round can outlast A's entry cache (about
    # a second), and then its link finds the name free, as the later rounds below always do.
    assert links_onto_a_name_moved_away(shared_dir.a, shared_dir.b, 10) >= 8
    assert links_onto_a_name_moved_away(shared_dir.a / "later", shared_dir.b / "later", 3, age=1.2) == 0
