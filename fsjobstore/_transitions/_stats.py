"""Store statistics: the counts ``JobStore.statistics()`` returns.

Pending and final jobs are counted per bucket (``pending/<queue>/<P>.<S>/`` and ``finished/<B>/``),
and a bucket whose stat did not change since this store counted it is not listed again
(:class:`DirCounts`). Final jobs are counted from their finished-index entries.

Not even every pending bucket is stat'ed: a deep backlog has one bucket per second of its
creation (~150 at a million jobs filled at full speed), and a stat each made ``statistics()``
five times slower at 1M than at 10k (PERFORMANCE.md). Only creates and claims change a bucket
without saying so, and they change only the queue's *tail* (the buckets of the last seconds:
creates go to the current one) and its *head* (the first buckets until ``_pending.ENOUGH`` jobs:
no claimer's index reaches further, ``_pending.QueueIndex._refill``). Every other change (a job
put back, a promotion, a claim or purge by id) sets the queue's marker (``.changed``,
``Tree.note_bucket_change``). So while the marker keeps the stat it had when this store last
counted the queue, a bucket between head and tail whose second ended ``SLACK`` s before that
count is taken from what was counted, without a stat, and while the stat of the queue's directory
stays too (no bucket came or went) the directory is not listed again: this process keeps its
bucket list and counts (:class:`_Queue`), and updates them from the head and tail buckets alone.
Every ``FULL_EVERY`` s each bucket is
stat'ed again (a full count), which corrects what the rule cannot see: a process that died
between a change and its marker, another host's clock more than ``SLACK`` s behind. FORMAT.md,
"Counting", says how exact that is."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, cast

from .._core import _buckets, _quarantine
from .._core._control import Control
from .._core._core import Core
from .._core._pending import ENOUGH
from .._format._layout import (
    ACTIVE_RE,
    BUCKET_RE,
    DEFERRED_RE,
    FINAL_RE,
    FINISHED_NAMES_RE,
    PENDING_NAMES_RE,
    QUEUE_RE,
    SCHEDULED_RE,
    WAITING_RE,
)
from .._os import _files as fs
from .._os import _syscalls as sc

_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """A snapshot of one store's counts, from a single listing of each directory."""

    pending: int
    scheduled: int
    active: int
    fulfilled: int
    failed: int
    cancelled: int
    notifications: int  # final jobs with targets still waiting
    quarantined: int
    pending_by_queue: Mapping[str, int]
    oldest_pending_age: float | None  # seconds since the oldest pending job was created
    paused: frozenset[str]  # queues no worker takes jobs from
    watching: bool  # whether *this process* gets inotify wake-ups (it has waited in a pull)
    # Every queue that has a job in any state: its jobs per state (all six states, zeros too).
    by_queue: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    deferred: int = 0  # waiting for the jobs they were made after
    oldest_pending_by_queue: Mapping[str, float] = field(default_factory=dict)  # age, seconds, of each queue's


