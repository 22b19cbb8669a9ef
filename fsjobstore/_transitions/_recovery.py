"""Recovery: return the jobs of dead, expired or overdue holders, finish or undo half-done
commits, remove what dead processes left, break stale locks, and quarantine what cannot be read.

Every step claims what it repairs with a rename first (the same fencing as a worker's commit),
so several processes may recover the same store at once: for each item exactly one wins the
rename and the others see ENOENT and move on. Running it twice changes nothing the second time.

An owner is *gone* when it is dead (its lock is free, where locks are trusted; or its file is
gone) or, in a heartbeat-only store, expired (its heartbeat stopped for a lease): everything it
left is cleaned up. Where locks are trusted, an expired owner's claims are taken (they may be
stuck) but nothing else of it is touched, since it is alive and may resume mid-create. A claim
is taken over by ``_takeover``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core import _worker_registry as registry
from .._core._control import Control
from .._core._core import Core
from .._core._hooks import Hooks, Sweep
from .._core._liveness import NotifyLock, break_if_expired
from .._core._quarantine import made_here
from .._errors import JobExists
from .._format._layout import (
    ACTIVE_RE,
    BELL_RE,
    EAR_RE,
    FINAL_RE,
    NOTIFY_LOCK_RE,
    OWNER_RE,
    TARGET_RE,
    TMP_RE,
    token_owner,
)
from .._format._records import Record
from .._os import _files as fs
from .._os import _syscalls as sc
from .._os._beneath import DISCONNECTED
from ._create import publish_new
from ._notify import Notifier
from ._power_loss import deep_pass
from ._removal import finish_gone, finish_unfinished
from ._takeover import quarantine_job, take_over

log = logging.getLogger("fsjobstore")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What one :meth:`JobStore.recover` pass did."""

    requeued: int = 0  # claims of dead, expired or overdue holders returned to pending
    failed: int = 0  # ... of which had no attempts left and became final "failed"
    timed_out: int = 0  # claims taken whose attempt ran past its time limit (counted above too): overrun
    # by a further lease_duration (even a live holder's), or held by a dead or hung holder
    cancelled: int = 0  # claims of gone holders whose job was to be cancelled: now cancelled
    commits_finished: int = 0  # half-done commits completed from their durable temp file
    duplicates_dropped: int = 0  # leftover copies of a job that exists elsewhere
    temp_files_removed: int = 0
    creates_finished: int = 0  # create(job_id=...) interrupted after reserving the id
    locks_removed: int = 0  # owner files of gone owners, and notification locks nobody holds
    workers_removed: int = 0  # worker entries of gone workers
    notifications_restored: int = 0
    quarantined: int = 0  # files this pass moved aside (quarantine/), whichever step met them; each logged once
    # Job files a power cut left without their data (a store made with durable=False): each is
    # quarantined with the reason, and that job, in whatever state it was (queued, running or
    # final, its result included), is lost. lost_to_power_loss counts them (also counted in
    # quarantined); lost_ids names them, the first MAX_LOST_IDS of one pass.
    lost_to_power_loss: int = 0
    lost_ids: tuple[str, ...] = ()
    removed: int = 0  # jobs removed: retention's, and removals others began and did not finish
    indexed: int = 0  # final jobs given their missing finished-index entry (explicit recover() only)
    children_resolved: int = 0  # jobs waiting for parents that had ended: promoted or cancelled (_dependencies)
    waiting_promoted: int = 0  # jobs parked by a limit moved back to their queue, room having freed (_limit_gate)


class Counts(dict[str, int]):
    """The counters of one pass, and the ids of the jobs it found lost to a power cut
    (``_power_loss.note_lost`` fills both)."""

    def __init__(self) -> None:
        super().__init__({f.name: 0 for f in dataclasses.fields(RecoveryReport) if f.name != "lost_ids"})
        self.lost_ids: list[str] = []


