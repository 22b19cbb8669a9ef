"""The store's side of jobs that know about each other, a part of :class:`JobStore` (which
inherits it): groups made all or none (``_groups``), and waiting for them; the limits jobs run
under (``_limits``, ``_gate``). Unique keys, ``after=`` and ``concurrency_key=`` are ``create``'s
options (``_unique``, ``_deps``, ``_gate``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._core._core import Core
from .._errors import InvalidRequest, JobExists, JobNotFound, WaitTimeout
from .._format._checks import number
from .._format._codec import check_queue_name
from .._format._job import Job
from .._format._patterns import Subscription, Subscriptions, check_interest, matches
from .._format._records import Record
from .._os import _files as fs
from .._relations import _groups
from .._relations import _limits as lim
from .._relations._groups import Group
from .._transitions._create import new_record, publish_new
from .._transitions._work import Work

log = logging.getLogger("fsjobstore")

# What a member of a group may say: create()'s options, less the two that name one job alone.
_MEMBER_OPTIONS = frozenset({"request", "queue", "priority", "delay", "run_at", "max_attempts", "timeout", "retain",
                             "after", "on_parent_failure", "concurrency_key"})


class Relations:
    """What :class:`JobStore` offers for groups (see its docstring for the rest)."""

    _core: Core
    _work: Work
    _subscriptions: Subscriptions
    _retain: float
    default_timeout: float | None

    def _check_open(self) -> None:
        raise NotImplementedError  # JobStore's

    def get(self, job_id: str) -> Job:
        raise NotImplementedError  # JobStore's

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        raise NotImplementedError  # JobStore's

    def _count_created(self, queue: str) -> None:
        raise NotImplementedError  # JobStore's

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
            publish_new(self._core, record, explicit=True, member=True)

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
        # Legal, and most likely a slip (a new user's trial): a copy is never copied again, and a
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
        for record in _groups.read(self._core, group_id):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                self.wait(record.id, left)
            except JobNotFound:
                continue  # removed by retention: it was final
            except WaitTimeout:
                raise WaitTimeout(f"group {group_id} was not all final after {timeout} s") from None
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
        self._work.gate.declarations.forget()
        self._work.gate.limit_changed(limit)
        return next((found for found in self._work.gate.overview() if found.id == limit.id), limit)

    def clear_limit(self, *, key: str | None = None, queue: str | None = None) -> bool:
        """Remove a declared limit (a key then runs one job at a time again; a queue, without a
        limit); False if none was declared."""
        self._check_open()
        kind, name = lim.check_target(key, queue)
        core = self._core
        limit_id = lim.limit_name(kind, name)
        found = fs.unlink(core.layout.limit_decl(limit_id))
        lim.remove_files(core.layout, limit_id)
        self._work.gate.declarations.forget()
        self._work.gate.limit_changed(lim.Limit(kind, name, 1 if kind == "key" else None, None))
        return found

    def limits(self) -> list[lim.Limit]:
        """Every declared limit, and every concurrency key with jobs waiting for it, with its
        slots held now (``running``) and the jobs waiting for it (``waiting``)."""
        self._check_open()
        return self._work.gate.overview()
