"""Periodic ticks on disk: each tick of a schedule becomes one job, once, whoever makes it
(FORMAT.md, "Schedules"). What is due when is the runtime's business (``fsjobstore.schedule``);
this module only makes a given tick, records it, and says what was made.

- A tick's job has the id ``tick-<schedule>-<epoch seconds>``. Its reservation in ``ids/``
  (a ``link``: exactly one winner, on every filesystem the store supports) is the claim, so two
  schedulers making the same tick make one job: the loser gets :class:`JobExists`.
- ``control/schedules/<name>/<epoch>`` (an empty file) records that tick ``<epoch>``'s job was
  made; only its maker (once the job is published) and its removal write it. A scheduler makes a
  tick only if no record of it *or of a later tick* exists (:func:`make`).
- The id is free again once the job is removed (retention, purge), so a scheduler that stalled
  between its look and its create for the job's whole life could make the tick again. Removal
  therefore writes the tick's record before it takes the job away (:func:`note_removed`), and a
  create that wins a tick's id looks for that record before it publishes: found, it gives the
  id back (:func:`published_before`).
- ``control/schedules/<name>.json`` declares the schedule (its spec, queue, and since when it
  is known), so ``fsjobstore schedules DIR`` can show the next tick without the user's code.

Nothing here takes a lock: links and exclusive names only, which hold across GlusterFS hosts
(``fsjobstore verify --peer`` requires them), where flock exclusion is not relied on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from .._core._core import Core
from .._errors import InvalidRequest, JobExists
from .._format._job import Job
from .._format._values import MAX_QUEUE_LENGTH, QUEUE_PATTERN, check_queue_name, dumps
from .._os import _files as fs

log = logging.getLogger("fsjobstore")

assert MAX_QUEUE_LENGTH + 17 <= 128  # a tick id (tick-<name>-<11 digits>) stays within a job id's length
MAX_TICK = 99_999_999_999  # the store's bound on run_at (the year 5138)
TICK_ID_RE = re.compile(rf"tick-(?P<name>{QUEUE_PATTERN})-(?P<at>[0-9]{{1,11}})\Z")
_TICK_NAME_RE = re.compile(r"[0-9]{1,11}\Z")
KEEP = 100  # tick records kept per schedule: a scheduler that stalled for more ticks than this may skip one
_SPEC_CAP = 64 * 1024


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """What a store knows of one schedule (:meth:`JobStore.schedules`).

    ``spec``: how its ticks fall (``"every 300s"``, ``"cron 0 3 * * * Europe/Paris"``), as the
    last scheduler to run it declared it; ``queue``: where its jobs go; ``since``: when a
    scheduler first declared it (epoch seconds: no tick before it is made); ``last_tick``: the
    newest tick made (epoch seconds), None before the first; ``last_job``: that tick's job id
    (the job itself may be removed by now); ``declared_at``: when the declaration was written."""

    name: str
    spec: str
    queue: str
    since: float
    last_tick: int | None
    last_job: str | None
    declared_at: float


def check_schedule_name(name: object) -> str:
    """A schedule name: the queue-name grammar, at most 64 characters (it is part of file names
    and of its ticks' ids)."""
    return check_queue_name(name, "schedule name")


def check_spec(spec: object) -> str:
    """A schedule's spec as stored: one printable line (the runtime writes and reads it)."""
    if not isinstance(spec, str) or not 0 < len(spec) <= 512 or not spec.isprintable():
        raise InvalidRequest(f"a schedule's spec must be one printable line of 1 to 512 characters, got {spec!r}")
    return spec


def tick_id(name: str, at: int) -> str:
    return f"tick-{name}-{at}"


def parse_tick_id(job_id: str) -> tuple[str, int] | None:
    """(schedule, tick epoch) of a tick's job id, or None for any other id."""
    m = TICK_ID_RE.match(job_id)
    return (m["name"], int(m["at"])) if m else None


def tick_of(job_id: str) -> tuple[str, datetime] | None:
    """(schedule name, tick time as an aware UTC datetime) of a periodic tick's job id, else
    None: what a handler reads when its work is about the tick's moment (yesterday's report,
    say), not about when it happened to run."""
    if not isinstance(job_id, str):
        raise TypeError(f"tick_of takes a job id (a str), not {type(job_id).__name__}")
    found = parse_tick_id(job_id)
    return None if found is None else (found[0], datetime.fromtimestamp(found[1], UTC))


def recorded(core: Core, name: str) -> list[int]:
    """The ticks of ``name`` recorded as made (the newest :data:`KEEP`), oldest first; names
    that are not ticks are ignored."""
    return sorted(int(n) for n in fs.scan_names(core.layout.ticks_dir(name)) if _TICK_NAME_RE.match(n))


def newest(core: Core, name: str) -> int | None:
    return max(recorded(core, name), default=None)


def published_before(ticks: list[int], at: int) -> bool:
    """Whether records ``ticks`` show that tick ``at`` had its job made already: its own
    record (written only once its job existed: by its maker, or by its removal), or records
    that all postdate it (its own was pruned: it is more than KEEP ticks old)."""
    return at in ticks or (bool(ticks) and ticks[0] > at)


def make(core: Core, name: str, at: int, create: Callable[[Callable[[], bool]], Job]) -> Job | None:
    """Make tick ``at`` of ``name`` unless it or a later tick was made; the job if this call
    made it. ``create(still_due)`` creates the job with the tick's id, calling ``still_due``
    once it holds the id's reservation (False: it gives the id back and raises JobExists)."""
    last = newest(core, name)
    if last is not None and last >= at:
        return None  # made already, or a later one was: a tick is never made after a later one
    try:
        # RACE: another scheduler may make this tick between our look and our create. The id
        # lets one of us in; the other gets JobExists. One that stalled past the job's removal
        # wins the freed id, then finds the record removal wrote (note_removed) and backs out.
        job = create(lambda: not published_before(recorded(core, name), at))
    except JobExists:
        # Made by another, or reserved by one that has yet to publish it (recovery publishes it
        # if that one died). Not recorded here: only a made job's record may say "made", or a
        # holder of the reservation would find it and back out, and the tick would be lost.
        return None
    record(core, name, at)
    return job


def record(core: Core, name: str, at: int) -> None:
    """Record tick ``at`` of ``name`` as made (its job exists, or existed), and forget all but
    the newest KEEP records. Idempotent."""
    tree, ticks = core.tree, core.layout.ticks_dir(name)
    tree.ensure_dir(core.layout.schedules)
    tree.ensure_dir(ticks)
    fs.touch(os.path.join(ticks, str(at)), tree.perms.file_mode)
    fs.sync_applied(ticks, durable=core.durable)
    kept = recorded(core, name)
    for old in kept[:-KEEP]:
        fs.unlink_quietly(os.path.join(ticks, str(old)))


def note_removed(core: Core, job_id: str) -> None:
    """Before a tick's job is removed: record its tick (see the module's docstring). Any other
    id: nothing. A job that merely has a tick's shape of id (made by hand) records it too,
    which only stops the scheduler from making that tick, as the job's id already did."""
    tick = parse_tick_id(job_id)
    if tick is not None and not published_before(recorded(core, tick[0]), tick[1]):
        record(core, *tick)


def declare(core: Core, name: str, *, spec: str, queue: str) -> ScheduleInfo:
    """Write ``control/schedules/<name>.json`` if it is missing or says another spec or queue
    (its ``since`` is kept); return what the store knows of the schedule."""
    lay, now = core.layout, core.wall()
    found = read(core, name)
    if found is not None and (found.spec, found.queue) == (spec, queue):
        return found
    if found is not None:
        # A changed schedule says so once. Said at every pass, it is two schedulers (two
        # versions of the code, or two schedules given one name) taking turns over one record.
        log.warning("schedule %s was %s into queue %s; now %s into queue %s (declared by this process)", name,
                    found.spec, found.queue, spec, queue)
    since = found.since if found is not None else now
    doc = {"schedule": name, "spec": spec, "queue": queue, "since": since, "declared_at": now}
    core.tree.ensure_dir(lay.schedules)
    fs.replace_with(lay.tmp_path(core.new_token(), "aux", "schedule.json"), lay.schedule_path(name),
                    dumps(doc, what="schedule") + b"\n", durable=core.durable, mode=core.tree.perms.file_mode)
    return ScheduleInfo(name, spec, queue, since, *_last(core, name), now)


def read(core: Core, name: str) -> ScheduleInfo | None:
    """The schedule's declaration and newest tick; None if it was never declared (or its
    declaration is not a readable one: it is then written again by the next scheduler)."""
    try:
        doc = json.loads(fs.read_regular(core.layout.schedule_path(name), _SPEC_CAP))
        spec, queue, since, at = doc["spec"], doc["queue"], float(doc["since"]), float(doc["declared_at"])
        if not (isinstance(spec, str) and isinstance(queue, str) and math.isfinite(since) and math.isfinite(at)):
            raise ValueError("spec and queue must be strings, since and declared_at finite numbers")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (fs.Unreadable, ValueError, KeyError, TypeError):  # planted, torn or foreign: declared again
        return None
    return ScheduleInfo(name, spec, queue, since, *_last(core, name), at)


def read_all(core: Core) -> list[ScheduleInfo]:
    """Every declared schedule, by name."""
    out = []
    for entry in sorted(fs.scan_names(core.layout.schedules)):
        base, dot, ext = entry.rpartition(".")
        if dot and ext == "json" and re.fullmatch(QUEUE_PATTERN, base):
            info = read(core, base)
            if info is not None:
                out.append(info)
    return out


def _last(core: Core, name: str) -> tuple[int | None, str | None]:
    at = newest(core, name)
    return at, (None if at is None else tick_id(name, at))

