"""The store's operator side, a part of :class:`JobStore` (which inherits it): periodic ticks,
the workers' registry, counts and counters, and finding and removing jobs. Each method checks its
arguments, then delegates one layer down: ``_ticks``, ``_registry``, ``_stats``, ``_counters``,
``_listing``, ``_purge``. Apart from ``_store`` only so that neither module outgrows one sitting.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._core import _counters
from .._core import _worker_registry as registry
from .._core._control import Control
from .._core._core import Core
from .._core._counters import Counters, StoreCounters
from .._core._worker_registry import WorkerInfo
from .._errors import InvalidRequest
from .._format._checks import Duration, integer, number
from .._format._codec import check_queue_name
from .._format._job import Job, JobState
from .._relations import _ticks
from .._relations._ticks import MAX_TICK, ScheduleInfo, check_schedule_name, check_spec, tick_id
from .._transitions import _listing, _purge
from .._transitions._create import new_record, publish_new
from .._transitions._stats import DirCounts, StoreStatistics, statistics

if TYPE_CHECKING:
    from ._background import Heart


class Operating:
    """What :class:`JobStore` offers those who run a store (see its docstring for the rest)."""

    _core: Core
    _control: Control
    _counts: DirCounts
    _counters: Counters
    _heart: Heart
    _retain: float
    default_timeout: float | None

    def _check_open(self) -> None:
        raise NotImplementedError  # JobStore's

    # == periodic ticks (_ticks; which tick is due is fsjobstore.schedule's business) ==============
    def make_tick(self, schedule: str, at: int, request: Any = None, *, queue: str = "default", priority: int = 0,
                  max_attempts: int | None = None, timeout: Duration | None = None,
                  retain: Duration | None = None) -> Job | None:
        """Make the job (id ``tick-<schedule>-<at>``) of tick ``at`` (epoch seconds) of ``schedule``
        once, however many schedulers try, on any host; None if it or a later tick was made."""
        self._check_open()
        name, at = check_schedule_name(schedule), integer(at, "at (epoch seconds)", at_least=0, at_most=MAX_TICK)
        record = new_record(self._core, request, queue=queue, priority=priority, max_attempts=max_attempts,
                            job_id=tick_id(name, at), timeout=timeout, retain=retain,
                            default_timeout=self.default_timeout, default_retain=self._retain)
        def publish(still_due: Callable[[], bool]) -> Job:
            made = publish_new(self._core, record, explicit=True, still_due=still_due)
            assert isinstance(made, str)  # a tick has no unique key
            return record.snapshot(JobState(made))

        return _ticks.make(self._core, name, at, publish)

    def declare_schedule(self, schedule: str, *, spec: str, queue: str = "default", request: Any = None,
                         priority: int = 0, max_attempts: int | None = None, timeout: Duration | None = None,
                         retain: Duration | None = None) -> ScheduleInfo:
        """Say that ``schedule`` ticks by ``spec``, making jobs as :meth:`make_tick` is told (every
        option checked here); no tick before its first declaration is made. What the store knows."""
        self._check_open()
        name = check_schedule_name(schedule)
        new_record(self._core, request, queue=queue, priority=priority, max_attempts=max_attempts, job_id=None,
                   timeout=timeout, retain=retain, default_timeout=None, default_retain=0)
        return _ticks.declare(self._core, name, spec=check_spec(spec), queue=queue)

    def schedules(self) -> list[ScheduleInfo]:
        """Every schedule declared in this store, by name, with its newest tick."""
        self._check_open()
        return _ticks.read_all(self._core)

    # == workers =================================================================================
    def workers(self) -> list[WorkerInfo]:
        """The workers running on this directory (from any process or host), oldest first, as
        each last published itself; a worker whose process died or stopped beating is left out."""
        self._check_open()
        return registry.read_all(self._core)

    def publish_worker(self, info: Mapping[str, Any]) -> None:
        """Publish (or refresh) this process's entry in :meth:`workers` with ``info`` (JSON):
        what ``fsjobstore.Worker`` calls about once a second. The entry lives as long as this
        store's owner identity, and each call also beats it, so a worker loop that does not
        pull (a supervisor of worker processes) stays alive to others."""
        self._check_open()
        registry.publish(self._core, dict(info), on_owner_gone=self._heart.beat_once)

    def retract_worker(self) -> None:
        """Remove this process's entry from :meth:`workers` (a worker stopping cleanly)."""
        self._check_open()
        registry.retract(self._core)

    # == counts ====================================================================================
    def statistics(self) -> StoreStatistics:
        """A snapshot of the store's counts: jobs in each state, and per queue in each state
        (``by_queue``), final jobs with notifications waiting, quarantined files, the age of the
        oldest pending job (and per queue), and the paused queues. One listing of each directory
        (and a read of each running job's file, for its queue); cheap enough to call often."""
        self._check_open()
        core = self._core
        return statistics(core, self._control, self._counts, lambda name: _listing.queue_of_active(core, name))

    # == counters (_counters) =========================================================================
    def count(self, queue: str, what: str, duration: float | None = None) -> None:
        """Add one to ``queue``'s counter ``what`` (one of ``created``, ``fulfilled``, ``retried``,
        ``failed``, ``cancelled``, ``timed_out``, ``lost``, ``given_back``), and ``duration``
        (seconds an attempt ran) to its run-time histogram: what the worker runtime's hooks call
        for each attempt. Kept in memory and written about once a second (:meth:`counters`)."""
        self._check_open()
        if what not in _counters.NAMES:
            raise InvalidRequest(f"no counter {what!r}: use one of {', '.join(_counters.NAMES)}")
        if duration is not None:
            duration = number(duration, "duration (seconds)", at_least=0.0, below=1e9)
        self._counters.add(check_queue_name(queue), what, duration)

    def counters(self) -> StoreCounters:
        """Every process's counters on this directory, added up (what ``/metrics`` exports): per
        queue, jobs created, attempts by how they ended, run times; jobs fulfilled and failed per
        minute for the last three hours. What a process counted in its last second, or before a
        power cut, may be missing; they survive every process's restart (FORMAT.md, "Counters")."""
        self._check_open()
        self._counters.flush()  # this process's own counts too, however recent
        return _counters.read_counters(self._core.layout.metrics, self._core.tree.perms.file_mode,
                                       self._core.wall())

    # == finding and removing jobs (_listing, _purge) =============================================
    def jobs(self, *, state: str | JobState | None = None, queue: str | None = None, limit: int | None = 100,
             after: str | None = None) -> Iterator[Job]:
        """Snapshots of the jobs in ``state`` (None: all), a page at a time, read as iterated.

        Order: ``active`` by id, ``pending`` in run order (priority, then creation, across
        queues as claims take them), ``scheduled`` by due time, final states newest first
        (merged); None walks them in that order. ``queue``: that queue only. ``limit``: 1 ..
        10,000, or None. ``after``: the last id of the previous page; the page starts right after
        that job's place, from its record, so paging is stable while jobs come and go
        (:class:`JobNotFound` if it is gone; with ``state=None`` its phase is its current state).
        A snapshot holds the job file only (no ``waiting``, ``progress``, ``logs``: see
        :meth:`get`). A job that moves while listed is passed over, or shown in its new state if
        the walk reaches it later; none twice. Pending lists each queue's directory whole.
        """
        self._check_open()
        return _listing.jobs(self._core, state=state, queue=queue, limit=limit, after=after)

    def purge(self, *, states: str | JobState | Sequence[str | JobState] = ("fulfilled", "failed", "cancelled"),
              queue: str | None = None, older_than: Duration | None = None,
              match: str | re.Pattern[str] | None = None, limit: int | None = None, dry_run: bool = False,
              progress: Callable[[int], object] | None = None) -> int:
        """Remove the selected jobs with every file of each; returns how many this call removed.

        ``states``: any of pending, scheduled, fulfilled, failed, cancelled (default the final
        three; ``active`` is refused: cancel a running job first). ``older_than`` (a duration:
        ``"7d"``, seconds, a timedelta): finished (final) or created (waiting) that long ago. ``match``: a regex
        searched in the id and the request's stored JSON text. ``limit``: at most this many.
        ``dry_run``: count only. ``progress(done)``: called every ~0.25 s and at the end.
        A final job whose targets have not all heard is skipped (not counted); a waiting job
        goes with its targets, never notified. Claimed first by a worker: skipped. Concurrent
        purges remove each job once; a killed one is finished by recovery. A removed job never
        comes back; its id may be used again.
        """
        self._check_open()
        selection = _purge.check(self._core, states=states, queue=queue, older_than=older_than, match=match,
                                 limit=limit, dry_run=dry_run, progress=progress)
        return _purge.purge(self._core, selection)
