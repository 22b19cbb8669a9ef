"""Notifications: targets waiting for a job's result, and the leases of the notifiers that deliver it.

Targets live in ``targets/<id>/`` from the moment they are queued, whatever the job's state. Once
the job is final and targets wait, ``jobs/notify/<id>.json`` says so (with the time the next
delivery attempt is due). A notifier holds ``leases/<id>.notify`` while it delivers.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable
from typing import Any, NamedTuple

from .._core._core import Core
from .._core._hooks import Hooks
from .._core._liveness import NotifyLock, break_if_expired
from .._errors import InvalidRequest, InvalidState, LeaseLost, StorageError, ValueTooLarge
from .._format._job import JobState
from .._format._layout import FINAL_RE, QUEUE_RE, TARGET_RE
from .._format._records import Record
from .._format._values import canonical, dumps, error_text, integer, loads, matches, number, target_key
from .._os import _files as fs
from .._os import _syscalls as sc
from ._leases import ClaimEnd, NotificationLease, OnCompromised


class NotifyEntry(NamedTuple):
    """``jobs/notify/<id>.json``: when the next delivery is due, how many deliveries so far
    left targets waiting, the last one's error, and the job's queue (None in an entry written
    before entries carried it: a notifier that filters by queue reads the job instead)."""

    not_before: float
    attempts: int
    error: str | None
    queue: str | None


# The most targets one job may have waiting. Each is a durable file, written and fsynced when it
# is queued and read by every delivery of the job, so a job's targets are a handful of callers
# (webhooks, reply queues), not a mailing list: a list of readers is better a subscription, or
# one target that fans out itself.
MAX_TARGETS = 100


class Notifier:
    def __init__(self, core: Core, hooks: Hooks) -> None:
        self._core = core
        self._hooks = hooks
        self._tree = core.tree
        self._layout = core.layout
        self._durable = core.durable
        self.target_cap = core.settings.max_request_bytes + 4096  # a target document, with room for its fields
        self._mutex = threading.Lock()
        self._held: dict[str, NotificationClaim] = {}

    def after_fork(self) -> None:
        self._mutex = threading.Lock()
        self._held = {}

    def held(self) -> list[NotificationClaim]:
        with self._mutex:
            return list(self._held.values())

    # -- targets -------------------------------------------------------------------------------
    def queue(self, job_id: str, target: Any) -> None:
        _, target = canonical(target, what="target")  # refuse what could not be read back
        key = target_key(target)
        doc = dumps({"target": target, "queued_at": self._core.wall()}, what="target")
        if len(doc) > self.target_cap:
            raise ValueTooLarge(f"target is {len(doc)} bytes; the cap is {self.target_cap}")
        self._tree.require(job_id)
        tdir = self._layout.target_dir(job_id)
        waiting = [n for n in fs.scan_names(tdir) if TARGET_RE.match(n)]
        # RACE: callers queueing on one job at once may each see room for one more and pass the
        # cap together, by at most their number: the cap bounds what one caller can ask for.
        if len(waiting) >= MAX_TARGETS and f"{key}.json" not in waiting:
            raise InvalidRequest(f"job {job_id} has {len(waiting)} targets waiting; the limit is {MAX_TARGETS} "
                                 "(fsjobstore.MAX_TARGETS)")
        tmp = self._layout.tmp_path(self._core.new_token(), "aux", f"{job_id}.{key}.json")
        self._tree.write_new(tmp, doc)
        try:
            for _ in range(100):
                try:
                    self._tree.ensure_dir(tdir)
                    self._tree.link_into(tmp, os.path.join(tdir, f"{key}.json"))
                except FileExistsError:
                    pass  # already queued: keep its original place in line
                except FileNotFoundError:
                    # A notifier or a sweep removed the emptied directory just now; or a member
                    # of a shared store moved targets/ or tmp/ (our file with it) away.
                    if not sc.lexists(tmp):
                        raise _gone("the target's temp file was moved away", tmp) from None
                    continue
                break
            else:
                raise _gone("targets/<id> kept disappearing", tdir)
        finally:
            fs.unlink(tmp)
        # RACE: the job may become final between require() and here; checking again *after* the
        # target is durable means either we see it final, or its committer sees our target.
        loc = self._tree.locate(job_id)
        if loc is not None and loc.state.is_final:
            self.mark_due_now(job_id)

    def read_targets(self, job_id: str) -> list[tuple[str, Any, float]]:
        """(key, target, queued_at) of every waiting target, oldest first; bad files quarantined."""
        tdir = self._layout.target_dir(job_id)
        out = []
        for name in fs.scan_names(tdir):
            m = TARGET_RE.match(name)
            if not m:
                continue
            path = os.path.join(tdir, name)
            try:
                doc = loads(fs.read_regular(path, self.target_cap))
                if not isinstance(doc, dict) or "target" not in doc:
                    raise ValueError("not a target document")
                queued = doc.get("queued_at")
                out.append((m["key"], doc["target"], float(queued) if isinstance(queued, int | float) else 0.0))
            except FileNotFoundError:
                continue
            except (fs.Unreadable, ValueError) as exc:
                self._tree.quarantine(path, f"target file {exc}")
        out.sort(key=lambda item: (item[2], item[0]))
        return out

    def unqueue_all(self, job_id: str, targets: Iterable[Any]) -> int:
        keys = {target_key(t) for t in targets}
        self._tree.require(job_id)
        return self._remove_targets(job_id, keys)

    def _remove_targets(self, job_id: str, keys: Iterable[str]) -> int:
        tdir = self._layout.target_dir(job_id)
        removed = sum(fs.unlink(os.path.join(tdir, f"{key}.json")) for key in keys)
        if removed and self._durable:
            try:
                fs.fsync_dir(tdir)
            except FileNotFoundError:
                # RACE: a recovery sweep removed the emptied directory; make that durable instead.
                fs.fsync_dir(self._layout.targets)
        return removed

    # -- the notify index ----------------------------------------------------------------------
    def write_entry(self, job_id: str, tmp_path: str, not_before: float, attempts: int,
                    error: str | None, queue: str | None) -> None:
        """Create or replace ``jobs/notify/<id>.json`` atomically."""
        doc: dict[str, Any] = {"id": job_id, "not_before": not_before, "attempts": attempts, "error": error}
        if queue is not None:  # what a notifier interested in some queues filters on, unread job
            doc["queue"] = queue
        for tries_left in (2, 1, 0):
            self._tree.write_new(tmp_path, dumps(doc) + b"\n")
            try:
                self._tree.rename_into(tmp_path, self._layout.notify_path(job_id))
                return
            except FileNotFoundError as exc:
                # RACE: a member of a shared store moved tmp/ (and our file) away between the
                # write and the rename; tmp/ is made again on the next write.
                fs.unlink_quietly(tmp_path)  # if it is still here after all, the next write needs its name
                if not tries_left:
                    err = StorageError(exc.errno, exc.strerror, exc.filename)
                    err.op = "rename"
                    raise err from None

    def read_entry(self, job_id: str) -> NotifyEntry | None:
        """The job's notify entry, or None if there is no usable one. An unusable one (not a
        regular file, not our JSON) is quarantined; the caller decides whether to write anew."""
        path = self._layout.notify_path(job_id)
        try:
            doc = loads(fs.read_regular(path, 64 * 1024))
            not_before, attempts, error = doc["not_before"], doc["attempts"], doc.get("error")
            due = number(not_before, "not_before", error=ValueError)
            attempts = integer(attempts, "attempts", at_least=0, error=ValueError)
            if error is not None and not isinstance(error, str):
                raise ValueError("error is not a string")
            queue = doc.get("queue")
            if queue is not None and not (isinstance(queue, str) and QUEUE_RE.match(queue)):
                raise ValueError("queue is not a queue name")
            return NotifyEntry(due, attempts, error, queue)
        except FileNotFoundError:
            return None
        except (fs.Unreadable, ValueError, TypeError, KeyError) as exc:
            self._tree.quarantine(path, f"notify entry {exc}")
            return None

    def after_final(self, job_id: str, queue: str | None = None) -> None:
        """What follows a job becoming final (after it is durable), on every path that makes
        one: its notification indexed if targets are waiting, then the ``after_final`` hooks
        (the jobs waiting for it resolved). ``queue``: the job's, when the caller has its record."""
        if has_targets(self._core, job_id):
            self.mark_due_now(job_id, queue)
        for hook in self._hooks.after_final:
            hook(job_id)

    def mark_due_now(self, job_id: str, queue: str | None = None) -> None:
        prev = self.read_entry(job_id)
        if queue is None:
            queue = prev.queue if prev is not None and prev.queue is not None else self._queue_of(job_id)
        tmp = self._layout.tmp_path(self._core.new_token(), "aux", f"{job_id}.notify")
        self.write_entry(job_id, tmp, 0.0, prev.attempts if prev else 0, None, queue)
        self._tree.bell("work")

    def _queue_of(self, job_id: str) -> str | None:
        """The final job's queue, read from its file; None if it cannot be read (the entry is
        written without one, and a claim that filters by queue reads the job again)."""
        loc = self._tree.locate(job_id)
        if loc is None:
            return None
        try:
            return self._tree.read_job(loc).queue
        except (OSError, fs.Unreadable, ValueError):
            return None

    def _drop_entry(self, job_id: str) -> None:
        fs.unlink(self._layout.notify_path(job_id))
        # RACE: a target queued after we read the list would be stranded without an entry;
        # queue() writes the target before checking for an entry, so checking again here after
        # the unlink catches it.
        if has_targets(self._core, job_id):
            self.mark_due_now(job_id)
        else:
            try:
                sc.rmdir(self._layout.target_dir(job_id))
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                    raise

    # -- leases --------------------------------------------------------------------------------
    def claim(self, interest: list[str] | None, on_compromised: OnCompromised | None) -> NotificationLease | None:
        """Lease the most overdue notification (of a job in a queue ``interest`` names or
        matches, when given), or return None."""
        lay, now = self._layout, self._core.wall()
        due: list[tuple[float, str]] = []
        for name in fs.scan_names(lay.notify):
            m = FINAL_RE.match(name)
            if not m:
                self._tree.quarantine(os.path.join(lay.notify, name), "unrecognised name in jobs/notify")
                continue
            entry = self.read_entry(m["id"])
            if entry is None:
                # Gone, or quarantined just now: if the job still has targets waiting, index it
                # again with a clean entry rather than strand them.
                if self._tree.is_final(m["id"]):
                    self.after_final(m["id"])
                continue
            if interest is not None and not self._wanted(m["id"], entry, interest):
                continue
            if entry[0] > now:
                self._core.pending.note_due(entry[0])
                continue
            due.append((entry[0], m["id"]))
        due.sort()
        me = self._core.owner_id()
        for _, job_id in due:
            lock_path = lay.notify_lock_path(job_id)
            lock = NotifyLock.try_acquire(lock_path, me, self._tree.perms.file_mode)
            if lock is None:
                break_if_expired(lock_path, me, self._core.probe)
                continue
            claim = self._open(job_id, lock, now, on_compromised)
            if claim is not None:
                return claim.lease
        return None

    def _wanted(self, job_id: str, entry: NotifyEntry, interest: list[str]) -> bool:
        queue = entry.queue if entry.queue is not None else self._queue_of(job_id)
        return queue is not None and any(matches(item, queue) for item in interest)

    def _open(self, job_id: str, lock: NotifyLock, now: float,
              on_compromised: OnCompromised | None) -> NotificationClaim | None:
        """With the lock held, check again and build the lease; the lock is released otherwise."""
        keep = False
        try:
            entry = self.read_entry(job_id)
            if entry is None or entry[0] > now:
                return None
            loc = self._tree.locate(job_id)
            if loc is None or not loc.state.is_final:
                self._tree.quarantine(self._layout.notify_path(job_id), "notify entry for no final job")
                return None
            try:
                record = self._tree.read_job(loc)
            except (fs.Unreadable, ValueError) as exc:
                self._tree.quarantine(loc.path, f"job file {exc}")
                self._tree.quarantine(self._layout.notify_path(job_id), "notify entry for an unreadable job")
                return None
            targets = self.read_targets(job_id)
            if not targets:
                self._drop_entry(job_id)
                return None
            claim = NotificationClaim(self, record, loc.state, tuple(t for _, t, _ in targets),
                                      frozenset(k for k, _, _ in targets), lock, entry[1], on_compromised)
            with self._mutex:
                self._held[job_id] = claim
            keep = True
            return claim
        finally:
            if not keep:
                lock.release()

    def finish(self, claim: NotificationClaim, delivered: list[Any], error: str | None) -> None:
        if claim.finished:
            raise InvalidState(f"the notification lease on job {claim.id} was already done")
        keys = {target_key(t) for t in delivered}
        strangers = [t for t in delivered if target_key(t) not in claim.keys]
        if strangers:
            raise InvalidRequest(
                f"done() was given {len(strangers)} target(s) this lease did not offer, e.g. "
                f"{strangers[0]!r}; deliver only targets from claim.waiting (nothing was removed)"
            )
        text = None if error is None else error_text(error)
        try:
            if not claim.lock.still_ours() or claim.compromised is not None:
                err = LeaseLost(f"the notification lease on job {claim.id} was lost; nothing was removed")
                claim.compromise(err)
                raise err
            # RACE: the lock could be broken between the check above and these unlinks only if
            # we stalled for a whole lease; the targets were delivered, so removing them is right.
            self._remove_targets(claim.id, keys)
            remaining = self.read_targets(claim.id)
            if remaining:
                attempts = claim.attempts + 1
                fresh = any(k not in claim.keys for k, _, _ in remaining)
                not_before = self._core.wall() if fresh else self._core.wall() + self._core.settings.backoff(attempts)
                tmp = self._layout.tmp_path(self._core.new_token(), "aux", f"{claim.id}.notify")
                self.write_entry(claim.id, tmp, not_before, attempts, text, claim.record.queue)
                self._core.pending.note_due(not_before)
            else:
                self._drop_entry(claim.id)
        finally:
            self._forget(claim)

    def release(self, claim: NotificationClaim) -> None:
        """Give the lease back without touching the notification: its entry keeps its due time
        (already passed, so it is offered again at once), attempts and error."""
        if claim.finished:
            raise InvalidState(f"the notification lease on job {claim.id} was already done")
        try:
            if not claim.lock.still_ours() or claim.compromised is not None:
                err = LeaseLost(f"the notification lease on job {claim.id} was lost; nothing to give back")
                claim.compromise(err)
                raise err
        finally:
            self._forget(claim)
        self._tree.bell("work")  # a waiting notifier elsewhere may take it now

    def _forget(self, claim: NotificationClaim) -> None:
        claim.lock.release()
        claim.mark_finished()
        with self._mutex:
            self._held.pop(claim.id, None)

    def check_held(self, problem: LeaseLost | None) -> None:
        """Tell every holder whose lock was broken (or, with ``problem``, every holder) so."""
        for claim in self.held():
            if problem is not None:
                claim.compromise(problem)
            elif not claim.finished and not claim.lock.still_ours():
                claim.compromise(LeaseLost(f"the notification lease on job {claim.id} was broken"))

    def close(self) -> None:
        for claim in self.held():
            claim.compromise(LeaseLost("the store was closed", reason="closed"))
            self._forget(claim)


