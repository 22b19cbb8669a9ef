"""The worker runtime: run handlers against a store, in threads or child processes.

    from fsjobstore import JobStore, Worker

    worker = Worker(JobStore("./jobs"), concurrency=4)

    @worker.handler("images")
    def resize(job):                  # job: a JobContext (id, request, attempt, token, progress, log, ...)
        ...
        return {"width": 640}         # the job's value (bytes, or any JSON); raise to fail the attempt

    worker.run()                      # until SIGTERM/SIGINT; run(burst=True) stops when nothing is due

Built on fsjobstore's public API only, like any user's code would be (a test checks).
"""

from __future__ import annotations

import fnmatch
import inspect
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Literal

from . import InvalidRequest, JobStore, JobStoreError, check_interest, check_queues
from ._runtime._asyncio import AsyncPool
from ._runtime._deliverer import Deliverer
from ._runtime._pool import Pool
from ._runtime._processes import ProcessPool
from ._runtime._run_flags import Gate
from ._runtime._slot import Handler, JobContext, Tally, WorkerShutdown
from ._runtime._threads import ThreadPool
from ._runtime._wake_pipe import Bell
from ._runtime._worker_hooks import EVENTS, Hook, Hooks, JobEvent, check_event
from .schedule import Periodic, Schedule

__all__ = ["EVENTS", "Deliverer", "JobContext", "JobEvent", "RunSummary", "Worker", "WorkerShutdown"]

log = logging.getLogger("fsjobstore.worker")

Mode = Literal["processes", "threads", "asyncio"]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What one :meth:`Worker.run` did: how each attempt it ran ended, how long it ran, and why
    it stopped. Each attempt is counted once, under the first of these that applies."""

    fulfilled: int  # committed a value
    retried: int  # failed (the handler raised, or its process died) and will run again after a backoff
    failed: int  # failed for good: its last attempt, or a value that cannot be stored
    cancelled: int  # ended cancelled (the handler stopped on a cancel request, or its process was killed)
    timed_out: int  # ran past its time limit (then retried or failed, as attempts remain)
    lost: int  # the lease was lost: another process took the job over; nothing was committed
    given_back: int  # released when the worker stopped: back to pending, no attempt counted
    seconds: float
    stopped_by: str  # "burst", "count", "duration", "signal" or "stop"

    @property
    def attempts(self) -> int:
        """Attempts that ended, given-back jobs left out."""
        return self.fulfilled + self.retried + self.failed + self.cancelled + self.timed_out + self.lost

    @classmethod
    def _of(cls, tally: Tally, seconds: float, stopped_by: str) -> RunSummary:
        fulfilled, retried, failed, cancelled, timed_out, lost, released = tally.as_tuple()
        return cls(fulfilled, retried, failed, cancelled, timed_out, lost, released, seconds, stopped_by)

    def __str__(self) -> str:
        counts = [(self.fulfilled, "fulfilled"), (self.retried, "retried"), (self.failed, "failed"),
                  (self.cancelled, "cancelled"), (self.timed_out, "timed out"), (self.lost, "lost"),
                  (self.given_back, "given back")]
        said = ", ".join(f"{n} {what}" for n, what in counts if n) or "no jobs"
        return f"{said} in {self.seconds:.1f}s (stopped by {self.stopped_by})"


def _number(value: object, what: str, *, low: float, high: float = math.inf, integer: bool = False,
            none: bool = False) -> Any:
    """The runtime's one check of a numeric argument (the store's own are in its private layer,
    which the runtime does not reach into): a real int or float, finite, in [low, high]."""
    if value is None and none:
        return None
    kind = int if integer else int | float
    if (isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value)
            or not low <= value <= high):
        wanted = "an integer" if integer else "a number"
        span = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        raise InvalidRequest(f"{what} must be {wanted} {span}{' or None' if none else ''}, got {value!r}")
    return value


class _Handlers(dict[str, "Handler"]):
    """``{queue or pattern: handler}``: a queue without a handler of its own gets the first
    pattern's (in the order they were registered) that matches it."""

    def __missing__(self, queue: str) -> Handler:
        for key, fn in self.items():
            if fnmatch.fnmatchcase(queue, key):
                return fn
        raise KeyError(queue)

    def __contains__(self, queue: object) -> bool:
        try:
            self[queue]  # type: ignore[index]
        except KeyError:
            return False
        return True


