"""fsjobstore.aio: waits on the event loop, woken by inotify through the loop's reader, with the
poll fallback; no thread or descriptor per waiter."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from typing import Any

import pytest

from fsjobstore import InvalidRequest, JobNotFound, JobState, JobStore, WaitTimeout
from fsjobstore.aio import AsyncJobStore


def _fulfil_all(root: str, n: int, start: Any) -> None:
    """In another process: wait for the go, then pull and fulfil ``n`` jobs."""
    start.wait(30)
    with JobStore(root, durable=False) as store:
        for _ in range(n):
            lease = store.pull_work(timeout=30)
            assert lease is not None
            lease.fulfill({"i": lease.request["i"]})


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_two_hundred_concurrent_waits_cost_no_thread_or_descriptor_each(root: str) -> None:
    async def main() -> None:
        async with AsyncJobStore(root, durable=False, poll_interval=30.0) as store:
            jobs = [await store.create({"i": i}) for i in range(200)]
            await store.get(jobs[0].id)  # the executor's threads exist before we count
            threads, fds = threading.active_count(), _fds()
            waits = [asyncio.create_task(store.wait(j.id, timeout=60)) for j in jobs]
            await asyncio.sleep(0.5)  # every wait has looked once and sleeps on the loop
            assert not any(w.done() for w in waits)
            # One inotify descriptor for results (plus at most the executor's few threads, which
            # run the looks, not the waits): not 200 of anything.
            assert threading.active_count() - threads <= 8, threading.enumerate()
            assert _fds() - fds <= 4
            go = multiprocessing.get_context("fork").Event()
            proc = multiprocessing.get_context("fork").Process(target=_fulfil_all, args=(root, 200, go))
            proc.start()
            started = time.monotonic()
            go.set()
            done = await asyncio.gather(*waits)
            took = time.monotonic() - started
            proc.join(10)
            # poll_interval is 30 s: each wait was woken by its result's arrival, not by a rescan.
            assert took < 15, took
            assert [j.state for j in done] == [JobState.FULFILLED] * 200
            assert [j.value for j in done] == [{"i": i} for i in range(200)]

    asyncio.run(main())


def _create_later(root: str, delay: float) -> None:
    time.sleep(delay)
    with JobStore(root, durable=False) as store:
        store.create("late", queue="q")
        store.queue(store.create("notified", queue="n").id, "t")


def test_a_waiting_pull_is_woken_by_another_processs_create_long_before_its_poll_interval(root: str) -> None:
    async def main() -> None:
        async with AsyncJobStore(root, durable=False, poll_interval=30.0) as store:
            proc = multiprocessing.get_context("fork").Process(target=_create_later, args=(root, 0.3))
            proc.start()
            t = time.monotonic()
            lease = await store.pull_work(queues="q", timeout=20)
            woke = time.monotonic() - t
            assert lease is not None and lease.request == "late" and woke < 10, woke
            await store.run(lease.fulfill, "ok")
            job = await store.wait(lease.id, timeout=5)
            assert job.value == "ok"
            worked = await store.pull_work(queues="n", timeout=10)
            assert worked is not None
            worked.fulfill("done")
            note = await store.pull_notification(timeout=10)
            assert note is not None and note.id == worked.id and note.waiting == ("t",)
            note.done(["t"])
            proc.join(10)

    asyncio.run(main())


def test_without_inotify_the_waits_fall_back_to_polling(root: str) -> None:
    async def main() -> None:
        async with AsyncJobStore(root, durable=False, watch=False, poll_interval=0.2) as store:
            waiter = asyncio.create_task(store.pull_work(timeout=10))
            await asyncio.sleep(0.3)
            job = await store.create("x")
            lease = await waiter
            assert lease is not None and lease.id == job.id
            done = asyncio.create_task(store.wait(job.id, timeout=10))
            await asyncio.sleep(0.3)
            await store.run(lease.fulfill, 1)
            assert (await done).value == 1

    asyncio.run(main())


def test_timeouts_unknown_ids_and_bad_arguments_are_answered_as_the_blocking_calls_answer_them(root: str) -> None:
    async def main() -> None:
        async with AsyncJobStore(root, durable=False) as store:
            t = time.monotonic()
            assert await store.pull_work(timeout=0.3) is None
            assert 0.25 <= time.monotonic() - t < 5
            assert await store.pull_work() is None  # timeout=0: one look
            job = await store.create("x")
            with pytest.raises(WaitTimeout, match=f"job {job.id} was not final after 0.2 s"):
                await store.wait(job.id, timeout=0.2)
            with pytest.raises(JobNotFound):
                await store.wait("no-such-job", timeout=1)
            with pytest.raises(InvalidRequest, match="timeout must be a number of seconds >= 0"):
                await store.pull_work(timeout=-1)
            with pytest.raises(InvalidRequest, match="timeout"):
                await store.wait(job.id, timeout="soon")  # type: ignore[arg-type]
            with pytest.raises(InvalidRequest, match="wakeups kind must be 'work' or 'done'"):
                store.store.wakeups("results")

    asyncio.run(main())


def test_a_wrapped_store_stays_open_and_options_for_an_open_store_are_refused(root: str) -> None:
    with JobStore(root) as plain:
        with pytest.raises(InvalidRequest, match="options durable are for opening a store"):
            AsyncJobStore(plain, durable=False)

        async def main() -> None:
            async with AsyncJobStore(plain) as store:
                await store.create("x")

        asyncio.run(main())
        assert plain.statistics().pending == 1  # still open


def test_a_wait_cancelled_by_its_caller_leaves_the_others_waiting(root: str) -> None:
    async def main() -> None:
        async with AsyncJobStore(root, durable=False, poll_interval=30.0) as store:
            a, b = await store.create("a"), await store.create("b")
            wa = asyncio.create_task(store.wait(a.id))
            wb = asyncio.create_task(store.wait(b.id, timeout=20))
            await asyncio.sleep(0.2)
            wa.cancel()
            with pytest.raises(asyncio.CancelledError):
                await wa
            await store.fulfill(b.id, "b done")
            assert (await wb).value == "b done"

    asyncio.run(main())


def test_one_store_serves_one_event_loop_after_another(root: str) -> None:
    store = AsyncJobStore(root, durable=False, poll_interval=30.0)

    async def one_round(n: int) -> None:
        job = await store.create(n)
        waiting = asyncio.create_task(store.wait(job.id, timeout=10))
        await asyncio.sleep(0.1)
        await store.fulfill(job.id, n * 10)
        assert (await waiting).value == n * 10

    asyncio.run(one_round(1))
    asyncio.run(one_round(2))  # a new loop: the watch made on the first one is made anew
    asyncio.run(store.aclose())


def _create_ringing(root: str, delay: float) -> None:
    time.sleep(delay)
    with JobStore(root, durable=False, doorbell=True) as store:
        store.create("rung", queue="q")
        time.sleep(0.3)  # a ring is a rename in control/doorbell: let the waiter list it first


def test_without_inotify_a_doorbell_ring_wakes_an_async_pull_as_from_another_host(root: str) -> None:
    # watch=False stands for a network filesystem, where inotify sees nothing another host does.
    async def main() -> None:
        async with AsyncJobStore(root, durable=False, watch=False, doorbell=True, poll_interval=30.0) as store:
            proc = multiprocessing.get_context("fork").Process(target=_create_ringing, args=(root, 0.5))
            proc.start()
            t = time.monotonic()
            lease = await store.pull_work(queues="q", timeout=20)
            woke = time.monotonic() - t
            proc.join(10)
            assert lease is not None and lease.request == "rung" and woke < 5, woke

    asyncio.run(main())


def test_an_async_notifier_can_name_the_queues_it_serves(tmp_path: Any) -> None:
    async def main() -> None:
        async with AsyncJobStore(str(tmp_path / "s")) as store:
            for queue in ("mail-eu", "sms"):
                job = await store.create(queue, queue=queue)
                await store.queue(job.id, "t")
                lease = await store.pull_work(queues=queue)
                assert lease is not None
                lease.fulfill(1)
            note = await store.pull_notification(queues=["mail-*"], timeout=1)
            assert note is not None and note.request == "mail-eu"
            note.done(note.waiting)
            assert await store.pull_notification(queues="mail-*", timeout=0.2) is None

    asyncio.run(main())
