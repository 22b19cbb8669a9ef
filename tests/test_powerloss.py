"""Power loss: every state a power cut could leave (powerloss.py states the model) recovers
with nothing acknowledged lost and nothing torn read; and the checker notices a missing fsync."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import powerloss
import pytest

from fsjobstore._core import _opening
from fsjobstore._os import _files as _fsops


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logger = logging.getLogger("fsjobstore")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)  # later tests' caplog must still see warnings


def test_every_power_cut_state_of_a_durable_run_recovers_with_nothing_acknowledged_lost() -> None:
    report = powerloss.run()
    # The problems first: the run stops after 50 of them, so a short count means problems found.
    assert report["problems"] == [], (report["states_checked"], report["problems"])
    assert report["calls_recorded"] > 50
    assert report["states_checked"] > 500


def test_the_checker_catches_a_missing_directory_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fsops, "sync_applied", lambda path, *, durable: None)
    report = powerloss.run()
    assert any("acknowledged job" in p and "is lost" in p for p in report["problems"]), report["problems"][:5]


def test_the_checker_catches_a_missing_file_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _fsops.write_new
    monkeypatch.setattr(_fsops, "write_new", lambda path, data, *, durable, **kw: real(path, data, durable=False, **kw))
    report = powerloss.run()
    assert any("not a whole job file" in p for p in report["problems"]), report["problems"][:5]


def test_every_power_cut_of_a_store_made_with_durable_false_leaves_a_store_that_opens() -> None:
    report = powerloss.run_not_durable()
    assert report["problems"] == [], (report["states_checked"], report["problems"])
    assert report["states_checked"] > 1000
    assert report["lost_reported"] > 0  # the cuts that lose jobs say so, through recover()


def test_the_not_durable_checker_catches_a_store_marker_written_without_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _fsops.write_new

    def marker_not_synced(path: str, data: bytes, *, durable: bool, **kw: int) -> None:
        real(path, data, durable=durable and ".init" not in path, **kw)

    monkeypatch.setattr(_fsops, "write_new", marker_not_synced)
    monkeypatch.setattr(_opening, "_looks_like_store", lambda layout: False)  # no second chance
    report = powerloss.run_not_durable()
    assert any("StoreNotFound" in p or "StoreFormatError" in p for p in report["problems"]), report["problems"][:3]


def test_data_written_through_a_rename_that_did_not_survive_is_in_the_file_the_old_name_links(tmp_path: object) -> None:
    import os

    root = str(tmp_path)
    a, b = os.path.join(root, "a"), os.path.join(root, "b")
    snap = powerloss.Snapshot(dirs={root}, names={a: 1}, inodes={1: b"record\n"})
    log = [("rename", a, b), ("write", b, 7, b"result\n"), ("fsync_file", b)]
    dest = os.path.join(root, "cut")
    powerloss.materialize(snap, log, len(log), 0, "lost", dest, root)  # the rename is lost, the data is not
    assert sorted(os.listdir(dest)) == ["a"]
    with open(os.path.join(dest, "a"), "rb") as fh:
        assert fh.read() == b"record\nresult\n"


def test_the_checker_catches_a_claim_that_quarantines_a_queued_file_holding_its_result(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsjobstore._transitions import _work

    def quarantine_it(core: Any, notifier: object, active: str, record: object, state: str) -> None:
        core.tree.quarantine(active, f"a queued job file already holds a {state} result")

    monkeypatch.setattr(_work, "publish_found_result", quarantine_it)
    report = powerloss.run()
    assert any("after a drain: acknowledged job" in p for p in report["problems"]), report["problems"][:5]


def test_a_commit_the_caller_was_told_failed_is_never_published_by_a_later_power_cut(tmp_path: object) -> None:
    import errno
    import os

    from faultkit import hooked
    from internals import die

    from fsjobstore import JobState, JobStore, StorageError

    class FailPublishOnce:
        def __init__(self, rec: powerloss.Recorder) -> None:
            self.rec, self.armed = rec, True

        def before(self, op: str, args: tuple[object, ...]) -> None:
            self.rec.before(op, args)
            if self.armed and op == "rename" and "/jobs/fulfilled/" in str(args[1]):
                self.armed = False
                raise OSError(errno.EIO, "injected")

        def after(self, op: str, args: tuple[object, ...], result: object) -> None:
            self.rec.after(op, args, result)

    root = os.path.join(str(tmp_path), "store")
    store = JobStore(root, durable=True, lease_duration=3600)
    job = store.create({"n": 1}).id
    snap = powerloss.snapshot(root)
    rec = powerloss.Recorder(root)
    with hooked(FailPublishOnce(rec)), pytest.raises(StorageError) as told:
        store.fulfill(job, "not committed")  # by id: the append is fsynced, the rename fails, the job is released
    assert not told.value.applied
    die(store)
    checked = 0
    for k, prefix, mode in powerloss.crash_states(snap, rec.log):
        if k != len(rec.log):
            continue  # the cuts after the caller heard "nothing happened"
        dest = os.path.join(str(tmp_path), f"cut{prefix}.{mode}")
        powerloss.materialize(snap, rec.log, k, prefix, mode, dest, root)
        with JobStore(dest, lease_duration=3600) as after:
            after.recover()
            while (lease := after.pull_work()) is not None:
                lease.fulfill("run again")
            got = after.get(job)
            assert got.state is JobState.FULFILLED and got.value == "run again", (prefix, mode, got)
        checked += 1
    assert checked >= 3


def test_recovery_reports_a_final_job_file_a_power_cut_emptied_and_names_it(tmp_path: object) -> None:
    import os

    from fsjobstore import JobNotFound, JobStore
    root = os.path.join(str(tmp_path), "s")
    with JobStore(root, durable=False) as store:
        done, queued = store.create("done"), store.create("queued")
        lease = store.pull_work()
        assert lease is not None and lease.id == done.id
        lease.fulfill("v")
        for path in (os.path.join(root, "jobs", "fulfilled", f"{done.id}.json"),
                     *(os.path.join(d, n) for d, _, names in os.walk(os.path.join(root, "jobs", "pending"))
                       for n in names)):
            os.truncate(path, 0)  # the names reached the disk, the data did not
        report = store.recover()
        assert report.lost_to_power_loss == 2 and sorted(report.lost_ids) == sorted([done.id, queued.id])
        with pytest.raises(JobNotFound):
            store.get(done.id)  # quarantined with its reason, not a CorruptJob on every read
        reasons = [n for n in os.listdir(os.path.join(root, "quarantine")) if n.endswith(".reason")]
        assert len(reasons) == 2
