"""Hooks: user code told about each job a worker runs (``Worker.on``), the way dramatiq's
middleware, huey's signals and Celery's signals are.

Every attempt makes one :class:`JobEvent` when it starts and one when it ends. The ending event is
told first to the runtime's own log line (:func:`say`), then to the pool's counters (what
:class:`RunSummary` adds up), then to the user's hooks, in the order they were registered: for
the outcome's own name (``"fulfilled"``, ``"retried"``, ...), then for ``"finished"``. So a hook
can neither change what the log and the counts say, nor the job: it runs after the outcome was
committed (or, for ``"started"``, before the handler, which runs whatever the hook does).

A hook that raises is logged (with its traceback the first time, one line after that) and
passed over; the job, the other hooks and the worker go on. ``SystemExit`` and
``KeyboardInterrupt`` from a hook are caught the same way: hook code is user code.

Where hooks run: in the thread or child process that ran the job, where a slow hook holds that
slot as a slow handler would. What the supervisor tells (in process mode an attempt it ended: a
child killed past its time limit or on a cancel request, or dead, once recovery has ended the
claim; in thread mode a time-out, and jobs given back when the grace period ends) and every
event of asyncio mode go to one hook thread of the worker's process, in order (:meth:`Hooks.later`):
a slow hook there delays the hooks after it, never the supervisor's watch of time limits and
signals, nor asyncio mode's event loop.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import CodeType

from .. import InvalidRequest

_START = threading.Lock()

log = logging.getLogger("fsjobstore.worker")

ENDINGS = ("fulfilled", "retried", "failed", "cancelled", "timed_out", "lost", "given_back")
"""The events of an ended attempt: exactly one per attempt, as :class:`RunSummary` counts them."""

EVENTS = ("started", *ENDINGS, "finished")
"""What :meth:`Worker.on` accepts; ``"finished"`` is told after each of :data:`ENDINGS`."""

# The runtime's own outcome words (_slot.OUTCOMES) and the events that tell them.
OF_OUTCOME = {"fulfilled": "fulfilled", "retrying": "retried", "failed": "failed", "cancelled": "cancelled",
              "timed-out": "timed_out", "lost": "lost", "released": "given_back"}
OUTCOME_OF = {event: outcome for outcome, event in OF_OUTCOME.items()}


@dataclass(frozen=True, slots=True)
class JobEvent:
    """What a hook is called with.

    ``event``: the name the hook was registered for (``"finished"`` hooks get ``"finished"``;
    ``outcome`` says how). ``outcome``: one of :data:`ENDINGS`, or None for ``"started"``.
    ``duration``: seconds the attempt ran (None for ``"started"``). ``error``: what the handler
    raised (``"Type: message"``), or why the attempt ended otherwise; None for a fulfilled one.
    ``then``: for an attempt the worker ended from outside (``timed_out``, a killed or dead
    child), what the job does next (``"retrying"``, ``"failed"``, ...), else None. For the
    request, the value or the logs: ``store.get(event.job_id)``.
    """

    event: str
    job_id: str
    queue: str
    attempt: int
    outcome: str | None = None
    duration: float | None = None
    error: str | None = None
    then: str | None = None


Hook = Callable[[JobEvent], object]


def check_event(event: object) -> str:
    if event not in EVENTS:
        raise InvalidRequest(f"no hook event {event!r}: use one of {', '.join(EVENTS)}")
    return str(event)


class Hooks:
    """The user's hooks of one worker, by event. Registered before ``run()``; a forked child
    gets a copy, a thread shares them."""

    def __init__(self) -> None:
        self._by_event: dict[str, list[Hook]] = {name: [] for name in EVENTS}
        self._told: set[int] = set()  # hooks whose first error was logged with its traceback
        self._queue: queue.Queue[JobEvent] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pid = 0  # the process whose hook thread _thread is (a forked child has none)

    def add(self, event: str, fn: Hook) -> None:
        if not callable(fn):
            raise InvalidRequest(f"the hook for {event!r} is not callable: {fn!r}")
        self._by_event[check_event(event)].append(fn)

    def pairs(self) -> list[tuple[str, Hook]]:
        return [(name, fn) for name, fns in self._by_event.items() for fn in fns]

    def __bool__(self) -> bool:
        return any(self._by_event.values())

    def later(self, event: JobEvent) -> None:
        """:meth:`emit` on the hook thread (started on first use), in the order given."""
        if not self:
            return
        with _START:
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._drain, name="fsjobstore-hooks", daemon=True)
                self._thread.start()
        self._queue.put(event)

    def _drain(self) -> None:
        while True:
            event = self._queue.get()
            try:
                self.emit(event)
            finally:
                self._queue.task_done()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout`` s) until the hook thread has told what it was given: a run
        tells its last events before it returns."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def emit(self, event: JobEvent) -> None:
        """Call the hooks of ``event.event``, then, for an ending, those of ``"finished"``. (The
        store counts each ending itself, in the transition that makes it.)"""
        self._call(event)
        if event.event in ENDINGS and self._by_event["finished"]:
            self._call(replace(event, event="finished"))

    def _call(self, event: JobEvent) -> None:
        for fn in self._by_event[event.event]:
            try:
                fn(event)
            # Hook code is user code (module docstring). Not BaseException: the worker's own stop
            # of a child (WorkerShutdown, raised by SIGTERM) must go through.
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                drop_caller_frame(exc, Hooks._call.__code__)  # its traceback starts at the hook, as a handler's does
                first = id(fn) not in self._told
                self._told.add(id(fn))
                log.error("hook %s for %s of job %s raised %s: %s; the job is not affected",
                          getattr(fn, "__qualname__", repr(fn)), event.event, event.job_id,
                          type(exc).__name__, exc, exc_info=exc if first else None)


def drop_caller_frame(exc: BaseException, caller: CodeType) -> None:
    """Start ``exc``'s traceback at the user's code (a handler, a hook) that raised it, not at
    the runtime's call of it in ``caller``: what a user reads in the log or the job's error is
    theirs alone, as Celery and RQ show a task's."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code is caller and tb.tb_next is not None:
        exc.__traceback__ = tb.tb_next



def say(event: JobEvent) -> None:
    """The runtime's own line for an ended attempt, in both pools."""
    if event.then is not None:  # ended from outside the handler: say how the job goes on
        then = {"retrying": "and is retrying", "lost": "and is lost"}.get(event.then, event.then)
        log.info("job %s queue=%s attempt=%d ended %s", event.job_id, event.queue, event.attempt, then)
        return
    word = OUTCOME_OF[event.outcome or ""]
    why = f": {event.error}" if event.error else ""
    log.info("job %s queue=%s attempt=%d %s (ran %.3fs)%s", event.job_id, event.queue, event.attempt, word,
             event.duration or 0.0, why)
