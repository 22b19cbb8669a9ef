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
from typing import Any

from . import _fsops as fs
from . import _syscalls as sc
from ._checks import error_text
from ._codec import canonical, dumps, target_key
from ._errors import InvalidRequest, InvalidState, LeaseLost, StorageError, ValueTooLarge
from ._layout import FINAL_RE
from ._leases import NotificationLease, OnCompromised
from ._liveness import NotifyLock, break_if_expired
from ._shared import Core


class Notifier:
    def __init__(self, core: Core) -> None:
        self._core = core
        self._tree = core.tree
        self._layout = core.layout
        self._durable = core.durable
        self._mutex = threading.Lock()
        self._held: dict[str, NotificationLease] = {}

    def after_fork(self) -> None:
        self._mutex = threading.Lock()
        self._held = {}

    def held(self) -> list[NotificationLease]:
        with self._mutex:
            return list(self._held.values())

    # -- targets -------------------------------------------------------------------------------
    def queue(self, job_id: str, target: Any) -> None:
        _, target = canonical(target, what="target")  # refuse what could not be read back
        key = target_key(target)
        doc = dumps({"target": target, "queued_at": self._core.wall()}, what="target")
        if len(doc) > self._tree.target_cap:
            raise ValueTooLarge(f"target is {len(doc)} bytes; the cap is {self._tree.target_cap}")
        self._tree.require(job_id)
        tdir = self._layout.target_dir(job_id)
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
    def after_final(self, job_id: str) -> None:
        """Index a final job for notification if targets are waiting (after it is durable)."""
        if self._tree.has_targets(job_id):
            self.mark_due_now(job_id)

    def mark_due_now(self, job_id: str) -> None:
        prev = self._tree.read_notify_entry(job_id)
        tmp = self._layout.tmp_path(self._core.new_token(), "aux", f"{job_id}.notify")
        self._tree.write_notify_entry(job_id, tmp, 0.0, prev[1] if prev else 0, None)
        self._tree.bell("work")

    def _drop_entry(self, job_id: str) -> None:
        fs.unlink(self._layout.notify_path(job_id))
        # RACE: a target queued after we read the list would be stranded without an entry;
        # queue() writes the target before checking for an entry, so checking again here after
        # the unlink catches it.
        if self._tree.has_targets(job_id):
            self.mark_due_now(job_id)
        else:
            try:
                sc.rmdir(self._layout.target_dir(job_id))
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                    raise

    # -- leases --------------------------------------------------------------------------------
    def claim(self, on_compromised: OnCompromised | None) -> NotificationLease | None:
        lay, now = self._layout, self._core.wall()
        due: list[tuple[float, str]] = []
        for name in fs.scan_names(lay.notify):
            m = FINAL_RE.match(name)
            if not m:
                self._tree.quarantine(os.path.join(lay.notify, name), "unrecognised name in jobs/notify")
                continue
            entry = self._tree.read_notify_entry(m["id"])
            if entry is None:
                # Gone, or quarantined just now: if the job still has targets waiting, index it
                # again with a clean entry rather than strand them.
                if self._tree.is_final(m["id"]):
                    self.after_final(m["id"])
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
            lease = self._open(job_id, lock, now, on_compromised)
            if lease is not None:
                return lease
        return None

    def _open(self, job_id: str, lock: NotifyLock, now: float,
              on_compromised: OnCompromised | None) -> NotificationLease | None:
        """With the lock held, check again and build the lease; the lock is released otherwise."""
        keep = False
        try:
            entry = self._tree.read_notify_entry(job_id)
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
            targets = self._tree.read_targets(job_id)
            if not targets:
                self._drop_entry(job_id)
                return None
            lease = NotificationLease(self, record, loc.state, tuple(t for _, t, _ in targets),
                                      frozenset(k for k, _, _ in targets), lock, entry[1], on_compromised)
            with self._mutex:
                self._held[job_id] = lease
            keep = True
            return lease
        finally:
            if not keep:
                lock.release()

    def _finish_notification(self, lease: NotificationLease, delivered: list[Any], error: str | None) -> None:
        if lease.finished:
            raise InvalidState(f"the notification lease on job {lease.id} was already done")
        keys = {target_key(t) for t in delivered}
        strangers = [t for t in delivered if target_key(t) not in lease._keys]
        if strangers:
            raise InvalidRequest(
                f"done() was given {len(strangers)} target(s) this lease did not offer, e.g. "
                f"{strangers[0]!r}; deliver only targets from lease.waiting (nothing was removed)"
            )
        text = None if error is None else error_text(error)
        try:
            if not lease._lock.still_ours() or lease.compromised is not None:
                err = LeaseLost(f"the notification lease on job {lease.id} was lost; nothing was removed")
                lease._compromise(err)
                raise err
            # RACE: the lock could be broken between the check above and these unlinks only if
            # we stalled for a whole lease; the targets were delivered, so removing them is right.
            self._remove_targets(lease.id, keys)
            remaining = self._tree.read_targets(lease.id)
            if remaining:
                attempts = lease.attempts + 1
                fresh = any(k not in lease._keys for k, _, _ in remaining)
                not_before = self._core.wall() if fresh else self._core.wall() + self._core.settings.backoff(attempts)
                tmp = self._layout.tmp_path(self._core.new_token(), "aux", f"{lease.id}.notify")
                self._tree.write_notify_entry(lease.id, tmp, not_before, attempts, text)
                self._core.pending.note_due(not_before)
            else:
                self._drop_entry(lease.id)
        finally:
            self._forget(lease)

    def _release_notification(self, lease: NotificationLease) -> None:
        """Give the lease back without touching the notification: its entry keeps its due time
        (already passed, so it is offered again at once), attempts and error."""
        if lease.finished:
            raise InvalidState(f"the notification lease on job {lease.id} was already done")
        try:
            if not lease._lock.still_ours() or lease.compromised is not None:
                err = LeaseLost(f"the notification lease on job {lease.id} was lost; nothing to give back")
                lease._compromise(err)
                raise err
        finally:
            self._forget(lease)
        self._tree.bell("work")  # a waiting notifier elsewhere may take it now

    def _forget(self, lease: NotificationLease) -> None:
        lease._lock.release()
        lease._mark_finished()
        with self._mutex:
            self._held.pop(lease.id, None)

    def check_held(self, problem: LeaseLost | None) -> None:
        """Tell every holder whose lock was broken (or, with ``problem``, every holder) so."""
        for note in self.held():
            if problem is not None:
                note._compromise(problem)
            elif not note.finished and not note._lock.still_ours():
                note._compromise(LeaseLost(f"the notification lease on job {note.id} was broken"))

    def close(self) -> None:
        for lease in self.held():
            lease._compromise(LeaseLost("the store was closed", reason="closed"))
            self._forget(lease)


def _gone(why: str, path: str) -> StorageError:
    err = StorageError(errno.ENOENT, why, path)
    err.op = "queue"
    return err
