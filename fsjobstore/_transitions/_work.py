"""Work leases on disk: claiming a pending job, and every way its holder ends or extends it.

A claim renames the job's file into ``jobs/active/`` under a name holding the claimer's token. Every
commit starts from exactly that name, so a holder whose claim was taken over (renamed away by
recovery) commits nothing: that rename is the fence. FORMAT.md, "Transitions", lists each commit's
steps; this module alone performs them for a live holder (``_recovery`` for dead ones; ``_by_id``
claims jobs by id and commits them here). A commit of a job whose cancellation was requested ends it
``cancelled``, whatever the holder asked. Each commit is counted where it is made (``_core._hooks``)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from .._core._attempt_log import RunLog, give_back
from .._core._control import Control
from .._core._core import Core
from .._core._hooks import Ended, Hooks
from .._core._liveness import NotifyLock
from .._errors import InvalidRequest, InvalidState, JobCancelled, LeaseLost, StorageError
from .._format._layout import PENDING_RE
from .._format._records import FINAL_STATES, Record, next_record, result_line
from .._format._values import Duration, result_value, seconds, time_limit_error
from .._os import _files as fs
from .._os import _syscalls as sc
from ._leases import ClaimEnd, OnCompromised, WorkLease
from ._notify import Notifier
from ._removal import remove_now
from ._takeover import publish_found_result

log = logging.getLogger("fsjobstore")


class Work:
    """Claims and commits of one store; keeps the leases this process holds. Thread-safe."""

    def __init__(self, core: Core, notifier: Notifier, control: Control, hooks: Hooks) -> None:
        self._core = core
        self._notifier = notifier
        self.control = control
        self._mutex = threading.Lock()
        self._held: dict[str, WorkClaim] = {}
        self._hooks = hooks
        self.gate = hooks.gate

    def after_fork(self) -> None:
        self._mutex = threading.Lock()
        self._held = {}
        self.gate.after_fork()

    def held(self) -> list[WorkClaim]:
        with self._mutex:
            return list(self._held.values())

    # == claiming ==================================================================================
    def claim(self, queues: list[str] | None, on_compromised: OnCompromised | None) -> WorkLease | None:
        core, gate = self._core, self.gate
        core.pending.promote_due()
        gate.promote_due()
        skip = self.control.paused_for_claim()
        for _ in range(10_000):  # bounded: every turn consumes one name, or passes over one queue
            index = core.pending.pick(queues, skip)
            if index is None:
                gate.watch_lines()  # idle: be the one that sees a holder die (_limit_gate)
                return None
            queue = os.path.basename(index.directory)
            held = gate.queue_turn(queue)
            if held is None:  # at its limit: its jobs wait in it, in their order
                skip = skip | {queue}
                continue
            name = index.pop()
            if name is None:
                gate.release(None, held)
                continue
            m = PENDING_RE.match(name, name.index("/") + 1)  # "<bucket>/<name>"
            assert m is not None  # the index only holds valid names
            token = core.new_token()
            active = core.layout.active_path(m["id"], token)
            src = f"{index.directory}/{name}"
            try:
                sc.rename(src, active)
            except OSError as exc:
                gate.release(None, held)
                # ESTALE: another host took the job and removed its emptied bucket (_buckets).
                if exc.errno not in fs.GONE:
                    raise
                index.lost(name)  # another worker claimed it first
                continue
            index.won()
            claim = None
            try:
                claim = self.claim_from_active(active, m["id"], queue, token, on_compromised, give_back=src, held=held)
            finally:
                if claim is None:
                    gate.release(None, held)  # (it never ran; a job that waits for its key let go already)
            if claim is not None:
                return claim.lease
        return None

    def claim_from_active(self, active: str, job_id: str, queue: str, token: str,
                          on_compromised: OnCompromised | None, *, give_back: str,
                          held: list[NotifyLock] | None = None) -> WorkClaim | None:
        """Read a file we just claimed into a lease; None (and the file quarantined) if it is not a job
        that may run. ``give_back``: where it came from, for a read fault. ``held`` (a worker's claim from
        a queue): the slots its queue's limit gave it; a job that meets a full limit waits (``_limit_gate``)."""
        tree = self._core.tree
        try:
            parsed, extra_links, data = tree.read_parsed_links(active)
            if extra_links:
                # Hard-linked (a member's link, a `cp -al` backup): the result is appended to
                # this file in place, so it becomes a file of its own first.
                tree.private_copy(active, data, self._core.layout.tmp_path(token, "aux", f"{job_id}.copy"))
        except FileNotFoundError:
            return None
        except StorageError as exc:
            # Reading failed, not the file: put the claim back where it was and report the fault.
            # ESTALE (past the read's retries): this client knows the name by a file another host
            # replaced (a take-over requeues a job as a new file): put back, a race lost.
            # RACE: none for the rename back: the claim's token is ours and we are alive, so no
            # recoverer moves it; a puller can see the job again only once it is back.
            try:
                sc.rename(active, give_back)
            except OSError:
                log.warning("could not return job %s after a read error; it returns to the queue when "
                            "this process exits", job_id)
            if exc.errno == errno.ESTALE:
                return None
            raise
        except (fs.Unreadable, ValueError) as exc:
            tree.quarantine(active, f"claimed job file {exc}")
            return None
        record = parsed.record
        if record.id != job_id or record.queue != queue:
            tree.quarantine(active, f"file content names job {record.id!r} in queue {record.queue!r}")
            return None
        if parsed.final is not None:
            publish_found_result(self._core, self._notifier, active, record, parsed.final)
            return None
        if held is not None and not self.gate.admit(record, active, token, give_back, held):
            return None  # it waits for its limit (and held was let go)
        claim = WorkClaim(self, record, token, on_compromised, size=parsed.complete, clean=not parsed.torn,
                          claimed_at=self._core.clock())
        claim.slots = held or []
        if record.timeout is not None:
            self._limit(claim, record.timeout)
        with self._mutex:
            self._held[token] = claim
        return claim

    def _limit(self, claim: WorkClaim, seconds: float) -> None:
        """Give the attempt ``seconds`` from now: locally (``claim.deadline``, on the monotonic
        clock) and for every other process (``control/deadlines/``, in wall time)."""
        core = self._core
        claim.deadline = core.clock() + seconds
        claim.deadline_path = self.control.set_deadline(claim.id, claim.token, core.wall() + seconds,
                                                          old=claim.deadline_path)

    # == committing (called by WorkClaim, and by _direct) ===========================================
    def commit(self, claim: WorkClaim, kind: str, payload: Any, retry: bool, delay: Duration | None) -> None:
        with claim.commit_lock:
            self._commit_locked(claim, kind, payload, retry, delay)

    def _commit_locked(self, claim: WorkClaim, kind: str, payload: Any, retry: bool, delay: Duration | None) -> None:
        core = self._core
        if claim.finished:
            if claim.compromised is not None:  # timed out or taken over: the late commit is fenced
                raise LeaseLost(f"{claim.compromised}; this commit was refused", reason=claim.compromised.reason)
            raise InvalidState(f"the lease on job {claim.id} was already committed")
        if core.forked():
            raise LeaseLost("this lease belongs to the parent process", reason="closed")
        record, token, lay = claim.record, claim.token, core.layout
        active = lay.active_path(record.id, token)
        claim.kind = kind
        reason = self.control.cancel_reason(record.id)
        if reason is not None and kind not in ("cancel", "withdraw"):
            # A job resolved by id ran no attempt here: its cancel counts none either.
            asked, kind, payload = kind, "withdraw" if kind == "resolve" else "cancel", reason
            claim.kind = kind
            new, dest = next_record(record, token, kind, payload, False, None, core.wall(), core.settings.backoff)
            self._commit_final(claim, active, new.result_bytes(dest), dest, new.finished_at or core.wall())
            claim.final_record = new
            log.info("job %s was cancelled while it ran; its %s became the cancel", record.id, asked)
            if asked not in ("release", "give_back"):
                raise JobCancelled(f"job {record.id} was cancelled ({reason}); it was not committed as asked")
            return
        if kind in ("release", "give_back"):
            self._release(claim, active)
            return
        if kind in ("fulfill", "resolve"):
            # The usual commit: its line written straight from the claimed record's fields. "resolve"
            # is JobStore.fulfill by id: work done elsewhere, so no attempt of this store's is counted.
            value = result_value(payload, core.settings.max_value_bytes)
            attempts = record.attempts + (kind == "fulfill")
            now = core.wall()
            line = result_line("fulfilled", attempts, record.error, now, token, None, value)
            self._commit_final(claim, active, line, "fulfilled", now)
            return
        new, dest = next_record(record, token, kind, payload, retry, delay, core.wall(), core.settings.backoff)
        if dest in FINAL_STATES:
            self._commit_final(claim, active, new.result_bytes(dest), dest, new.finished_at or core.wall())
            claim.final_record = new
            return
        tmp = lay.commit_tmp_path(token, record.id, dest)
        fs.unlink_quietly(tmp)  # a failed earlier attempt of this very commit may have left it
        try:
            core.tree.write_new(tmp, new.to_bytes())
        except OSError as exc:
            if fs.gone_after(exc, active):  # a stale handle, and our claim is gone too: lost
                fs.unlink_quietly(tmp)
                raise self._lost(claim) from None
            raise
        claim.committing = True
        committing = lay.active_path(record.id, token, "commit")
        try:
            sc.rename(active, committing)  # the fence: fails if our claim was taken over
        except OSError as exc:  # (a retried rename a network filesystem applied: the fence stands)
            if not sc.lexists(committing):  # never unlink the temp file of a ".commit" (FORMAT.md)
                fs.unlink_quietly(tmp)
                if isinstance(exc, FileNotFoundError) or fs.gone_after(exc, active):
                    raise self._lost(claim) from None
                claim.committing = False
                raise
        try:
            core.tree.publish(tmp, new, dest)
        except (FileExistsError, FileNotFoundError):
            # RACE: we were judged hung after fencing, and a recoverer finished our commit from
            # our own temp file. That is our result; anything else is someone else's.
            fs.unlink_quietly(tmp)
            if not self._published_by(token, core.tree.dest_path(new, dest)):
                raise self._lost(claim) from None
        except StorageError as exc:
            if not exc.applied:
                self._unfence(claim, committing, active, tmp)
                raise
            self._committed(claim, committing, new, dest)
            raise
        self._committed(claim, committing, new, dest)

    def _release(self, claim: WorkClaim, active: str) -> None:
        core, record = self._core, claim.record
        dst = core.layout.pending_path(record.queue, record.priority, record.seq, record.id)
        claim.committing = True
        try:
            core.tree.into_pending(active, dst)
        except FileNotFoundError:
            raise self._lost(claim) from None
        except StorageError as exc:
            if not exc.applied:
                claim.committing = False  # nothing moved: the lease is still ours
                if fs.gone_after(exc, active):
                    raise self._lost(claim) from None
                raise
            self._released(claim)  # only the fsync failed
            raise
        core.tree.bell("work")
        self._released(claim)

    def _released(self, claim: WorkClaim) -> None:
        # Its progress is no attempt's now. RACE: said after the rename, so a failed release says
        # nothing; a reader in between sees the job waiting (no progress) or another claim's.
        give_back(self._core, claim.record.id, claim.token)
        self._finish(claim)
        if claim.kind == "release":  # a holder's (a give-back by id undoes a claim nobody ran)
            self._count(claim, "given_back")
        self._core.pending.note_published(claim.record, "pending")

    def _commit_final(self, claim: WorkClaim, active: str, line: bytes, dest: str, finished_at: float) -> None:
        """A result is final: append it as one line to the claimed file, then move that file to its final
        directory with one rename that never replaces a result. The rename is the fence (ENOENT once a
        recoverer moved our claim); where it is a link and an unlink, a rename comes first (Tree.fence_final)."""
        core, job_id = self._core, claim.record.id
        claim.committing = True
        claimed = active
        if sc.noreplace_emulated() and not (active := core.tree.fence_final(
                active, core.layout.active_path(job_id, core.new_token())) or ""):
            raise self._lost(claim)
        try:
            fs.write_at(active, claim.size, line, durable=core.durable, clean=claim.clean,
                        linked_as=core.layout.id_marker(job_id))
        except FileNotFoundError:
            raise self._lost(claim) from None
        except fs.Unreadable as exc:
            # Swapped since the claim for a hard link (or a FIFO) a member planted: nothing was
            # written; the file is kept aside like any planted one, and this attempt is void.
            claim.committing = False
            core.tree.quarantine(active, f"claimed job file {exc}")
            raise self._lost(claim) from None
        except OSError as exc:
            claim.committing = False  # the line was cut back (if it could be): a retry truncates first
            claim.clean = False
            if fs.gone_after(exc, active):
                raise self._lost(claim) from None
            core.tree.unfence_final(active, claimed)
            raise
        try:
            core.tree.publish_final(active, claim.record, dest, finished_at)
        except FileNotFoundError:
            # RACE: we were judged hung and a recoverer moved our claim. If it saw our whole
            # result line it published that (our commit stands); otherwise it requeued the job
            # from the record line and ours is void.
            if not self._published_by(claim.token, core.layout.final_path(dest, job_id)):
                raise self._lost(claim) from None
        except FileExistsError:
            # A result exists already, so this claim was a second copy of a job that is final:
            # a restored backup, a hand-made copy. It is kept aside, and nothing was committed.
            core.tree.quarantine(active, f"a second copy of job {job_id}, which is already final")
            raise self._lost(claim) from None
        except StorageError as exc:
            if not exc.applied and fs.gone_after(exc, active):
                # RACE: a recoverer on another host moved our claim and the rename met a stale
                # handle rather than ENOENT: the same as the FileNotFoundError case above.
                if not self._published_by(claim.token, core.layout.final_path(dest, job_id)):
                    raise self._lost(claim) from None
                self._committed_final(claim, job_id, dest, finished_at)
                return
            if not exc.applied:
                # Nothing moved. Cut the line back, durably, so a release or a retry starts clean
                # and no power cut brings the line back. RACE: if even that fails, the file is
                # what a crash between the append and the rename leaves, and recovery (or, after
                # a power cut, a claim) may publish the line: a double fault can turn this
                # "nothing happened" into a commit, never into a lost job.
                fs.cut_back(active, claim.size, durable=core.durable)
                claim.committing = False
                claim.clean = False
                core.tree.unfence_final(active, claimed)
                raise
            self._committed_final(claim, job_id, dest, finished_at)
            raise
        self._committed_final(claim, job_id, dest, finished_at)

    def _committed_final(self, claim: WorkClaim, job_id: str, dest: str, finished_at: float) -> None:
        self._finish(claim)
        self._count(claim, dest)
        if dest == "cancelled":
            # Honoured. RACE: a request written after the commit looked for one is too late; it
            # is left for recovery (_sweep_cancels), so a plain commit unlinks nothing.
            self.control.clear_cancel(job_id)
        try:
            self._notifier.after_final(job_id, claim.record.queue)
        except StorageError as exc:
            # The result is committed and durable; only its notify index entry is missing,
            # and every recovery pass restores those (_recovery._sweep_targets).
            log.warning("job %s is committed but its notification was not indexed: %s", job_id, exc)
            return
        if self._core.tree.retain_of(claim.record) == 0:
            remove_now(self._core, self._hooks, claim.record, dest, finished_at)

    def _committed(self, claim: WorkClaim, committing: str, new: Record, dest: str) -> None:
        self._core.drop(committing)
        self._finish(claim)
        self._count(claim, "retried")
        self._core.pending.note_published(new, dest)  # a retry: final results go by _commit_final

    def _unfence(self, claim: WorkClaim, committing: str, active: str, tmp: str) -> None:
        """Undo a commit that failed before anything was published: the claim is ours again
        and the caller may retry. The temp file goes only after the ``.commit`` entry (one left
        without it is taken for published, and dropped); if the undo fails, both stay until
        this process exits, and recovery then publishes the commit from its temp file."""
        if not self._core.tree.unfence(committing, active, tmp):
            log.warning("could not undo the fence of job %s; recovery finishes its commit when this process exits",
                        claim.id)
            return
        claim.committing = False

    def _published_by(self, token: str, path: str) -> bool:
        """Whether the job file at ``path`` holds a commit of claim ``token``."""
        try:
            return self._core.tree.read_record(path).committed_by == token
        except (FileNotFoundError, fs.Unreadable, ValueError):
            return False

    def _lost(self, claim: WorkClaim) -> LeaseLost:
        error = LeaseLost(f"the lease on job {claim.id} (token {claim.token}) was taken over; nothing was committed")
        claim.compromise(error)
        self._finish(claim)
        return error

    def _count(self, claim: WorkClaim, what: str) -> None:
        """The ``ended`` point: what this claim's commit did, and how long an attempt it ended ran."""
        no_attempt = claim.kind in ("resolve", "withdraw", "release") or claim.timing_out
        ran = None if no_attempt else self._core.clock() - claim.claimed_at
        for hook in self._hooks.ended:
            hook(Ended(claim.record.queue, what, ran))

    def _finish(self, claim: WorkClaim) -> None:
        claim.mark_finished()
        self.control.clear_deadline(claim.deadline_path)
        with self._mutex:
            self._held.pop(claim.token, None)
        if claim.slots:
            self.gate.release(claim.record, claim.slots)

    # == a running attempt (called by WorkClaim) ===================================================
    def touch(self, claim: WorkClaim, extend: Duration | None) -> None:
        wanted = claim.timeout if extend is None else extend
        if wanted is None:
            raise InvalidRequest(f"job {claim.id} has no timeout to renew; give extend=seconds")
        limit = seconds(wanted, "extend (seconds)", above=0, below=1e9)
        with claim.commit_lock:
            if claim.finished or not sc.lexists(self._core.layout.active_path(claim.id, claim.token)):
                raise LeaseLost(f"the lease on job {claim.id} is no longer held; it cannot be extended")
            self._limit(claim, limit)

    def run_log(self, claim: WorkClaim) -> RunLog:
        run = claim.run
        if run is None:
            run = claim.run = RunLog(self._core, claim.id, claim.token, claim.attempt)
        return run

    def time_out(self, claim: WorkClaim) -> bool:
        """End an attempt that overran its time limit: a failed attempt (retried or failed as
        usual), committed here so that the late holder's own commit is fenced (LeaseLost).
        False if the lease had ended already."""
        text = time_limit_error(claim.attempt, claim.timeout)
        with claim.commit_lock:
            if claim.finished:
                return False
            claim.compromise(LeaseLost(f"job {claim.id}: {text}", reason="timeout"))
            claim.timing_out = True
            with contextlib.suppress(JobCancelled):  # cancelled meanwhile: that is how it ended
                self._commit_locked(claim, "fail", text, True, None)
            if claim.kind == "fail":  # (not a cancel that came first)
                claim.timing_out = False  # its run time: counted here, once
                self._count(claim, "timed_out")
        return True

    # == the heartbeat's checks ====================================================================
    def check_held(self, problem: LeaseLost | None) -> None:
        """Tell every holder whose claim is gone (or, with ``problem``, every holder) so, and
        every holder whose job is to be cancelled."""
        layout = self._core.layout
        for claim in self.held():
            if problem is not None:
                claim.compromise(problem)
            elif not claim.committing and not sc.lexists(layout.active_path(claim.id, claim.token)):
                claim.compromise(LeaseLost(f"job {claim.id} was taken over by another process"))
            else:
                claim.cancel_requested()  # fires on_cancel once

    def release_all(self) -> None:
        """Give back every held job (on close)."""
        for claim in self.held():
            try:
                claim.commit("release", None, False, None)
            except Exception:  # already lost: nothing of ours to give back
                log.debug("release on close failed for %s", claim.id, exc_info=True)


