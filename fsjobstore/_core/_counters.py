"""Counters every process adds to and anyone reads: ``control/metrics/`` (FORMAT.md, "Counters").

What they count: jobs created (``create``), and how attempts and jobs ended, counted by the
transition that ends them, whoever calls it (a lease's commit, a release, a time-out, a take-over,
``fulfill`` and ``cancel`` by id: the ``ended`` point, ``_hooks``; :meth:`JobStore.count` adds
counts of a user's own), with a histogram of attempt run times and a per-minute tally of jobs
fulfilled and failed per queue. They are what ``/metrics`` and the dashboard show: the work of
every process on the directory, outliving each of them.

No file is shared for writing, and nothing takes a lock (flock exclusion is not relied on across
hosts):

- A process keeps what it counted in memory (:class:`Counters`) and about once a second writes
  it as a new, immutable **delta** file ``d.<pid>.<random>.<n>.json``, then starts from zero.
  A process killed before a write loses at most that second of counts; a power cut may lose
  the deltas of the last seconds too (they are not fsynced: counts are a report, not state).
- A **total** ``t.<SEQ>.json`` holds the sum of every delta folded into it so far, and the names
  of the folded deltas that may still be present. Readers add the newest total and every delta
  it does not name.
- Folding (:func:`fold`), once there are ``FOLD_AT`` deltas: any process writes the next total
  (the newest one plus the deltas it does not name) under the next ``<SEQ>`` with ``link``, which
  exactly one process wins; the winner then removes the deltas it folded and totals older than
  the one it read. A loser changes nothing. A reader whose delta vanished under it (folded by
  then) reads again.

Every file is read with the rules for untrusted ones (no links followed, regular files under a
cap, strict JSON, values checked); one that fails them is passed over, never believed.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import re
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from .._format._values import QUEUE_PATTERN
from .._os import _files as fs
from .._os import _syscalls as sc
from ._hooks import Ended

NAMES = ("created", "fulfilled", "retried", "failed", "cancelled", "timed_out", "lost", "given_back")
"""Counted per queue. ``retried``: attempts failed and run again; ``failed``: jobs failed for good; ``timed_out``,
``lost``: attempts (each also ``retried`` or ``failed``, as its job went on); ``given_back``: jobs released."""

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
          1800.0, 3600.0)
"""Upper bounds (seconds) of the run-time histogram's buckets; one more bucket holds the rest."""

PER_MINUTE = ("fulfilled", "failed")  # what the per-minute tally keeps
_INDEX, _PER_MINUTE_INDEX = ({name: k for k, name in enumerate(names)} for names in (NAMES, PER_MINUTE))
MINUTES_KEPT = 180  # minutes of that tally a total keeps
FOLD_AT = 64  # deltas present before a flush or a read folds them
FLUSH_EVERY = 1.0  # seconds between a process's delta files while it counts
_IDLE_EXIT = 30.0  # a flusher thread with nothing to write for this long ends (made again on the next count)
_CAP = 4 << 20  # bytes: no counts file is read past this
_DATAGRAM = 1024  # bytes: the most one count a child sends up may take (a queue name is at most 64)
_MAX_QUEUES = 10_000  # queues one file may name (a planted file must not make a reader build millions)

DELTA_RE = re.compile(r"d\.(?P<pid>[0-9]{1,10})\.(?P<rand>[0-9a-f]{16})\.(?P<n>[0-9]{1,12})\.json\Z")
TOTAL_RE = re.compile(r"t\.(?P<seq>[0-9]{12})\.json\Z")
_QUEUE_RE = re.compile(rf"{QUEUE_PATTERN}\Z")


@dataclass(frozen=True, slots=True)
class QueueCounters:
    """One queue's counters (:data:`NAMES`), and its attempts' run times: ``durations[i]``
    attempts took at most ``BOUNDS[i]`` seconds and more than the bound before it (the last: more
    than every bound); ``duration_sum`` is their total, in seconds."""

    created: int = 0
    fulfilled: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    lost: int = 0
    given_back: int = 0
    durations: tuple[int, ...] = (0,) * (len(BOUNDS) + 1)
    duration_sum: float = 0.0
    bounds: ClassVar[tuple[float, ...]] = BOUNDS  # the buckets' upper bounds, seconds


