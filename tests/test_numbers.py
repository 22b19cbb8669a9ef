"""Every numeric argument of the store goes through one check (``_checks.number``/``integer``):
no bool, NaN or infinity is taken for a number, and each error names the argument and its range."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsjobstore import InvalidRequest, JobStore

NOT_NUMBERS = [float("nan"), float("inf"), float("-inf"), True, "1", None]


@pytest.mark.parametrize("bad", NOT_NUMBERS)
@pytest.mark.parametrize("name", ["lease_duration", "heartbeat_interval", "poll_interval", "max_attempts",
                                  "max_value_bytes", "max_request_bytes", "default_timeout"])
def test_the_store_refuses_what_is_not_a_finite_number_for_each_numeric_setting(
        tmp_path: Path, name: str, bad: object) -> None:
    if bad is None and name in ("heartbeat_interval", "default_timeout"):
        return  # None means the default there
    with pytest.raises(InvalidRequest, match=name):
        JobStore(tmp_path / "s", **{name: bad})


@pytest.mark.parametrize("bad", NOT_NUMBERS[:5])
@pytest.mark.parametrize("name", ["priority", "delay", "run_at", "max_attempts", "timeout"])
def test_create_refuses_what_is_not_a_finite_number_for_each_numeric_argument(
        store: JobStore, name: str, bad: object) -> None:
    with pytest.raises(InvalidRequest, match=name):
        store.create("x", **{name: bad})
    assert store.statistics().pending == 0


@pytest.mark.parametrize("bad", NOT_NUMBERS[:5])
def test_the_calls_of_a_lease_and_the_waits_refuse_nan_and_infinities(store: JobStore, bad: object) -> None:
    job = store.create("x", timeout=60)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("timeout", lambda: store.pull_work(timeout=bad)),  # type: ignore[arg-type]
        ("timeout", lambda: store.wait(job.id, timeout=bad)),  # type: ignore[arg-type]
    ]
    for what, call in calls:
        with pytest.raises(InvalidRequest, match=what):
            call()
    lease = store.pull_work()
    assert lease is not None
    for what, call in [("extend", lambda: lease.touch(bad)),  # type: ignore[arg-type]
                       ("done", lambda: lease.progress(bad)),  # type: ignore[arg-type]
                       ("total", lambda: lease.progress(1, bad)),  # type: ignore[arg-type]
                       ("delay", lambda: lease.fail("e", delay=bad))]:  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match=what):
            call()
    lease.fulfill(1)  # nothing was changed by the refused calls: the lease is still ours


def test_a_lease_shorter_than_its_heartbeats_can_keep_is_refused_naming_the_minimum(tmp_path: Path) -> None:
    for too_short in (0.01, 0.49, 0, -1):
        with pytest.raises(InvalidRequest, match=r"lease_duration must be positive and at least 0\.5 s"):
            JobStore(tmp_path / "s", lease_duration=too_short)
    with JobStore(tmp_path / "s", lease_duration=0.5) as store:
        assert (store.lease_duration, store.heartbeat_interval) == (0.5, 0.125)


def test_a_heartbeat_interval_below_the_minimum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match=r"heartbeat_interval must be in \[0\.01, lease_duration / 2"):
        JobStore(tmp_path / "s", lease_duration=1.0, heartbeat_interval=0.001)


def test_an_error_names_the_argument_its_range_and_the_value(store: JobStore) -> None:
    with pytest.raises(InvalidRequest, match=r"priority must be an integer in \[-999999, 999999\], got 1\.5"):
        store.create("x", priority=1.5)
    with pytest.raises(InvalidRequest, match=r"delay \(seconds\) must be a finite number in \[0, 1e\+09\), got nan"):
        store.create("x", delay=float("nan"))
