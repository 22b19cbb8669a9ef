"""Nothing leaves the store through a link, FIFO or file planted where a directory belongs (issue 23).

A member of a shared store's group can write every directory of it. Whatever such a member plants
at a directory's name (a symbolic link to a directory of someone else's, a FIFO, a plain file),
before a store opens or while it is open, every operation must leave the link's target untouched
(no file created, renamed, removed or read there) and no acknowledged job may be lost. The planted
entry is quarantined and a real directory made in its place, or the operation is refused with an
error; it never hangs.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from faultkit import hooked
from internals import pending_file

from fsjobstore import JobStore, JobStoreError
from fsjobstore._os import _beneath

JOB = "victim"  # the id whose targets/<id> and runs/<id> are planted
QUEUE = "q1"

# Every directory FORMAT.md lists ("Layout"), the per-queue, per-job ones included.
DIRECTORIES = [
    "jobs", "jobs/pending", f"jobs/pending/{QUEUE}", "jobs/scheduled", "jobs/active", "jobs/fulfilled",
    "jobs/failed", "jobs/cancelled", "jobs/notify", "targets", f"targets/{JOB}", "control",
    "control/paused", "control/cancel", "control/deadlines", "control/doorbell", "control/metrics", "runs",
    f"runs/{JOB}",
    "workers", "leases", "ids", "tmp", "quarantine", f"jobs/pending/{QUEUE}/BUCKET",
]
# BUCKET stands for the bucket (pending/<queue>/<P>.<S>/) the warm-up job is queued in, its name
# known only once it is made.


class Hung(Exception):
    pass


@pytest.fixture
def alarm() -> Iterator[None]:
    def ring(signum: int, frame: FrameType | None) -> None:
        raise Hung("an operation blocked for 30 s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(30)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _canary(base: Path) -> Path:
    """A directory of someone else's, holding what a store directory would hold."""
    canary = base / "canary"
    (canary / "default").mkdir(parents=True)
    (canary / "secret.json").write_text('{"format": 2, "id": "secret"}\n')
    (canary / "0001000.00000000000000000001.secret.json").write_text("{}\n")
    (canary / "default" / "0001000.00000000000000000002.deeper.json").write_text("{}\n")
    return canary


