"""Retention: removing final jobs whose time is up, a bounded batch at a time.

It walks the finished index (``finished/<B>/<FIN>.<EXP>.<state>.<queue>.<id>``, FORMAT.md) from
its oldest bucket, so it never lists the final directories, and removes each job whose ``<EXP>``
has passed with ``_removal.remove_job``. A job whose notification is still due is kept: a later
pass removes it once its targets have heard. An entry whose job is not at ``<state>/<id>.json``
with that ``finished_at`` is stale (its commit failed after it, the job was retried or removed)
and is unlinked; an emptied bucket other than the current hour's is removed.

Who runs it: the retention thread of a store that runs maintenance (``Heart``, a store that
pulls), and ``JobStore.recover()`` (one pass). One remover at a time per host: a pass takes
``control/retention.lock`` (flock, non-blocking) and skips if another process holds it. Two
removers on different hosts never remove one job twice: each removal is fenced by a rename.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass

from . import _fsops as fs
from . import _syscalls as sc
from ._layout import BUCKET_RE, FINISHED_RE, bucket_field, micros
from ._removal import notification_due, remove_job
from ._shared import Core

log = logging.getLogger("fsjobstore")

BATCH = 256  # jobs removed by one pass at most...
BUDGET = 0.05  # ... or seconds spent, whichever comes first
# An entry is made just before its job's publishing rename: one whose job is missing is judged
# stale only once it is this old, so a commit between the two is never robbed of its entry.
STALE_AFTER = 120.0
_AT_LEAST = 16  # entries one pass considers whatever its time budget


@dataclass(frozen=True, slots=True)
class PassResult:
    removed: int  # jobs removed
    more: bool  # stopped by its bound with expired jobs left: run again soon


class Retention:
    """The retention passes of one open store (with what it learnt of each bucket)."""

    def __init__(self, core: Core) -> None:
        self._core = core
        # bucket -> (its signature when listed, the earliest <EXP> left in it): a settled bucket
        # that did not change is not listed again before that time.
        self._seen: dict[str, tuple[tuple[int, int, int], int]] = {}
        self._left: dict[str, list[str]] = {}  # bucket -> names a pass stopped before

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
            signature, settled = fs.dir_signature(bdir)
            seen = self._seen.get(bucket)
            if seen is not None and seen[0] == signature and seen[1] > now and bucket not in self._left:
                continue
            # The names a pass cut short did not reach are taken up where it stopped, so a large
            # bucket is listed once per walk through it, not once per pass.
            names = self._left.pop(bucket, None) or sorted(fs.scan_names(bdir))
            earliest = none_left = 10**18
            for i, name in enumerate(names):
                # At least a few entries per pass whatever the clock says: listing a large bucket
                # may use the whole budget, and a pass must still make progress.
                if removed >= batch or (i >= _AT_LEAST and core.clock() >= stop_at):
                    self._left[bucket] = names[i:]
                    return PassResult(removed, True)
                left = self._consider(bdir, name, now)
                if left is True:
                    removed += 1
                elif isinstance(left, int):
                    earliest = min(earliest, left)
            if earliest == none_left and bucket != current:
                with contextlib.suppress(OSError):
                    sc.rmdir(bdir)  # ENOTEMPTY: an entry arrived meanwhile (or a kept one): fine
                self._seen.pop(bucket, None)
            elif settled:
                self._seen[bucket] = (fs.dir_signature(bdir)[0], earliest)
        return PassResult(removed, False)

    def _consider(self, bdir: str, name: str, now: int) -> bool | int | None:
        """Remove the job of one entry if its time is up: True if removed; the entry's <EXP>
        (or now, to look again next pass) if it stays; None if the entry is gone."""
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
        if remove_job(core, path, job_id, drop_targets=False, entry=entry):
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
