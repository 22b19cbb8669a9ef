"""Periodic jobs (fsjobstore.schedule, JobStore.make_tick): when ticks fall, the catch-up
policy, and each tick made once, whoever makes it (more processes: test_schedule_procs.py)."""

from __future__ import annotations

import errno
import itertools
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from conftest import FakeWall

from fsjobstore import (
    InvalidQueueName,
    InvalidRequest,
    JobNotFound,
    JobStore,
    Schedule,
    StorageError,
    Worker,
    tick_of,
)
from fsjobstore._relations import _ticks
from fsjobstore.schedule import LATE, RETRY_AFTER, Cron, Every, timing_of

PARIS = ZoneInfo("Europe/Paris")
T0 = 1_800_000_000  # 2027-01-15T08:00:00Z: a whole hour


def at(*fields: int, tz: ZoneInfo = PARIS) -> float:
    return datetime(*fields, tzinfo=tz).timestamp()  # type: ignore[misc]


def local(t: int) -> str:
    return datetime.fromtimestamp(t, PARIS).strftime("%m-%d %H:%M%z")


# -- when ticks fall --------------------------------------------------------------------------------

def test_every_ticks_on_whole_intervals_from_its_start_and_none_before_it() -> None:
    every = Every(300)
    assert every.ticks(T0 - 1, T0 + 900, 10) == [T0, T0 + 300, T0 + 600, T0 + 900]
    assert every.ticks(T0, T0 + 899, 10) == [T0 + 300, T0 + 600]  # (after, upto]
    assert every.next_after(T0) == T0 + 300 and every.next_after(T0 + 1) == T0 + 300
    started = Every(300, start=T0 + 10)
    assert started.ticks(0, T0 + 320, 10) == [T0 + 10, T0 + 310]
    assert started.next_after(5) == T0 + 10
    assert every.ticks(0, T0, 2) == [T0 - 300, T0]  # the newest two


def test_a_daily_cron_tick_skipped_by_spring_forward_runs_after_the_gap_and_once_on_fall_back() -> None:
    daily = Cron("30 2 * * *", "Europe/Paris")
    spring = daily.ticks(at(2026, 3, 27, 12), at(2026, 3, 31, 12), 100)
    assert [local(t) for t in spring] == ["03-28 02:30+0100", "03-29 03:00+0200", "03-30 02:30+0200",
                                          "03-31 02:30+0200"]
    autumn = daily.ticks(at(2026, 10, 23, 12), at(2026, 10, 27, 12), 100)
    assert [local(t) for t in autumn] == ["10-24 02:30+0200", "10-25 02:30+0200", "10-26 02:30+0100",
                                          "10-27 02:30+0100"]
    assert daily.next_after(at(2026, 10, 25, 2, 45)) == at(2026, 10, 26, 2, 30)


def test_an_hourly_cron_ticks_in_both_repeated_hours_of_a_fall_back_and_23_times_on_spring_forward() -> None:
    hourly = Cron("0 * * * *", "Europe/Paris")
    autumn = hourly.ticks(at(2026, 10, 25, 0, 0) - 1, at(2026, 10, 26, 0, 0) - 1, 100)
    spring = hourly.ticks(at(2026, 3, 29, 0, 0) - 1, at(2026, 3, 30, 0, 0) - 1, 100)
    assert (len(autumn), len(spring)) == (25, 23)
    assert len(set(autumn)) == 25 and all(b - a == 3600 for a, b in itertools.pairwise(autumn))


def test_a_cron_schedule_keeps_its_zone_and_a_spec_reads_back_as_the_same_timing() -> None:
    s = Schedule()
    p = s.cron("0 3 * * *", tz=PARIS, queue="reports")
    q = s.every(timedelta(minutes=5), start=datetime(2026, 1, 1, 0, 1, tzinfo=UTC), queue="digest")
    assert p.spec == "cron 0 3 * * * Europe/Paris" and p.name.startswith("reports-cron-")
    assert timing_of(p.spec) == p.timing and timing_of(q.spec) == q.timing
    assert q.name == "digest-every-300s"


