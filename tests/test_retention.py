"""Retention (issue 24, D2), removal (D3), free ids (D4) and the format 2 -> 3 migration (D1)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from faultkit import job_files, removal_leftovers
from internals import no_background, pending_file, pending_files, retention_walker

from fsjobstore import InvalidRequest, JobExists, JobNotFound, JobState, JobStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _finished(root: Path) -> list[str]:
    return sorted(n for _, _, names in os.walk(root / "finished") for n in names)


def _run(store: JobStore, **kw: Any) -> str:
    job = store.create({"n": 1}, **kw)
    lease = store.pull_work()
    assert lease is not None and lease.id == job.id
    lease.log("a line")
    lease.fulfill(b"v")
    return job.id


def _open(root: Path, clock: Clock, **kw: Any) -> JobStore:
    return JobStore(root, wall_clock=clock, durable=False, **kw)


def _gone(store: JobStore, job_id: str) -> bool:
    """Whether the job is removed once retention has had its chance: recover() makes a pass, and
    a store that pulled has its retention thread too (it may hold the lock, or be first)."""
    for _ in range(50):
        store.recover()
        try:
            store.get(job_id)
        except JobNotFound:
            return True
        time.sleep(0.1)
    return False


def _only_skeleton_left(root: Path) -> None:
    files = job_files(str(root))
    assert files == {} and removal_leftovers(str(root), files) == []
    assert os.listdir(root / "ids") == [] and os.listdir(root / "runs") == [] and _finished(root) == []


def test_retention_removes_a_finished_job_after_its_retain_with_its_runs_ids_and_index_entry(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "s", clock) as s:
        _run(s, job_id="a", retain=60)
        assert len(_finished(tmp_path / "s")) == 1 and os.listdir(tmp_path / "s" / "runs") == ["a"]
        clock.now += 59
        s.recover()
        assert s.get("a").state is JobState.FULFILLED
        clock.now += 2
        assert _gone(s, "a")
    _only_skeleton_left(tmp_path / "s")


def test_a_job_with_targets_waiting_is_kept_until_they_are_delivered(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "s", clock, retain=0) as s:
        job = s.create({"n": 1})
        s.queue(job.id, "someone")
        lease = s.pull_work()
        assert lease is not None
        lease.fulfill(b"v")
        clock.now += 10
        s.recover()
        assert s.get(job.id).waiting == ("someone",)
        note = s.pull_notification()
        assert note is not None
        note.done(note.waiting)
        assert _gone(s, job.id)
    _only_skeleton_left(tmp_path / "s")


def test_retain_zero_removes_a_job_as_soon_as_it_is_final_and_forever_keeps_it(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "s", clock) as s:
        _run(s, job_id="gone", retain=0)
        _run(s, job_id="kept", retain="forever")
        _run(s, job_id="week", retain=timedelta(days=7))
        assert _gone(s, "gone")
        assert s.get("week").state is JobState.FULFILLED
        clock.now += 365 * 24 * 3600
        assert _gone(s, "week")
        assert s.get("kept").state is JobState.FULFILLED


def test_the_store_default_is_recorded_in_the_marker_and_followed_by_a_later_open(tmp_path: Path) -> None:
    clock = Clock()
    root = tmp_path / "s"
    _open(root, clock, retain=30).close()
    assert json.loads((root / "fsjobstore.json").read_text())["retain"] == 30
    with _open(root, clock) as s:  # retain=None: the store's default
        assert s.retain == 30
        _run(s, job_id="a")
        clock.now += 31
        assert _gone(s, "a")
    with _open(root, clock, retain="forever") as s:  # this process's own default, for its jobs
        assert s.retain == float("inf")
        _run(s, job_id="b")
    assert json.loads((root / "fsjobstore.json").read_text())["retain"] == 30  # never rewritten
    new = tmp_path / "n"
    JobStore(new).close()
    assert json.loads((new / "fsjobstore.json").read_text())["retain"] == 7 * 24 * 3600
    JobStore(tmp_path / "f", retain="forever").close()
    assert json.loads((tmp_path / "f" / "fsjobstore.json").read_text())["retain"] is None


@pytest.mark.parametrize("bad", [-1, "7x", "7D", "for ever", float("nan"), True, [], 1e12])
def test_bad_retain_values_give_invalid_request_naming_retain(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(InvalidRequest, match="retain"):
        JobStore(tmp_path / "s", retain=bad)
    with JobStore(tmp_path / "t") as s, pytest.raises(InvalidRequest, match="retain"):
        s.create(1, retain=bad)


def test_a_removed_jobs_id_can_be_created_again_and_the_old_job_never_comes_back(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "s", clock) as s:
        _run(s, job_id="order-7", retain=0)
        clock.now += 1
        assert _gone(s, "order-7")
        again = s.create({"second": True}, job_id="order-7")
        assert again.state is JobState.PENDING
        with pytest.raises(JobExists):
            s.create({"third": True}, job_id="order-7")
        got = s.get("order-7")
        assert got.request == {"second": True} and got.value is None and got.logs == ()


def test_a_final_file_deleted_by_hand_is_not_resurrected_by_a_create_with_its_id(tmp_path: Path) -> None:
    # The story: create with an id, run it, rm the final file, create with the same id.
    root = tmp_path / "s"
    with JobStore(root) as s:
        _run(s, job_id="report", retain="forever")
        os.unlink(root / "jobs" / "fulfilled" / "report.json")
        with pytest.raises(JobNotFound):
            s.get("report")
        fresh = s.create({"fresh": True}, job_id="report")
        assert fresh.state is JobState.PENDING
        got = s.get("report")
        assert got.state is JobState.PENDING and got.value is None and got.request == {"fresh": True}
        lease = s.pull_work()
        assert lease is not None and lease.request == {"fresh": True} and lease.attempt == 1


def _format2_store(root: Path) -> list[str]:
    """A store as the library on main (format 2) leaves it: no finished/, a format-2 marker, a
    pending job written flat in its queue's directory with a uuid4 id and no reservation."""
    ids = []
    with JobStore(root, durable=False) as s:
        for i in range(3):
            ids.append(_run(s, job_id=f"old-{i}"))
        waiting = s.create({"waiting": True}, job_id=uuid.uuid4().hex).id
    os.unlink(root / "ids" / waiting)  # a generated id had none
    queued = pending_file(str(root), waiting)
    os.rename(queued, root / "jobs" / "pending" / "default" / os.path.basename(queued))
    os.rmdir(os.path.dirname(queued))
    for dirpath, _dirs, names in os.walk(root / "finished", topdown=False):
        for name in names:
            os.unlink(os.path.join(dirpath, name))
        os.rmdir(dirpath)
    for state in ("fulfilled", "failed", "cancelled"):  # format-2 records have no "retain"
        for path in (root / "jobs" / state).iterdir():
            first, rest = path.read_bytes().split(b"\n", 1)
            record = json.loads(first)
            del record["retain"]
            path.write_bytes(json.dumps(record, separators=(",", ":")).encode() + b"\n" + rest)
    marker = json.loads((root / "fsjobstore.json").read_text())
    marker["format"] = 2
    del marker["retain"]
    (root / "fsjobstore.json").write_text(json.dumps(marker))
    return ids


