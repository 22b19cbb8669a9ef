"""store.purge(): removing the jobs an operator selects, across processes and crashes (issue 24, D5)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from conftest import FakeWall, files_under

from fsjobstore import InvalidRequest, JobNotFound, JobStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def finish(store: JobStore, job_id: str, how: str = "fulfilled") -> None:
    if how == "cancelled":
        store.cancel(job_id)
        return
    lease = store.pull_work()
    assert lease is not None and lease.id == job_id
    lease.log(f"ran {job_id}")  # a runs/<id>/ file, which must go with the job
    if how == "fulfilled":
        lease.fulfill({"done": job_id})
    else:
        lease.fail("boom", retry=False)


def gone_entirely(root: str, job_id: str) -> bool:
    """No file of the job is left anywhere in the store."""
    return not [f for f in files_under(root) if re.search(rf"(^|[/.]){re.escape(job_id)}([/.]|$)", f)]


@pytest.fixture
def wall() -> FakeWall:
    return FakeWall(time.time())


@pytest.fixture
def walled(open_store: Callable[..., JobStore], wall: FakeWall) -> JobStore:
    return open_store(wall_clock=wall, backoff=lambda a: 0.0)


def test_purge_removes_every_final_job_with_every_file_of_it(store: JobStore) -> None:
    for n, how in enumerate(["fulfilled", "failed", "cancelled"]):
        store.create(n, job_id=f"j{n}")
        finish(store, f"j{n}", how)
    store.create(9, job_id="waits")
    assert store.purge() == 3
    for n in range(3):
        assert gone_entirely(store.path, f"j{n}")
        with pytest.raises(JobNotFound):
            store.get(f"j{n}")
    assert store.get("waits").state.value == "pending"  # not a final state: untouched by default
    assert [f for f in files_under(f"{store.path}/tmp")] == []


def test_purge_by_state_removes_only_those_states(store: JobStore) -> None:
    for n, how in enumerate(["fulfilled", "failed", "cancelled", "failed"]):
        store.create(n, job_id=f"j{n}")
        finish(store, f"j{n}", how)
    store.create(0, job_id="later", delay=600)
    assert store.purge(states="failed") == 2
    assert [j.id for j in store.jobs()] == ["later", "j2", "j0"]
    assert store.purge(states=["scheduled", "cancelled"]) == 2
    assert [j.id for j in store.jobs()] == ["j0"]


def test_purge_by_queue_removes_only_that_queues_jobs(store: JobStore) -> None:
    for q in ("a", "b"):
        store.create(1, job_id=f"{q}-done", queue=q)
        lease = store.pull_work(queues=q)
        assert lease is not None
        lease.fulfill(1)
        store.create(1, job_id=f"{q}-waiting", queue=q)
    assert store.purge(states=("fulfilled", "pending"), queue="a") == 2
    assert sorted(j.id for j in store.jobs()) == ["b-done", "b-waiting"]


def test_purge_older_than_goes_by_when_a_final_job_finished(walled: JobStore, wall: FakeWall) -> None:
    walled.create(1, job_id="old")
    finish(walled, "old")
    wall.advance(2 * 3600)  # another bucket of the index
    walled.create(1, job_id="recent")
    finish(walled, "recent")
    wall.advance(60)
    assert walled.purge(older_than=timedelta(hours=1)) == 1
    assert [j.id for j in walled.jobs()] == ["recent"]
    assert walled.purge(older_than=30) == 1
    assert list(walled.jobs()) == []


def test_purge_older_than_goes_by_when_a_waiting_job_was_created(store: JobStore) -> None:
    store.create(1, job_id="first")
    store.create(1, job_id="first-later", delay=600)
    time.sleep(0.3)
    store.create(1, job_id="second")
    store.create(1, job_id="second-later", delay=600)
    assert store.purge(states=["pending", "scheduled"], older_than=0.2) == 2
    assert sorted(j.id for j in store.jobs()) == ["second", "second-later"]


def test_purge_match_searches_the_requests_stored_json_text_and_the_id(store: JobStore) -> None:
    store.create({"user": "ann", "n": 1}, job_id="one")
    store.create({"user": "bob", "n": 2}, job_id="two")
    store.create({"user": "bob", "n": 3}, job_id="ann-three")
    assert store.purge(states="pending", match='"user":"ann"') == 1  # compact, as stored
    assert store.purge(states="pending", match=re.compile(r"^ann-")) == 1  # the id
    assert [j.id for j in store.jobs()] == ["two"]


def test_a_dry_run_counts_what_would_go_and_changes_nothing(store: JobStore) -> None:
    for n in range(4):
        store.create(n, job_id=f"j{n}")
        finish(store, f"j{n}")
    store.create(1, job_id="waiting")
    before = files_under(store.path)
    assert store.purge(states=["fulfilled", "pending"], dry_run=True) == 5
    assert store.purge(dry_run=True, limit=2) == 2
    assert files_under(store.path) == before


def test_limit_stops_after_that_many_removals_oldest_first(walled: JobStore, wall: FakeWall) -> None:
    for n in range(5):
        walled.create(n, job_id=f"j{n}")
        finish(walled, f"j{n}")
        wall.advance(1)
    assert walled.purge(limit=2) == 2
    assert [j.id for j in walled.jobs()] == ["j4", "j3", "j2"]


def test_progress_hears_the_count_and_the_end(store: JobStore) -> None:
    for n in range(3):
        store.create(n)
    heard: list[int] = []
    assert store.purge(states="pending", progress=heard.append) == 3
    assert heard and heard[-1] == 3


def test_active_is_refused_a_running_job_is_never_purged(store: JobStore) -> None:
    store.create(1, job_id="running")
    lease = store.pull_work()
    with pytest.raises(InvalidRequest, match="running job is never purged; cancel it first"):
        store.purge(states=["fulfilled", "active"])
    assert lease is not None
    lease.fulfill(1)


@pytest.mark.parametrize("kwargs, named", [
    ({"states": "bogus"}, "states"),
    ({"states": []}, "states"),
    ({"states": 5}, "states"),
    ({"queue": "no.dots"}, "queue"),
    ({"older_than": -1}, "older_than"),
    ({"older_than": "7x"}, "older_than"),
    ({"match": "(unclosed"}, "match"),
    ({"match": re.compile(b"bytes")}, "match"),
    ({"match": 3}, "match"),
    ({"limit": 0}, "limit"),
    ({"limit": 1.5}, "limit"),
    ({"dry_run": "yes"}, "dry_run"),
    ({"progress": 3}, "progress"),
])
def test_bad_arguments_raise_invalid_request_naming_the_argument(store: JobStore, kwargs: dict[str, Any],
                                                                 named: str) -> None:
    store.create(1)
    with pytest.raises(InvalidRequest, match=named):
        store.purge(**kwargs)
    assert len(list(store.jobs())) == 1


def test_a_final_job_whose_notification_is_due_is_skipped_until_its_targets_have_heard(store: JobStore) -> None:
    store.create(1, job_id="told")
    store.queue("told", {"mail": "ann"})
    finish(store, "told")
    store.create(1, job_id="plain")
    finish(store, "plain")
    assert store.purge(dry_run=True) == 1
    assert store.purge() == 1
    assert store.get("told").waiting == ({"mail": "ann"},)
    lease = store.pull_notification()
    assert lease is not None and lease.id == "told"
    lease.done(lease.waiting)
    assert store.purge() == 1
    assert gone_entirely(store.path, "told")


def test_a_waiting_job_is_purged_with_its_queued_targets(store: JobStore) -> None:
    store.create(1, job_id="w")
    store.queue("w", "someone")
    assert store.purge(states="pending") == 1
    assert gone_entirely(store.path, "w")
    assert store.pull_notification() is None


def test_a_purged_id_can_be_created_again(store: JobStore) -> None:
    store.create("first life", job_id="reused")
    finish(store, "reused")
    assert store.purge() == 1
    job = store.create("second life", job_id="reused")
    assert store.get("reused").request == "second life" == job.request
    assert store.get("reused").state.value == "pending"


def test_a_purged_job_never_comes_back(store: JobStore, open_store: Callable[..., JobStore]) -> None:
    for n in range(3):
        store.create(n, job_id=f"j{n}")
        finish(store, f"j{n}")
    store.create(0, job_id="p")
    assert store.purge(states=["fulfilled", "pending"]) == 4
    other = open_store()
    other.recover()
    store.recover()
    assert list(other.jobs()) == []
    assert other.pull_work() is None
    for job_id in ("j0", "j1", "j2", "p"):
        with pytest.raises(JobNotFound):
            other.get(job_id)
        assert gone_entirely(store.path, job_id)


# -- across processes --------------------------------------------------------------------------
def run_child(code: str, *args: object) -> subprocess.Popen[str]:
    script = textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": REPO})


PURGER = """
    import sys
    from fsjobstore import JobStore
    root, states = sys.argv[1], sys.argv[2].split(",")
    with JobStore(root) as store:
        print(store.purge(states=states, progress=lambda done: None), flush=True)
