"""A process-local index of the first few pending names per queue, so a claim is cheap.

A queue's jobs are in buckets, one directory per priority and second (``_buckets``): a listing
reads the queue's bucket names, then its buckets in run order until it holds ``limit`` names
(the next jobs to run), so it costs the same at a million jobs as at a thousand. We list again
when they run out, when the cached view is older than ``rescan_interval``, or never sooner. A
queue found empty is listed again only when the stat of its directory or of an emptied bucket it
still holds changed (see ``_files.SETTLE``) or the interval passed. Arrivals reported by the waker
are merged in at once, so a new urgent job does not wait for the next listing.

The index is only a hint: a name in it may already be claimed by another process (the claim's
rename then fails with ENOENT and we move on), and the directory stays the truth.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import random
import threading
import time
from collections.abc import Callable

from .._errors import InvalidRequest, StorageError
from .._format._layout import PENDING_MARKER, PENDING_RE, SCHEDULED_RE, Layout, bucket_of_name, pending_rel, prio_value
from .._format._records import Record
from .._format._values import check_queue_name, is_pattern, matches
from .._os import _files as fs
from . import _buckets
from ._tree import Tree

# After losing a name to another process, a claimer drops the next few names of that priority
# from its index instead of trying them one by one: the winner takes names in the same order and
# is about to take those. Processes with the same sorted view otherwise lose every other claim to
# each other (measured on the GlusterFS bed with two workers: one failed rename, a round trip, per
# job). The drop doubles with each race lost in a row (we are inside a stretch others took) up to
# DROP_MAX. Dropped names are hints forgotten, not jobs: the next listing (when the index runs
# dry, and every rescan interval) brings back any nobody took, at the front, so a job runs at
# most a few hundred places late.
#
# Not done (PERFORMANCE.md, "W8 blocked"): keeping the passed names and
# going on from a random point of the priority after a lost race. It lost far fewer races with
# 16 processes, but ran jobs in nearly random order (bench/claim_order.py: p99 2,854 places late
# of 4,000 with 8 processes, against 268 here); bounded to the first 256 names, it lost races
# at the front all the time and drained slower than this.
SKIP = 16
DROP_MAX = 256
_PRIO = 7  # a pending name starts with its 7-digit priority field (_layout.PENDING_RE)
INDEX_SIZE = 4096  # names of a queue a process keeps between listings
ENOUGH = 256  # a listing goes on to the next bucket only while it holds fewer names than this
QUIET_SLACK = 5.0  # seconds past its second before a kept empty bucket may be passed over (_quiet_buckets)
QUIET_FOR = 60.0  # seconds between listings that look at every kept empty bucket again
UNREADABLE_SAID_EVERY = 60.0  # seconds between warnings of one bucket that cannot be read

log = logging.getLogger("fsjobstore")


def _valid(rel: str) -> bool:
    """``<bucket>/<name>`` with a name of the grammar, in the bucket it belongs in."""
    bucket, _, name = rel.partition("/")
    return PENDING_RE.match(name) is not None and bucket == bucket_of_name(name)


class QueueIndex:
    def __init__(self, directory: str, limit: int, rescan_interval: float,
                 clock: Callable[[], float], on_bad_name: Callable[[str], None],
                 settle: Callable[[str, list[str]], int] = lambda d, n: 0, keep: float = 0.0) -> None:
        """``keep``: seconds an emptied bucket stays unchanged before it is removed (a network
        filesystem's rule, ``_buckets.NETWORK_KEEP``; 0: the local rules alone)."""
        self.directory = directory
        self._keep = keep
        self._marker = f"{directory}/{PENDING_MARKER}"
        # Kept emptied buckets of past seconds (keep > 0 only), passed over with no call while the
        # queue's marker keeps the stat it had when they were listed empty (_quiet_buckets).
        self._quiet: set[str] = set()
        self._quiet_marker: tuple[int, int, int] | None = None
        self._quiet_until = float("-inf")
        self._limit = limit
        self._rescan = rescan_interval
        self._clock = clock
        self._on_bad_name = on_bad_name  # given a name below the queue's directory
        self._settle = settle  # moves flat jobs into their buckets (Tree.settle_flat)
        # "<bucket>/<name>", sorted: the next jobs to run first. A bucket's names all sort after
        # the names of the buckets before it, so these sort as their jobs run.
        self._names: list[str] = []
        self._losses = 0  # races lost in a row
        self._unreadable_said: dict[str, float] = {}  # bucket -> when its EIO was last logged
        self._known: set[str] = set()
        self._truncated = False
        self._ceiling = ""  # when truncated: the largest name we kept
        self._listed_at = float("-inf")
        # The stats of the directory and of the emptied buckets it still holds (and, on a network
        # filesystem, of the queue's marker, which vouches for the quiet ones), taken before a
        # listing that found them empty once they had settled (_files.SETTLE): while they are
        # the same, the queue is still empty, and a claim that passes over it costs a stat or
        # two instead of a listing (a worker of 16 queues, 15 of them empty, did 15 listings
        # per claim). _empty_names: those names below the queue's directory, in _empty_sig[1:]'s order.
        self._empty_sig: tuple[tuple[int, int, int], ...] | None = None
        self._empty_names: list[str] = []
        self._mutex = threading.Lock()
        self._checked: str | None = None  # the head _drop_bad_head last found valid (by identity)

    def _refill(self) -> None:
        """List the queue's buckets in run order, and the first of them until ``limit`` names (or,
        past a bucket's end, ``ENOUGH``): a bounded slice of the backlog however deep it is
        (``_buckets``). Emptied buckets of past seconds are removed on the way."""
        sig, settled = fs.dir_signature(self.directory)  # before the listing it vouches for
        quiet, marker = self._quiet_buckets()  # the marker's stat too: before the listings
        emptied: list[tuple[str, tuple[int, int, int]]] = []
        buckets, others = _buckets.list_queue(self.directory)
        if others:
            flat = _buckets.flat_jobs(self.directory, others)
            if flat and self._settle(self.directory, flat):
                buckets, others = _buckets.list_queue(self.directory)
            for name in others:
                if name not in flat:
                    self._on_bad_name(name)  # a name that is neither a bucket nor a job
        front: list[str] = []
        truncated = False
        now = time.time()
        for bucket in buckets:
            if len(front) >= min(self._limit, ENOUGH):
                # Enough to go on with: the next bucket may hold ~13,000 names (a second of two
                # busy creators), and listing it would make this one claim the slowest by 5-10 ms.
                truncated = True
                break
            if bucket in quiet:
                continue  # kept empty, and no older bucket changed since: no call
            bdir = os.path.join(self.directory, bucket)
            try:
                bsig, bsettled = fs.dir_signature(bdir)
                names = _buckets.names_in(bdir)
            except StorageError as exc:
                if exc.errno != errno.EIO:
                    raise
                # One bucket the filesystem will not read (on GlusterFS: a directory in
                # split-brain) must not stop the queue: its jobs wait, the others run, and the
                # queue is never taken for empty meanwhile, so every listing looks at it again.
                self._unreadable(bdir, exc)
                settled = False
                continue
            if not names:
                if _buckets.remove_if_spent(bdir, bucket, (bsig, bsettled), now, keep=self._keep):
                    continue
                if marker is not None and bsettled and _buckets.is_old(bucket, now - QUIET_SLACK):
                    # RACE: anything put into it from now on sets the marker (Tree.note_bucket_change),
                    # whose stat we took before this listing: the next listing then looks again.
                    quiet.add(bucket)
                else:
                    emptied.append((bucket, bsig))  # kept: still empty while its stat is the same
                    settled = settled and bsettled
                continue
            # Names are checked against the grammar when they reach the front (_drop_bad_head),
            # not all here (PERFORMANCE.md: at 100,000 pending, matching every name cost more
            # than listing them).
            prefix = bucket + "/"
            need = self._limit - len(front)
            if len(names) > need:
                truncated = True
            front.extend(prefix + n for n in names[:need])  # names_in sorted them
        self._set_front(front, truncated=truncated)
        if not self._names and self._truncated:
            # A whole front of bad names that could not be quarantined (too long to move, say)
            # would hide every job behind it: hostile, and rare enough to check every name.
            valid = [rel for b, n in _buckets.walk(self.directory) if _valid(rel := f"{b}/{n}")]
            self._set_front(valid[: self._limit], truncated=len(valid) > self._limit)
        self._listed_at = self._clock()
        if settled and not self._names and not self._truncated:
            # The quiet buckets are vouched for by the marker's stat: it joins the stats kept.
            self._empty_sig = (sig, *(s for _, s in emptied), *(() if marker is None else (marker,)))
            self._empty_names = [b for b, _ in emptied] + ([PENDING_MARKER] if marker is not None else [])
        else:
            self._empty_sig = None

    def _unreadable(self, bdir: str, exc: OSError) -> None:
        now = self._clock()
        if now >= self._unreadable_said.get(bdir, float("-inf")) + UNREADABLE_SAID_EVERY:
            self._unreadable_said[bdir] = now
            log.warning("%s: this pending bucket cannot be read (%s); its jobs are passed over until it can "
                        "(on GlusterFS, a directory in split-brain: gluster volume heal VOLUME info split-brain)",
                        bdir, os.strerror(exc.errno or 0))

    def _quiet_buckets(self) -> tuple[set[str], tuple[int, int, int] | None]:
        """The kept empty buckets a listing may pass over, and the marker's stat that vouches for
        them (None: no bucket may be passed over this time, nor recorded as quiet).

        Only a network filesystem keeps emptied buckets (``keep``), up to ``NETWORK_KEEP`` s:
        hundreds, each a stat and a listing over the network, before the first job. Every change
        to a bucket of a past second but a create (a release, a retry, a take-over, a promotion)
        sets the queue's marker (``Tree.note_bucket_change``), and creates go to the current
        second; so while the marker keeps its settled stat, a bucket of a second ``QUIET_SLACK``
        s past that was empty is empty still. Every ``QUIET_FOR`` s every bucket is looked at
        again: that corrects a process that died between a change and its marker, and another
        host's clock more than ``QUIET_SLACK`` s behind."""
        if not self._keep:
            return set(), None
        msig, msettled = fs.dir_signature(self._marker)
        now = self._clock()
        if not msettled:  # a stat that may still change within its own timestamp's grain
            self._quiet, self._quiet_marker = set(), None
            return set(), None
        if msig != self._quiet_marker or now >= self._quiet_until:
            self._quiet, self._quiet_marker, self._quiet_until = set(), msig, now + QUIET_FOR
        return self._quiet, msig

    def _set_front(self, front: list[str], *, truncated: bool) -> None:
        self._truncated = truncated
        self._ceiling = front[-1] if front else ""
        self._names = front
        self._known = set(front)
        self._drop_bad_head()

    def add(self, name: str) -> None:
        """Merge an arrival (``<bucket>/<name>``) reported by the waker or made by us."""
        if not _valid(name):
            return
        with self._mutex:
            if name in self._known or (self._truncated and name > self._ceiling):
                return  # the next listing will find it in order
            bisect.insort(self._names, name)
            self._known.add(name)

    def discard(self, name: str) -> None:
        """Forget ``<bucket>/<name>``: this process moved that job out of pending itself."""
        with self._mutex:
            if name in self._known:
                self._known.discard(name)
                i = bisect.bisect_left(self._names, name)
                if i < len(self._names) and self._names[i] == name:
                    del self._names[i]

    def peek(self) -> str | None:
        with self._mutex:
            self._maybe_refill()
            # A bad name must not make this queue look due, or urgent; if the names left were
            # all bad, the directory may hold more.
            if self._drop_bad_head() and not self._names:
                self._maybe_refill()
            return self._names[0] if self._names else None

    def _drop_bad_head(self) -> bool:
        """Report (to be quarantined) and forget names not of the grammar at the front; True
        if there were any. (Dot names never get this far: a listing leaves them out, and add()
        takes only names of the grammar.)"""
        names, dropped = self._names, False
        if names and names[0] is self._checked:
            return False  # peek() checked this very head just before pop()
        while names and not _valid(names[0]):
            name = names.pop(0)
            self._known.discard(name)
            dropped = True
            self._on_bad_name(name)
        self._checked = names[0] if names else None
        return dropped

    def pop(self) -> str | None:
        """The next name to try to claim, or None; names not of the grammar are reported as bad
        (and passed over) here, so every name returned is ``<bucket>/<name>`` with the name
        matching ``PENDING_RE``."""
        with self._mutex:
            self._maybe_refill()
            self._drop_bad_head()
            if not self._names:
                return None
            name = self._names.pop(0)  # a list of at most 4,096: a memmove of under a microsecond
            self._known.discard(name)
            return name

    def won(self) -> None:
        """The name just popped was ours."""
        self._losses = 0

    def lost(self, name: str) -> None:
        """``name``, just popped, was claimed by another process first: drop the next 1 to
        SKIP names of its priority (doubling with each loss in a row, see SKIP)."""
        with self._mutex:
            self._losses += 1
            drop = random.randint(1, min(SKIP << min(self._losses - 1, 4), DROP_MAX))
            names, prio, k = self._names, name[:_PRIO], 0
            while k < drop and k < len(names) and names[k][:_PRIO] == prio:
                self._known.discard(names[k])
                k += 1
            del names[:k]

    def _maybe_refill(self) -> None:
        if self._clock() - self._listed_at >= self._rescan or (not self._names and not self._still_empty()):
            self._refill()

    def _still_empty(self) -> bool:
        sig = self._empty_sig
        if sig is None or fs.dir_signature(self.directory)[0] != sig[0]:
            return False
        # The emptied buckets it still holds (of the last few seconds, not removed yet): a
        # create into one of them changes its stat, not the queue directory's. The marker: a
        # job put back into a quiet bucket changes its stat.
        return all(fs.dir_signature(os.path.join(self.directory, name))[0] == s
                   for name, s in zip(self._empty_names, sig[1:], strict=True))

    def invalidate(self) -> None:
        with self._mutex:
            self._listed_at = float("-inf")


class Pending:
    """This process's view of ``jobs/pending`` and ``jobs/scheduled``: which queue to claim from
    next, and when scheduled jobs fall due. Thread-safe."""

    def __init__(self, layout: Layout, tree: Tree, *, durable: bool, poll_interval: float,
                 clock: Callable[[], float], wall: Callable[[], float]) -> None:
        self._layout = layout
        self._tree = tree
        self._durable = durable
        self._poll = poll_interval
        self._clock = clock
        self._wall = wall
        self._mutex = threading.Lock()
        self._indexes: dict[str, QueueIndex] = {}
        self._queues_listed_at = float("-inf")
        self._sched_mutex = threading.Lock()
        self._sched_listed_at = float("-inf")
        self.next_due = 0.0  # earliest known due time of a scheduled job or notification

    def pick(self, queues: list[str] | None, skip: frozenset[str] = frozenset()) -> QueueIndex | None:
        """The index to claim from next: the first non-empty of ``queues`` in order, or across
        all queues the one whose head sorts first (lowest priority number, then oldest). A
        pattern among ``queues`` (``_values``) stands for every queue it matches, taken as all
        queues are. Queues in ``skip`` (the paused ones, those at their limit) are passed over."""
        if queues is None:
            return self._best(self._all_queues(), skip)
        for q in queues:
            if is_pattern(q):
                index = self._best([name for name in self._all_queues() if matches(q, name)], skip)
                if index is not None:
                    return index
                continue
            if q in skip:
                continue
            index = self._index(q)
            if index.peek() is not None:
                return index
        return None

    def _best(self, queues: list[str], skip: frozenset[str]) -> QueueIndex | None:
        best: tuple[str, QueueIndex] | None = None
        for q in queues:
            if q in skip:
                continue
            index = self._index(q)
            head = index.peek()
            if head is not None and (best is None or head < best[0]):
                best = (head, index)
        return None if best is None else best[1]

    def _all_queues(self) -> list[str]:
        now = self._clock()
        with self._mutex:
            if now - self._queues_listed_at >= self._poll:
                for q in fs.scan_names(self._layout.pending):
                    if q in self._indexes:
                        continue
                    try:
                        check_queue_name(q)
                    except InvalidRequest:
                        self._tree.quarantine(self._layout.pending_dir(q), "unrecognised queue directory")
                        continue
                    if not fs.is_real_dir(self._layout.pending_dir(q)):  # a file planted there
                        self._tree.quarantine(self._layout.pending_dir(q), "a queue must be a directory")
                        continue
                    self._index_locked(q)
                self._queues_listed_at = now
            return list(self._indexes)

    def _index(self, queue: str) -> QueueIndex:
        with self._mutex:
            return self._index_locked(queue)

    def _index_locked(self, queue: str) -> QueueIndex:
        index = self._indexes.get(queue)
        if index is None:
            directory = self._layout.pending_dir(queue)

            def bad_name(name: str, directory: str = directory) -> None:
                self._tree.quarantine(os.path.join(directory, name), "unrecognised name in a pending queue")

            index = QueueIndex(directory, INDEX_SIZE, rescan_interval=self._poll, clock=self._clock,
                               on_bad_name=bad_name, settle=self._tree.settle_flat, keep=self._tree.bucket_keep)
            self._indexes[queue] = index
        return index

    def invalidate(self) -> None:
        """Forget what we listed: the next pick lists again (used when inotify is not helping)."""
        with self._mutex:
            for index in self._indexes.values():
                index.invalidate()
            self._queues_listed_at = float("-inf")

    def note_published(self, record: Record, dest: str) -> None:
        """This process just put ``record`` into ``dest``: note what that means for claims."""
        if dest == "pending":
            self.note_pending(record)
        elif dest == "scheduled":
            self.note_due(record.not_before or 0.0)

    def note_pending(self, record: Record) -> None:
        """We just put a job in pending: our own index need not wait for inotify or a rescan
        (inotify cannot even report files in a queue directory created a moment ago)."""
        self.note_name(record.queue, pending_rel(record.priority, record.seq, record.id))

    def note_name(self, queue: str, rel: str) -> None:
        """We just put ``<bucket>/<name>`` back into ``queue`` (a promotion from a limit's line)."""
        with self._mutex:
            index = self._indexes.get(queue)
            if index is None:
                self._queues_listed_at = float("-inf")
        if index is not None:
            index.add(rel)

    def note_due(self, due: float) -> None:
        """Something becomes due at ``due``: make sure pullers look (and wake) by then."""
        with self._sched_mutex:
            self.next_due = min(self.next_due, due)

    def _pending_name(self, path: str) -> tuple[str, str] | None:
        """``(queue, "<bucket>/<name>")`` of ``pending/<queue>/<bucket>/<name>``, else None."""
        parent, name = os.path.split(path)
        qdir, bucket = os.path.split(parent)
        if os.path.dirname(qdir) != self._layout.pending:
            return None
        return os.path.basename(qdir), f"{bucket}/{name}"

    def on_arrival(self, path: str) -> None:
        """A file appeared under jobs/ (reported by the waker)."""
        found = self._pending_name(path)
        if found is not None:
            queue, rel = found
            with self._mutex:
                index = self._indexes.get(queue)
                if index is None:
                    self._queues_listed_at = float("-inf")
            if index is not None:
                index.add(rel)
        elif os.path.dirname(path) == self._layout.scheduled:
            m = SCHEDULED_RE.match(os.path.basename(path))
            if m:
                self.note_due(int(m["due"]) / 1_000_000)

    def gone(self, path: str) -> None:
        """This process moved ``pending/<queue>/<bucket>/<name>`` away (a claim by id, a purge):
        its own index forgets the name. Left there, the next claim would fail on it and take it
        for a race lost to another process, and drop the names behind it of its priority until
        the next listing (hypothesis found a higher-priority job passed over that way)."""
        found = self._pending_name(path)
        if found is not None:
            with self._mutex:
                index = self._indexes.get(found[0])
            if index is not None:
                index.discard(found[1])

    def promote_due(self) -> None:
        """Move scheduled jobs whose time has come into pending (a rename each)."""
        now = self._wall()
        with self._sched_mutex:
            if now < self.next_due and self._clock() - self._sched_listed_at < self._poll:
                return
            self._sched_listed_at = self._clock()
            next_due = float("inf")
            touched: set[str] = set()
            for name in sorted(fs.scan_names(self._layout.scheduled)):
                m = SCHEDULED_RE.match(name)
                src = os.path.join(self._layout.scheduled, name)
                if not m:
                    self._tree.quarantine(src, "unrecognised name in jobs/scheduled")
                    continue
                due = int(m["due"]) / 1_000_000
                if due > now:
                    next_due = due
                    break
                rel = pending_rel(prio_value(m["prio"]), m["seq"], m["id"])
                dst = f"{self._layout.pending_dir(m['queue'])}/{rel}"
                try:
                    self._tree.into_pending(src, dst, durable=False)  # fsynced below, once per bucket
                except FileNotFoundError:
                    continue  # another process promoted it
                touched.add(os.path.dirname(dst))
                self._index(m["queue"]).add(rel)
            if self._durable:
                for directory in touched:
                    fs.fsync_dir(directory)
            if touched:
                self._tree.bell("work")  # other hosts' waiters do not know these were due
            self.next_due = next_due