def test_a_format_2_store_is_migrated_final_jobs_get_index_entries_and_a_second_open_does_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "s"
    ids = _format2_store(root)
    JobStore(root).close()
    marker = json.loads((root / "fsjobstore.json").read_text())
    # A store made before retention kept every job: the upgrade keeps doing so unless asked.
    assert (marker["format"], marker["migrated_from"], marker["retain"]) == (3, 2, None)
    entries = _finished(root)
    assert all(e.split(".")[1] == "9" * 17 for e in entries)  # <EXP>: forever
    assert sorted(e.rsplit(".", 1)[1] for e in entries) == ids
    assert removal_leftovers(str(root), job_files(str(root))) == []
    # The pending job moved into its bucket, and nothing is left flat.
    [queued] = pending_files(str(root))
    assert [n for n in os.listdir(root / "jobs" / "pending" / "default") if n.endswith(".json")] == []
    with JobStore(root) as store:
        waiting = os.path.basename(queued).split(".")[2]
        assert store.get(waiting).request == {"waiting": True}  # an older version's id: found
        lease = store.pull_work()
        assert lease is not None and lease.id == waiting
        lease.release()
    caplog.clear()
    before = (root / "fsjobstore.json").read_bytes()
    JobStore(root).close()
    assert (root / "fsjobstore.json").read_bytes() == before and _finished(root) == entries
    assert "upgraded" not in caplog.text