"""


def fill_final(store: JobStore, n: int) -> list[str]:
    made = []
    for i in range(n):
        made.append(store.create(i, job_id=f"f{i:04d}").id)
    while (lease := store.pull_work()) is not None:
        lease.log("line")
        lease.fulfill(None)
    return made


def test_two_processes_purging_the_same_jobs_remove_each_once_and_their_counts_sum_to_the_total(
        store: JobStore) -> None:
    made = fill_final(store, 400)
    children = [run_child(PURGER, store.path, "fulfilled") for _ in range(2)]
    counts = [int(c.communicate(timeout=120)[0].strip()) for c in children]
    assert sum(counts) == len(made)
    assert all(gone_entirely(store.path, job_id) for job_id in made[::17])
    assert list(store.jobs(limit=None)) == []


def test_a_purge_while_a_worker_drains_the_queue_never_both_runs_and_purges_a_job(store: JobStore) -> None:
    made = [store.create(i, job_id=f"p{i:04d}").id for i in range(1500)]
    log = f"{store.path}.drain.log"
    worker = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "_proc.py"), "drain", store.path, log,
                               "0", "30"])  # fulfils each job with its token, and logs "ok <id> <token>"
    deadline = time.monotonic() + 30
    while not os.listdir(f"{store.path}/jobs/fulfilled") and time.monotonic() < deadline:
        time.sleep(0.01)  # until it drains
    purged = store.purge(states="pending")
    assert worker.wait(timeout=120) == 0
    with open(log) as fh:
        lines = [line.split() for line in fh]
    assert all(line[0] == "ok" for line in lines), lines  # no LeaseLost: a purge never takes a claimed job
    ran = {line[1]: line[2] for line in lines}
    assert ran and purged, "the two did not overlap"
    assert len(ran) + purged == len(made)
    assert len(ran) == len(lines)
    for job_id in made:
        if job_id in ran:
            assert store.get(job_id).value == ran[job_id]  # fulfilled, and not removed
        else:
            assert gone_entirely(store.path, job_id)


SLOW_PURGER = """
    import sys
    from fsjobstore import JobStore
    with JobStore(sys.argv[1]) as store:
        print("started", flush=True)
        store.purge()
