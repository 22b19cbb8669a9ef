"""Each crash window of a commit, create and notification, and what recovery makes of it.

The real code is stopped at a chosen step (that step raises), and the owner is then made dead the
way the kernel does it when a process dies: its flock is released and its files stay.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeWall, die, freeze
from internals import owner, owner_or_none, pending_file, temp_path

from fsjobstore import JobExists, JobNotFound, JobState, JobStore, LeaseLost, WorkLease
from fsjobstore._core import _tree
from fsjobstore._os import _files as _fsops
from fsjobstore._os import _syscalls


class Crash(BaseException):
    """Stands for the process dying at this instant (not an Exception: nothing catches it)."""


def names(store: JobStore, rel: str) -> list[str]:
    return sorted(os.listdir(os.path.join(store.path, rel)))


def crash(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, when: Callable[..., bool] | None = None) -> None:
    """Make ``owner.name`` die (raise Crash) when called, or only when ``when(*args)`` holds."""
    real = getattr(owner, name)

    def dying(*args: Any, **kwargs: Any) -> Any:
        if when is None or when(*args):
            raise Crash()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, dying)


def commit_and_die(worker: JobStore, monkeypatch: pytest.MonkeyPatch, commit: Callable[[WorkLease], None],
                   owner: object, name: str, when: Callable[..., bool] | None = None) -> str:
    """Claim the job, die inside ``owner.name`` during ``commit``; returns the job id."""
    lease = worker.pull_work()
    assert lease is not None
    crash(monkeypatch, owner, name, when)
    with pytest.raises(Crash):
        commit(lease)
    monkeypatch.undo()
    die(worker)
    return lease.id


def _is_commit_file(path: str, *_: object) -> bool:
    return path.endswith(".commit")


def requeue_and_crash_before_the_drop(worker: JobStore, recoverer: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """``worker`` claims the job and dies; ``recoverer`` requeues it and dies (Crash) after the
    publish, before dropping its ``.commit``."""
    assert worker.pull_work() is not None
    die(worker)
    crash(monkeypatch, _fsops, "unlink_quietly", _is_commit_file)
    with pytest.raises(Crash):
        recoverer.recover()
    monkeypatch.undo()


@pytest.fixture
def pair(open_store: Callable[..., JobStore]) -> tuple[JobStore, JobStore]:
    return open_store(backoff=lambda a: 0.0), open_store(backoff=lambda a: 0.0)


def test_a_retry_that_died_after_its_fence_is_finished_from_its_temp_file(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, rescuer = pair
    worker.create("x")
    job_id = commit_and_die(worker, monkeypatch, lambda lease: lease.fail("boom"), _tree.Tree, "publish")
    assert [n.rsplit(".", 1)[1] for n in names(rescuer, "jobs/active")] == ["commit"]
    report = rescuer.recover()
    assert report.commits_finished == 1 and report.requeued == 0
    got = rescuer.get(job_id)
    assert got.state is JobState.PENDING and got.attempts == 1 and got.error == "boom"
    assert names(rescuer, "jobs/active") == [] and names(rescuer, "tmp") == []


def test_a_retry_whose_temp_file_is_torn_is_undone_and_the_attempt_counted(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, rescuer = pair
    job = worker.create("x")
    commit_and_die(worker, monkeypatch, lambda lease: lease.fail("boom"), _tree.Tree, "publish")
    [tmp] = names(rescuer, "tmp")
    with open(os.path.join(rescuer.path, "tmp", tmp), "r+b") as fh:
        fh.truncate(20)  # as a power loss can leave a file whose data was not yet on disk
    report = rescuer.recover()
    assert report.requeued == 1 and report.commits_finished == 0
    got = rescuer.get(job.id)
    assert got.state is JobState.PENDING and got.attempts == 1


def test_a_result_appended_by_a_worker_that_died_before_its_rename_is_published(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, rescuer = pair
    worker.create("x")
    job_id = commit_and_die(worker, monkeypatch, lambda lease: lease.fulfill(b"result"), _tree.Tree, "publish_final")
    [claim] = names(rescuer, "jobs/active")
    with open(os.path.join(rescuer.path, "jobs", "active", claim), "rb") as fh:
        assert fh.read().count(b"\n") == 2  # the record line and the result line
    report = rescuer.recover()
    assert report.commits_finished == 1 and report.requeued == 0
    got = rescuer.get(job_id)
    assert got.state is JobState.FULFILLED and got.value == b"result" and got.attempts == 1
    assert names(rescuer, "jobs/active") == [] and names(rescuer, "tmp") == []


def test_a_result_line_cut_short_by_a_crash_is_ignored_and_the_job_requeued_without_it(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, rescuer = pair
    job = worker.create("x")
    commit_and_die(worker, monkeypatch, lambda lease: lease.fulfill(b"result"), _tree.Tree, "publish_final")
    [claim] = names(rescuer, "jobs/active")
    path = os.path.join(rescuer.path, "jobs", "active", claim)
    with open(path, "r+b") as fh:
        data = fh.read()
        fh.truncate(len(data) - 5)  # the append reached the disk only in part
    report = rescuer.recover()
    assert report.requeued == 1 and report.commits_finished == 0
    got = rescuer.get(job.id)
    assert got.state is JobState.PENDING and got.attempts == 1 and got.value is None
    with open(pending_file(rescuer.path, job.id), "rb") as fh:
        assert fh.read().count(b"\n") == 1  # requeued from the record line alone


def test_a_commit_that_died_between_link_and_unlink_leaves_one_result(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where renameat2 is missing, publishing a result is link() then unlink()."""
    worker, rescuer = pair
    job = worker.create("x")
    monkeypatch.setattr(_syscalls, "_renameat2", None)
    lease = worker.pull_work()
    assert lease is not None
    crash(monkeypatch, _syscalls, "unlink", lambda path: f"{os.sep}active{os.sep}" in path)
    with pytest.raises(Crash):
        lease.fulfill(b"result")
    monkeypatch.undo()
    die(worker)
    assert len(names(rescuer, "jobs/active")) == 1 and names(rescuer, "jobs/fulfilled") == [f"{job.id}.json"]
    report = rescuer.recover()
    assert report.requeued == 0 and report.duplicates_dropped == 1
    assert rescuer.get(job.id).value == b"result"
    assert rescuer.statistics().pending == 0 and names(rescuer, "jobs/active") == []


