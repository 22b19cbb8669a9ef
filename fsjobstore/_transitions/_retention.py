"""Retention: removing final jobs whose time is up, a bounded batch at a time.

It walks the finished index (``finished/<B>/<FIN>.<EXP>.<state>.<queue>.<id>``, FORMAT.md) from
its oldest bucket, so it never lists the final directories, and removes each job whose ``<EXP>``
has passed with ``_removal.remove_job``. A job whose notification is still due is kept: a later
pass removes it once its targets have heard. An entry whose job is not at ``<state>/<id>.json``
with that ``finished_at`` is stale (its commit failed after it, the job was retried or removed)
and is unlinked; an emptied bucket other than the current hour's is removed.

Who runs it: the retention thread of a store that runs maintenance (``Background``, a store that
pulls), and ``JobStore.recover()`` (one pass). One remover at a time per host: a pass takes
``control/retention.lock`` (flock, non-blocking) and skips if another process holds it. Two
removers on different hosts never remove one job twice: each removal is fenced by a rename.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass, field

from .._core._core import Core
from .._core._hooks import Hooks
from .._format._layout import BUCKET_RE, FINISHED_RE, bucket_field, micros
from .._os import _files as fs
from .._os import _syscalls as sc
from ._removal import notification_due, remove_job

log = logging.getLogger("fsjobstore")

BATCH = 256  # jobs removed by one pass at most...
BUDGET = 0.05  # ... or seconds spent, whichever comes first
# An entry is made just before its job's publishing rename: one whose job is missing is judged
# stale only once it is this old, so a commit between the two is never robbed of its entry.
STALE_AFTER = 120.0
_AT_LEAST = 16  # entries one pass considers whatever its time budget
RELIST_AFTER = 1.0  # seconds before a changed bucket with nothing due is listed again...
RELIST_SHARE = 50  # ... or this many times what its last listing took, if longer
FULL_WALK = 60.0  # seconds between whole walks of a changing bucket with nothing due
_NONE_LEFT = 10**18  # "earliest <EXP> kept": nothing kept


@dataclass(frozen=True, slots=True)
class _Listing:
    """One listing of a bucket: what a walk through it, and the next pass, know of it."""

    signature: tuple[int, int, int]  # the bucket's stat before the listing
    settled: bool  # whether that stat had settled (_files.SETTLE)
    at: float  # core.clock() of the listing
    cost: float  # seconds it took
    whole_at: float  # core.clock() of the last listing walked whole (not only its new names)


@dataclass(frozen=True, slots=True)
class _Walked:
    """What the last walk of a bucket found."""

    listing: _Listing
    earliest: int  # the earliest <EXP> of the entries it kept until later (_NONE_LEFT: none)
    again: tuple[str, ...]  # entries that were due but stayed: looked at again each pass
    top: str  # the largest name walked


@dataclass(slots=True)
class _Walk:
    """A walk through a bucket's names in progress (kept between passes if cut short)."""

    names: list[str]
    earliest: int
    top: str
    listing: _Listing
    pos: int = 0
    again: list[str] = field(default_factory=list)

    def done(self) -> _Walked:
        return _Walked(self.listing, self.earliest, tuple(self.again), self.top)


@dataclass(frozen=True, slots=True)
class PassResult:
    removed: int  # jobs removed
    more: bool  # stopped by its bound with expired jobs left: run again soon


