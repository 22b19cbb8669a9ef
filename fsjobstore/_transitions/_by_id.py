"""Operations on a job named by its id, from any process: fulfil or fail it, cancel it, retry it.

Each one claims the job the way a worker does (a rename into ``jobs/active/`` under a token of
ours), so it races safely with workers and recoverers, then commits through ``_work`` like any
holder. A job that a live worker holds is not taken: fulfilling it is refused, cancelling it
leaves a request that its holder (or whoever recovers it) honours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

from .._core._attempt_log import LATEST, read_runs
from .._core._control import Control
from .._core._core import Core
from .._core._finding import Location
from .._core._hooks import Hooks
from .._errors import CorruptJob, InvalidState, JobNotFound, JobStoreError, StorageError
from .._format._job import Job, JobState
from .._format._layout import DEFERRED_RE, PENDING_BUCKET_RE, SCHEDULED_RE, WAITING_RE, token_owner
from .._format._records import FINAL_STATES, Record
from .._os import _files as fs
from .._os import _syscalls as sc
from ._notify import Notifier
from ._recovery import new_counts
from ._takeover import take_over
from ._work import Work, WorkClaim


class ById:
    def __init__(self, core: Core, work: Work, notifier: Notifier, control: Control, hooks: Hooks) -> None:
        self._core = core
        self._work = work
        self._notifier = notifier
        self._control = control
        self._hooks = hooks

    def fulfill(self, job_id: str, value: Any) -> None:
        """Fulfil a job by id (JobStore.fulfill): no attempt of this store's is counted."""
        self._resolve(job_id, "resolve", value)

    def fail(self, job_id: str, error: str) -> None:
        """Fail a job by id for good (JobStore.fail): counted as its one failed attempt."""
        self._resolve(job_id, "fail", error)

    def _resolve(self, job_id: str, kind: str, payload: Any) -> None:
        for _ in range(20):
            loc = self._core.tree.require(job_id)
            if loc.state.is_final:
                raise InvalidState(f"job {job_id} is already {loc.state.value}")
            if loc.state is JobState.ACTIVE:
                if self._holder_alive(loc):
                    raise InvalidState(f"job {job_id} is leased by a live worker")
                self._take_over(loc, job_id, "its holder is gone (taken over to resolve it by id)")
                continue
            claim = self._claim(loc, job_id)
            if claim is None:
                continue
            try:
                self._work.commit(claim, kind, payload, False, None)
            except StorageError:
                if not claim.finished:  # nobody else holds this claim: give the job back
                    with contextlib.suppress(JobStoreError):
                        self._work.commit(claim, "give_back", None, False, None)
                raise
            return
        raise InvalidState(f"job {job_id} kept moving; try again")

    def cancel(self, job_id: str, reason: str | None) -> Job:
        """End a job ``cancelled``: at once if it is waiting; by request if it runs (its holder
        commits the cancel, or recovery does if the holder is gone). Returns the job as it is
        afterwards: cancelled, or active (the request is made); a job kept 0 s that this cancel
        ended is removed by it, and its snapshot is the record the cancel wrote. InvalidState
        for a job that has ended, or that a holder's commit ended while the request was being made."""
        text = "cancelled" if not reason else f"cancelled: {reason}"
        for _ in range(20):
            loc = self._core.tree.require(job_id)
            if loc.state.is_final:
                raise InvalidState(f"job {job_id} is already {loc.state.value}; only a job that has not ended "
                                   "can be cancelled")
            if loc.state is JobState.ACTIVE:
                self._control.request_cancel(job_id, reason)
                if not self._holder_alive(loc):
                    self._take_over(loc, job_id, "its holder is gone")  # it sees the request: the job ends cancelled
                again = self._core.tree.locate(job_id)
                try:
                    if again is not None:
                        # RACE: the holder may commit between that look and the snapshot: judge by
                        # the state the snapshot read, which is what this call returns.
                        now = self.snapshot(job_id)
                        if not now.state.is_final:
                            return now  # asked: its holder (or recovery) ends it cancelled
                        self._control.clear_cancel(job_id)
                        if now.state is JobState.CANCELLED:
                            return now  # honoured (by the holder, or by our take-over)
                        # It ended otherwise, its commit having looked for a request before ours
                        # was made: the request came too late, and the job is not cancelled. Said
                        # as for any job that has ended (a bulk cancel counts it skipped).
                        raise InvalidState(f"job {job_id} ended {now.state.value} before the cancel reached it")
                except JobNotFound:
                    pass
                # RACE: its holder ended it as the request was made, and that commit removed it
                # (kept 0 s): how it ended went with it (its holder counted it). Said as for a
                # job that has ended.
                self._control.clear_cancel(job_id)
                raise InvalidState(f"job {job_id} ended, and was removed (kept 0 s), as the cancel was made")
            claim = self._claim(loc, job_id)
            if claim is None:
                continue
            self._work.commit(claim, "withdraw", text, False, None)
            try:
                return self.snapshot(job_id)  # with its waiting targets (a job with targets is kept)
            except JobNotFound:
                if claim.final_record is None:
                    raise
                return claim.final_record.snapshot(JobState.CANCELLED)  # removed by this commit: kept 0 s
        raise InvalidState(f"job {job_id} kept moving; try again")

    def retry(self, job_id: str) -> Job:
        """Give a failed or cancelled job a new life: back to pending with no attempts spent,
        its earlier outcome appended to ``history``. A job made ``after`` others goes back to
        ``deferred`` while one of them is not final, and is refused while one of them failed,
        was cancelled or is gone (unless it runs anyway: ``on_parent_failure="run"``)."""
        core, lay = self._core, self._core.layout
        for _ in range(20):
            loc = core.tree.require(job_id)
            if loc.state not in (JobState.FAILED, JobState.CANCELLED):
                raise InvalidState(f"job {job_id} is {loc.state.value}; only a failed or cancelled job can be retried")
            token = core.new_token()
            mine = lay.active_path(job_id, token)
            try:
                sc.rename(loc.path, mine)  # the claim: a second retry, or a notifier's read, loses the race
            except FileNotFoundError:
                continue
            try:
                old = core.tree.read_record(mine)
            except (fs.Unreadable, ValueError) as exc:
                core.tree.quarantine(mine, f"job file {exc}")
                raise CorruptJob(f"job {job_id}: {exc}; moved to quarantine") from None
            except StorageError:  # a read fault (EIO, EMFILE): nothing changed, the job goes back
                with contextlib.suppress(OSError):
                    sc.rename(mine, loc.path)
                raise
            try:
                dest = self._hooks.parents.place_retry(old) if old.after else "pending"
                if old.unique_key is not None:
                    self._hooks.keys.retake(old, mine)  # another job may hold its key since it ended
            except BaseException:
                with contextlib.suppress(OSError):
                    sc.rename(mine, loc.path)
                raise
            past = {"state": loc.state.value, "attempts": old.attempts, "error": old.error,
                    "finished_at": old.finished_at}
            new = dataclasses.replace(old, attempts=0, error=None, value=None, finished_at=None, not_before=None,
                                      committed_by=token, history=(*old.history, past)[-20:],
                                      attempt_errors=())
            if dest == "deferred":
                self._hooks.parents.link(new)  # before it is seen, as a create does
            self._republish(mine, new, token, dest)
            if dest == "deferred":
                self._hooks.parents.recheck(new)  # parents that ended meanwhile
            if old.finished_at is not None:
                # Its old life's finished-index entry: statistics() counts final jobs from the
                # index, and would count this one failed until retention or a listing found the
                # entry stale (2 minutes: an operator saw a bulk retry counted twice). A crash
                # before this unlink leaves it to them, as before.
                fs.unlink_quietly(core.tree.finished_entry(old, loc.state.value, old.finished_at))
            return new.snapshot(JobState(dest))
        raise InvalidState(f"job {job_id} kept moving; try again")

    def _republish(self, mine: str, new: Record, token: str, dest: str) -> None:
        """Publish the new life of a job we claimed out of a final state, then drop the claim.
        Fenced as a worker's commit is: a crash before the rename to ``.commit`` leaves our
        claim, which recovery publishes back into its final state (its result line is whole:
        the retry did not happen, as the caller was not told it did); after it, recovery
        finishes the retry from the temp file, or, once that is published, drops the
        ``.commit``, never publishing the old life back."""
        core, lay = self._core, self._core.layout
        tmp = lay.commit_tmp_path(token, new.id, dest)
        committing = lay.active_path(new.id, token, "commit")
        try:
            core.tree.write_new(tmp, new.to_bytes())
            sc.rename(mine, committing)
        except StorageError:
            self._put_back(mine, tmp, new.id)
            raise
        try:
            core.tree.publish(tmp, new, dest)
        except StorageError as exc:
            if exc.applied:  # the new life is in place; only its fsync failed
                core.drop(committing)
            else:
                self._put_back(committing, tmp, new.id)
            raise
        core.drop(committing)
        # Its old notification (of the outcome that was just undone) waits no more: the targets
        # stay queued, and hear of the new outcome instead.
        fs.unlink_quietly(lay.notify_path(new.id))
        core.pending.note_published(new, dest)

    def _put_back(self, held: str, tmp: str, job_id: str) -> None:
        """Nothing was published: the old life goes back to its final directory from our claim
        (or its ``.commit``). If it cannot move, this process's exit leaves it to recovery."""
        core = self._core
        core.tree.unfence(held, core.layout.final_path(_final_state(core, held), job_id), tmp)

    def snapshot(self, job_id: str) -> Job:
        """``JobStore.get``: the job's file, targets, run log and notify entry as one snapshot;
        a file that cannot be read is quarantined (:class:`CorruptJob`)."""
        core, tree = self._core, self._core.tree
        for _ in range(5):
            loc = tree.require(job_id)
            try:
                record = tree.read_job(loc)
            except FileNotFoundError:
                continue  # it moved while we read it
            except (fs.Unreadable, ValueError) as exc:
                moved = tree.quarantine(loc.path, f"job file {exc}")
                where = "moved to quarantine" if moved else f"left at {loc.path}"
                raise CorruptJob(f"job {job_id}: {exc}; {where}") from None
            waiting = tuple(t for _, t, _ in self._notifier.read_targets(job_id))
            # The running attempt's progress, or the last attempt's once final; none while it waits.
            shown = loc.token if loc.state is JobState.ACTIVE else LATEST if loc.state.is_final else None
            progress, logs, dropped = read_runs(core, job_id, shown)
            requested = loc.state is JobState.ACTIVE and self._control.cancel_requested(job_id)
            entry = self._notifier.read_entry(job_id) if waiting and loc.state.is_final else None
            return record.snapshot(loc.state, waiting, progress=progress, logs=logs, logs_dropped=dropped,
                                   cancel_requested=requested, delivery_attempts=entry.attempts if entry else 0,
                                   delivery_error=entry.error if entry else None,
                                   delivery_due_at=entry.not_before if entry else None)
        raise JobNotFound(f"job {job_id!r} kept moving while being read")

    # -- helpers ---------------------------------------------------------------------------------
    def _holder_alive(self, loc: Location) -> bool:
        assert loc.token is not None
        owner = token_owner(loc.token)
        return owner == self._core.owner_id() or self._core.probe.status(owner) == "alive"

    def _take_over(self, loc: Location, job_id: str, why: str) -> None:
        assert loc.token is not None and loc.kind is not None
        take_over(self._core, self._hooks, self._notifier, self._control, loc.path, job_id, loc.token, loc.kind, why,
                  new_counts())

    def _claim(self, loc: Location, job_id: str) -> WorkClaim | None:
        """Claim a pending, scheduled or deferred job as a worker would; None if it moved first."""
        core = self._core
        token = core.new_token()
        active = core.layout.active_path(job_id, token)
        try:
            sc.rename(loc.path, active)
        except OSError as exc:
            if exc.errno not in fs.GONE:  # ESTALE: its bucket went (_work.claim)
                raise
            return None
        if loc.state is JobState.PENDING:
            core.tree.note_bucket_change(os.path.dirname(loc.path))
            core.pending.gone(loc.path)
        claim = self._work.claim_from_active(active, job_id, _queue_of(loc), token, None, give_back=loc.path)
        if claim is None:
            again = core.tree.locate(job_id)
            if again is not None and again.state.is_final:
                return None  # it already held its result and was published: the caller sees it final
            raise CorruptJob(f"job {job_id} could not be read and was quarantined")
        return claim


def _final_state(core: Core, path: str) -> str:
    try:
        parsed = core.tree.read_parsed(path)
    except (OSError, fs.Unreadable, ValueError):
        return "failed"
    return parsed.final if parsed.final in FINAL_STATES else "failed"


def _queue_of(loc: Location) -> str:
    if loc.state is JobState.DEFERRED:
        d = DEFERRED_RE.match(os.path.basename(loc.path))
        assert d is not None
        return d["queue"]
    w = WAITING_RE.match(os.path.basename(loc.path))  # no other state's names have its shape
    if w is not None:
        return w["queue"]  # pending, parked by a limit (_limit_gate)
    if loc.state is JobState.PENDING:
        parent = os.path.dirname(loc.path)  # <queue>/<bucket>, or <queue> for a flat job (_buckets)
        if PENDING_BUCKET_RE.match(os.path.basename(parent)):
            parent = os.path.dirname(parent)
        return os.path.basename(parent)
    m = SCHEDULED_RE.match(os.path.basename(loc.path))
    assert m is not None
    return m["queue"]
