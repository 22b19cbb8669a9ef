"""The worker runtime, driven from Python: handlers, outcomes, limits, cancels, pause, budgets,
and the registry, in both modes (threads, and forked child processes)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
import worker_tasks as tasks

from fsjobstore import InvalidQueueName, InvalidRequest, JobState, JobStore, Worker
from fsjobstore.worker import Deliverer

MODES = ["threads", "processes"]


@pytest.fixture
def fast(open_store: Callable[..., JobStore]) -> JobStore:
    return open_store(backoff=lambda attempt: 0.0, lease_duration=5.0)


@pytest.mark.parametrize("mode", MODES)
def test_a_burst_runs_every_due_job_with_its_queues_handler_and_stores_the_values(fast: JobStore, mode: str) -> None:
    ids = [fast.create({"n": i}, queue="echo").id for i in range(12)]
    flaky = fast.create({}, queue="flaky").id
    fast.create({}, queue="nobody-handles-this")
    summary = Worker(fast, {"echo": tasks.echo, "flaky": tasks.flaky}, concurrency=3, mode=mode).run(burst=True)
    assert summary.stopped_by == "burst" and (summary.fulfilled, summary.retried, summary.failed) == (13, 1, 0)
    assert [fast.get(i).value["echo"] for i in ids] == list(range(12))
    assert fast.get(flaky).result() == "fine" and fast.get(flaky).attempts == 2
    assert fast.statistics().pending_by_queue["nobody-handles-this"] == 1


def test_a_burst_says_which_paused_queues_it_left_jobs_in(fast: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    fast.create({"n": 1}, queue="echo")
    fast.create({"n": 2}, queue="held")
    fast.pause("held")
    with caplog.at_level(logging.WARNING, logger="fsjobstore.worker"):
        summary = Worker(fast, {"echo": tasks.echo, "held": tasks.echo}).run(burst=True)
    assert summary.fulfilled == 1
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"queue held is paused: its 1 pending job(s) were left (resume it: fsjobstore resume "
                    f"{fast.path} held)"]


def test_a_burst_that_found_nothing_names_the_queues_where_jobs_wait(
        fast: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    fast.create({"n": 1}, queue="alpha")
    with caplog.at_level(logging.WARNING, logger="fsjobstore.worker"):
        Worker(fast, {"default": tasks.echo}).run(burst=True)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["no job of queue(s) default was due; jobs wait in other queues: alpha (1)"]


def test_a_burst_says_what_a_limit_left_waiting(fast: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    fast.set_limit(key="api", concurrency=5, rate="2/m")
    for i in range(5):
        fast.create({"n": i}, concurrency_key="api")
    fast.set_limit(queue="slow", rate="1/m")
    for i in range(3):
        fast.create({"n": i}, queue="slow")
    with caplog.at_level(logging.WARNING, logger="fsjobstore.worker"):
        summary = Worker(fast, {"default": tasks.echo, "slow": tasks.echo}).run(burst=True)
    assert summary.fulfilled == 3
    said = sorted(r.getMessage() for r in caplog.records)
    assert said == ["3 job(s) of concurrency key 'api' were left waiting for its limit (5 at once, 2 per 60 s); a "
                    "later run, or the worker holding it, starts them",
                    "queue slow is at its limit (1 per 60 s): its 2 pending job(s) were left"]


@pytest.mark.parametrize("mode", MODES)
def test_count_stops_after_that_many_jobs(fast: JobStore, mode: str) -> None:
    for i in range(10):
        fast.create({"n": i}, queue="echo")
    summary = Worker(fast, {"echo": tasks.echo}, concurrency=2, mode=mode).run(count=4)
    assert summary.stopped_by == "count" and summary.fulfilled == 4
    assert fast.statistics().fulfilled == 4 and fast.statistics().pending == 6


@pytest.mark.parametrize("mode", MODES)
def test_duration_stops_taking_work_and_lets_the_running_job_finish(fast: JobStore, mode: str) -> None:
    job = fast.create({"seconds": 1.0}, queue="slow")
    started = time.monotonic()
    summary = Worker(fast, {"slow": tasks.slow}, mode=mode).run(duration=0.3)
    assert summary.stopped_by == "duration" and 0.9 < time.monotonic() - started < 10
    assert fast.get(job.id).state is JobState.FULFILLED


@pytest.mark.parametrize("mode", MODES)
def test_a_stop_past_the_grace_gives_the_running_job_back_without_counting_an_attempt(
    fast: JobStore, mode: str
) -> None:
    job = fast.create({"seconds": 30}, queue="slow")
    worker = Worker(fast, {"slow": tasks.slow}, mode=mode, grace=0.5)
    threading.Timer(1.0, worker.stop).start()
    summary = worker.run()
    assert summary.stopped_by == "stop" and summary.seconds < 15
    got = fast.get(job.id)
    assert got.state is JobState.PENDING and got.attempts == 0
    assert summary.given_back == 1 and summary.attempts == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_job_given_back_at_a_stop_no_longer_shows_the_progress_of_that_try(fast: JobStore, mode: str) -> None:
    job = fast.create({}, queue="careful")
    worker = Worker(fast, {"careful": tasks.careful}, mode=mode, grace=0.5)
    threading.Timer(1.0, worker.stop).start()
    summary = worker.run()
    assert summary.given_back == 1
    got = fast.get(job.id)
    assert got.state is JobState.PENDING and got.attempts == 0 and got.progress is None


@pytest.mark.parametrize("mode", MODES)
def test_a_handler_past_its_time_limit_fails_that_attempt_and_the_job_is_retried(fast: JobStore, mode: str) -> None:
    job = fast.create({}, queue="hang", timeout=0.5, max_attempts=2)
    started = time.monotonic()
    summary = Worker(fast, {"hang": tasks.hang}, mode=mode).run(burst=True)
    assert time.monotonic() - started < 20
    got = fast.get(job.id)
    assert got.state is JobState.FULFILLED and got.value == "second time" and got.attempts == 2
    assert summary.timed_out == 1 and summary.fulfilled == 1


def test_a_thread_past_its_limit_is_fenced_and_its_late_value_discarded(fast: JobStore) -> None:
    job = fast.create({"seconds": 1.5}, queue="slow", timeout=0.3, max_attempts=1)
    Worker(fast, {"slow": tasks.slow}, mode="threads").run(burst=True)
    time.sleep(1.6)  # the abandoned thread finishes and tries to commit: refused
    got = fast.get(job.id)
    assert got.state is JobState.FAILED and "TimeLimitExceeded" in (got.error or "") and got.value is None


@pytest.mark.parametrize("mode", MODES)
def test_a_job_cancelled_while_it_runs_ends_cancelled_not_fulfilled(open_store: Callable[..., JobStore],
                                                                     mode: str) -> None:
    store, operator = open_store(), open_store()
    job = store.create({}, queue="careful")
    worker = Worker(store, {"careful": tasks.careful}, mode=mode)
    done = threading.Event()
    runner = threading.Thread(target=lambda: (worker.run(burst=True), done.set()))
    runner.start()
    deadline = time.monotonic() + 20
    while operator.get(job.id).state is not JobState.ACTIVE and time.monotonic() < deadline:
        time.sleep(0.05)
    operator.cancel(job.id, reason="stop it")
    assert done.wait(20), "the worker did not finish"
    runner.join()
    got = operator.get(job.id)
    assert got.state is JobState.CANCELLED and got.value is None and got.error == "cancelled: stop it"


@pytest.mark.parametrize("mode", MODES)
def test_a_paused_worker_takes_nothing_until_resumed(fast: JobStore, mode: str) -> None:
    job = fast.create({"n": 1}, queue="echo")
    worker = Worker(fast, {"echo": tasks.echo}, mode=mode)
    worker.pause()
    runner = threading.Thread(target=lambda: worker.run(count=1))
    runner.start()
    time.sleep(1.0)
    assert fast.get(job.id).state is JobState.PENDING
    worker.resume()
    runner.join(20)
    assert not runner.is_alive() and fast.get(job.id).state is JobState.FULFILLED


@pytest.mark.parametrize("mode", MODES)
def test_a_running_worker_shows_in_the_registry_with_its_jobs(open_store: Callable[..., JobStore], mode: str) -> None:
    store, observer = open_store(), open_store()
    job = store.create({"seconds": 2.0}, queue="slow")
    worker = Worker(store, {"slow": tasks.slow}, mode=mode, concurrency=2, name="w-test")
    runner = threading.Thread(target=lambda: worker.run(burst=True))
    runner.start()
    seen = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        entries = observer.workers()
        if entries and entries[0].current:
            seen = entries[0]
            break
        time.sleep(0.1)
    runner.join(20)
    assert seen is not None, "the worker never showed its running job"
    assert (seen.name, seen.mode, seen.concurrency, seen.queues) == ("w-test", mode, 2, ("slow",))
    assert seen.current[0]["id"] == job.id
    assert observer.workers() == []  # retracted when it stopped


def test_bad_worker_arguments_name_the_problem(fast: JobStore) -> None:
    with pytest.raises(InvalidRequest, match="concurrency"):
        Worker(fast, concurrency=0)
    with pytest.raises(InvalidRequest, match="mode"):
        Worker(fast, mode="fibers")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="no handlers"):
        Worker(fast).run(burst=True)
    with pytest.raises(InvalidRequest, match="no handler for queue"):
        Worker(fast, {"echo": tasks.echo}, queues=["echo", "other"]).run(burst=True)
    with pytest.raises(InvalidRequest, match="not callable"):
        Worker(fast, {"echo": "not a function"})  # type: ignore[dict-item]
    for bad in ("my.queue", "with space", "", "-first"):
        with pytest.raises(InvalidQueueName, match="is not a queue name"):
            Worker(fast, {bad: tasks.echo})
        with pytest.raises(InvalidQueueName, match="is not a queue name"):
            Worker(fast, {"echo": tasks.echo}, queues=[bad])
        with pytest.raises(InvalidQueueName):  # the error the store raises for the same name
            fast.create({}, queue=bad)


@pytest.mark.parametrize("mode", MODES)
def test_slots_that_keep_dying_at_start_stop_the_worker_with_an_error_and_lose_nothing(
    fast: JobStore, mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from fsjobstore import WorkerFailing

    job = fast.create({"n": 1}, queue="echo")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("this store cannot be read")  # what every pull of a broken setup meets

    monkeypatch.setattr(fast, "pull_work", broken)  # forked children inherit it
    started = time.monotonic()
    with pytest.raises(WorkerFailing, match="5 times in a row"):
        Worker(fast, {"echo": tasks.echo}, concurrency=2, mode=mode).run(burst=True)
    deaths = [r for r in caplog.records if "exited with" in r.message or "worker thread failed" in r.message]
    assert len(deaths) <= 6, len(deaths)  # no fork storm: restarts waited, 0.1 s doubling
    assert time.monotonic() - started > 0.4
    monkeypatch.undo()
    assert fast.get(job.id).state is JobState.PENDING and fast.workers() == []


def test_the_deliverer_delivers_and_keeps_the_targets_that_failed(fast: JobStore, tmp_path: object) -> None:
    import pathlib

    out = pathlib.Path(str(tmp_path)) / "delivered.txt"
    job = fast.create(1)
    fast.queue(job.id, {"file": str(out)})
    fast.queue(job.id, "not a file target")
    fast.fulfill(job.id, {"v": 1})
    delivered, failed = Deliverer(fast, tasks.deliver).run(burst=True)
    assert (delivered, failed) == (1, 1)
    assert out.read_text() == f"{job.id} fulfilled {{'v': 1}}\n"
    assert fast.get(job.id).waiting == ("not a file target",)


@pytest.mark.parametrize("mode", MODES)
def test_a_burst_runs_every_attempt_of_a_job_that_keeps_timing_out_before_it_ends(fast: JobStore, mode: str) -> None:
    job = fast.create({"seconds": 5}, queue="slow", timeout=0.3, max_attempts=3)
    summary = Worker(fast, {"slow": tasks.slow}, mode=mode).run(burst=True)
    got = fast.get(job.id)
    assert got.state is JobState.FAILED and got.attempts == 3, (got, summary)


@pytest.mark.parametrize("mode", MODES)
def test_a_value_that_cannot_be_stored_fails_the_job_at_once_with_a_clear_error(fast: JobStore, mode: str) -> None:
    job = fast.create({"value": "a set"}, queue="bad", max_attempts=3)
    Worker(fast, {"bad": tasks.unstorable}, mode=mode).run(burst=True)
    got = fast.get(job.id)
    assert got.state is JobState.FAILED and got.attempts == 1  # a bug in the handler: running it again cannot help
    assert (got.error or "").startswith("the handler's return value cannot be stored: ")


def test_a_child_slow_to_start_after_a_time_out_is_not_taken_for_the_one_that_overran(
        fast: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Until a new child writes its slot, the slot showed the killed child's overrun job, and the
    # next tick killed the new child for it, again and again: one time-out counted 4 times in CI.
    from fsjobstore._runtime import _processes

    real = _processes._child

    def slow_child(*args: object) -> None:
        time.sleep(0.5)  # a loaded machine: the child writes its slot late
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_processes, "_child", slow_child)
    job = fast.create({}, queue="hang", timeout=0.3, max_attempts=2)
    summary = Worker(fast, {"hang": tasks.hang}, mode="processes").run(burst=True)
    assert fast.get(job.id).state is JobState.FULFILLED
    assert (summary.timed_out, summary.fulfilled) == (1, 1), summary