"""


def files_of_each_job(root: str) -> dict[str, list[str]]:
    """Every file of the store under each job id its path names (``f0001`` in
    ``finished/<B>/<FIN>.<EXP>.fulfilled.default.f0001``, ``runs/f0001/...``, ``ids/f0001``)."""
    out: dict[str, list[str]] = {}
    for path in files_under(root):
        for part in set(re.split(r"[/.]", path)):
            out.setdefault(part, []).append(path)
    return out


@pytest.mark.parametrize("kill_after", [0.05, 0.15, 0.3])
def test_sigkill_during_a_purge_leaves_every_job_intact_or_gone_entirely_after_recovery(
        open_store: Callable[..., JobStore], root: str, kill_after: float) -> None:
    store = open_store(durable=False)
    made = fill_final(store, 1500)
    child = run_child(SLOW_PURGER, root)
    assert child.stdout is not None and child.stdout.readline().strip() == "started"
    time.sleep(kill_after)
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    open_store().recover()
    left = {j.id for j in store.jobs(limit=None)}
    assert 0 < len(left) < len(made), "the kill did not land mid-purge: change kill_after"
    files = files_of_each_job(root)
    for job_id in made:
        kinds = sorted({f.split("/")[0] for f in files.get(job_id, [])})
        if job_id in left:  # whole: its file, index entry, reservation and run log
            assert kinds == ["finished", "ids", "jobs", "runs"], (job_id, files.get(job_id))
        else:
            assert kinds == [], (job_id, files.get(job_id))
    assert files_under(f"{root}/tmp") == []
    assert store.purge() == len(left)  # what is left is whole: a purge removes it all


def test_a_stale_index_entry_of_a_job_finished_again_does_not_select_it(walled: JobStore, wall: FakeWall) -> None:
    walled.create(1, job_id="again")
    finish(walled, "again", "failed")
    wall.advance(2 * 3600)
    walled.retry("again")
    finish(walled, "again", "failed")  # a newer entry; the first one is stale now
    wall.advance(60)
    assert walled.purge(older_than=3600) == 0  # by its stale entry it finished 2 h ago: not so
    assert walled.get("again").state.value == "failed"
    assert walled.purge(older_than=30) == 1
