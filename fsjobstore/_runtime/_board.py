"""The status board of process mode: anonymous shared memory made before the children fork.

Each child writes its own slot (what it runs, until when); the supervisor writes the run's flags
(stop, paused) and reads the slots. No locks on the hot path: a slot is written under a
sequence counter (odd while writing), and a reader retries until it reads the same even count
before and after, so it never acts on half of one job and half of another. The job budget
(``run(count=...)``) is the one thing children change together, under a fork-shared lock; a run
without one never takes it.
"""

from __future__ import annotations

import mmap
import multiprocessing
import struct
import time
from dataclasses import dataclass

from ._slot import OUTCOMES

_FLAGS = struct.Struct("<iiq")  # stop, paused, budget left (-1: no limit)
# seq, busy, attempt, started, deadline, pid, one count per outcome (OUTCOMES' order), id, queue, token
_SLOT = struct.Struct(f"<qiiddi{len(OUTCOMES)}q130s66s44s")
_SLOT_SIZE = 512
assert _SLOT.size <= _SLOT_SIZE


@dataclass(frozen=True, slots=True)
class SlotView:
    seq: int
    busy: bool
    attempt: int
    started: float  # monotonic (CLOCK_MONOTONIC is one clock for every process of a host)
    deadline: float  # monotonic; 0.0: no time limit
    pid: int
    counts: tuple[int, ...]  # attempts this slot's children ended, one count per outcome (OUTCOMES)
    job_id: str
    queue: str
    token: str


class Board:
    def __init__(self, slots: int, budget: int | None) -> None:
        self._map = mmap.mmap(-1, _FLAGS.size + slots * _SLOT_SIZE)  # MAP_SHARED | MAP_ANONYMOUS
        self._lock = multiprocessing.get_context("fork").Lock()
        _FLAGS.pack_into(self._map, 0, 0, 0, -1 if budget is None else budget)

    # -- the run's flags (the supervisor writes, children read) ---------------------------------
    def _flags(self) -> tuple[int, int, int]:
        stop, paused, budget = _FLAGS.unpack_from(self._map, 0)
        return stop, paused, budget

    def set_stop(self) -> None:
        self._set(stop=1)

    def set_paused(self, paused: bool) -> None:
        if self._flags()[1] != int(paused):  # the supervisor calls this often: change, or touch nothing
            self._set(paused=int(paused))

    def _set(self, **flag: int) -> None:
        """Write the stop or pause flag under the lock, like take() and give_back(): the flags
        share one record, and this write must not put back a budget a child changed meanwhile.

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

    def stopping(self) -> bool:
        return bool(self._flags()[0])

    def paused(self) -> bool:
        return bool(self._flags()[1])

    def take(self) -> bool:
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
        if self._flags()[2] < 0:
            return
        with self._lock:
            stop, paused, budget = self._flags()
            if budget >= 0:
                _FLAGS.pack_into(self._map, 0, stop, paused, budget + 1)

    # -- slots (each child writes its own) -------------------------------------------------------
    def _offset(self, index: int) -> int:
        return _FLAGS.size + index * _SLOT_SIZE

    def write(self, index: int, *, busy: bool, pid: int, counts: tuple[int, ...], job_id: str = "",
              queue: str = "", token: str = "", attempt: int = 0, started: float = 0.0,
              deadline: float | None = None) -> None:
        off = self._offset(index)
        seq = struct.unpack_from("<q", self._map, off)[0]
        struct.pack_into("<q", self._map, off, seq + 1)  # odd: being written
        _SLOT.pack_into(self._map, off, seq + 1, int(busy), attempt, started, deadline or 0.0, pid, *counts,
                        job_id.encode(), queue.encode(), token.encode())
        struct.pack_into("<q", self._map, off, seq + 2)  # even again: whole

    def read(self, index: int) -> SlotView:
        off = self._offset(index)
        while True:
            before = struct.unpack_from("<q", self._map, off)[0]
            if before % 2:
                time.sleep(0)
                continue
            _, busy, attempt, started, deadline, pid, *counts, job_id, queue, token = _SLOT.unpack_from(
                self._map, off)
            if struct.unpack_from("<q", self._map, off)[0] == before:
                return SlotView(before, bool(busy), attempt, started, deadline, pid, tuple(counts),
                                job_id.rstrip(b"\0").decode(), queue.rstrip(b"\0").decode(),
                                token.rstrip(b"\0").decode())
