"""JobStore: the public face of a store, one class. Every method checks its arguments first (bad
input raises before anything changes), then calls one transition (``_transitions``) or feature
(``_relations``); what happens on disk is there. ``__init__`` makes the parts, each whole from those
made before it: the core (``_core._core.Core``), the hooks the features attach to the transitions'
named points (``_features``), the transitions, the background thread (``_background``) and the
blocking waits (``_waiting``). See docs/explanation/architecture.md for the map.

A facade may be long: the size rule of the house applies to modules of machinery, and this one's
length is its public methods'.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import re
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from .._core import _counters
from .._core import _worker_registry as registry
from .._core._control import Control
from .._core._core import Core, Settings
from .._core._counters import Counters, StoreCounters
from .._core._opening import open_skeleton
from .._core._quarantine import QuarantinedFile
from .._core._quarantine import read_all as read_quarantined
from .._core._worker_registry import WorkerInfo
from .._errors import CorruptJob, InvalidRequest, JobExists, JobNotFound, WaitTimeout
from .._format._job import Job, JobState
from .._format._layout import Layout
from .._format._records import Record
from .._format._values import (
    Duration,
    check_interest,
    check_job_id,
    check_queue_name,
    check_queues,
    check_timeout,
    default_backoff,
    integer,
    job_file_cap,
    lease_timing,
    matches,
    number,
    result_value,
    retain_seconds,
    seconds,
)
from .._os import _files as fs
from .._os import _syscalls as sc
from .._os._verify import locks_prove_death
from .._relations import _groups, _ticks
from .._relations import _limits as lim
from .._relations._groups import Group
from .._relations._subscriptions import Subscription, Subscriptions
from .._relations._ticks import MAX_TICK, ScheduleInfo, check_schedule_name, check_spec, tick_id
from .._transitions import _listing, _purge
from .._transitions._by_id import ById
from .._transitions._create import new_record, publish_new
from .._transitions._leases import NotificationLease, OnCompromised, WorkLease
from .._transitions._listing import MAX_LIMIT, notified
from .._transitions._notify import Notifier
from .._transitions._recovery import RecoveryReport, recover
from .._transitions._retention import index_strays
from .._transitions._stats import DirCounts, StoreStatistics, statistics
from .._transitions._work import Work
from ._background import Background
from ._features import attach
from ._read_only import read_only_class
from ._waiting import Waiting, Wakeups

log = logging.getLogger("fsjobstore")

_LIVE_STORES: weakref.WeakSet[JobStore] = weakref.WeakSet()

# What a member of a group may say: create()'s options, less the two that name one job alone.
_MEMBER_OPTIONS = frozenset({"request", "queue", "priority", "delay", "run_at", "max_attempts", "timeout", "retain",
                             "after", "on_parent_failure", "concurrency_key"})





class JobStore:
    """A job store in one directory, shared by any number of threads and processes.

    Every length of time it takes (a lease, a heartbeat, a poll interval, a time limit, a
    delay, a retention, a purge's age) is seconds, a ``timedelta``, or text as the command line
    takes it: ``"90s"``, ``"15m"``, ``"1h30m"``, ``"7d"``, ``"2w"`` (:func:`parse_duration`). A
    call's own wait (``timeout=`` of ``pull_work``, ``wait``) is seconds, as in ``queue.Queue``.

    :param path: the store's directory. A store is made there if the directory is missing or
        empty (and ``create`` is true); a directory holding anything else and no store is
        refused (:class:`StoreNotFound`). Relative paths are resolved once.
    :param create: False to open only an existing store (what read-only tools should do).
    :param read_only: a reader that never changes anything in the store: no directory, temp,
        owner or heartbeat file is made, no bad file is quarantined, no planted directory
        replaced, no count cached, nothing recovered or removed. Reads (``get``, ``jobs``,
        ``statistics``, ``wait``, ...) skip what they cannot read (``get`` of an unreadable job
        raises :class:`CorruptJob`); every call that would change the store raises
        :class:`StorageError` (EROFS) naming it. Implies ``create=False``. A store that needs a
        repair or an upgrade at open is refused (open it writable once).
    :param durable: fsync files and directories before acknowledging (see FORMAT.md). It is
        recorded when the store is made (default True) and belongs to the store: None (the
        default) follows the store, True is always allowed, and False is refused on a durable
        store, so one process cannot weaken what the others promise. With False, every
        operation is still atomic under process crashes, but a power loss may undo recent
        acknowledged operations.
    :param group: share the store with the members of this Unix group (a name or a gid): its
        directories are made setgid and group-writable, its files group-readable and -writable,
        and directories made by other members are trusted. Only when the store is made; later
        opens may repeat it or leave it out. Without it a store belongs to the user who made it.
    :param lease_duration: seconds without a heartbeat after which another process may take a
        hung holder's job. A dead holder's jobs are taken at once, whatever this says. At least
        0.5 s: a holder calls itself stalled 0.75 lease after its last beat landed, and a shorter
        lease leaves too little room for one slow write.
    :param heartbeat_interval: seconds between heartbeats (default ``lease_duration / 4``; from
        0.01 s to ``lease_duration / 2``).
    :param max_attempts: default for jobs that do not set their own.
    :param default_timeout: seconds one attempt of a job may run, for jobs created here that do
        not set their own ``timeout`` (None: no limit).
    :param backoff: ``attempt -> seconds`` before a failed job (or notification) is retried.
    :param poll_interval: longest a waiting puller sleeps before rescanning, whether or not
        inotify said anything (it cannot see other hosts, and it can overflow).
    :param lock_takeover: whether a free ``flock`` proves a holder dead, so its jobs are taken at
        once. None (the default) trusts locks on local filesystems and not on network ones
        (NFS, CIFS, FUSE, ...), where they may not reach other hosts; untrusted, a holder is
        replaced only after ``lease_duration`` without heartbeats. ``fsjobstore verify`` checks.
    :param doorbell: wake waiting pullers when another *host* makes work due, by a directory
        they list every 25 ms (inotify sees only this host). None (the default) turns it on for
        network filesystems only. See FORMAT.md, "Doorbell".
    :param retain: how long the jobs this process creates are kept once final, before
        retention removes them with every file of theirs: a duration (``"7d"``, seconds, a
        ``timedelta``; 0 removes a job as soon as it is final and its targets have heard) or
        ``"forever"``.
        None (the default) follows the store's default, recorded when it is made: a new store
        records the ``retain`` it is made with (7 days if None). See the guide "Operating a store
        for months", "Retention".
    :param clock: monotonic seconds, for leases and timeouts (injectable for tests).
    :param wall_clock: epoch seconds, for ``run_at``/``delay`` and timestamps.
    """

    def __new__(cls, *args: Any, read_only: bool = False, **kwargs: Any) -> JobStore:
        # A reader is of its own class (_read_only): its methods are the reader's from the start.
        return object.__new__(_ReaderJobStore if read_only is True and cls is JobStore else cls)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        read_only: bool = False,
        durable: bool | None = None,
        group: str | int | None = None,
        lease_duration: Duration = 30.0,
        heartbeat_interval: Duration | None = None,
        max_attempts: int = 3,
        default_timeout: Duration | None = None,
        backoff: Callable[[int], float] = default_backoff,
        max_value_bytes: int = 16 * 1024 * 1024,
        max_request_bytes: int = 1024 * 1024,
        poll_interval: Duration = 1.0,
        watch: bool = True,
        lock_takeover: bool | None = None,
        doorbell: bool | None = None,
        retain: Duration | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        lease, heartbeat = lease_timing(lease_duration, heartbeat_interval)
        max_attempts = integer(max_attempts, "max_attempts", at_least=1, at_most=1_000_000)
        max_value_bytes = integer(max_value_bytes, "max_value_bytes", at_least=1)
        max_request_bytes = integer(max_request_bytes, "max_request_bytes", at_least=1)
        poll_interval = seconds(poll_interval, "poll_interval (seconds)", at_least=0.001, below=1e9)
        self.default_timeout = check_timeout(default_timeout, "default_timeout")
        if durable is not None and not isinstance(durable, bool):
            raise InvalidRequest(f"durable must be True, False or None, got {durable!r}")
        try:
            raw = os.fspath(path)
        except TypeError:
            raise InvalidRequest(f"the store path must be a str or os.PathLike (a directory), got {path!r}") from None
        if isinstance(raw, bytes):
            raise InvalidRequest(f"the store path must be a str, not bytes: got {raw!r}")
        if not raw.strip():
            raise InvalidRequest(f"the store path must be a non-empty string, got {raw!r}")
        # The caller chose this path, so a symlink to the store is resolved once; inside the
        # store, symlinked directories are refused (see _fsops.check_trusted).
        self.path = os.path.realpath(os.path.abspath(raw))
        layout = Layout(self.path)
        own_retain = retain_seconds(retain)
        if not isinstance(read_only, bool):
            raise InvalidRequest(f"read_only must be True or False, got {read_only!r}")
        if not isinstance(create, bool):
            raise InvalidRequest(f"create must be True or False, got {create!r}")
        self.read_only = read_only
        config = open_skeleton(layout, durable=durable, group=group, create=create and not read_only,
                               retain=own_retain, read_only=read_only)
        self._retain = config.retain if own_retain is None else own_retain
        # Ends the root's attachment (_syscalls.attach, made by open_skeleton) at close, or when
        # a store that was never closed is collected: at most once either way.
        self._detach = weakref.finalize(self, sc.detach, self.path)
        durable = config.durable if durable is None else durable
        local = locks_prove_death(self.path)  # a local filesystem: locks reach every process, inotify too
        settings = Settings(
            path=self.path, durable=durable, store_durable=config.durable, lease_duration=lease,
            heartbeat_interval=float(heartbeat), max_attempts=max_attempts, backoff=backoff,
            max_value_bytes=max_value_bytes, max_request_bytes=max_request_bytes,
            poll_interval=poll_interval, watch=watch, local=local,
            lock_takeover=local if lock_takeover is None else lock_takeover,
            doorbell=not local if doorbell is None else doorbell,
            clock=clock, wall=wall_clock,
        )
        # The parts, each made whole from those made before it. Two calls go back up, each handed
        # in as a method of this store: a Core that made an owner identity starts the heartbeat
        # (_owner_made), and a parent that did not end fulfilled cancels its children by id
        # (_cancel_child).
        self._core = core = Core(settings, layout, perms=config.perms,
                                 record_cap=job_file_cap(max_value_bytes, max_request_bytes),
                                 default_retain=config.retain, on_new_owner=self._owner_made)
        self._control = Control(core)
        self._counts = DirCounts(core.layout.control, core.tree.perms.file_mode)  # statistics() per bucket
        self._counters = Counters(core.layout.metrics, lambda: core.tree.ensure_dir(core.layout.metrics),
                                  core.tree.perms.file_mode, wall_clock)
        self._hooks, self._gate = attach(core, self._counters, self._cancel_child)
        self._notifier = Notifier(core, self._hooks)
        self._work = Work(core, self._notifier, self._control, self._hooks)
        self._direct = ById(core, self._work, self._notifier, self._control, self._hooks)
        self._subscriptions = Subscriptions(core.layout, core.clock)
        self._background = Background(core, self._hooks, self._work, self._notifier, self._control)
        self._waiting = Waiting(core, self._background)
        self.group: int | None = config.perms.gid
        """The gid of the group that shares this store, or None for a private store."""
        _LIVE_STORES.add(self)

    # == settings, read-only ========================================================================
    @property
    def durable(self) -> bool:
        """Whether operations are fsynced before they are acknowledged."""
        return self._core.settings.durable

    @property
    def lease_duration(self) -> float:
        return self._core.settings.lease_duration

    @property
    def heartbeat_interval(self) -> float:
        return self._core.settings.heartbeat_interval

    @property
    def retain(self) -> float:
        """Seconds the jobs this process creates are kept once final by default (``math.inf``:
        forever): its own ``retain=``, else the store's recorded default."""
        return self._retain

    @property
    def max_attempts(self) -> int:
        return self._core.settings.max_attempts

    @property
    def max_value_bytes(self) -> int:
        return self._core.settings.max_value_bytes

    @property
    def max_request_bytes(self) -> int:
        return self._core.settings.max_request_bytes

    @property
    def poll_interval(self) -> float:
        return self._core.settings.poll_interval

    @property
    def lock_takeover(self) -> bool:
        """Whether a free flock proves a holder dead here (see the class docstring)."""
        return self._core.settings.lock_takeover

    def _owner_made(self) -> None:
        self._background.keep_beating()

    def _cancel_child(self, job_id: str, reason: str) -> object:
        return self._direct.cancel(job_id, reason)

    def _check_open(self) -> None:
        self._core.check_open()
        if self._core.forked():
            self._after_fork()

    def _after_fork(self) -> None:
        """A forked child must not reuse the parent's owner lock, claims or threads."""
        self._core.after_fork()
        self._counters.after_fork()
        self._work.after_fork()
        self._notifier.after_fork()
        self._background.after_fork()

    # == creating ==================================================================================
    def create(self, request: Any, *, queue: str = "default", priority: int = 0, delay: Duration | None = None,
               run_at: float | datetime | None = None, max_attempts: int | None = None, job_id: str | None = None,
               timeout: Duration | None = None, retain: Duration | None = None,
               unique_key: str | None = None, after: Sequence[str] | None = None,
               on_parent_failure: str = "cancel", concurrency_key: str | None = None) -> Job:
        """Store a new job and return its snapshot once it is durable.

        ``priority``: lower runs sooner (-999,999 .. 999,999); equal priorities run in creation
        order. ``delay`` (a duration) or ``run_at`` (epoch seconds or an aware
        datetime) holds the job back until then. ``job_id`` lets the caller choose the id; using
        an id twice raises :class:`JobExists`, so it doubles as an idempotency key.
        ``timeout``: how long one attempt may run (default: the store's ``default_timeout``);
        the worker runtime stops an attempt that overruns it, counted as a failed attempt, and
        any process takes the job over once it overran by a further ``lease_duration``.
        ``retain``: how long the job is kept once final (a duration, or ``"forever"``;
        0: removed as soon as it is final and its targets have heard); default: the store's
        ``retain``. A removed job's id may be used again. ``unique_key``: while a job with this
        key is not final, a create with it makes nothing and returns that job (compare ids);
        once it is final, the key may be used again. ``after``: ids of jobs this one waits for
        (``deferred`` until they are all final): it runs once they are all fulfilled; if one
        fails, is cancelled or is removed first, it is cancelled saying why, unless
        ``on_parent_failure="run"``. Each must exist (:class:`JobNotFound`).
        ``concurrency_key``: jobs sharing it run at most the key's limit at once (one, unless
        :meth:`set_limit` says otherwise), across every process on the directory; the others
        wait in order, and show as ``pending``.
        """
        self._check_open()
        subs = self._subscriptions.matching(check_queue_name(queue))
        if subs:
            return self._fan_out(subs, request, dict(
                queue=queue, priority=priority, delay=delay, run_at=run_at, max_attempts=max_attempts, job_id=job_id,
                timeout=timeout, retain=retain, default_timeout=self.default_timeout, default_retain=self._retain,
                unique_key=unique_key, after=after, on_parent_failure=on_parent_failure,
                concurrency_key=concurrency_key))
        record = new_record(self._core, request, queue=queue, priority=priority, delay=delay, run_at=run_at,
                            max_attempts=max_attempts, job_id=job_id, timeout=timeout, retain=retain,
                            default_timeout=self.default_timeout, default_retain=self._retain,
                            unique_key=unique_key, after=after, on_parent_failure=on_parent_failure,
                            concurrency_key=concurrency_key)
        made = publish_new(self._core, self._hooks, record, explicit=job_id is not None)
        if isinstance(made, Job):
            return made  # the job that holds the unique key
        self._count_created(record.queue)
        if made == "deferred":  # its parents may have ended meanwhile: it may have moved on already
            return self.get(record.id)
        return record.snapshot(JobState(made))

    def _count_created(self, queue: str) -> None:
        self._counters.add(queue, "created")

    # == claiming work =============================================================================
    def pull_work(self, *, queues: str | Sequence[str] | None = None, timeout: float | None = 0,
                  on_compromised: OnCompromised | None = None) -> WorkLease | None:
        """Lease one due job, or return None.

        ``queues``: a name or a list in priority order (all queues when None); a pattern (``order-*``)
        stands for every queue it matches, the most urgent job of them first. ``timeout``: 0
        never waits; a positive number waits up to that many seconds; None waits forever.
        ``on_compromised`` is installed before the lease is visible, so no loss is missed.
        """
        self._check_open()
        names = check_queues(queues)
        return self._waiting.pull(lambda: self._work.claim(names, on_compromised), timeout)

    # == resolving by id ===========================================================================
    def fulfill(self, job_id: str, value: Any) -> None:
        """Fulfil a job without holding its lease (for jobs resolved elsewhere).

        Raises :class:`InvalidState` if a live worker holds it or it is already final, and
        :class:`JobNotFound` for an unknown id. A job held by a dead or hung worker is taken
        over first.
        """
        self._check_open()
        check_job_id(job_id)
        self._direct.fulfill(job_id, result_value(value, self.max_value_bytes))

    def fail(self, job_id: str, error: BaseException | str) -> None:
        """Fail a job for good without holding its lease (for jobs whose work failed elsewhere):
        it ends ``failed`` with ``error`` (an exception is kept as its type and message), counted
        as a failed attempt, with no retry. Raises as :meth:`fulfill` does."""
        self._check_open()
        check_job_id(job_id)
        if not isinstance(error, (str, BaseException)):
            raise InvalidRequest(f"error must be a str or an exception, not {type(error).__name__}")
        self._direct.fail(job_id, error if isinstance(error, str) else f"{type(error).__name__}: {error}")

    def get(self, job_id: str) -> Job:
        """A snapshot of the job (state, request, value or error, attempts, waiting targets)."""
        self._check_open()
        check_job_id(job_id)
        return self._direct.snapshot(job_id)

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is final (fulfilled, failed or cancelled) and return its snapshot;
        ``wait(job_id).result()`` gives its value or raises. Raises :class:`WaitTimeout` after
        ``timeout`` seconds (None: wait forever), :class:`JobNotFound` for an unknown id.
        Woken by inotify when the result lands, with a rescan every ``poll_interval``."""
        self._check_open()
        check_job_id(job_id)
        if not self._waiting.wait_final(job_id, timeout):
            raise WaitTimeout(f"job {job_id} was not final after {timeout} s")
        return self.get(job_id)

    # == control =================================================================================
    def cancel(self, job_id: str, reason: str | None = None) -> Job:
        """Cancel a job. A pending or scheduled job becomes ``cancelled`` at once; a running one
        is asked to stop (its lease's ``cancel_requested`` turns true, ``on_cancel`` fires, the
        worker runtime aborts the handler) and ends ``cancelled`` whatever its holder commits
        after the request is made (a commit that had already looked for one, just before it writes
        its result, keeps its outcome, even if this returned the job ``active``).
        Notifications are delivered as for any final state. Returns the job's snapshot: state
        ``cancelled``, or ``active`` with ``cancel_requested`` set. :class:`InvalidState` for a job
        that has ended, or that its holder's commit ended as the request was made (it keeps that)."""
        self._check_open()
        check_job_id(job_id)
        if reason is not None and not isinstance(reason, str):
            raise InvalidRequest(f"reason must be a str or None, not {type(reason).__name__}")
        return self._direct.cancel(job_id, reason)

    def retry(self, job_id: str) -> Job:
        """Give a ``failed`` or ``cancelled`` job a new life: back to pending, with its whole
        attempt budget again. Its earlier outcome stays readable in ``Job.history``. Raises
        :class:`InvalidState` for a job in any other state."""
        self._check_open()
        check_job_id(job_id)
        return self._direct.retry(job_id)

    def cancel_requested(self, job_id: str) -> bool:
        """Whether a cancel was asked for this job and not yet honoured (cheap: one stat)."""
        self._check_open()
        return self._control.cancel_requested(check_job_id(job_id))

    def pause(self, queue: str) -> bool:
        """Stop every worker on this directory from taking jobs of ``queue`` (running ones go on;
        the queue keeps accepting jobs). Persisted in the store. False if it was paused already."""
        self._check_open()
        return self._control.pause(check_queue_name(queue))

    def resume(self, queue: str) -> bool:
        """Undo :meth:`pause`; False if the queue was not paused."""
        self._check_open()
        return self._control.resume(check_queue_name(queue))

    def paused(self) -> frozenset[str]:
        """The queues that are paused."""
        self._check_open()
        return self._control.paused()

    # == notifications =============================================================================
    def queue(self, job_id: str, target: Any) -> None:
        """Ask for the job's result to be delivered to ``target`` (any JSON value) once final.

        Queueing the same target twice has no further effect. If the job is already final the
        notification is available at once.
        """
        self._check_open()
        self._notifier.queue(check_job_id(job_id), target)

    def unqueue(self, job_id: str, target: Any) -> bool:
        """Stop waiting to notify ``target``; True if it was waiting. A notifier already
        delivering it may still do so."""
        return self.unqueue_all(job_id, [target]) == 1

    def unqueue_all(self, job_id: str, targets: Iterable[Any]) -> int:
        """Batch :meth:`unqueue`; returns how many of ``targets`` were waiting."""
        self._check_open()
        return self._notifier.unqueue_all(check_job_id(job_id), targets)

    def pull_notification(self, *, queues: str | Sequence[str] | None = None, timeout: float | None = 0,
                          on_compromised: OnCompromised | None = None) -> NotificationLease | None:
        """Lease one final job whose result is waiting to be delivered, or return None.

        ``queues``: only jobs of these queues (names, or patterns such as ``order-*``; all queues
        when None), the most overdue first. ``timeout`` as for :meth:`pull_work`."""
        self._check_open()
        names = check_queues(queues)
        return self._waiting.pull(lambda: self._notifier.claim(names, on_compromised), timeout)

    def notifications(self, *, queues: str | Sequence[str] | None = None) -> list[Job]:
        """Snapshots (as :meth:`get` makes them) of the final jobs whose targets wait for a
        notifier, the soonest due first: ``delivery_due_at`` says when each is next due, and
        ``delivery_attempts`` / ``delivery_error`` why one waits for a backoff. ``queues`` as
        for :meth:`pull_notification`. It reads every waiting job: an operator's call."""
        self._check_open()
        names = check_queues(queues)
        found = []
        for job_id in notified(self._core):
            try:
                job = self.get(job_id)
            except (JobNotFound, CorruptJob):  # delivered and gone, or moved aside, meanwhile
                continue
            wanted = names is None or any(matches(n, job.queue) for n in names)
            if wanted and job.waiting and job.delivery_due_at is not None:
                found.append(job)
        return sorted(found, key=lambda j: (j.delivery_due_at, j.id))

    def wakeups(self, kind: str = "work") -> Wakeups:
        """What an event loop waits on instead of a blocked thread (``fsjobstore.aio`` uses it):
        ``"work"`` (for pulls of work and notifications) or ``"done"`` (jobs became final). Close it."""
        self._check_open()
        return Wakeups(self._core, kind)

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
            made = publish_new(self._core, self._hooks, record, explicit=True, still_due=still_due)
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

    def quarantined(self, *, limit: int | None = None) -> list[QuarantinedFile]:
        """The files the store moved aside as unusable (``quarantine/``: bad JSON, a planted
        link or FIFO, an unrecognised name), oldest first, each with where it was, why, and
        when; the first ``limit`` (1 .. 10,000, or None: all). Nothing is ever removed from there
        by the store: look, keep what matters, then delete the directory's contents by hand."""
        self._check_open()
        cap = None if limit is None else integer(limit, "limit (or None)", at_least=1, at_most=MAX_LIMIT)
        return read_quarantined(self._core.layout, cap)

    def publish_worker(self, info: Mapping[str, Any]) -> None:
        """Publish (or refresh) this process's entry in :meth:`workers` with ``info`` (JSON):
        what ``fsjobstore.Worker`` calls about once a second. The entry lives as long as this
        store's owner identity, and each call also beats it, so a worker loop that does not
        pull (a supervisor of worker processes) stays alive to others."""
        self._check_open()
        registry.publish(self._core, dict(info), on_owner_gone=self._background.beat_once)

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
        (seconds an attempt ran) to its run-time histogram. The store counts what its own calls
        do (creates, and every attempt or job a commit, release, time-out, take-over or call by
        id ends); this adds counts of your own. Kept in memory and written about once a second
        (:meth:`counters`)."""
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
        return _purge.purge(self._core, self._hooks, selection)

    # == groups ======================================================================================
    def create_group(self, jobs: Sequence[Mapping[str, Any]], *, group_id: str | None = None) -> Group:
        """Make several jobs at once, all or none: each item is a dict of :meth:`create`'s
        options (``request`` required; not ``job_id`` or ``unique_key``: members get generated
        ids, and ``group_id``, an id of your choosing, makes the group an idempotent unit:
        :class:`JobExists` the second time). ``after`` may name jobs that exist, or earlier
        members by their index in ``jobs``. Returns the group, its members in order."""
        self._check_open()
        core = self._core
        if isinstance(jobs, Mapping | str | bytes) or not isinstance(jobs, Sequence):
            raise InvalidRequest("jobs must be a list of dicts of create()'s options")
        _groups.check_size(len(jobs))
        gid = _groups.new_group_id(core, group_id)
        records: list[Record] = []
        for i, spec in enumerate(jobs):
            try:
                records.append(self._member(gid, i, spec, records))
            except InvalidRequest as exc:  # each of a member's problems names the member
                if not str(exc).startswith(f"jobs[{i}]"):
                    raise type(exc)(f"jobs[{i}]: {exc}") from None
                raise
        inside = {r.id for r in records}
        for i, record in enumerate(records):
            for parent in record.after:
                if parent not in inside and core.tree.locate(parent) is None:
                    raise JobNotFound(f"jobs[{i}]: after names no job {parent!r} in {core.layout.root}")
        _groups.make(core, gid, records, self._publish_member)
        for record in records:
            self._count_created(record.queue)
        return self.get_group(gid)

    def _member(self, gid: str, i: int, spec: object, earlier: list[Record]) -> Record:
        if not isinstance(spec, Mapping):
            raise InvalidRequest(f"jobs[{i}] must be a dict of create()'s options, got {type(spec).__name__}")
        unknown = sorted(set(spec) - _MEMBER_OPTIONS)
        if unknown:
            raise InvalidRequest(f"jobs[{i}]: {', '.join(map(repr, unknown))} cannot be given to a member of a group "
                                 f"(it may have {', '.join(sorted(_MEMBER_OPTIONS))})")
        if "request" not in spec:
            raise InvalidRequest(f"jobs[{i}] has no request")
        options = dict(spec)
        after = options.pop("after", None)
        if after is not None:
            if isinstance(after, str) or not isinstance(after, Sequence):
                raise InvalidRequest(f"jobs[{i}]: after must be a list of job ids or of earlier members' indexes")
            after = [self._parent(i, p, earlier) for p in after]
        request = options.pop("request")
        record = new_record(self._core, request, job_id=None, after=after, default_timeout=self.default_timeout,
                            default_retain=self._retain, **{"queue": "default", "priority": 0, "max_attempts": None,
                                                            "timeout": None, "retain": None, **options})
        return dataclasses.replace(record, group=gid)

    @staticmethod
    def _parent(i: int, parent: object, earlier: list[Record]) -> object:
        if isinstance(parent, bool):
            raise InvalidRequest(f"jobs[{i}]: after holds {parent!r}, neither a job id nor a member's index")
        if isinstance(parent, int):
            if not 0 <= parent < i:
                earlier_ones = "the first member can name none" if i == 0 else f"0 to {i - 1}"
                raise InvalidRequest(f"jobs[{i}]: after may name earlier members only ({earlier_ones}), got {parent}")
            return earlier[parent].id
        return parent

    def _publish_member(self, record: Record) -> None:
        # Reserved as a chosen id is, so a member is published once; JobExists: published
        # already (a recoverer finishing the group while we were slow).
        with contextlib.suppress(JobExists):
            publish_new(self._core, self._hooks, record, explicit=True, member=True)

    def _fan_out(self, subs: list[Subscription], request: Any, options: dict[str, Any]) -> Job:
        """``create`` into a queue that subscriptions fan out: a copy for each, in its queue, all or
        none (a group); returns the first copy (``Job.group`` names the rest)."""
        queue = options.pop("queue")
        if options.get("job_id") is not None or options.get("unique_key") is not None:
            raise InvalidRequest(f"queue {queue!r} is fanned out to subscription(s) {', '.join(s.name for s in subs)}: "
                                 "its copies get generated ids, so job_id and unique_key cannot be given")
        options.pop("job_id", None)
        options.pop("unique_key", None)
        core = self._core
        gid = _groups.new_group_id(core, None)
        records = [dataclasses.replace(new_record(core, request, queue=sub.name, job_id=None, **options),
                                       group=gid, topic=queue) for sub in subs]
        for parent in records[0].after:
            if core.tree.locate(parent) is None:
                raise JobNotFound(f"after names no job {parent!r} in {core.layout.root}")
        _groups.make(core, gid, records, self._publish_member)
        for record in records:
            self._count_created(record.queue)
        return self.get(records[0].id)

    # == subscriptions ============================================================================
    def subscribe(self, name: str, pattern: str) -> Subscription:
        """Give the subscription ``name`` its own copy of every job created from now on into a
        queue ``pattern`` matches (a queue name, or a glob: ``order-*``), whether or not anything
        works on it then: the copy is a job of its own in the queue ``name`` (work it as any
        queue), with its own lease, attempts and result; ``Job.topic`` says where it was created.
        Such a create makes one copy per matching subscription, all or none, and no job in the
        queue it named. Declared again, its pattern is replaced. Applies to every process's
        creates within a second."""
        self._check_open()
        name = check_queue_name(name, "a subscription's name")
        pattern = check_interest(pattern, "a subscription's pattern")
        core = self._core
        sub = Subscription(name, pattern, core.wall())
        before = self._subscriptions.all()
        others = [s for s in before if s.name != name]
        replacing = len(others) < len(before)  # only its pattern changes: its queue was one already
        self._subscriptions.write(sub, token=core.new_token(), durable=core.durable, perms=core.tree.perms,
                                  ensure_dir=core.tree.ensure_dir)
        # Legal, and most likely a slip: a copy is never copied again, and a
        # create into a subscription's own queue stays there.
        if deaf := [s.name for s in others if matches(pattern, s.name)]:
            log.warning("subscription %s: its pattern %s matches the queue of subscription %s, whose jobs are "
                        "never copied; it gets nothing from there", name, pattern, ", ".join(deaf))
        if not replacing and (took := [s.name for s in others if matches(s.pattern, name)]):
            log.warning("subscription %s: jobs created into queue %s were copied to %s; as a subscription's "
                        "own queue, they now stay in it", name, name, ", ".join(took))
        return sub

    def unsubscribe(self, name: str) -> bool:
        """Stop copying jobs for subscription ``name`` (copies made stay in its queue); False if
        there was none."""
        self._check_open()
        return self._subscriptions.remove(check_queue_name(name, "a subscription's name"), durable=self._core.durable)

    def subscriptions(self) -> list[Subscription]:
        """Every subscription, by name."""
        self._check_open()
        return self._subscriptions.all()

    def get_group(self, group_id: str) -> Group:
        """A group's members, as they are now (:class:`JobNotFound` for an unknown group; a
        member removed by retention is left out)."""
        self._check_open()
        jobs = []
        for record in _groups.read(self._core, group_id):
            try:
                jobs.append(self.get(record.id))
            except JobNotFound:
                continue
        return Group(group_id, tuple(jobs))

    def wait_group(self, group_id: str, timeout: float | None = None) -> Group:
        """Block until every member of the group is final, and return it; :class:`WaitTimeout`
        after ``timeout`` seconds (None: wait forever)."""
        self._check_open()
        if timeout is not None:  # checked as wait() checks it: a negative or NaN one is a mistake
            timeout = number(timeout, "timeout (seconds, or None)", at_least=0)
        deadline = None if timeout is None else time.monotonic() + timeout
        # One ear for the whole wait, not one per member: ringers look for ears once a second.
        ear = self._core.doorbell.listener(("done",)) if self._core.doorbell.enabled else None
        try:
            for record in _groups.read(self._core, group_id):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    self.wait(record.id, left)
                except JobNotFound:
                    continue  # removed by retention: it was final
                except WaitTimeout:
                    raise WaitTimeout(f"group {group_id} was not all final after {timeout} s") from None
        finally:
            if ear is not None:
                ear.close()
        return self.get_group(group_id)

    # == limits ===================================================================================
    def set_limit(self, *, key: str | None = None, queue: str | None = None, concurrency: int | None = None,
                  rate: tuple[int, float] | str | None = None) -> lim.Limit:
        """Declare (or replace) the limit of a concurrency key (``key=``: the jobs made with
        ``concurrency_key=key``) or of a queue (``queue=``), for every process on the directory:
        at most ``concurrency`` of its jobs run at once, and at most ``rate`` of them start in any
        period (``(10, 60.0)`` or ``"10/m"``: ten a minute; units s, m, h, d). The others wait, in
        their order. A key nobody declared runs one job at a time. Takes effect within a second
        (each process reads declarations at most once a second). A declaration replaces the
        previous one whole: give both ``concurrency`` and ``rate`` to keep both. Lowering a
        limit stops no running job; new ones wait until the running ones fit under it. Returns
        the limit with what runs and waits under it now, as :meth:`limits` shows it."""
        self._check_open()
        kind, name = lim.check_target(key, queue)
        limit = lim.Limit(kind, name, lim.check_concurrency(concurrency), lim.parse_rate(rate))
        if limit.concurrency is None and limit.rate is None:
            raise InvalidRequest("give concurrency= or rate= (or both); to remove a limit, use clear_limit()")
        core = self._core
        lim.write_declaration(core.layout, limit, token=core.new_token(), durable=core.durable,
                              perms=core.tree.perms, ensure_dir=core.tree.ensure_dir)
        self._gate.declarations.forget()
        self._gate.limit_changed(limit)
        return next((found for found in self._gate.overview() if found.id == limit.id), limit)

    def clear_limit(self, *, key: str | None = None, queue: str | None = None) -> bool:
        """Remove a declared limit (a key then runs one job at a time again; a queue, without a
        limit); False if none was declared."""
        self._check_open()
        kind, name = lim.check_target(key, queue)
        core = self._core
        limit_id = lim.limit_name(kind, name)
        found = fs.unlink(core.layout.limit_decl(limit_id))
        lim.remove_files(core.layout, limit_id)
        self._gate.declarations.forget()
        self._gate.limit_changed(lim.Limit(kind, name, 1 if kind == "key" else None, None))
        return found

    def limits(self) -> list[lim.Limit]:
        """Every declared limit, and every concurrency key with jobs waiting for it, with its
        slots held now (``running``) and the jobs waiting for it (``waiting``)."""
        self._check_open()
        return self._gate.overview()

    # == maintenance ===============================================================================
    def recover(self, *, deep: bool = True) -> RecoveryReport:
        """Repair what crashed or hung processes left behind; safe to run anywhere, any time.

        Every store that pulls also runs it: once before its first pull, then every
        ``lease_duration / 2`` in the background. See FORMAT.md, "Recovery", for each step.
        ``deep``: in a store that does not fsync, also look for job files a power cut left
        empty, queued or final (one stat per job file: pass False for a periodic pass over a deep
        backlog); each is quarantined, counted in ``lost_to_power_loss`` and named in
        ``lost_ids``; and final jobs an older fsjobstore committed after the upgrade are indexed
        (``indexed``). Also one bounded retention pass (the guide "Operating a store for months"), in ``removed``."""
        self._check_open()
        report = recover(self._core, self._hooks, self._notifier, self._control, deep=deep)
        removed = self._background.retention.run_pass().removed  # one bounded pass (its thread does the rest)
        indexed = index_strays(self._core) if deep else 0  # it lists every final job: deep passes only
        return dataclasses.replace(report, removed=report.removed + removed, indexed=indexed)

    def close(self) -> None:
        """Release held leases (giving their jobs back), stop the threads, drop the owner lock."""
        core = self._core
        if core.closed:
            return
        if core.forked():
            self._after_fork()
        self._work.release_all()
        self._notifier.close()
        self._counters.close()  # what this process counted, for the others
        core.closed = True
        self._background.stop_event.set()
        core.stop_waker()
        self._background.stop()
        if core.owner is not None:
            core.owner.close()
        _LIVE_STORES.discard(self)
        self._detach()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<JobStore {self.path!r} durable={self.durable}>"


_ReaderJobStore = read_only_class(JobStore)


def _before_fork() -> None:
    for store in list(_LIVE_STORES):
        if not store._core.closed:
            store._counters.before_fork()  # the children send their counts up its pipe


def _after_fork_in_parent() -> None:
    for store in list(_LIVE_STORES):
        if not store._core.closed:
            store._counters.after_fork_in_parent()


def _reset_after_fork() -> None:
    for store in list(_LIVE_STORES):
        store._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_reset_after_fork)


@atexit.register
def _flush_counters_at_exit() -> None:
    """What a store that was never closed counted in its last second (its writer is a daemon
    thread, which the interpreter's exit does not wait for)."""
    for store in list(_LIVE_STORES):
        if not store._core.closed and not store._core.forked():
            store._counters.close()

