"""Thread mode: ``concurrency`` slot threads sharing this process's store, for I/O handlers.

A monitor (the thread that called ``run``) watches every running job: one past its deadline is
timed out through its lease (a failed attempt; the handler's late commit is fenced) and its
thread is replaced, since a thread cannot be stopped; one whose cancel was requested has its
``on_cancel`` fired, and stops when its handler looks (cooperative). Stopping: no new pulls;
running jobs get ``grace`` seconds, then their leases are released (no attempt counted).

A thread left running a handler past its time limit costs a thread until the handler returns,
if ever. While more than ``max_hung`` such threads run, a slot whose handler overran is left
empty until one of them returns (the worker runs on with fewer slots, and says so), so the
worker never has more than ``concurrency + max_hung`` threads; once no slot has taken a job for
``ALL_HELD_FOR`` seconds, ``run()`` raises :class:`WorkerFailing` rather than sit idle for good:
a restarted process has none of those threads (processes mode kills such handlers).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from .. import JobStore, WorkerFailing, WorkLease
from ._restarts import Restarts
from ._run_flags import Gate
from ._slot import CANCEL_POLL, ENDED_BECAUSE, Handler, Tally, fate, give_back_running, next_look, serve, tell
from ._worker_hooks import Hooks, JobEvent

log = logging.getLogger("fsjobstore.worker")

ALL_HELD_FOR = 60.0  # seconds every slot may stay held before run() gives up (WorkerFailing)


class _Slot:
    """One slot's thread and what it is running now (read by the monitor); its own Reporter."""

    def __init__(self, index: int, ring: Callable[[], None]) -> None:
        self.index = index
        self.ring = ring  # wakes the monitor: a job started (a deadline to watch) or a thread ended
        self.crashed = False  # its thread ended on an unexpected error (not a stop or a burst's end)
        self.thread: threading.Thread | None = None
        self.returned = False  # its thread is past serve(): set before it rings, so the tick it wakes sees it
        self.lease: WorkLease | None = None
        self.began = 0.0  # wall time its current job started
        self.tally = Tally()
        self.abandoned = False  # its handler overran its limit and still runs: the slot moved on

    def started(self, lease: WorkLease) -> None:
        self.lease, self.began = lease, time.time()
        self.ring()

    def touched(self, lease: WorkLease) -> None:
        self.ring()  # the monitor reads lease.deadline itself, and must wake for a nearer one

    def finished(self, event: JobEvent) -> None:
        self.lease = None
        if self.abandoned:
            return  # counted as timed out when it was left behind
        self.tally.count(event)

    def dropped(self) -> bool:
        return self.abandoned


