"""Periodic jobs: schedules declared in code, whose ticks become jobs.

::

    from datetime import timedelta
    from fsjobstore.schedule import Schedule

    schedule = Schedule()
    schedule.every(timedelta(minutes=5), queue="digest", request={"kind": "hourly"})
    schedule.cron("0 3 * * *", tz="Europe/Paris", queue="reports", name="nightly")

A :class:`~fsjobstore.worker.Worker` runs its own (``worker.every(...)``, ``worker.cron(...)``)
between jobs; ``fsjobstore scheduler DIR --schedule myapp.jobs:schedule`` runs one apart. Run as
many as you like, on as many hosts: each tick is made once (:meth:`JobStore.make_tick`).

When ticks fall:

- ``every(interval, start=...)``: at ``start``, ``start + interval``, ... (``start`` defaults to
  the Unix epoch, so ``every(timedelta(hours=1))`` ticks on the hour, UTC, whoever runs it).
- ``cron(expr, tz=...)``: a five-field cron expression read by ``cronsim`` in the named zone
  (default UTC). A tick a DST change skips runs at the first minute after the gap; a daily tick
  in the repeated hour runs once; an hourly one runs in both hours (as cron does).
- A schedule makes no tick from before it was first declared in the store. A scheduler that was
  down, or a store nobody ran, misses ticks: a pass makes at most ``catch_up`` of the newest
  missed ones (default 1); ``catch_up=0`` skips every tick found more than :data:`LATE` seconds
  after its time.

A tick's job has the id ``tick-<schedule>-<epoch seconds>`` (:func:`tick_of` reads it back),
the schedule's ``request``, queue and job options. Which ticks were made is in the store:
``fsjobstore schedules DIR`` lists each schedule with its last and next tick.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Protocol

from . import InvalidRequest, JobStore, ScheduleInfo, check_queue_name, tick_of

__all__ = ["LATE", "Cron", "Every", "Periodic", "Schedule", "Timing", "tick_of", "timing_of"]

log = logging.getLogger("fsjobstore.schedule")

LATE = 60.0  # seconds after its time past which a tick is "missed" (what catch_up counts)
RETRY_AFTER = 5.0  # seconds before a schedule whose pass failed (a storage error) is tried again
LONGEST_SLEEP = 60.0  # a wall clock set forward is noticed within this
MAX_EPOCH = 99_999_999_999  # the store's bound on a time (the year 5138)


class Timing(Protocol):
    """When a schedule's ticks fall (epoch seconds)."""

    @property
    def spec(self) -> str:
        """The timing as the store keeps it (:func:`timing_of` reads it back)."""

    def ticks(self, after: float, upto: float, limit: int) -> list[int]:
        """The newest ``limit`` ticks in (``after``, ``upto``], oldest first."""

    def next_after(self, moment: float) -> int:
        """The first tick after ``moment``."""


@dataclass(frozen=True)
class Every:
    """Every ``seconds``, from ``start`` (epoch seconds)."""

    seconds: int
    start: int = 0

    @property
    def spec(self) -> str:
        return f"every {self.seconds}s" + (f" from {self.start}" if self.start else "")

    def ticks(self, after: float, upto: float, limit: int) -> list[int]:
        if upto < self.start:
            return []
        t = self.start + math.floor((upto - self.start) / self.seconds) * self.seconds
        out: list[int] = []
        while t > after and t >= self.start and len(out) < limit:
            out.append(t)
            t -= self.seconds
        return out[::-1]

    def next_after(self, moment: float) -> int:
        if moment < self.start:
            return self.start
        return self.start + (math.floor((moment - self.start) / self.seconds) + 1) * self.seconds


@dataclass(frozen=True)
class Cron:
    """A five-field cron expression in the time zone ``zone`` (an IANA name)."""

    expr: str
    zone: str = "UTC"

    @property
    def spec(self) -> str:
        return f"cron {self.expr} {self.zone}"

    def ticks(self, after: float, upto: float, limit: int) -> list[int]:
        out: list[int] = []
        # cronsim steps strictly before its start: one second past upto includes upto itself.
        for moment in _cronsim()(self.expr, self._at(math.floor(upto) + 1), reverse=True):
            t = int(moment.timestamp())
            if t <= after or len(out) >= limit:
                break
            out.append(t)
        return out[::-1]

    def next_after(self, moment: float) -> int:
        return int(next(_cronsim()(self.expr, self._at(moment))).timestamp())

    def _at(self, moment: float) -> datetime:
        return datetime.fromtimestamp(moment, _zone(self.zone))