class DirCounts:
    """What was counted in each bucket directory, kept while its stat says it did not change.

    A bucket of a past second (pending) or hour (the finished index) rarely changes once it
    settles, so ``statistics()`` lists only the buckets that changed: those being drained,
    filled or purged. Trusted only for a directory that had settled (``_files.SETTLE``) when it
    was listed, so a change in the same clock tick as the listing is never hidden behind an
    unchanged mtime. Kept in ``control/counts.v2.json`` too (a hint: replaced whole, never
    fsynced, ignored when unreadable), so a fresh process (``fsjobstore status``) starts from
    what others counted. Thread-safe enough: a lost update is a recount."""

    def __init__(self, control: str, file_mode: int) -> None:
        self._path = os.path.join(control, COUNTS)
        self._cut = len(os.path.dirname(control)) + 1  # keys are paths below the store's root
        self._file_mode = file_mode
        self._seen: dict[str, tuple[tuple[int, int, int], object]] | None = None
        # queue directory -> (its marker's stat, wall time of the last count, of the last full one)
        self._queues: dict[str, _QueueSeen] = {}
        self.listed: dict[str, _Queue] = {}  # queue directory -> its buckets, this process only
        self._changed = False

    def trusted_since(self, qdir: str, marker: tuple[int, int, int], settled: bool, now: float) -> float | None:
        """The wall time of this queue's last count, if its buckets' counts may be trusted
        without a stat (module docstring): the marker has the stat it had then and had settled,
        and the last full count is less than ``FULL_EVERY`` s old (on a clock that did not go back)."""
        self._load()
        seen = self._queues.get(qdir[self._cut:])
        if seen is None or not settled or seen.marker != marker:
            return None
        if not (seen.full <= seen.last <= now and now - seen.full < FULL_EVERY):
            return None
        return seen.last

    def counted(self, qdir: str, marker: tuple[int, int, int], settled: bool, at: float, full: bool) -> None:
        """Note a count of the queue at ``qdir`` that began at wall time ``at``."""
        key = qdir[self._cut:]
        if not settled:
            if self._queues.pop(key, None) is not None:
                self._changed = True
            return
        last = self._queues.get(key)
        self._queues[key] = _QueueSeen(marker, at, at if full or last is None else last.full)
        # Written for other processes only when more than the time moved (a later time there
        # would save them a few stats; an older one only costs them those stats).
        if full or last is None or last.marker != marker:
            self._changed = True

    def get(self, path: str, count: Callable[[list[str]], _V]) -> _V:
        seen = self._load()
        sig, settled = fs.dir_signature(path)  # before the listing it vouches for
        key = path[self._cut:]
        hit = seen.get(key)
        if hit is not None and hit[0] == sig:
            return cast(_V, hit[1])
        value = count(_names(path))
        if settled:
            seen[key] = (sig, value)
            self._changed = True
        elif seen.pop(key, None) is not None:
            self._changed = True
        return value

    def _load(self) -> dict[str, tuple[tuple[int, int, int], object]]:
        if self._seen is None:
            self._seen = {}
            with contextlib.suppress(OSError, ValueError, fs.Unreadable, TypeError, KeyError):
                doc = json.loads(fs.read_regular(self._path, _COUNTS_CAP))
                for key, (m, c, ino, value) in doc["buckets"].items():
                    if isinstance(key, str) and all(type(v) is int for v in (m, c, ino)) and _believed(key, value):
                        self._seen[key] = ((m, c, ino), value)
                for key, (m, c, ino, last, full) in doc.get("queues", {}).items():
                    if all(type(v) is int for v in (m, c, ino)) and all(type(v) is float for v in (last, full)):
                        self._queues[key] = _QueueSeen((m, c, ino), last, full)
        return self._seen

    def finish(self, present: set[str]) -> None:
        """Forget the buckets that are gone, and write what changed for the next process."""
        seen = self._load()
        keep = {p[self._cut:] for p in present}
        for key in [k for k in seen if k not in keep]:
            del seen[key]
            self._changed = True
        if not self._changed:
            return
        self._changed = False
        doc = {"buckets": {k: [*sig, value] for k, (sig, value) in seen.items()},
               "queues": {k: [*q.marker, q.last, q.full] for k, q in self._queues.items()}}
        tmp = f"{os.path.dirname(self._path)}/.{COUNTS}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fs.write_new(tmp, json.dumps(doc, separators=(",", ":")).encode(), durable=False, mode=self._file_mode)
            sc.rename(tmp, self._path)
        except OSError:
            fs.unlink_quietly(tmp)  # a hint: the next call counts again (read-only control/, full disk)


# counts.v2.json since the finished buckets' counts are per state and queue (they were per state in
# counts.json, which a process of an older version may still write beside it).
COUNTS = "counts.v2.json"
_COUNTS_CAP = 64 << 20
SLACK = 5.0  # seconds before a queue's last count whose buckets are stat'ed still (module docstring)
FULL_EVERY = 60.0  # seconds between full counts of a queue (every bucket stat'ed)


@dataclass(frozen=True, slots=True)
class _QueueSeen:
    marker: tuple[int, int, int]  # the stat of the queue's marker at its last count
    last: float  # wall time the last count began
    full: float  # wall time the last full count began