class NotificationClaim(ClaimEnd):
    """One notification claim's changing state, changed only here (by ``Notifier``); its
    :class:`NotificationLease` (``.lease``, what the notifier gets) reads it and calls its methods."""

    def __init__(self, notifier: Notifier, record: Record, state: JobState, waiting: tuple[Any, ...],
                 keys: frozenset[str], lock: NotifyLock, attempts: int, on_compromised: OnCompromised | None) -> None:
        super().__init__(on_compromised)
        self._notifier = notifier
        self.record = record
        self.state = state
        self.waiting = waiting
        self.keys = keys  # the targets offered, to tell them from ones queued meanwhile
        self.lock = lock
        self.attempts = attempts
        self.lease = NotificationLease(self)

    @property
    def id(self) -> str:
        return self.record.id

    def done(self, delivered: list[Any], error: str | None) -> None:
        self._notifier.finish(self, delivered, error)

    def release(self) -> None:
        self._notifier.release(self)


def has_targets(core: Core, job_id: str) -> bool:
    """Whether targets wait for job ``job_id``'s result (``_removal`` asks before removing it)."""
    tdir = core.layout.target_dir(job_id)
    # Most jobs never have targets: the name watch (or one stat) answers without listing anything.
    return core.exists(tdir) and any(TARGET_RE.match(n) for n in fs.scan_names(tdir))


def _gone(why: str, path: str) -> StorageError:
    err = StorageError(errno.ENOENT, why, path)
    err.op = "queue"
    return err
