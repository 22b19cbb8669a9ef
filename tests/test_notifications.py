"""Notifications: queue/unqueue, delivery, partial delivery, backoff, exclusivity."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FakeWall, in_background

from fsjobstore import InvalidRequest, InvalidState, JobState, JobStore, LeaseLost, NotificationLease


def _finish(store: JobStore, value: bytes = b"v") -> None:
    lease = store.pull_work()
    assert lease is not None
    lease.fulfill(value)


def _leased_notification(store: JobStore, target: object = "t") -> tuple[str, NotificationLease]:
    """A fulfilled job with one target waiting, its notification leased by ``store``."""
    job = store.create("x")
    store.queue(job.id, target)
    _finish(store)
    note = store.pull_notification()
    assert note is not None
    return job.id, note


def test_targets_queued_before_fulfilment_are_notified_after_it(store: JobStore) -> None:
    job = store.create("x")
    store.queue(job.id, {"url": "a"})
    store.queue(job.id, "b")
    assert store.pull_notification() is None  # not final yet
    _finish(store, b"result")
    note = store.pull_notification()
    assert note is not None
    assert (note.id, note.state, note.value, note.waiting) == (job.id, JobState.FULFILLED, b"result",
                                                               ({"url": "a"}, "b"))
    note.done(note.waiting)
    assert store.pull_notification() is None
    assert store.get(job.id).waiting == ()


def test_a_target_queued_on_a_final_job_is_available_at_once(store: JobStore) -> None:
    job = store.create("x")
    _finish(store)
    assert store.pull_notification() is None
    store.queue(job.id, "late")
    note = store.pull_notification()
    assert note is not None and note.waiting == ("late",)


def test_queueing_the_same_target_twice_waits_once(store: JobStore) -> None:
    job = store.create("x")
    store.queue(job.id, {"b": 1, "a": 2})
    store.queue(job.id, {"a": 2, "b": 1})
    assert store.get(job.id).waiting == ({"b": 1, "a": 2},)


def test_unqueue_and_unqueue_all_remove_targets(store: JobStore) -> None:
    job = store.create("x")
    for t in ("a", "b", "c", "d"):
        store.queue(job.id, t)
    assert store.unqueue(job.id, "a") is True
    assert store.unqueue(job.id, "a") is False
    assert store.unqueue_all(job.id, ["b", "c", "zzz"]) == 2
    assert store.get(job.id).waiting == ("d",)


def test_unqueueing_every_target_of_a_final_job_leaves_nothing_to_notify(store: JobStore) -> None:
    job = store.create("x")
    store.queue(job.id, "a")
    _finish(store)
    store.unqueue(job.id, "a")
    assert store.pull_notification() is None


def test_partial_delivery_keeps_the_rest_for_later_after_a_backoff(open_store: Callable[..., JobStore]) -> None:
    wall = FakeWall()
    s = open_store(wall_clock=wall, backoff=lambda attempt: 10.0)
    job = s.create("x")
    for t in ("ok", "down"):
        s.queue(job.id, t)
    _finish(s)
    note = s.pull_notification()
    assert note is not None
    note.done(["ok"], error="connection refused")
    assert s.get(job.id).waiting == ("down",)
    assert s.pull_notification() is None  # backing off, not in a hot loop
    wall.advance(11)
    again = s.pull_notification()
    assert again is not None and again.waiting == ("down",) and again.attempts == 1
    again.done(["down"])
    assert s.pull_notification() is None


def test_get_shows_how_often_delivery_to_the_waiting_targets_failed_and_why(
        open_store: Callable[..., JobStore]) -> None:
    wall = FakeWall()
    s = open_store(wall_clock=wall, backoff=lambda attempt: 10.0)
    job = s.create("x")
    s.queue(job.id, "down")
    _finish(s)
    assert (s.get(job.id).delivery_attempts, s.get(job.id).delivery_error) == (0, None)  # none tried yet
    for attempt in (1, 2):
        note = s.pull_notification()
        assert note is not None
        note.done([], error=f"connection refused ({attempt})")
        wall.advance(11)
    got = s.get(job.id)
    assert got.waiting == ("down",) and got.delivery_attempts == 2
    assert got.delivery_error == "connection refused (2)" and got.to_dict()["delivery_error"] == got.delivery_error
    note = s.pull_notification()
    assert note is not None
    note.done(["down"])
    got = s.get(job.id)
    assert got.waiting == () and (got.delivery_attempts, got.delivery_error) == (0, None)


def test_a_new_target_during_delivery_is_not_held_back_by_the_backoff(open_store: Callable[..., JobStore]) -> None:
    wall = FakeWall()
    s = open_store(wall_clock=wall, backoff=lambda attempt: 100.0)
    job = s.create("x")
    s.queue(job.id, "first")
    _finish(s)
    note = s.pull_notification()
    assert note is not None
    s.queue(job.id, "second")
    note.done([])
    again = s.pull_notification()
    assert again is not None and set(again.waiting) == {"first", "second"}


def test_a_failed_job_notifies_with_its_error(store: JobStore) -> None:
    job = store.create("x", max_attempts=1)
    store.queue(job.id, "t")
    lease = store.pull_work()
    assert lease is not None
    lease.fail("it broke")
    note = store.pull_notification()
    assert note is not None and note.state is JobState.FAILED and note.value is None
    assert note.error == "it broke"


def test_a_notification_is_handed_to_one_notifier_at_a_time(open_store: Callable[..., JobStore]) -> None:
    a, b = open_store(backoff=lambda n: 0.0), open_store(backoff=lambda n: 0.0)
    _, note = _leased_notification(a)
    assert b.pull_notification() is None
    note.done([])
    assert b.pull_notification() is not None


def test_a_notifier_that_died_frees_its_notification_at_once(open_store: Callable[..., JobStore]) -> None:
    a, b = open_store(backoff=lambda n: 0.0), open_store(backoff=lambda n: 0.0)
    job_id, note = _leased_notification(a)
    note._claim.lock.release()  # what the kernel does to flock when the process dies
    taken = b.pull_notification()
    assert taken is not None and taken.waiting == ("t",)
    with pytest.raises(LeaseLost):
        note.done(["t"])
    assert b.get(job_id).waiting == ("t",)  # the loser removed nothing


def test_done_twice_is_refused(store: JobStore) -> None:
    _, note = _leased_notification(store)
    note.done(["t"])
    with pytest.raises(InvalidState):
        note.done(["t"])


def test_a_notification_lease_as_context_manager_releases_on_exit(store: JobStore) -> None:
    job_id, note = _leased_notification(store)
    with pytest.raises(ValueError), note:
        raise ValueError("delivery failed")
    assert store.get(job_id).waiting == ("t",)


def test_recovery_restores_a_lost_notification_index_entry(store: JobStore) -> None:
    import os
    job = store.create("x")
    store.queue(job.id, "t")
    _finish(store)
    os.unlink(os.path.join(store.path, "jobs", "notify", f"{job.id}.json"))  # crash before indexing
    assert store.pull_notification() is None
    assert store.recover().notifications_restored == 1
    assert store.pull_notification() is not None


def test_done_survives_a_sweep_removing_the_emptied_target_directory(store: JobStore,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from fsjobstore._os import _files as _fsops
    job_id, note = _leased_notification(store)
    real_unlink = _fsops.unlink

    def unlink_then_sweep(path: str, *, missing_ok: bool = True) -> bool:
        removed = real_unlink(path, missing_ok=missing_ok)
        if os.sep + "targets" + os.sep in path:
            os.rmdir(os.path.dirname(path))  # what a concurrent recovery sweep may do
        return removed

    monkeypatch.setattr(_fsops, "unlink", unlink_then_sweep)
    note.done(["t"])
    monkeypatch.undo()
    assert store.get(job_id).waiting == () and store.pull_notification() is None


def test_a_waiting_notifier_is_woken_when_a_job_becomes_final(open_store: Callable[..., JobStore]) -> None:
    notifier, worker = open_store(poll_interval=60.0), open_store()
    job = worker.create("x")
    worker.queue(job.id, "t")
    notifier.pull_notification(timeout=0.01)  # start the watcher
    pulled = in_background(lambda: notifier.pull_notification(timeout=20))
    _finish(worker)
    note = pulled()
    assert note is not None and note.id == job.id


def test_done_with_a_target_that_was_not_offered_is_refused_and_changes_nothing(store: JobStore) -> None:
    job = store.create("x")
    store.queue(job.id, "a")
    store.queue(job.id, "b")
    store.fulfill(job.id, "v")
    note = store.pull_notification()
    assert note is not None and set(note.waiting) == {"a", "b"}
    with pytest.raises(InvalidRequest, match=r"did not offer.*'not-waiting'"):
        note.done(["a", "not-waiting"])
    assert not note.finished and set(store.get(job.id).waiting) == {"a", "b"}
    note.done(["a"])  # the lease is still held: a corrected call works
    assert store.get(job.id).waiting == ("b",)


def test_a_hung_notifier_whose_owner_file_was_cleaned_up_loses_its_lock_where_locks_prove_nothing(
    open_store: Callable[..., JobStore],
) -> None:
    import os

    from conftest import freeze
    from internals import owner

    settings = {"backoff": lambda n: 0.0, "lock_takeover": False, "lease_duration": 1.0, "heartbeat_interval": 0.2}
    a, b = open_store(**settings), open_store(**settings)
    job_id, note = _leased_notification(a)
    freeze(a)  # hung: no more beats, and its flock stays held (a hung GlusterFS client keeps it)
    os.unlink(owner(a).path)  # another process judged it expired and cleaned its owner file up
    taken = b.pull_notification()
    assert taken is not None and taken.id == job_id
    taken.done(["t"])
    with pytest.raises(LeaseLost):
        note.done(["t"])


def test_releasing_a_notification_hands_it_back_untouched(open_store: Callable[..., JobStore]) -> None:
    wall = FakeWall()
    s = open_store(wall_clock=wall, backoff=lambda attempt: 100.0)
    job_id, note = _leased_notification(s)
    note.release()
    again = s.pull_notification()  # no backoff: it is due at once, as before
    assert again is not None and again.waiting == ("t",)
    assert again.attempts == 0  # no delivery attempt was counted
    again.release()
    snapshot = s.get(job_id)
    assert (snapshot.delivery_attempts, snapshot.delivery_error) == (0, None)


def test_a_burst_notifier_says_what_waits_for_its_backoff_and_for_how_long(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root, backoff=lambda attempt: 600.0) as store:
        job = store.create({"n": 1}, queue="mail")
        store.queue(job.id, {"to": "x"})
        lease = store.pull_work()
        assert lease is not None
        lease.fulfill("ok")
        note = store.pull_notification()
        assert note is not None
        note.done([], error="smtp down")  # the target stays, due again in 600 s
        waiting = store.notifications()
        assert [j.id for j in waiting] == [job.id] and waiting[0].delivery_error == "smtp down"
        assert waiting[0].delivery_due_at is not None and 590 < waiting[0].delivery_due_at - time.time() <= 600
        assert store.notifications(queues="other-*") == []
    (tmp_path / "deliver_mod.py").write_text("def deliver(target, note):\n    pass\n")
    ran = subprocess.run([sys.executable, "-m", "fsjobstore", "notify", root, "--handler", "deliver_mod:deliver",
                          "--burst"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert f"1 notification(s) wait for a later delivery; the next, job {job.id} (queue mail), is due in" in ran.stderr
    assert "after 1 failed delivery(ies): smtp down" in ran.stderr
    shown = subprocess.run([sys.executable, "-m", "fsjobstore", "get", root, job.id], capture_output=True, text=True,
                           timeout=60)
    assert re.search(r"^next delivery +in \d+ s", shown.stdout, re.M), shown.stdout
