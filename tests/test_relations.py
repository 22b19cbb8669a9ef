"""Jobs that know about each other: unique keys, dependencies (``after=``) and groups, in one
process and across processes (FORMAT.md, "Unique keys", "Dependencies", "Groups")."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsjobstore import (
    InvalidRequest,
    InvalidState,
    JobExists,
    JobNotFound,
    JobState,
    JobStore,
    StorageError,
    WaitTimeout,
)
from fsjobstore._os import _syscalls


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(str(tmp_path / "s"), backoff=lambda attempt: 0.0) as s:
        yield s


def _run(store: JobStore, queues: list[str] | None = None, fail: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Claim and commit every job that becomes due, in order; the requests' "n" of each run."""
    ran = []
    while (lease := store.pull_work(queues=queues)) is not None:
        n = lease.request["n"]
        ran.append(n)
        if n in fail:
            lease.fail(f"{n} failed", retry=False)
        else:
            lease.fulfill(n)
    return ran


# -- unique keys --------------------------------------------------------------------------------------
def test_a_unique_key_makes_one_job_until_it_is_final_then_the_key_is_free(store: JobStore) -> None:
    first = store.create({"n": 1}, unique_key="report:2026-11")
    again = store.create({"n": 2}, unique_key="report:2026-11")
    assert again.id == first.id and again.request == {"n": 1} and again.unique_key == "report:2026-11"
    other = store.create({"n": 3}, unique_key="report:2026-12")
    assert other.id != first.id
    lease = store.pull_work()
    assert lease is not None and lease.id == first.id
    assert store.create({"n": 4}, unique_key="report:2026-11").id == first.id  # running: not final
    lease.fulfill("done")
    fresh = store.create({"n": 5}, unique_key="report:2026-11")
    assert fresh.id != first.id and fresh.state is JobState.PENDING
    assert store.statistics().pending == 2


def test_retry_of_a_job_whose_key_another_job_now_holds_is_refused(store: JobStore) -> None:
    old = store.create({"n": 1}, unique_key="k")
    store.cancel(old.id)
    new = store.create({"n": 2}, unique_key="k")
    with pytest.raises(InvalidState, match="held by job"):
        store.retry(old.id)
    assert store.get(old.id).state is JobState.CANCELLED
    store.cancel(new.id)
    assert store.retry(old.id).state is JobState.PENDING  # free again: it takes it back
    assert store.create({"n": 3}, unique_key="k").id == old.id


def test_a_bad_unique_key_is_refused_and_a_removed_jobs_key_entry_goes(store: JobStore, tmp_path: Path) -> None:
    for bad in ("", "x" * 513, "tab\there", 5):
        with pytest.raises(InvalidRequest, match="unique_key"):
            store.create(1, unique_key=bad)  # type: ignore[arg-type]
    job = store.create(1, unique_key="gone-soon")
    store.cancel(job.id)
    assert len(os.listdir(tmp_path / "s" / "unique")) == 1
    store.purge(states="cancelled")
    assert os.listdir(tmp_path / "s" / "unique") == []


def _make_unique(root: str, key: str, n: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    with JobStore(root) as s:
        out.put([s.create({"p": os.getpid(), "i": i}, unique_key=key).id for i in range(n)])


def test_processes_creating_one_key_at_once_make_one_job(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    JobStore(root).close()
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_make_unique, args=(root, "one", 20, out)) for _ in range(4)]
    for p in procs:
        p.start()
    ids = [i for _ in procs for i in out.get(timeout=60)]
    for p in procs:
        p.join(30)
    assert len(set(ids)) == 1
    with JobStore(root) as s:
        assert s.statistics().pending == 1


# -- dependencies -------------------------------------------------------------------------------------
def test_a_job_after_others_waits_until_they_are_all_fulfilled(store: JobStore) -> None:
    a, b = store.create({"n": "a"}), store.create({"n": "b"})
    c = store.create({"n": "c"}, after=[a.id, b.id])
    assert c.state is JobState.DEFERRED and c.after == (a.id, b.id)
    assert store.statistics().deferred == 1 and [j.id for j in store.jobs(state="deferred")] == [c.id]
    assert _run(store) == ["a", "b", "c"]
    assert store.get(c.id).state is JobState.FULFILLED


def test_a_deferred_job_fulfilled_by_id_lets_its_children_go_on_and_leaves_its_parents(store: JobStore) -> None:
    parent = store.create("p")
    middle = store.create("m", after=[parent.id])
    child = store.create("c", after=[middle.id])
    store.fulfill(middle.id, "done elsewhere")  # README: resolved, though its parent has not run
    assert store.get(middle.id).state is JobState.FULFILLED
    assert store.get(child.id).state is JobState.PENDING and store.get(parent.id).state is JobState.PENDING
    ran = []
    while (lease := store.pull_work()) is not None:
        ran.append(lease.id)
        lease.fulfill(None)
    assert sorted(ran) == sorted([parent.id, child.id])  # the parent's end finds its child final: no error
    assert os.listdir(os.path.join(store.path, "deps")) == []