class WorkClaim(ClaimEnd):
    """One work claim's changing state, changed only here (by ``Work``); its :class:`WorkLease`
    (``.lease``, what the holder gets) reads it and calls its methods."""

    def __init__(self, work: Work, record: Record, token: str, on_compromised: OnCompromised | None,
                 size: int, clean: bool, claimed_at: float) -> None:
        super().__init__(on_compromised)
        self._work = work
        self.record = record
        self.token = token
        self.size = size  # bytes of the claimed file: where a final commit appends its result
        self.clean = clean  # the file is known to end at size (no torn tail, no failed attempt)
        self.committing = False  # set once the commit's first visible step is under way
        self.commit_lock = threading.RLock()  # one commit at a time (a handler, a time limit)
        self.deadline: float | None = None  # monotonic; None: no time limit
        self.deadline_path: str | None = None
        self.run: RunLog | None = None
        self.on_cancel: Callable[[WorkLease], object] | None = None
        self.slots: list[NotifyLock] = []  # of the limits it runs under (_limit_gate): let go when it ends
        # What a final commit of a fail, cancel or withdraw wrote (a fulfil's record is not built):
        # the caller's answer even once that commit removed the job (kept 0 s).
        self.final_record: Record | None = None
        self.claimed_at = claimed_at  # monotonic: how long its attempt ran, when it is counted
        self.kind: str | None = None  # of the commit under way or made (fulfill, fail, release, ...)
        self.timing_out = False  # a time-out's commit: its run time counted once, as timed_out
        self._cancel_seen = False
        self.lease = WorkLease(self)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def attempt(self) -> int:
        return self.record.attempts + 1

    @property
    def timeout(self) -> float | None:
        return self.record.timeout

    def commit(self, kind: str, payload: Any, retry: bool, delay: Duration | None) -> None:
        self._work.commit(self, kind, payload, retry, delay)

    def touch(self, extend: Duration | None) -> None:
        self._work.touch(self, extend)

    def run_log(self) -> RunLog:
        return self._work.run_log(self)

    def time_out(self) -> bool:
        return self._work.time_out(self)

    def cancel_requested(self) -> bool:
        """Whether a cancel was asked for (one stat); fires ``on_cancel`` the first time."""
        if self._cancel_seen:
            return True
        if self.finished or not self._work.control.cancel_requested(self.id):
            return False
        with self.mutex:
            first, self._cancel_seen = not self._cancel_seen, True
            callback = self.on_cancel
        if first and callback is not None:
            try:
                callback(self.lease)
            except Exception:
                log.exception("on_cancel callback raised")
        return True