def _kill_mid(root: Path, where: str) -> None:
    """A process that starts removing a job and is SIGKILLed at ``where`` (a syscall of it)."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from faultkit import hooked
        from fsjobstore import JobStore
        from fsjobstore._transitions._removal import remove_job

        class Kill:
            def __init__(self): self.n = 0
            def before(self, op, args):
                if op == {where.split(":")[0]!r}:
                    self.n += 1
                    if self.n == {int(where.split(":")[1])}:
                        os.kill(os.getpid(), signal.SIGKILL)
            def after(self, op, args, result): pass

        s = JobStore({str(root)!r}, durable=False)
        with hooked(Kill()):
            remove_job(s._core, s._hooks, s._core.layout.final_path("fulfilled", "k"), "k", drop_targets=False)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


# Every unlink and rmdir of the removal of a job with no cancel request, targets or notification
# (the name watch rules those out without a call): its id's marker, its run directory, its index
# entry, the fenced file itself.
@pytest.mark.parametrize("where", ["unlink:1", "rmdir:1", "unlink:2", "unlink:3"])
def test_a_removal_killed_midway_is_finished_by_the_next_recovery_and_the_job_never_comes_back(
    tmp_path: Path, where: str
) -> None:
    root = tmp_path / "s"
    with JobStore(root, durable=False) as s:
        _run(s, job_id="k", retain="forever")
        other = s.create({"other": True}).id
    _kill_mid(root, where)
    with JobStore(root, durable=False) as s:
        report = s.recover()
        assert report.removed == 1
        with pytest.raises(JobNotFound):
            s.get("k")
        assert s.get(other).state is JobState.PENDING
        files = job_files(str(root))
        assert list(files) == [other] and removal_leftovers(str(root), files) == []
        assert os.listdir(root / "tmp") == []
        assert s.create({"new": True}, job_id="k").request == {"new": True}


def test_a_format_2_store_opened_first_with_retain_keeps_its_final_jobs_that_long(tmp_path: Path) -> None:
    root = tmp_path / "s"
    _format2_store(root)
    JobStore(root, retain=3600).close()
    marker = json.loads((root / "fsjobstore.json").read_text())
    assert marker["retain"] == 3600
    assert all(e.split(".")[1] != "9" * 17 for e in _finished(root))


def test_recover_indexes_a_final_job_an_older_process_committed_after_the_upgrade(tmp_path: Path) -> None:
    # A format-2 worker still running when the store was upgraded commits without an entry; the
    # job would never be listed, purged or removed. An explicit recover() gives it its entry.
    root = tmp_path / "s"
    with JobStore(root, durable=False) as store:
        job_id = _run(store)
        for dirpath, _dirs, names in os.walk(root / "finished"):
            for name in names:
                os.unlink(os.path.join(dirpath, name))
        assert [j.id for j in store.jobs(state="fulfilled")] == []
        assert store.recover().indexed == 1
        assert [j.id for j in store.jobs(state="fulfilled")] == [job_id]
        assert store.recover().indexed == 0


def test_a_final_file_read_as_an_older_version_never_costs_the_job_its_index_entry(tmp_path: Path) -> None:
    # On GlusterFS under chaos, a host read a just-published final file as the version before its
    # result line (a requeued record: committed_by set, no finished_at) and retention unlinked the
    # job's entry as stale: the job stayed final, unlisted and never removed. Such a read is kept.
    root = tmp_path / "s"
    with JobStore(root, durable=False) as store:
        # Only the passes asked for here: the retention thread could remove the job before the
        # stale read is planted, or after it is undone, whenever a loaded machine lets it run.
        no_background(store)
        job_id = _run(store, retain=0.5)  # (0 would be removed by its own commit)
        final = root / "jobs" / "fulfilled" / f"{job_id}.json"
        whole = final.read_bytes()
        time.sleep(0.6)
        older = json.loads(whole.split(b"\n", 1)[0])
        older.update(finished_at=None, committed_by="0123456789abcdef-1", attempts=1)
        final.write_bytes(json.dumps(older, separators=(",", ":")).encode() + b"\n")
        assert store.recover().removed == 0
        assert len(_finished(root)) == 1  # the entry stays
        final.write_bytes(whole)  # the read catches up
        # Within a second or two: a bucket that changed with nothing due is listed again at most
        # once a second (_retention), and a loaded CI run can land this pass inside that second.
        removed, deadline = 0, time.monotonic() + 5
        while not removed and time.monotonic() < deadline:
            removed = store.recover().removed
            time.sleep(0 if removed else 0.2)
        assert removed == 1
        assert _finished(root) == [] and not final.exists()


def test_a_job_kept_0_seconds_is_removed_by_the_commit_that_makes_it_final_unless_a_target_waits(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    with JobStore(root, durable=False, retain=0) as store:
        held = os.open(root / "control" / "retention.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(held, fcntl.LOCK_EX)  # no retention pass runs: only the commit can remove it
        plain = store.create({"n": 1})
        heard = store.create({"n": 2})
        store.queue(heard.id, {"to": "someone"})
        for _ in range(2):
            lease = store.pull_work()
            assert lease is not None
            lease.fulfill({"ok": True})
        with pytest.raises(JobNotFound):
            store.get(plain.id)  # no retention pass was needed
        assert store.get(heard.id).state is JobState.FULFILLED  # its target has not heard yet
        assert _finished(root) != [] and not (root / "runs" / plain.id).exists()
        note = store.pull_notification()
        assert note is not None and note.id == heard.id
        note.done(note.waiting)
        os.close(held)
        deadline = time.monotonic() + 10
        while os.listdir(root / "jobs" / "fulfilled") and time.monotonic() < deadline:
            store.recover(deep=False)  # then retention removes it (this pass, or its thread's)
            time.sleep(0.05)
        assert _finished(root) == [] and os.listdir(root / "jobs" / "fulfilled") == []


def test_a_cancel_that_ends_a_job_kept_0_seconds_returns_it_cancelled_and_counts_it(tmp_path: Path) -> None:
    """The cancel's own commit removes the job (kept 0 s): the caller still hears what it did."""
    with JobStore(tmp_path / "s", durable=False, retain=0) as store:
        waiting = store.create({"n": 1}, queue="q")
        later = store.create({"n": 2}, queue="q", delay=3600, retain=0)
        heard = store.create({"n": 3}, queue="q")
        store.queue(heard.id, {"to": "someone"})
        for job in (waiting, later):
            ended = store.cancel(job.id, reason="withdrawn")
            assert (ended.id, ended.state, ended.error, ended.queue) == (job.id, JobState.CANCELLED,
                                                                         "cancelled: withdrawn", "q")
            assert ended.finished_at is not None and ended.request == job.request
            with pytest.raises(JobNotFound):
                store.get(job.id)  # removed by the cancel itself
        kept = store.cancel(heard.id)
        assert kept.state is JobState.CANCELLED and kept.waiting == ({"to": "someone"},)  # kept for its target
        assert store.counters().queues["q"].cancelled == 3