@dataclass(frozen=True, slots=True)
class StoreCounters:
    """What :meth:`JobStore.counters` returns: the counters of every queue that counted anything,
    since the store began counting (they never go down, except after a counts file was removed
    or damaged by hand), and ``per_minute``: for each of the last minutes (epoch seconds of its
    start) and queue, the jobs fulfilled and failed in it (``{minute: {queue: (fulfilled,
    failed)}}``)."""

    queues: Mapping[str, QueueCounters]
    per_minute: Mapping[int, Mapping[str, tuple[int, int]]]

    def throughput(self, queue: str | None = None, *, minutes: int = 60,
                   now: float | None = None) -> list[tuple[int, int, int]]:
        """``(minute, fulfilled, failed)`` for each of the last ``minutes`` minutes, oldest
        first, ending with the current one; of one queue, or of all when ``queue`` is None."""
        last = int((time.time() if now is None else now) // 60) * 60
        out = []
        for m in range(last - 60 * (minutes - 1), last + 1, 60):
            row = self.per_minute.get(m, {})
            picked = row.values() if queue is None else [row[queue]] if queue in row else []
            out.append((m, sum(v[0] for v in picked), sum(v[1] for v in picked)))
        return out


# -- the sums ----------------------------------------------------------------------------------------
class _Sums:
    """Counts being added up: per queue, the counters (NAMES' order), the histogram and its sum;
    per minute (epoch seconds) and queue, jobs fulfilled and failed. The files hold the same as
    ``{"v": 1, "queues": {queue: {"c": [...], "h": [...], "s": float}}, "minutes": {"<minute>":
    {queue: [fulfilled, failed]}}}`` (a total adds ``"folded": [delta names]``)."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self.hist: dict[str, list[int]] = {}
        self.sums: dict[str, float] = {}
        self.minutes: dict[int, dict[str, list[int]]] = {}

    def __bool__(self) -> bool:
        return bool(self.counts or self.minutes)

    def _queue(self, queue: str) -> tuple[list[int], list[int]]:
        c = self.counts.get(queue)
        if c is None:
            c = self.counts[queue] = [0] * len(NAMES)
            self.hist[queue] = [0] * (len(BOUNDS) + 1)
            self.sums[queue] = 0.0
        return c, self.hist[queue]

    def add(self, queue: str, name: str, duration: float | None, minute: int) -> None:
        c, h = self._queue(queue)
        c[_INDEX[name]] += 1
        if duration is not None:
            h[bisect.bisect_left(BOUNDS, duration)] += 1  # the first bucket whose bound is >= it
            self.sums[queue] += duration
        k = _PER_MINUTE_INDEX.get(name)
        if k is not None:
            self.minutes.setdefault(minute, {}).setdefault(queue, [0, 0])[k] += 1

    def add_sums(self, other: _Sums) -> None:
        for q, oc in other.counts.items():
            c, h = self._queue(q)
            c[:] = [a + b for a, b in zip(c, oc, strict=True)]
            h[:] = [a + b for a, b in zip(h, other.hist[q], strict=True)]
            self.sums[q] += other.sums[q]
        for m, row in other.minutes.items():
            mine = self.minutes.setdefault(m, {})
            for q, pair in row.items():
                old = mine.setdefault(q, [0, 0])
                old[0] += pair[0]
                old[1] += pair[1]

    def prune(self, now: float) -> None:
        oldest = int(now // 60) * 60 - 60 * MINUTES_KEPT
        for m in [m for m in self.minutes if m < oldest]:
            del self.minutes[m]

    def dump(self, folded: list[str] | None = None) -> bytes:
        doc: dict[str, object] = {
            "v": 1,
            "queues": {q: {"c": c, "h": self.hist[q], "s": self.sums[q]} for q, c in self.counts.items()},
            "minutes": {str(m): row for m, row in self.minutes.items()},
        }
        if folded is not None:
            doc["folded"] = folded
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    def snapshot(self) -> StoreCounters:
        return StoreCounters(
            {q: QueueCounters(**dict(zip(NAMES, c, strict=True)), durations=tuple(self.hist[q]),
                              duration_sum=self.sums[q]) for q, c in self.counts.items()},
            {m: {q: (p[0], p[1]) for q, p in row.items()} for m, row in self.minutes.items()})


def _count(v: object) -> bool:
    return type(v) is int and 0 <= v < 1 << 62


def _checked(raw: bytes) -> tuple[_Sums, list[str]]:
    """A counts file's sums and folded names, or ValueError for anything not exactly right."""
    doc = json.loads(raw, parse_constant=_refuse)
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise ValueError("not a counts file of version 1")
    queues, minutes, folded = doc.get("queues"), doc.get("minutes"), doc.get("folded", [])
    if not (isinstance(queues, dict) and isinstance(minutes, dict) and isinstance(folded, list)):
        raise ValueError("wrong types")
    if len(queues) > _MAX_QUEUES or len(minutes) > 10 * MINUTES_KEPT:
        raise ValueError("too many entries")
    out = _Sums()
    for q, v in queues.items():
        if not (_QUEUE_RE.match(q) and isinstance(v, dict) and set(v) == {"c", "h", "s"}):
            raise ValueError(f"bad queue entry {q!r}")
        c, h, s = v["c"], v["h"], v["s"]
        if not (isinstance(c, list) and len(c) == len(NAMES) and all(map(_count, c))):
            raise ValueError("bad counters")
        if not (isinstance(h, list) and len(h) == len(BOUNDS) + 1 and all(map(_count, h))):
            raise ValueError("bad histogram")
        if not (type(s) in (int, float) and math.isfinite(s) and s >= 0):
            raise ValueError("bad sum")
        out.counts[q], out.hist[q], out.sums[q] = c, h, float(s)
    for m, row in minutes.items():
        if not (m.isdigit() and len(m) <= 12 and isinstance(row, dict) and len(row) <= _MAX_QUEUES):
            raise ValueError("bad minute")
        for q, pair in row.items():
            if not (_QUEUE_RE.match(q) and isinstance(pair, list) and len(pair) == 2 and all(map(_count, pair))):
                raise ValueError("bad minute entry")
        out.minutes[int(m)] = row
    if not all(isinstance(n, str) and DELTA_RE.match(n) for n in folded):
        raise ValueError("bad folded name")
    return out, folded


def _refuse(token: str) -> object:
    raise ValueError(f"{token} is not strict JSON")


# -- reading and folding ----------------------------------------------------------------------------
def _write_exclusive(directory: str, name: str, data: bytes, mode: int, *, replace: bool) -> bool:
    """Write ``data`` as ``directory/name``, whole or not at all: through a dot-named temp file,
    renamed (``replace``) or linked (exclusive: False if the name exists) into place."""
    tmp = f"{directory}/.{name}.{os.getpid()}.{secrets.token_hex(4)}"
    fs.write_new(tmp, data, durable=False, mode=mode)
    try:
        if replace:
            sc.rename(tmp, f"{directory}/{name}")
            return True
        try:
            sc.link(tmp, f"{directory}/{name}")
            return True
        except FileExistsError:
            return False
    finally:
        fs.unlink_quietly(tmp)  # after a rename: already gone


def _read(path: str) -> tuple[_Sums, list[str]] | None:
    """A counts file's content; None if it is gone; ValueError if it is not to be believed."""
    try:
        return _checked(fs.read_regular(path, _CAP))
    except FileNotFoundError:
        return None
    except fs.Unreadable as exc:
        raise ValueError(str(exc)) from None


def _newest_total(directory: str, names: list[str]) -> tuple[_Sums, list[str], int] | None:
    """The newest believable total (a damaged one is passed over for the one before it):
    (its sums, its folded names, its <SEQ>); an empty one at <SEQ> 0 when there is none.
    None if the newest was removed while we looked (a fold is under way: look again)."""
    for t in sorted((int(m["seq"]) for n in names if (m := TOTAL_RE.match(n))), reverse=True):
        try:
            got = _read(f"{directory}/t.{t:012d}.json")
        except ValueError:
            continue
        if got is None:
            return None
        return got[0], got[1], t
    return _Sums(), [], 0


def read(directory: str, *, tries: int = 5) -> _Sums:
    """The sums of the newest total and of every delta it does not name."""
    sums = _Sums()
    for _ in range(tries):
        names = fs.scan_names(directory)
        total = _newest_total(directory, names)
        if total is None:
            continue
        sums, folded = total[0], set(total[1])
        for n in names:
            if DELTA_RE.match(n) and n not in folded:
                try:
                    got = _read(f"{directory}/{n}")
                except ValueError:
                    continue  # not believed
                if got is None:
                    break  # folded into a newer total and removed meanwhile: read again
                sums.add_sums(got[0])
        else:
            return sums
    return sums  # still moving after a few tries: what the last one added up


def fold(directory: str, mode: int, now: float) -> bool:
    """Write the next total (module docstring); True if this process wrote it."""
    names = fs.scan_names(directory)
    total = _newest_total(directory, names)
    if total is None:
        return False  # another fold is under way
    base, folded, seq = total
    totals = [int(m["seq"]) for n in names if (m := TOTAL_RE.match(n))]
    present = set(names)
    carried = [n for n in folded if n in present]  # folded earlier, not removed yet (a crash)
    added = []
    for n in names:
        if DELTA_RE.match(n) and n not in folded:
            try:
                got = _read(f"{directory}/{n}")
            except ValueError:
                continue  # not believed: never folded, left for a person to look at
            if got is None:
                return False  # another fold took it
            base.add_sums(got[0])
            added.append(n)
    if not added and not carried:
        return False
    base.prune(now)
    next_seq = max([seq, *totals]) + 1
    if not _write_exclusive(directory, f"t.{next_seq:012d}.json", base.dump(carried + added), mode, replace=False):
        return False  # RACE: another process wrote this <SEQ> first; it folded what we read, or will
    for n in carried + added:
        fs.unlink_quietly(f"{directory}/{n}")
    for t in totals:
        if t < seq:  # keep the one we read: a reader may be on its way to it
            fs.unlink_quietly(f"{directory}/t.{t:012d}.json")
    for n in names:  # temp files of writers killed between write and rename, an hour old
        if n.startswith("."):
            with contextlib.suppress(OSError):
                if now - sc.lstat(f"{directory}/{n}").st_mtime > 3600:
                    fs.unlink_quietly(f"{directory}/{n}")
    return True


# -- counting in one process --------------------------------------------------------------------------
class Counters:
    """What this process counted and has not written yet, and the thread that writes it.

    ``add`` is a few dict operations under a lock; a daemon thread, made on the first count
    after it was idle, writes a delta every ``FLUSH_EVERY`` s while there is something to write,
    and ends after ``_IDLE_EXIT`` s with nothing. ``flush`` writes now (``JobStore.close``).

    A process that forks (a worker's supervisor, a user's multiprocessing) first makes a socket
    pair: its forked children send each count up it at once, as one datagram, and the parent's
    thread adds them to its own. So a child killed with SIGKILL (at its time limit, or on a
    cancel) has lost nothing it counted. A child whose parent is gone or far behind (its queue
    full) counts in its own deltas instead."""

    def __init__(self, directory: str, make_dir: Callable[[], None], mode: int,
                 wall: Callable[[], float]) -> None:
        self._dir = directory
        self._make_dir = make_dir
        self._mode = mode
        self._wall = wall
        # (ours, the children's): a datagram socket pair made before this process first forks.
        self._from_children: tuple[socket.socket, socket.socket] | None = None
        self._to_parent: socket.socket | None = None
        self._pid = os.getpid()
        self.after_fork()

    def after_fork(self) -> None:
        """A forked child starts from nothing, sending what it counts to its parent (who writes
        what it had counted itself)."""
        self._lock = threading.Lock()
        self._sums = _Sums()
        self._thread: threading.Thread | None = None
        self._stopped = False
        if self._from_children is not None and self._pid != os.getpid():
            # A child of a child sends to its own parent, not to the one its parent sent to.
            parents, theirs = self._from_children
            for sock in (parents, self._to_parent):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
            self._from_children, self._to_parent = None, theirs
        self._pid = os.getpid()
        self._rand = secrets.token_hex(8)
        self._n = 0
        self._flushes = 0

    def before_fork(self) -> None:
        """The socket pair the children of this process send their counts up (once, before its
        first fork): datagrams, so each count arrives whole or not at all, and a send to a parent
        that closed its end fails (ECONNREFUSED) rather than raise SIGPIPE, which a program may
        have set to kill."""
        if self._from_children is None and not self._stopped:
            with contextlib.suppress(OSError):
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                ours.setblocking(False)
                self._from_children = (ours, theirs)

    def after_fork_in_parent(self) -> None:
        """Its thread now also reads what the children send, for as long as the store is open."""
        with self._lock:
            self._start()

    def add(self, queue: str, name: str, duration: float | None = None) -> None:
        self._add(queue, name, duration, int(self._wall() // 60) * 60)

    def _add(self, queue: str, name: str, duration: float | None, minute: int) -> None:
        """Count, in the minute ``minute``: up to the parent if this is a forked child, else here."""
        if duration is not None and not (math.isfinite(duration) and duration >= 0):
            duration = None
        if self._to_parent is not None and self._send(queue, name, duration, minute):
            return
        with self._lock:
            self._sums.add(queue, name, duration, minute)
            self._start()

    def ended(self, event: Ended) -> None:
        """The ``ended`` point of the transitions (``_hooks``): count what a commit did."""
        self.add(event.queue, event.what, event.duration)

    def _send(self, queue: str, name: str, duration: float | None, minute: int) -> bool:
        line = json.dumps([queue, name, duration, minute]).encode()
        to_parent = self._to_parent
        if to_parent is None or len(line) > _DATAGRAM:
            return False
        try:
            return to_parent.send(line, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL) == len(line)
        except BlockingIOError:
            return False  # the parent is far behind: counted here, this time
        except OSError:
            self._to_parent = None  # the parent is gone (ECONNREFUSED): count here from now on
            return False

    def _start(self) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._run, name="fsjobstore-counters", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            children = self._from_children
            if children is None:
                time.sleep(FLUSH_EVERY)
            else:
                with contextlib.suppress(OSError, ValueError):
                    select.select([children[0]], [], [], FLUSH_EVERY)
                self._drain()
            with self._lock:
                if self._stopped or self._pid != os.getpid():
                    self._thread = None
                    return
                dirty = bool(self._sums)
                if not dirty and self._from_children is None and time.monotonic() - idle_since > _IDLE_EXIT:
                    self._thread = None
                    return
            if dirty:
                idle_since = time.monotonic()
                with contextlib.suppress(OSError):  # a report: tried again in a second
                    self.flush()

    def _drain(self) -> None:
        """Add what the children sent (each count checked: a child is ours, but a count is data)."""
        children = self._from_children
        if children is None or self._pid != os.getpid():
            return
        while True:
            try:
                datagram = children[0].recv(_DATAGRAM + 1)
            except OSError:  # BlockingIOError: nothing more now
                return
            try:
                queue, name, duration, minute = json.loads(datagram)
            except (ValueError, TypeError):
                continue
            timed = duration is None or (isinstance(duration, int | float) and not isinstance(duration, bool))
            if (name not in NAMES or not isinstance(queue, str) or not _QUEUE_RE.match(queue)
                    or not isinstance(minute, int) or not timed):
                continue
            self._add(queue, name, duration, minute)  # (a child of a child: on up, to our parent)

    def flush(self) -> None:
        """Write what was counted since the last write as a new delta (nothing if nothing was)."""
        self._drain()
        with self._lock:
            if not self._sums or self._pid != os.getpid():
                return
            sums, self._sums = self._sums, _Sums()
            self._n += 1
            name = f"d.{self._pid}.{self._rand}.{self._n}.json"
            self._flushes += 1
            check_fold = self._flushes % 16 == 1
        try:
            try:
                _write_exclusive(self._dir, name, sums.dump(), self._mode, replace=True)
            except FileNotFoundError:
                self._make_dir()
                _write_exclusive(self._dir, name, sums.dump(), self._mode, replace=True)
        except BaseException:
            with self._lock:  # not written: counted again, with what came since
                self._sums.add_sums(sums)
            raise
        if check_fold and sum(1 for n in fs.scan_names(self._dir) if n.startswith("d.")) >= FOLD_AT:
            with contextlib.suppress(OSError):
                fold(self._dir, self._mode, self._wall())

    def close(self) -> None:
        """Write what is left (what the children sent too) and stop the thread (``JobStore.close``)."""
        with self._lock:
            self._stopped = True
        with contextlib.suppress(OSError):
            self.flush()
        children, self._from_children = self._from_children, None
        to_parent, self._to_parent = self._to_parent, None
        for sock in (*(children or ()), to_parent):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


def read_counters(directory: str, mode: int, now: float) -> StoreCounters:
    """Every process's counts as one snapshot; folds first when many deltas wait."""
    if sum(1 for n in fs.scan_names(directory) if n.startswith("d.")) >= FOLD_AT:
        with contextlib.suppress(OSError):
            fold(directory, mode, now)
    return read(directory).snapshot()
