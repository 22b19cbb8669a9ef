"""The asyncio pool (``Worker(mode="asyncio")``): async handlers at concurrency on one loop, with
time limits, cancel, progress, logs, hooks and graceful shutdown; async handlers in the other modes."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import worker_tasks as tasks

from fsjobstore import InvalidRequest, JobContext, JobState, Worker
from fsjobstore.worker import JobEvent


async def nap(job: JobContext) -> Any:
    job.progress(1, 2, "half way")
    job.log("napping")
    await asyncio.sleep(float(job.request.get("seconds", 0.3)))
    job.progress(2, 2)
    return {"slept": job.request.get("seconds", 0.3), "thread": threading.current_thread().name}


async def hang_once(job: JobContext) -> Any:
    if job.attempt == 1:
        await asyncio.sleep(3600)
    return "second time"


async def boom(job: JobContext) -> Any:
    await asyncio.sleep(0)
    raise ValueError("async boom")


async def block_the_loop(job: JobContext) -> Any:
    if job.attempt == 1:
        time.sleep(1.5)  # no await: the whole loop waits
    return "unblocked"


def test_async_handlers_run_concurrently_on_one_event_loop_with_progress_and_logs(open_store: Any) -> None:
    store = open_store(durable=False)
    jobs = [store.create({"seconds": 1.0}, queue="nap") for _ in range(20)]
    worker = Worker(store, {"nap": nap}, mode="asyncio", concurrency=20)
    started = time.monotonic()
    summary = tasks.bounded_run(worker)
    took = time.monotonic() - started
    assert summary.fulfilled == 20 and summary.attempts == 20
    assert took < 10, took  # 20 one-second naps, one at a time, would take 20 s
    done = [store.get(j.id) for j in jobs]
    assert {j.value["thread"] for j in done} == {"fsjobstore-asyncio"}  # one loop, one thread
    assert all(j.progress is not None and j.progress.done == 2 for j in done)
    assert all(any(line.line == "napping" for line in j.logs) for j in done)


def test_an_async_handler_past_its_time_limit_is_cancelled_and_retried(open_store: Any) -> None:
    store = open_store(backoff=lambda attempt: 0.0)
    job = store.create({}, queue="hang", timeout=0.5, max_attempts=2)
    quick = store.create({"seconds": 0.1}, queue="nap")
    worker = Worker(store, {"hang": hang_once, "nap": nap}, mode="asyncio", concurrency=2)
    told: list[Any] = []
    worker.on("timed_out", told.append)
    summary = tasks.bounded_run(worker)
    assert summary.timed_out == 1 and summary.fulfilled == 2, summary
    # Told as the other pools tell it: why, and what the job does next.
    assert [(e.job_id, e.error, e.then) for e in told] == [(job.id, "ran past its time limit", "retrying")]
    final = store.get(job.id)
    assert final.state is JobState.FULFILLED and final.value == "second time" and final.attempts == 2
    assert store.get(quick.id).state is JobState.FULFILLED


def test_a_handler_that_blocks_the_loop_is_still_timed_out_on_time_by_the_supervisor(open_store: Any) -> None:
    store = open_store(backoff=lambda attempt: 0.0)
    job = store.create({}, queue="block", timeout=0.3, max_attempts=2)
    worker = Worker(store, {"block": block_the_loop}, mode="asyncio")
    told: list[Any] = []
    worker.on("timed_out", told.append)
    summary = tasks.bounded_run(worker)
    final = store.get(job.id)
    assert summary.timed_out == 1 and final.state is JobState.FULFILLED and final.attempts == 2
    # It returned after its time-out, raising nothing: still told why (a trial found None here).
    assert [(e.error, e.then) for e in told] == [("ran past its time limit", "retrying")]


def test_a_cancel_request_cancels_the_running_task_and_ends_the_job_cancelled(open_store: Any) -> None:
    store = open_store()
    job = store.create({"seconds": 30}, queue="nap")
    worker = Worker(store, {"nap": nap}, mode="asyncio")

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 10
        while store.get(job.id).state is not JobState.ACTIVE and time.monotonic() < deadline:
            time.sleep(0.02)
        store.cancel(job.id, "no longer wanted")

    threading.Thread(target=cancel_when_running).start()
    started = time.monotonic()
    summary = tasks.bounded_run(worker)
    assert summary.cancelled == 1 and time.monotonic() - started < 10
    assert store.get(job.id).state is JobState.CANCELLED


def test_hooks_and_failures_in_the_asyncio_pool(open_store: Any) -> None:
    store = open_store(backoff=lambda attempt: 0.0)
    ok = store.create({"seconds": 0.05}, queue="nap")
    bad = store.create({}, queue="boom", max_attempts=1)
    worker = Worker(store, {"nap": nap, "boom": boom}, mode="asyncio", concurrency=2)
    seen: list[tuple[str, str, str | None]] = []
    worker.on("started", lambda e: seen.append((e.event, e.job_id, None)))
    worker.on("finished", lambda e: seen.append((e.event, e.job_id, e.outcome)))

    @worker.on("failed")
    def failed(event: JobEvent) -> None:
        seen.append((event.event, event.job_id, event.error))
        raise RuntimeError("a broken hook")

    summary = tasks.bounded_run(worker)
    assert summary.fulfilled == 1 and summary.failed == 1
    assert sorted(seen) == sorted([("started", ok.id, None), ("finished", ok.id, "fulfilled"),
                                   ("started", bad.id, None), ("failed", bad.id, "ValueError: async boom"),
                                   ("finished", bad.id, "failed")])
    stored = store.get(bad.id).error or ""
    # The stored traceback starts at the handler, not at the pool's call of it.
    assert stored.splitlines()[1].endswith(", in boom") and stored.endswith("ValueError: async boom"), stored
    assert "fsjobstore/_runtime" not in stored


def test_stopping_gives_running_jobs_grace_then_back(open_store: Any, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store()
    slow = store.create({"seconds": 30}, queue="nap")
    worker = Worker(store, {"nap": nap}, mode="asyncio", grace=0.3)
    threading.Timer(0.5, worker.stop).start()
    with caplog.at_level(logging.INFO, logger="fsjobstore.worker"):
        summary = worker.run()
    assert summary.given_back == 1 and summary.stopped_by == "stop"
    job = store.get(slow.id)
    assert job.state is JobState.PENDING and job.attempts == 0


def test_asyncio_mode_refuses_a_handler_that_is_not_async_and_other_modes_run_async_handlers(
        open_store: Any) -> None:
    store = open_store()
    with pytest.raises(InvalidRequest, match=r"mode 'asyncio' runs async def handlers.*queue\(s\) plain"):
        Worker(store, {"plain": lambda job: 1}, mode="asyncio").run(burst=True)
    with pytest.raises(InvalidRequest, match="mode must be 'processes', 'threads' or 'asyncio'"):
        Worker(store, {"nap": nap}, mode="async")  # type: ignore[arg-type]
    for mode in ("threads", "processes"):
        job = store.create({"seconds": 0.05}, queue="nap")
        summary = tasks.bounded_run(Worker(store, {"nap": nap}, mode=mode))  # type: ignore[arg-type]
        assert summary.fulfilled == 1, (mode, summary)
        assert store.get(job.id).value["slept"] == 0.05  # the coroutine ran: its value, not a coroutine