def new_counts() -> Counts:
    """Zeroed counters, one per :class:`RecoveryReport` field."""
    return Counts()


def recover(core: Core, hooks: Hooks, notifier: Notifier, control: Control, *,
            deep: bool | None = False) -> RecoveryReport:
    """One pass of every repair. ``deep`` also looks for jobs a power cut emptied, in stores
    that do not fsync (it reads the size of every job file: done by every explicit
    ``recover()``; with None once per boot of the host, as :func:`boot_pass` does)."""
    counts = new_counts()
    quarantined_before = made_here()
    me = core.owner_id()
    steps = _Steps()
    counts["duplicates_dropped"] += steps.run("litter", core.sweep_litter, default=0)
    counts["removed"] += steps.run("unfinished removals", finish_unfinished, core, hooks, default=0)
    # What the store promises decides, not what this process does: a process that fsyncs in a
    # store that does not still meets the files others wrote without fsync.
    emptiable = not core.settings.store_durable
    if emptiable and deep is not False:  # None: deep once per boot (_power_loss.deep_pass)
        steps.run("power-loss pass", deep_pass, core, counts, explicit=deep is True, default=None)
    # Without the deadlines' step, no live holder's overdue claim is taken this pass: the next does.
    no_deadlines: dict[tuple[str, str], float] = {}
    overdue = steps.run("deadlines", _sweep_deadlines, core, hooks, notifier, control, me, counts, steps,
                        default=no_deadlines)
    steps.run("claims", _sweep_active, core, hooks, notifier, control, me, overdue, counts, steps, default=None)
    steps.run("temp files", _sweep_tmp, core, hooks, me, counts, steps, default=None)
    steps.run("locks", _sweep_leases, core, me, counts, steps, default=None)
    steps.run("bells", _sweep_bells, core, me, counts, default=None)
    counts["workers_removed"] += steps.run("workers", registry.sweep, core, me, default=0)
    steps.run("notification targets", _sweep_targets, core, notifier, counts, steps, default=None)
    steps.run("cancel requests", _sweep_cancels, core, control, steps, default=None)
    # The features' sweeps (a group's maker that died, children of parents that ended, jobs
    # parked by a limit with room now): each adds to its count of the report.
    for name, feature_sweep in hooks.sweeps:
        sweep = Sweep(deep=deep is not False, gone=lambda owner: owner != me and _gone(core, owner),
                      publish=lambda record: _publish_member(core, hooks, record),
                      each=functools.partial(steps.each, name))
        counts[name] += steps.run(name, feature_sweep, sweep, default=0)
    if steps.first is not None:
        raise steps.first
    # Every file this pass moved aside, whichever step did it (a deferred job's file by the
    # dependency sweep, a second copy met by a take-over): the count and the warnings agree.
    counts["quarantined"] = made_here() - quarantined_before
    return RecoveryReport(**counts, lost_ids=tuple(counts.lost_ids))


class _Steps:
    """The steps of one pass, each tried whatever the others met, and within a step each file:
    a fault on one (ESTALE or EIO on one file while a network filesystem heals, a file planted
    where a step looks) must not keep the others from their work. Every repair is safe on its own
    (each claims what it repairs with a rename first), so one that failed is simply made again by
    the next pass. The first error is raised once every step was tried; any later one is logged.
    A lost connection (ENOTCONN, ECONNABORTED) ends the pass at once: every repair would fail the
    same way."""

    def __init__(self) -> None:
        self.first: Exception | None = None

    def run(self, name: str, step: Callable[..., T], *args: Any, default: T, **kwargs: Any) -> T:
        """A whole step; ``default`` is what it returns if it failed."""
        with self.each(name):
            return step(*args, **kwargs)
        return default

    @contextlib.contextmanager
    def each(self, name: str, what: str = "") -> Iterator[None]:
        """One repair of step ``name`` (``what``: on which file, for the log), or the whole step;
        a fault in it is kept or logged, and the step goes on to its next file."""
        try:
            yield
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno in DISCONNECTED:
                raise
            if self.first is None:
                self.first = exc
            else:
                log.warning("recovery: the %s step failed too%s, the pass goes on: %s", name,
                            f" (on {what})" if what else "", exc)


