"""Purging jobs (``JobStore.purge``): remove the jobs an operator selects, each with every file
of it, by the one removal primitive retention uses too (``_removal.remove_job``).

Selection reads names before files. A final job is found in the finished index, oldest first, and
its state, queue and ``finished_at`` come from the entry's name; a waiting job's queue, id and
creation time (``<SEQ>``) come from its name in ``pending/<q>/`` or ``scheduled/``. Only ``match``
(a regular expression over the request) needs a job's file, and a final job's file is read once
more before it goes, to make sure the entry is its current one (a job retried and finished again
has a newer entry; the older one is stale and must not select it).

Every removal starts with a rename of the job's file (the fence), so a job a worker claims first
is skipped, and two processes purging the same jobs remove each once: a purge counts only the
jobs its own fences took. A final job whose notification is still due (a ``notify/`` entry or a
queued target) is skipped and not counted; a later purge or retention pass removes it once its
targets have heard. A pending or scheduled job goes with its queued targets: they would never
hear of it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from .._core import _buckets
from .._core._core import Core
from .._core._hooks import Hooks
from .._errors import InvalidRequest
from .._format._job import JobState
from .._format._layout import (
    BUCKET_RE,
    BUCKET_US,
    DEFERRED_RE,
    FINISHED_RE,
    PENDING_RE,
    QUEUE_RE,
    SCHEDULED_RE,
    WAITING_RE,
    micros,
)
from .._format._records import Record
from .._format._values import check_queue_name, dumps, integer, seconds
from .._os import _files as fs
from ._listing import check_states
from ._removal import notification_due, remove_job

DEFAULT_STATES = ("fulfilled", "failed", "cancelled")
_FINAL = frozenset({JobState.FULFILLED, JobState.FAILED, JobState.CANCELLED})
PROGRESS_EVERY = 0.25  # seconds between progress calls (and one at the end)


@dataclass(frozen=True, slots=True)
class Selection:
    """What a purge removes, checked (see ``JobStore.purge``)."""

    states: tuple[JobState, ...]
    queue: str | None
    cutoff: float | None  # epoch seconds: only jobs finished (final) or created (waiting) before it
    match: Searcher | None
    limit: int | None
    dry_run: bool
    progress: Callable[[int], object] | None


def check(core: Core, *, states: object, queue: object, older_than: object, match: object, limit: object,
          dry_run: object, progress: object) -> Selection:
    """The arguments of ``purge``, each checked, or InvalidRequest naming the one that is wrong."""
    chosen = check_states(states, "states")
    if JobState.ACTIVE in chosen:
        raise InvalidRequest("states: a running job is never purged; cancel it first "
                             "(it is then final, and a purge of 'cancelled' removes it)")
    q = None if queue is None else check_queue_name(queue, "queue")
    cutoff = None
    if older_than is not None:
        age = seconds(older_than, "older_than (seconds, a timedelta, or a duration such as 7d)", at_least=0)
        cutoff = core.wall() - age
    if not isinstance(dry_run, bool):
        raise InvalidRequest(f"dry_run must be True or False, got {dry_run!r}")
    if progress is not None and not callable(progress):
        raise InvalidRequest(f"progress must be a callable progress(done) or None, got {progress!r}")
    cap = None if limit is None else integer(limit, "limit (or None)", at_least=1)
    return Selection(chosen, q, cutoff, _pattern(match), cap, dry_run, progress)


class Searcher(Protocol):
    """A compiled pattern: RE2's, which searches in time linear in the text."""

    def search(self, text: str) -> object: ...


# The flags of an ``re.Pattern`` that RE2 has too, as its inline flags. re.UNICODE is what every
# str pattern has; the rest (VERBOSE, ASCII, LOCALE) have no RE2 counterpart and are refused.
_INLINE = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"))
_KNOWN_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.UNICODE