def _served(queue: str, queues: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(queue, q) for q in queues)


class Worker:
    """Runs handlers for jobs of their queues, ``concurrency`` at a time.

    :param store: the store to work on.
    :param handlers: ``{queue: handler}``; more with :meth:`handler`. A key may be a pattern over
        queue names (``"order-*"``): it serves every queue it matches that has no handler of its
        own (the first such pattern registered wins). A handler takes a
        :class:`JobContext` and returns the job's value (bytes, or any JSON), or raises: a failed
        attempt, retried with the store's backoff while attempts remain.
    :param concurrency: jobs run at once.
    :param mode: ``"processes"`` (the default: CPU-bound handlers, and time limits that kill),
        ``"threads"`` (I/O-bound handlers; a handler past its limit is failed and fenced, but
        runs on, since a thread cannot be stopped) or ``"asyncio"`` (``async def`` handlers,
        ``concurrency`` of them as tasks on one event loop; one past its limit is cancelled).
        Processes are forked (Linux). An ``async def`` handler in the other modes runs on an
        event loop of its own per job.
    :param queues: which queues to take jobs from, in priority order (default: every queue with
        a handler, in the order they were registered).
    :param grace: seconds running jobs get to finish once the worker is told to stop; after it
        they are given back (released: no attempt counted).
    :param name: shown in :meth:`JobStore.workers` (default ``host:pid``).
    :param max_hung: threads mode: how many threads may be left running handlers past their time
        limit (a thread cannot be stopped) before slots stay empty until one returns (default: 8,
        or ``concurrency`` if larger). With every slot held so, :meth:`run` raises
        :class:`WorkerFailing`.
    """

    def __init__(self, store: JobStore, handlers: Mapping[str, Handler] | None = None, *, concurrency: int = 1,
                 mode: Mode = "processes", queues: Sequence[str] | None = None, grace: float = 30.0,
                 name: str | None = None, max_hung: int | None = None) -> None:
        _number(concurrency, "concurrency", low=1, high=1024, integer=True)
        if mode not in ("processes", "threads", "asyncio"):
            raise InvalidRequest(f"mode must be 'processes', 'threads' or 'asyncio', got {mode!r}")
        _number(grace, "grace (seconds)", low=0, high=1e9)
        self.max_hung: int = max(8, concurrency) if max_hung is None else _number(
            max_hung, "max_hung", low=0, high=1_000_000, integer=True)
        self.store = store
        self.concurrency = concurrency
        self.mode: Mode = mode
        self.grace = float(grace)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._handlers: dict[str, Handler] = _Handlers()
        self._queues = check_queues(queues)
        for queue, fn in (handlers or {}).items():
            self.handler(queue)(fn)
        self._paused = threading.Event()
        self._stop = threading.Event()
        self._stop_now = threading.Event()
        self._bell = Bell()
        self._hooks = Hooks()
        self.schedule = Schedule()  # periodic jobs this worker makes while it runs (every(), cron())

    # -- handlers --------------------------------------------------------------------------------
    def handler(self, queue: str) -> Callable[[Handler], Handler]:
        """Decorator: ``fn`` handles the jobs of ``queue`` (a name, or a pattern: ``"img-*"``)."""
        check_interest(queue, "a handler's queue")

        def register(fn: Handler) -> Handler:
            if not callable(fn):
                raise InvalidRequest(f"the handler for queue {queue!r} is not callable: {fn!r}")
            self._handlers[queue] = fn
            return fn

        return register

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return _Handlers(self._handlers)

    # -- hooks -----------------------------------------------------------------------------------
    @property
    def hooks(self) -> list[tuple[str, Hook]]:
        """``(event, hook)`` pairs: by event, each event's hooks in the order they were registered."""
        return self._hooks.pairs()

    def on(self, event: str, fn: Hook | None = None) -> Any:
        """Call ``fn(event)`` (a :class:`JobEvent`) at ``event`` of every job this worker runs:
        ``"started"``; one of ``"fulfilled"``, ``"retried"``, ``"failed"``, ``"cancelled"``,
        ``"timed_out"``, ``"lost"``, ``"given_back"`` as each attempt ends; then ``"finished"``
        for each of those. ``worker.on("failed", fn)``, or as a decorator ``@worker.on("failed")``.

        A hook runs after the outcome is committed (``"started"``: before the handler) and cannot
        change it; one that raises is logged and passed over. Where hooks run (a child process,
        a thread, the supervisor): see the guide "Handlers and the worker runtime", "Hooks"."""
        if fn is not None:
            self._hooks.add(event, fn)
            return fn

        def register(f: Hook) -> Hook:
            return self.on(event, f)  # type: ignore[no-any-return]

        check_event(event)  # a misspelt event fails at the decorator's line, not when it is applied
        return register

    # -- periodic jobs ---------------------------------------------------------------------------
    def every(self, interval: Any, **options: Any) -> Periodic:
        """Make a job every ``interval`` while this worker runs: :meth:`Schedule.every
        <fsjobstore.Schedule.every>` (``queue=``, ``request=``, ``name=``, ...). Each tick
        is made once however many workers and schedulers run the same schedule."""
        return self.schedule.every(interval, **options)

    def cron(self, expr: str, **options: Any) -> Periodic:
        """Make a job at each moment of the cron expression ``expr`` while this worker runs:
        :meth:`Schedule.cron <fsjobstore.Schedule.cron>` (``tz=``, ``queue=``, ...)."""
        return self.schedule.cron(expr, **options)

    # -- control ---------------------------------------------------------------------------------
    def pause(self) -> None:
        """Take no new jobs until :meth:`resume` (running ones go on). SIGUSR1 does it too."""
        self._paused.set()
        self._bell.ring()

    def resume(self) -> None:
        """Take jobs again. SIGUSR2 does it too."""
        self._paused.clear()
        self._bell.ring()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def stop(self, *, now: bool = False) -> None:
        """Stop taking jobs; running ones get ``grace`` seconds (``now``: none) before they are
        given back. What SIGTERM and SIGINT do (a second SIGINT stops now). Thread-safe."""
        self._stop.set()
        if now:
            self._stop_now.set()
        self._bell.ring()

    # -- running ---------------------------------------------------------------------------------
    def run(self, count: int | None = None, duration: float | None = None, burst: bool = False) -> RunSummary:
        """Run until stopped; or after ``count`` jobs, or ``duration`` seconds (then stopping as
        :meth:`stop` does), or, with ``burst``, as soon as no job is due (for cron)."""
        if not self._handlers:
            raise InvalidRequest("no handlers: register one with @worker.handler(queue) or handlers={...}")
        _number(count, "count", low=1, integer=True, none=True)
        _number(duration, "duration (seconds)", low=1e-3, high=1e9, none=True)
        queues = self._queues if self._queues is not None else list(self._handlers)
        missing = [q for q in queues if q not in self._handlers]
        if missing:
            raise InvalidRequest(f"no handler for queue(s) {', '.join(missing)}")
        blocking = [q for q in queues if not inspect.iscoroutinefunction(self._handlers[q])]
        if self.mode == "asyncio" and blocking:
            raise InvalidRequest(f"mode 'asyncio' runs async def handlers on one event loop; the handler of "
                                 f"queue(s) {', '.join(blocking)} is not one (use mode 'threads' or 'processes')")
        self.schedule.declare(self.store)  # a schedule's bad job options raise here, before anything runs
        for p in self.schedule:
            if not _served(p.queue, queues):
                log.warning("schedule %s makes jobs in queue %s, which this worker does not serve", p.name, p.queue)
        self._stop.clear()
        self._stop_now.clear()
        started = time.monotonic()
        with self._signals():
            stopped_by = self._run(queues, count, duration, burst, started)
        summary = RunSummary._of(self._pool.tally(), time.monotonic() - started, stopped_by)
        log.info("worker %s stopped: %s", self.name, summary)
        if stopped_by == "burst":
            self._say_what_was_left(queues, summary)
        return summary

    def _say_what_was_left(self, queues: list[str], summary: RunSummary) -> None:
        """A burst ends once nothing it may take is due. Jobs of a paused queue stay, and jobs
        of queues it does not work on: a user who paused a queue long ago, or started it on the
        wrong queue, would wonder why the burst left them."""
        try:
            stats = self.store.statistics()
        except JobStoreError:
            return
        paused, by_queue = stats.paused, stats.pending_by_queue
        for q in queues:
            if q in paused and by_queue.get(q, 0):
                log.warning("queue %s is paused: its %d pending job(s) were left (resume it: fsjobstore "
                            "resume %s %s)", q, by_queue[q], self.store.path, q)
        self._say_what_limits_held(queues, by_queue)
        others = {q: n for q, n in by_queue.items() if n and not _served(q, queues)}
        if others and not summary.attempts:
            log.warning("no job of queue(s) %s was due; jobs wait in other queues: %s", ", ".join(queues),
                        ", ".join(f"{q} ({n})" for q, n in sorted(others.items())))

    def _say_what_limits_held(self, queues: list[str], by_queue: Mapping[str, int]) -> None:
        """Jobs a limit held back are not due for a burst either: say so, or a cron user takes
        the queue for drained (a rate of 2 per 3 s leaves 3 of 5 jobs after a burst)."""
        try:
            limits = self.store.limits()
        except JobStoreError:
            return
        for lim in limits:
            caps = ", ".join(([f"{lim.concurrency} at once"] if lim.concurrency is not None else [])
                             + ([f"{lim.rate[0]} per {lim.rate[1]:g} s"] if lim.rate is not None else []))
            if lim.kind == "key" and lim.waiting:
                log.warning("%d job(s) of concurrency key %r were left waiting for its limit (%s); a later "
                            "run, or the worker holding it, starts them", lim.waiting, lim.name, caps)
            elif lim.kind == "queue" and by_queue.get(lim.name) and _served(lim.name, queues):
                log.warning("queue %s is at its limit (%s): its %d pending job(s) were left", lim.name, caps,
                            by_queue[lim.name])

    def _run(self, queues: list[str], count: int | None, duration: float | None, burst: bool,
             started: float) -> str:
        self._started_at = time.time()
        gate = self._gate = Gate(count)
        pool = self._pool = self._make_pool(queues, gate, burst)
        self._apply_pause()  # before any slot starts: a worker paused before run() takes nothing
        one, many = {"processes": ("process", "processes"), "threads": ("thread", "threads"),
                     "asyncio": ("task", "tasks")}[self.mode]
        unit = many if self.concurrency > 1 else one
        log.info("worker %s: %d %s on queues %s of %s", self.name, self.concurrency, unit, ", ".join(queues),
                 self.store.path)
        stopped_by = ""
        stop_began: float | None = None
        next_publish = 0.0
        idle_rounds = 0  # burst rounds in a row that did no job
        round_start = 0  # jobs ended when the current round began
        next_ticks = self._ticks(time.monotonic(), 0.0)  # due ticks first: a burst then runs their jobs
        try:
            pool.start()
            while True:
                if not pool.alive():
                    # In a burst every slot ends once it finds nothing due. A job may be due again
                    # by then: one whose child was killed (a time limit), recovered a moment after
                    # the new child looked. Then another round, so a burst leaves nothing due; a
                    # round that does nothing twice in a row ends it anyway (a job that cannot be
                    # claimed must not keep it going).
                    if not (burst and stop_began is None and idle_rounds < 2 and self._more_due(queues, count)):
                        break
                    ended = pool.tally().ended()
                    idle_rounds = idle_rounds + 1 if ended == round_start else 0
                    round_start = ended
                    pool.start()
                    continue
                now = time.monotonic()
                self._apply_pause()
                if duration is not None and now - started >= duration and not self._stop.is_set():
                    stopped_by = "duration"
                    self._stop.set()
                if self._stop.is_set() and stop_began is None:
                    stop_began = now
                    stopped_by = stopped_by or "stop"
                    log.info("worker %s stopping: no new jobs; running ones get %.0fs", self.name, self.grace)
                    gate.set_stop()
                if stop_began is not None and (self._stop_now.is_set() or now - stop_began > self.grace):
                    pool.give_back()
                    break
                pool.tick()
                next_ticks = self._ticks(now, next_ticks)
                if not pool.alive():
                    continue  # every slot has finished (a burst, a spent count): no reason to wait
                if now >= next_publish:
                    self._publish()
                    next_publish = now + 1.0
                # Sleep until something rings or the soonest thing we know of is due.
                due = [pool.next_tick(now), next_publish - now, next_ticks - now]
                if duration is not None and stop_began is None:
                    due.append(started + duration - now)
                if stop_began is not None:
                    due.append(stop_began + self.grace - now)
                self._bell.wait(min(due), pool.wait_fds())
        finally:
            pool.close()
            self._hooks.flush(max(5.0, self.grace))  # what the hook thread was given is told before run() returns
            self._retract()
        if self._signalled:
            return "signal"
        if stopped_by:
            return stopped_by
        return "count" if count is not None and gate.spent() else "burst"

    def _ticks(self, now: float, due: float) -> float:
        """Make the periodic ticks due (a pass of :attr:`schedule`) once ``now`` reaches ``due``;
        when to look next (monotonic). Its failures are logged by the pass, never raised."""
        if now < due or not len(self.schedule):
            return due if len(self.schedule) else math.inf
        return now + min(self.schedule.run_pending(self.store), 60.0)

    def _make_pool(self, queues: list[str], gate: Gate, burst: bool) -> Pool:
        """The one place the mode is looked at: past it, the worker drives any :class:`Pool` alike."""
        given = (self.store, self._handlers, queues, gate, self._hooks, self.concurrency)
        if self.mode == "threads":
            return ThreadPool(*given, burst=burst, ring=self._bell.ring, max_hung=self.max_hung)
        if self.mode == "asyncio":
            return AsyncPool(*given, burst=burst, ring=self._bell.ring)
        return ProcessPool(*given, burst=burst, ring=self._bell.ring)

    def _more_due(self, queues: list[str], count: int | None) -> bool:
        """Whether a job of our queues is due and may be taken (its queue not paused, budget left)."""
        if count is not None and self._gate.spent():
            return False
        stats = self.store.statistics()  # (its paused: the same read as store.paused())
        return any(n > 0 and q not in stats.paused and _served(q, queues) for q, n in stats.pending_by_queue.items())

    def _apply_pause(self) -> None:
        self._gate.set_paused(self._paused.is_set())

    # -- the registry ------------------------------------------------------------------------------
    def _publish(self) -> None:
        t = RunSummary._of(self._pool.tally(), 0.0, "")
        done, failed = t.fulfilled + t.cancelled, t.failed + t.retried + t.timed_out
        current = self._pool.running()
        try:
            self.store.publish_worker({
                "name": self.name, "queues": self._queues if self._queues is not None else list(self._handlers),
                "concurrency": self.concurrency, "mode": self.mode, "paused": self._paused.is_set(),
                "started_at": self._started_at, "jobs_done": done, "jobs_failed": failed, "current": current,
            })
        except Exception as exc:  # a status, not state: never stop working for it
            log.debug("could not publish this worker's entry: %s", exc)

    def _retract(self) -> None:
        try:
            self.store.retract_worker()
        except Exception as exc:
            log.debug("could not retract this worker's entry: %s", exc)

    # -- signals -----------------------------------------------------------------------------------
    @contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT stop (a second SIGINT: at once), SIGUSR1 pauses, SIGUSR2 resumes.
        Installed only when run() is called in the main thread (Python's rule for handlers)."""
        self._signalled = False
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_stop(signum: int, frame: FrameType | None) -> None:
            self._signalled = True
            now = signum == signal.SIGINT and self._stop.is_set()
            log.info("worker %s got %s%s", self.name, signal.Signals(signum).name, ": stopping now" if now else "")
            self.stop(now=now)

        def on_pause(signum: int, frame: FrameType | None) -> None:
            (self.pause if signum == signal.SIGUSR1 else self.resume)()
            log.info("worker %s %s", self.name, "paused" if self._paused.is_set() else "resumed")

        wanted = {signal.SIGTERM: on_stop, signal.SIGINT: on_stop, signal.SIGUSR1: on_pause,
                  signal.SIGUSR2: on_pause}
        previous = {sig: signal.signal(sig, fn) for sig, fn in wanted.items()}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
