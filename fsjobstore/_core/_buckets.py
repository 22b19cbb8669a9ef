"""Pending buckets: a queue's jobs in ``pending/<queue>/<P>.<S>/``, one directory per priority
and second of creation (FORMAT.md, "Tree").

Why: a claimer, a listing or a lookup by id reads one bucket, not the whole backlog. With a
million jobs in one directory, a worker's first listing took seconds and 150 MB, and an emptied
ext4 directory never shrinks (a drained queue of 20,000 stayed 2.2 MB). Bucket names sort as their
jobs run (priority, then second), and every name in a bucket sorts after every name of the buckets
before it, so reading buckets in name order reads the queue in run order.

An emptied bucket is removed (rmdir) by whoever lists it empty once its second is ``LINGER``
seconds past and the bucket itself did not change for ``_files.SETTLE`` seconds: creates go to
the current second's bucket, so only a job put back into an old second (a release, a retry, a
promotion, a take-over) can meet a bucket removed under it, and it makes it again
(:meth:`Tree.into_pending`); the bucket it made is new, so nobody removes it before its rename.
(Without that rule, workers polling an empty queue can remove such a bucket again each time it is
made, and a take-over that takes the failure for another's success drops the job: the chaos test,
tests/test_chaos.py, finds that.)

On a network filesystem (a store that does not trust locks) an emptied bucket is removed only once
it has not changed for ``NETWORK_KEEP`` seconds. A replicated volume's server that was down while
a job left a bucket still holds the job's name there until it heals; a bucket removed and made
again under the same name before then had the heal bring that job back, to run a second time (the
three-host chaos, tests/distfs/chaos_three_hosts.py: 3-51 jobs committed twice per run with
buckets removed after 2 s, none with them kept). A bucket kept empty costs a claimer no call while
the queue's marker says no older bucket changed (``_pending.QueueIndex``).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .._format._layout import PENDING_BUCKET_RE, PENDING_MARKER, PENDING_RE, bucket_of_name
from .._os import _files as fs
from .._os import _syscalls as sc

log = logging.getLogger("fsjobstore")

LINGER = 2.0  # seconds after its second ends before an emptied bucket is removed
# Seconds an emptied bucket stays unchanged before it is removed on a network filesystem: longer
# than a server's outage and its heal (the bed's heals took 23-129 s in the chaos, 182 and 281 s
# under the bench's full drain). See the module docstring.
NETWORK_KEEP = 600.0
# A change to a bucket whose second ended more than this many seconds ago (a job put back, a
# claim or purge by id) sets the queue's marker (Tree.note_bucket_change): statistics() trusts
# its counts of such buckets while the marker stays (_stats).
FRESH_FOR = 1.0


def list_queue(qdir: str) -> tuple[list[str], list[str]]:
    """A queue directory's buckets in run order, and its other names (dot names left out)."""
    buckets: list[str] = []
    others: list[str] = []
    try:
        names = fs.scan_names(qdir)
    except NotADirectoryError:
        names = []  # a file planted where a queue belongs: the next pull quarantines it
    for name in names:
        if PENDING_BUCKET_RE.match(name):
            buckets.append(name)
        elif not name.startswith("."):
            others.append(name)
    buckets.sort()
    return buckets, others


def names_in(bdir: str) -> list[str]:
    """A bucket's names in order (the order its jobs run in), dot names left out; [] if it is
    gone (or not a directory).

    Sorted first, then the dot names cut out as the one run they form ('.' sorts just before
    '/'): at ~13,000 names a bucket (a second of two busy creators), testing every name cost
    more than the sort, and a claimer's refill needs them sorted anyway (PERFORMANCE.md,
    "A deep backlog")."""
    try:
        names = fs.scan_names(bdir)
    except NotADirectoryError:
        return []
    names.sort()
    lo = bisect.bisect_left(names, ".")
    if lo < len(names) and names[lo][0] == ".":
        del names[lo:bisect.bisect_left(names, "/", lo)]
    return names


def is_old(bucket: str, now: float | None = None) -> bool:
    """Whether ``bucket``'s second ended ``LINGER`` seconds ago (wall clock: creators use theirs)."""
    return int(bucket[8:]) + 1 + LINGER <= (time.time() if now is None else now)


def remove_if_spent(bdir: str, bucket: str, sig: tuple[tuple[int, int, int], bool], now: float | None = None, *,
                    keep: float = 0.0) -> bool:
    """Remove a bucket listed empty if it may go (the module's docstring): its second ended
    ``LINGER`` s ago and its own stat had settled (``sig``: ``_files.dir_signature``, taken before
    the listing that found it empty), so a bucket made again a moment ago lives until the job put
    back into it lands; and, with ``keep`` (a network filesystem: ``NETWORK_KEEP``), nothing
    changed it for that long. True if it was removed."""
    (mtime_ns, _, _), settled = sig
    now = time.time() if now is None else now
    return (settled and is_old(bucket, now) and (not keep or now - mtime_ns / 1e9 >= keep)
            and remove_if_empty(bdir))