class ThreadPool:
    def __init__(self, store: JobStore, handlers: Mapping[str, Handler], queues: Sequence[str], gate: Gate,
                 hooks: Hooks, concurrency: int, *, burst: bool, ring: Callable[[], None], max_hung: int) -> None:
        self._store = store
        self._handlers = handlers
        self._queues = queues
        self._gate = gate
        self._hooks = hooks
        self._burst = burst
        self._ring = ring
        self._slots = [_Slot(i, ring) for i in range(concurrency)]
        self._abandoned: list[_Slot] = []
        self._max_hung = max_hung  # Worker's default: max(8, concurrency)
        self._held: list[int] = []  # slots left empty: max_hung threads still run overdue handlers
        self._all_held_since: float | None = None  # monotonic: since when no slot takes jobs
        self._restarts = Restarts()
        self._next_cancel_look = 0.0

    def start(self) -> None:
        for slot in self._slots:
            self._start(slot)

    def _start(self, slot: _Slot) -> None:
        slot.returned = False

        def body() -> None:
            try:
                serve(self._store, self._handlers, self._queues, self._gate, slot, self._hooks, burst=self._burst)
            except Exception:
                log.exception("a worker thread failed; it is replaced")
                slot.crashed = True
            finally:
                slot.returned = True
                slot.ring()

        slot.thread = threading.Thread(target=body, name=f"fsjobstore-worker-{slot.index}", daemon=True)
        self._restarts.born(slot.index)
        slot.thread.start()

    def alive(self) -> bool:
        # A crashed slot the next tick has not seen yet still counts: it is to be started again.
        # So does a held one, except in a burst (which ends with what it could do).
        return any((s.thread is not None and s.thread.is_alive()) or s.crashed for s in self._slots) \
            or self._restarts.waiting() or (bool(self._held) and not self._burst and not self._gate.stopping())

    def tick(self) -> None:
        """One look at every slot: time limits, cancel requests, threads that died. Raises
        WorkerFailing when threads keep dying at start (see _restarts), or when every slot is
        held by hung handlers (the module docstring)."""
        stopping = self._gate.stopping()
        if stopping:  # nothing is started again
            for slot in self._slots:
                slot.crashed = False
            self._held.clear()
        for i in self._restarts.look(self.tally().ended(), stopping=stopping):
            self._start(self._slots[i])
        while self._held and self._hung() <= self._max_hung:
            i = self._held.pop(0)
            log.info("a handler left running past its time limit has returned: worker thread %d starts again", i)
            self._start(self._slots[i])
            self._all_held_since = None
        since = self._all_held_since
        if since is not None and self._held and time.monotonic() - since > ALL_HELD_FOR:
            raise WorkerFailing(f"every worker thread has been held for {ALL_HELD_FOR:g}s: {self._hung()} handlers "
                                "run on past their time limit and a thread cannot be stopped; restart the worker, "
                                "or run such handlers with mode='processes', which kills them")
        now = time.monotonic()
        look_at_cancels = now >= self._next_cancel_look
        if look_at_cancels:
            self._next_cancel_look = now + CANCEL_POLL
        for i, slot in enumerate(self._slots):
            lease = slot.lease
            if lease is not None and not lease.finished:
                deadline = lease.deadline
                if deadline is not None and now > deadline and lease.time_out():
                    # The same words as process mode's, but for what happens to the handler.
                    ran = time.time() - slot.began
                    log.info("job %s queue=%s attempt=%d timed-out: ran past its time limit (ran %.1fs); its "
                             "thread cannot be stopped and is left to finish, fenced (processes mode kills)",
                             lease.id, lease.queue, lease.attempt, ran)
                    # Never "running": time_out() has ended the claim. None: unreadable (purged).
                    then = fate(self._store, lease.id, lease.attempt) or "lost"
                    self._replace(i, slot, JobEvent("timed_out", lease.id, lease.queue, lease.attempt, "timed_out",
                                                    ran, ENDED_BECAUSE["timed_out"], then))
                    continue
                if look_at_cancels:
                    lease.cancel_requested  # noqa: B018  (fires on_cancel once; the handler looks)
            if slot.crashed and slot.thread is not None and not slot.thread.is_alive() and not stopping:
                slot.crashed = False  # scheduled once: the flag is set again only by a new thread's crash
                self._restarts.died(i, "worker threads")  # a thread that died on an unexpected error

    def _replace(self, i: int, slot: _Slot, event: JobEvent) -> None:
        slot.abandoned = True
        self._abandoned.append(slot)
        tell(event, slot.tally, self._hooks)
        fresh = _Slot(slot.index, self._ring)
        self._slots[i] = fresh
        if self._hung() <= self._max_hung:
            self._start(fresh)
            return
        self._held.append(i)
        working = len(self._slots) - len(self._held)
        log.warning("%d worker threads still run handlers past their time limit (max_hung=%d): worker thread %d "
                    "waits until one returns; %d of %d threads take jobs%s", self._hung(), self._max_hung, i,
                    working, len(self._slots), "" if working else
                    f" (the worker stops with WorkerFailing if none returns within {ALL_HELD_FOR:g}s)")
        if not working and self._all_held_since is None:
            self._all_held_since = time.monotonic()

    def _hung(self) -> int:
        """Threads left running a handler past its time limit that have not returned yet."""
        return sum(not s.returned for s in self._abandoned)

    def running(self) -> list[dict[str, object]]:
        return [{"id": s.lease.id, "queue": s.lease.queue, "attempt": s.lease.attempt, "started_at": s.began}
                for s in self._slots if s.lease is not None]

    def tally(self) -> Tally:
        total = Tally()
        for slot in self._slots + self._abandoned:
            total = total + slot.tally
        return total

    def wait_fds(self) -> list[int]:
        return []  # slot threads ring the monitor themselves

    def next_tick(self, now: float) -> float:
        """Seconds until the monitor must look again if nothing rings: the nearest deadline of a
        running job, a restart due, or the next look at cancel requests while jobs run."""
        due = [self._restarts.next_due() - now] if self._restarts.waiting() else []
        if self._all_held_since is not None:
            due.append(self._all_held_since + ALL_HELD_FOR - now)
        return next_look((slot.lease for slot in self._slots), now, self._next_cancel_look, due)

    def give_back(self) -> None:
        """Grace is over: give back every job still running (the handlers run on, fenced)."""
        for slot in self._slots:
            if give_back_running(slot.lease, slot.began, slot.tally, self._hooks):
                slot.abandoned = True  # its handler runs on, fenced: its end is not counted again

    def close(self) -> None:
        """Nothing to end: the slots have returned, or run on fenced (daemon threads)."""