def timing_of(spec: str) -> Timing:
    """The timing a spec string names (``"every 300s"``, ``"every 60s from 1767225600"``,
    ``"cron 0 3 * * * Europe/Paris"``): what ``fsjobstore schedules`` reads from the store."""
    words = spec.split()
    try:
        if words[0] == "every" and words[1].endswith("s") and len(words) in (2, 4):
            start = int(words[3]) if len(words) == 4 and words[2] == "from" else 0
            if len(words) == 4 and words[2] != "from":
                raise ValueError
            return Every(_seconds(int(words[1][:-1])), start)
        if words[0] == "cron" and len(words) == 7:
            return _checked_cron(" ".join(words[1:6]), words[6])
    except (IndexError, ValueError):
        pass
    raise InvalidRequest(f"{spec!r} is not a schedule spec (every <N>s [from <epoch>], or cron <5 fields> <zone>)")


@dataclass(frozen=True)
class Periodic:
    """One schedule: its name, when it ticks, and the job each tick makes."""

    name: str
    timing: Timing
    queue: str
    request: Any
    priority: int
    max_attempts: int | None
    timeout: float | None
    retain: float | timedelta | str | None
    catch_up: int

    @property
    def spec(self) -> str:
        return self.timing.spec

    def due(self, after: float, now: float) -> list[int]:
        """The ticks a pass at ``now`` makes when the newest made (or the declaration) is ``after``."""
        found = self.timing.ticks(after, now, max(self.catch_up, 1))
        return found if self.catch_up else [t for t in found if now - t <= LATE]


class Schedule:
    """A set of periodic jobs, run against a store by :meth:`run` (or :meth:`run_pending`)."""

    def __init__(self) -> None:
        self._periodics: dict[str, Periodic] = {}
        self._next: dict[str, float] = {}  # name -> when to look again (epoch seconds)
        self._lock = threading.Lock()

    def every(self, interval: timedelta | float, *, queue: str = "default", request: Any = None,
              name: str | None = None, start: datetime | float | None = None, catch_up: int = 1,
              priority: int = 0, max_attempts: int | None = None, timeout: float | None = None,
              retain: float | timedelta | str | None = None) -> Periodic:
        """Make a job in ``queue`` every ``interval`` (a timedelta, or seconds; whole seconds,
        at least one), ticking at ``start`` (an aware datetime or epoch seconds; default the
        epoch) plus whole intervals. ``name`` (default ``<queue>-every-<N>s``) is what the store
        knows the schedule by: keep it when you change the rest."""
        check_queue_name(queue)  # before the default name is made of it
        raw = interval.total_seconds() if isinstance(interval, timedelta) else interval
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw != int(raw):
            raise InvalidRequest(f"interval must be a whole number of seconds (a timedelta or a number), "
                                 f"got {interval!r}")
        timing = Every(_seconds(int(raw)), _epoch(start, "start") if start is not None else 0)
        return self._add(name or f"{queue}-every-{timing.seconds}s", timing, queue, request, catch_up, priority,
                         max_attempts, timeout, retain)

    def cron(self, expr: str, *, tz: str | tzinfo = "UTC", queue: str = "default", request: Any = None,
             name: str | None = None, catch_up: int = 1, priority: int = 0, max_attempts: int | None = None,
             timeout: float | None = None, retain: float | timedelta | str | None = None) -> Periodic:
        """Make a job in ``queue`` at each moment the five-field cron expression ``expr``
        names (``"0 3 * * *"``: 03:00 daily) in the time zone ``tz`` (an IANA name such as
        ``"Europe/Paris"``, or a ``zoneinfo.ZoneInfo``; default UTC). Needs the ``cron`` extra
        (``pip install 'fsjobstore[cron]'``). ``name`` defaults to ``<queue>-cron-<hash>``."""
        check_queue_name(queue)  # before the default name is made of it
        timing = _checked_cron(expr, _zone_name(tz))
        digest = hashlib.sha256(timing.spec.encode()).hexdigest()[:8]
        return self._add(name or f"{queue}-cron-{digest}", timing, queue, request, catch_up, priority,
                         max_attempts, timeout, retain)

    def _add(self, name: str, timing: Timing, queue: str, request: Any, catch_up: int, priority: int,
             max_attempts: int | None, timeout: float | None, retain: float | timedelta | str | None) -> Periodic:
        if len(name) > 64 and name.startswith(queue):  # a long queue name: the default is shortened
            name = f"{queue[:40]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        check_queue_name(name, "schedule name")
        if isinstance(catch_up, bool) or not isinstance(catch_up, int) or not 0 <= catch_up <= 1000:
            raise InvalidRequest(f"catch_up must be an integer from 0 to 1000 (missed ticks made at once), "
                                 f"got {catch_up!r}")
        periodic = Periodic(name, timing, check_queue_name(queue), request, priority, max_attempts, timeout,
                            retain, catch_up)
        with self._lock:
            if name in self._periodics:
                raise InvalidRequest(f"this Schedule has a schedule named {name!r} already; give each its own name=")
            self._periodics[name] = periodic
        return periodic

    def __iter__(self) -> Iterator[Periodic]:
        with self._lock:
            return iter(list(self._periodics.values()))

    def __len__(self) -> int:
        return len(self._periodics)

    def declare(self, store: JobStore) -> None:
        """Declare every schedule in ``store``, checking each one's job options by the store's
        rules: bad ones raise here (:class:`InvalidRequest`), before anything runs. :meth:`run`
        and a Worker's ``run()`` begin with it."""
        for p in self:
            try:
                self._declare(store, p)
            except InvalidRequest as exc:  # say which schedule: the store's message names only the option
                raise type(exc)(f"schedule {p.name!r}: {exc}") from None

    def _declare(self, store: JobStore, p: Periodic) -> ScheduleInfo:
        return store.declare_schedule(p.name, spec=p.spec, queue=p.queue, request=p.request, priority=p.priority,
                                      max_attempts=p.max_attempts, timeout=p.timeout, retain=p.retain)

    def run_pending(self, store: JobStore, *, now: float | None = None) -> float:
        """One pass: make every tick due in ``store`` now (each once, whoever else runs this
        schedule); returns the seconds until the next tick of any schedule. A schedule whose
        pass fails (a storage error, say) is logged and tried again :data:`RETRY_AFTER` later."""
        now = time.time() if now is None else now
        for p in self:
            if now < self._next.get(p.name, -math.inf):
                continue
            try:
                info = self._declare(store, p)
                after = info.last_tick if info.last_tick is not None else info.since
                for t in p.due(after, now):
                    job = store.make_tick(p.name, t, p.request, queue=p.queue, priority=p.priority,
                                          max_attempts=p.max_attempts, timeout=p.timeout, retain=p.retain)
                    if job is not None:
                        log.info("schedule %s: tick %s made job %s in %s", p.name, _show(t), job.id, p.queue)
                self._next[p.name] = p.timing.next_after(now)
            except Exception as exc:  # one schedule's failure must not stop the others, nor a worker
                log.warning("schedule %s: pass failed (%s: %s); trying again in %gs", p.name, type(exc).__name__,
                            exc, RETRY_AFTER, exc_info=log.isEnabledFor(logging.DEBUG))
                self._next[p.name] = now + RETRY_AFTER
        return max(0.0, min(self._next.values(), default=now + LONGEST_SLEEP) - now)

    def run(self, store: JobStore, *, stop: threading.Event | None = None) -> None:
        """Run passes until ``stop`` is set (forever without one)."""
        if not self._periodics:
            raise InvalidRequest("this Schedule has no periodic jobs: declare some with every() or cron()")
        stop = stop or threading.Event()
        self.declare(store)
        for p in self:
            log.info("schedule %s: %s into queue %s", p.name, p.spec, p.queue)
        while not stop.is_set():
            stop.wait(min(self.run_pending(store), LONGEST_SLEEP))
        log.info("scheduler stopped")


