"""store.jobs(): snapshots in a stable order, paged by a cursor (issue 24, D6)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from conftest import FakeWall

from fsjobstore import InvalidRequest, JobNotFound, JobState, JobStore


def ids(jobs: Any) -> list[str]:
    return [j.id for j in jobs]


def finish(store: JobStore, job_id: str, how: str) -> None:
    """Claim ``job_id`` (it must be the next due job) and end it ``how``."""
    if how == "cancelled":
        store.cancel(job_id)
        return
    lease = store.pull_work()
    assert lease is not None and lease.id == job_id
    if how == "fulfilled":
        lease.fulfill({"done": job_id})
    else:
        lease.fail("boom", retry=False)


@pytest.fixture
def wall() -> FakeWall:
    return FakeWall()


@pytest.fixture
def walled(open_store: Callable[..., JobStore], wall: FakeWall) -> JobStore:
    return open_store(wall_clock=wall, backoff=lambda a: 0.0)


def test_pending_jobs_are_listed_in_run_order_priority_first_then_fifo_across_queues(store: JobStore) -> None:
    store.create(1, job_id="a1", queue="a", priority=5)
    store.create(2, job_id="b1", queue="b", priority=0)
    store.create(3, job_id="a2", queue="a", priority=0)
    store.create(4, job_id="b2", queue="b", priority=-3)
    store.create(5, job_id="b3", queue="b", priority=5)
    store.create(6, job_id="a3", queue="a", priority=5)
    listed = list(store.jobs(state="pending"))
    assert ids(listed) == ["b2", "b1", "a2", "a1", "b3", "a3"]
    assert {j.state for j in listed} == {JobState.PENDING}
    taken = []  # ... which is the order claims take them in
    while (lease := store.pull_work()) is not None:
        taken.append(lease.id)
    assert taken == ids(listed)


def test_scheduled_jobs_are_listed_by_due_time(store: JobStore) -> None:
    store.create(1, job_id="late", delay=300)
    store.create(2, job_id="soon", delay=100)
    store.create(3, job_id="middle", delay=200, queue="other", priority=-9)
    assert ids(store.jobs(state=JobState.SCHEDULED)) == ["soon", "middle", "late"]


def test_final_jobs_are_listed_newest_first_across_the_three_final_states(walled: JobStore, wall: FakeWall) -> None:
    for n, how in enumerate(["fulfilled", "failed", "cancelled", "fulfilled", "cancelled", "failed"]):
        walled.create(n, job_id=f"j{n}")
        finish(walled, f"j{n}", how)
        wall.advance(1_000 if n != 2 else 4 * 3600)  # one jump crosses buckets (an hour each)
    assert ids(walled.jobs()) == ["j5", "j4", "j3", "j2", "j1", "j0"]
    assert ids(walled.jobs(state="failed")) == ["j5", "j1"]
    assert [j.state.value for j in walled.jobs(state=None)][:2] == ["failed", "cancelled"]
    assert walled.jobs(state="fulfilled", limit=1).__next__().value == {"done": "j3"}


def test_active_jobs_are_listed_by_id_with_the_running_attempt_counted(store: JobStore) -> None:
    for job_id in ("m", "z", "c"):
        store.create(job_id, job_id=job_id)
    leases = [store.pull_work() for _ in range(3)]
    listed = list(store.jobs(state="active"))
    assert ids(listed) == ["c", "m", "z"]
    assert [j.attempts for j in listed] == [1, 1, 1]
    for lease in leases:
        assert lease is not None
        lease.release()


def test_all_states_are_walked_active_pending_scheduled_then_final_newest_first(walled: JobStore,
                                                                                 wall: FakeWall) -> None:
    walled.create(0, job_id="old")
    finish(walled, "old", "fulfilled")
    wall.advance(10)
    walled.create(0, job_id="new")
    finish(walled, "new", "failed")
    walled.create(0, job_id="run")
    lease = walled.pull_work()
    walled.create(0, job_id="wait", delay=60)
    walled.create(0, job_id="due")
    assert [(j.id, j.state.value) for j in walled.jobs()] == [
        ("run", "active"), ("due", "pending"), ("wait", "scheduled"), ("new", "failed"), ("old", "fulfilled")]
    assert lease is not None
    lease.release()


def test_paging_with_after_stays_stable_while_new_jobs_arrive_and_old_ones_are_claimed(store: JobStore) -> None:
    for n in range(10):
        store.create(n, job_id=f"p{n:02d}")
    first = ids(store.jobs(state="pending", limit=4))
    assert first == ["p00", "p01", "p02", "p03"]
    # Meanwhile: the page's jobs, its last one included, are claimed and finished; new jobs arrive.
    for _ in range(4):
        lease = store.pull_work()
        assert lease is not None
        lease.fulfill(None)
    for n in range(10, 13):
        store.create(n, job_id=f"p{n:02d}")
    second = ids(store.jobs(state="pending", limit=4, after=first[-1]))
    assert second == ["p04", "p05", "p06", "p07"]
    store.pull_work()  # p04 runs now: still the place the cursor says
    rest = ids(store.jobs(state="pending", limit=100, after=second[-1]))
    assert rest == ["p08", "p09", "p10", "p11", "p12"]


def test_paging_final_jobs_reaches_each_once_across_buckets_while_more_finish(walled: JobStore,
                                                                              wall: FakeWall) -> None:
    for n in range(12):
        walled.create(n, job_id=f"f{n:02d}")
        finish(walled, f"f{n:02d}", "fulfilled")
        wall.advance(1500)  # 2-3 jobs an hour: pages cross buckets
    pages = [ids(walled.jobs(state="fulfilled", limit=5))]
    walled.create(99, job_id="newer")
    finish(walled, "newer", "fulfilled")  # newest: before the cursor, so not on a later page
    for _ in range(5):  # 3 pages, then an empty one
        page = ids(walled.jobs(state="fulfilled", limit=5, after=pages[-1][-1]))
        if not page:
            break
        pages.append(page)
    assert [j for page in pages for j in page] == [f"f{n:02d}" for n in reversed(range(12))]


def test_limit_caps_what_the_iterator_yields_and_none_is_no_limit(store: JobStore) -> None:
    for n in range(7):
        store.create(n)
    assert len(list(store.jobs(limit=3))) == 3
    assert len(list(store.jobs(limit=None))) == 7
    assert len(list(store.jobs())) == 7  # default 100


def test_the_queue_filter_lists_only_that_queue_in_every_state(store: JobStore) -> None:
    store.create(1, job_id="x-pending", queue="x")
    store.create(1, job_id="y-pending", queue="y")
    store.create(1, job_id="x-later", queue="x", delay=60)
    store.create(1, job_id="y-later", queue="y", delay=60)
    store.create(1, job_id="y-done", queue="y")
    lease = store.pull_work(queues="y")
    assert lease is not None and lease.id == "y-pending"
    lease.fulfill(1)
    running = store.pull_work(queues="y")
    assert running is not None and running.id == "y-done"
    assert ids(store.jobs(queue="x")) == ["x-pending", "x-later"]
    assert ids(store.jobs(queue="y")) == ["y-done", "y-later", "y-pending"]
    running.release()


def test_an_unknown_after_id_raises_job_not_found(store: JobStore) -> None:
    store.create(1, job_id="known")
    with pytest.raises(JobNotFound, match="nope"):
        store.jobs(after="nope")  # at the call, not at the first next()


@pytest.mark.parametrize("kwargs, named", [
    ({"state": "running"}, "state"),
    ({"state": 3}, "state"),
    ({"queue": "a.b"}, "queue"),
    ({"limit": 0}, "limit"),
    ({"limit": 10_001}, "limit"),
    ({"limit": True}, "limit"),
    ({"limit": "10"}, "limit"),
    ({"after": "no/slash"}, "after"),
    ({"after": 7}, "after"),
])
def test_bad_arguments_raise_invalid_request_naming_the_argument(store: JobStore, kwargs: dict[str, Any],
                                                                 named: str) -> None:
    with pytest.raises(InvalidRequest, match=named):
        store.jobs(**kwargs)


def test_a_retried_job_is_listed_once_by_its_new_entry_and_its_old_entry_is_passed_over(
        walled: JobStore, wall: FakeWall) -> None:
    def entries() -> list[str]:
        root = f"{walled.path}/finished"
        return [f"{root}/{b}/{n}" for b in os.listdir(root) for n in os.listdir(f"{root}/{b}")]

    walled.create(1, job_id="again")
    finish(walled, "again", "failed")
    (old,) = entries()
    wall.advance(60)
    walled.create(2, job_id="other")
    finish(walled, "other", "fulfilled")
    walled.retry("again")
    assert old not in entries()  # a retry unlinks its old life's entry...
    open(old, "x").close()  # ... which a crash just before that unlink leaves behind
    wall.advance(60)
    finish(walled, "again", "failed")  # a second entry, newer: the first is stale now
    assert sum(".again" in n for n in entries()) == 2
    assert ids(walled.jobs(state="failed")) == ["again"]
    assert ids(walled.jobs()) == ["again", "other"]


def test_a_stale_entry_is_unlinked_once_no_commit_can_still_be_publishing_it(walled: JobStore,
                                                                            wall: FakeWall) -> None:
    walled.create(1, job_id="gone")
    finish(walled, "gone", "fulfilled")
    os.unlink(f"{walled.path}/jobs/fulfilled/gone.json")  # removed by hand: its entry is stale
    bucket_dir = f"{walled.path}/finished"

    def entries() -> int:
        return sum(len(os.listdir(f"{bucket_dir}/{b}")) for b in os.listdir(bucket_dir))

    assert list(walled.jobs()) == []
    assert entries() == 1  # young: it could be a commit between its entry and its rename
    wall.advance(3600)
    assert list(walled.jobs()) == []
    assert entries() == 0


def test_a_job_that_moves_on_during_an_all_states_walk_is_yielded_once(store: JobStore) -> None:
    store.create(1, job_id="mover")
    store.create(2, job_id="stays")
    walk = store.jobs()
    first = next(walk)
    assert first.id == "mover" and first.state is JobState.PENDING
    lease = store.pull_work()
    assert lease is not None and lease.id == "mover"
    lease.fulfill("x")  # final now: the final phase of this walk meets it again
    assert [(j.id, j.state.value) for j in walk] == [("stays", "pending")]
    assert [(j.id, j.state.value) for j in store.jobs()] == [("stays", "pending"), ("mover", "fulfilled")]
