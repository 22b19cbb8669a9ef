"""The final-commit path: a result is one line appended to the claimed file, which one rename
then moves into place. These tests pin the file grammar and the syscalls a commit may make."""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

import pytest
from internals import pending_file, rescan

from fsjobstore import JobState, JobStore, LeaseLost, StorageError
from fsjobstore._core import _tree
from fsjobstore._format._records import LostJobData, Record
from fsjobstore._os import _syscalls


class Recorder:
    """The calls this thread makes: the store's background thread (its heartbeat, a recovery or
    retention pass) makes its own meanwhile, which a CI run once caught in the middle of a commit."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.thread = threading.get_ident()

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if threading.get_ident() == self.thread:
            self.calls.append((op, args))

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        pass


def _record(**over: Any) -> Record:
    fields: dict[str, Any] = dict(id="j1", queue="default", priority=0, request={"a": 1}, created_at=1.0,
                                  seq="0" * 20, max_attempts=3)
    fields.update(over)
    return Record(**fields)


def test_a_record_line_followed_by_its_result_line_reads_as_the_final_record() -> None:
    base = _record()
    final = _record(attempts=1, value=b"ok", finished_at=2.0, committed_by="t")
    parsed = Record.parse(base.to_bytes() + final.result_bytes("fulfilled"))
    assert parsed.record == final and parsed.final == "fulfilled"
    assert parsed.complete == len(base.to_bytes() + final.result_bytes("fulfilled"))


def test_a_result_line_cut_short_is_ignored_and_the_whole_prefix_measured() -> None:
    base = _record()
    line = _record(attempts=1, value=b"ok", finished_at=2.0, committed_by="t").result_bytes("fulfilled")
    for cut in (1, len(line) // 2, len(line) - 1):
        parsed = Record.parse(base.to_bytes() + line[:cut])
        assert parsed.record == base and parsed.final is None and parsed.complete == len(base.to_bytes())


@pytest.mark.parametrize(
    "tail, problem",
    [
        (b'{"result":"pending"}\n', "does not name a final state"),
        (b'{"result":"failed","attempts":1}\n', "has fields"),
        (b"[1]\n", "does not name a final state"),
        (b"nonsense\n", "invalid JSON"),
    ],
)
def test_a_bad_result_line_is_an_error_naming_it(tail: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Record.parse(_record().to_bytes() + tail)


@pytest.mark.parametrize(("data", "lost", "said"), [
    (b"", True, "is empty"),
    (b"\0\0\0\0", True, "is empty"),  # what some filesystems leave of a file a power cut did not write
    (b'{"format":2,"id":"x","queue":"def', True, "stops inside its first line"),
    (b'{"format":2,"id":"x"\0\0\0', True, "stops inside its first line"),
    (b'{"format":2,"id":"\xc3', True, "stops inside its first line"),  # a character cut in two
    (b"{nope", False, "invalid JSON: Expecting property name"),
    (b"[1,2]x", False, "invalid JSON: Extra data"),
    (b"\xff\xfe{}", False, "not UTF-8"),
])
def test_a_first_line_cut_short_is_lost_data_and_one_that_is_not_json_says_why(data: bytes, lost: bool,
                                                                              said: str) -> None:
    with pytest.raises(ValueError, match=said) as caught:
        Record.parse(data)
    assert isinstance(caught.value, LostJobData) is lost


def test_two_result_lines_are_an_error() -> None:
    line = _record(attempts=1, value=b"ok", finished_at=2.0, committed_by="t").result_bytes("fulfilled")
    with pytest.raises(ValueError, match="more than one result line"):
        Record.parse(_record().to_bytes() + line + line)


def test_a_result_line_without_who_committed_it_is_an_error() -> None:
    line = _record(attempts=1, value=b"ok", finished_at=2.0).result_bytes("fulfilled")
    with pytest.raises(ValueError, match="committed_by"):
        Record.parse(_record().to_bytes() + line)


@pytest.mark.parametrize("durable", [True, False])
@pytest.mark.parametrize("how", ["fulfill", "fail"])
def test_a_final_commit_makes_no_new_inode_its_index_entry_is_a_link_to_the_job_file(
    tmp_path: Any, durable: bool, how: str
) -> None:
    with JobStore(tmp_path / "s", durable=durable) as s:
        s.create("warm")
        warm = s.pull_work()
        assert warm is not None
        warm.fulfill(b"w")  # so the hour's bucket of the index is there already
        job = s.create("x", max_attempts=1)
        lease = s.pull_work()
        assert lease is not None
        rec = Recorder()
        _syscalls.set_hook(rec)
        try:
            lease.fulfill(b"v") if how == "fulfill" else lease.fail("no")
        finally:
            _syscalls.set_hook(None)
        ops = [op for op, _ in rec.calls]
        creates = [a for op, a in rec.calls if (op == "open" and a[1] & os.O_CREAT) or op in ("mknod", "mkdir")]
        assert creates == []
        links = [a for op, a in rec.calls if op == "link"]
        assert len(links) == 1 and "/jobs/active/" in links[0][0] and "/finished/" in links[0][1]
        assert "unlink" not in ops
        assert ops.count("rename") == 1
        assert ops.count("fsync") == (2 if durable else 0)  # the file, then its new directory
        got = s.get(job.id)
        assert got.state is (JobState.FULFILLED if how == "fulfill" else JobState.FAILED)
        assert got.value == (b"v" if how == "fulfill" else None) and got.attempts == 1
        state = "fulfilled" if how == "fulfill" else "failed"
        final = os.stat(tmp_path / "s" / "jobs" / state / f"{job.id}.json")
        assert os.stat(links[0][1]).st_ino == final.st_ino and final.st_nlink == 2


def test_without_renameat2_a_result_is_published_by_link_and_unlink(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_syscalls, "_renameat2", None)
    with JobStore(tmp_path / "s") as s:
        job = s.create("x")
        lease = s.pull_work()
        assert lease is not None
        lease.fulfill(b"v")
        assert s.get(job.id).value == b"v"
        assert os.listdir(tmp_path / "s" / "jobs" / "active") == []


def test_a_result_is_never_published_over_an_existing_one(tmp_path: Any) -> None:
    """A stray second copy of a final job (a restored backup) cannot replace its result."""
    with JobStore(tmp_path / "s") as s:
        job = s.create("x")
        stray = pending_file(s.path, job.id)
        with open(stray, "rb") as fh:
            copy = fh.read()
        lease = s.pull_work()
        assert lease is not None
        lease.fulfill(b"first")
        os.makedirs(os.path.dirname(stray), exist_ok=True)  # its bucket, if a claimer removed it
        with open(stray, "wb") as fh:
            fh.write(copy)
        rescan(s)
        second = s.pull_work()
        assert second is not None
        with pytest.raises(Exception, match="taken over"):
            second.fulfill(b"second")
        assert s.get(job.id).value == b"first"
        assert os.listdir(os.path.join(s.path, "jobs", "active")) == []


def test_where_reads_may_lag_a_final_jobs_index_entry_is_an_empty_file_not_a_link(tmp_path: Any) -> None:
    # lock_takeover=False is how a store on a network filesystem opens: there a stale cached name
    # can link a file another host moved, and a link would keep a fenced holder's file alive.
    with JobStore(tmp_path / "s", lock_takeover=False) as s:
        job = s.create("x")
        lease = s.pull_work()
        assert lease is not None
        lease.fulfill(b"v")
        final = os.stat(tmp_path / "s" / "jobs" / "fulfilled" / f"{job.id}.json")
        entries = [e for b in os.scandir(tmp_path / "s" / "finished") for e in os.scandir(b.path)]
        assert len(entries) == 1 and entries[0].name.endswith(f".fulfilled.default.{job.id}")
        entry = entries[0].stat(follow_symlinks=False)
        assert entry.st_size == 0 and entry.st_ino != final.st_ino and final.st_nlink == 1
        assert s.statistics().fulfilled == 1


def test_a_holder_whose_publish_met_enoent_makes_no_empty_index_entry_for_a_job_that_is_gone(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An empty entry is made by name, whatever is there: a holder whose claim a take-over moved
    # (and whose job was published and removed since) must not make its entry again.
    with JobStore(tmp_path / "s", lock_takeover=False) as s:
        s.create("x", retain=0)
        lease = s.pull_work()
        assert lease is not None

        def moved_away(path: str, dst: str) -> None:
            os.unlink(path)
            raise FileNotFoundError(errno.ENOENT, "moved by a take-over", path)

        monkeypatch.setattr(_tree.Tree, "_rename_final", staticmethod(moved_away))
        with pytest.raises(LeaseLost):
            lease.fulfill(b"late")
        entries = [e.name for b in os.scandir(tmp_path / "s" / "finished") for e in os.scandir(b.path)]
        assert entries == []


def test_where_the_filesystem_refuses_the_link_the_index_entry_is_an_empty_file(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = _syscalls.link

    def refused(src: str, dst: str) -> None:
        if "/finished/" in dst:
            raise PermissionError(errno.EPERM, "protected_hardlinks", src)
        link(src, dst)

    with JobStore(tmp_path / "s") as s:
        job = s.create("x")
        lease = s.pull_work()
        assert lease is not None
        monkeypatch.setattr(_syscalls, "link", refused)
        lease.fulfill(b"v")
        entries = [e for b in os.scandir(tmp_path / "s" / "finished") for e in os.scandir(b.path)]
        assert [e.name.rsplit(".", 1)[1] for e in entries] == [job.id]
        assert entries[0].stat(follow_symlinks=False).st_size == 0 and s.statistics().fulfilled == 1


def test_without_renameat2_a_commit_whose_unlink_fails_after_its_link_keeps_the_published_result(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # link() published the result, then the unlink of the claimed name failed (a network mount's
    # client killed between the two): the commit stands, and the result is not cut off the file.
    monkeypatch.setattr(_syscalls, "_renameat2", None)

    class FailUnlinkOfActive:
        def before(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "unlink" and "/jobs/active/" in str(args[0]):
                raise OSError(errno.ENOTCONN, "Transport endpoint is not connected", args[0])

        def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
            pass

    with JobStore(tmp_path / "s") as s:
        job = s.create("x")
        lease = s.pull_work()
        assert lease is not None
        _syscalls.set_hook(FailUnlinkOfActive())
        try:
            with pytest.raises(StorageError):
                lease.fulfill(b"v")
        finally:
            _syscalls.set_hook(None)
        got = s.get(job.id)
        assert (got.state, got.value) == (JobState.FULFILLED, b"v")
        s.recover()  # the claimed name left beside the published file goes; the result stays
        assert s.get(job.id).value == b"v"
