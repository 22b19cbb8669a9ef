"""The leases users get: what ``pull_work`` and ``pull_notification`` return.

A lease is a view of a claim: the claim's changing state (its file, token, deadline, whether it
ended and why) lives in one class beside the code that changes it, ``_work.WorkClaim`` for work
and ``_notify.NotificationClaim`` for notifications. A lease reads that state and calls the
claim's methods; it holds nothing of its own. The claims are seen here only through the small
``WorkClaimed`` and ``NotificationClaimed`` protocols, so this module imports neither.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Protocol

from .._errors import LeaseLost
from .._format._job import JobState
from .._format._records import Record
from .._format._values import Duration

log = logging.getLogger("fsjobstore")

OnCompromised = Callable[[LeaseLost], object]


class ClaimEnd:
    """How a claim ended, shared by both kinds of claim: finished (committed, released or
    lost) and, if lost, why. ``on_compromised`` runs once, with the reason."""

    def __init__(self, on_compromised: OnCompromised | None) -> None:
        self.mutex = threading.Lock()
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
        with self.mutex:
            self._callback = callback
        self._deliver()

    @property
    def compromised(self) -> LeaseLost | None:
        return self._compromised

    @property
    def finished(self) -> bool:
        return self._finished

    def compromise(self, error: LeaseLost) -> None:
        """Record that the claim is lost (unless it ended already) and tell the holder, once."""
        with self.mutex:
            if self._compromised is not None or self._finished:
                return
            self._compromised = error
        self._deliver()

    def _deliver(self) -> None:
        with self.mutex:
            if self._compromised is None or self._notified or self._callback is None:
                return
            self._notified = True
            callback, error = self._callback, self._compromised
        try:
            callback(error)
        except Exception:  # a user's callback must not kill the heartbeat thread
            log.exception("on_compromised callback raised")

    def mark_finished(self) -> None:
        with self.mutex:
            self._finished = True


class _Claimed(Protocol):
    """What both leases read of their claim (``ClaimEnd`` provides it)."""

    on_compromised: OnCompromised | None

    @property
    def record(self) -> Record: ...
    @property
    def compromised(self) -> LeaseLost | None: ...
    @property
    def finished(self) -> bool: ...


class RunLogging(Protocol):
    def progress(self, done: Any, total: Any, message: Any) -> None: ...
    def log(self, line: Any) -> None: ...


class WorkClaimed(_Claimed, Protocol):
    """A work claim, as its lease sees it (``_work.WorkClaim``)."""

    on_cancel: Callable[[WorkLease], object] | None

    @property
    def token(self) -> str: ...
    @property
    def deadline(self) -> float | None: ...
    def commit(self, kind: str, payload: Any, retry: bool, delay: Duration | None) -> None: ...
    def touch(self, extend: Duration | None) -> None: ...
    def run_log(self) -> RunLogging: ...
    def cancel_requested(self) -> bool: ...
    def time_out(self) -> bool: ...


class NotificationClaimed(_Claimed, Protocol):
    """A notification claim, as its lease sees it (``_notify.NotificationClaim``)."""

    @property
    def state(self) -> JobState: ...
    @property
    def waiting(self) -> tuple[Any, ...]: ...
    @property
    def attempts(self) -> int: ...
    def done(self, delivered: list[Any], error: str | None) -> None: ...
    def release(self) -> None: ...


class _Lease:
    """What both leases show of their claim: whether it ended, and why it was lost."""

    _claim: _Claimed

    @property
    def on_compromised(self) -> OnCompromised | None:
        return self._claim.on_compromised

    @on_compromised.setter
    def on_compromised(self, callback: OnCompromised | None) -> None:
        self._claim.on_compromised = callback

    @property
    def compromised(self) -> LeaseLost | None:
        """Why the lease was lost, or None while it is (as far as we know) ours."""
        return self._claim.compromised

    @property
    def id(self) -> str:
        """The job's id."""
        return self._claim.record.id

    @property
    def request(self) -> Any:
        """The job's request, as stored (JSON)."""
        return self._claim.record.request

    @property
    def queue(self) -> str:
        """The job's queue: the one it was claimed from (or, for a notification, the one a
        notifier naming queues or patterns was given it for)."""
        return self._claim.record.queue

    @property
    def topic(self) -> str | None:
        """A subscription's copy: the queue its job was created into (``subscribe``); else None."""
        return self._claim.record.topic

    @property
    def finished(self) -> bool:
        """True once this handle has committed, released, or lost its lease."""
        return self._claim.finished


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

    def __init__(self, claim: WorkClaimed) -> None:
        self._claim: WorkClaimed = claim

    @property
    def token(self) -> str:
        """This claim's fencing token: unique to this claim, part of the claimed file's name.
        Use it as the idempotency key of side effects outside the store."""
        return self._claim.token

    @property
    def priority(self) -> int:
        """The job's priority (lower runs sooner)."""
        return self._claim.record.priority

    @property
    def attempt(self) -> int:
        """This attempt's number: 1 for the first run, 2 for the first retry, ..."""
        return self._claim.record.attempts + 1

    @property
    def max_attempts(self) -> int:
        """Attempts the job gets before it fails for good."""
        return self._claim.record.max_attempts

    @property
    def timeout(self) -> float | None:
        """Seconds one attempt of this job may run (``create(timeout=...)``), or None."""
        return self._claim.record.timeout

    @property
    def deadline(self) -> float | None:
        """When this attempt's time runs out, on the store's monotonic clock (None: no limit).
        :meth:`touch` moves it. The worker runtime enforces it; other processes take the job
        over once it has passed by a ``lease_duration``."""
        return self._claim.deadline

    def touch(self, extend: Duration | None = None) -> None:
        """Renew this attempt's time limit: ``extend`` from now (seconds, a timedelta, or a
        duration such as ``"10m"``; default: the job's ``timeout`` again). Seen by every
        process. Raises :class:`LeaseLost` if the claim is gone, :class:`InvalidRequest` if the
        job has no timeout and ``extend`` is not given."""
        self._claim.touch(extend)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far this attempt got; ``JobStore.get(id).progress`` shows the latest.
        Raises :class:`LeaseLost` once the claim is no longer ours (never mixed into another
        attempt's). Cheap: one small append, not fsynced."""
        self._claim.run_log().progress(done, total, message)

    def log(self, line: str) -> None:
        """Add a line to this attempt's log (``JobStore.get(id).logs``). The oldest lines are
        dropped, and counted, past 256 KiB per attempt. Raises :class:`LeaseLost` like
        :meth:`progress`."""
        self._claim.run_log().log(line)

    def time_out(self) -> bool:
        """End this attempt as timed out: a failed attempt (retried, or failed for good, as
        usual), ``on_compromised`` fires with reason ``"timeout"``, and any later commit of this
        lease raises :class:`LeaseLost`. What the worker runtime does when an attempt runs past
        :attr:`deadline` in a thread it cannot stop. False if the lease had already ended."""
        return self._claim.time_out()

    @property
    def cancel_requested(self) -> bool:
        """True once ``JobStore.cancel`` was asked for this job. A handler that sees it should
        stop; whatever it commits then, the job ends ``cancelled``. Reading it checks the store
        (one stat) and fires :attr:`on_cancel` the first time it is true."""
        return self._claim.cancel_requested()

    @property
    def on_cancel(self) -> Callable[[WorkLease], object] | None:
        """Called once, with this lease, when a cancel request is first noticed (by the store's
        heartbeat, or by reading :attr:`cancel_requested`)."""
        return self._claim.on_cancel

    @on_cancel.setter
    def on_cancel(self, callback: Callable[[WorkLease], object] | None) -> None:
        self._claim.on_cancel = callback

    def fulfill(self, value: Any) -> None:
        """Make the job final with ``value``: bytes (kept as bytes) or any JSON value (str,
        number, bool, None, list, dict), given back as stored JSON. Raises :class:`LeaseLost`
        if the claim is gone, :class:`InvalidRequest` if the value is neither."""
        self._claim.commit("fulfill", value, False, None)

    def fail(self, error: BaseException | str, *, retry: bool = True, delay: Duration | None = None) -> None:
        """Record a failed attempt; retried after ``delay`` (seconds, a timedelta, or a duration
        such as ``"5m"``; default the store's backoff) while attempts remain and ``retry`` is
        true, otherwise the job becomes final ``failed``."""
        self._claim.commit("fail", error, retry, delay)

    def release(self) -> None:
        """Give the job back untouched (the attempt is not counted)."""
        self._claim.commit("release", None, False, None)

    def __enter__(self) -> WorkLease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.finished:
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

    def __init__(self, claim: NotificationClaimed) -> None:
        self._claim: NotificationClaimed = claim

    @property
    def state(self) -> JobState:
        """The job's final state: fulfilled, failed or cancelled."""
        return self._claim.state

    @property
    def waiting(self) -> tuple[Any, ...]:
        """The targets to deliver to, oldest first (as they were when the lease was taken)."""
        return self._claim.waiting

    @property
    def attempts(self) -> int:
        """Earlier delivery attempts of this notification that left targets undelivered."""
        return self._claim.attempts

    @property
    def value(self) -> Any:
        """The job's result (bytes, or a JSON value), or None if it did not succeed."""
        return self._claim.record.value

    @property
    def error(self) -> str | None:
        """The job's last error (a failed job), or its reason (a cancelled one)."""
        return self._claim.record.error

    def done(self, delivered: Iterable[Any] = (), *, error: str | None = None) -> None:
        """Remove the ``delivered`` targets and release the lease. ``error`` describes why the
        others were not delivered; it is kept with the notification for the next attempt.

        Every delivered target must be one of :attr:`waiting`; anything else is a mistake in the
        caller and raises :class:`InvalidRequest` before anything changes (the lease is still
        held, so ``done`` can be called again)."""
        self._claim.done(list(delivered), error)

    def release(self) -> None:
        """Give the notification back untouched, as :meth:`WorkLease.release` gives a job back:
        no delivery attempt is counted, no backoff is set, its last delivery error stays, and it
        is offered again at once. Raises :class:`LeaseLost` if the lease was lost meanwhile
        (nothing of ours to give back), :class:`InvalidState` if it had already ended."""
        self._claim.release()

    def __enter__(self) -> NotificationLease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.finished:
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