def remove_if_empty(bdir: str) -> bool:
    """rmdir an emptied bucket; False if it holds something (ENOTEMPTY: a job arrived) or is gone."""
    try:
        sc.rmdir(bdir)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno in (39, 66):  # ENOTEMPTY (Linux), ENOTEMPTY (BSD): a job arrived meanwhile
            return False
        raise
    return True


def mark_changed(bucket: str, file_mode: int, quarantine: Callable[[str, str], bool]) -> None:
    """Say that pending bucket ``bucket`` (its path) changed, if its second ended more than
    ``FRESH_FOR`` s ago, by setting its queue's marker file (``.changed``) to now:
    ``statistics()`` stats only the buckets that creates and claims change, and trusts the
    rest while the marker stays (``_stats``). A create into the current second costs one clock
    read here. Never raises: the change is made; a marker that could not be set only leaves the
    count of that bucket behind until the next full count (``_stats.FULL_EVERY``)."""
    second = bucket[-11:]  # <P>.<S>: the second, 11 digits (every create passes here: no os.path)
    if not second.isdigit() or time.time() - int(second) - 1 <= FRESH_FOR:
        return
    marker = f"{os.path.dirname(bucket)}/{PENDING_MARKER}"
    try:
        sc.touch(marker)
    except FileNotFoundError:
        with contextlib.suppress(OSError):  # (FileNotFoundError: the queue went meanwhile)
            sc.mknod(marker, file_mode)  # made now: as good as set
    except (PermissionError, NotADirectoryError) as exc:
        # Not ours to set: a file a member planted, of another owner. Moved aside, made anew.
        with contextlib.suppress(OSError):
            if quarantine(marker, f"a queue's marker that cannot be set ({exc})"):
                sc.mknod(marker, file_mode)
    except OSError as exc:
        log.debug("could not set %s (%s): the next full count corrects the counts", marker, exc)


def walk(qdir: str, low: str = "") -> Iterator[tuple[str, str]]:
    """``(bucket, name)`` of each pending job of a queue in run order, names after ``low`` (a
    pending file name) only. Lists one bucket at a time, as the caller reads on. Names not of
    the grammar are passed over."""
    buckets, _ = list_queue(qdir)
    floor = bucket_of_name(low) if PENDING_RE.match(low) else low[:19]
    for bucket in buckets:
        if bucket < floor:
            continue  # every name in it sorts before low
        for name in names_in(os.path.join(qdir, bucket)):
            if name > low and PENDING_RE.match(name):
                yield bucket, name


def flat_jobs(qdir: str, others: list[str]) -> list[str]:
    """Of a queue directory's non-bucket names, those that are pending jobs written flat (by a
    format-2 store, or a format-3 one before buckets): :meth:`Tree.settle_flat` moves them."""
    return [n for n in others if PENDING_RE.match(n) and fs.is_regular(os.path.join(qdir, n))]


WATCHED_FOR = 60.0  # seconds: buckets of older seconds are not watched (see past_bucket)


def past_bucket(parent: str, name: str) -> bool:
    """Whether a directory found while starting to watch ``jobs/`` is a pending bucket of a past
    minute: a waiting puller needs to hear of jobs put into the current buckets (a create, or a
    release into a bucket made a moment ago); a deep backlog has thousands of past ones, and one
    inotify watch each would reach ``fs.inotify.max_user_watches``. A job put back into a past
    bucket (a release, a retry) is found by the next listing, within ``poll_interval``; buckets
    made after the start are watched when they appear."""
    return PENDING_BUCKET_RE.match(name) is not None and int(name[8:]) + WATCHED_FOR < time.time()


# == the finished index's buckets (finished/<B>/), as listings of final jobs read them ==================
class FinishedLists:
    """Each finished-index bucket's names, sorted, as this process last listed them: kept while
    the bucket's stat says nothing came or went (a bucket of a past hour rarely changes), so a
    page of final jobs reads the names it returns, not its bucket's. A bucket that changes (the
    current hour of a busy store) is listed again, and while no name went, only the new ones are
    sorted in. Names begin with their <FIN>, so sorting the names sorts by finishing time, with
    no Python work per name. Thread-safe enough: a lost update is a listing more."""

    _CAP = 4_000_000  # names kept in all, for every bucket

    def __init__(self) -> None:
        self._lists: dict[str, _Listed] = {}
        self._size = 0

    def get(self, path: str) -> list[str]:
        sig, settled = fs.dir_signature(path)  # before the listing it vouches for
        known = self._lists.get(path)
        if known is not None and known.sig == sig and known.settled:
            return known.names
        listed = names_in(path)
        seen = set(listed)
        if known is not None and known.seen <= seen:  # nothing went: sort in the new names only
            fresh = sorted(seen - known.seen)
            if not fresh or not known.names or fresh[0] >= known.names[-1]:
                names = known.names + fresh  # the usual case: later commits, after the others
            else:
                names = sorted([*known.names, *fresh])
        else:
            names = sorted(listed)
        self._size += len(names) - (len(known.names) if known is not None else 0)
        if self._size > self._CAP:  # forget the others, not this one
            self._lists.clear()
            self._size = len(names)
        self._lists[path] = _Listed(sig, settled, names, seen)
        return names


@dataclass(slots=True)
class _Listed:
    sig: tuple[int, int, int]
    settled: bool
    names: list[str]  # sorted
    seen: set[str]
