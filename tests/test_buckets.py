"""Pending jobs in buckets, ``pending/<queue>/<P>.<S>/`` (FORMAT.md, "Tree"; issue 24, section 3).

A job's bucket is named by its priority field and the second of its <SEQ>; the store's SEQ comes
from the real clock (no injectable clock for it), so the tests that need jobs in several seconds
sleep across second boundaries.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import FakeWall
from faultkit import hooked
from internals import count_listings, keep_emptied_buckets, pending_buckets, pending_file

from fsjobstore import JobNotFound, JobState, JobStore
from fsjobstore._core._buckets import LINGER, NETWORK_KEEP
from fsjobstore._core._pending import QUIET_FOR
from fsjobstore._format._layout import generated_id, seq_field
from fsjobstore._os import _beneath
from fsjobstore._os._files import SETTLE


def _next_second() -> None:
    """Sleep into the next second of the wall clock: what is created then goes to a new bucket."""
    time.sleep(1.02 - time.time() % 1)


def _second_of(path: str) -> int:
    """The second a job's bucket stands for (``<P>.<S>``)."""
    return int(os.path.basename(os.path.dirname(path)).split(".")[1])


def _seq_of(path: str) -> int:
    """A pending job's <SEQ>, from its file name (``<P>.<SEQ>.<id>.json``)."""
    return int(os.path.basename(path).split(".")[1])


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(left)


def test_jobs_made_over_three_seconds_are_claimed_by_priority_then_in_order_and_old_emptied_buckets_go(
        open_store: Callable[..., JobStore]) -> None:
    producer = open_store(durable=False)
    made = []  # (priority, order of creation, id)
    for second in range(3):
        for p in (5, 0, -5):
            made.append((p, len(made), producer.create({"second": second, "p": p}, priority=p).id))
        if second < 2:
            _next_second()
    assert len(pending_buckets(producer.path)) == 9  # 3 priorities x 3 seconds
    # Bucket, then name, sorts as the jobs run: what lets a claimer read the oldest bucket first.
    paths = [pending_file(producer.path, i) for _, _, i in sorted(made)]
    assert sorted(paths) == paths
    newest = max(_second_of(pending_file(producer.path, i)) for _, _, i in made)
    _sleep_until(newest + 1 + LINGER + 0.05)  # every one of these buckets is past its linger now
    late = producer.create({"late": True}, priority=9)  # this second's bucket: it stays once emptied
    late_bucket = os.path.basename(os.path.dirname(pending_file(producer.path, late.id)))
    worker = open_store(durable=False, watch=False)  # another process
    claimed = []
    while (lease := worker.pull_work(timeout=0)) is not None:
        claimed.append(lease.id)
        lease.fulfill(b"")
    assert claimed == [i for _, _, i in sorted(made)] + [late.id]  # priority, then first made first
    # The emptied buckets of past seconds go with a claimer's listing once their own stat settled
    # (a bucket just made again for a job put back must live: _buckets); the current one does not.
    time.sleep(SETTLE + 0.1)
    assert worker.pull_work(timeout=0) is None
    listed_at = time.time()
    if listed_at < int(late_bucket.split(".")[1]) + 1 + LINGER:
        assert pending_buckets(producer.path) == [late_bucket]
    else:  # a loaded machine took past the late bucket's own linger: it may go too, as it should
        assert pending_buckets(producer.path) in ([late_bucket], [])
    assert worker.statistics().pending == 0 and worker.statistics().fulfilled == 10


def test_a_job_released_into_a_bucket_removed_meanwhile_is_put_back_and_runs(
        open_store: Callable[..., JobStore]) -> None:
    holder, other = open_store(durable=False), open_store(durable=False, watch=False)
    job = holder.create("x")
    path = pending_file(holder.path, job.id)
    lease = holder.pull_work()
    assert lease is not None and lease.id == job.id
    _sleep_until(_second_of(path) + 1 + LINGER + 0.05)
    assert other.pull_work(timeout=0) is None  # its listing finds the bucket empty and old
    assert not os.path.exists(os.path.dirname(path))  # removed
    lease.release()
    assert pending_file(holder.path, job.id) == path  # its bucket made again, the job in it
    again = other.pull_work(timeout=0)
    assert again is not None and again.id == job.id and again.attempt == 1  # a release is no attempt
    again.fulfill(b"done")
    assert other.get(job.id).value == b"done"


