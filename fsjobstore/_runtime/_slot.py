"""One slot of a worker: pull a job, run its handler, commit what happened, tell it.

Every pool runs :func:`serve` in each of its slots (a thread, a child process); they differ only
in where a slot says what it is doing (a :class:`Reporter`). This module, like all of the
runtime, uses fsjobstore's public API only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import CodeType
from typing import Any, Protocol

from .. import InvalidRequest, JobCancelled, JobStore, LeaseLost, WorkLease
from ._run_flags import Gate
from ._worker_hooks import OF_OUTCOME, OUTCOME_OF, Hooks, JobEvent, drop_caller_frame, say

log = logging.getLogger("fsjobstore.worker")

Handler = Callable[["JobContext"], Any]


class WorkerShutdown(BaseException):
    """Raised in a child process's main thread when its supervisor stops it mid-job: the job
    is given back (released, no attempt counted). A BaseException, so handlers' ``except
    Exception`` does not swallow it."""


class JobContext:
    """What a handler gets: the job, and the calls a running job may make.

    ``id``, ``queue``, ``topic``, ``request``, ``attempt``, ``max_attempts``, ``priority``, ``token`` (the
    idempotency key for side effects outside the store), ``timeout``; :meth:`progress`,
    :meth:`log`, :meth:`touch`, :attr:`cancel_requested` and :meth:`raise_if_cancelled`.
    ``lease`` is the underlying :class:`WorkLease` (return a value rather than committing it).
    """

    def __init__(self, lease: WorkLease, on_touch: Callable[[], None] = lambda: None) -> None:
        self.lease = lease
        self._on_touch = on_touch

    id = property(lambda self: self.lease.id, doc="The job's id.")
    queue = property(lambda self: self.lease.queue, doc="The job's queue.")
    topic = property(lambda self: self.lease.topic, doc="A subscription's copy: the queue it was created into.")
    request = property(lambda self: self.lease.request, doc="The job's request (JSON, as stored).")
    attempt = property(lambda self: self.lease.attempt, doc="1 for the first run, 2 for the first retry, ...")
    max_attempts = property(lambda self: self.lease.max_attempts, doc="Attempts before the job fails for good.")
    priority = property(lambda self: self.lease.priority, doc="The job's priority (lower runs sooner).")
    token = property(lambda self: self.lease.token, doc="This claim's token: the idempotency key.")
    timeout = property(lambda self: self.lease.timeout, doc="Seconds this attempt may run, or None.")

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress (``store.get(id).progress`` shows it)."""
        self.lease.progress(done, total, message)

    def log(self, line: str) -> None:
        """Add a line to this attempt's log (``store.get(id).logs``)."""
        self.lease.log(line)

    def touch(self, extend: float | None = None) -> None:
        """Renew the time limit: ``extend`` seconds from now (default: the job's timeout)."""
        self.lease.touch(extend)
        self._on_touch()

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel this job: stop, and return or raise."""
        return self.lease.cancel_requested

    def raise_if_cancelled(self) -> None:
        """Raise :class:`JobCancelled` if a cancel was requested (a convenient place to stop)."""
        if self.lease.cancel_requested:
            raise JobCancelled(f"job {self.id} was cancelled while it ran")

    def __repr__(self) -> str:
        return f"<JobContext id={self.id!r} queue={self.queue!r} attempt={self.attempt}>"


class Reporter(Protocol):
    """Where a slot says what it is doing (a thread pool's table, or the board of process mode),
    and where its counters are."""

    def started(self, lease: WorkLease) -> None: ...
    def touched(self, lease: WorkLease) -> None: ...
    def finished(self, event: JobEvent) -> None: ...  # count event.outcome
    def dropped(self) -> bool: ...  # this slot was left behind (a hung thread): take no more jobs


def serve(store: JobStore, handlers: Mapping[str, Handler], queues: Sequence[str], gate: Gate,
          reporter: Reporter, hooks: Hooks, *, burst: bool, poll: float = 0.5,
          on_lease: Callable[[WorkLease], None] = lambda lease: None) -> None:
    """Run jobs until the gate says stop, the budget is spent, or (``burst``) nothing is due."""
    while not (gate.stopping() or reporter.dropped()):
        if gate.paused():
            time.sleep(min(poll, 0.2))
            continue
        if not gate.take():
            return
        lease = store.pull_work(queues=list(queues), timeout=0 if burst else poll)
        if lease is None:
            gate.give_back()
            if burst:
                return
            continue
        if gate.stopping():  # told to stop while it waited: this job is not ours to start
            lease.release()
            gate.give_back()
            return
        on_lease(lease)
        run_one(lease, handlers[lease.queue], reporter, hooks)


OUTCOMES = ("fulfilled", "retrying", "failed", "cancelled", "timed-out", "lost", "released")
"""What :func:`run_one` returns: how one attempt ended (RunSummary counts each)."""

ENDED_BECAUSE = {"cancelled": "was cancelled while it ran", "timed_out": "ran past its time limit"}
"""The ``error`` of an attempt ended by a cancel request or its time limit rather than by what
its handler raised (every pool says the same)."""

CANCEL_POLL = 0.1  # seconds between a pool's looks at the cancel requests of running jobs


def fate(store: JobStore, job_id: str, attempt: int) -> str | None:
    """How a job goes on once its attempt ``attempt`` was ended outside :func:`run_one` (a
    time-out, a kill, a crash): its outcome as in :data:`OUTCOMES` (``retrying`` while it is to
    run again, or once a later attempt began); ``running`` while that attempt's claim is still
    there (its holder is dead, but the recoverer taking it over, maybe another process's, has
    not ended it yet: ask again later); or None when its state cannot be read (purged
    meanwhile, or unreadable)."""
    try:
        job = store.get(job_id)
    except Exception as exc:  # a status, not state: never stop a pool's monitor for it
        log.debug("job %s: could not read its state: %s", job_id, exc)
        return None
    # A later attempt may already have run and ended by the time we look (no backoff, a loaded
    # machine): "attempt 1 ended fulfilled" would be the second attempt's outcome, not this one's.
    if job.attempts > attempt:
        return "retrying"
    state = job.state.value
    if state == "active":
        return "running"  # this attempt's claim is not ended yet (another recoverer is mid-way)
    return "retrying" if state in ("pending", "scheduled") else state


def next_look(leases: Iterable[WorkLease | None], now: float, cancel_look: float, due: list[float]) -> float:
    """Seconds until a pool that watches its slots' leases in this process (threads, asyncio)
    must look again if nothing rings: the nearest of ``due`` (other reasons, in seconds from
    now), the deadline of a running job, and the next look at cancel requests while jobs run."""
    for lease in leases:
        if lease is not None and not lease.finished:
            due.append(cancel_look - now)
            if lease.deadline is not None:
                due.append(lease.deadline - now)
    return max(0.0, min(due, default=3600.0))


def give_back_running(lease: WorkLease | None, began: float, tally: Tally, hooks: Hooks) -> bool:
    """Release a job still running when the grace period ends (no attempt counted) and tell
    it (the log line, ``tally``, the hook thread); False if it had ended or cannot be released
    (a storage fault: recovery has it). ``began``: wall time its attempt started."""
    if lease is None or lease.finished:
        return False
    try:
        lease.release()
    except Exception as exc:
        log.debug("releasing %s at shutdown: %s", lease.id, exc)
        return False
    tell(JobEvent("given_back", lease.id, lease.queue, lease.attempt, "given_back", time.time() - began,
                  "given back at shutdown"), tally, hooks)
    return True


def tell(event: JobEvent, tally: Tally, hooks: Hooks) -> None:
    """Tell an attempt that ended outside a slot's :func:`run_one` (the supervisor's time-out or
    kill, a give-back, the asyncio pool): the log line, then ``tally``, then the hook thread."""
    say(event)
    tally.count(event)
    hooks.later(event)


class Tally:
    """How many attempts ended with each outcome, in :data:`OUTCOMES`' order."""

    def __init__(self, counts: Sequence[int] = ()) -> None:
        self.counts = list(counts) or [0] * len(OUTCOMES)

    def add(self, outcome: str, n: int = 1) -> None:
        self.counts[OUTCOMES.index(outcome)] += n

    def count(self, event: JobEvent) -> None:
        """Count an ending event (its ``outcome``, one of the hooks' ENDINGS)."""
        self.add(OUTCOME_OF[event.outcome or ""])

    def __add__(self, other: Tally) -> Tally:
        return Tally([a + b for a, b in zip(self.counts, other.counts, strict=True)])

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(self.counts)

    def ended(self) -> int:
        """Attempts that ended, given-back ones included (a slot that ended one is working)."""
        return sum(self.counts)


