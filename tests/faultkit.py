"""Shared machinery of the reliability suite: call-counting hooks, the operations under test,
and the invariant checker every crash, fault and power-loss test ends with.

The hooks plug into ``fsjobstore._os._syscalls`` (the one module every filesystem call goes through),
so "the N-th call of an operation" means the same thing in every test.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from internals import die_unlinked, freeze, temp_path

from fsjobstore import InvalidState, JobExists, JobStore
from fsjobstore._format._layout import (
    ACTIVE_RE,
    FINAL_RE,
    FINISHED_RE,
    PENDING_BUCKET_RE,
    PENDING_RE,
    SCHEDULED_RE,
    TMP_RE,
    bucket_of_name,
)
from fsjobstore._format._records import Record
from fsjobstore._os import _syscalls

CRASH_EXIT = 77


class CountingHook:
    """Counts the calls of the thread that made it; at call number ``at`` (1-based) runs
    ``action`` (raise, or die). Only that thread's: the store's background threads (heartbeat,
    recovery, the counters' flush) make calls of their own at moments no run repeats."""

    def __init__(self, at: int = 0, action: Callable[[str, tuple[Any, ...]], None] | None = None) -> None:
        self.at = at
        self.action = action
        self.calls = 0
        self.fired: str | None = None
        self.thread = threading.get_ident()

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if threading.get_ident() != self.thread:
            return
        self.calls += 1
        if self.calls == self.at and self.action is not None:
            self.fired = op
            self.action(op, args)

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        pass


def die_now(op: str, args: tuple[Any, ...]) -> None:
    os._exit(CRASH_EXIT)  # no cleanup, no flush: as close to kill -9 as Python gets


def raise_errno(code: int) -> Callable[[str, tuple[Any, ...]], None]:
    def action(op: str, args: tuple[Any, ...]) -> None:
        if code == errno.EINTR:
            raise InterruptedError(code, os.strerror(code))
        raise OSError(code, os.strerror(code), *[a for a in args if isinstance(a, str)][:1])
    return action


class hooked:
    """Context manager installing a hook for the duration of one operation."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    def __enter__(self) -> Any:
        _syscalls.set_hook(self.hook)
        return self.hook

    def __exit__(self, *exc: object) -> None:
        _syscalls.set_hook(None)


# == operations under test =========================================================================
@dataclass
class Ctx:
    """What a scenario's setup made, and what the caller was told (the acknowledged facts)."""

    jobs: list[str] = field(default_factory=list)  # acknowledged jobs (must survive)
    results: dict[str, str] = field(default_factory=dict)  # acknowledged final states
    lease: Any = None
    note: Any = None
    outcome: Any = None


def _job(store: JobStore, ctx: Ctx, **kw: Any) -> str:
    job = store.create({"n": len(ctx.jobs)}, **kw)
    ctx.jobs.append(job.id)
    return job.id


def _claimed(store: JobStore, ctx: Ctx) -> None:
    _job(store, ctx)
    ctx.lease = store.pull_work()
    assert ctx.lease is not None


def _final_with_target(store: JobStore, ctx: Ctx) -> None:
    _claimed(store, ctx)
    store.queue(ctx.lease.id, "t1")
    ctx.lease.fulfill(b"v")
    ctx.results[ctx.lease.id] = "fulfilled"


def _noted(store: JobStore, ctx: Ctx) -> None:
    _final_with_target(store, ctx)
    ctx.note = store.pull_notification()
    assert ctx.note is not None


def _dead_owner(store: JobStore, ctx: Ctx) -> None:
    """A claim and a temp file of an owner whose process is gone (its lock file removed)."""
    other = JobStore(store.path, durable=store.durable, backoff=lambda a: 0.0)
    _job(other, ctx)
    lease = other.pull_work()
    assert lease is not None
    freeze(other)
    tmp = temp_path(other, "new", "x.json")
    with open(tmp, "wb") as fh:
        fh.write(b"{}")
    die_unlinked(other)  # the flock is gone: the owner is dead to every prober
    _job(store, ctx)


class _Died(BaseException):
    """A setup's stand-in for its process dying at that instant."""


def _dead_committer(store: JobStore, ctx: Ctx) -> None:
    """An owner that died in a retry's commit after its fence: a ``.commit`` and its temp file."""
    other = JobStore(store.path, durable=store.durable, backoff=lambda a: 0.0)
    _job(other, ctx)
    lease = other.pull_work()
    assert lease is not None

    def die(*args: Any) -> None:
        raise _Died()

    other._core.tree.publish = die  # type: ignore[method-assign]
    with contextlib.suppress(_Died):
        lease.fail("boom")
    freeze(other)
    die_unlinked(other)


def _failed(store: JobStore, ctx: Ctx) -> None:
    _claimed(store, ctx)
    ctx.lease.fail("boom", retry=False)


def _retry(store: JobStore, ctx: Ctx) -> None:
    ctx.outcome = store.retry(ctx.lease.id)


def _retry_again(store: JobStore, ctx: Ctx) -> None:
    """After a fault: the retry again, unless the fault came after its publish (only an fsync
    failed), which left the job pending already."""
    try:
        _retry(store, ctx)
    except InvalidState:
        if store.get(ctx.lease.id).state.value != "pending":
            raise


def _nothing(store: JobStore, ctx: Ctx) -> None:
    pass


def _create(store: JobStore, ctx: Ctx) -> None:
    ctx.outcome = store.create({"new": True}).id


def _create_id(store: JobStore, ctx: Ctx) -> None:
    ctx.outcome = store.create({"new": True}, job_id="chosen").id


def _retry_create_id(store: JobStore, ctx: Ctx) -> None:
    """An id doubles as an idempotency key: after an unknown outcome, create again; JobExists
    then means the first try did store it, which must be true."""
    try:
        _create_id(store, ctx)
    except JobExists:
        store.get("chosen")


def _create_delayed(store: JobStore, ctx: Ctx) -> None:
    ctx.outcome = store.create({"new": True}, delay=3600).id


def _pull(store: JobStore, ctx: Ctx) -> None:
    ctx.lease = store.pull_work()
    ctx.outcome = ctx.lease


def _fulfill(store: JobStore, ctx: Ctx) -> None:
    ctx.lease.fulfill(b"done")


def _fail_retry(store: JobStore, ctx: Ctx) -> None:
    ctx.lease.fail("boom")


def _fail_final(store: JobStore, ctx: Ctx) -> None:
    ctx.lease.fail("boom", retry=False)


def _release(store: JobStore, ctx: Ctx) -> None:
    ctx.lease.release()


def _fulfill_by_id(store: JobStore, ctx: Ctx) -> None:
    store.fulfill(ctx.jobs[0], b"by-id")


def _retry_fulfill_by_id(store: JobStore, ctx: Ctx) -> None:
    try:
        _fulfill_by_id(store, ctx)
    except InvalidState:  # the first try committed; only its fsync failed
        got = store.get(ctx.jobs[0])
        assert got.value == b"by-id", got


def _queue(store: JobStore, ctx: Ctx) -> None:
    store.queue(ctx.jobs[0], "t2")


def _unqueue(store: JobStore, ctx: Ctx) -> None:
    ctx.outcome = store.unqueue(ctx.jobs[0], "t1")


def _queue_then_setup(store: JobStore, ctx: Ctx) -> None:
    _job(store, ctx)
    store.queue(ctx.jobs[0], "t1")


def _pull_note(store: JobStore, ctx: Ctx) -> None:
    ctx.note = store.pull_notification()
    ctx.outcome = ctx.note


def _done(store: JobStore, ctx: Ctx) -> None:
    ctx.note.done(ctx.note.waiting)


def _recover(store: JobStore, ctx: Ctx) -> None:
    ctx.outcome = store.recover()


def _final_kept_an_hour(store: JobStore, ctx: Ctx) -> None:
    """A final job with every file a job can have (ids/, runs/, a finished-index entry), kept
    for an hour: not acknowledged to survive, since the operation removes it."""
    store.create({"kept": 1}, job_id="kept-1", retain=3600)
    lease = store.pull_work()
    assert lease is not None and lease.id == "kept-1"
    lease.log("a line")
    lease.fulfill(b"v")
    ctx.outcome = "kept-1"


def _retention_later(store: JobStore, ctx: Ctx) -> None:
    """recover() two hours on: its retention pass removes the job."""
    real = store._core.wall
    store._core.wall = lambda: real() + 7200
    try:
        store.recover()
    finally:
        store._core.wall = real


def _remove(store: JobStore, ctx: Ctx) -> None:
    from fsjobstore._transitions._removal import remove_job
    core = store._core
    remove_job(core, store._hooks, core.layout.final_path("fulfilled", "kept-1"), "kept-1", drop_targets=False)


def _job_setup(store: JobStore, ctx: Ctx) -> None:
    _job(store, ctx)


def _claimed_bucket_gone(store: JobStore, ctx: Ctx) -> None:
    """A claimed job whose pending bucket was removed once emptied (as a listing does once its
    second is past): its release must make the bucket again."""
    _claimed(store, ctx)
    qdir = os.path.join(store.path, "jobs", "pending", "default")
    for bucket in os.listdir(qdir):
        os.rmdir(os.path.join(qdir, bucket))


def _job_behind_an_old_emptied_bucket(store: JobStore, ctx: Ctx) -> None:
    """A pending job, and before it an emptied bucket of a second long past whose stat has
    settled: the claim's listing removes that bucket on its way to the job."""
    _job(store, ctx)
    qdir = os.path.join(store.path, "jobs", "pending", "default")
    (live,) = os.listdir(qdir)
    old = os.path.join(qdir, f"{live[:7]}.{int(time.time()) - 100:011d}")
    os.mkdir(old, 0o700)
    os.utime(old, (time.time() - 60, time.time() - 60))


@dataclass(frozen=True)
class Scenario:
    name: str
    setup: Callable[[JobStore, Ctx], None]
    run: Callable[[JobStore, Ctx], None]
    # What a retry after a fault means for this operation (None: the op is simply run again).
    retry: Callable[[JobStore, Ctx], None] | None = None


def _retry_lease(method: str, *args: Any, **kw: Any) -> Callable[[JobStore, Ctx], None]:
    def retry(store: JobStore, ctx: Ctx) -> None:
        if ctx.lease is not None and not ctx.lease.finished:
            getattr(ctx.lease, method)(*args, **kw)
    return retry


def _retry_done(store: JobStore, ctx: Ctx) -> None:
    if ctx.note is not None and not ctx.note.finished:
        ctx.note.done(ctx.note.waiting)


SCENARIOS = [
    Scenario("create", _nothing, _create),
    Scenario("create_job_id", _nothing, _create_id, _retry_create_id),
    Scenario("create_delayed", _nothing, _create_delayed),
    Scenario("pull_work", _job_setup, _pull),
    Scenario("fulfill", _claimed, _fulfill, _retry_lease("fulfill", b"done")),
    Scenario("fail_retry", _claimed, _fail_retry, _retry_lease("fail", "boom")),
    Scenario("fail_final", _claimed, _fail_final, _retry_lease("fail", "boom", retry=False)),
    Scenario("release", _claimed, _release, _retry_lease("release")),
    Scenario("fulfill_by_id", _job_setup, _fulfill_by_id, _retry_fulfill_by_id),
    Scenario("queue", _job_setup, _queue),
    Scenario("queue_on_final", _final_with_target, _queue),
    Scenario("unqueue", _queue_then_setup, _unqueue),
    Scenario("pull_notification", _final_with_target, _pull_note),
    Scenario("done", _noted, _done, _retry_done),
    Scenario("recover", _dead_owner, _recover),
    Scenario("recover_commit", _dead_committer, _recover),
    Scenario("retry_final", _failed, _retry, _retry_again),
    Scenario("retention", _final_kept_an_hour, _retention_later),
    Scenario("remove_job", _final_kept_an_hour, _remove),
    Scenario("release_into_removed_bucket", _claimed_bucket_gone, _release, _retry_lease("release")),
    Scenario("pull_removing_emptied_bucket", _job_behind_an_old_emptied_bucket, _pull),
]
BY_NAME = {s.name: s for s in SCENARIOS}


# == the invariants ==============================================================================
def job_files(root: str) -> dict[str, list[tuple[str, str]]]:
    """id -> [(state, path)] for every job file in a state directory (names per the grammar)."""
    out: dict[str, list[tuple[str, str]]] = {}
    jobs = os.path.join(root, "jobs")

    def add(job_id: str, state: str, path: str) -> None:
        out.setdefault(job_id, []).append((state, path))

    for queue in _ls(os.path.join(jobs, "pending")):
        qdir = os.path.join(jobs, "pending", queue)
        for entry in _ls(qdir):
            m = PENDING_RE.match(entry)
            if m:  # written flat, as an older store did: the next claimer's listing moves it
                add(m["id"], "pending", os.path.join(qdir, entry))
            elif PENDING_BUCKET_RE.match(entry):  # pending/<queue>/<P>.<S>/<name>
                for name in _ls(os.path.join(qdir, entry)):
                    m = PENDING_RE.match(name)
                    if m and bucket_of_name(name) == entry:  # in another bucket it is no job
                        add(m["id"], "pending", os.path.join(qdir, entry, name))
    for name in _ls(os.path.join(jobs, "scheduled")):
        m = SCHEDULED_RE.match(name)
        if m:
            add(m["id"], "scheduled", os.path.join(jobs, "scheduled", name))
    for name in _ls(os.path.join(jobs, "active")):
        m = ACTIVE_RE.match(name)
        if m:
            add(m["id"], f"active.{m['kind']}", os.path.join(jobs, "active", name))
    for state in ("fulfilled", "failed", "cancelled"):
        for name in _ls(os.path.join(jobs, state)):
            m = FINAL_RE.match(name)
            if m:
                add(m["id"], state, os.path.join(jobs, state, name))
    return out


def _ls(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def check_store(root: str, ctx: Ctx, *, settled: bool, litter_ok: bool = False,
                power_loss_ok: bool = False) -> list[str]:
    """Problems found in the directory (empty list: all invariants hold).

    ``settled``: no live process is mid-operation and recovery has run, so there must be no
    claim of a dead owner, no half-done commit and no temp file left. ``litter_ok``: a live
    store just absorbed a fault, so a fenced copy it could not unlink may sit beside the job's
    published copy until its next recovery pass (FORMAT.md, "Faults"). ``power_loss_ok``: a
    store with durable=False after a power cut, where quarantined files (with the power-loss
    reason, checked by the caller) and final files without their result are expected.
    """
    problems: list[str] = []
    files = job_files(root)
    for job_id, places in files.items():
        extra = [s for s, _ in places if s in ("active.commit", "active.recover")]
        if len(places) != 1 and not (litter_ok and len(places) - len(extra) == 1):
            problems.append(f"job {job_id} is in {len(places)} places: {[p for _, p in places]}")
        for state, path in places:
            try:
                with open(path, "rb") as fh:
                    record = Record.from_bytes(fh.read())
            except (OSError, ValueError) as exc:
                problems.append(f"{os.path.relpath(path, root)} is not a whole job file: {exc}")
                continue
            if record.id != job_id:
                problems.append(f"{os.path.relpath(path, root)} holds job {record.id}")
            if state == "fulfilled" and record.value is None and not power_loss_ok:
                problems.append(f"fulfilled job {job_id} has no value")
            if settled and state.startswith("active.") and state != "active.json":
                problems.append(f"job {job_id} left in {state} after recovery")
    for job_id in ctx.jobs:
        if job_id not in files:
            problems.append(f"acknowledged job {job_id} is lost")
    for job_id, state in ctx.results.items():
        states = [s for s, _ in files.get(job_id, [])]
        if state not in states:
            problems.append(f"acknowledged result of {job_id} ({state}) is lost; it is {states}")
    if not power_loss_ok and not litter_ok:  # right after a fault, a removal may be midway
        problems += removal_leftovers(root, files)
    quarantine = _ls(os.path.join(root, "quarantine"))
    if quarantine and not power_loss_ok:
        problems.append(f"good files were quarantined: {quarantine}")
    if settled:
        leftovers = [n for n in _ls(os.path.join(root, "tmp")) if TMP_RE.match(n)]
        if leftovers:
            problems.append(f"temp files left after recovery: {leftovers}")
        for job_id in _ls(os.path.join(root, "targets")):
            final = any(s in ("fulfilled", "failed") for s, _ in files.get(job_id, []))
            waiting = _ls(os.path.join(root, "targets", job_id))
            indexed = os.path.exists(os.path.join(root, "jobs", "notify", f"{job_id}.json"))
            if final and waiting and not indexed:
                problems.append(f"final job {job_id} has targets waiting but no notify entry")
    return problems


def removal_leftovers(root: str, files: dict[str, list[tuple[str, str]]]) -> list[str]:
    """What a removal cut short would leave: a reservation, run logs or a finished-index entry
    of a job that has no file; and a final job without its index entry."""
    problems = [f"{where}/{job_id} names no job" for where in ("ids", "runs")
                for job_id in _ls(os.path.join(root, where)) if job_id not in files]
    indexed: set[tuple[str, str]] = set()
    for bucket in _ls(os.path.join(root, "finished")):
        for name in _ls(os.path.join(root, "finished", bucket)):
            m = FINISHED_RE.match(name)
            if m is None:
                problems.append(f"finished/{bucket}/{name} is not an index entry")
                continue
            indexed.add((m["id"], m["state"]))
            if m["id"] not in files:
                problems.append(f"finished/{bucket}/{name} names no job")
    for job_id, places in files.items():
        for state, _ in places:
            if state in ("fulfilled", "failed", "cancelled") and (job_id, state) not in indexed:
                problems.append(f"final job {job_id} ({state}) has no finished-index entry")
    return problems


def drain_survivors(store: JobStore, root: str, ctx: Ctx, *, power_loss_ok: bool = False) -> list[str]:
    """Claim and fulfil every job that is due, then check the store again: a state that only
    shows when a survivor is claimed (a queued file that already holds a result line, say)
    must not cost an acknowledged job or quarantine a good file."""
    for _ in range(1000):
        lease = store.pull_work()
        if lease is None:
            break
        lease.fulfill(b"drained")
    else:
        return ["drain: more than 1000 jobs were due"]
    return [f"after a drain: {p}" for p in check_store(root, ctx, settled=True, power_loss_ok=power_loss_ok)]


def full_cycle(store: JobStore) -> list[str]:
    """Create, claim, fulfil, queue, notify and finish a fresh job: the store must still work."""
    job = store.create({"cycle": True}, queue="cycle")
    store.queue(job.id, "cycle-target")
    lease = store.pull_work(queues="cycle")
    if lease is None or lease.id != job.id:
        return [f"full cycle: could not claim the fresh job (got {lease})"]
    lease.fulfill(b"ok")
    for _ in range(100):
        note = store.pull_notification()
        if note is None:
            return ["full cycle: the fresh job's notification was not offered"]
        if note.id == job.id:
            note.done(note.waiting)
            break
        note.done([])  # not delivered: set aside with a backoff (a release would offer it again first)
    got = store.get(job.id)
    if got.state.value != "fulfilled" or got.value != b"ok" or got.waiting:
        return [f"full cycle: the fresh job ended as {got}"]
    return []