def test_a_bucket_removed_and_made_again_by_another_process_is_read_through_its_new_directory(
        open_store: Callable[..., JobStore], tmp_path: Any) -> None:
    """This process keeps the bucket's descriptor from its create; another removes the bucket
    (emptied) and makes it again for a job put back into that second: a lookup, a claim and a
    rename into it must reach the new directory, not answer from the removed one."""
    store = open_store(durable=False, watch=False)
    job = store.create("x")
    path = pending_file(store.path, job.id)
    bucket, aside = os.path.dirname(path), str(tmp_path / "aside")

    def remove_and_make_again() -> None:
        os.rename(path, aside)
        os.rmdir(bucket)
        os.mkdir(bucket)
        os.rename(aside, path)

    remove_and_make_again()
    assert store.get(job.id).state is JobState.PENDING
    lease = store.pull_work(timeout=0)
    assert lease is not None and lease.id == job.id
    os.rmdir(bucket)  # emptied by the claim, and removed; made again (empty) by another process
    os.mkdir(bucket)
    lease.release()
    assert pending_file(store.path, job.id) == path
    remove_and_make_again()
    again = store.pull_work(timeout=0)
    assert again is not None and again.id == job.id
    again.fulfill(b"done")
    assert store.get(job.id).value == b"done"


def test_a_process_spreading_jobs_over_many_buckets_keeps_few_of_their_descriptors_open(
        open_store: Callable[..., JobStore]) -> None:
    """Each priority of each second is a bucket: 200 of them within a second must not mean 200
    descriptors (an evicted one stays open a while: another thread may be about to use it)."""
    store = open_store(durable=False, watch=False)
    before = len(os.listdir("/proc/self/fd"))
    started = time.monotonic()
    for p in range(200):
        store.create(p, priority=p)
    seconds = time.monotonic() - started
    while (lease := store.pull_work(timeout=0)) is not None:
        lease.fulfill(None)
    grown = len(os.listdir("/proc/self/fd")) - before
    # the cache's slots, one eviction a second, two finished-index hours, a listing or two
    assert grown <= _beneath.BUCKETS_KEPT + 2 * (seconds + 2) + 4, (grown, seconds)


