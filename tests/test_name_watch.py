"""Whether a job has a cancel request, targets or children waiting, and which queues are paused,
is asked on every claim and commit: where reads do not lag, inotify answers (one poll) instead of
a lookup of each name. These tests hold the answers exact across processes, and the watch to its
fallbacks: a moved directory, a queue overflow, a forked child, a network filesystem."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from internals import name_watch

from fsjobstore import JobCancelled, JobState, JobStore
from fsjobstore._os import _beneath, _syscalls
from fsjobstore._os._inotify import NameWatch
from fsjobstore._store import _jobstore


class Lookups:
    """The paths this thread looks up by name (stat), as the system-call hook sees them."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.thread = threading.get_ident()

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "stat" and threading.get_ident() == self.thread and isinstance(args[0], str):
            self.paths.append(args[0])

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        pass


def _other_process(root: Any, code: str) -> None:
    """Run ``code`` with ``s``, the store at ``root`` opened by another process."""
    subprocess.run([sys.executable, "-c", f"from fsjobstore import JobStore\nwith JobStore({str(root)!r}) as s:\n"
                    f"    {code}"], check=True, timeout=60)


def test_a_claim_and_commit_of_a_plain_job_look_up_no_cancel_request_targets_children_or_pause(tmp_path: Any) -> None:
    with JobStore(tmp_path / "s") as s:
        s.create("warm")
        s.pull_work().fulfill(b"")  # type: ignore[union-attr]
        s.create("x")
        rec = Lookups()
        _syscalls.set_hook(rec)
        try:
            lease = s.pull_work()
            assert lease is not None
            lease.fulfill(b"v")
        finally:
            _syscalls.set_hook(None)
        asked = [p for p in rec.paths if any(f"/{d}/" in p or p.endswith(f"/{d}")
                                             for d in ("cancel", "targets", "deps", "paused"))]
        assert asked == []


def test_a_cancel_request_made_by_another_process_just_before_a_commit_becomes_the_cancel(tmp_path: Any) -> None:
    with JobStore(tmp_path / "s") as s:
        job = s.create("x")
        lease = s.pull_work()
        assert lease is not None
        assert not lease.cancel_requested  # the watch of control/cancel/ is made now
        _other_process(tmp_path / "s", f"s.cancel({job.id!r}, 'stop it')")
        assert lease.cancel_requested
        with pytest.raises(JobCancelled):
            lease.fulfill(b"v")
        assert s.get(job.id).state is JobState.CANCELLED


def test_a_pause_made_by_another_process_stops_this_processes_next_claim_at_once(tmp_path: Any) -> None:
    with JobStore(tmp_path / "s") as s:
        for i in range(3):
            s.create(i)
        s.pull_work().fulfill(b"")  # type: ignore[union-attr]
        _other_process(tmp_path / "s", "s.pause('default')")
        assert s.pull_work() is None  # no settling time: the event is there when pause() returns
        _other_process(tmp_path / "s", "s.resume('default')")
        assert s.pull_work() is not None


def test_children_made_by_another_process_run_once_their_parent_commits_here(tmp_path: Any) -> None:
    with JobStore(tmp_path / "s") as s:
        parent = s.create("parent")
        lease = s.pull_work()
        assert lease is not None and s.pull_work() is None  # deps/ is watched from here on
        _other_process(tmp_path / "s", f"s.create('child', job_id='c' * 32, after=[{parent.id!r}])")
        assert s.pull_work() is None  # the child waits for its parent
        lease.fulfill(b"done")
        child = s.pull_work()
        assert child is not None and child.id == "c" * 32


def test_targets_added_by_another_process_before_a_commit_are_notified(tmp_path: Any) -> None:
    with JobStore(tmp_path / "s") as s:
        job = s.create("x")
        lease = s.pull_work()
        assert lease is not None
        lease.fulfill(b"warm")
        job = s.create("y")
        lease = s.pull_work()  # targets/ is watched from the first commit
        assert lease is not None
        _other_process(tmp_path / "s", f"s.queue({job.id!r}, 'mailbox')")
        lease.fulfill(b"v")
        note = s.pull_notification()
        assert note is not None and note.id == job.id


def test_a_directory_moved_from_under_the_watch_is_watched_anew_where_the_store_names_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lookup's own cached descriptor of control/cancel/ is trusted for RECHECK_AFTER
    # (_beneath); not waited for here.
    monkeypatch.setattr(_beneath, "RECHECK_AFTER", 0.0)
    with JobStore(tmp_path / "s") as s:
        job = s.create("x")
        lease = s.pull_work()
        assert lease is not None
        assert not lease.cancel_requested  # watched
        cancel_dir = tmp_path / "s" / "control" / "cancel"
        os.rename(cancel_dir, tmp_path / "old-cancel")  # a repair, or a member's swap
        os.mkdir(cancel_dir)
        (cancel_dir / f"{job.id}.json").write_text('{"reason": "moved", "at": 1}\n')
        (tmp_path / "old-cancel" / "stale.json").touch()  # the old directory is not watched now
        assert name_watch(s).listing(str(cancel_dir)) == frozenset({f"{job.id}.json"})
        with pytest.raises(JobCancelled):
            lease.fulfill(b"v")


