"""A deep backlog at flat cost: what statistics() and a first pull read (issue 24, section 3)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fsjobstore import JobStore
from fsjobstore._core import _core as _shared
from fsjobstore._os import _syscalls
from fsjobstore._os._files import SETTLE
from fsjobstore._transitions import _stats


class _Listings:
    """Counts listings of directories below ``prefix`` made through the store's one door."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.paths: list[str] = []

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "listdir" and isinstance(args[0], str) and args[0].startswith(self.prefix):
            self.paths.append(args[0])

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        pass


def _fill_three_seconds(store: JobStore) -> list[str]:
    ids = []
    for _ in range(3):
        ids += [store.create({"n": i}).id for i in range(20)]
        time.sleep(1.0)
    time.sleep(SETTLE + 0.5)  # every bucket settled: its count may be kept
    return ids


def test_a_fresh_process_counts_from_what_another_counted_and_lists_only_the_bucket_that_changed(
        tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root, durable=False) as first:
        ids = _fill_three_seconds(first)
        assert first.statistics().pending == 60  # lists every bucket, and keeps the counts
    buckets = os.path.join(root, "jobs", "pending", "default")
    assert len(os.listdir(buckets)) >= 3
    watch = _Listings(buckets + os.sep)
    _syscalls.set_hook(watch)
    try:
        with JobStore(root, durable=False) as second:
            stats = second.statistics()
            assert stats.pending == 60 and stats.pending_by_queue == {"default": 60}
            assert watch.paths == []  # no bucket listed: counted by the first process
            second.cancel(ids[0])  # changes the oldest bucket only
            after = second.statistics()
            assert after.pending == 59 and after.cancelled == 1
            assert len(set(watch.paths)) == 1  # that bucket alone was listed again
    finally:
        _syscalls.set_hook(None)


def test_counts_kept_in_a_damaged_or_planted_file_are_ignored_not_believed(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root, durable=False) as store:
        _fill_three_seconds(store)
        store.statistics()
    counts = os.path.join(root, "control", "counts.v2.json")
    with open(counts) as fh:
        kept = json.load(fh)["buckets"]
    shapes = [b"{not json", b'{"buckets": {"jobs/pending/default/x": [1, 2]}}', b"[]", b""]
    for key, (m, c, ino, _value) in kept.items():  # the right stat, a count of the wrong shape
        for value in ("junk", [-5, None], {"fulfilled": "x"}, ["a", 1]):
            shapes.append(json.dumps({"buckets": {key: [m, c, ino, value]}}).encode())
    for junk in shapes:
        with open(counts, "wb") as fh:
            fh.write(junk)
        with JobStore(root, durable=False) as store:
            assert store.statistics().pending == 60


def test_a_count_is_not_kept_for_a_bucket_that_changed_just_before_it_was_counted(tmp_path: Path) -> None:
    """A change within the clock tick of a listing would leave the mtime as it was: counts of a
    bucket younger than SETTLE are never kept, so the next call lists it again."""
    with JobStore(str(tmp_path / "s"), durable=False) as store:
        store.create("a")
        assert store.statistics().pending == 1
        store.create("b")  # most likely into the same bucket, within the same second
        assert store.statistics().pending == 2


