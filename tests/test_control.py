"""Job control through the store: cancel, retry, pause, time limits, progress and logs, waiting
for a result, and the worker registry. Each store opened here stands for another process."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest
from conftest import FakeWall, in_background
from internals import count_paused_listings, die, freeze, pretend_paused_dir_unchanged

from fsjobstore import (
    InvalidRequest,
    InvalidState,
    Job,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobState,
    JobStore,
    LeaseLost,
    WaitTimeout,
)
from fsjobstore._core import _control, _doorbell


# == cancel ======================================================================================
def test_a_pending_or_scheduled_job_is_cancelled_at_once_and_its_targets_hear_it(store: JobStore) -> None:
    waiting = store.create({"n": 1})
    later = store.create({"n": 2}, delay=3600)
    store.queue(waiting.id, "t")
    got = store.cancel(waiting.id, reason="not needed")
    assert got.state is JobState.CANCELLED and got.error == "cancelled: not needed" and got.attempts == 0
    assert store.cancel(later.id).state is JobState.CANCELLED
    assert store.pull_work() is None
    note = store.pull_notification()
    assert note is not None and note.id == waiting.id and note.state is JobState.CANCELLED
    note.done(note.waiting)
    with pytest.raises(InvalidState, match="already cancelled"):
        store.cancel(waiting.id)
    with pytest.raises(JobCancelled):
        store.get(waiting.id).result()
    assert store.statistics().cancelled == 2


def test_a_final_job_cannot_be_cancelled(store: JobStore) -> None:
    job = store.create(1)
    store.fulfill(job.id, "done")
    with pytest.raises(InvalidState, match="already fulfilled"):
        store.cancel(job.id)
    with pytest.raises(JobNotFound):
        store.cancel("no-such-job")


def test_a_running_job_is_asked_to_stop_and_ends_cancelled_whatever_its_holder_commits(
    open_store: Callable[..., JobStore],
) -> None:
    worker, operator = open_store(), open_store()
    job = worker.create({"n": 1})
    noticed: list[str] = []
    lease = worker.pull_work()
    assert lease is not None
    lease.on_cancel = lambda lease: noticed.append(lease.id)
    assert lease.cancel_requested is False
    snap = operator.cancel(job.id, reason="user asked")
    assert snap.state is JobState.ACTIVE and snap.cancel_requested
    assert lease.cancel_requested is True and noticed == [job.id]
    with pytest.raises(JobCancelled, match="was cancelled"):
        lease.fulfill("too late")
    got = operator.get(job.id)
    assert got.state is JobState.CANCELLED and got.value is None and got.error == "cancelled: user asked"
    assert got.attempts == 1 and not operator.cancel_requested(job.id)


def test_the_heartbeat_tells_a_holder_of_a_cancel(open_store: Callable[..., JobStore]) -> None:
    worker = open_store(lease_duration=0.8, heartbeat_interval=0.05)
    operator = open_store()
    job = worker.create(1)
    told = threading.Event()
    lease = worker.pull_work()
    assert lease is not None
    lease.on_cancel = lambda lease: told.set()
    operator.cancel(job.id)
    assert told.wait(10)  # nobody read cancel_requested: the heartbeat noticed
    lease.release()  # giving it back ends it cancelled too (no error: the holder was stopping)
    assert operator.get(job.id).state is JobState.CANCELLED


@pytest.mark.parametrize("commit_lands", ["before the request", "between the second look and the snapshot"])
def test_a_cancel_that_a_holders_commit_beat_raises_invalid_state_and_leaves_no_request(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch, commit_lands: str) -> None:
    """The holder's commit looked for a request before ours was made, and ended the job
    fulfilled: the cancel came too late. It must say so, not return as if it had cancelled (a
    bulk cancel counted such jobs as cancelled: a new user's trial, 7-13 in 1,300), nor hand back
    the fulfilled job when the commit lands after the cancel's second look (1-2 in 300 races)."""
    from fsjobstore._transitions import _by_id

    worker, operator = open_store(), open_store()
    job = worker.create(1)
    lease = worker.pull_work()
    assert lease is not None

    def commit() -> None:
        with monkeypatch.context() as m:  # its look for a request came before the request was made
            m.setattr(_control.Control, "cancel_reason", lambda self, job_id: None)
            lease.fulfill("done first")

    if commit_lands == "before the request":
        real_request = _control.Control.request_cancel

        def request_after_it(self: _control.Control, job_id: str, reason: str | None) -> None:
            commit()
            real_request(self, job_id, reason)

        monkeypatch.setattr(_control.Control, "request_cancel", request_after_it)
    else:
        real_snapshot = _by_id.ById.snapshot

        def snapshot_after_it(self: _by_id.ById, job_id: str) -> Job:
            monkeypatch.setattr(_by_id.ById, "snapshot", real_snapshot)
            commit()
            return real_snapshot(self, job_id)

        monkeypatch.setattr(_by_id.ById, "snapshot", snapshot_after_it)
    with pytest.raises(InvalidState, match="ended fulfilled before the cancel reached it"):
        operator.cancel(job.id)
    monkeypatch.undo()
    got = operator.get(job.id)
    assert got.state is JobState.FULFILLED and got.value == "done first"
    assert not operator.cancel_requested(job.id)


def test_a_cancelled_job_whose_holder_died_is_ended_by_recovery(open_store: Callable[..., JobStore]) -> None:
    worker, operator = open_store(), open_store()
    job = worker.create(1)
    assert worker.pull_work() is not None
    die(worker)
    got = operator.cancel(job.id)  # the holder is dead: cancelled at once, through its take-over
    assert got.state is JobState.CANCELLED and got.attempts == 1


def test_a_cancel_request_for_a_hung_holder_is_honoured_by_the_take_over(open_store: Callable[..., JobStore]) -> None:
    clock = FakeWall(0.0)
    worker, rescuer = open_store(lease_duration=30.0), open_store(lease_duration=30.0, clock=clock)
    job = worker.create(1)
    lease = worker.pull_work()
    assert lease is not None
    freeze(worker)  # alive, but its heartbeat stopped
    rescuer.cancel(job.id)
    assert rescuer.get(job.id).state is JobState.ACTIVE
    rescuer.recover()
    clock.advance(31)
    assert rescuer.recover().cancelled == 1
    assert rescuer.get(job.id).state is JobState.CANCELLED
    with pytest.raises(LeaseLost):
        lease.fulfill("late")


# == retry =======================================================================================
def test_retry_gives_a_failed_job_a_new_life_and_keeps_its_history(store: JobStore) -> None:
    job = store.create({"n": 1}, max_attempts=2)
    for error in ("first", "second"):
        lease = store.pull_work()
        assert lease is not None
        lease.fail(error)
    failed = store.get(job.id)
    assert failed.state is JobState.FAILED and failed.attempts == 2
    with pytest.raises(JobFailed, match="second") as info:
        failed.result()
    assert info.value.error == "second"
    again = store.retry(job.id)
    assert again.state is JobState.PENDING and again.attempts == 0 and again.error is None
    assert again.history == ({"state": "failed", "attempts": 2, "error": "second",
                              "finished_at": failed.finished_at},)
    lease = store.pull_work()
    assert lease is not None and lease.attempt == 1 and lease.max_attempts == 2
    lease.fulfill("third time lucky")
    done = store.get(job.id)
    assert done.result() == "third time lucky" and len(done.history) == 1


def test_retry_of_a_cancelled_job_and_refusals(store: JobStore) -> None:
    job = store.create(1)
    store.cancel(job.id, reason="oops")
    assert store.retry(job.id).history[0]["state"] == "cancelled"
    with pytest.raises(InvalidState, match="only a failed or cancelled job"):
        store.retry(job.id)  # it is pending again
    store.fulfill(job.id, 1)
    with pytest.raises(InvalidState, match="is fulfilled"):
        store.retry(job.id)


def test_a_retried_job_notifies_its_targets_of_its_new_outcome(store: JobStore) -> None:
    job = store.create(1, max_attempts=1)
    store.queue(job.id, "t")
    lease = store.pull_work()
    assert lease is not None
    lease.fail("no")
    store.retry(job.id)  # before any notifier delivered the failure
    assert store.pull_notification() is None
    store.fulfill(job.id, "yes")
    note = store.pull_notification()
    assert note is not None and note.state is JobState.FULFILLED and note.value == "yes"


# == pause =======================================================================================
def test_pause_stops_claims_from_that_queue_in_every_process(open_store: Callable[..., JobStore]) -> None:
    a, b = open_store(), open_store()
    a.create("img", queue="images")
    a.create("mail", queue="email")
    assert b.pause("images") is True and b.pause("images") is False
    assert a.paused() == frozenset({"images"})
    lease = a.pull_work()
    assert lease is not None and lease.queue == "email"
    lease.fulfill(None)
    assert a.pull_work() is None and a.pull_work(queues="images") is None
    a.create("more", queue="images")  # a paused queue still takes jobs
    assert a.statistics().pending_by_queue["images"] == 2
    assert b.resume("images") is True and b.resume("images") is False
    lease = a.pull_work(queues=["images"])
    assert lease is not None and lease.queue == "images"


# == time limits =================================================================================
def test_a_job_with_a_timeout_has_a_deadline_that_touch_moves(open_store: Callable[..., JobStore]) -> None:
    store = open_store(default_timeout=60)
    job = store.create(1)
    assert store.get(job.id).timeout == 60.0
    assert store.create(2, timeout=5).timeout == 5.0
    lease = store.pull_work()
    assert lease is not None and lease.timeout == 60.0 and lease.deadline is not None
    first = lease.deadline
    deadlines = os.listdir(os.path.join(store.path, "control", "deadlines"))
    assert len(deadlines) == 1 and deadlines[0].endswith(f".{job.id}.{lease.token}")
    lease.touch(extend=600)
    assert lease.deadline > first + 500
    assert os.listdir(os.path.join(store.path, "control", "deadlines")) != deadlines
    lease.fulfill("ok")
    assert os.listdir(os.path.join(store.path, "control", "deadlines")) == []
    with pytest.raises(InvalidRequest, match=r"timeout \(seconds, or None\) must be a number in \(0, "):
        store.create(3, timeout=0)
    plain = open_store()
    plain.create(4, queue="plain")
    lease = plain.pull_work(queues="plain")
    assert lease is not None and lease.timeout is None
    with pytest.raises(InvalidRequest, match="no timeout to renew"):
        lease.touch()
    lease.touch(extend=30)  # a job without a limit may be given one
    assert lease.deadline is not None


def test_an_attempt_that_overran_its_limit_is_taken_over_even_from_a_live_holder(
    open_store: Callable[..., JobStore],
) -> None:
    wall = FakeWall()
    worker = open_store(lease_duration=30.0, wall_clock=wall)
    rescuer = open_store(lease_duration=30.0, wall_clock=wall)
    job = worker.create(1, timeout=10)
    lives: list[str] = []
    lease = worker.pull_work(on_compromised=lambda exc: lives.append(exc.reason))
    assert lease is not None
    wall.advance(35)  # past the limit, but not by a whole lease: its own runtime's business
    assert rescuer.recover().timed_out == 0
    wall.advance(10)
    report = rescuer.recover()
    assert report.timed_out == 1 and report.requeued == 1
    got = rescuer.get(job.id)
    assert got.state is JobState.PENDING and got.error == "TimeLimitExceeded: attempt 1 ran past its limit of 10 s"
    with pytest.raises(LeaseLost):
        lease.fulfill("late")


def test_time_out_fails_the_attempt_and_fences_the_late_commit(open_store: Callable[..., JobStore]) -> None:
    store = open_store(backoff=lambda attempt: 0.0)
    job = store.create(1, timeout=5, max_attempts=2)
    reasons: list[str] = []
    lease = store.pull_work(on_compromised=lambda exc: reasons.append(exc.reason))
    assert lease is not None
    assert lease.time_out() is True  # what the thread runtime does at the deadline
    assert lease.time_out() is False
    assert reasons == ["timeout"]
    with pytest.raises(LeaseLost, match="TimeLimitExceeded: attempt 1 ran past its limit of 5 s"):
        lease.fulfill("too late")
    got = store.get(job.id)
    assert got.state is JobState.PENDING and got.attempts == 1 and "TimeLimitExceeded" in (got.error or "")


# == progress and logs ===========================================================================
def test_progress_and_logs_are_visible_to_others_during_and_after_the_job(open_store: Callable[..., JobStore]) -> None:
    worker, watcher = open_store(backoff=lambda attempt: 0.0), open_store()
    job = worker.create(1)
    lease = worker.pull_work()
    assert lease is not None
    for i in range(300):  # cheap enough to call hundreds of times
        lease.progress(i, 300, f"step {i}")
        lease.log(f"line {i}")
    seen = watcher.get(job.id)
    assert seen.progress is not None and (seen.progress.done, seen.progress.total) == (299, 300)
    assert seen.progress.message == "step 299" and seen.progress.attempt == 1
    assert [line.line for line in seen.logs][-2:] == ["line 298", "line 299"] and seen.logs_dropped == 0
    lease.fail("retry me")
    lease = worker.pull_work()
    assert lease is not None
    lease.log("second attempt")
    lease.fulfill("ok")
    done = watcher.get(job.id)
    assert [(line.attempt, line.line) for line in done.logs][-2:] == [(1, "line 299"), (2, "second attempt")]
    assert done.progress is not None and done.progress.attempt == 1
    with pytest.raises((LeaseLost, InvalidState)):
        lease.log("after the end")


def test_a_job_given_back_shows_no_progress_of_the_claim_that_gave_it_back(store: JobStore) -> None:
    """A released claim ran no attempt: its progress is not the job's, while the job waits, once
    it runs again (as the same attempt), nor once it ends. Its log lines stay."""
    job = store.create(1)
    first = store.pull_work()
    assert first is not None
    first.progress(32, 60, "resizing")
    first.log("stopping early")
    first.release()
    waiting = store.get(job.id)
    assert waiting.state is JobState.PENDING and waiting.progress is None
    assert [(line.attempt, line.line) for line in waiting.logs] == [(1, "stopping early")]
    again = store.pull_work()
    assert again is not None and again.attempt == 1
    assert store.get(job.id).progress is None  # the running claim has said nothing yet
    again.progress(5, 60)
    running = store.get(job.id).progress
    assert running is not None and (running.done, running.attempt) == (5, 1)
    again.release()
    third = store.pull_work()
    assert third is not None
    third.fulfill("ok")
    done = store.get(job.id)
    assert done.state is JobState.FULFILLED and done.progress is None  # every claim that reported gave it back


def test_a_superseded_holder_cannot_write_progress_into_the_new_attempt(open_store: Callable[..., JobStore]) -> None:
    worker, rescuer = open_store(), open_store()
    job = worker.create(1)
    old = worker.pull_work()
    assert old is not None
    old.log("old says hi")
    die(worker)
    rescuer.recover()
    new = rescuer.pull_work()
    assert new is not None and new.attempt == 2
    with pytest.raises(LeaseLost):
        old.log("a late line")
    with pytest.raises(LeaseLost):
        old.progress(5)
    new.log("new says hi")
    lines = [(line.attempt, line.line) for line in rescuer.get(job.id).logs]
    assert lines == [(1, "old says hi"), (2, "new says hi")]


def test_a_long_log_keeps_its_newest_lines_and_counts_the_dropped(store: JobStore) -> None:
    job = store.create(1)
    lease = store.pull_work()
    assert lease is not None
    for i in range(2000):
        lease.log(f"{i:05d} " + "x" * 200)
    got = store.get(job.id)
    assert got.logs[-1].line.startswith("01999") and got.logs_dropped > 0
    assert len(got.logs) + got.logs_dropped == 2000
    size = os.path.getsize(os.path.join(store.path, "runs", job.id, f"{lease.token}.jsonl"))
    assert size <= 256 * 1024
    with pytest.raises(InvalidRequest):
        lease.progress(float("nan"))


# == waiting =====================================================================================
def test_wait_returns_when_another_process_finishes_the_job(open_store: Callable[..., JobStore]) -> None:
    waiter, worker = open_store(), open_store()
    job = waiter.create({"n": 2})
    result = in_background(lambda: waiter.wait(job.id, timeout=30))
    started = time.monotonic()
    lease = worker.pull_work()
    assert lease is not None
    lease.fulfill({"square": 4})
    got = result()
    assert got.state is JobState.FULFILLED and got.result() == {"square": 4}
    assert time.monotonic() - started < 5  # woken, not polled at its leisure
    with pytest.raises(WaitTimeout):
        waiter.wait(waiter.create(3).id, timeout=0.2)
    with pytest.raises(JobNotFound):
        waiter.wait("nope", timeout=0.1)


# == workers =====================================================================================
def test_workers_publish_themselves_and_a_dead_ones_entry_goes(open_store: Callable[..., JobStore]) -> None:
    worker, other = open_store(), open_store()
    worker.publish_worker({"name": "w1", "queues": ["images"], "concurrency": 4, "mode": "threads",
                           "started_at": 1.0, "jobs_done": 7, "jobs_failed": 1, "paused": False,
                           "current": [{"id": "j1", "queue": "images", "attempt": 1, "started_at": 2.0}]})
    seen = other.workers()
    assert len(seen) == 1
    w = seen[0]
    assert (w.name, w.pid, w.queues, w.concurrency, w.jobs_done, w.current[0]["id"]) == (
        "w1", os.getpid(), ("images",), 4, 7, "j1")
    die(worker)
    assert other.workers() == []
    assert other.recover().workers_removed == 1
    assert os.listdir(os.path.join(other.path, "workers")) == []


# == the doorbell ================================================================================
@pytest.mark.parametrize("doorbell", [True, False])
def test_the_doorbell_wakes_a_waiter_that_cannot_see_the_other_process(open_store: Callable[..., JobStore],
                                                                       doorbell: bool) -> None:
    """Without inotify (as between two hosts), a waiter hears of a new job through the doorbell
    within tens of milliseconds; without the doorbell only its poll_interval rescan finds it."""
    waiter = open_store(watch=False, poll_interval=3.0, doorbell=doorbell)
    producer = open_store(watch=False, doorbell=doorbell)
    got = in_background(lambda: waiter.pull_work(timeout=10), settle=0.5)
    made = time.monotonic()
    job = producer.create({"n": 1})
    lease = got()
    waited = time.monotonic() - made
    assert lease is not None and lease.id == job.id
    if doorbell:
        assert waited < 0.5, waited
        assert len(os.listdir(os.path.join(producer.path, "control", "doorbell"))) == 1
    else:
        assert waited > 1.0, waited  # it slept until its rescan: what the doorbell is for


def test_a_gone_processs_bell_and_ear_are_swept(open_store: Callable[..., JobStore]) -> None:
    producer, other = open_store(doorbell=True), open_store()
    waits = producer.wakeups("done")  # its ear, kept while it waits for results
    producer.create(1)
    bells = os.path.join(producer.path, "control", "doorbell")
    deadline = time.monotonic() + 5
    while len(os.listdir(bells)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(name.split(".")[1] for name in os.listdir(bells)) == ["ear", "work"]
    die(producer)
    other.recover()
    assert os.listdir(bells) == []
    waits.close()


def _done_bells(store: JobStore) -> list[str]:
    return [n for n in os.listdir(os.path.join(store.path, "control", "doorbell")) if ".done." in n]


def test_the_done_bell_rings_only_while_another_process_waits_for_results(
        open_store: Callable[..., JobStore]) -> None:
    # A drain nobody waits on pays no rename per 25 ms for the feature: on the replicated
    # GlusterFS bed that was a tenth of its rate.
    worker, waiter = open_store(durable=False, doorbell=True), open_store(doorbell=True)
    for i in range(20):
        worker.create(i)
    while (lease := worker.pull_work()) is not None:
        lease.fulfill(None)
    time.sleep(0.1)  # a ring would have gone out
    assert _done_bells(worker) == []
    job = worker.create("x")
    got = in_background(lambda: waiter.wait(job.id, timeout=30), settle=0.2)
    ears = [n for n in os.listdir(os.path.join(waiter.path, "control", "doorbell")) if ".ear." in n]
    assert ears == [f"{waiter._core.owner_id()}.ear.done"]  # kept while it waits
    lease = worker.pull_work()
    assert lease is not None and lease.id == job.id
    lease.fulfill("ok")
    assert got().value == "ok"
    listening = waiter.wakeups("done")  # an ear kept until closed
    time.sleep(_doorbell.EAR_LOOK + 0.1)  # the ringer's last look, which found none, is stale
    for i in range(5):
        worker.create(i)
    while (lease := worker.pull_work()) is not None:
        lease.fulfill(None)
    deadline = time.monotonic() + 5
    while not _done_bells(worker) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [n.split(".")[0] for n in _done_bells(worker)] == [worker._core.owner_id()]
    listening.close()
    assert not [n for n in os.listdir(os.path.join(waiter.path, "control", "doorbell")) if ".ear." in n]


def test_claims_list_control_paused_only_when_it_changed(open_store: Callable[..., JobStore]) -> None:
    a, b = open_store(durable=False), open_store(durable=False)
    paused_dir = os.path.join(a.path, "control", "paused")
    old = time.time() - 60
    os.utime(paused_dir, (old, old))  # settled: a listing of it can be trusted
    ids = [a.create(i).id for i in range(50)]
    listings = count_paused_listings(a)
    for _ in range(40):
        lease = a.pull_work()
        assert lease is not None
        lease.fulfill(None)
    assert listings[0] <= 2, listings[0]  # one stat per claim instead
    assert b.pause("default") is True
    assert a.pull_work() is None  # the stat changed: the very next claim knows
    assert b.resume("default") is True
    lease = a.pull_work()
    assert lease is not None and lease.id == ids[40]


def test_a_pause_hidden_from_the_directory_stat_stops_claims_within_a_second(
        open_store: Callable[..., JobStore]) -> None:
    a, b = open_store(durable=False), open_store(durable=False)
    for i in range(100):
        a.create(i)
    pretend_paused_dir_unchanged(a, changed_at=time.time() - 60)
    assert a.pull_work() is not None  # listed (nothing paused) and trusted for a second
    b.pause("default")
    deadline = time.monotonic() + 1.5
    taken = 0
    while a.pull_work() is not None:
        taken += 1
        assert time.monotonic() < deadline, "a pause the stat hid was not seen within a second"
        time.sleep(0.05)
    assert taken <= 30 and a.statistics().pending_by_queue["default"] == 99 - taken


def test_a_pause_right_after_a_change_is_seen_within_20_ms_even_if_the_stat_misses_it(
        open_store: Callable[..., JobStore]) -> None:
    a, b = open_store(durable=False), open_store(durable=False)
    for i in range(5):
        a.create(i)
    pretend_paused_dir_unchanged(a, changed_at=time.time())  # changed in the tick of the listing
    assert a.pull_work() is not None
    b.pause("default")
    time.sleep(_control.PAUSED_RECHECK_UNSETTLED)
    assert a.pull_work() is None  # a recently changed directory's listing is trusted that long only


def test_claims_go_on_when_control_paused_was_removed_by_hand(open_store: Callable[..., JobStore]) -> None:
    store = open_store(durable=False)
    store.create(1)
    os.rmdir(os.path.join(store.path, "control", "paused"))
    lease = store.pull_work()
    assert lease is not None and store.paused() == frozenset()


def test_a_stream_of_commits_rings_the_done_bell_at_most_every_25_ms(open_store: Callable[..., JobStore]) -> None:
    """Each ring is a rename: through FUSE, one per commit was a round trip per job."""
    store = open_store(durable=False, doorbell=True)
    waits = open_store(doorbell=True).wakeups("done")  # another process waits for results
    for i in range(300):
        store.create(i)
    started = time.monotonic()
    while (lease := store.pull_work()) is not None:
        lease.fulfill(None)
    elapsed = time.monotonic() - started
    time.sleep(0.1)  # the last ring goes out
    bells = os.listdir(os.path.join(store.path, "control", "doorbell"))
    done = [int(name.rsplit(".", 1)[1], 16) for name in bells if ".done." in name]
    assert len(done) == 1
    assert done[0] <= elapsed / 0.025 + 2, (done[0], elapsed)
    waits.close()