def test_a_failed_parent_cancels_its_children_down_the_chain_saying_why(store: JobStore) -> None:
    a = store.create({"n": "a"})
    chain = [a]
    for i in range(50):
        chain.append(store.create({"n": i}, after=[chain[-1].id]))
    assert _run(store, fail={"a"}) == ["a"]
    child = store.get(chain[1].id)
    assert child.state is JobState.CANCELLED and f"its parent {a.id} failed" in (child.error or "")
    assert all(store.get(j.id).state is JobState.CANCELLED for j in chain[1:])
    assert os.listdir(os.path.join(store.path, "deps")) == []


def test_on_parent_failure_run_runs_it_anyway_and_a_cancelled_or_purged_parent_counts_as_failed(
        store: JobStore) -> None:
    a = store.create({"n": "a"})
    runs = store.create({"n": "runs"}, after=[a.id], on_parent_failure="run")
    stops = store.create({"n": "stops"}, after=[a.id])
    store.cancel(a.id)
    assert store.get(runs.id).state is JobState.PENDING
    assert "was cancelled" in (store.get(stops.id).error or "")
    p = store.create({"n": "p"}, queue="other")
    orphan = store.create({"n": "o"}, after=[p.id])
    assert store.purge(states="pending", queue="other") == 1
    assert "removed before it was fulfilled" in (store.get(orphan.id).error or "")


def test_a_job_after_fulfilled_parents_is_pending_at_once_and_after_unknown_ones_is_refused(
        store: JobStore) -> None:
    a = store.create({"n": "a"})
    store.fulfill(a.id, 1)
    assert store.create({"n": "b"}, after=[a.id]).state is JobState.PENDING
    with pytest.raises(JobNotFound, match="after names no job"):
        store.create(1, after=["no-such-job"])
    with pytest.raises(InvalidRequest, match="after"):
        store.create(1, after="not-a-list")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="on_parent_failure"):
        store.create(1, after=[a.id], on_parent_failure="maybe")


def test_a_fulfilled_parent_removed_by_retention_still_lets_its_waiting_child_run(tmp_path: Path) -> None:
    with JobStore(str(tmp_path / "s")) as store:
        a = store.create({"n": "a"}, retain=0)  # removed the moment it is final
        b = store.create({"n": "b"}, after=[a.id])
        assert _run(store) == ["a", "b"]
        with pytest.raises(JobNotFound):
            store.get(a.id)
        assert store.get(b.id).state is JobState.FULFILLED


def test_a_child_whose_resolution_a_crash_interrupted_is_resolved_by_recovery(store: JobStore) -> None:
    a = store.create({"n": "a"})
    b = store.create({"n": "b"}, after=[a.id])
    lease = store.pull_work()
    assert lease is not None
    deps = store._hooks.parents
    deps._resolve_children_of = lambda parent: None  # type: ignore[attr-defined]  # as if the committer died before resolving
    try:
        lease.fulfill("x")
    finally:
        del deps._resolve_children_of  # type: ignore[attr-defined]
    assert store.get(b.id).state is JobState.DEFERRED
    assert store.recover().children_resolved == 1
    assert store.get(b.id).state is JobState.PENDING


