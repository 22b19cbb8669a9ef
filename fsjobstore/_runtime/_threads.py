"""Thread mode: ``concurrency`` slot threads sharing this process's store, for I/O handlers.

A monitor (the thread that called ``run``) watches every running job: one past its deadline is
timed out through its lease (a failed attempt; the handler's late commit is fenced) and its
thread is replaced, since a thread cannot be stopped; one whose cancel was requested has its
``on_cancel`` fired, and stops when its handler looks (cooperative). Stopping: no new pulls;
running jobs get ``grace`` seconds, then their leases are released (no attempt counted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from .. import JobStore, WorkLease
from ._restarts import Restarts
from ._slot import CANCEL_POLL, Gate, Handler, Tally, fate, say_fate, serve

log = logging.getLogger("fsjobstore.worker")


class _Slot:
    """One slot's thread and what it is running now (read by the monitor)."""

    def __init__(self, index: int, ring: Callable[[], None]) -> None:
        self.index = index
        self.ring = ring  # wakes the monitor: a job started (a deadline to watch) or a thread ended
        self.crashed = False  # its thread ended on an unexpected error (not a stop or a burst's end)
        self.thread: threading.Thread | None = None
        self.lease: WorkLease | None = None
        self.started = 0.0
        self.tally = Tally()
        self.abandoned = False  # its handler overran its limit and still runs: the slot moved on

    def started_job(self, lease: WorkLease) -> None:
        self.lease, self.started = lease, time.time()
        self.ring()

    def touched(self, lease: WorkLease) -> None:
        self.ring()  # the monitor reads lease.deadline itself, and must wake for a nearer one

    def finished(self, outcome: str) -> None:
        self.lease = None
        if self.abandoned:
            return  # counted as timed out when it was left behind
        self.tally.add(outcome)


class ThreadPool:
    def __init__(self, store: JobStore, handlers: Mapping[str, Handler], queues: Sequence[str], gate: Gate,
                 concurrency: int, *, burst: bool, ring: Callable[[], None]) -> None:
        self._store = store
        self._handlers = handlers
        self._queues = queues
        self._gate = gate
        self._burst = burst
        self._ring = ring
        self._slots = [_Slot(i, ring) for i in range(concurrency)]
        self._abandoned: list[_Slot] = []
        self._restarts = Restarts()
        self._next_cancel_look = 0.0

    def start(self) -> None:
        for slot in self._slots:
            self._start(slot)

    def _start(self, slot: _Slot) -> None:
        reporter = _Report(slot)
        gate = _SlotGate(self._gate, slot)

        def body() -> None:
            try:
                serve(self._store, self._handlers, self._queues, gate, reporter, burst=self._burst)
            except Exception:
                log.exception("a worker thread failed; it is replaced")
                slot.crashed = True
            finally:
                slot.ring()

        slot.thread = threading.Thread(target=body, name=f"fsjobstore-worker-{slot.index}", daemon=True)
        self._restarts.born(slot.index)
        slot.thread.start()

    def alive(self) -> bool:
        # A crashed slot the next tick has not seen yet still counts: it is to be started again.
        return any((s.thread is not None and s.thread.is_alive()) or s.crashed for s in self._slots) \
            or self._restarts.waiting()

    def tick(self) -> None:
        """One look at every slot: time limits, cancel requests, threads that died. Raises
        WorkerFailing when threads keep dying at start (see _restarts)."""
        stopping = self._gate.stopping()
        if stopping:  # nothing is started again
            for slot in self._slots:
                slot.crashed = False
        for i in self._restarts.look(self.tally().ended(), stopping=stopping):
            self._start(self._slots[i])
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
                    log.info("job %s queue=%s attempt=%d timed-out: ran past its time limit (%.1fs); its "
                             "thread cannot be stopped and is left to finish, fenced (processes mode kills)",
                             lease.id, lease.queue, lease.attempt, time.time() - slot.started)
                    outcome = fate(self._store, lease.id, lease.attempt)
                    if outcome is not None:  # never "running": time_out() has ended the claim
                        say_fate(lease.id, lease.queue, lease.attempt, outcome)
                    self._replace(i, slot)
                    continue
                if look_at_cancels:
                    lease.cancel_requested  # noqa: B018  (fires on_cancel once; the handler looks)
            if slot.crashed and slot.thread is not None and not slot.thread.is_alive() and not stopping:
                slot.crashed = False  # scheduled once: the flag is set again only by a new thread's crash
                self._restarts.died(i, "worker threads")  # a thread that died on an unexpected error

    def _replace(self, i: int, slot: _Slot) -> None:
        slot.tally.add("timed-out")
        slot.abandoned = True
        self._abandoned.append(slot)
        fresh = _Slot(slot.index, self._ring)
        self._slots[i] = fresh
        self._start(fresh)

    def running(self) -> list[tuple[WorkLease, float]]:
        return [(s.lease, s.started) for s in self._slots if s.lease is not None]

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
        due: list[float] = [self._restarts.next_due() - now] if self._restarts.waiting() else []
        for slot in self._slots:
            lease = slot.lease
            if lease is not None and not lease.finished:
                due.append(self._next_cancel_look - now)
                if lease.deadline is not None:
                    due.append(lease.deadline - now)
        return max(0.0, min(due, default=3600.0))

    def release_running(self) -> None:
        """Grace is over: give back every job still running (the handlers run on, fenced)."""
        for slot in self._slots:
            lease = slot.lease
            if lease is not None and not lease.finished:
                try:
                    lease.release()
                    slot.tally.add("released")
                    slot.abandoned = True  # its handler runs on, fenced: its end is not counted again
                    log.info("job %s queue=%s attempt=%d released: given back at shutdown", lease.id,
                             lease.queue, lease.attempt)
                except Exception as exc:  # ended meanwhile, or a storage fault: recovery has it
                    log.debug("releasing %s at shutdown: %s", lease.id, exc)

class _SlotGate:
    """The run's gate, closed for a slot whose thread was left behind on a timed-out job."""

    def __init__(self, gate: Gate, slot: _Slot) -> None:
        self._gate = gate
        self._slot = slot

    def stopping(self) -> bool:
        return self._slot.abandoned or self._gate.stopping()

    def paused(self) -> bool:
        return self._gate.paused()

    def take(self) -> bool:
        return self._gate.take()

    def give_back(self) -> None:
        self._gate.give_back()


class _Report:
    def __init__(self, slot: _Slot) -> None:
        self._slot = slot

    def started(self, lease: WorkLease) -> None:
        self._slot.started_job(lease)

    def touched(self, lease: WorkLease) -> None:
        self._slot.touched(lease)

    def finished(self, outcome: str) -> None:
        self._slot.finished(outcome)