def boot_pass(core: Core, stop: Callable[[], bool]) -> int:
    """The deep pass alone, once per boot of the host (``_power_loss.deep_pass``), for a store that
    does not fsync; made by a long-lived store's retention thread, so no pull waits for it (it
    reads every job file's size). Returns how many job files it found emptied (each is
    quarantined and logged)."""
    if core.settings.store_durable:
        return 0
    counts = new_counts()
    try:
        deep_pass(core, counts, explicit=False, stop=stop)
    except Exception:
        log.exception("the pass looking for job files a power cut emptied failed; the next process makes it")
    return counts["lost_to_power_loss"]


def _publish_member(core: Core, hooks: Hooks, record: Record) -> None:
    """A member of a group whose maker died after its manifest (``_groups``): published as its
    maker would have, once."""
    with contextlib.suppress(JobExists):
        publish_new(core, hooks, record, explicit=True, member=True)


def _gone(core: Core, owner: str) -> bool:
    """Everything the owner left may be cleaned up (see the module docstring)."""
    status = core.probe.status(owner)
    return status == "dead" or (status == "expired" and not core.probe.trust_locks)


# == claims =========================================================================================
def _sweep_deadlines(core: Core, hooks: Hooks, notifier: Notifier, control: Control, me: str,
                     counts: dict[str, int], steps: _Steps) -> dict[tuple[str, str], float]:
    """Take over attempts that ran past their time limit by more than a lease, whoever holds
    them, alive or not: their holder's commit is fenced. Forget deadlines whose claim ended.
    Returns the (job, token) pairs whose deadline has passed at all, with that deadline."""
    now, grace = core.wall(), core.settings.lease_duration
    passed: dict[tuple[str, str], float] = {}
    active = set(fs.scan_names(core.layout.active))
    for due, job_id, token, path in control.deadlines():
        names = [n for n in (f"{job_id}.{token}.{k}" for k in ("json", "commit", "recover")) if n in active]
        if not names:
            control.clear_deadline(path)  # its claim ended (a crash between commit and cleanup)
            continue
        if due > now:
            continue
        passed[job_id, token] = due
        if due + grace > now or token_owner(token) == me:
            continue  # its own runtime ends it first; our own threads are watched by our runtime
        before = counts["requeued"] + counts["failed"]
        with steps.each("deadlines", names[0]):
            take_over(core, hooks, notifier, control, os.path.join(core.layout.active, names[0]), job_id, token,
                      names[0].rsplit(".", 1)[1], f"it ran {now - due:.0f} s past its time limit", counts,
                      timed_out=True, deadline=due)
        counts["timed_out"] += counts["requeued"] + counts["failed"] - before
    return passed


def _sweep_active(core: Core, hooks: Hooks, notifier: Notifier, control: Control, me: str,
                  overdue: dict[tuple[str, str], float], counts: dict[str, int], steps: _Steps) -> None:
    for name in fs.scan_names(core.tree.layout.active):
        with steps.each("claims", name):
            _take_if_gone(core, hooks, notifier, control, me, overdue, counts, name)