class Retention:
    """The retention passes of one open store (with what it learnt of each bucket)."""

    def __init__(self, core: Core, hooks: Hooks) -> None:
        self._core = core
        self._hooks = hooks
        self._walked: dict[str, _Walked] = {}  # bucket -> what its last whole walk found
        self._left: dict[str, _Walk] = {}  # bucket -> a walk a pass stopped in

    def run_pass(self, *, batch: int = BATCH, budget: float = BUDGET) -> PassResult:
        core = self._core
        lock = os.path.join(core.layout.control, "retention.lock")
        try:
            fd = fs.open_lock(lock, core.tree.perms)
        except OSError as exc:
            log.warning("retention skipped: cannot open %s: %s", lock, exc)
            return PassResult(0, False)
        try:
            if not sc.try_lock(fd):
                return PassResult(0, False)  # another process of this host is removing
            return self._locked_pass(batch, budget)
        finally:
            sc.close_read(fd)  # releases the flock

    def _locked_pass(self, batch: int, budget: float) -> PassResult:
        core, lay = self._core, self._core.layout
        now = micros(core.wall())
        current = bucket_field(now)
        stop_at = core.clock() + budget
        removed = 0
        for bucket in sorted(fs.scan_names(lay.finished)):
            bdir = lay.finished_bucket(bucket)
            if not BUCKET_RE.match(bucket):
                core.tree.quarantine(bdir, "unrecognised name in finished")
                continue
            if bucket > current:
                break  # finished in a later hour than now (a clock set back): nothing due there
            # The names a pass cut short did not reach are taken up where it stopped, so a large
            # bucket is listed once per walk through it, not once per pass.
            walk = self._left.pop(bucket, None) or self._start_walk(bdir, bucket, now)
            if walk is None:
                continue
            names = walk.names
            for i in range(walk.pos, len(names)):
                # At least a few entries per pass whatever the clock says: listing a large bucket
                # may use the whole budget, and a pass must still make progress.
                if removed >= batch or (i - walk.pos >= _AT_LEAST and core.clock() >= stop_at):
                    walk.pos = i
                    self._left[bucket] = walk
                    return PassResult(removed, True)
                left = self._consider(bdir, names[i], now)
                if left is True:
                    removed += 1
                elif left is not None and left <= now:
                    walk.again.append(names[i])  # due, but it stays for now
                elif left is not None:
                    walk.earliest = min(walk.earliest, left)
            if walk.earliest == _NONE_LEFT and not walk.again and bucket != current:
                with contextlib.suppress(OSError):
                    sc.rmdir(bdir)  # ENOTEMPTY: an entry arrived meanwhile (or a kept one): fine
                self._walked.pop(bucket, None)
            else:
                self._walked[bucket] = walk.done()
        return PassResult(removed, False)

    def _start_walk(self, bdir: str, bucket: str, now: int) -> _Walk | None:
        """The names of ``bucket`` this pass must look at, or None if none.

        A bucket whose entries are all kept until later is not walked again while it is
        unchanged, and, while it changes (the current hour's, as jobs finish), only its new
        names are walked (those after the largest one walked: names begin with their finishing
        time), with the entries that were due but had to stay (a target still waiting). Its
        listing is not repeated more often than once per RELIST_SHARE times what it last cost.
        Without this, a worker that had finished 100,000 kept jobs in the current hour read
        and parsed all their names every second. A name that arrives out of order (a finishing
        time older than one already walked: another host's clock, a slow commit) is looked at
        by the next whole walk: once something is due, or FULL_WALK after the last one (so is
        every new name after one a group member planted with a finishing time far ahead: its
        removal is late by a minute at most)."""
        signature, settled = fs.dir_signature(bdir)  # before the listing it vouches for
        last = self._walked.get(bucket)
        clock = self._core.clock()
        if last is not None and last.earliest > now:
            was = last.listing
            unchanged = settled and was.settled and was.signature == signature
            if unchanged or clock - was.whole_at < FULL_WALK:
                if unchanged or clock - was.at < max(RELIST_AFTER, RELIST_SHARE * was.cost):
                    return _Walk(list(last.again), last.earliest, last.top, was) if last.again else None
                listed = fs.scan_names(bdir)
                listing = _Listing(signature, settled, clock, self._core.clock() - clock, was.whole_at)
                tail = [n for n in listed if n > last.top]
                return _Walk([*last.again, *tail], last.earliest, _top(tail, last.top), listing)
        # Not sorted: sorting 100,000 names holds the GIL for ~30 ms in one call, a stall of
        # every claim of this process's workers; a walk's order does not matter.
        names = fs.scan_names(bdir)
        return _Walk(names, _NONE_LEFT, _top(names, ""), _Listing(signature, settled, clock,
                                                                   self._core.clock() - clock, clock))

    def _consider(self, bdir: str, name: str, now: int) -> bool | int | None:
        """Remove the job of one entry if its time is up: True if removed; the entry's <EXP>
        (or now, to look again next pass) if it stays; None if the entry is gone."""
        # An entry kept until later, told by its fixed-width <EXP> alone: 0.6 us a name instead
        # of 2.4 with the grammar's regex (timeit), and a process's first walk of a
        # bucket of 100,000 entries looks at each.
        # (A name that only looks like an entry here is matched when its <EXP> comes.)
        exp_field = name[18:35]
        if len(name) > 36 and name[17] == "." and name[35] == "." and exp_field.isdigit():
            kept_until = int(exp_field)
            if kept_until > now:
                return kept_until
        core = self._core
        entry = os.path.join(bdir, name)
        m = FINISHED_RE.match(name)
        if not m:
            core.tree.quarantine(entry, "unrecognised name in a bucket of finished")
            return None
        fin, exp, job_id = int(m["fin"]), int(m["exp"]), m["id"]
        if exp > now:
            return exp
        path = core.layout.final_path(m["state"], job_id)
        try:
            record = core.tree.read_parsed(path).record
        except FileNotFoundError:
            if now - fin < STALE_AFTER * 1_000_000:
                return now  # RACE: its job may be between this entry and its rename
            fs.unlink(entry)
            return None
        except (fs.Unreadable, ValueError) as exc:
            log.warning("retention keeps job %s: its file %s", job_id, exc)
            return now
        except OSError as exc:
            if exc.errno != errno.ESTALE:
                raise
            # Another host removed or moved it while we read it (a stale handle on a network
            # filesystem, after the read's own retries): look again next pass.
            return now
        if record.finished_at is None or micros(record.finished_at) != fin:
            if later_life(record.finished_at, fin):
                fs.unlink(entry)  # an earlier life's entry: the job was retried, or its id used again
                return None
            # A read that lags behind the file (a network filesystem's cache served its content
            # from before the result line: seen on GlusterFS under chaos), or an entry made by a
            # commit that a take-over finished first, at an earlier time: never a reason to
            # unlink. Looked at again; it goes with its job.
            return now
        if notification_due(core, job_id):
            return now  # kept until its targets have heard
        if remove_job(core, self._hooks, path, job_id, drop_targets=False, entry=entry):
            return True
        return now