def run_one(lease: WorkLease, handler: Handler, reporter: Reporter, hooks: Hooks) -> str:
    """Run ``handler`` on one leased job, commit the outcome, tell it (the log line, the
    reporter's counters, then the hooks: ``_hooks``); returns the outcome, one of
    :data:`OUTCOMES`.

    Anything the handler raises is a failed attempt, ``BaseException`` included: a handler's
    ``sys.exit()`` or ``KeyboardInterrupt`` must not end the slot with its job given back
    uncounted, or the job would run again at once, forever. The one exception is
    :class:`WorkerShutdown`, the worker's own graceful stop, which gives the job back."""
    reporter.started(lease)
    started = time.monotonic()
    pid = os.getpid()
    outcome, error = "lost", None
    try:
        try:
            if hooks:
                hooks.emit(JobEvent("started", lease.id, lease.queue, lease.attempt))
            value = handler(JobContext(lease, lambda: reporter.touched(lease)))
            if inspect.iscoroutine(value):  # an async def handler, outside asyncio mode: its own loop
                value = asyncio.run(value)
        except WorkerShutdown:
            outcome = _release(lease)
            raise
        except BaseException as exc:  # handler code is untrusted: see the docstring
            _forked_by_handler(pid)
            drop_own_frame(exc)
            outcome = commit_failure(lease, exc)
            error = described(exc)
        else:
            _forked_by_handler(pid)
            outcome = commit_value(lease, value)
    finally:
        name = OF_OUTCOME[outcome]
        # Ended by a cancel request or the time limit while the handler returned: say why, as
        # the pools that end an attempt from outside do.
        error = error or ENDED_BECAUSE.get(name)
        event = JobEvent(name, lease.id, lease.queue, lease.attempt, name, time.monotonic() - started, error)
        say(event)
        reporter.finished(event)
        if hooks and not reporter.dropped():  # a dropped slot's attempt was told when it was left
            hooks.emit(event)
    return outcome