def test_a_retention_pass_looks_only_at_new_entries_of_a_changing_bucket_until_something_is_due(
        tmp_path: Path) -> None:
    """A worker that had finished 100,000 kept jobs this hour parsed all their entries every
    second (PERFORMANCE.md, "A deep backlog"): a pass now looks at the entries added since the
    last one, and at all of them only when one is due or a minute has passed."""
    wall, mono = Clock(), Clock()
    root = tmp_path / "s"
    with JobStore(root, wall_clock=wall, clock=mono, durable=False, retain=3600) as s:
        remover, looked = retention_walker(s)
        first = [s.create({"n": i}).id for i in range(5)]
        for job_id in first:
            s.fulfill(job_id, b"v")
        remover.run_pass()
        assert sorted(n.rsplit(".", 1)[1] for n in looked) == sorted(first)
        looked.clear()
        remover.run_pass()  # nothing new, listed a moment ago
        assert looked == []
        wall.now += 1
        later = [s.create({"n": i}).id for i in range(2)]
        for job_id in later:
            s.fulfill(job_id, b"v")
        # An entry out of order (an older finishing time than any walked), with nothing behind it.
        bucket = next((root / "finished").iterdir())
        stray = f"{1:017d}.{10**17 - 1:017d}.fulfilled.default.{'e' * 32}"
        (bucket / stray).touch()
        mono.now += 1.5
        remover.run_pass()
        assert sorted(n.rsplit(".", 1)[1] for n in looked) == sorted(later)
        looked.clear()
        mono.now += 61  # a whole walk, which finds the stray
        remover.run_pass()
        assert len(looked) == 8 and stray in looked
        looked.clear()
        wall.now += 3601  # all due: each is looked at and removed
        assert remover.run_pass().removed == 7
        assert sorted(_finished(root)) == [stray]  # its time is far off


def test_junk_planted_among_new_entries_does_not_hide_the_entries_after_it(tmp_path: Path) -> None:
    """A name that sorts after every entry ('zzz') is quarantined by the pass that meets it, and
    the next pass still looks at the entries added since."""
    wall, mono = Clock(), Clock()
    root = tmp_path / "s"
    with JobStore(root, wall_clock=wall, clock=mono, durable=False, retain=3600) as s:
        remover, looked = retention_walker(s)
        s.fulfill(s.create({"n": 0}).id, b"v")
        remover.run_pass()
        bucket = next((root / "finished").iterdir())
        (bucket / "zzz").touch()
        wall.now += 1
        s.fulfill(s.create({"n": 1}).id, b"v")
        mono.now += 1.5
        looked.clear()
        remover.run_pass()
        assert "zzz" in looked and not (bucket / "zzz").exists()  # quarantined
        wall.now += 1
        last = s.create({"n": 2}).id
        s.fulfill(last, b"v")
        mono.now += 1.5
        looked.clear()
        remover.run_pass()
        assert [n.rsplit(".", 1)[1] for n in looked] == [last]