@pytest.mark.parametrize(("call", "says"), [
    (lambda s: s.every(0.5), "whole number of seconds"),
    (lambda s: s.every(0), "from 1 to"),
    (lambda s: s.every("5m"), "whole number of seconds"),
    (lambda s: s.every(60, start=datetime(2026, 1, 1)), "no time zone"),
    (lambda s: s.cron("0 3 * *"), "five fields"),
    (lambda s: s.cron("61 * * * *"), "is not valid"),
    (lambda s: s.cron("0 3 * * *", tz="Europe/Pariss"), "not a time zone"),
    (lambda s: s.cron("0 3 * * *", tz=datetime.now().astimezone().tzinfo), "zone name"),
    (lambda s: s.every(60, catch_up=-1), "catch_up"),
    (lambda s: (s.every(60), s.every(60)), "has a schedule named 'default-every-60s' already"),
])
def test_a_mistake_in_a_schedule_is_refused_where_it_is_declared_and_says_what(
        call: Callable[[Schedule], object], says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        call(Schedule())


def test_a_bad_schedule_or_queue_name_is_refused_by_the_names_rule() -> None:
    with pytest.raises(InvalidQueueName, match="schedule name"):
        Schedule().every(60, name="no/slash")
    with pytest.raises(InvalidQueueName, match="queue 'a b' is not"):  # the queue, not the name made of it
        Schedule().every(60, queue="a b")
    with pytest.raises(InvalidQueueName, match="queue 'a b' is not"):
        Schedule().cron("0 3 * * *", queue="a b")
    with pytest.raises(TypeError, match="a job id"):
        tick_of(123)  # type: ignore[arg-type]


def test_bad_job_options_of_a_schedule_raise_before_a_worker_takes_anything(
        open_store: Callable[..., JobStore]) -> None:
    store = open_store()
    store.create("waiting")
    worker = Worker(store, {"default": lambda job: None}, mode="threads")
    worker.every(60, priority="high", name="hourly")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="schedule 'hourly': priority"):
        worker.run(burst=True)
    assert store.statistics().pending == 1 and store.schedules() == []


# -- catch-up ---------------------------------------------------------------------------------------

def test_no_tick_from_before_a_schedule_was_first_declared_is_made(open_store: Callable[..., JobStore]) -> None:
    wall = FakeWall(T0 + 30)
    store = open_store(wall_clock=wall)
    s = Schedule()
    s.every(60, queue="q")
    assert s.run_pending(store, now=wall.now) == pytest.approx(30)
    assert store.statistics().pending == 0
    wall.advance(30)
    s.run_pending(store, now=wall.now)
    assert [j.id for j in store.jobs(state="pending")] == [f"tick-q-every-60s-{T0 + 60}"]


@pytest.mark.parametrize(("catch_up", "made"), [(1, [5]), (3, [3, 4, 5]), (0, [])])
def test_a_scheduler_back_after_missing_ticks_makes_at_most_catch_up_of_the_newest(
        open_store: Callable[..., JobStore], catch_up: int, made: list[int]) -> None:
    wall = FakeWall(T0)
    store = open_store(wall_clock=wall)
    s = Schedule()
    s.every(120, queue="q", catch_up=catch_up)
    s.run_pending(store, now=wall.now)  # declared at T0; then down while five ticks fell
    wall.advance(700)  # the newest, T0 + 600, is 100 s late: missed (LATE is 60 s)
    assert LATE < 100
    s.run_pending(store, now=wall.now)
    assert sorted(j.id for j in store.jobs(state="pending")) == [f"tick-q-every-120s-{T0 + 120 * k}" for k in made]
    s.run_pending(store, now=wall.now)  # a second pass makes nothing more
    assert store.statistics().pending == len(made)


def test_catch_up_0_still_makes_a_tick_found_on_time(open_store: Callable[..., JobStore]) -> None:
    wall = FakeWall(T0)
    store = open_store(wall_clock=wall)
    s = Schedule()
    s.every(60, queue="q", catch_up=0)
    s.run_pending(store, now=T0)
    s.run_pending(store, now=T0 + 60 + LATE - 1)
    assert [j.id for j in store.jobs(state="pending")] == [f"tick-q-every-60s-{T0 + 60}"]


# -- each tick once ---------------------------------------------------------------------------------