def _snapshot(root: Path) -> dict[str, tuple[float, bytes | None]]:
    """Names, contents and mtimes of everything below ``root``."""
    out: dict[str, tuple[float, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            data = Path(path).read_bytes() if name in filenames else None
            out[os.path.relpath(path, root)] = (st.st_mtime, data)
    return out


def _plant(store_root: Path, where: str, kind: str, canary: Path, aside: Path) -> None:
    """Replace the directory ``where`` (moving a real one aside, as a member could) with ``kind``.
    An open store's threads may make the directory again between the two steps (a heartbeat, a
    counts writer): then the new one goes aside too, and the plant is tried again."""
    path = store_root / where
    for attempt in range(20):
        if os.path.lexists(path):
            os.rename(path, aside / f"{where.replace('/', '~')}.{attempt}")
        try:
            if kind == "link":
                os.symlink(canary, path)
            elif kind == "fifo":
                os.mkfifo(path)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "wb") as planted:
                    planted.write(b"not a directory\n")
            return
        except FileExistsError:
            continue
    raise AssertionError(f"{where} was made again 20 times while it was being planted")


def _drive(store: JobStore, acked: set[str]) -> list[str]:
    """Every operation once; refusals (JobStoreError) are allowed, anything else is a failure."""
    problems: list[str] = []

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except JobStoreError:
            return None
        except Exception as exc:  # the point is to report it
            problems.append(f"{what}: {type(exc).__name__}: {exc}")
            return None

    for queue in ("default", QUEUE):
        job = attempt("create", lambda q=queue: store.create({"q": q}, queue=q))
        if job is not None:
            acked.add(job.id)
    job = attempt("create victim", lambda: store.create({"v": 1}, queue=QUEUE, job_id=JOB))
    if job is not None:
        acked.add(job.id)
    attempt("queue", lambda: store.queue(JOB, {"to": "a"}))
    attempt("queue", lambda: store.queue(JOB, {"to": "b"}))
    attempt("unqueue", lambda: store.unqueue(JOB, {"to": "b"}))
    attempt("pause", lambda: store.pause("default"))
    attempt("resume", lambda: store.resume("default"))
    attempt("publish_worker", lambda: store.publish_worker({"name": "w"}))
    attempt("workers", store.workers)
    for _ in range(4):
        lease = attempt("pull_work", lambda: store.pull_work(timeout=0))
        if lease is None:
            continue
        attempt("progress", lambda held=lease: held.progress(1, 2, "half"))
        attempt("log", lambda held=lease: held.log("a line"))
        if lease.id == JOB:
            attempt("fulfill", lambda held=lease: held.fulfill({"ok": True}))
        else:
            attempt("fail", lambda held=lease: held.fail("boom", retry=False))
    for job_id in sorted(acked - {JOB}):
        attempt("retry", lambda j=job_id: store.retry(j))
        attempt("cancel", lambda j=job_id: store.cancel(j, "planted"))
    note = attempt("pull_notification", lambda: store.pull_notification(timeout=0))
    if note is not None:
        attempt("done", lambda: note.done(list(note.waiting)))
    attempt("retract_worker", store.retract_worker)
    attempt("recover", lambda: store.recover(deep=True))
    attempt("statistics", store.statistics)
    attempt("count", lambda: store.count(QUEUE, "fulfilled", 0.5))
    attempt("counters", store.counters)
    return problems


def _lost(root: Path, acked: set[str]) -> list[str]:
    with JobStore(str(root), durable=False) as fresh:
        lost = []
        for job_id in sorted(acked):
            try:
                fresh.get(job_id)
            except JobStoreError:
                lost.append(job_id)
        return lost


@pytest.mark.usefixtures("alarm")
@pytest.mark.parametrize("kind", ["link", "fifo", "file"])
@pytest.mark.parametrize("where", DIRECTORIES)
@pytest.mark.parametrize("when", ["before_open", "while_open"])
def test_a_planted_entry_where_a_directory_belongs_is_never_followed_and_loses_no_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str, where: str, kind: str) -> None:
    # A cached directory is looked up again after this long; 0 makes a swap seen at once, so the
    # test shows the store's answer to it rather than the window (see the test after this one).
    monkeypatch.setattr(_beneath, "RECHECK_AFTER", 0.0)
    canary = _canary(tmp_path)
    before = _snapshot(canary)
    aside = tmp_path / "aside"
    aside.mkdir()
    root = tmp_path / "store"
    acked: set[str] = set()
    with JobStore(str(root), durable=False) as store:
        if where.endswith(JOB):  # the per-job directories exist once the job is queued and run
            (root / where).mkdir()
        else:
            warm = store.create({"warm": 1}, queue=QUEUE)  # caches filled, jobs/pending/q1 made
            if where.endswith("/BUCKET"):
                bucket = os.path.dirname(pending_file(str(root), warm.id, QUEUE))
                where = os.path.relpath(bucket, root)
        if when == "while_open":
            store.pull_work(timeout=0)  # a claim, so the hot directories are in use
            _plant(root, where, kind, canary, aside)
            problems = _drive(store, acked)
    if when == "before_open":
        _plant(root, where, kind, canary, aside)
        try:
            store = JobStore(str(root), durable=False)
        except JobStoreError as exc:  # refused: it must name what it refused
            assert where.split("/")[0] in str(exc)
            problems = []
        else:
            with store:
                problems = _drive(store, acked)
    assert problems == []
    assert _snapshot(canary) == before
    if os.path.lexists(root / where) and (root / where).is_dir() and not (root / where).is_symlink():
        assert _lost(root, acked) == []


