"""Asyncio mode: ``concurrency`` ``async def`` handlers at once, as tasks on one event loop in one
thread of the worker, for handlers that wait on the network.

Each slot is a task that pulls (``fsjobstore.aio``: woken on the loop, no thread per waiting
slot), runs its handler as a task of its own, and commits in the loop's executor (a commit may
fsync). The supervisor (the thread that called ``run``) watches the slots as thread mode's
monitor does, from its own thread, so a loop stuck in a handler that blocks it does not stop
the watch: a job past its deadline is timed out through its lease (fenced: a later commit of
the handler raises) and its task cancelled; a job whose cancel was requested has its task
cancelled, and ends ``cancelled``. Unlike a thread, a task stops at its next ``await``. A
handler that blocks the loop (``time.sleep``, a CPU loop) holds every slot until it returns:
its own job is still timed out on time, the others wait; use ``await`` or another mode.
Stopping: no new pulls; running jobs get ``grace`` seconds, then their leases are released (no
attempt counted) and their tasks cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .. import JobCancelled, JobStore, WorkLease
from ..aio import AsyncJobStore
from ._restarts import Restarts
from ._run_flags import Gate
from ._slot import (
    CANCEL_POLL,
    ENDED_BECAUSE,
    Handler,
    JobContext,
    Tally,
    commit_failure,
    commit_value,
    described,
    drop_own_frame,
    fate,
    give_back_running,
    next_look,
    tell,
)
from ._worker_hooks import OF_OUTCOME, Hooks, JobEvent

log = logging.getLogger("fsjobstore.worker")


class _Slot:
    def __init__(self) -> None:
        self.lease: WorkLease | None = None
        self.task: asyncio.Task[Any] | None = None  # the running handler
        self.began = 0.0  # wall time its current job started
        self.why: str | None = None  # "cancel" or "timeout": why the supervisor cancelled the task
        self.given_back = False  # released by give_back(): told there, not again by the slot


class AsyncPool:
    def __init__(self, store: JobStore, handlers: Mapping[str, Handler], queues: Sequence[str], gate: Gate,
                 hooks: Hooks, concurrency: int, *, burst: bool, ring: Callable[[], None]) -> None:
        self._store = store
        self._handlers = handlers
        self._queues = list(queues)
        self._gate = gate
        self._hooks = hooks
        self._burst = burst
        self._ring = ring
        self._slots = [_Slot() for _ in range(concurrency)]
        self._tally = Tally()
        # Who tells an attempt that ends as grace runs out: the slot (it ended it) or give_back
        # (it released it). Each decides under this lock, after its own change to the lease.
        self._told = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._crashed = False
        self._restarts = Restarts()
        self._next_cancel_look = 0.0

    # -- the loop's thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._crashed = False
        self._thread = threading.Thread(target=self._body, name="fsjobstore-asyncio", daemon=True)
        self._restarts.born(0)
        self._thread.start()

    def _body(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("the worker's event loop failed; it is started again")
            self._crashed = True
        finally:
            self._loop = None
            self._ring()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        async with AsyncJobStore(self._store) as astore:
            await asyncio.gather(*(self._serve(astore, slot) for slot in self._slots))

    async def _serve(self, astore: AsyncJobStore, slot: _Slot) -> None:
        """One slot: what ``_slot.serve`` does in a thread, as a task."""
        gate = self._gate
        while not gate.stopping():
            if gate.paused():
                await asyncio.sleep(0.2)
                continue
            if not gate.take():
                return
            lease = await astore.pull_work(queues=self._queues, timeout=0 if self._burst else 0.5)
            if lease is None:
                gate.give_back()
                if self._burst:
                    return
                continue
            if gate.stopping():
                await astore.run(lease.release)
                gate.give_back()
                return
            await self._run_one(astore, slot, lease)

    async def _run_one(self, astore: AsyncJobStore, slot: _Slot, lease: WorkLease) -> None:
        """``_slot.run_one`` for an ``async def`` handler: anything it raises, ``CancelledError``
        from our own cancel included, is a failed (or cancelled, or timed-out) attempt."""
        slot.lease, slot.began, slot.why, slot.given_back = lease, time.time(), None, False
        started = time.monotonic()
        self._ring()  # the supervisor watches a new deadline
        error = None
        try:
            self._hooks.later(JobEvent("started", lease.id, lease.queue, lease.attempt))
            work: Awaitable[Any] = self._handlers[lease.queue](JobContext(lease, self._ring))
            slot.task = asyncio.ensure_future(work)
            try:
                value = await asyncio.shield(slot.task)  # our cancel goes to the handler's task only
            finally:
                slot.task = None
        except asyncio.CancelledError as exc:
            if slot.why is None:  # not ours: the loop itself is being cancelled (shutdown)
                raise
            why: BaseException = JobCancelled("the handler was cancelled on a cancel request") \
                if slot.why == "cancel" else exc
            outcome = await astore.run(commit_failure, lease, why)
            error = ENDED_BECAUSE["cancelled" if slot.why == "cancel" else "timed_out"]
        except BaseException as exc:  # handler code is untrusted, as in _slot.run_one
            drop_own_frame(exc, AsyncPool._run_one.__code__)
            outcome = await astore.run(commit_failure, lease, exc)
            error = described(exc)
        else:
            outcome = await astore.run(commit_value, lease, value)
        finally:
            slot.lease = None
        with self._told:  # after our commit: a give-back now finds the lease ended, and leaves it to us
            if slot.given_back:
                return
        name = OF_OUTCOME[outcome]
        # As the other pools tell it: why an attempt the supervisor ended did end (a blocking
        # handler that returned after its time-out raised nothing), and what its job does next.
        error = error or ENDED_BECAUSE.get(name)
        then = await astore.run(fate, self._store, lease.id, lease.attempt) if name == "timed_out" else None
        tell(JobEvent(name, lease.id, lease.queue, lease.attempt, name, time.monotonic() - started, error,
                      (then or "lost") if name == "timed_out" else None), self._tally, self._hooks)

    # -- the supervisor's side --------------------------------------------------------------------
    def alive(self) -> bool:
        return (self._thread is not None and self._thread.is_alive()) or self._crashed or self._restarts.waiting()

    def tick(self) -> None:
        stopping = self._gate.stopping()
        if stopping:
            self._crashed = False
        if self._restarts.look(self._tally.ended(), stopping=stopping):
            self.start()
        if self._crashed and self._thread is not None and not self._thread.is_alive() and not stopping:
            self._crashed = False
            self._restarts.died(0, "the worker's event loop")
        now = time.monotonic()
        look_at_cancels = now >= self._next_cancel_look
        if look_at_cancels:
            self._next_cancel_look = now + CANCEL_POLL
        for slot in self._slots:
            lease = slot.lease
            if lease is None or lease.finished or slot.why is not None:
                continue
            deadline = lease.deadline
            if deadline is not None and now > deadline and lease.time_out():
                log.info("job %s queue=%s attempt=%d timed-out: ran past its time limit (ran %.1fs); its task is "
                         "cancelled", lease.id, lease.queue, lease.attempt, time.time() - slot.began)
                self._cancel(slot, "timeout")
            elif look_at_cancels and lease.cancel_requested:
                self._cancel(slot, "cancel")

    def _cancel(self, slot: _Slot, why: str) -> None:
        slot.why = why
        loop, task = self._loop, slot.task
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)

    def next_tick(self, now: float) -> float:
        due = [self._restarts.next_due() - now] if self._restarts.waiting() else []
        return next_look((slot.lease for slot in self._slots), now, self._next_cancel_look, due)

    def wait_fds(self) -> list[int]:
        return []  # the loop rings the supervisor itself

    def give_back(self) -> None:
        """Grace is over: release every job still running and cancel its task."""
        for slot in self._slots:
            with self._told:
                if not give_back_running(slot.lease, slot.began, self._tally, self._hooks):
                    continue  # ended meanwhile: its slot tells it
                slot.given_back = True  # told here: the slot's own end tells nothing more
            self._cancel(slot, "shutdown")

    def close(self) -> None:
        """Let the loop's thread end (its slots see the stop), for up to a few seconds."""
        self._gate.set_stop()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def running(self) -> list[dict[str, object]]:
        return [{"id": s.lease.id, "queue": s.lease.queue, "attempt": s.lease.attempt, "started_at": s.began}
                for s in self._slots if s.lease is not None]

    def tally(self) -> Tally:
        return self._tally