def _names(bucket: str) -> list[str]:
    """A bucket's names, unsorted (a count needs no order; dot names match no job's grammar)."""
    try:
        return fs.scan_names(bucket)
    except NotADirectoryError:
        return []


def _pending_bucket(names: list[str]) -> tuple[int, int | None]:
    seqs = PENDING_NAMES_RE.findall("\0".join(names))  # (one match in C, not one a name)
    return len(seqs), int(min(seqs)) if seqs else None


def _finished_bucket(names: list[str]) -> dict[str, int]:
    """Jobs per ``"<state>.<queue>"`` (a dot never appears in a queue's name)."""
    return {f"{state}.{queue}": n for (state, queue), n in Counter(FINISHED_NAMES_RE.findall("\0".join(names))).items()}


def _believed(key: str, value: object) -> bool:
    """Whether a count kept in the counts file has the shape its bucket's count has (a planted
    or damaged one must not reach the arithmetic)."""
    if key.startswith("finished/"):
        return isinstance(value, dict) and all(
            isinstance(k, str) and k.partition(".")[0] in _FINAL and type(n) is int and n >= 0
            for k, n in value.items())
    return (isinstance(value, list) and len(value) == 2 and type(value[0]) is int and value[0] >= 0
            and (value[1] is None or type(value[1]) is int))


_FINAL = ("fulfilled", "failed", "cancelled")
_STATES = ("pending", "scheduled", "deferred", "active", *_FINAL)


@dataclass(slots=True)
class _Queue:
    """What this process counted in one queue: its buckets as listed (while the stat of its
    directory stays, no bucket came or went) and each one's (jobs, smallest <SEQ>)."""

    sig: tuple[int, int, int]  # the queue directory's stat before the listing
    paths: list[str]  # its buckets, in run order
    seconds: list[int]  # each one's second
    values: list[tuple[int, int | None]]  # each one's count, as last counted or stat'ed
    total: int  # the sum of their jobs, and of the flat ones below
    flat: tuple[int, int | None]  # jobs written flat by an older store, not moved yet
    young: list[int]  # indices of the buckets that may still be in a count's tail
    groups: list[int]  # the index where each priority's buckets begin


def _list_queue(qdir: str, sig: tuple[int, int, int], counts: DirCounts) -> _Queue:
    """List the queue and count every bucket (each one stat'ed; listed only if it changed)."""
    buckets, others = _buckets.list_queue(qdir)
    paths = [f"{qdir}/{b}" for b in buckets]
    values = [counts.get(p, _pending_bucket) for p in paths]
    flat = _pending_bucket(_buckets.flat_jobs(qdir, others))  # (rare: one lstat each)
    groups = [i for i, b in enumerate(buckets) if i == 0 or b[:7] != buckets[i - 1][:7]]
    return _Queue(sig, paths, [int(b[8:]) for b in buckets], values,
                  flat[0] + sum(k for k, _ in values), flat, list(range(len(paths))), groups)


def _recount(q: _Queue, i: int, counts: DirCounts) -> int:
    k, low = counts.get(q.paths[i], _pending_bucket)
    q.total += k - q.values[i][0]
    q.values[i] = (k, low)
    return k