def test_a_recovery_sweep_lists_each_directory_once_however_many_parents_wait(
        store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Looked for one by one, every waiting parent cost a listing of active/ and more: on a
    # network filesystem (a dozen milliseconds a listing) a sweep of hundreds took minutes.
    parents = [store.create({"n": f"p{i}"}) for i in range(40)]
    lease = store.pull_work()  # one parent running, one final: the others pending
    assert lease is not None
    lease.fulfill("done")
    running = store.pull_work()
    assert running is not None
    children = [store.create({"n": f"c{i}"}, after=[p.id]) for i, p in enumerate(parents)]
    deps = store._hooks.parents
    deps._resolve_children_of = lambda parent: None  # type: ignore[attr-defined]  # its resolution cut short
    try:
        running.fulfill("done")
    finally:
        del deps._resolve_children_of  # type: ignore[attr-defined]
    listed: list[str] = []
    real = _syscalls.listdir
    monkeypatch.setattr(_syscalls, "listdir", lambda path: listed.append(path) or real(path))
    assert store.recover().children_resolved == 1
    repeated = {path: n for path, n in Counter(listed).items() if n > 6 and "/deps/" not in path}  # 40 parents
    assert [store.get(c.id).state for c in children[:2]] == [JobState.PENDING, JobState.PENDING]
    assert all(store.get(c.id).state is JobState.DEFERRED for c in children[2:])
    assert repeated == {}, f"listed again and again in one recovery pass: {repeated}"


def test_a_fault_on_one_parents_children_keeps_the_dependency_sweep_from_no_other_parents_children(
        store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a network filesystem while a brick heals: one child's file answers EIO for a while.
    parents = [store.create({"n": f"p{i}"}) for i in range(3)]
    children = [store.create({"n": f"c{i}"}, after=[p.id]) for i, p in enumerate(parents)]
    deps = store._hooks.parents
    deps._resolve_children_of = lambda parent: None  # type: ignore[attr-defined]  # its resolution cut short
    try:
        for _ in parents:
            lease = store.pull_work()
            assert lease is not None
            lease.fulfill("done")
    finally:
        del deps._resolve_children_of  # type: ignore[attr-defined]
    real, faults = deps.resolve, []

    def the_first_meets_eio(child: str) -> object:
        if not faults:
            faults.append(child)
            raise StorageError(errno.EIO, os.strerror(errno.EIO), "deferred")
        return real(child)
    monkeypatch.setattr(deps, "resolve", the_first_meets_eio)
    with pytest.raises(StorageError, match=r"(?i)input/output"):
        store.recover()
    assert {c.id: store.get(c.id).state for c in children} == {
        c.id: JobState.DEFERRED if c.id == faults[0] else JobState.PENDING for c in children}
    monkeypatch.undo()
    assert store.recover().children_resolved == 1
    assert {store.get(c.id).state for c in children} == {JobState.PENDING}


# -- groups -------------------------------------------------------------------------------------------
def test_a_group_is_made_at_once_and_a_chord_runs_after_all_of_it(store: JobStore) -> None:
    group = store.create_group([{"request": {"n": 1}}, {"request": {"n": 2}, "queue": "q"},
                                {"request": {"n": 3}, "after": [0, 1]}], group_id="batch-7")
    assert group.id == "batch-7" and [j.state for j in group.jobs] == [JobState.PENDING, JobState.PENDING,
                                                                       JobState.DEFERRED]
    assert all(j.group == "batch-7" for j in group.jobs)
    chord = store.create({"n": "sum"}, after=list(group.ids))
    with pytest.raises(JobExists):
        store.create_group([{"request": 1}], group_id="batch-7")
    with pytest.raises(WaitTimeout):
        store.wait_group("batch-7", timeout=0.1)
    assert sorted(_run(store, queues=["default", "q"]), key=str) == [1, 2, 3, "sum"]
    done = store.wait_group("batch-7", timeout=5)
    assert done.done and store.get(chord.id).state is JobState.FULFILLED


def test_a_group_with_a_bad_member_makes_nothing(store: JobStore) -> None:
    for bad, match in (([{"request": 1}, {"queue": "q"}], "has no request"),
                       ([{"request": 1, "job_id": "x"}], "cannot be given"),
                       ([{"request": 1, "unique_key": "x"}], "cannot be given"),
                       ([{"request": 1}, {"request": 2, "after": [1]}], "earlier members"),
                       ([{"request": 1, "after": ["nobody"]}], "after names no job"),
                       ([{"request": 1, "queue": "bad.name"}], "queue"), ([], "1 to"), ("x", "list")):
        with pytest.raises((InvalidRequest, JobNotFound), match=match):
            store.create_group(bad)  # type: ignore[arg-type]
    assert store.statistics().pending == 0 and not os.path.exists(os.path.join(store.path, "groups"))


MAKER = textwrap.dedent("""
    import os, sys
    from fsjobstore import JobStore
    store = JobStore(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    store.create_group([{"request": {"i": i}} for i in range(int(sys.argv[2]))], group_id=sys.argv[3])
    print("made", flush=True)
""")


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01, 0.03, 0.08])
def test_sigkill_in_the_middle_of_making_a_group_leaves_all_of_it_or_none_after_recovery(
        tmp_path: Path, delay: float) -> None:
    root = str(tmp_path / "s")
    JobStore(root).close()
    n = 60
    proc = subprocess.Popen([sys.executable, "-c", MAKER, root, str(n), "g"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write("go\n")
    proc.stdin.flush()
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    with JobStore(root) as store:
        store.recover()
        jobs = list(store.jobs(limit=None))
        assert len(jobs) in (0, n), f"a group of {n} left {len(jobs)} jobs"
        if jobs:
            assert len(store.get_group("g").jobs) == n
        else:
            with pytest.raises(JobNotFound):
                store.get_group("g")
        groups = os.path.join(root, "groups")
        assert not [m for m in (os.listdir(groups) if os.path.isdir(groups) else []) if m.endswith(".open")]


# -- the command line -------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True, timeout=60)


def test_the_cli_makes_unique_and_deferred_jobs_and_shows_them(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    parent = _cli("create", d, '{"n": 1}', "--init").stdout.strip()
    child = _cli("create", d, '{"n": 2}', "--after", parent, "--unique-key", "k").stdout.strip()
    again = _cli("create", d, '{"n": 3}', "--unique-key", "k")
    assert again.returncode == 0 and again.stdout.strip() == child
    assert f"unique key 'k' is held by job {child} (deferred): no job was made" in again.stderr
    shown = _cli("get", d, child).stdout
    assert "deferred" in shown and f"after       {parent}" in shown and "unique key  k" in shown
    listed = _cli("list", d, "--state", "deferred").stdout
    assert child in listed and parent not in listed
    assert "deferred 1" in _cli("status", d).stdout
    missing = _cli("create", d, "{}", "--after", "no-such-job")
    assert missing.returncode != 0 and "after names no job" in missing.stderr and "Traceback" not in missing.stderr
    bad = _cli("create", d, "{}", "--after", parent, "--on-parent-failure", "maybe")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_a_retried_child_waits_for_its_parent_again_and_is_refused_while_its_parent_failed(store: JobStore) -> None:
    parent = store.create({"n": 1})
    child = store.create({"n": 2}, after=[parent.id])
    store.cancel(child.id)
    again = store.retry(child.id)
    assert again.state is JobState.DEFERRED and store.get(child.id).state is JobState.DEFERRED
    assert _run(store) == [1, 2]  # the parent first, then the child: never the child alone
    failing = store.create({"n": 3})
    child2 = store.create({"n": 4}, after=[failing.id])
    assert _run(store, fail={3}) == [3]
    assert store.get(child2.id).state is JobState.CANCELLED
    with pytest.raises(InvalidState, match="would be cancelled again"):
        store.retry(child2.id)
    assert store.get(child2.id).state is JobState.CANCELLED  # put back as it was
    store.retry(failing.id)
    assert store.retry(child2.id).state is JobState.DEFERRED
    assert _run(store) == [3, 4]


def test_bulk_retry_says_which_jobs_the_store_refused_and_why(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    with JobStore(d) as store:
        first = store.create({"n": 1}, unique_key="R")
        lease = store.pull_work()
        assert lease is not None and lease.id == first.id
        lease.fail("no", retry=False)
        store.create({"n": 2}, unique_key="R")  # holds R now
    out = _cli("retry", d, "--state", "failed")
    assert out.returncode == 0, out.stderr
    assert "retried 0 failed jobs; refused 1 (the first:" in out.stdout and "unique key 'R' is held" in out.stdout
    assert "moved on" not in out.stdout
    doc = _cli("retry", d, "--state", "failed", "--json")
    assert json.loads(doc.stdout) == {"retried": 0, "skipped": 0, "refused": 1}
    cancelled = _cli("cancel", d, "--state", "deferred", "--json")
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["cancelled"] == 0


class _PauseBeforeDeferred:
    """Holds the thread making a child at the rename that publishes it into ``deferred/`` (its
    ``deps/`` entries made), until let go: the window in which its parents may end."""

    def __init__(self) -> None:
        import threading

        self.thread = threading.get_ident()
        self.reached, self.go = threading.Event(), threading.Event()

    def before(self, op: str, args: tuple[object, ...]) -> None:
        import threading

        if (threading.get_ident() == self.thread and op == "rename" and len(args) > 1
                and "/deferred/" in str(args[1]) and not self.reached.is_set()):
            self.reached.set()
            self.go.wait(10)

    def after(self, op: str, args: tuple[object, ...], result: object) -> None:
        pass


@pytest.mark.parametrize("parents", [1, 2])
def test_a_parent_that_ends_while_its_child_is_being_made_never_leaves_the_child_waiting(
    store: JobStore, parents: int
) -> None:
    import threading

    from fsjobstore._os import _syscalls

    made = [store.create(f"parent {k}") for k in range(parents)]
    leases = [store.pull_work() for _ in made]
    child: list[str] = []

    def make() -> None:
        hook.thread = threading.get_ident()
        child.append(store.create("child", after=[p.id for p in made]).id)

    hook = _PauseBeforeDeferred()
    _syscalls.set_hook(hook)
    try:
        maker = threading.Thread(target=make)
        maker.start()
        assert hook.reached.wait(10)
        leases[0].fulfill(b"")  # type: ignore[union-attr]  # resolves the children it finds: not this one yet
    finally:
        hook.go.set()
        maker.join()
        _syscalls.set_hook(None)
    for lease in leases[1:]:
        assert store.get(child[0]).state is JobState.DEFERRED  # still waits for the others
        lease.fulfill(b"")  # type: ignore[union-attr]
    assert store.get(child[0]).state is JobState.PENDING