@pytest.mark.usefixtures("alarm")
def test_a_directory_swapped_for_a_link_within_the_recheck_window_is_written_in_place_never_in_the_link(
        tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    before = _snapshot(canary)
    root = tmp_path / "store"
    with JobStore(str(root), durable=False) as store:
        for _ in range(2):  # the first one puts jobs/fulfilled's descriptor in the cache
            store.create({"warm": 1})
        warm = store.pull_work(timeout=0)
        assert warm is not None
        warm.fulfill("v")
        lease = store.pull_work(timeout=0)
        assert lease is not None
        moved = tmp_path / "moved-fulfilled"
        os.rename(root / "jobs" / "fulfilled", moved)
        os.symlink(canary, root / "jobs" / "fulfilled")
        lease.fulfill("v")  # within RECHECK_AFTER of the last look: the real directory, wherever it is
    assert _snapshot(canary) == before
    # In the real directory, where the member moved it (it went there before the recheck).
    assert sorted(os.listdir(moved)) == sorted([f"{warm.id}.json", f"{lease.id}.json"])


def test_a_store_leaves_no_directory_descriptor_open_after_close(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for i in range(20):
        with JobStore(str(tmp_path / f"s{i}"), durable=False) as store:
            store.create({"i": i})
            lease = store.pull_work(timeout=0)
            assert lease is not None
            lease.fulfill(None)
        shutil.rmtree(tmp_path / f"s{i}")
    assert len(os.listdir("/proc/self/fd")) <= before + 2


@pytest.mark.usefixtures("alarm")
def test_a_directory_planted_again_after_every_repair_is_refused_with_the_stores_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A member who plants again each time the store replaced the plant by a directory (the
    # hostile-member trial hit this): the store must give up with its own error naming the
    # directory, never a bare NotADirectoryError that callers would read as an answer.
    monkeypatch.setattr(_beneath, "RECHECK_AFTER", 0.0)
    canary = _canary(tmp_path)
    root = tmp_path / "store"
    with JobStore(str(root), durable=False) as store:
        store.create({"warm": 1})
        repair = _beneath.Root.repair

        def repair_then_plant_again(self: _beneath.Root, parent: int, name: str, rel: str) -> None:
            repair(self, parent, name, rel)
            if rel == "jobs/fulfilled":
                os.rmdir(root / rel)
                os.symlink(canary, root / rel)

        monkeypatch.setattr(_beneath.Root, "repair", repair_then_plant_again)
        os.rmdir(root / "jobs" / "fulfilled")
        os.symlink(canary, root / "jobs" / "fulfilled")
        lease = store.pull_work(timeout=0)
        assert lease is not None
        with pytest.raises(JobStoreError, match="jobs/fulfilled"):
            lease.fulfill("v")


def test_a_create_whose_temp_file_is_moved_away_raises_the_stores_error_and_acknowledges_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    # Past the recheck window (within it the cached descriptor follows the moved directory and
    # the job is published from there: the RACE FORMAT.md describes).
    monkeypatch.setattr(_beneath, "RECHECK_AFTER", 0.0)

    root = tmp_path / "store"
    moved = tmp_path / "moved-tmp"

    class MoveTmpAway:
        def before(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "rename" and str(args[0]).startswith(f"{root}/tmp/") and not moved.exists():
                os.rename(root / "tmp", tmp_path / "moved-tmp")  # as a member may
                os.mkdir(root / "tmp")

        def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
            pass

    with JobStore(str(root), durable=False) as store:
        with hooked(MoveTmpAway()), pytest.raises(JobStoreError):
            store.create({"n": 1})
        assert moved.exists()  # the hook did move it
        # Nothing acknowledged, nothing stored (in any queue's bucket)
        assert [files for _, _, files in os.walk(root / "jobs" / "pending") if files] == []


@pytest.mark.usefixtures("alarm")
@pytest.mark.parametrize("where", ["jobs", f"jobs/pending/{QUEUE}"])
def test_wakeups_never_watch_a_directory_through_a_planted_link(tmp_path: Path, where: str) -> None:
    # Wake-ups are hints, but a watch through a link would tell this process the names of files
    # made in a directory outside the store (and hold an inotify watch there). The new-directory
    # event is the race: a member swaps the new directory for a link before the watch is added.
    from fsjobstore._os._inotify import Waker

    canary = _canary(tmp_path)
    root = tmp_path / "store"
    seen: list[str] = []
    with JobStore(str(root), durable=False) as store:
        store.create({"warm": 1}, queue=QUEUE)
        _plant(root, where, "link", canary, tmp_path)
        waker = Waker(str(root / "jobs"), seen.append)
        waker.start()
        try:
            if waker.mechanism != "inotify":
                pytest.skip("inotify is not available here")
            waker._watch_tree(str(root / where))  # as on a new directory's event
            generation = waker.generation
            (canary / "default" / "new.json").write_text("{}\n")
            (canary / "new.json").write_text("{}\n")
            waker.wait(generation, 0.3)
        finally:
            waker.stop()
    assert [p for p in seen if "new.json" in p] == []
    assert not (root / where).is_symlink()  # quarantined, a directory in its place


class _MoveTmpAwayOnce:
    """A syscall hook that moves tmp/ away (as a member may) just before the first ``op`` whose
    source is a temp file with ``marker`` in its name."""

    def __init__(self, root: Path, op: str, marker: str) -> None:
        self.root, self.op, self.marker, self.moved = root, op, marker, False

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        src = str(args[0])
        if not self.moved and op == self.op and src.startswith(f"{self.root}/tmp/") and self.marker in src:
            self.moved = True
            os.rename(self.root / "tmp", self.root.parent / f"moved-tmp-{time.time_ns()}")

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        pass


def test_a_result_commits_and_its_notify_entry_is_made_even_when_tmp_is_moved_away_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(_beneath, "RECHECK_AFTER", 0.0)
    root = tmp_path / "store"
    with JobStore(str(root), durable=False) as store:
        job = store.create({"n": 1})
        store.queue(job.id, {"to": "web"})
        lease = store.pull_work(timeout=0)
        assert lease is not None
        hook = _MoveTmpAwayOnce(root, "rename", ".notify")
        with hooked(hook):
            lease.fulfill("v")
        assert hook.moved
        assert store.get(job.id).state.value == "fulfilled"
        note = store.pull_notification(timeout=0)
        assert note is not None and note.id == job.id


def test_a_target_whose_temp_file_is_moved_away_is_refused_never_silently_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(_beneath, "RECHECK_AFTER", 0.0)
    root = tmp_path / "store"
    with JobStore(str(root), durable=False) as store:
        job = store.create({"n": 1})
        hook = _MoveTmpAwayOnce(root, "link", ".aux.")
        with hooked(hook), pytest.raises(JobStoreError):
            store.queue(job.id, {"to": "web"})
        assert hook.moved


def _job_file(root: Path, state: str, job_id: str) -> Path:
    found = [p for p in (root / "jobs" / state).rglob("*.json") if job_id in p.name]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("chosen_id", [False, True])
@pytest.mark.parametrize("owner", ["someone_else", "the_store"])
def test_a_job_file_hard_linked_from_elsewhere_is_never_written_and_read_only_if_it_is_the_stores(
        tmp_path: Path, chosen_id: bool, owner: str) -> None:
    # With fs.protected_hardlinks = 0 a member can hard-link any file into the store (here: a
    # file holding a valid job, as a copy of a real one would). Appending a result to it would
    # write outside the store; reading someone else's file as a job would show it to members.
    # The store's own file hard-linked elsewhere (a `cp -al` backup, a member's second name for
    # a job) runs on a private copy. A caller-chosen id's file legitimately has a second link,
    # ids/<id>: it runs in place.
    if owner == "someone_else" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    root = tmp_path / "store"
    victim = tmp_path / "elsewhere.json"
    with JobStore(str(root), durable=False) as store:
        job = store.create({"n": 1}, job_id="chosen" if chosen_id else None)
        pending = _job_file(root, "pending", job.id)
        victim.write_bytes(pending.read_bytes())
        if owner == "someone_else":
            os.chown(victim, 54_321, 54_321)
        before = victim.read_bytes()
        planted = pending.with_suffix(".planting")
        os.link(victim, planted)
        os.rename(planted, pending)  # in place of the job file, as a member may
        lease = store.pull_work(timeout=0)
        if owner == "someone_else":
            assert lease is None
            assert any(job.id in name for name in os.listdir(root / "quarantine"))
        else:
            assert lease is not None and lease.id == job.id
            lease.fulfill("done")
            assert store.get(job.id).value == "done"
        ok = store.create({"n": 2}, job_id="chosen2" if chosen_id else None)
        lease = store.pull_work(timeout=0)
        assert lease is not None and lease.id == ok.id  # a job of ours still runs, ids/<id> and all
        lease.fulfill("done")
        assert store.get(ok.id).value == "done"
    assert victim.read_bytes() == before


def test_a_claimed_file_swapped_for_a_hard_link_after_the_claim_is_never_written(tmp_path: Path) -> None:
    from fsjobstore import LeaseLost

    root = tmp_path / "store"
    victim = tmp_path / "someone-elses.json"
    with JobStore(str(root), durable=False) as store:
        job = store.create({"n": 1})
        lease = store.pull_work(timeout=0)
        assert lease is not None
        active = _job_file(root, "active", job.id)
        victim.write_bytes(active.read_bytes())
        before = victim.read_bytes()
        os.link(victim, active.with_suffix(".planting"))
        os.rename(active.with_suffix(".planting"), active)
        with pytest.raises(LeaseLost):
            lease.fulfill("done")
    assert victim.read_bytes() == before


def test_publishing_a_worker_after_leases_was_moved_away_makes_a_new_identity_and_tells_held_leases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsjobstore import LeaseLost

    monkeypatch.setattr(_beneath, "RECHECK_AFTER", 0.0)
    root = tmp_path / "store"
    with JobStore(str(root), durable=False) as store:
        store.create({"n": 1})
        lease = store.pull_work(timeout=0)
        assert lease is not None
        store.publish_worker({"name": "w"})
        os.rename(root / "leases", tmp_path / "moved-leases")  # as a member may: our owner file goes too
        store.publish_worker({"name": "w"})  # never a bare OSError: a new owner identity
        assert [w.name for w in store.workers()] == ["w"]
        # Told, as by the heartbeat: its claim was made under the identity that went.
        assert isinstance(lease.compromised, LeaseLost)


def test_verify_never_writes_through_a_link_planted_in_place_of_its_scratch_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # verify(dir) works in a scratch directory it makes in ``dir``; in a shared directory a
    # member can move that away and plant a link to a directory of someone else's in its place
    # while the checks run. Done here as the first check, so every real check runs after it.
    from fsjobstore import verify
    from fsjobstore._os import _verify

    canary = _canary(tmp_path)
    before = _snapshot(canary)
    shared = tmp_path / "shared"
    shared.mkdir()
    aside = tmp_path / "aside"

    def swap(sub: str) -> Any:
        scratch = os.path.dirname(sub)
        os.rename(scratch, aside)
        os.symlink(canary, scratch)
        return _verify.VerifyCheck("swap", True, "swapped", False)

    monkeypatch.setattr(_verify, "CHECKS", (("swap", swap, False), *_verify.CHECKS))
    report = verify(str(shared))
    assert _snapshot(canary) == before
    assert [c.name for c in report.checks if not c.passed] == []  # the checks ran, in the real scratch
    assert not aside.exists() or os.listdir(aside) == []  # emptied through its descriptor, wherever it went


def test_a_run_log_swapped_for_a_hard_link_is_never_appended_to(tmp_path: Path) -> None:
    root = tmp_path / "store"
    victim = tmp_path / "someone-elses.log"
    victim.write_bytes(b"their lines\n")
    with JobStore(str(root), durable=False) as store:
        job = store.create({"n": 1})
        lease = store.pull_work(timeout=0)
        assert lease is not None
        lease.log("first")
        [log_file] = (root / "runs" / job.id).glob("*.jsonl")
        os.link(victim, log_file.with_suffix(".planting"))
        os.rename(log_file.with_suffix(".planting"), log_file)
        lease.log("second")
        lease.fulfill("v")
        assert "second" in log_file.read_text()
    assert victim.read_bytes() == b"their lines\n"


def test_a_target_queued_right_after_targets_was_moved_away_lands_in_one_directory_not_a_refusal(
        tmp_path: Path) -> None:
    # Within RECHECK_AFTER of a swap the cached targets/ is the moved directory: the mkdir of
    # targets/<id> and the link into it must reach the same one (the hostile-member trial saw
    # a quarter of its queue() calls refused when they did not).
    root = tmp_path / "store"
    with JobStore(str(root), durable=False) as store:
        job = store.create({"n": 1})
        store.queue(job.id, {"to": "a"})  # targets/ cached
        os.rename(root / "targets", tmp_path / "moved-targets")
        store.queue(job.id, {"to": "b"})
    assert len(os.listdir(tmp_path / "moved-targets" / job.id)) == 2
