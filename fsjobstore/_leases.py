"""Lease handles: what ``pull_work`` and ``pull_notification`` return.

A handle is the only way to commit a claimed job. Its methods delegate to the store through
the small ``_WorkCommitter`` and ``_NotificationCommitter`` protocols, so this module does not import the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from ._errors import LeaseLost
from ._records import JobState, Record

if TYPE_CHECKING:
    from ._liveness import NotifyLock

log = logging.getLogger("fsjobstore")

OnCompromised = Callable[[LeaseLost], object]


class _WorkCommitter(Protocol):
    def _commit_work(self, lease: WorkLease, kind: str, payload: Any, retry: bool,
                     delay: float | None) -> None: ...
    def _touch(self, lease: WorkLease, extend: float | None) -> None: ...
    def _run_log(self, lease: WorkLease) -> _RunLog: ...
    def _cancel_requested(self, lease: WorkLease) -> bool: ...
    def _time_out(self, lease: WorkLease) -> bool: ...


class _RunLog(Protocol):
    def progress(self, done: Any, total: Any, message: Any) -> None: ...
    def log(self, line: Any) -> None: ...


class _NotificationCommitter(Protocol):
    def _finish_notification(self, lease: NotificationLease, delivered: list[Any],
                             error: str | None) -> None: ...
    def _release_notification(self, lease: NotificationLease) -> None: ...


class _Lease:
    """Shared compromise bookkeeping: the callback runs once, with the reason."""

    def __init__(self, on_compromised: OnCompromised | None) -> None:
        self._mutex = threading.Lock()
        self._callback = on_compromised
        self._compromised: LeaseLost | None = None
        self._notified = False
        self._finished = False

    @property
    def on_compromised(self) -> OnCompromised | None:
        return self._callback

    @on_compromised.setter
    def on_compromised(self, callback: OnCompromised | None) -> None:
        # Setting it after the lease was already lost still delivers the news, once.
        with self._mutex:
            self._callback = callback
        self._deliver()

    @property
    def compromised(self) -> LeaseLost | None:
        """Why the lease was lost, or None while it is (as far as we know) ours."""
        return self._compromised

    @property
    def finished(self) -> bool:
        """True once this handle has committed, released, or lost its lease."""
        return self._finished

    def _compromise(self, error: LeaseLost) -> None:
        with self._mutex:
            if self._compromised is not None or self._finished:
                return
            self._compromised = error
        self._deliver()

    def _deliver(self) -> None:
        with self._mutex:
            if self._compromised is None or self._notified or self._callback is None:
                return
            self._notified = True
            callback, error = self._callback, self._compromised
        try:
            callback(error)
        except Exception:  # a user's callback must not kill the heartbeat thread
            log.exception("on_compromised callback raised")

    def _mark_finished(self) -> None:
        with self._mutex:
            self._finished = True


class WorkLease(_Lease):
    """An exclusive claim on one job. Commit it with :meth:`fulfill`, :meth:`fail` or :meth:`release`.

    :attr:`token` is unique to this claim and is part of the claimed file's name; a commit is a
    rename of exactly that name, so once the claim is taken over (the lease expired, or a
    recovery found us dead) every commit raises :class:`LeaseLost` and changes nothing. Use the
    token as the idempotency key for side effects outside the store: execution is at least
    once, commit is exactly once.

    As a context manager: an exception in the body counts as a failed attempt (retried per the
    job's ``max_attempts``) and is re-raised; leaving the body without committing releases, and
    so does a ``KeyboardInterrupt`` or ``SystemExit`` (the process is stopping: not the job's
    fault, and no attempt is counted). Time limits are not delivered as exceptions: the worker
    runtime ends a timed-out attempt itself, as a failed attempt (see :meth:`touch`).
    """

    def __init__(self, store: _WorkCommitter, record: Record, token: str,
                 on_compromised: OnCompromised | None, size: int = 0, clean: bool = True) -> None:
        super().__init__(on_compromised)
        self._store = store
        self._record = record
        self._size = size  # bytes of the claimed file: where a final commit appends its result
        self._clean = clean  # the file is known to end at _size (no torn tail, no failed attempt)
        self._committing = False  # set once the commit's first visible step is under way
        self._token = token
        self._commit_lock = threading.RLock()  # one commit at a time (a handler, a time limit)
        self._deadline: float | None = None  # monotonic; None: no time limit
        self._deadline_path: str | None = None
        self._run: _RunLog | None = None
        self._on_cancel: Callable[[WorkLease], object] | None = None
        self._cancel_seen = False

    @property
    def token(self) -> str:
        """This claim's fencing token: unique to this claim, part of the claimed file's name.
        Use it as the idempotency key of side effects outside the store."""
        return self._token

    @property
    def id(self) -> str:
        """The job's id."""
        return self._record.id

    @property
    def request(self) -> Any:
        """The job's request, as stored (JSON)."""
        return self._record.request

    @property
    def queue(self) -> str:
        """The queue the job was claimed from."""
        return self._record.queue

    @property
    def priority(self) -> int:
        """The job's priority (lower runs sooner)."""
        return self._record.priority

    @property
    def attempt(self) -> int:
        """This attempt's number: 1 for the first run, 2 for the first retry, ..."""
        return self._record.attempts + 1

    @property
    def max_attempts(self) -> int:
        """Attempts the job gets before it fails for good."""
        return self._record.max_attempts

    @property
    def timeout(self) -> float | None:
        """Seconds one attempt of this job may run (``create(timeout=...)``), or None."""
        return self._record.timeout

    @property
    def deadline(self) -> float | None:
        """When this attempt's time runs out, on the store's monotonic clock (None: no limit).
        :meth:`touch` moves it. The worker runtime enforces it; other processes take the job
        over once it has passed by a ``lease_duration``."""
        return self._deadline

    def touch(self, extend: float | None = None) -> None:
        """Renew this attempt's time limit: ``extend`` seconds from now (default: the job's
        ``timeout`` again). Seen by every process. Raises :class:`LeaseLost` if the claim is
        gone, :class:`InvalidRequest` if the job has no timeout and ``extend`` is not given."""
        self._store._touch(self, extend)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far this attempt got; ``JobStore.get(id).progress`` shows the latest.
        Raises :class:`LeaseLost` once the claim is no longer ours (never mixed into another
        attempt's). Cheap: one small append, not fsynced."""
        self._store._run_log(self).progress(done, total, message)

    def log(self, line: str) -> None:
        """Add a line to this attempt's log (``JobStore.get(id).logs``). The oldest lines are
        dropped, and counted, past 256 KiB per attempt. Raises :class:`LeaseLost` like
        :meth:`progress`."""
        self._store._run_log(self).log(line)

    def time_out(self) -> bool:
        """End this attempt as timed out: a failed attempt (retried, or failed for good, as
        usual), ``on_compromised`` fires with reason ``"timeout"``, and any later commit of this
        lease raises :class:`LeaseLost`. What the worker runtime does when an attempt runs past
        :attr:`deadline` in a thread it cannot stop. False if the lease had already ended."""
        return self._store._time_out(self)

    @property
    def cancel_requested(self) -> bool:
        """True once ``JobStore.cancel`` was asked for this job. A handler that sees it should
        stop; whatever it commits then, the job ends ``cancelled``. Reading it checks the store
        (one stat) and fires :attr:`on_cancel` the first time it is true."""
        if self._cancel_seen:
            return True
        if self._finished or not self._store._cancel_requested(self):
            return False
        with self._mutex:
            first, self._cancel_seen = not self._cancel_seen, True
            callback = self._on_cancel
        if first and callback is not None:
            try:
                callback(self)
            except Exception:
                log.exception("on_cancel callback raised")
        return True

    @property
    def on_cancel(self) -> Callable[[WorkLease], object] | None:
        """Called once, with this lease, when a cancel request is first noticed (by the store's
        heartbeat, or by reading :attr:`cancel_requested`)."""
        return self._on_cancel

    @on_cancel.setter
    def on_cancel(self, callback: Callable[[WorkLease], object] | None) -> None:
        self._on_cancel = callback

    def fulfill(self, value: Any) -> None:
        """Make the job final with ``value``: bytes (kept as bytes) or any JSON value (str,
        number, bool, None, list, dict), given back as stored JSON. Raises :class:`LeaseLost`
        if the claim is gone, :class:`InvalidRequest` if the value is neither."""
        self._store._commit_work(self, "fulfill", value, False, None)

    def fail(self, error: BaseException | str, *, retry: bool = True, delay: float | None = None) -> None:
        """Record a failed attempt; retried after ``delay`` (or the store's backoff) while
        attempts remain and ``retry`` is true, otherwise the job becomes final ``failed``."""
        self._store._commit_work(self, "fail", error, retry, delay)

    def release(self) -> None:
        """Give the job back untouched (the attempt is not counted)."""
        self._store._commit_work(self, "release", None, False, None)

    def __enter__(self) -> WorkLease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._finished:
            return
        try:
            if exc is not None and isinstance(exc, Exception):
                self.fail(exc)
            else:  # clean exit, or KeyboardInterrupt/SystemExit: not the job's fault
                self.release()
        except LeaseLost:
            if exc is None:
                raise

    def __repr__(self) -> str:
        return f"<WorkLease id={self.id!r} queue={self.queue!r} attempt={self.attempt} token={self.token!r}>"


class NotificationLease(_Lease):
    """An exclusive claim on delivering one final job's result to its waiting targets.

    Call :meth:`done` with the targets that were delivered; they are removed while the lease is
    still held. The rest are offered again after a backoff. :meth:`release` gives it back
    untouched (no delivery attempt counted, no backoff).

    As a context manager: an exception in the body is a failed delivery (``done([])`` with the
    exception as its error, retried after a backoff) and is re-raised; leaving the body without
    calling :meth:`done` releases, and so does a ``KeyboardInterrupt`` or ``SystemExit``.
    """

    def __init__(self, store: _NotificationCommitter, record: Record, state: JobState, waiting: tuple[Any, ...],
                 keys: frozenset[str], lock: NotifyLock, attempts: int,
                 on_compromised: OnCompromised | None) -> None:
        super().__init__(on_compromised)
        self._store = store
        self._record = record
        self._keys = keys  # the targets offered, to tell them from ones queued meanwhile
        self._lock = lock
        self._state = state
        self._waiting = waiting
        self._attempts = attempts

    @property
    def id(self) -> str:
        """The job's id."""
        return self._record.id

    @property
    def state(self) -> JobState:
        """The job's final state: fulfilled, failed or cancelled."""
        return self._state

    @property
    def waiting(self) -> tuple[Any, ...]:
        """The targets to deliver to, oldest first (as they were when the lease was taken)."""
        return self._waiting

    @property
    def attempts(self) -> int:
        """Earlier delivery attempts of this notification that left targets undelivered."""
        return self._attempts

    @property
    def request(self) -> Any:
        """The job's request, as stored (JSON)."""
        return self._record.request

    @property
    def value(self) -> Any:
        """The job's result (bytes, or a JSON value), or None if it did not succeed."""
        return self._record.value

    @property
    def error(self) -> str | None:
        """The job's last error (a failed job), or its reason (a cancelled one)."""
        return self._record.error

    def done(self, delivered: Iterable[Any] = (), *, error: str | None = None) -> None:
        """Remove the ``delivered`` targets and release the lease. ``error`` describes why the
        others were not delivered; it is kept with the notification for the next attempt.

        Every delivered target must be one of :attr:`waiting`; anything else is a mistake in the
        caller and raises :class:`InvalidRequest` before anything changes (the lease is still
        held, so ``done`` can be called again)."""
        self._store._finish_notification(self, list(delivered), error)

    def release(self) -> None:
        """Give the notification back untouched, as :meth:`WorkLease.release` gives a job back:
        no delivery attempt is counted, no backoff is set, its last delivery error stays, and it
        is offered again at once. Raises :class:`LeaseLost` if the lease was lost meanwhile
        (nothing of ours to give back), :class:`InvalidState` if it had already ended."""
        self._store._release_notification(self)

    def __enter__(self) -> NotificationLease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._finished:
            try:
                if exc is not None and isinstance(exc, Exception):
                    self.done([], error=f"{type(exc).__name__}: {exc}")
                else:  # clean exit, or KeyboardInterrupt/SystemExit: not the delivery's fault
                    self.release()
            except LeaseLost:
                if exc is None:
                    raise

    def __repr__(self) -> str:
        return f"<NotificationLease id={self.id!r} state={self.state.value} waiting={len(self.waiting)}>"