def test_a_bucket_removed_between_its_making_and_the_rename_into_it_is_made_again(
        open_store: Callable[..., JobStore]) -> None:
    """The race into_pending's retry is for: an emptied bucket removed by another claimer just
    before our rename into it (here at every one of the first three renames)."""
    store = open_store(durable=False, watch=False)
    job = store.create("x")
    bucket = os.path.dirname(pending_file(store.path, job.id))
    lease = store.pull_work()
    assert lease is not None
    removed = [0]

    class RemoveTheBucket:
        def before(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "rename" and str(args[1]).startswith(bucket + os.sep) and removed[0] < 3:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(bucket)  # empty (its job is claimed), and old enough for a claimer
                removed[0] += 1

        def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
            pass

    with hooked(RemoveTheBucket()):
        lease.release()
    assert removed[0] == 3  # three renames failed, the fourth went in
    assert os.path.dirname(pending_file(store.path, job.id)) == bucket
    again = store.pull_work(timeout=0)
    assert again is not None and again.id == job.id


def test_a_pending_file_written_flat_is_moved_into_its_bucket_by_the_next_pull_and_runs_once(
        open_store: Callable[..., JobStore]) -> None:
    producer = open_store(durable=False)
    job = producer.create({"n": 1})
    bucketed = pending_file(producer.path, job.id)
    qdir = os.path.dirname(os.path.dirname(bucketed))
    flat = os.path.join(qdir, os.path.basename(bucketed))
    os.rename(bucketed, flat)  # where a format-2 store (or format 3 before buckets) wrote it
    os.rmdir(os.path.dirname(bucketed))
    worker = open_store(durable=False, watch=False)  # a process that never saw it in its bucket
    assert worker.statistics().pending_by_queue == {"default": 1}  # counted where it is
    lease = worker.pull_work(timeout=0)
    assert lease is not None and lease.id == job.id and lease.request == {"n": 1}
    assert not os.path.exists(flat)
    lease.fulfill(b"ran")
    assert worker.pull_work(timeout=0) is None  # once: no copy left behind to run again
    got = worker.get(job.id)
    assert got.state is JobState.FULFILLED and got.attempts == 1 and got.value == b"ran"
    assert [n for n in os.listdir(qdir) if not os.path.isdir(os.path.join(qdir, n))] == []


def test_lookups_by_id_find_pending_jobs_with_generated_and_chosen_ids_in_any_queue_and_priority(
        open_store: Callable[..., JobStore]) -> None:
    """get(), cancel() and fulfill(id) of pending jobs, from a process that did not make them.

    The place of a pending job is found from its id: a chosen id's reservation ``ids/<id>`` names
    its queue, priority and <SEQ>; a generated id begins with its <SEQ>. So a chosen id whose
    ``ids/<id>`` was removed by hand is not looked for in pending at all: get() says JobNotFound
    (as for a job whose file was removed by hand), though a claimer, which lists buckets, still
    finds and runs the job."""
    producer = open_store(durable=False)
    jobs = {
        "gen-get-cancel": producer.create({"k": 1}),
        "gen-fulfill": producer.create({"k": 2}, queue="mail", priority=3),
        "chosen-cancel": producer.create({"k": 3}, job_id="order-1", queue="mail", priority=-2),
        "chosen-fulfill": producer.create({"k": 4}, job_id="order-2"),
    }
    _next_second()
    for i in range(3):  # other jobs in other buckets, of both queues
        producer.create({"other": i}, queue="mail" if i % 2 else "default", priority=i)
    lookups = open_store(durable=False, watch=False)  # another process: nothing cached
    for made in jobs.values():
        got = lookups.get(made.id)
        assert got.state is JobState.PENDING and got.request == made.request and got.queue == made.queue
    assert lookups.cancel(jobs["gen-get-cancel"].id, "no").state is JobState.CANCELLED
    assert lookups.cancel("order-1", "no").state is JobState.CANCELLED
    lookups.fulfill(jobs["gen-fulfill"].id, {"by": "hand"})
    lookups.fulfill("order-2", {"by": "hand"})
    states = {name: lookups.get(made.id) for name, made in jobs.items()}
    assert {n: j.state.value for n, j in states.items()} == {
        "gen-get-cancel": "cancelled", "gen-fulfill": "fulfilled", "chosen-cancel": "cancelled",
        "chosen-fulfill": "fulfilled"}
    assert states["gen-fulfill"].value == {"by": "hand"} and states["chosen-fulfill"].value == {"by": "hand"}

    producer.create({"k": 5}, job_id="order-3", queue="lost")
    os.unlink(os.path.join(producer.path, "ids", "order-3"))  # removed by hand
    with pytest.raises(JobNotFound):
        lookups.get("order-3")
    lease = lookups.pull_work(queues="lost", timeout=0)  # claims read buckets, not ids/
    assert lease is not None and lease.id == "order-3"
    lease.fulfill(b"ran")
    assert lookups.get("order-3").value == b"ran"  # a final job is found by its name alone

    unknown = generated_id(seq_field(time.time_ns()))
    with pytest.raises(JobNotFound):
        lookups.get(unknown)
    with pytest.raises(JobNotFound):
        lookups.get("7f3c1a9e2b4d4c8e9a1b2c3d4e5f6a7b")  # the shape of an older version's (uuid4) id


def test_statistics_count_pending_per_queue_and_the_oldest_age_as_jobs_come_and_go(
        open_store: Callable[..., JobStore]) -> None:
    wall = FakeWall(time.time() + 1000)  # oldest_pending_age is wall - SEQ: fixed wall, exact ages
    producer = open_store(durable=False)
    a = [producer.create(i, queue="a").id for i in range(3)]
    b = [producer.create(i, queue="b", priority=-1).id for i in range(2)]
    stats_store = open_store(durable=False, watch=False, wall_clock=wall)

    def age_of(job_id: str, queue: str) -> float:
        return wall.now - _seq_of(pending_file(stats_store.path, job_id, queue)) / 1e9

    stats = stats_store.statistics()
    assert (stats.pending, dict(stats.pending_by_queue)) == (5, {"a": 3, "b": 2})
    assert stats.oldest_pending_age == pytest.approx(age_of(a[0], "a"), abs=1e-6)
    worker = open_store(durable=False, watch=False)
    for _ in range(3):  # b's two (more urgent), then a's first
        lease = worker.pull_work(timeout=0)
        assert lease is not None
        lease.fulfill(b"")
    stats = stats_store.statistics()
    assert (stats.pending, dict(stats.pending_by_queue), stats.fulfilled) == (2, {"a": 2, "b": 0}, 3)
    assert stats.oldest_pending_age == pytest.approx(age_of(a[1], "a"), abs=1e-6)
    assert b  # (claimed above)


def test_statistics_counted_again_when_a_released_job_lands_in_a_bucket_whose_count_was_kept(
        open_store: Callable[..., JobStore]) -> None:
    store = open_store(durable=False, watch=False)
    ids = [store.create(i).id for i in range(3)]
    bucket = os.path.dirname(pending_file(store.path, ids[0]))
    assert all(os.path.dirname(pending_file(store.path, i)) == bucket for i in ids[1:]) or pytest.skip(
        "the three creates straddled a second")
    lease = store.pull_work(timeout=0)
    assert lease is not None and lease.id == ids[0]
    then = time.time() - 60
    os.utime(bucket, (then, then))  # settled, as a bucket of a past second is: its count may be kept
    assert store.statistics().pending == 2
    with count_listings(bucket) as listings:
        assert store.statistics().pending == 2  # the kept count: its stat did not change
    assert listings[0] == 0
    lease.release()  # back into that bucket
    with count_listings(bucket) as listings:
        assert store.statistics().pending == 3
    assert listings[0] == 1  # its stat changed: listed again


def test_the_fulfilled_count_is_right_after_each_commit(open_store: Callable[..., JobStore]) -> None:
    store = open_store(durable=False, watch=False)
    for i in range(4):
        store.create(i)
    assert store.statistics().fulfilled == 0
    for n in range(1, 4):
        lease = store.pull_work(timeout=0)
        assert lease is not None
        lease.fulfill(n)
        stats = store.statistics()  # every call, a commit apart: no count kept past a change
        assert (stats.fulfilled, stats.pending) == (n, 4 - n)
    lease = store.pull_work(timeout=0)
    assert lease is not None
    lease.fail("no", retry=False)
    stats = store.statistics()
    assert (stats.fulfilled, stats.failed, stats.pending) == (3, 1, 0)
    store.retry(lease.id)  # counted pending at once, no longer failed (its index entry goes)
    stats = store.statistics()
    assert (stats.fulfilled, stats.failed, stats.pending) == (3, 0, 1)


def test_a_claim_passes_over_a_queue_emptied_this_second_with_stats_and_sees_a_job_put_back_into_it(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    keep_emptied_buckets(monkeypatch)  # its emptied bucket stays (as for 2 s after its second)
    s = open_store(durable=False, poll_interval=3600.0, watch=False)  # no inotify, no rescan soon
    other = open_store(durable=False, watch=False)  # another process
    first, second = s.create("1", queue="images"), s.create("2", queue="images")
    bucket = os.path.dirname(pending_file(s.path, first.id, "images"))
    if os.path.dirname(pending_file(s.path, second.id, "images")) != bucket:
        pytest.skip("the two creates straddled a second")
    lease = s.pull_work(queues="images")
    assert lease is not None and lease.id == first.id
    lease.fulfill(b"")
    held = other.pull_work(queues="images")
    assert held is not None and held.id == second.id  # images is empty now; its bucket is kept
    images = os.path.dirname(bucket)
    then = time.time() - 60
    for directory in (bucket, images):
        os.utime(directory, (then, then))  # both settled: their stats are trusted
    for i in range(10):
        s.create(i)
    with count_listings(images, below=True) as listings:
        for _ in range(10):
            lease = s.pull_work(timeout=0)
            assert lease is not None and lease.queue == "default"
            lease.fulfill(b"")
    assert listings[0] <= 2  # once each, to see them empty; then their stats say they still are
    # A job put back into the kept bucket changes its stat, not the queue directory's: seen at once.
    held.release()
    got = s.pull_work(timeout=0)
    assert got is not None and got.id == second.id


def test_an_emptied_bucket_of_a_past_second_is_removed_only_once_its_own_stat_settled(
        open_store: Callable[..., JobStore]) -> None:
    """A bucket made again a moment ago (for a job being put back into its second) must live
    until that job's rename lands: claimers polling an empty queue removed such a bucket each
    time it was made, and a take-over that gave up dropped its job (tests/test_chaos.py)."""
    s = open_store(durable=False, watch=False, poll_interval=0.001)  # every pull lists again
    qdir = os.path.join(s.path, "jobs", "pending", "default")
    old = os.path.join(qdir, f"1000000.{int(time.time()) - 60:011d}")
    os.makedirs(old)  # just made: its mtime is now
    assert s.pull_work(timeout=0) is None
    assert os.path.isdir(old)  # kept: it may be about to receive its job
    then = time.time() - 60
    os.utime(old, (then, then))
    assert s.pull_work(timeout=0) is None
    assert not os.path.exists(old)  # settled, empty and old: removed


def _old_bucket(qdir: str, age: float, *, changed_ago: float) -> str:
    """Make an empty bucket of a second ``age`` s past, last changed ``changed_ago`` s ago."""
    path = os.path.join(qdir, f"1000000.{int(time.time() - age):011d}")
    os.makedirs(path)
    then = time.time() - changed_ago
    os.utime(path, (then, then))
    return path


def test_on_a_network_filesystem_an_emptied_bucket_stays_until_nothing_changed_it_for_the_keep(
        open_store: Callable[..., JobStore]) -> None:
    """A replicated volume's server that was down while a job left a bucket brings the job back
    at its heal if the bucket was removed and made again meanwhile: there, an emptied bucket goes
    only once nothing changed it for ``NETWORK_KEEP`` s, longer than an outage and its heal."""
    clock = FakeWall(1000.0)
    s = open_store(durable=False, watch=False, poll_interval=0.001, lock_takeover=False, clock=clock)
    local = open_store(durable=False, watch=False, poll_interval=0.001)
    qdir = os.path.join(s.path, "jobs", "pending", "default")
    recent = _old_bucket(qdir, 600, changed_ago=60)  # settled and old: a local store removes it
    assert s.pull_work(timeout=0) is None
    assert os.path.isdir(recent)  # kept: emptied a minute ago
    spent = _old_bucket(qdir, 900, changed_ago=NETWORK_KEEP + 10)
    clock.advance(QUIET_FOR)  # every kept bucket is looked at again
    assert s.pull_work(timeout=0) is None
    assert os.path.isdir(recent) and not os.path.exists(spent)
    assert local.pull_work(timeout=0) is None
    assert not os.path.exists(recent)  # the local rule: old, settled and empty is enough


def test_a_claimer_on_a_network_filesystem_passes_over_kept_empty_buckets_with_no_call_and_sees_a_job_put_back(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept empty buckets (up to ``NETWORK_KEEP`` s of them) would cost a stat and a listing each
    over the network before every claim; while the queue's marker says no older bucket changed
    they cost nothing, and a job put back into one sets the marker, so it is found at once."""
    producer = open_store(durable=False, lock_takeover=False)
    real_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() - 60 * 10**9)  # a job made a minute ago
    job = producer.create("x")
    monkeypatch.setattr(time, "time_ns", real_ns)
    qdir = os.path.join(producer.path, "jobs", "pending", "default")
    kept = [_old_bucket(qdir, 120 + i, changed_ago=30) for i in range(40)]
    holder = open_store(durable=False, watch=False, lock_takeover=False)  # another process: it puts the job back
    lease = holder.pull_work(timeout=0)
    assert lease is not None and lease.id == job.id
    worker = open_store(durable=False, watch=False, poll_interval=0.001, lock_takeover=False)  # every pull lists
    emptied = pending_buckets(producer.path)
    assert len(emptied) == 41  # the job's own bucket is kept too
    then = time.time() - 30
    for name in [*emptied, ".changed"]:  # settled, the queue's marker too (the old create set it)
        os.utime(os.path.join(qdir, name), (then, then))
    assert worker.pull_work(timeout=0) is None  # lists each once and finds it empty
    with count_listings(qdir, below=True) as listings:
        assert worker.pull_work(timeout=0) is None
    assert listings[0] == 1  # the queue's directory only: none of the 41 buckets
    assert all(os.path.isdir(p) for p in kept)
    lease.release()  # back into its bucket of a minute ago: the marker is set
    again = worker.pull_work(timeout=0)
    assert again is not None and again.id == job.id
    again.fulfill(b"done")


class _Unreadable:
    """Every call on a path under ``top`` fails with EIO, as GlusterFS answers for a directory in
    split-brain."""

    def __init__(self, top: str) -> None:
        self.top = top

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], str) and args[0].startswith(self.top):
            raise OSError(errno.EIO, "Input/output error", args[0])

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        pass


def test_a_pending_bucket_the_filesystem_will_not_read_holds_back_its_own_jobs_and_no_others(
        open_store: Callable[..., JobStore], caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(durable=False, watch=False)
    stuck = store.create("first")
    bad = os.path.dirname(pending_file(store.path, stuck.id))
    _next_second()
    later = store.create("second")
    assert os.path.dirname(pending_file(store.path, later.id)) != bad
    with hooked(_Unreadable(bad)), caplog.at_level(logging.WARNING, logger="fsjobstore"):
        lease = store.pull_work(timeout=0)
        assert lease is not None and lease.id == later.id  # the queue goes on past it
        lease.fulfill(None)
        assert store.pull_work(timeout=0) is None
        assert store.pull_work(timeout=0) is None
    assert caplog.text.count("this pending bucket cannot be read") == 1, caplog.text  # said once a minute
    lease = store.pull_work(timeout=0)  # readable again: its job runs
    assert lease is not None and lease.id == stuck.id