def _take_if_gone(core: Core, hooks: Hooks, notifier: Notifier, control: Control, me: str,
                  overdue: dict[tuple[str, str], float], counts: dict[str, int], name: str) -> None:
    """One claim of ``active/``: taken over if its holder is gone."""
    tree = core.tree
    m = ACTIVE_RE.match(name)
    path = os.path.join(tree.layout.active, name)
    if not m:
        tree.quarantine(path, "unrecognised name in jobs/active")
        return
    owner = token_owner(m["token"])
    if owner == me:
        return  # our own threads hold it; we are alive by definition
    status = core.probe.status(owner)
    if status == "alive":
        return
    why = "its process exited" if status == "dead" else "its heartbeat stopped"
    # Past its deadline, a dead holder was most likely killed for it by its worker runtime
    # (processes mode): a time-out, told as the thread runtime tells one.
    deadline = overdue.get((m["id"], m["token"]))
    timed_out = deadline is not None
    before = counts["requeued"] + counts["failed"]
    take_over(core, hooks, notifier, control, path, m["id"], m["token"], m["kind"], why, counts,
              timed_out=timed_out, deadline=deadline)
    if timed_out:
        counts["timed_out"] += counts["requeued"] + counts["failed"] - before


# == what gone processes left =======================================================================
def _sweep_tmp(core: Core, hooks: Hooks, me: str, counts: dict[str, int], steps: _Steps) -> None:
    tree = core.tree
    claimed: set[str] | None = None  # ids with an entry in active/, listed once if needed
    for name in fs.scan_names(tree.layout.tmp):
        path = os.path.join(tree.layout.tmp, name)
        m = TMP_RE.match(name)
        if not m:
            tree.quarantine(path, "unrecognised name in tmp")
            continue
        owner = token_owner(m["token"])
        # Only a gone owner's temp files go: a live producer may be between write and rename.
        if owner == me or not _gone(core, owner):
            continue
        if m["purpose"] == "newid":
            with steps.each("temp files", name):
                _finish_create(core, path, counts)
        elif m["purpose"] == "gone" and FINAL_RE.match(m["rest"]):
            # A removal whose remover died after its fence: finish it, never publish it back.
            with steps.each("temp files", name):
                finish_gone(core, hooks, path, m["rest"][: -len(".json")])
                counts["removed"] += 1
        elif m["purpose"] == "commit" and m["rest"].split(".", 1)[0] in (
                claimed := _claimed_ids(core) if claimed is None else claimed):
            # RACE: a ".commit" of its claim (or a take-over of one, renamed) may still be
            # finished from it by whoever takes it over; gone from under it, the ".commit"
            # would be taken for published and dropped. It goes once its job has left active/.
            continue
        elif fs.unlink(path):
            counts["temp_files_removed"] += 1


def _claimed_ids(core: Core) -> set[str]:
    return {m["id"] for m in map(ACTIVE_RE.match, fs.scan_names(core.layout.active)) if m}


def _finish_create(core: Core, path: str, counts: dict[str, int]) -> None:
    """A create(job_id=...) that died after reserving the id (a hard link in ids/) but before
    publishing: publish it, since the id is now taken and nobody else can create that job."""
    tree = core.tree
    try:
        st = sc.lstat(path)
        if st.st_nlink < 2:
            # Never reserved: the create died before acknowledging anything, perhaps mid-write.
            if fs.unlink(path):
                counts["temp_files_removed"] += 1
            return
        record = tree.read_record(path)
    except FileNotFoundError:
        return
    except (fs.Unreadable, ValueError) as exc:
        quarantine_job(core, path, f"temp job file {exc}", exc, counts)
        return
    # RACE: another recoverer may publish this very file between our read and this look (two
    # processes recovering at once, on one host or two): its new name is the same file, not a
    # copy, and giving the reservation back then would leave a published job whose id is free
    # and which get() cannot find (seen on GlusterFS). A copy that is another file means the id
    # was taken; one found while our temp name is gone means someone else moved ours on.
    if tree.exists_elsewhere(record.id, path, st) and fs.names_file(path, st):
        # A create that found its (generated-looking) id taken, and died before it gave the
        # reservation back: give it back now, so the id never names this refused job.
        _unlink_if_same_file(tree.layout.id_marker(record.id), st)
        if fs.unlink(path):
            counts["temp_files_removed"] += 1
        return
    due = record.not_before is not None and record.not_before > core.wall()
    with contextlib.suppress(FileNotFoundError):
        tree.publish(path, record, "scheduled" if due else "pending")
        counts["creates_finished"] += 1