def test_names_lost_to_a_queue_overflow_are_listed_again(tmp_path: Any) -> None:
    d = tmp_path / "d"
    d.mkdir()
    watch = NameWatch(str(tmp_path), (str(d),))
    try:
        assert watch.has(str(d), "a") is False
        with open("/proc/sys/fs/inotify/max_queued_events") as fh:
            limit = int(fh.read())
        for i in range(limit + 10):  # more events than the kernel queues: it drops the rest
            (d / f"n{i}").touch()
        os.unlink(d / "n0")
        assert watch.has(str(d), f"n{limit + 9}") is True
        assert watch.has(str(d), "n0") is False
        assert len(watch.listing(str(d)) or ()) == limit + 9
    finally:
        watch.close()


def test_a_forked_child_leaves_the_parents_events_alone(tmp_path: Any) -> None:
    d = tmp_path / "d"
    d.mkdir()
    watch = NameWatch(str(tmp_path), (str(d),))
    try:
        assert watch.has(str(d), "x") is False
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: wait for the parent's file, then ask (its own watch, if any)
            try:
                os.read(r, 1)
                watch.abandon_after_fork()
                child = NameWatch(str(tmp_path), (str(d),))
                os._exit(0 if child.has(str(d), "x") is True else 3)
            except BaseException:
                os._exit(4)
        (d / "x").touch()
        os.write(w, b"go")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert watch.has(str(d), "x") is True  # its event was still there for the parent
    finally:
        watch.close()


@pytest.mark.parametrize("lock_takeover", [None, True])
def test_on_a_network_filesystem_names_are_looked_up_not_watched_even_where_locks_are_trusted(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, lock_takeover: bool | None
) -> None:
    # As the store sees NFS or GlusterFS: inotify there misses every other host's changes,
    # whatever flock proves (lock_takeover=True is for a network filesystem whose locks work).
    monkeypatch.setattr(_jobstore, "locks_prove_death", lambda path: False)
    with JobStore(tmp_path / "s", lock_takeover=lock_takeover) as s:
        job = s.create("x")
        lease = s.pull_work()
        assert lease is not None
        rec = Lookups()
        _syscalls.set_hook(rec)
        try:
            lease.fulfill(b"v")
        finally:
            _syscalls.set_hook(None)
        assert any(p.endswith(f"/cancel/{job.id}.json") for p in rec.paths)
        assert name_watch(s).has(str(tmp_path / "s" / "control" / "cancel"), "x") is None


def test_a_directory_above_a_watched_one_moved_away_makes_the_watch_start_over(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Moving control/ sends no event for control/cancel/ or control/paused/ themselves: the
    # directories above a watched one are watched for their own move too. (The lookups' cached
    # descriptor of control/ is trusted for RECHECK_AFTER: not waited for here.)
    monkeypatch.setattr(_beneath, "RECHECK_AFTER", 0.0)
    with JobStore(tmp_path / "s") as s:
        s.create({}, queue="q")
        s.pull_work(queues="q").fulfill(b"")  # type: ignore[union-attr]  # paused/ watched
        job = s.create({}, queue="c")
        lease = s.pull_work(queues="c")
        assert lease is not None and not lease.cancel_requested  # cancel/ watched
        os.rename(tmp_path / "s" / "control", tmp_path / "control.old")  # a member's move
        _other_process(tmp_path / "s", f"s.pause('q'); s.cancel({job.id!r})")  # (its open makes control/ again)
        s.create({}, queue="q")
        assert s.pull_work(queues="q") is None
        assert lease.cancel_requested
        with pytest.raises(JobCancelled):
            lease.fulfill(b"v")


def test_a_fork_while_another_thread_asks_the_watch_leaves_a_child_that_works(tmp_path: Any) -> None:
    with JobStore(tmp_path / "s") as s:
        job = s.create("x")
        stop = threading.Event()

        def ask() -> None:
            while not stop.is_set():
                s.cancel_requested(job.id)
                s.paused()

        asker = threading.Thread(target=ask)
        asker.start()
        hung = 0
        try:
            for _ in range(40):
                pid = os.fork()
                if pid == 0:  # the child: the at-fork reset must not wait for the parent's thread
                    try:
                        s.pause("f")
                        s.cancel_requested(job.id)
                    finally:
                        os._exit(0)
                for _ in range(300):
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                    time.sleep(0.01)
                else:
                    hung += 1
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                s.resume("f")
        finally:
            stop.set()
            asker.join()
        assert hung == 0