def _count_queue(qdir: str, marker: str, counts: DirCounts, present: set[str]) -> tuple[int, int | None]:
    """The pending jobs of one queue and its smallest <SEQ>: every bucket stat'ed, or, while the
    marker says no older bucket changed and the queue's directory that no bucket came or went,
    only its head and tail buckets (module docstring)."""
    qsig, qsettled = fs.dir_signature(qdir)  # both before the listings they vouch for
    msig, msettled = fs.dir_signature(marker)
    now = time.time()  # real wall time, as the creators' <SEQ>s and so the buckets' names
    since = counts.trusted_since(qdir, msig, msettled, now)
    q = counts.listed.get(qdir)
    if since is None or q is None or q.sig != qsig:
        q = _list_queue(qdir, qsig, counts)
    else:
        older = int(since - SLACK)  # buckets of a second before it: taken as counted
        head = i = 0
        while i < len(q.paths) and head < ENOUGH:  # the head: as far as a claimer's index reaches
            head += _recount(q, i, counts)
            i += 1
        q.young = [j for j in q.young if q.seconds[j] >= older]
        for j in q.young:  # the tail: where creates land
            if j >= i:
                _recount(q, j, counts)
    if qsettled:
        counts.listed[qdir] = q
    else:
        counts.listed.pop(qdir, None)
    present.update(q.paths)
    counts.counted(qdir, msig, msettled, now, full=since is None)
    first = q.flat[1]
    for g in q.groups:  # each priority's oldest job is in its first non-empty bucket
        low = next((v[1] for v in itertools.islice(q.values, g, None) if v[1] is not None), None)
        if low is not None and (first is None or low < first):
            first = low
    return q.total, first


def statistics(core: Core, control: Control, counts: DirCounts, active_queue: Callable[[str], str | None]
               ) -> StoreStatistics:
    """Count each state: pending and final jobs bucket by bucket (a bucket that did not change
    since this store last counted it is not listed again), the rest by listing its directory.
    Only names of each directory's grammar count (FORMAT.md, "Names"): anything planted beside
    them is no job. ``active_queue(name)``: the queue of the active job of that name (its file is read)."""
    lay = core.layout
    now = core.wall()
    by_queue: dict[str, dict[str, int]] = {}

    def add(queue: str, state: str, n: int = 1) -> None:
        row = by_queue.get(queue)
        if row is None:
            row = by_queue[queue] = dict.fromkeys(_STATES, 0)
        row[state] += n

    oldest: dict[str, float] = {}
    present: set[str] = set()
    pending: dict[str, int] = {}
    for q in fs.scan_names(lay.pending):
        if not QUEUE_RE.match(q):
            continue  # no queue's directory (the next claimer's listing quarantines it)
        qdir = lay.pending_dir(q)
        n, first = _count_queue(qdir, lay.pending_marker(qdir), counts, present)
        pending[q] = n
        add(q, "pending", n)
        if first is not None:
            oldest[q] = max(0.0, now - first / 1e9)
    for name in fs.scan_names(lay.waiting):  # parked by a limit (_limit_gate): pending, out of their queue
        w = WAITING_RE.match(name)
        if w:
            pending[w["queue"]] = pending.get(w["queue"], 0) + 1
            add(w["queue"], "pending")
    scheduled = [m for m in map(SCHEDULED_RE.match, fs.scan_names(lay.scheduled)) if m]
    for m in scheduled:
        add(m["queue"], "scheduled")
    deferred = [d for d in map(DEFERRED_RE.match, fs.scan_names(lay.deferred)) if d]
    for d in deferred:
        add(d["queue"], "deferred")
    active = [name for name in fs.scan_names(lay.active) if ACTIVE_RE.match(name)]
    for name in active:
        of = active_queue(name)
        if of is not None:
            add(of, "active")
    for bucket in fs.scan_names(lay.finished):
        if BUCKET_RE.match(bucket):
            path = lay.finished_bucket(bucket)
            present.add(path)
            for key, k in counts.get(path, _finished_bucket).items():
                state, _, q = key.partition(".")
                add(q, state, k)
    counts.finish(present)
    quarantined = len(_quarantine.names(lay))
    waker = core.waker
    total = {state: sum(row[state] for row in by_queue.values()) for state in _FINAL}
    return StoreStatistics(
        pending=sum(pending.values()),
        scheduled=len(scheduled),
        active=len(active),
        fulfilled=total["fulfilled"],
        failed=total["failed"],
        cancelled=total["cancelled"],
        notifications=sum(1 for n in fs.scan_names(lay.notify) if FINAL_RE.match(n)),
        quarantined=quarantined,
        pending_by_queue=pending,
        oldest_pending_age=max(oldest.values(), default=None),
        paused=control.paused(),
        watching=bool(waker and waker.watching),
        by_queue=by_queue,
        oldest_pending_by_queue=oldest,
        deferred=len(deferred),
    )