def test_two_schedules_of_the_same_name_on_one_store_make_each_tick_once(open_store: Callable[..., JobStore]) -> None:
    wall = FakeWall(T0)
    one, two = open_store(wall_clock=wall), open_store(wall_clock=wall)
    a, b = Schedule(), Schedule()
    for s in (a, b):
        s.every(60, queue="q", request={"n": 1}, name="shared")
    a.run_pending(one, now=T0)
    b.run_pending(two, now=T0)
    for minute in range(1, 6):
        first, second = (a, one), (b, two)
        if minute % 2:
            first, second = second, first
        first[0].run_pending(first[1], now=T0 + 60 * minute)
        second[0].run_pending(second[1], now=T0 + 60 * minute + 1)
    ids = sorted(j.id for j in one.jobs(state="pending"))
    assert ids == [f"tick-shared-{T0 + 60 * m}" for m in range(1, 6)]
    assert one.get(ids[0]).request == {"n": 1}
    assert tick_of(ids[0]) == ("shared", datetime.fromtimestamp(T0 + 60, UTC))
    [info] = one.schedules()
    assert (info.name, info.last_tick, info.last_job) == ("shared", T0 + 300, ids[-1])


def test_a_tick_whose_job_was_made_and_removed_before_its_record_is_not_made_again(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    # A scheduler killed between creating a tick's job and recording it; the job then ran and was
    # removed before another scheduler looked. Removal records the tick before it frees the id.
    wall = FakeWall(T0)
    store = open_store(wall_clock=wall, retain=0)
    s = Schedule()
    s.every(60, queue="q", name="nightly")
    s.run_pending(store, now=T0)
    job = store.create("made by the killed scheduler", queue="q", job_id=f"tick-nightly-{T0 + 60}", retain=0)
    store.fulfill(job.id, "done")
    store.purge()  # (retain=0 may have removed it already: the same removal)
    with pytest.raises(JobNotFound):
        store.get(job.id)
    s.run_pending(store, now=T0 + 61)
    assert store.statistics().pending == 0, "the tick was made a second time"
    assert store.schedules()[0].last_tick == T0 + 60


def test_a_scheduler_whose_look_was_stale_gives_the_id_back_when_it_finds_the_tick_recorded(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    # It looked (no record), stalled while another made the tick, the job ran and was removed;
    # it then wins the freed id. The check made once it holds the reservation turns it back.
    store = open_store()
    _ticks.record(store._core, "nightly", T0 + 60)  # what the other scheduler and the removal left
    real, looks = _ticks.recorded, []

    def stale_first(core: object, name: str) -> list[int]:
        looks.append(name)
        return [] if len(looks) == 1 else real(core, name)  # type: ignore[arg-type]

    monkeypatch.setattr(_ticks, "recorded", stale_first)
    assert store.make_tick("nightly", T0 + 60, "x", queue="q") is None
    assert len(looks) == 2 and store.statistics().pending == 0
    assert not os.path.exists(os.path.join(store.path, "ids", f"tick-nightly-{T0 + 60}"))


def test_a_tick_reserved_by_one_scheduler_is_not_recorded_by_another_so_its_maker_publishes_it(
        open_store: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch) -> None:
    # The loss the first version had: B met A's reservation (JobExists) and recorded the tick;
    # A, looking again before it published, took the record for a removal's and gave the id back.
    store = open_store()
    real_recorded = _ticks.recorded
    met: list[object] = []

    def second_scheduler_meets_the_reservation(core: object, name: str) -> list[int]:
        if not met and os.path.exists(os.path.join(store.path, "ids", f"tick-s-{T0}")):
            met.append("B looks")
            met.append(store.make_tick("s", T0, queue="q"))  # B, between A's link and A's look
        return real_recorded(core, name)  # type: ignore[arg-type]

    monkeypatch.setattr(_ticks, "recorded", second_scheduler_meets_the_reservation)
    made = store.make_tick("s", T0, queue="q")
    assert met == ["B looks", None] and made is not None and made.id == f"tick-s-{T0}"
    assert [j.id for j in store.jobs(state="pending")] == [f"tick-s-{T0}"]


def test_make_tick_never_makes_a_tick_older_than_one_made(open_store: Callable[..., JobStore]) -> None:
    store = open_store()
    assert store.make_tick("s", T0 + 120, queue="q") is not None
    assert store.make_tick("s", T0 + 60, queue="q") is None
    assert store.make_tick("s", T0 + 120, queue="q") is None
    assert [j.id for j in store.jobs(state="pending")] == [f"tick-s-{T0 + 120}"]


# -- a hostile directory, a failing pass --------------------------------------------------------------

def test_a_link_planted_for_the_schedules_directory_steers_nothing_outside(
        open_store: Callable[..., JobStore], tmp_path: object) -> None:
    store = open_store()
    outside = os.path.join(str(tmp_path), "outside")
    os.mkdir(outside)
    planted = os.path.join(store.path, "control", "schedules")
    os.symlink(outside, planted)
    s = Schedule()
    s.every(1, queue="q")
    s.run_pending(store)
    assert store.make_tick("s", T0, queue="q") is not None
    assert os.listdir(outside) == [] and not os.path.islink(planted)  # quarantined; a directory made there
    assert {i.name for i in store.schedules()} == {"q-every-1s", "s"} or {i.name for i in store.schedules()} == {
        "q-every-1s"}


def test_a_pass_that_fails_is_logged_and_tried_again_without_stopping_the_others(
        open_store: Callable[..., JobStore], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    wall = FakeWall(T0)
    store = open_store(wall_clock=wall)
    real = store.make_tick

    def eio_for_broken(schedule: str, tick: int, *args: object, **kw: object) -> object:
        if schedule == "broken":
            raise StorageError(errno.EIO, "Input/output error")
        return real(schedule, tick, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "make_tick", eio_for_broken)
    s = Schedule()
    s.every(1, queue="q", name="broken")
    s.every(1, queue="q", name="fine")
    s.run_pending(store, now=T0)
    with caplog.at_level(logging.WARNING, "fsjobstore.schedule"):
        wait = s.run_pending(store, now=T0 + 3)
    assert "schedule broken: pass failed (StorageError" in caplog.text and wait <= RETRY_AFTER
    assert [j.id for j in store.jobs(state="pending")] == [f"tick-fine-{T0 + 3}"]
    monkeypatch.undo()
    s.run_pending(store, now=T0 + 3 + RETRY_AFTER)  # tried again; the newest missed tick is made
    assert f"tick-broken-{T0 + 8}" in {j.id for j in store.jobs(state="pending")}


@pytest.mark.parametrize("planted", [b"{not json", b'{"spec": 1}', b"[]", b'{"spec": "every 5s", "queue": "q", '
                                     b'"since": NaN, "declared_at": 1}'])
def test_a_declaration_that_is_junk_is_written_again_and_ticks_go_on(
        open_store: Callable[..., JobStore], planted: bytes) -> None:
    wall = FakeWall(T0)
    store = open_store(wall_clock=wall)
    s = Schedule()
    s.every(5, queue="q", name="x")
    s.run_pending(store, now=T0)
    with open(os.path.join(store.path, "control", "schedules", "x.json"), "wb") as fh:
        fh.write(planted)
    assert store.schedules() == []  # not believed
    wall.advance(5)
    s.run_pending(store, now=T0 + 5)  # declared again, from now (what it said before is lost)
    assert [i.name for i in store.schedules()] == ["x"]
    wall.advance(5)
    s.run_pending(store, now=T0 + 10)
    assert [j.id for j in store.jobs(state="pending")] == [f"tick-x-{T0 + 10}"]


def test_two_schedulers_that_disagree_about_one_name_say_so_at_each_pass(
        open_store: Callable[..., JobStore], caplog: pytest.LogCaptureFixture) -> None:
    store = open_store()
    a, b = Schedule(), Schedule()
    a.every(2, queue="a", name="x")
    b.every(3, queue="b", name="x")
    with caplog.at_level(logging.WARNING, "fsjobstore"):
        a.run_pending(store, now=T0)
        assert "was" not in caplog.text  # first declared: nothing to say
        b.run_pending(store, now=T0)
        a.run_pending(store, now=T0 + 2)
    assert "schedule x was every 2s into queue a; now every 3s into queue b" in caplog.text
    assert "schedule x was every 3s into queue b; now every 2s into queue a" in caplog.text
