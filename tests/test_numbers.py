"""Every numeric argument of the store goes through one check (``_checks.number``/``integer``):
no bool, NaN or infinity is taken for a number, and each error names the argument and its range."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fsjobstore import InvalidRequest, JobState, JobStore, parse_duration

NOT_NUMBERS = [float("nan"), float("inf"), float("-inf"), True, "1", None]
# Lengths of time: plain seconds as text ("1") is one of their forms (parse_duration).
DURATIONS = {"lease_duration", "heartbeat_interval", "poll_interval", "default_timeout", "delay", "timeout",
             "extend"}


@pytest.mark.parametrize("bad", NOT_NUMBERS)
@pytest.mark.parametrize("name", ["lease_duration", "heartbeat_interval", "poll_interval", "max_attempts",
                                  "max_value_bytes", "max_request_bytes", "default_timeout"])
def test_the_store_refuses_what_is_not_a_finite_number_for_each_numeric_setting(
        tmp_path: Path, name: str, bad: object) -> None:
    if bad is None and name in ("heartbeat_interval", "default_timeout"):
        return  # None means the default there
    if bad == "1" and name in DURATIONS:
        return
    with pytest.raises(InvalidRequest, match=name):
        JobStore(tmp_path / "s", **{name: bad})


@pytest.mark.parametrize("bad", NOT_NUMBERS[:5])
@pytest.mark.parametrize("name", ["priority", "delay", "run_at", "max_attempts", "timeout"])
def test_create_refuses_what_is_not_a_finite_number_for_each_numeric_argument(
        store: JobStore, name: str, bad: object) -> None:
    if bad == "1" and name in DURATIONS:
        return
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
        if bad == "1" and what in DURATIONS:
            continue
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


def test_every_duration_the_api_takes_reads_the_forms_the_command_line_takes(tmp_path: Path) -> None:
    """One reading of a length of time (parse_duration) for the store's settings, a job's, a
    purge's and a lease's, as for the command line's --retain and --older-than."""
    assert [parse_duration(v) for v in ("90s", "15m", "1h30m", "12h", "7d", "2w", "3600", "1.5", "1.5h", 5,
                                        timedelta(minutes=2))] == [90, 900, 5400, 43200, 604800, 1209600, 3600,
                                                                   1.5, 5400, 5, 120]
    assert parse_duration("forever", forever=True) == float("inf")
    with JobStore(tmp_path / "s", lease_duration="1m", heartbeat_interval="5s", poll_interval="2s",
                  default_timeout="1h30m", retain="7d") as store:
        assert (store.lease_duration, store.heartbeat_interval, store.poll_interval, store.retain) == (60, 5, 2, 604800)
        assert store.create("x").timeout == 5400
        later = store.create("y", delay="90s", timeout="15m", retain="2w")
        assert later.timeout == 900 and later.run_at is not None
        assert later.run_at - later.created_at == pytest.approx(90)
        scheduled = os.path.join(store.path, "jobs", "scheduled")
        [name] = os.listdir(scheduled)
        with open(os.path.join(scheduled, name)) as fh:
            assert json.loads(fh.readline())["retain"] == 1209600
        assert store.purge(states="scheduled", older_than="1h") == 0  # made just now
        lease = store.pull_work()
        assert lease is not None and lease.deadline is not None
        before = lease.deadline
        lease.touch("1h")
        assert lease.deadline == pytest.approx(before - 1800, abs=60)  # an hour from now, not the job's 90 minutes
        lease.fail("try again later", delay="2h")
        again = store.get(lease.id)
        assert again.state is JobState.SCHEDULED and again.run_at is not None
        assert again.run_at - store.get(later.id).run_at > 7000  # two hours, not the backoff's seconds


@pytest.mark.parametrize(("call", "said"), [
    (lambda s: s.create("x", delay="soon"), "delay (seconds) must be a duration such as 90s, 15m, 1h30m"),
    (lambda s: s.create("x", timeout="1M"), "timeout (seconds, or None): units are lower-case s, m, h, d, w, and "
                                            "m is minutes: there is no month unit"),
    (lambda s: s.create("x", retain="7D"), "retain: units are lower-case s, m, h, d, w: did you mean '7d'?"),
    (lambda s: s.create("x", retain="7x"), "retain must be forever, 0 (removed as soon as final) or a duration"),
    (lambda s: s.purge(older_than="1h 30m"), "older_than (seconds, a timedelta, or a duration such as 7d) must be"),
    (lambda s: s.create("x", delay="-5s"), "delay (seconds) must be a duration"),
    (lambda s: parse_duration(True, "grace"), "grace must be a duration such as 90s"),
    (lambda s: parse_duration(-1.0, "grace"), "grace must be a duration such as 90s"),
])
def test_a_duration_of_no_accepted_form_is_refused_naming_the_argument_and_the_forms(
        store: JobStore, call: Callable[[JobStore], Any], said: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        call(store)
    assert said in str(caught.value)
    assert store.statistics().pending + store.statistics().scheduled == 0