def _pattern(match: object) -> Searcher | None:
    """``match`` compiled by RE2 (google-re2). Python's ``re`` backtracks, and a pattern such as
    ``(a|a)*!`` over a few dozen characters of a request would hold its thread for ever; RE2
    runs in time linear in the text, and refuses what needs backtracking (backreferences,
    lookaround). An ``re.Pattern`` is taken as its pattern text and flags, compiled by RE2."""
    if match is None:
        return None
    if isinstance(match, re.Pattern):
        if not isinstance(match.pattern, str):
            raise InvalidRequest("match must be a str pattern (the request is matched as text), not bytes")
        if match.flags & ~_KNOWN_FLAGS:
            raise InvalidRequest(f"match {match.pattern!r} has flags RE2 lacks ({re.RegexFlag(match.flags)!r}): only "
                                 "IGNORECASE, MULTILINE and DOTALL are kept; give the pattern as a str in RE2 syntax")
        inline = "".join(letter for flag, letter in _INLINE if match.flags & flag)
        text = f"(?{inline}){match.pattern}" if inline else match.pattern
    elif isinstance(match, str):
        text = match
    else:
        raise InvalidRequest(f"match must be a regular expression (a str in RE2 syntax, or an re.Pattern), "
                             f"got {match!r}")
    try:
        import re2  # google-re2: an optional dependency (the re2, web and test extras)
    except ImportError:
        raise InvalidRequest('purge by match needs RE2 (the google-re2 package): pip install "fsjobstore[re2]"') \
            from None
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the caller's error, not a line on stderr
    try:
        compiled: Searcher = re2.compile(text, options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        shown = match if isinstance(match, str) else text
        raise InvalidRequest(f"match '{shown}' is not a pattern RE2 accepts: "
                             f"{why} (RE2 syntax: no backreferences or lookaround)") from None
    return compiled


@dataclass(slots=True)
class _Candidate:
    path: str
    job_id: str
    queue: str
    state: JobState
    fin: int | None = None  # a final job's <FIN>, from its index entry
    entry: str | None = None


def purge(core: Core, hooks: Hooks, sel: Selection) -> int:
    """Remove (or with ``dry_run``, count) the selected jobs; returns how many."""
    done = 0
    said = time.monotonic()
    for cand in _candidates(core, sel):
        if sel.limit is not None and done >= sel.limit:
            break
        if cand.state in _FINAL and notification_due(core, cand.job_id):
            continue  # its targets have not heard yet: never removed before they do
        if not _still_selected(core, sel, cand):
            continue
        if sel.dry_run or remove_job(core, hooks, cand.path, cand.job_id, drop_targets=cand.state not in _FINAL,
                                     entry=cand.entry):
            done += 1
        if sel.progress is not None and time.monotonic() - said >= PROGRESS_EVERY:
            said = time.monotonic()
            sel.progress(done)
    if sel.progress is not None:
        sel.progress(done)
    return done


def _still_selected(core: Core, sel: Selection, cand: _Candidate) -> bool:
    """Read the job: only a job file whose record is the job its name says (its id, its queue)
    is purged and counted. A job that moved away meanwhile is passed over; so is a file that
    cannot be read or names another job (planted, or damaged): it is no job to remove, and
    removing it would free the id it names, whose job may live elsewhere. Whoever reads it
    next as a job quarantines it."""
    try:
        record = core.tree.read_record(cand.path)
    except (FileNotFoundError, fs.Unreadable, ValueError):
        return False
    if record.id != cand.job_id or record.queue != cand.queue:
        return False
    if cand.fin is not None and (record.finished_at is None or micros(record.finished_at) != cand.fin):
        # RACE: a stale entry (the job was retried and finished again: its newer entry selects
        # it). A retry and a new commit between this read and our fence would take many steps
        # of other processes within a few of ours; the fence then takes the newer version.
        return False
    return sel.match is None or _matches(sel.match, record)


def _matches(pattern: Searcher, record: Record) -> bool:
    if pattern.search(record.id):
        return True
    # The request as stored: compact JSON, keys in the order they were given (a create writes
    # exactly these bytes, and reading them back then writing them again gives them again).
    text = (record.request_json or dumps(record.request, what="request")).decode("utf-8")
    return pattern.search(text) is not None


def _candidates(core: Core, sel: Selection) -> Iterator[_Candidate]:
    for state in sel.states:
        if state is JobState.PENDING:
            yield from _pending(core, sel)
        elif state is JobState.SCHEDULED:
            yield from _scheduled(core, sel)
        elif state is JobState.DEFERRED:
            yield from _deferred(core, sel)
    finals = frozenset(s.value for s in sel.states if s in _FINAL)
    if finals:
        yield from _final(core, sel, finals)


def _created_before(seq: str, cutoff: float | None) -> bool:
    return cutoff is None or int(seq) / 1e9 < cutoff


def _pending(core: Core, sel: Selection) -> Iterator[_Candidate]:
    lay = core.layout
    queues = [sel.queue] if sel.queue is not None else [q for q in fs.scan_names(lay.pending) if QUEUE_RE.match(q)]
    for q in queues:
        qdir = lay.pending_dir(q)
        last = None
        for bucket, name in _buckets.walk(qdir):  # run order: the oldest of a priority first
            if last is not None and bucket != last:
                _drop_if_emptied(qdir, last, core.tree.bucket_keep)
            last = bucket
            m = PENDING_RE.match(name)
            if m and _created_before(m["seq"], sel.cutoff):
                yield _Candidate(f"{qdir}/{bucket}/{name}", m["id"], q, JobState.PENDING)
        if last is not None:
            _drop_if_emptied(qdir, last, core.tree.bucket_keep)
    yield from _flat(lay.waiting, WAITING_RE, JobState.PENDING, sel)  # parked by a limit (_limit_gate)


def _drop_if_emptied(qdir: str, bucket: str, keep: float) -> None:
    """A bucket the purge emptied goes now, not at a claimer's next listing: a purged queue may
    have no worker (on a network filesystem, as any emptied bucket, once ``keep`` s unchanged)."""
    bdir = f"{qdir}/{bucket}"
    _buckets.remove_if_spent(bdir, bucket, fs.dir_signature(bdir), keep=keep)


def _scheduled(core: Core, sel: Selection) -> Iterator[_Candidate]:
    return _flat(core.layout.scheduled, SCHEDULED_RE, JobState.SCHEDULED, sel)


def _deferred(core: Core, sel: Selection) -> Iterator[_Candidate]:
    return _flat(core.layout.deferred, DEFERRED_RE, JobState.DEFERRED, sel)


def _flat(directory: str, pattern: re.Pattern[str], state: JobState, sel: Selection) -> Iterator[_Candidate]:
    """The jobs of a directory of one level whose names carry <queue>, <SEQ> and <id>, in name order."""
    for name in sorted(fs.scan_names(directory)):
        m = pattern.match(name)
        if m and (sel.queue is None or m["queue"] == sel.queue) and _created_before(m["seq"], sel.cutoff):
            yield _Candidate(os.path.join(directory, name), m["id"], m["queue"], state)


def _final(core: Core, sel: Selection, states: frozenset[str]) -> Iterator[_Candidate]:
    """Final jobs oldest first, from the finished index (never the final directories whole)."""
    lay = core.layout
    stop = None if sel.cutoff is None else micros(sel.cutoff)  # finished before this µs
    for bucket in sorted(b for b in fs.scan_names(lay.finished) if BUCKET_RE.match(b)):
        if stop is not None and int(bucket) * BUCKET_US >= stop:
            return  # this bucket and every later one finished after the cutoff
        bdir = lay.finished_bucket(bucket)
        for name in sorted(fs.scan_names(bdir)):
            m = FINISHED_RE.match(name)
            if not m or m["state"] not in states or (sel.queue is not None and m["queue"] != sel.queue):
                continue
            fin = int(m["fin"])
            if stop is not None and fin >= stop:
                return  # entries sort by <FIN>: the rest finished later
            yield _Candidate(lay.final_path(m["state"], m["id"]), m["id"], m["queue"], JobState(m["state"]), fin,
                             os.path.join(bdir, name))

