"""Listing jobs (``JobStore.jobs``): snapshots in a stable order, a page at a time.

Each state is walked in the order its names sort, so nothing but names is read until a job is
returned: ``active`` by id (its names start with the id), ``pending`` in run order (priority,
then creation: a lexical sort of the names, merged across queues as a claim would take them),
``scheduled`` by due time (its names start with it), and the final states newest first through
the finished index (``finished/<B>/<FIN>.<EXP>.<state>.<queue>.<id>``, newest bucket first), so
the final directories are never listed whole. ``state=None`` walks them in that order: active,
pending, scheduled, then the three final states merged.

The cursor (``after``) is a job id. Its place is computed from its record, not from where it is
now: in pending order from its priority and ``seq``, in scheduled order from its due time, in
final order from its ``finished_at``. So the next page starts right after it even if it was
claimed, promoted or removed from its directory since (it must still exist somewhere: an
unknown id is ``JobNotFound``). With ``state=None`` the cursor's phase is the state the job is in
now: paging every state at once is stable for jobs that stay where they are; page one state at
a time to follow jobs that move.

A job that moves between the listing of its directory and the read of its file is passed over
in that state; it is shown in its new state if the walk reaches that state later (a pending job
finishing during an all-states walk is shown among the final ones). One call never yields the
same job twice.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .._core import _buckets
from .._core._core import Core
from .._core._finding import Location
from .._errors import InvalidJobId, InvalidRequest, JobNotFound
from .._format._job import Job, JobState
from .._format._layout import (
    ACTIVE_RE,
    BUCKET_RE,
    DEFERRED_RE,
    FINAL_RE,
    FINISHED_RE,
    PENDING_RE,
    QUEUE_RE,
    SCHEDULED_RE,
    WAITING_RE,
    bucket_field,
    due_field,
    micros,
    pending_name,
    prio_field,
)
from .._format._records import FINAL_STATES, Record
from .._format._values import MAX_ID_LENGTH, check_name, check_queue_name, integer
from .._os import _files as fs
from ._retention import STALE_AFTER, later_life

log = logging.getLogger("fsjobstore")

MAX_LIMIT = 10_000
# The order of an all-states walk; the final states share one phase (the finished index).
_PHASES = ("active", "pending", "scheduled", "deferred", "final")
_FINAL = frozenset(JobState(s) for s in FINAL_STATES)


def check_state(value: object, what: str) -> JobState:
    """``value`` (a :class:`JobState` or its name) as a JobState, or InvalidRequest naming ``what``."""
    if isinstance(value, JobState):
        return value
    if isinstance(value, str):
        try:
            return JobState(value)
        except ValueError:
            pass
    names = ", ".join(s.value for s in JobState)
    raise InvalidRequest(f"{what} must be one of {names} (a str or JobState), got {value!r}")


def check_states(value: object, what: str) -> tuple[JobState, ...]:
    """One state or a sequence of them, in walk order, each once; InvalidRequest naming ``what``."""
    given: Iterable[object]
    if isinstance(value, str | JobState):
        given = (value,)
    elif isinstance(value, Sequence | frozenset | set):
        given = value
    else:
        raise InvalidRequest(f"{what} must be a state or a sequence of states, got {value!r}")
    states = {check_state(s, what) for s in given}
    if not states:
        raise InvalidRequest(f"{what} must name at least one state")
    return tuple(s for s in JobState if s in states)


def check_after(value: object) -> str | None:
    if value is None:
        return None
    return check_name(value, what="after (the id of the last job of the previous page)",
                      max_length=MAX_ID_LENGTH, error=InvalidJobId)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page starts: in ``phase``, strictly after ``key`` (a name in that phase's order)."""

    phase: str
    key: str
    job_id: str


def jobs(core: Core, *, state: object = None, queue: object = None, limit: object = 100,
         after: object = None) -> Iterator[Job]:
    """Check the arguments and place the cursor now (bad input and an unknown ``after`` raise
    at the call, not at the first ``next``); the walk itself is lazy."""
    chosen = None if state is None else check_state(state, "state")
    q = None if queue is None else check_queue_name(queue, "queue")
    cap = None if limit is None else integer(limit, "limit (or None)", at_least=1, at_most=MAX_LIMIT)
    after_id = check_after(after)
    cursor = None if after_id is None else _place(core, after_id, chosen)
    return _walk(core, chosen, q, cap, cursor)


def _phase_of(state: JobState) -> str:
    return "final" if state in _FINAL else state.value