def later_life(finished_at: float | None, fin: int) -> bool:
    """Whether a final file that says ``finished_at`` makes an index entry of ``fin`` stale:
    only a file that finished *later* does (the job was retried and finished again, or a commit
    retried after a fault). A file that says less (no finish, an earlier one) may be a read that
    lags behind on a network filesystem, and is never taken as proof."""
    return finished_at is not None and micros(finished_at) > fin


def index_strays(core: Core) -> int:
    """Give every final job without a finished-index entry its entry; returns how many.

    Only an explicit, deep ``recover()`` does this (it lists the final directories and the
    whole index): a final commit always writes its entry first, so a job without one was committed by
    a process of an older fsjobstore (format 2) that was still running when the store was
    upgraded, and would otherwise never be listed, purged or removed by retention."""
    lay = core.layout
    indexed: set[tuple[str, str]] = set()
    for bucket in fs.scan_names(lay.finished):
        if BUCKET_RE.match(bucket):
            for name in fs.scan_names(lay.finished_bucket(bucket)):
                m = FINISHED_RE.match(name)
                if m:
                    indexed.add((m["state"], m["id"]))
    added = core.tree.index_unindexed(indexed)
    if added:
        log.warning("indexed %d final job(s) that had no finished-index entry (committed by an older "
                    "fsjobstore after the store was upgraded?)", added)
    return added


def _top(names: list[str], floor: str) -> str:
    """The largest of ``names`` that starts like an entry (a digit), or ``floor``: junk planted to
    sort last is quarantined by the walk, and must not hide later names until the next whole one."""
    return max((n for n in names if n[:1].isdigit()), default=floor)
