"""Every failed attempt's error is kept in the job's record (bounded), not only the last one."""

from __future__ import annotations

import json
from collections.abc import Callable

from conftest import FakeWall, die
from internals import pending_file

from fsjobstore import AttemptError, JobState, JobStore
from fsjobstore._format._records import Record


def test_each_failed_attempt_keeps_its_error_and_the_final_one_too(store: JobStore) -> None:
    job = store.create("x", max_attempts=3)
    for n in (1, 2, 3):
        lease = store.pull_work()
        assert lease is not None
        lease.fail(f"boom {n}")
    got = store.get(job.id)
    assert got.state is JobState.FAILED and got.error == "boom 3"
    assert [(e.attempt, e.error) for e in got.attempt_errors] == [(1, "boom 1"), (2, "boom 2"), (3, "boom 3")]
    assert all(isinstance(e, AttemptError) and e.at > 0 for e in got.attempt_errors)
    assert [e["error"] for e in got.to_dict()["attempt_errors"]] == ["boom 1", "boom 2", "boom 3"]


def test_a_lost_attempt_is_listed_with_what_recovery_said(open_store: Callable[..., JobStore]) -> None:
    worker, rescuer = open_store(), open_store(backoff=lambda a: 0.0)
    job = worker.create("x", max_attempts=3)
    assert worker.pull_work() is not None
    die(worker)
    rescuer.recover()
    lease = rescuer.pull_work()
    assert lease is not None
    lease.fail("second")
    got = rescuer.get(job.id)
    assert [(e.attempt, e.error) for e in got.attempt_errors] == [(1, "attempt 1 lost: its process exited"),
                                                                  (2, "second")]


def test_only_the_last_ten_attempts_are_kept_each_cut_to_a_few_kib(open_store: Callable[..., JobStore]) -> None:
    store = open_store(backoff=lambda a: 0.0)
    job = store.create("x", max_attempts=15)
    for n in range(1, 14):
        lease = store.pull_work()
        assert lease is not None
        lease.fail(f"first line of {n}\n" + "x" * 10_000 + f"\nValueError: number {n}")
    got = store.get(job.id)
    assert [e.attempt for e in got.attempt_errors] == list(range(4, 14))
    last = got.attempt_errors[-1].error
    assert len(last) <= 4096 and last.startswith("first line of 13") and last.endswith("ValueError: number 13")
    assert "chars cut" in last
    assert len(got.error or "") > 10_000  # the last error itself is kept whole


def test_a_retry_starts_a_new_life_with_no_attempt_errors(store: JobStore) -> None:
    job = store.create("x", max_attempts=1)
    lease = store.pull_work()
    assert lease is not None
    lease.fail("once")
    assert len(store.get(job.id).attempt_errors) == 1
    again = store.retry(job.id)
    assert again.attempt_errors == () and store.get(job.id).attempt_errors == ()
    assert store.get(job.id).history[0]["error"] == "once"


def test_a_job_file_without_the_field_still_reads_and_one_that_has_it_round_trips(store: JobStore) -> None:
    job = store.create("x", max_attempts=3)
    with open(pending_file(store.path, job.id), "rb") as fh:
        data = fh.read()
    assert b"attempt_errors" not in data  # absent while empty: files are as before
    lease = store.pull_work()
    assert lease is not None
    lease.fail("boom")
    with open(pending_file(store.path, job.id), "rb") as fh:  # retried: back in its bucket
        doc = json.loads(fh.readline())
    assert doc["format"] == 3 and doc["attempt_errors"][0]["error"] == "boom"
    record = Record.from_bytes(json.dumps(doc).encode() + b"\n")
    assert record.attempt_errors[0]["attempt"] == 1
    assert store.get(job.id).attempt_errors[0].error == "boom"


def test_a_time_out_is_listed_as_a_failed_attempt(open_store: Callable[..., JobStore]) -> None:
    store = open_store(backoff=lambda a: 0.0, wall_clock=FakeWall())
    job = store.create("x", timeout=5, max_attempts=2)
    lease = store.pull_work()
    assert lease is not None and lease.time_out()
    assert [e.error for e in store.get(job.id).attempt_errors] == [
        "TimeLimitExceeded: attempt 1 ran past its limit of 5 s"]