def described(exc: BaseException) -> str:
    """``Type: message``, or the type alone when there is no message (a bare KeyboardInterrupt)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _forked_by_handler(pid: int) -> None:
    """A handler that called ``os.fork()`` returns twice. The copy in the new process must not
    commit (its parent does) nor go on taking jobs as a worker nobody supervises: it ends here,
    at once, without running any cleanup it inherited."""
    if os.getpid() != pid:
        os._exit(0)


def drop_own_frame(exc: BaseException, caller: CodeType | None = None) -> None:
    """The stored traceback starts at the handler, not at the runtime's call of it (``caller``:
    the code that called it, default :func:`run_one`)."""
    drop_caller_frame(exc, caller or run_one.__code__)


def _ended(lease: WorkLease) -> str | None:
    """How a lease that ended outside our commit ended, or None if it is still ours."""
    if not lease.finished:
        return None
    lost = lease.compromised
    return "lost" if lost is None or lost.reason != "timeout" else "timed-out"


def commit_value(lease: WorkLease, value: Any) -> str:
    if lease.finished:  # the handler committed it itself, or it timed out meanwhile
        return _ended(lease) or "fulfilled"
    try:
        lease.fulfill(value)
        return "fulfilled"
    except JobCancelled:
        return "cancelled"
    except LeaseLost:
        return _ended(lease) or "lost"
    except InvalidRequest as exc:
        # The handler returned something that cannot be stored (a set, a datetime, too big):
        # a bug in the handler, which running it again will not cure, so the job fails for good.
        why = f"the handler's return value cannot be stored: {exc}"
        outcome = commit_failure(lease, why, retry=False)
        if outcome == "failed":
            log.warning("job %s: %s", lease.id, why)
        return outcome


def commit_failure(lease: WorkLease, exc: BaseException | str, *, retry: bool = True) -> str:
    if isinstance(exc, JobCancelled) and lease.cancel_requested:
        exc = JobCancelled("the handler stopped on a cancel request")
    ended = _ended(lease)
    if ended is not None:
        return ended
    try:
        lease.fail(exc, retry=retry)
    except JobCancelled:
        return "cancelled"
    except LeaseLost:
        return _ended(lease) or "lost"
    return "retrying" if retry and lease.attempt < lease.max_attempts else "failed"


def _release(lease: WorkLease) -> str:
    if lease.finished:
        return _ended(lease) or "released"
    try:
        lease.release()
    except LeaseLost:
        return _ended(lease) or "lost"
    return "released"