def _show(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(n: int) -> int:
    if not 1 <= n <= MAX_EPOCH:
        raise InvalidRequest(f"interval must be from 1 to {MAX_EPOCH} seconds, got {n}")
    return n


def _epoch(value: datetime | float, what: str) -> int:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidRequest(f"{what} {value} has no time zone, so it is ambiguous: give an aware datetime")
        value = value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_EPOCH:
        raise InvalidRequest(f"{what} must be an aware datetime or epoch seconds from 0 to {MAX_EPOCH}, got {value!r}")
    return int(value)


def _zone_name(tz: str | tzinfo) -> str:
    if tz is UTC:
        return "UTC"
    key = tz if isinstance(tz, str) else getattr(tz, "key", None)
    if not isinstance(key, str):
        raise InvalidRequest(f"tz must be a zone name such as 'Europe/Paris' (or a zoneinfo.ZoneInfo), got {tz!r}: "
                             "a fixed offset would move a schedule's ticks by an hour at each DST change")
    _zone(key)
    return key


def _zone(name: str) -> tzinfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequest(f"{name!r} is not a time zone this machine knows (an IANA name such as "
                             "'Europe/Paris' or 'UTC')") from None


def _cronsim() -> Any:
    try:
        from cronsim import CronSim
    except ImportError:
        raise ModuleNotFoundError("cron schedules need the cronsim package: pip install 'fsjobstore[cron]'",
                                  name="cronsim") from None
    return CronSim


def _checked_cron(expr: object, zone: str) -> Cron:
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise InvalidRequest(f"cron expression must be five fields (minute hour day month weekday), got {expr!r}")
    expr = " ".join(expr.split())
    sim = _cronsim()
    try:
        next(sim(expr, datetime.now(_zone(zone))))
    except StopIteration:
        raise InvalidRequest(f"cron expression {expr!r} never fires") from None
    except Exception as exc:  # cronsim's CronSimError (a bad field), or ValueError
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(f"cron expression {expr!r} is not valid: {exc}") from None
    return Cron(expr, zone)