def _place(core: Core, job_id: str, chosen: JobState | None) -> Cursor:
    """The cursor right after job ``job_id``, from its record."""
    tree = core.tree
    for _ in range(5):
        loc = tree.require(job_id)  # JobNotFound: the page's last job is unknown
        try:
            record = tree.read_record(loc.path)
        except FileNotFoundError:
            continue  # it moved while we read it
        except (fs.Unreadable, ValueError) as exc:
            raise JobNotFound(f"job {job_id!r} (after) cannot be read ({exc}); its place is unknown") from None
        phase = _phase_of(chosen if chosen is not None else loc.state)
        return Cursor(phase, _key(core, record, phase, loc.state), job_id)
    raise JobNotFound(f"job {job_id!r} (after) kept moving while being read")


def _key(core: Core, record: Record, phase: str, now: JobState) -> str:
    if phase == "active":
        return record.id
    if phase == "pending":
        return pending_name(record.priority, record.seq, record.id)
    if phase == "deferred":
        return f"{record.seq}.{record.queue}.{record.id}.json"
    if phase == "scheduled":
        # A job that was never scheduled has no due time: it sorts before every scheduled one.
        return (f"{due_field(record.not_before or 0.0)}.{record.queue}.{prio_field(record.priority)}."
                f"{record.seq}.{record.id}.json")
    if record.finished_at is None:
        # It never finished, or was retried since: nothing places it among the final jobs.
        how = "was retried and is" if record.history else "is"
        raise JobNotFound(f"job {record.id!r} (after) {how} {now.value}, not final: its place among the final jobs "
                          "is unknown; after takes the last id of a page of the same state")
    # Its finished-index entry's name: final jobs are walked in the order of those names.
    return os.path.basename(core.tree.finished_entry(record, now.value, record.finished_at))


def _walk(core: Core, chosen: JobState | None, queue: str | None, limit: int | None,
          cursor: Cursor | None) -> Iterator[Job]:
    phases: tuple[str, ...] = _PHASES if chosen is None else (_phase_of(chosen),)
    finals = _FINAL if chosen is None else frozenset({chosen}) & _FINAL
    if cursor is not None:
        phases = phases[phases.index(cursor.phase):]
    seen: set[str] = set() if cursor is None else {cursor.job_id}
    given = 0
    for phase in phases:
        key = cursor.key if cursor is not None and cursor.phase == phase else None
        if phase == "active":
            found = _active(core, queue, key)
        elif phase == "pending":
            found = _pending(core, queue, key)
        elif phase == "scheduled":
            found = _scheduled(core, queue, key)
        elif phase == "deferred":
            found = _deferred(core, queue, key)
        else:
            found = _final(core, finals, queue, key)
        for job in found:
            if job.id in seen:
                continue  # it moved forward during the walk and was shown already
            seen.add(job.id)
            given += 1
            yield job
            if limit is not None and given >= limit:
                return  # before reading the next file


def _read(core: Core, loc: Location, job_id: str) -> Record | None:
    """The job at ``loc``, or None if it moved away or cannot be read (passed over: a claim or
    ``get`` quarantines a bad file; a listing only looks)."""
    try:
        record = core.tree.read_job(loc)
    except FileNotFoundError:
        return None
    except (fs.Unreadable, ValueError) as exc:
        log.info("listing passed over %s: %s", loc.path, exc)
        return None
    return record if record.id == job_id else None


def queue_of_active(core: Core, name: str) -> str | None:
    """The queue of the job whose file in ``active/`` is called ``name``; None if it is not a
    job's claim, is gone, or cannot be read."""
    m = ACTIVE_RE.match(name)
    if m is None or m["kind"] != "json":
        return None
    loc = Location(JobState.ACTIVE, os.path.join(core.layout.active, name), m["token"], m["kind"])
    record = _read(core, loc, m["id"])
    return None if record is None else record.queue


def _active(core: Core, queue: str | None, after: object) -> Iterator[Job]:
    directory = core.layout.active
    found = []
    for name in fs.scan_names(directory):
        m = ACTIVE_RE.match(name)
        if m and (after is None or m["id"] > str(after)):
            found.append((m["id"], m["token"], m["kind"], name))
    found.sort()
    for job_id, token, kind, name in found:
        loc = Location(JobState.ACTIVE, os.path.join(directory, name), token, kind)
        record = _read(core, loc, job_id)
        if record is not None and (queue is None or record.queue == queue):
            yield record.snapshot(JobState.ACTIVE)


def _drain(names: list[str]) -> Iterator[str]:
    """``names`` in order, sorting lazily: a page of a deep queue pays O(n) for the heap, not
    O(n log n) for a sort."""
    heapq.heapify(names)
    while names:
        yield heapq.heappop(names)


def _in_queue(qdir: str, queue: str, low: str) -> Iterator[tuple[str, str, str]]:
    """``(name, path, queue)`` of a queue's pending jobs in run order, from the name ``low`` on."""
    for bucket, name in _buckets.walk(qdir, low):
        yield name, f"{qdir}/{bucket}/{name}", queue