def _unlink_if_same_file(path: str, st: os.stat_result) -> None:
    if fs.names_file(path, st):
        fs.unlink(path)


def _sweep_leases(core: Core, me: str, counts: dict[str, int], steps: _Steps) -> None:
    for name in fs.scan_names(core.layout.leases):
        if not name.startswith("."):  # an owner being born (see OwnerLease): never judged
            with steps.each("locks", name):
                _sweep_lease(core, me, counts, name)


def _sweep_lease(core: Core, me: str, counts: dict[str, int], name: str) -> None:
    """One file of ``leases/``: removed if its owner or holder is gone."""
    tree = core.tree
    path = os.path.join(tree.layout.leases, name)
    if not fs.is_regular(path):
        tree.quarantine(path, "not a regular file in leases")
        return
    m = OWNER_RE.match(name)
    if m:
        if m["owner"] != me and _gone(core, m["owner"]) and fs.unlink(path):
            core.probe.forget(m["owner"])
            counts["locks_removed"] += 1
        return
    if NOTIFY_LOCK_RE.match(name):
        # A free lock proves its holder died only where locks are trusted; heartbeat-only
        # stores wait for the holder's heartbeat to stop instead.
        lock = NotifyLock.try_acquire(path, me, tree.perms.file_mode) if core.probe.trust_locks else None
        if lock is not None:
            lock.release()
            counts["locks_removed"] += 1
            return
        if break_if_expired(path, me, core.probe):
            counts["locks_removed"] += 1
        return
    tree.quarantine(path, "unrecognised name in leases")


def _sweep_bells(core: Core, me: str, counts: dict[str, int]) -> None:
    for name in fs.scan_names(core.layout.doorbell):
        m = BELL_RE.match(name) or EAR_RE.match(name)
        if m and m["owner"] != me and _gone(core, m["owner"]):
            counts["temp_files_removed"] += fs.unlink(os.path.join(core.layout.doorbell, name))


def _sweep_targets(core: Core, notifier: Notifier, counts: dict[str, int], steps: _Steps) -> None:
    """A crash between publishing a final job and indexing its notification leaves targets
    that nobody would deliver: index them again."""
    for job_id in fs.scan_names(core.layout.targets):
        with steps.each("notification targets", job_id):
            _restore_targets(core, notifier, counts, job_id)


def _restore_targets(core: Core, notifier: Notifier, counts: dict[str, int], job_id: str) -> None:
    tree, lay = core.tree, core.layout
    tdir = lay.target_dir(job_id)
    if not FINAL_RE.match(job_id + ".json") or not fs.is_real_dir(tdir):
        tree.quarantine(tdir, "unrecognised entry in targets")
        return
    # Most target directories belong to jobs still running: two stats rule them out, so a
    # periodic sweep stays cheap when many jobs have targets waiting.
    if not tree.is_final(job_id) or sc.lexists(lay.notify_path(job_id)):
        return
    names = fs.scan_names(tdir)
    for name in names:
        if not TARGET_RE.match(name):
            tree.quarantine(os.path.join(tdir, name), "unrecognised target name")
    if not any(TARGET_RE.match(n) for n in names):
        with contextlib.suppress(OSError):
            sc.rmdir(tdir)
        return
    notifier.after_final(job_id)
    counts["notifications_restored"] += 1


def _sweep_cancels(core: Core, control: Control, steps: _Steps) -> None:
    """Forget cancel requests of jobs that ended (or never existed): a request that came too
    late, or whose job ended while its canceller died between request and check."""
    for job_id in control.cancel_requests():
        with steps.each("cancel requests", job_id):
            loc = core.tree.locate(job_id)
            if loc is None or loc.state.is_final:
                control.clear_cancel(job_id)
