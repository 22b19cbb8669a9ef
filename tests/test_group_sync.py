"""Group commit of directory fsyncs: threads that commit into one directory at once share its
fsync, each returning only after one begun after it asked; a failed fsync fails every caller it
was to cover and is never run again for them."""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

import pytest

from fsjobstore import JobState, JobStore, StorageError
from fsjobstore._os import _syscalls
from fsjobstore._os._group_sync import GroupSync


class SlowFsync:
    """An fsync that takes ``seconds`` and notes when each one began and ended (a shared clock
    of events, so that order is exact)."""

    def __init__(self, seconds: float, fail: set[int] | None = None) -> None:
        self.seconds = seconds
        self.fail = fail or set()
        self.lock = threading.Lock()
        self.events = 0
        self.runs: list[tuple[int, int]] = []  # (began, ended) event numbers

    def tick(self) -> int:
        with self.lock:
            self.events += 1
            return self.events

    def __call__(self, path: str) -> None:
        began = self.tick()
        number = len(self.runs) + 1
        time.sleep(self.seconds)
        self.runs.append((began, self.tick()))
        if number in self.fail:
            err = StorageError(errno.EIO, "Input/output error", path)
            err.op = "fsync"
            raise err


def test_threads_that_ask_at_once_share_fsyncs_and_each_returns_after_one_begun_after_it_asked() -> None:
    fsync = SlowFsync(0.02)
    group = GroupSync(fsync)
    seen: list[tuple[int, int]] = []

    def commit() -> None:
        asked = fsync.tick()
        group.sync("/d")
        seen.append((asked, fsync.tick()))

    threads = [threading.Thread(target=commit) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 12
    assert len(fsync.runs) < 12  # shared
    for asked, returned in seen:
        assert any(asked < began and ended < returned for began, ended in fsync.runs), (asked, returned, fsync.runs)


def test_a_failed_fsync_fails_every_caller_it_was_to_cover_and_is_not_run_again_for_them() -> None:
    fsync = SlowFsync(0.05, fail={2})
    group = GroupSync(fsync)
    outcome: dict[str, str] = {}

    def commit(name: str) -> None:
        try:
            group.sync("/d")
            outcome[name] = "ok"
        except StorageError as exc:
            outcome[name] = f"error {exc.errno}"

    first = threading.Thread(target=commit, args=("first",))
    first.start()
    time.sleep(0.01)  # the first fsync runs; these two ask meanwhile, so the second covers both
    later = [threading.Thread(target=commit, args=(n,)) for n in ("second", "third")]
    for t in later:
        t.start()
    for t in (first, *later):
        t.join()
    assert outcome == {"first": "ok", "second": f"error {errno.EIO}", "third": f"error {errno.EIO}"}
    assert len(fsync.runs) == 2  # no third fsync passed off as proof for the callers of the failed one
    group.sync("/d")  # a later caller runs a fresh one
    assert len(fsync.runs) == 3


class DirFsyncs:
    """Counts the fsyncs of the store's ``fulfilled/`` directory, and makes each take a few ms,
    as a disk's does, so committing threads overlap."""

    def __init__(self) -> None:
        self.dir_fds: set[int] = set()
        self.count = 0
        self.lock = threading.Lock()

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "fsync" and args[0] in self.dir_fds:
            with self.lock:
                self.count += 1
            time.sleep(0.005)

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        if op == "open" and str(args[0]).endswith("/jobs/fulfilled"):
            self.dir_fds.add(result)
        elif op == "close" and args[0] in self.dir_fds:
            self.dir_fds.discard(args[0])


@pytest.mark.parametrize("threads", [4])
def test_threads_of_a_durable_store_committing_at_once_make_fewer_directory_fsyncs_than_commits(
    tmp_path: Any, threads: int
) -> None:
    with JobStore(tmp_path / "s", durable=True) as s:
        jobs = [s.create(i) for i in range(threads * 10)]
        leases = [s.pull_work() for _ in jobs]
        hook = DirFsyncs()
        _syscalls.set_hook(hook)
        try:
            workers = [threading.Thread(target=lambda part=leases[i::threads]: [x.fulfill(b"v") for x in part])  # type: ignore[union-attr]
                       for i in range(threads)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
        finally:
            _syscalls.set_hook(None)
        assert all(s.get(j.id).state is JobState.FULFILLED for j in jobs)
        assert 0 < hook.count < len(jobs)