def test_a_retry_that_died_after_publishing_is_not_run_twice(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, rescuer = pair
    job = worker.create("x")
    commit_and_die(worker, monkeypatch, lambda lease: lease.fail("boom"), _fsops, "unlink_quietly", _is_commit_file)
    rescuer.recover()
    stats = rescuer.statistics()
    assert (stats.pending, stats.active) == (1, 0)
    assert rescuer.get(job.id).attempts == 1


def test_a_retry_that_died_after_publishing_is_not_run_again_once_its_new_copy_ran_and_was_removed(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its ``.commit`` outlives the copy it published: another worker ran that copy, and a
    retention of 0 removed it. The ``.commit`` must not be taken for the job's only copy (the
    GlusterFS chaos with retention committed jobs twice this way)."""
    worker, rescuer = pair
    job = worker.create("x", retain=0)
    first = worker.pull_work()
    assert first is not None
    crash(monkeypatch, _fsops, "unlink_quietly", _is_commit_file)
    with pytest.raises(Crash):
        first.fail("boom")
    monkeypatch.undo()
    lease = rescuer.pull_work()  # the worker is not seen dead yet: its ".commit" stays
    assert lease is not None and lease.id == job.id
    lease.fulfill("done")
    assert names(rescuer, "jobs/fulfilled") == []  # kept 0 s: removed by its commit
    die(worker)
    assert rescuer.recover().requeued == 0
    assert rescuer.pull_work() is None and names(rescuer, "jobs/active") == [] and names(rescuer, "tmp") == []


def test_a_take_over_that_died_after_requeueing_is_not_requeued_again_once_the_job_ran_and_was_removed(
    open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, recoverer, rescuer = (open_store(backoff=lambda a: 0.0) for _ in range(3))
    job = worker.create("x", retain=0)
    requeue_and_crash_before_the_drop(worker, recoverer, monkeypatch)
    die(recoverer)
    lease = rescuer.pull_work()
    assert lease is not None and lease.id == job.id and lease.attempt == 2
    lease.fulfill("done")
    assert rescuer.recover().requeued == 0
    assert rescuer.pull_work() is None and names(rescuer, "jobs/active") == []


def test_a_claim_beside_a_spent_commit_fence_is_taken_over_as_the_jobs_only_copy(
    open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recoverer requeued a job and died before dropping its ``.commit``; a worker claimed the
    requeued copy and died too. Taking the worker's claim over, the spent ``.commit`` is no
    other copy: dropping the claim for it lost the job once the ``.commit`` was dropped in turn
    (a chaos run of the worker runtime in CI)."""
    worker, recoverer, claimer, rescuer = (open_store(backoff=lambda a: 0.0) for _ in range(4))
    job = worker.create("x")
    requeue_and_crash_before_the_drop(worker, recoverer, monkeypatch)
    lease = claimer.pull_work()  # the recoverer is alive still: its spent ".commit" stays
    assert lease is not None and lease.id == job.id
    die(claimer)
    die(recoverer)
    real_scan = _fsops.scan_names

    def claims_first(path: str) -> list[str]:  # the order that lost the job
        return sorted(real_scan(path), key=lambda n: not n.endswith(".json"))

    monkeypatch.setattr(_fsops, "scan_names", claims_first)
    rescuer.recover()
    monkeypatch.undo()
    assert rescuer.get(job.id).state is JobState.PENDING
    assert rescuer.statistics().pending == 1 and names(rescuer, "jobs/active") == []


def test_a_take_over_that_died_finishing_a_commit_leaves_what_the_next_finishes(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recoverer renames the dead committer's ``.commit`` to its own ``.recover``, then back
    to a ``.commit`` of the committer's token before it publishes the committer's temp file: a
    crash of the recoverer between the two leaves the temp file to publish, after, a fence to drop."""
    worker, rescuer = pair
    job = worker.create("x")
    commit_and_die(worker, monkeypatch, lambda lease: lease.fail("boom"), _tree.Tree, "publish")
    third = JobStore(rescuer.path, backoff=lambda a: 0.0)
    crash(monkeypatch, _tree.Tree, "publish")
    with pytest.raises(Crash):
        third.recover()
    monkeypatch.undo()
    die(third)
    assert [n.rsplit(".", 1)[1] for n in names(rescuer, "jobs/active")] == ["commit"]
    report = rescuer.recover()
    assert report.commits_finished == 1 and report.requeued == 0
    got = rescuer.get(job.id)
    assert got.state is JobState.PENDING and got.attempts == 1 and got.error == "boom"
    assert names(rescuer, "jobs/active") == [] and names(rescuer, "tmp") == []


def test_temp_files_of_dead_owners_go_and_those_of_live_owners_stay(pair: tuple[JobStore, JobStore]) -> None:
    live, other = pair
    dead = JobStore(live.path)
    for s in (live, dead):
        _fsops.write_new(temp_path(s, "new", "abc.json"), b"partial", durable=False)
    die(dead)
    report = other.recover()
    assert report.temp_files_removed == 1
    assert len(names(other, "tmp")) == 1 and names(other, "tmp")[0].startswith(owner(live).owner)
    assert report.locks_removed == 1  # the dead owner's liveness file


def test_a_create_with_an_id_that_died_after_reserving_it_is_published(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, rescuer = pair
    crash(monkeypatch, _tree.Tree, "publish")
    crash(monkeypatch, _fsops, "unlink")  # so that no clean-up runs either
    with pytest.raises(Crash):
        producer.create({"n": 1}, job_id="invoice-9")
    monkeypatch.undo()
    die(producer)
    report = rescuer.recover()
    assert report.creates_finished == 1
    assert rescuer.get("invoice-9").request == {"n": 1}


def test_a_create_with_an_id_published_by_another_recoverer_meanwhile_keeps_its_reservation(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two recoverers finish one interrupted create at once: the second sees the job published
    under its new name, which is the same file as its temp file, not a copy with that id."""
    producer, rescuer = pair
    crash(monkeypatch, _tree.Tree, "publish")
    crash(monkeypatch, _fsops, "unlink")
    with pytest.raises(Crash):
        producer.create({"n": 1}, job_id="invoice-9")
    monkeypatch.undo()
    die(producer)
    real_read, real_publish = _tree.Tree.read_record, _tree.Tree.publish

    def read_then_lose_the_race(tree: _tree.Tree, path: str) -> Any:
        record = real_read(tree, path)
        if os.sep + "tmp" + os.sep in path:
            real_publish(tree, path, record, "pending")  # the other recoverer, a moment ahead
        return record

    monkeypatch.setattr(_tree.Tree, "read_record", read_then_lose_the_race)
    rescuer.recover()
    monkeypatch.undo()
    assert rescuer.get("invoice-9").request == {"n": 1}
    with pytest.raises(JobExists):
        rescuer.create({"n": 2}, job_id="invoice-9")
    assert rescuer.statistics().pending == 1


def test_a_create_whose_publish_fails_gives_its_id_back(pair: tuple[JobStore, JobStore],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    producer, _ = pair
    monkeypatch.setattr(_tree.Tree, "publish", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(OSError):
        producer.create({"n": 1}, job_id="invoice-11")
    monkeypatch.undo()
    assert names(producer, "tmp") == [] and names(producer, "ids") == []
    producer.create({"n": 2}, job_id="invoice-11")
    assert producer.get("invoice-11").request == {"n": 2}


def test_a_create_that_died_before_reserving_its_id_leaves_nothing(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, rescuer = pair
    crash(monkeypatch, _fsops, "link_into")
    with pytest.raises(Crash):
        producer.create({"n": 1}, job_id="invoice-10")
    monkeypatch.undo()
    die(producer)
    rescuer.recover()
    assert names(rescuer, "tmp") == []
    rescuer.create({"n": 2}, job_id="invoice-10")  # the id was never spent
    assert rescuer.get("invoice-10").request == {"n": 2}


def test_a_late_commit_after_a_take_over_raises_lease_lost_and_leaves_no_trace(pair: tuple[JobStore, JobStore]) -> None:
    worker, rescuer = pair
    job = worker.create("x")
    lease = worker.pull_work()
    assert lease is not None
    owner = owner_or_none(worker)
    assert owner is not None
    hidden = os.path.join(os.path.dirname(worker.path), "hidden-owner")
    os.rename(owner.path, hidden)  # observers now see no liveness file: dead
    assert rescuer.recover().requeued == 1
    os.rename(hidden, owner.path)
    before = sorted(os.listdir(os.path.join(worker.path, "tmp")))
    with pytest.raises(LeaseLost):
        lease.fulfill(b"late")
    assert sorted(os.listdir(os.path.join(worker.path, "tmp"))) == before
    assert lease.compromised is not None
    assert rescuer.get(job.id).state is JobState.PENDING


def test_a_late_commit_whose_result_a_take_over_published_and_retention_removed_leaves_no_index_entry(
    pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder appended its result and stalled; a take-over published that result with its
    finished-index entry and retention removed the job (kept 0 s). The holder's commit then made
    the entry again before its rename failed: a stale entry naming no job (CI's chaos run at f45d24e)."""
    worker, rescuer = pair
    job = worker.create("x", retain=0)
    lease = worker.pull_work()
    assert lease is not None
    owner = owner_or_none(worker)
    assert owner is not None
    hidden = os.path.join(os.path.dirname(worker.path), "hidden-owner")
    real_index = _tree.Tree.index_final
    stalled: list[bool] = []

    def stalled_here(tree: _tree.Tree, *args: Any) -> bool:
        if not stalled:  # the holder's own call, after its append: it stalls here
            stalled.append(True)
            os.rename(owner.path, hidden)  # and looks dead
            assert rescuer.recover().removed == 1  # its result published, then removed
            os.rename(hidden, owner.path)
        return real_index(tree, *args)

    monkeypatch.setattr(_tree.Tree, "index_final", stalled_here)
    with pytest.raises(LeaseLost):
        lease.fulfill("done")
    monkeypatch.undo()
    with pytest.raises(JobNotFound):
        rescuer.get(job.id)
    entries = [n for b in names(rescuer, "finished") for n in names(rescuer, f"finished/{b}")]
    assert entries == []


def test_the_heartbeat_tells_a_holder_its_job_was_taken(open_store: Callable[..., JobStore]) -> None:
    worker = open_store(lease_duration=0.8, heartbeat_interval=0.05)
    rescuer = open_store()
    worker.create("x")
    fired = threading.Event()
    reasons: list[str] = []
    lease = worker.pull_work(on_compromised=lambda exc: (reasons.append(exc.reason), fired.set()))
    assert lease is not None
    owner = owner_or_none(worker)
    assert owner is not None
    hidden = os.path.join(os.path.dirname(worker.path), "hidden-owner")
    os.rename(owner.path, hidden)
    rescuer.recover()
    os.rename(hidden, owner.path)
    assert fired.wait(10)
    assert reasons == ["taken-over"]


def test_concurrent_recoveries_repair_each_thing_once(open_store: Callable[..., JobStore]) -> None:
    workers = [open_store() for _ in range(3)]
    ids = [workers[0].create(i).id for i in range(30)]
    for w in workers:
        for _ in range(10):
            assert w.pull_work() is not None
    for w in workers:  # no worker may recover another's jobs once the first one "dies"
        freeze(w)
    for w in workers:
        die(w)
    rescuers = [open_store() for _ in range(4)]
    reports: list[int] = []
    threads = [threading.Thread(target=lambda r=r: reports.append(r.recover().requeued)) for r in rescuers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(reports) == 30
    assert rescuers[0].statistics().pending == 30
    assert all(rescuers[0].get(i).attempts == 1 for i in ids)
    assert rescuers[0].recover().requeued == 0  # idempotent


def test_jobs_out_of_attempts_fail_when_their_worker_dies(pair: tuple[JobStore, JobStore]) -> None:
    worker, rescuer = pair
    job = worker.create("x", max_attempts=1)
    assert worker.pull_work() is not None
    die(worker)
    assert rescuer.recover().failed == 1
    got = rescuer.get(job.id)
    assert got.state is JobState.FAILED and "exited" in (got.error or "")


def test_a_planted_file_named_like_a_copy_does_not_make_recovery_drop_the_job(pair: tuple[JobStore, JobStore]) -> None:
    worker, rescuer = pair
    job = worker.create("x")
    bucket = os.path.dirname(pending_file(worker.path, job.id))
    assert worker.pull_work() is not None
    die(worker)
    os.makedirs(bucket, exist_ok=True)  # where the job was queued (an emptied bucket may be gone)
    junk = os.path.join(bucket, f"junk.{job.id}.json")
    with open(junk, "w") as fh:
        fh.write("not a job")
    report = rescuer.recover()
    assert report.requeued == 1 and report.duplicates_dropped == 0
    lease = rescuer.pull_work()
    assert lease is not None and lease.id == job.id


def test_a_process_starting_while_another_makes_the_boot_pass_skips_it_and_a_pass_cut_short_is_made_again(
        tmp_path: Any) -> None:
    """Workers started together make one deep pass, not one each: the one making it holds
    control/boot.lock, and marks the boot only when done, so a pass whose process went away
    first is made by the next one."""
    root = str(tmp_path / "fast")
    with JobStore(root, durable=False) as store:
        for i in range(5):
            store.create({"i": i})
    qdir = os.path.join(root, "jobs", "pending", "default")
    control = os.path.join(root, "control")
    sizes_read = [0]

    class Watch:
        def before(self, op: str, args: tuple[Any, ...]) -> None:
            # A job file's size (the pass also stats the queue's buckets: directories, not jobs)
            if op == "stat" and isinstance(args[0], str) and args[0].startswith(qdir + os.sep) \
                    and args[0].endswith(".json"):
                sizes_read[0] += 1

        def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
            pass

    def markers() -> list[str]:
        return [n for n in os.listdir(control) if n.startswith("boot-")]

    def settle(store: JobStore) -> None:
        """The pass runs in the retention thread, beside the first pull: give it its time."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not markers():
            time.sleep(0.05)

    for name in markers():
        os.unlink(os.path.join(control, name))  # as after a reboot (the store was made this boot)
    sweeper = os.open(os.path.join(control, "boot.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(sweeper, fcntl.LOCK_EX)  # another process is making this boot's pass
    _syscalls.set_hook(Watch())
    try:
        with JobStore(root) as second:
            assert second.pull_work(queues=["elsewhere"]) is None
            settle(second)
        assert sizes_read[0] == 0 and markers() == []  # skipped, and not marked
        os.close(sweeper)  # that process exited before it finished
        with JobStore(root) as third:
            assert third.pull_work(queues=["elsewhere"]) is None
            settle(third)
        assert sizes_read[0] == 5 and markers() != []  # made again, and marked once done
        with JobStore(root) as fourth:
            assert fourth.pull_work(queues=["elsewhere"]) is None
            time.sleep(0.5)
        assert sizes_read[0] == 5  # once per boot
    finally:
        _syscalls.set_hook(None)


def test_the_first_puller_after_a_boot_looks_for_jobs_a_power_cut_emptied_once(tmp_path: Any) -> None:
    root = str(tmp_path / "fast")

    def empty_one(store: JobStore) -> None:
        job = store.create({"n": 1})
        open(pending_file(store.path, job.id), "wb").close()  # what a power cut leaves with durable=False

    def reasons() -> list[str]:
        qdir = os.path.join(root, "quarantine")
        return sorted(open(os.path.join(qdir, n)).read() for n in os.listdir(qdir) if n.endswith(".reason"))

    def boots() -> list[str]:
        return [n for n in os.listdir(os.path.join(root, "control")) if n.startswith("boot-")]

    with JobStore(root, durable=False) as store:
        empty_one(store)
    for name in boots():
        os.unlink(os.path.join(root, "control", name))  # as after a reboot (the store was made this boot)
    with JobStore(root) as first:
        assert first.pull_work(queues=["elsewhere"]) is None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not boots():
            time.sleep(0.05)  # the pass runs in the retention thread, beside the first pull
    assert len(reasons()) == 1 and '"reason":"job file is empty:' in reasons()[0]
    assert [n for n in os.listdir(os.path.join(root, "control")) if n.startswith("boot-")]
    with JobStore(root) as store:
        empty_one(store)
    with JobStore(root) as second:
        assert second.pull_work() is None  # no second sweep this boot: the claim itself tripped on it
    assert len(reasons()) == 2 and any('"reason":"claimed job file is empty:' in r for r in reasons())
    with JobStore(root) as explicit:
        empty_one(explicit)
        assert explicit.recover().lost_to_power_loss == 1  # an explicit recover() always looks
    with JobStore(root, durable=True) as careful:  # this process fsyncs; the store does not promise it
        empty_one(careful)
        assert careful.recover().lost_to_power_loss == 1


def test_the_deep_pass_takes_only_job_files_for_jobs_a_power_cut_emptied(tmp_path: Any) -> None:
    """A queue's ".changed" marker is empty by design, and an empty name of no job's grammar
    was planted: neither is a job, lost or not. A job file emptied beside them still is."""
    with JobStore(str(tmp_path / "fast"), durable=False) as store:
        kept = store.create({"n": 1})
        emptied = store.create({"n": 2})
        open(pending_file(store.path, emptied.id), "wb").close()  # what a power cut leaves
        queue = os.path.dirname(os.path.dirname(pending_file(store.path, kept.id)))
        planted = [os.path.join(queue, ".changed"),  # the marker the store sets itself (FORMAT.md)
                   os.path.join(os.path.dirname(pending_file(store.path, kept.id)), "notes.txt"),
                   os.path.join(store.path, "jobs", "scheduled", "notes.json"),
                   os.path.join(store.path, "jobs", "fulfilled", "not.a.job.json")]
        for path in planted:
            open(path, "wb").close()
        report = store.recover()
        assert (report.lost_to_power_loss, report.lost_ids, report.quarantined) == (1, (emptied.id,), 1)
        assert all(os.path.exists(path) for path in planted)
        lease = store.pull_work()
        assert lease is not None and lease.id == kept.id


def test_a_holder_hears_of_a_hung_heartbeat_while_it_is_still_hung(open_store: Callable[..., JobStore],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat thread blocked inside a hung mount cannot tell anyone; the watchdog, which
    never touches the filesystem, must, within about 0.75 lease of the last beat that landed."""
    from fsjobstore._core import _liveness

    worker = open_store(lease_duration=1.0, heartbeat_interval=0.1)
    worker.create("x")
    told: list[tuple[str, float]] = []
    lease = worker.pull_work(on_compromised=lambda exc: told.append((exc.reason, time.monotonic())))
    assert lease is not None
    hung = threading.Event()
    real_beat = _liveness.OwnerLease.beat

    def hang(self: _liveness.OwnerLease) -> None:
        hung.wait(30)  # as if the mount stopped answering
        real_beat(self)

    monkeypatch.setattr(_liveness.OwnerLease, "beat", hang)
    started = time.monotonic()
    deadline = started + 10
    while not told and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert told and told[0][0] == "stalled"
        assert told[0][1] - started < 1.5  # about 0.75 s after the last beat, not when the mount returns
        assert not hung.is_set()
    finally:
        hung.set()


def test_a_recovery_pass_longer_than_a_lease_does_not_cost_the_process_its_claims(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass can take long (hundreds of waiting parents on a network filesystem took minutes):
    beats go on meanwhile, so the holder neither hears it stalled nor loses its claim."""
    from fsjobstore._store import _background

    worker = open_store(lease_duration=1.0, heartbeat_interval=0.1)
    worker.create("x")
    told: list[str] = []
    lease = worker.pull_work(on_compromised=lambda exc: told.append(exc.reason))
    assert lease is not None
    slow = threading.Event()
    real_recover = _background.recover

    def long_pass(*args: Any, **kwargs: Any) -> Any:
        if not slow.is_set():
            slow.set()
            time.sleep(2.0)  # two leases
        return real_recover(*args, **kwargs)

    monkeypatch.setattr(_background, "recover", long_pass)
    assert slow.wait(5)  # the next periodic pass began, and lasts
    time.sleep(2.2)
    lease.fulfill("done")
    assert told == []
    assert worker.get(lease.id).state is JobState.FULFILLED


def test_a_producer_in_a_heartbeat_only_store_beats_so_others_never_judge_it_gone(tmp_path: Any) -> None:
    root = str(tmp_path / "s")
    settings: dict[str, Any] = {"lock_takeover": False, "lease_duration": 1.0, "heartbeat_interval": 0.2}
    with JobStore(root, **settings) as producer, JobStore(root, **settings) as observer:
        producer.create({"n": 1})  # never pulls
        me = owner(producer)
        observer.pull_work(queues="elsewhere")  # a long-lived observer, judging expiry every half lease
        first = Path(me.path).read_bytes()
        time.sleep(2.5)  # more than two leases
        observer.recover()
        assert os.path.exists(me.path) and Path(me.path).read_bytes() != first  # it beat, and is alive to others
        assert owner(producer) is me
        producer.create({"n": 2})
        assert observer.statistics().pending == 2


def test_a_result_line_a_power_cut_lost_is_never_read_as_a_result_even_after_a_retry(tmp_path: Any) -> None:
    from fsjobstore import CorruptJob

    with JobStore(str(tmp_path / "s"), durable=False, backoff=lambda n: 0.0) as store:
        job = store.create({"n": 1})
        lease = store.pull_work()
        assert lease is not None
        lease.fail("first try")  # retried: the record line now names this claim (committed_by)
        lease = store.pull_work()
        assert lease is not None
        lease.fulfill({"answer": 42})
        path = os.path.join(store.path, "jobs", "fulfilled", f"{job.id}.json")
        first_line = Path(path).read_bytes().split(b"\n")[0] + b"\n"
        Path(path).write_bytes(first_line)  # the rename reached the disk, the appended line did not
        with pytest.raises(CorruptJob, match="holds no result"):
            store.get(job.id)  # not "fulfilled" with a null value


def result_back_in_queue(path: str, value: Any, *, durable: bool = True, target: str | None = None) -> str:
    """Make the state a power cut can leave (nothing fsyncs a claim): a job fulfilled with
    ``value`` whose commit's and claim's renames were undone, so its file is back in its queue
    with the result line appended. Returns the job's id."""
    with JobStore(path, durable=durable) as store:
        job = store.create({"n": 1})
        if target is not None:
            store.queue(job.id, target)
        queued = pending_file(path, job.id)
        lease = store.pull_work()
        assert lease is not None
        lease.fulfill(value)
        os.makedirs(os.path.dirname(queued), exist_ok=True)  # its bucket, if a claimer removed it
        os.rename(os.path.join(path, "jobs", "fulfilled", f"{job.id}.json"), queued)
        if target is not None:
            os.unlink(os.path.join(path, "jobs", "notify", f"{job.id}.json"))
    return job.id


@pytest.mark.parametrize("durable", [True, False])
def test_a_queued_file_that_already_holds_its_result_is_published_when_claimed_not_run_again(
    tmp_path: Any, durable: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # What a power cut can leave: the result line reached the disk, the renames of the claim
    # and of the commit did not, so the file is back in the queue with its result appended.
    caplog.set_level(logging.WARNING, logger="fsjobstore")
    path = str(tmp_path / "s")
    job_id = result_back_in_queue(path, {"answer": 42}, durable=durable, target="target")
    with JobStore(path) as store:  # the next boot
        later = store.create({"n": 2})
        lease = store.pull_work()
        assert lease is not None and lease.id == later.id  # the finished job is not handed out again
        got = store.get(job_id)
        assert got.state is JobState.FULFILLED and got.value == {"answer": 42} and got.attempts == 1
        assert names(store, "quarantine") == []
        note = store.pull_notification()
        assert note is not None and note.id == job_id  # its target still hears of it
        assert "power cut" in caplog.text


def test_a_fault_publishing_a_found_result_does_not_fail_the_pull_and_recovery_finishes_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from fsjobstore import StorageError

    path = str(tmp_path / "s")
    job_id = result_back_in_queue(path, "done")
    worker = JobStore(path)

    def eio(*args: Any) -> str:
        raise StorageError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_tree.Tree, "publish_found_result", eio)
    assert worker.pull_work() is None  # no exception, and the job is not run again
    monkeypatch.undo()
    assert len(names(worker, "jobs/active")) == 1
    die(worker)
    with JobStore(path) as rescuer:
        assert rescuer.recover().commits_finished == 1
        got = rescuer.get(job_id)
        assert got.state is JobState.FULFILLED and got.value == "done"


def test_cancelling_a_queued_job_that_already_holds_its_result_says_it_is_final_not_corrupt(tmp_path: Any) -> None:
    from fsjobstore import InvalidState

    path = str(tmp_path / "s")
    job_id = result_back_in_queue(path, "done")
    with JobStore(path) as store:
        with pytest.raises(InvalidState, match="already fulfilled"):
            store.cancel(job_id)
        got = store.get(job_id)
        assert got.state is JobState.FULFILLED and got.value == "done"
        assert names(store, "quarantine") == []


# == what a take-over says (issue 19, item 6) ======================================================
def _takeover_logs(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if "taking" in r.getMessage()]


def test_a_killed_attempt_past_its_deadline_reads_as_the_same_time_out_as_in_threads_mode(
        open_store: Callable[..., JobStore], caplog: pytest.LogCaptureFixture) -> None:
    wall = FakeWall()
    threads = open_store(wall_clock=wall, backoff=lambda attempt: 0.0)
    job = threads.create(1, timeout=5, queue="threads")
    lease = threads.pull_work(queues="threads")
    assert lease is not None and lease.time_out()  # what the thread runtime does at the deadline
    told_by_threads = threads.get(job.id).error

    worker, rescuer = open_store(wall_clock=wall), open_store(wall_clock=wall)
    job = worker.create(1, timeout=5, queue="processes")
    assert worker.pull_work(queues="processes") is not None
    wall.advance(6)  # past the limit: the process runtime's supervisor SIGKILLs the child
    die(worker)
    with caplog.at_level(logging.INFO, logger="fsjobstore"):
        report = rescuer.recover()
    assert (report.requeued, report.timed_out) == (1, 1)
    got = rescuer.get(job.id)
    assert got.error == told_by_threads == "TimeLimitExceeded: attempt 1 ran past its limit of 5 s"
    [(level, message)] = _takeover_logs(caplog)
    assert level == logging.INFO and f"job {job.id} ran past its time limit" in message


def test_a_cancelled_attempt_taken_over_says_it_was_cancelled_at_info(
        open_store: Callable[..., JobStore], caplog: pytest.LogCaptureFixture) -> None:
    worker, rescuer = open_store(), open_store()
    job = worker.create(1)
    assert worker.pull_work() is not None
    assert rescuer.cancel(job.id, "no longer needed").state is JobState.ACTIVE  # asked of a live holder
    die(worker)  # the process runtime kills the child running a cancelled job
    with caplog.at_level(logging.INFO, logger="fsjobstore"):
        assert rescuer.recover().cancelled == 1
    assert rescuer.get(job.id).error == "cancelled: no longer needed"
    [(level, message)] = _takeover_logs(caplog)
    assert level == logging.INFO and f"job {job.id} was cancelled" in message
    assert "its process exited" in message  # what became of the holder, as a detail


def test_a_crashed_holder_still_reads_as_a_crash_at_warning(
        open_store: Callable[..., JobStore], caplog: pytest.LogCaptureFixture) -> None:
    worker, rescuer = open_store(), open_store()
    job = worker.create(1, timeout=60)
    assert worker.pull_work() is not None
    die(worker)  # long before its deadline
    with caplog.at_level(logging.INFO, logger="fsjobstore"):
        assert rescuer.recover().timed_out == 0
    assert rescuer.get(job.id).error == "attempt 1 lost: its process exited"
    [(level, message)] = _takeover_logs(caplog)
    assert level == logging.WARNING and message.endswith("its process exited")


def _reasons(store: JobStore) -> dict[str, str]:
    """What each file moved aside was, by the job id its name carries: the reason noted for it."""
    qdir = os.path.join(store.path, "quarantine")
    out = {}
    for name in os.listdir(qdir):
        if name.endswith(".reason"):
            with open(os.path.join(qdir, name)) as fh:
                doc = json.load(fh)
            out[doc["from"].rsplit("/", 1)[1].split(".")[0]] = doc["reason"]
    return out


@pytest.mark.parametrize("durable", [True, False])
def test_a_quarantined_job_file_says_what_was_wrong_with_it_and_only_a_cut_one_is_lost(
        tmp_path: Path, durable: bool) -> None:
    """Bad JSON is said as the parser says it, never as a power cut; an empty or cut-short file is
    lost to a power cut in a store that does not fsync, and said as what it may be in one that does."""
    with JobStore(str(tmp_path / "s"), durable=durable) as store:
        dead = "0123456789abcdef-1"  # an owner with no liveness file: gone
        active = os.path.join(store.path, "jobs", "active")
        for job_id, content in (("badjson", b"{nope"), ("cut", b'{"format":2,"id":"cut","queue":"def'),
                                ("empty", b"")):
            Path(active, f"{job_id}.{dead}.json").write_bytes(content)
        report = store.recover()
        reasons = _reasons(store)
        assert report.quarantined == 3 and set(reasons) == {"badjson", "cut", "empty"}
        assert reasons["badjson"].startswith("active job file invalid JSON: Expecting property name")
        assert "power cut" not in reasons["badjson"]
        assert reasons["cut"].startswith("active job file stops inside its first line: ")
        assert reasons["empty"].startswith("active job file is empty: ")
        for job_id in ("cut", "empty"):
            assert ("durable=False" in reasons[job_id]) is not durable
            assert ("fsyncs every job file" in reasons[job_id]) is durable
        assert sorted(report.lost_ids) == ([] if durable else ["cut", "empty"])
        assert report.lost_to_power_loss == (0 if durable else 2)


def test_recovery_counts_every_file_it_quarantines_whichever_step_moved_it(store: JobStore) -> None:
    parent = store.create("parent")
    child = store.create("child", after=[parent.id])
    deferred = os.path.join(store.path, "jobs", "deferred")
    [name] = os.listdir(deferred)
    Path(deferred, name).write_bytes(b"{nope")
    os.unlink(pending_file(store.path, parent.id))  # its parent gone: the sweep of waiting jobs reads it
    Path(store.path, "jobs", "active", "junk").write_bytes(b"x")  # met by the sweep of claims
    report = store.recover()
    moved = [n for n in os.listdir(os.path.join(store.path, "quarantine")) if not n.endswith(".reason")]
    assert report.quarantined == len(moved) == 2
    assert sorted(n.split("~")[-1] for n in moved) == sorted(["junk", name])
    assert child.id in name


def test_a_ctrl_c_during_a_first_pull_leaves_the_next_pull_to_start_the_background_threads(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt in the first pull's recovery pass (a REPL user's Ctrl-C) must not
    leave the store pulling with none of its threads: no beats, no lease checks, no periodic
    recovery, no retention. Seen here by retention: a job kept for 0.2 s goes."""
    from fsjobstore._store import _background

    worker = open_store()
    real_recover = _background.recover
    interrupted = False

    def ctrl_c_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            raise KeyboardInterrupt
        return real_recover(*args, **kwargs)

    monkeypatch.setattr(_background, "recover", ctrl_c_once)
    with pytest.raises(KeyboardInterrupt):
        worker.pull_work()
    worker.create("x", retain=0.2)
    lease = worker.pull_work()
    assert lease is not None
    lease.fulfill("done")
    deadline = time.monotonic() + 10
    while list(worker.jobs(state="fulfilled")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(worker.jobs(state="fulfilled")) == []  # before: it stayed, with no retention thread to remove it


def test_a_pull_waiting_for_another_threads_first_pass_goes_on_when_that_pass_is_cut_short(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread making the first pass is interrupted: a pull waiting for it makes the pass
    itself at once, rather than waiting for a pass nobody makes any more."""
    from fsjobstore._store import _background

    store = open_store()
    store.create("x")
    real_recover = _background.recover
    inside, go_on = threading.Event(), threading.Event()
    calls = 0

    def first_pass_cut_short(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            inside.set()
            go_on.wait(10)
            raise KeyboardInterrupt  # as a Ctrl-C would, in the thread making the pass
        return real_recover(*args, **kwargs)

    monkeypatch.setattr(_background, "recover", first_pass_cut_short)
    cut: list[BaseException] = []

    def first() -> None:
        try:
            store.pull_work()
        except KeyboardInterrupt as exc:
            cut.append(exc)

    maker = threading.Thread(target=first)
    maker.start()
    assert inside.wait(10)
    got: list[WorkLease | None] = []
    waiter = threading.Thread(target=lambda: got.append(store.pull_work()))
    waiter.start()
    time.sleep(0.2)  # the waiter waits for the maker's pass
    go_on.set()
    maker.join(10)
    waiter.join(10)  # before: it waited 60 s for the pass the maker never finished
    assert not waiter.is_alive() and len(cut) == 1
    assert calls == 2 and got and got[0] is not None
    got[0].fulfill("done")


def test_a_take_over_of_a_hung_recoverer_before_its_commit_does_not_lose_the_job_when_it_wakes(
        open_store: Callable[..., JobStore]) -> None:
    """Recoverer H takes a dead worker's claim over, writes the job's next version to its temp
    file, and hangs (SIGSTOP) before the rename to ``.commit``. T takes H's ``.recover`` entry
    over. H wakes, finds its entry gone, and removes its temp file, which was never committed.
    T must not have counted on that file: finishing from it, T lost the job (the worker
    runtime's chaos, both children of one stopped worker resuming at once)."""
    worker = open_store(lease_duration=0.5, heartbeat_interval=0.1)
    job = worker.create("x")
    assert worker.pull_work() is not None
    die(worker)
    hung = open_store(lease_duration=0.5, heartbeat_interval=0.1)
    taker = open_store(lease_duration=0.5, heartbeat_interval=0.1)
    h_paused, h_go, t_paused, t_go = (threading.Event() for _ in range(4))
    threads: dict[str, threading.Thread] = {}
    h_temp: list[str] = []

    class Hook:
        def before(self, op: str, args: tuple[Any, ...]) -> None:
            me = threading.current_thread()
            if me is threads.get("h") and op == "rename" and str(args[0]).endswith(".recover") \
                    and str(args[1]).endswith(".commit"):
                h_temp.extend(os.path.join(hung.path, "tmp", n) for n in os.listdir(os.path.join(hung.path, "tmp"))
                              if ".commit." in n)
                h_paused.set()
                assert h_go.wait(10)
            elif me is threads.get("t") and h_temp and op in ("rename", "link") and args[0] == h_temp[0]:
                t_paused.set()  # about to publish H's temp file
                assert t_go.wait(10)

        def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
            pass

    _syscalls.set_hook(Hook())
    try:
        threads["h"] = threading.Thread(target=hung.recover)
        threads["h"].start()
        assert h_paused.wait(10) and len(h_temp) == 1
        assert taker.recover().requeued == 0  # T sees H's owner file for the first time: alive
        time.sleep(1.0)  # two leases without a beat of H's: T judges it hung next time
        threads["t"] = threading.Thread(target=taker.recover)
        threads["t"].start()
        t_paused.wait(5)  # only a taker that uses H's temp file stops here
        h_go.set()  # H wakes: its rename fails, and it removes its temp file
        threads["h"].join(10)
        t_go.set()
        threads["t"].join(10)
    finally:
        _syscalls.set_hook(None)
    assert not threads["h"].is_alive() and not threads["t"].is_alive()
    got = taker.get(job.id)  # before: JobNotFound, its only copy dropped
    assert got.state is JobState.PENDING and got.attempts == 1
    assert taker.pull_work() is not None


def test_a_ctrl_c_while_a_first_pull_starts_the_threads_leaves_them_all_running_and_the_next_pull_goes_on(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGINT that lands between two threads' starts (0.5-3 ms into a REPL's first pull: 4 of 10
    tries in a user's trial) left the next pull waiting for ever for a recovery thread that was
    never started. The Ctrl-C now comes once every thread runs."""
    import signal

    store = open_store()
    store.create("x")
    real_thread = threading.Thread

    class CtrlCAfterTheWatchdog(real_thread):  # type: ignore[misc,valid-type]
        def start(self) -> None:
            super().start()
            if self.name.startswith("fsjobstore-watchdog"):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):  # the handler runs at the next check: here, mid-start
                    pass

    monkeypatch.setattr(threading, "Thread", CtrlCAfterTheWatchdog)
    with pytest.raises(KeyboardInterrupt):
        store.pull_work()
    monkeypatch.setattr(threading, "Thread", real_thread)
    got: list[WorkLease | None] = []
    puller = threading.Thread(target=lambda: got.append(store.pull_work(timeout=1)), daemon=True)
    puller.start()
    puller.join(10)
    assert not puller.is_alive()  # before: it waited for ever
    assert got and got[0] is not None
    names = {t.name.rsplit("-", 1)[0] for t in threading.enumerate()}
    assert {"fsjobstore-heartbeat", "fsjobstore-watchdog", "fsjobstore-recovery", "fsjobstore-retention"} <= names
    got[0].fulfill("done")


def _a_dead_holders_claim(pair: tuple[JobStore, JobStore]) -> tuple[JobStore, str]:
    """The first store claims a job and dies; the second (to recover) and the job's id."""
    worker, rescuer = pair
    job = worker.create("x")
    assert worker.pull_work() is not None
    die(worker)
    return rescuer, job.id


def _failing_with(code: int) -> Callable[..., int]:
    from fsjobstore import StorageError

    def step(*_: object, **__: object) -> int:
        raise StorageError(code, os.strerror(code), "tmp")
    return step


def test_a_fault_in_one_recovery_step_keeps_no_other_step_from_its_work_and_the_pass_raises_it(
        pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # As on a network filesystem while a brick heals: one file answers ESTALE.
    from fsjobstore import StorageError
    from fsjobstore._transitions import _recovery

    rescuer, job_id = _a_dead_holders_claim(pair)
    monkeypatch.setattr(_recovery, "finish_unfinished", _failing_with(errno.ESTALE))  # the pass's second step
    monkeypatch.setattr(_recovery, "_sweep_bells", _failing_with(errno.EIO))
    with caplog.at_level(logging.WARNING, logger="fsjobstore"), pytest.raises(StorageError, match=r"(?i)stale"):
        rescuer.recover()
    assert rescuer.get(job_id).state is JobState.PENDING  # the dead holder's claim was taken all the same
    assert "the bells step failed too" in caplog.text
    monkeypatch.undo()
    assert rescuer.recover().requeued == 0  # and a pass with no fault raises nothing


def test_a_fault_on_one_dead_holders_claim_keeps_the_pass_from_no_other_claim_and_the_next_pass_takes_it(
        pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a network filesystem while a brick heals: one claimed file answers EIO for a while.
    from fsjobstore import StorageError
    from fsjobstore._transitions import _recovery

    worker, rescuer = pair
    ids = [worker.create(f"x{i}").id for i in range(3)]
    assert all(worker.pull_work() is not None for _ in ids)
    die(worker)
    real, faults = _recovery.take_over, []

    def the_first_meets_eio(*args: object, **kwargs: object) -> None:
        if not faults:
            faults.append(args[5])  # the job's id
            raise StorageError(errno.EIO, os.strerror(errno.EIO), "active")
        real(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(_recovery, "take_over", the_first_meets_eio)
    with pytest.raises(StorageError, match=r"(?i)input/output"):
        rescuer.recover()
    states = {job_id: rescuer.get(job_id).state for job_id in ids}
    assert states == {job_id: JobState.ACTIVE if job_id == faults[0] else JobState.PENDING for job_id in ids}
    monkeypatch.undo()
    assert rescuer.recover().requeued == 1
    assert {rescuer.get(job_id).state for job_id in ids} == {JobState.PENDING}


@pytest.mark.parametrize("code", [errno.ENOTCONN, errno.ECONNABORTED], ids=["ENOTCONN", "ECONNABORTED"])
def test_a_recovery_pass_that_meets_a_lost_mount_ends_there(
        pair: tuple[JobStore, JobStore], monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    # A dead FUSE client answers either: every later step would fail the same way.
    from fsjobstore import StorageError
    from fsjobstore._transitions import _recovery

    rescuer, job_id = _a_dead_holders_claim(pair)
    monkeypatch.setattr(_recovery, "finish_unfinished", _failing_with(code))
    with pytest.raises(StorageError, match=re.escape(errno.errorcode[code])):
        rescuer.recover()
    assert rescuer.get(job_id).state is JobState.ACTIVE  # no later step was tried
