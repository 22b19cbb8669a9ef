"""asyncio: await a store's waits on the event loop, without a thread per waiter.

    from fsjobstore.aio import AsyncJobStore

    async with AsyncJobStore("./jobs") as store:
        job = await store.create({"x": 1}, queue="images")
        lease = await store.pull_work(queues="images", timeout=10)   # None after 10 s
        ...
        done = await store.wait(job.id, timeout=30)                  # the final snapshot

Waiting happens on the loop: per store, one inotify descriptor for work and one for results,
watched with ``loop.add_reader`` (``JobStore.wakeups``), so 200 concurrent ``wait()`` calls
cost no thread and no descriptor each. What inotify cannot see (another host's work, a
filesystem without events) is covered as the blocking calls cover it: the doorbell is looked at
on a timer, and every wait tries again at least every ``poll_interval``.

The store's own calls are file operations of well under a millisecond, with fsyncs in a
durable store: they run in the loop's default executor (``asyncio.to_thread``), a bounded pool,
so the loop never blocks on a disk. A lease's calls (``lease.fulfill(value)``, ``progress``,
...) are those of :class:`~fsjobstore.WorkLease`: call them directly, or through
``await store.run(lease.fulfill, value)`` to keep an fsync off the loop.

Built on fsjobstore's public API only, like the worker runtime.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from . import (
    InvalidRequest,
    Job,
    JobStore,
    NotificationLease,
    StoreStatistics,
    WaitTimeout,
    WorkLease,
)

__all__ = ["AsyncJobStore"]

T = TypeVar("T")


def _timeout(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or value == math.inf:
        raise InvalidRequest(f"timeout must be a number of seconds >= 0, or None to wait forever, got {value!r}")
    return float(value)


class _Watch:
    """One kind of wake-ups on one loop, shared by every waiter of that kind: the store's
    :class:`Wakeups`, its descriptor on the loop's reader, and a ticker for the doorbell or
    watchdog while anyone waits."""

    def __init__(self, store: JobStore, kind: str) -> None:
        self._wakeups = store.wakeups(kind)
        self.loop = asyncio.get_running_loop()
        self._waiters: dict[asyncio.Future[None], str | None] = {}  # -> the job id it waits for (done)
        self._ticker: asyncio.Task[None] | None = None
        self.generation = 0  # counts wake-ups for anyone: a waiter that saw it change looks again
        self._fd = self._wakeups.fileno()
        if self._fd is not None:
            self.loop.add_reader(self._fd, self._look)
        self._poll = store.poll_interval

    def _look(self) -> None:
        anything, ids = self._wakeups.take()
        if anything:
            self.generation += 1
        for fut, job_id in self._waiters.items():
            if not fut.done() and (anything or job_id in ids):
                fut.set_result(None)

    async def _tick(self) -> None:
        while self._waiters:
            await asyncio.sleep(self._wakeups.interval)
            self._look()
        self._ticker = None

    def due_in(self) -> float:
        return self._wakeups.due_in()

    async def sleep(self, seen: int, pause: float, job_id: str | None = None) -> None:
        """Until a wake-up that concerns us, or ``pause`` seconds; at once if one came since
        generation ``seen`` was read."""
        if self.generation != seen or pause <= 0:
            return
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiters[fut] = job_id
        if self._ticker is None and self._wakeups.interval < self._poll:
            self._ticker = self.loop.create_task(self._tick())
        try:
            await asyncio.wait([fut], timeout=pause)
        finally:
            del self._waiters[fut]

    def close(self) -> None:
        if not self.loop.is_closed():  # a closed loop forgot its readers and tasks already
            if self._fd is not None:
                self.loop.remove_reader(self._fd)
            if self._ticker is not None:
                self._ticker.cancel()
            for fut in self._waiters:
                if not fut.done():
                    fut.set_result(None)
        self._wakeups.close()


class AsyncJobStore:
    """An asyncio face of a :class:`~fsjobstore.JobStore`.

    ``AsyncJobStore(path, **options)`` opens a store as ``JobStore(path, **options)`` does;
    ``AsyncJobStore(store)`` wraps one you opened (closing the wrapper then leaves it open).
    Use it from one event loop at a time (``asyncio.run`` again is fine); ``.store`` is the
    blocking store underneath.
    """

    def __init__(self, store: JobStore | str, **options: Any) -> None:
        if isinstance(store, JobStore):
            if options:
                raise InvalidRequest(f"options {', '.join(sorted(options))} are for opening a store; "
                                     "this one is open already")
            self.store, self._owned = store, False
        else:
            self.store, self._owned = JobStore(store, **options), True
        self._watches: dict[str, _Watch] = {}

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the loop's default executor: for a blocking call of the
        store or of a lease (``await store.run(lease.fulfill, value)``)."""
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))

    def _watch(self, kind: str) -> _Watch:
        watch = self._watches.get(kind)
        if watch is not None and watch.loop is not asyncio.get_running_loop():
            # Made on a loop that is gone (asyncio.run again) or another one: its reader and its
            # waiters belong there. Used from a new loop, it starts anew.
            watch.close()
            watch = None
        if watch is None:
            watch = self._watches[kind] = _Watch(self.store, kind)
        return watch

    # -- the calls that wait ---------------------------------------------------------------------
    async def pull_work(self, *, queues: str | Sequence[str] | None = None, timeout: float | None = 0,
                        on_compromised: Callable[..., Any] | None = None) -> WorkLease | None:
        """As :meth:`JobStore.pull_work`: a lease, or None once ``timeout`` seconds passed
        (0: one look; None: wait for ever)."""
        return await self._pull(functools.partial(self.store.pull_work, queues=queues, timeout=0,
                                                  on_compromised=on_compromised), _timeout(timeout))

    async def pull_notification(self, *, queues: str | Sequence[str] | None = None, timeout: float | None = 0,
                                on_compromised: Callable[..., Any] | None = None) -> NotificationLease | None:
        """As :meth:`JobStore.pull_notification`."""
        return await self._pull(functools.partial(self.store.pull_notification, queues=queues, timeout=0,
                                                  on_compromised=on_compromised), _timeout(timeout))

    async def _pull(self, attempt: Callable[[], T | None], timeout: float | None) -> T | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        watch = self._watch("work") if timeout != 0 else None
        while True:
            seen = watch.generation if watch else 0
            got = await self.run(attempt)
            if got is not None or watch is None:
                return got
            remaining = math.inf if deadline is None else deadline - loop.time()
            if remaining <= 0:
                return None
            await watch.sleep(seen, min(remaining, self.store.poll_interval, watch.due_in()))

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """As :meth:`JobStore.wait`: the job's snapshot once it is final; :class:`WaitTimeout`
        after ``timeout`` seconds (None: wait for ever), :class:`JobNotFound` for an unknown id."""
        timeout = _timeout(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        watch = self._watch("done")
        while True:
            seen = watch.generation
            job = await self.run(self.store.get, job_id)
            if job.state.is_final:
                return job
            remaining = math.inf if deadline is None else deadline - loop.time()
            if remaining <= 0:
                raise WaitTimeout(f"job {job_id} was not final after {timeout} s")
            await watch.sleep(seen, min(remaining, self.store.poll_interval), job_id)

    # -- the rest, off the loop ------------------------------------------------------------------
    async def create(self, request: Any, **options: Any) -> Job:
        """As :meth:`JobStore.create` (same keyword options)."""
        return await self.run(self.store.create, request, **options)

    async def get(self, job_id: str) -> Job:
        return await self.run(self.store.get, job_id)

    async def cancel(self, job_id: str, reason: str | None = None) -> Job:
        return await self.run(self.store.cancel, job_id, reason)

    async def retry(self, job_id: str) -> Job:
        return await self.run(self.store.retry, job_id)

    async def fulfill(self, job_id: str, value: Any) -> None:
        await self.run(self.store.fulfill, job_id, value)

    async def fail(self, job_id: str, error: BaseException | str) -> None:
        await self.run(self.store.fail, job_id, error)

    async def queue(self, job_id: str, target: Any) -> None:
        await self.run(self.store.queue, job_id, target)

    async def statistics(self) -> StoreStatistics:
        return await self.run(self.store.statistics)

    # -- closing -------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Stop watching (waiters still waiting return, or time out, at their next look) and close
        the store if this wrapper opened it."""
        watches, self._watches = self._watches, {}
        for watch in watches.values():
            watch.close()
        if self._owned:
            await self.run(self.store.close)

    async def __aenter__(self) -> AsyncJobStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncJobStore {self.store.path!r}>"
