"""The run's gate: what every slot asks before each pull (stop? paused? is a job of the budget
left?), in every pool.

One gate for threads and child processes alike: its three flags live in anonymous shared memory
made before any child forks, so a thread reads them as a forked child does. Only the supervisor
(the thread that called ``Worker.run``) sets stop and pause; the job budget (``run(count=...)``)
is the one thing slots change together, under a fork-shared lock that a run without a budget
never takes.
"""

from __future__ import annotations

import mmap
import multiprocessing
import struct

_FLAGS = struct.Struct("<iiq")  # stop, paused, budget left (-1: no limit)


class Gate:
    def __init__(self, budget: int | None) -> None:
        self._map = mmap.mmap(-1, _FLAGS.size)  # MAP_SHARED | MAP_ANONYMOUS: seen by forked children
        self._lock = multiprocessing.get_context("fork").Lock()
        _FLAGS.pack_into(self._map, 0, 0, 0, -1 if budget is None else budget)

    def _flags(self) -> tuple[int, int, int]:
        stop, paused, budget = _FLAGS.unpack_from(self._map, 0)
        return stop, paused, budget

    # -- the supervisor's side -------------------------------------------------------------------
    def set_stop(self) -> None:
        if not self._flags()[0]:
            self._set(stop=1)

    def set_paused(self, paused: bool) -> None:
        if self._flags()[1] != int(paused):  # the supervisor calls this often: change, or touch nothing
            self._set(paused=int(paused))

    def _set(self, **flag: int) -> None:
        """Write the stop or pause flag under the lock, like take() and give_back(): the flags
        share one record, and this write must not put back a budget a slot changed meanwhile.

        RACE: a child killed (a time limit, a cancel) in the instant it held the lock would hold
        it for good; the kill re-checks the child's slot first, so that instant is tiny, and
        here a lock not had within a second is written without, rather than hang the worker."""
        got = self._lock.acquire(timeout=1.0)
        try:
            stop, paused, budget = self._flags()
            stop, paused = flag.get("stop", stop), flag.get("paused", paused)
            _FLAGS.pack_into(self._map, 0, stop, paused, budget)
        finally:
            if got:
                self._lock.release()

    def spent(self) -> bool:
        """Whether the run's budget is used up (never, without one)."""
        return self._flags()[2] == 0

    # -- a slot's side -----------------------------------------------------------------------------
    def stopping(self) -> bool:
        return bool(self._flags()[0])

    def paused(self) -> bool:
        return bool(self._flags()[1])

    def take(self) -> bool:
        """One job of the run's budget; False when it is spent."""
        if self._flags()[2] < 0:
            # No budget (the usual run): nothing to count, and nothing ever sets one later, so
            # no lock; with 16 children, taking a shared lock per job was a futex round each.
            return True
        with self._lock:
            stop, paused, budget = self._flags()
            if budget == 0:
                return False
            if budget > 0:
                _FLAGS.pack_into(self._map, 0, stop, paused, budget - 1)
            return True

    def give_back(self) -> None:
        """Return a job taken with :meth:`take` that was not started (nothing was due)."""
        if self._flags()[2] < 0:
            return
        with self._lock:
            stop, paused, budget = self._flags()
            if budget >= 0:
                _FLAGS.pack_into(self._map, 0, stop, paused, budget + 1)
