"""The machinery one open store shares between its parts: settings, the owner identity and its
tokens, the pending index, the wake-up source, and the waiting loop of every blocking call.

``JobStore`` builds one :class:`Core` and hands it to the protocol modules (``_create``,
``_work``, ``_notify``, ``_recovery``, ``_heart``); none of them reaches into ``JobStore``.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from . import _fsops as fs
from . import _syscalls as sc
from ._checks import number
from ._doorbell import POLL as DOORBELL_POLL
from ._doorbell import Doorbell, Listener
from ._errors import StoreClosed
from ._layout import Layout, seq_field
from ._liveness import OwnerLease, OwnerProbe
from ._pending import Pending
from ._tree import Tree
from ._wakeup import Waker

T = TypeVar("T")


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
    lock_takeover: bool
    doorbell: bool
    clock: Callable[[], float]
    wall: Callable[[], float]


class Core:
    """Shared state of one open store. Thread-safe; reset in a forked child."""

    def __init__(self, settings: Settings, layout: Layout, tree: Tree) -> None:
        self.settings = settings
        self.layout = layout
        self.tree = tree
        self.durable = settings.durable
        self.clock = settings.clock
        self.wall = settings.wall
        self.probe = OwnerProbe(layout, settings.lease_duration, settings.clock, trust_locks=settings.lock_takeover)
        self.closed = False
        # Called once before the first pull that needs the background thread (set by JobStore).
        self.start_background: Callable[[], None] = lambda: None
        self.keep_beating: Callable[[], None] = lambda: None  # the heartbeat alone (see ensure_owner)
        self.doorbell = Doorbell(layout, self.owner_id, enabled=settings.doorbell, file_mode=tree.perms.file_mode)
        tree.bell = self.doorbell.ring
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
        self.pending = Pending(self.layout, self.tree, durable=self.durable,
                               poll_interval=self.settings.poll_interval, clock=self.clock, wall=self.wall)

    def after_fork(self) -> None:
        """A forked child must not reuse the parent's owner lock, wake-up descriptors or index."""
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
            self.keep_beating()
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
                waker = Waker(self.layout.jobs, self.pending.on_arrival, self.pending.invalidate)
                waker.start()
                self.waker = waker

    def pull(self, attempt: Callable[[], T | None], timeout: float | None) -> T | None:
        """Call ``attempt`` until it returns something or ``timeout`` runs out, sleeping between
        tries until a wake-up, the next due job, or ``poll_interval``, whichever comes first."""
        if timeout is not None:
            timeout = number(timeout, "timeout (seconds, or None)", at_least=0)
        self.start_background()
        deadline = None if timeout is None else self.clock() + timeout
        bell = self.doorbell.listener(("work",)) if self.doorbell.enabled else None
        while True:
            waker = self.waker
            generation = waker.generation if waker else 0
            got = attempt()
            if got is not None or timeout == 0:
                return got
            remaining = float("inf") if deadline is None else deadline - self.clock()
            if remaining <= 0:
                return None
            if waker is None and self.settings.watch:
                # Started only when a pull has to wait: watching costs a busy process a thread
                # hop per event it causes itself. Start, then look again before sleeping.
                self.start_waker()
                continue
            pause = min(remaining, self.settings.poll_interval, max(0.001, self.pending.next_due - self.wall()))
            self._sleep(waker, generation, pause, bell)
            self.check_open()

    def _sleep(self, waker: Waker | None, generation: int, pause: float, bell: Listener | None) -> None:
        """Wait up to ``pause`` for a local event (inotify) or, with a doorbell, a ring from
        another host; past ``pause`` (or at a ring) the next look lists the directories anew."""
        end = self.clock() + pause
        if bell is not None:
            bell.rang()  # the first look only learns the names there are
        while True:
            left = end - self.clock()
            if left <= 0:
                break
            step = left if bell is None else min(left, DOORBELL_POLL)
            if waker is not None and waker.watching:
                waker.wait(generation, step)
                if waker.generation != generation:
                    return
            else:
                time.sleep(step)
            if bell is not None and bell.rang():
                break
        self.pending.invalidate()

    def wait_final(self, job_id: str, timeout: float | None) -> bool:
        """Wait until job ``job_id`` is in a final state; False if ``timeout`` ran out first.
        Raises JobNotFound if there is no such job. Woken by inotify on the final directories
        (a watcher of its own: pullers are not woken by every result), with a rescan every
        ``poll_interval`` for what inotify cannot see."""
        if timeout is not None:
            timeout = number(timeout, "timeout (seconds, or None)", at_least=0)
        deadline = None if timeout is None else self.clock() + timeout
        with self.mutex:
            if self.final_waker is None and self.settings.watch and not self.closed:
                lay = self.layout
                self.final_waker = Waker((lay.fulfilled, lay.failed, lay.cancelled), lambda path: None)
                self.final_waker.start()
            waker = self.final_waker
        bell = self.doorbell.listener(("done",)) if self.doorbell.enabled else None
        while True:
            generation = waker.generation if waker else 0
            if self.tree.require(job_id).state.is_final:
                return True
            remaining = float("inf") if deadline is None else deadline - self.clock()
            if remaining <= 0:
                return False
            self._sleep(waker, generation, min(remaining, self.settings.poll_interval), bell)
            self.check_open()

    def stop_waker(self) -> None:
        for waker in (self.waker, self.final_waker):
            if waker is not None:
                waker.stop()
        self.doorbell.close()