def test_a_store_made_during_this_boot_needs_no_pass_for_files_a_power_cut_emptied(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with JobStore(str(root), durable=False):
        pass
    assert [n for n in os.listdir(root / "control") if n.startswith("boot-")]


def test_the_pass_for_files_a_power_cut_emptied_runs_beside_the_first_pull_not_before_it(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with JobStore(str(root), durable=False) as store:
        job = store.create({"n": 1})
    for name in os.listdir(root / "control"):
        if name.startswith("boot-"):
            os.unlink(root / "control" / name)  # as after a reboot
    [bucket] = os.listdir(root / "jobs" / "pending" / "default")
    [name] = os.listdir(root / "jobs" / "pending" / "default" / bucket)
    assert job.id in name
    emptied = str(root / "jobs" / "pending" / "default" / bucket / name)
    open(emptied, "wb").close()  # what the cut left
    pulled = threading.Event()
    looked: list[bool] = []  # for each look at the emptied file's size: had the pull returned?

    class Watch:
        def before(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "stat" and args[0] == emptied:
                looked.append(pulled.wait(10))

        def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
            pass

    _syscalls.set_hook(Watch())
    try:
        with JobStore(str(root)) as worker:
            assert worker.pull_work(queues=["elsewhere"]) is None
            pulled.set()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not os.listdir(root / "quarantine"):
                time.sleep(0.05)  # the retention thread makes it
    finally:
        _syscalls.set_hook(None)
    assert looked and all(looked)  # looked at only once the pull had returned
    assert len([n for n in os.listdir(root / "quarantine") if n.endswith(".reason")]) == 1
    assert [n for n in os.listdir(root / "control") if n.startswith("boot-")]  # marked once done


def _old_backlog(root: str, monkeypatch: pytest.MonkeyPatch) -> tuple[JobStore, list[list[str]]]:
    """A store whose queue holds buckets of 31 seconds three minutes ago, all settled: 300 jobs
    in the first (more than any claimer's index reaches), then 2 in each of the others."""
    store = JobStore(root, durable=False, watch=False)
    start = (int(time.time()) - 180) * 1_000_000_000
    clock = {"ns": start}
    monkeypatch.setattr(_shared, "time", SimpleNamespace(time_ns=lambda: clock["ns"]))
    buckets: list[list[str]] = []
    for k, n in enumerate([300] + [2] * 30):
        clock["ns"] = start + k * 1_000_000_000
        buckets.append([store.create({"k": k, "i": i}).id for i in range(n)])
    monkeypatch.undo()
    qdir = os.path.join(root, "jobs", "pending", "default")
    then = time.time() - 60
    for name in os.listdir(qdir):  # settled, as buckets of past seconds are
        os.utime(os.path.join(qdir, name), (then, then), follow_symlinks=False)
    os.utime(qdir, (then, then))  # and no bucket came or went for a while
    return store, buckets


class _BucketStats:
    """Counts the stats of a queue's buckets made through the store's one door."""

    def __init__(self, qdir: str) -> None:
        self.prefix = qdir + os.sep
        self.stats = 0

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        path = args[0] if args else None
        if op == "stat" and isinstance(path, str) and path.startswith(self.prefix) and "/." not in path:
            self.stats += 1

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        pass


def _counting(store: JobStore) -> tuple[int, int]:
    """(pending, buckets stat'ed) of one statistics() call."""
    watch = _BucketStats(os.path.join(store.path, "jobs", "pending", "default"))
    _syscalls.set_hook(watch)
    try:
        return store.statistics().pending, watch.stats
    finally:
        _syscalls.set_hook(None)


def test_a_deep_backlog_is_counted_with_a_stat_of_its_head_bucket_only_while_nothing_older_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, buckets = _old_backlog(str(tmp_path / "s"), monkeypatch)
    with store:
        assert _counting(store) == (360, 31)  # the first count: every bucket
        assert _counting(store) == (360, 1)  # the head (300 jobs: as far as a claimer reaches)
        lease = store.pull_work(timeout=0)
        assert lease is not None and lease.id == buckets[0][0]
        assert _counting(store) == (359, 1)  # a claim changes the head only
        store.cancel(buckets[20][0])  # a claim by id, of a bucket in the middle: the marker is set
        assert _counting(store) == (358, 31)
        assert store.purge(states=["pending"], match=buckets[25][1]) == 1
        assert store.statistics().pending == 357
        lease.release()  # back into the head bucket
        assert store.statistics().pending == 358
        store.create({"new": 1})  # into a bucket of this second, made now
        store.create({"new": 2})
        assert store.statistics().pending == 360


def test_counts_of_buckets_between_head_and_tail_are_corrected_by_the_next_full_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change that did not set the marker (its process died between the two, or a file moved
    by hand) shows once the queue's last full count is FULL_EVERY seconds old, as FORMAT.md says."""
    store, buckets = _old_backlog(str(tmp_path / "s"), monkeypatch)
    with store:
        assert store.statistics().pending == 360
        [path] = [os.path.join(d, n) for d, _, names in os.walk(store.path) for n in names if buckets[10][0] in n
                  and "pending" in d]
        os.rename(path, str(tmp_path / "moved-by-hand.json"))
        assert store.statistics().pending == 360  # not seen yet: no marker says so
        monkeypatch.setattr(_stats, "FULL_EVERY", 0.0)
        assert store.statistics().pending == 359


def test_a_link_planted_as_a_queues_marker_is_never_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, buckets = _old_backlog(str(tmp_path / "s"), monkeypatch)
    outside = tmp_path / "someone-elses-file"
    outside.write_text("x")
    os.utime(outside, (1_000_000, 1_000_000))
    marker = os.path.join(store.path, "jobs", "pending", "default", ".changed")
    if os.path.lexists(marker):
        os.unlink(marker)
    os.symlink(outside, marker)
    with store:
        assert store.statistics().pending == 360
        store.cancel(buckets[5][0])
        assert store.statistics().pending == 359
    assert outside.stat().st_mtime == 1_000_000
