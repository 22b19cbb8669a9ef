"""The state one open store shares between its parts: settings, the tree of job files, the
owner identity and its tokens, the pending index, the doorbell and the wake-up sources.

``JobStore`` builds one :class:`Core`, whole, and hands it to the transitions (``_transitions``),
the features (``_relations``) and its own background thread and waits (``_store``); none of them
reaches into ``JobStore``, and nothing is set on a Core after it is made. What the features add
to a transition is handed to the transition itself (``_hooks``), not kept here.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._errors import StoreClosed
from .._format._layout import Layout, seq_field
from .._os import _files as fs
from .._os import _syscalls as sc
from .._os._inotify import NameWatch, Waker
from . import _buckets
from ._doorbell import Doorbell
from ._liveness import OwnerLease, OwnerProbe
from ._pending import Pending
from ._tree import Tree


@dataclass(frozen=True, slots=True)
class Settings:
    """What a store was opened with, validated (see ``JobStore.__init__``)."""

    path: str
    durable: bool  # whether this process fsyncs
    store_durable: bool  # what the store promises (its marker): a power cut may empty files where False
    lease_duration: float
    heartbeat_interval: float
    max_attempts: int
    backoff: Callable[[int], float]
    max_value_bytes: int
    max_request_bytes: int
    poll_interval: float
    watch: bool
    local: bool  # a local filesystem: inotify sees every change to it (not only this host's own)
    lock_takeover: bool
    doorbell: bool
    clock: Callable[[], float]
    wall: Callable[[], float]


class Core:
    """Shared state of one open store. Thread-safe; reset in a forked child."""

    def __init__(self, settings: Settings, layout: Layout, *, perms: fs.Perms, record_cap: int,
                 default_retain: float, on_new_owner: Callable[[], None]) -> None:
        """``on_new_owner`` is called once this process has an owner identity and must beat (a
        store where a free lock proves nothing): the one call a Core makes upward, handed in by
        the store, whose background thread beats."""
        self.settings = settings
        self.layout = layout
        self.durable = settings.durable
        self.clock = settings.clock
        self.wall = settings.wall
        self.probe = OwnerProbe(layout, settings.lease_duration, settings.clock, trust_locks=settings.lock_takeover)
        self.closed = False
        self._on_new_owner = on_new_owner
        self.doorbell = Doorbell(layout, self.owner_id, enabled=settings.doorbell, file_mode=perms.file_mode)
        # Locks that prove nothing mean a network filesystem, unless told otherwise: reads there
        # may lag behind another host's writes.
        self.tree = Tree(layout, durable=settings.durable, record_cap=record_cap, perms=perms,
                         ring=self.doorbell.ring if settings.doorbell else None, default_retain=default_retain,
                         lagging=not settings.lock_takeover, emptiable=not settings.store_durable)
        self._reset()

    def _reset(self) -> None:
        self.pid = os.getpid()
        self.mutex = threading.RLock()
        self.owner: OwnerLease | None = None
        self._tokens = itertools.count(1)
        self._last_seq = 0
        self._litter: set[str] = set()
        # Removals this store fenced and could not finish (a fault): gone temp -> (id, entry).
        self.unfinished_removals: dict[str, tuple[str, str | None]] = {}
        self.waker: Waker | None = None
        self.final_waker: Waker | None = None  # for wait(): results arriving in the final directories
        self.finished_lists = _buckets.FinishedLists()  # what listings of final jobs read (_listing)
        self.pending = Pending(self.layout, self.tree, durable=self.durable,
                               poll_interval=self.settings.poll_interval, clock=self.clock, wall=self.wall)
        # Whether a job has a cancel request, targets, a due notification or children waiting,
        # and which queues are paused: asked on every claim, commit and removal, and almost
        # always no. Answered by inotify (one poll) instead of a lookup each, where reads do not
        # lag (a local filesystem, whatever lock_takeover says: a lock may reach other hosts
        # where no event here tells of their changes).
        lay = self.layout
        watched = (lay.cancels, lay.targets, lay.deps, lay.paused, lay.notify)
        self.names = NameWatch(lay.root, watched if self.settings.watch and self.settings.local else ())

    def after_fork(self) -> None:
        """A forked child must not reuse the parent's owner lock, wake-up descriptors or index."""
        self.names.abandon_after_fork()
        if self.owner is not None:
            self.owner.abandon_after_fork()
        for waker in (self.waker, self.final_waker):
            if waker is not None:
                waker.abandon_after_fork()
        self.doorbell.after_fork()
        self._reset()

    def forked(self) -> bool:
        return os.getpid() != self.pid

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosed(f"the JobStore at {self.settings.path} is closed")

    # -- identity ------------------------------------------------------------------------------
    def ensure_owner(self) -> OwnerLease:
        with self.mutex:
            made = self.owner is None
            if made:
                self.owner = OwnerLease(self.layout, self.settings.lease_duration, self.tree.perms.file_mode)
            owner = self.owner
        if made and not self.settings.lock_takeover:
            # Where a free lock proves nothing, an owner file that stops changing is a dead
            # owner's: others delete its temp files and its reservations' owner. A process that
            # only creates jobs must beat too, from the moment it has an identity.
            self._on_new_owner()
        assert owner is not None
        return owner

    def replace_owner(self, old: OwnerLease) -> None:
        """Drop an owner identity others judged gone; the next claim makes a new one."""
        with self.mutex:
            if self.owner is old:
                old.close()
                self.owner = None

    def owner_id(self) -> str:
        return self.ensure_owner().owner

    def new_token(self) -> str:
        return f"{self.owner_id()}-{next(self._tokens):x}"

    def next_seq(self) -> str:
        with self.mutex:
            # Strictly increasing within a process, so FIFO holds even when the clock repeats.
            self._last_seq = max(time.time_ns(), self._last_seq + 1)
            return seq_field(self._last_seq)

    # -- superseded copies -----------------------------------------------------------------------
    def drop(self, path: str) -> bool:
        """Remove a superseded copy of a job; True once it is gone. If that fails the copy stays
        until the next recovery pass of this store retries it (see FORMAT.md, "Faults")."""
        if fs.unlink_quietly(path) or not sc.lexists(path):
            return True
        with self.mutex:
            self._litter.add(path)
        return False

    def sweep_litter(self) -> int:
        """Retry the copies :meth:`drop` could not remove; how many are gone now."""
        with self.mutex:
            litter, self._litter = self._litter, set()
        return sum(self.drop(path) for path in litter)

    # -- waiting ---------------------------------------------------------------------------------
    def start_waker(self) -> None:
        with self.mutex:
            if self.waker is None and not self.closed:
                waker = Waker(self.layout.jobs, self.pending.on_arrival, self.pending.invalidate,
                              skip=_buckets.past_bucket)
                waker.start()
                self.waker = waker

    def start_final_waker(self) -> Waker | None:
        """The watcher of the final directories that ``wait`` sleeps on (its own: pullers are not
        woken by every result), started by the first wait that needs it; None without inotify."""
        with self.mutex:
            if self.final_waker is None and self.settings.watch and not self.closed:
                lay = self.layout
                self.final_waker = Waker((lay.fulfilled, lay.failed, lay.cancelled), lambda path: None)
                self.final_waker.start()
            return self.final_waker

    def kick_waker(self) -> None:
        """Wake this process's waiting pullers (a slot of a limit freed)."""
        waker = self.waker
        if waker is not None:
            waker.kick()

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists, without following a link: from the name watch when it can
        answer for its directory (``cancels/``, ``targets/``, ``deps/``, ``paused/``, ``notify/``),
        else looked up."""
        head, _, name = path.rpartition("/")
        known = self.names.has(head, name)
        return sc.lexists(path) if known is None else known

    def stop_waker(self) -> None:
        self.names.close()
        for waker in (self.waker, self.final_waker):
            if waker is not None:
                waker.stop()
        self.doorbell.close()

