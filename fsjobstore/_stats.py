"""Store statistics: the counts ``JobStore.statistics()`` returns.

Pending and final jobs are counted per bucket (``pending/<queue>/<P>.<S>/`` and ``finished/<B>/``),
and a bucket whose stat did not change since this store counted it is not listed again
(:class:`DirCounts`): the cost grows with the buckets that changed, not with the backlog. Final
jobs are counted from their finished-index entries (FORMAT.md says how exact that is)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar, cast

from . import _buckets
from . import _fsops as fs
from . import _syscalls as sc
from ._control import Control
from ._layout import BUCKET_RE, FINISHED_RE, PENDING_RE
from ._shared import Core

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


class DirCounts:
    """What was counted in each bucket directory, kept while its stat says it did not change.

    A bucket of a past second (pending) or hour (the finished index) rarely changes once it
    settles, so ``statistics()`` lists only the buckets that changed: those being drained,
    filled or purged. Trusted only for a directory that had settled (``_fsops.SETTLE``) when it
    was listed, so a change in the same clock tick as the listing is never hidden behind an
    unchanged mtime. Kept in ``control/counts.json`` too (a hint: replaced whole, never
    fsynced, ignored when unreadable), so a fresh process (``fsjobstore status``) starts from
    what others counted. Thread-safe enough: a lost update is a recount."""

    def __init__(self, control: str, file_mode: int) -> None:
        self._path = os.path.join(control, COUNTS)
        self._cut = len(os.path.dirname(control)) + 1  # keys are paths below the store's root
        self._file_mode = file_mode
        self._seen: dict[str, tuple[tuple[int, int, int], object]] | None = None
        self._changed = False

    def get(self, path: str, count: Callable[[list[str]], _V]) -> _V:
        seen = self._load()
        sig, settled = fs.dir_signature(path)  # before the listing it vouches for
        key = path[self._cut:]
        hit = seen.get(key)
        if hit is not None and hit[0] == sig:
            return cast(_V, hit[1])
        value = count(_buckets.names_in(path))
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
                    if isinstance(key, str) and all(type(v) is int for v in (m, c, ino)):
                        self._seen[key] = ((m, c, ino), value)
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
        doc = {"buckets": {k: [*sig, value] for k, (sig, value) in seen.items()}}
        tmp = f"{os.path.dirname(self._path)}/.{COUNTS}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fs.write_new(tmp, json.dumps(doc, separators=(",", ":")).encode(), durable=False, mode=self._file_mode)
            sc.rename(tmp, self._path)
        except OSError:
            fs.unlink_quietly(tmp)  # a hint: the next call counts again (read-only control/, full disk)


COUNTS = "counts.json"
_COUNTS_CAP = 64 << 20


def _pending_bucket(names: list[str]) -> tuple[int, int | None]:
    seqs = [int(n[8:28]) for n in names if PENDING_RE.match(n)]
    return len(seqs), min(seqs, default=None)


def _finished_bucket(names: list[str]) -> dict[str, int]:
    by_state = {"fulfilled": 0, "failed": 0, "cancelled": 0}
    for name in names:
        m = FINISHED_RE.match(name)
        if m:
            by_state[m["state"]] += 1
    return by_state


def statistics(core: Core, control: Control, counts: DirCounts) -> StoreStatistics:
    """Count each state: pending and final jobs bucket by bucket (a bucket that did not change
    since this store last counted it is not listed again), the rest by listing its directory."""
    lay = core.layout
    by_queue: dict[str, int] = {}
    oldest: int | None = None
    present: set[str] = set()
    for q in fs.scan_names(lay.pending):
        qdir = lay.pending_dir(q)
        buckets, others = _buckets.list_queue(qdir)
        n, first = _pending_bucket(others)  # jobs written flat by an older store, not moved yet
        for bucket in buckets:
            path = f"{qdir}/{bucket}"
            present.add(path)
            k, low = counts.get(path, _pending_bucket)
            n += k
            if low is not None and (first is None or low < first):
                first = low
        by_queue[q] = n
        if first is not None and (oldest is None or first < oldest):
            oldest = first
    final = {"fulfilled": 0, "failed": 0, "cancelled": 0}
    for bucket in fs.scan_names(lay.finished):
        if BUCKET_RE.match(bucket):
            path = lay.finished_bucket(bucket)
            present.add(path)
            for state, k in counts.get(path, _finished_bucket).items():
                final[state] += k
    counts.finish(present)
    quarantined = sum(1 for n in fs.scan_names(lay.quarantine) if not n.endswith(".reason"))
    waker = core.waker
    return StoreStatistics(
        pending=sum(by_queue.values()),
        scheduled=len(fs.scan_names(lay.scheduled)),
        active=len(fs.scan_names(lay.active)),
        fulfilled=final["fulfilled"],
        failed=final["failed"],
        cancelled=final["cancelled"],
        notifications=len(fs.scan_names(lay.notify)),
        quarantined=quarantined,
        pending_by_queue=by_queue,
        oldest_pending_age=None if oldest is None else max(0.0, core.wall() - oldest / 1e9),
        paused=control.paused(),
        watching=bool(waker and waker.watching),
    )