def _parked(core: Core, queue: str | None, low: str) -> Iterator[tuple[str, str, str]]:
    """The same of the pending jobs a limit parked in ``jobs/waiting/`` (``_limit_gate``): ``name`` is
    the name each has in its queue, so they sort among the others as they will run."""
    found = []
    for entry in fs.scan_names(core.layout.waiting):
        w = WAITING_RE.match(entry)
        if w is not None and (queue is None or w["queue"] == queue):
            name = f"{w['prio']}.{w['seq']}.{w['id']}.json"
            if name > low:
                found.append((name, f"{core.layout.waiting}/{entry}", w["queue"]))
    return iter(sorted(found))


def _pending(core: Core, queue: str | None, after: object) -> Iterator[Job]:
    lay = core.layout
    # Names of jobs sort from "0"; dot names (a writer's temp file) sort before them.
    low = "0" if after is None else str(after)
    queues = [queue] if queue is not None else [q for q in fs.scan_names(lay.pending) if QUEUE_RE.match(q)]
    # One bucket at a time (_buckets.walk), as the caller reads on: a page of a deep queue
    # reads the names of the buckets it returns from, not the whole backlog.
    streams = [_in_queue(lay.pending_dir(q), q, low) for q in queues]
    for name, path, q in heapq.merge(*streams, _parked(core, queue, low)):
        m = PENDING_RE.match(name)
        if not m:
            continue
        record = _read(core, Location(JobState.PENDING, path), m["id"])
        if record is not None and record.queue == q:
            yield record.snapshot(JobState.PENDING)


def _scheduled(core: Core, queue: str | None, after: object) -> Iterator[Job]:
    return _flat(core, core.layout.scheduled, SCHEDULED_RE, JobState.SCHEDULED, queue, after)


def _deferred(core: Core, queue: str | None, after: object) -> Iterator[Job]:
    """Jobs waiting for their parents, oldest first (their names begin with their <SEQ>)."""
    return _flat(core, core.layout.deferred, DEFERRED_RE, JobState.DEFERRED, queue, after)


def _flat(core: Core, directory: str, pattern: re.Pattern[str], state: JobState, queue: str | None,
          after: object) -> Iterator[Job]:
    """The jobs of a directory of one level, in name order, after the name ``after``."""
    low = "0" if after is None else str(after)
    for name in _drain([n for n in fs.scan_names(directory) if n > low]):
        m = pattern.match(name)
        if not m or (queue is not None and m["queue"] != queue):
            continue
        record = _read(core, Location(state, os.path.join(directory, name)), m["id"])
        if record is not None:
            yield record.snapshot(state)


def _final(core: Core, states: frozenset[JobState], queue: str | None, after: object) -> Iterator[Job]:
    """Final jobs newest first, from the finished index, newest bucket first. ``after``: the
    cursor's finished-index entry name (its record's, :func:`_key`)."""
    lay = core.layout
    below = after if isinstance(after, str) else None
    top = None if below is None else below[:17]
    buckets = sorted((b for b in fs.scan_names(lay.finished) if BUCKET_RE.match(b)), reverse=True)
    wanted = {s.value for s in states}
    for bucket in buckets:
        if top is not None and bucket > bucket_field(int(top)):
            continue
        names = core.finished_lists.get(lay.finished_bucket(bucket))
        i = len(names) if below is None else bisect.bisect_left(names, below)
        while i > 0:  # newest first: the sorted names from their end
            i -= 1
            m = FINISHED_RE.match(names[i])
            if not m or m["state"] not in wanted or (queue is not None and m["queue"] != queue):
                continue
            state, job_id, fin = m["state"], m["id"], int(m["fin"])
            loc = Location(JobState(state), lay.final_path(state, job_id))
            record = _read(core, loc, job_id)
            if record is not None and record.finished_at is not None and micros(record.finished_at) == fin:
                yield record.snapshot(JobState(state))
            elif record is None or later_life(record.finished_at, fin):
                drop_if_stale(core, os.path.join(lay.finished_bucket(bucket), names[i]), fin)
            # else: a read that lags behind the file (network filesystems), never proof: kept


def drop_if_stale(core: Core, entry: str, fin: int) -> None:
    """Unlink a finished-index entry found stale (its job is not where it says, or finished at
    another time), once it is old enough that no commit can still be publishing its job: the
    rule retention follows (``_retention.STALE_AFTER``)."""
    # RACE: the entry is made before the rename that publishes the job; a commit between the two
    # is a few system calls, and a holder stopped there past its lease is fenced (taken over),
    # so its rename fails and the entry is stale indeed. STALE_AFTER is far beyond both.
    if core.wall() - fin / 1e6 > STALE_AFTER:
        fs.unlink_quietly(entry)


def notified(core: Core) -> list[str]:
    """The ids of the final jobs with targets waiting (``jobs/notify/``), in no order."""
    return [m.group("id") for name in fs.scan_names(core.layout.notify) if (m := FINAL_RE.match(name))]
