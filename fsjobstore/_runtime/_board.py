"""The status board of process mode: anonymous shared memory made before the children fork.

Each child writes its own slot (what it runs, until when, how its attempts ended); the
supervisor reads the slots. No locks: a slot is written under a sequence counter (odd while
writing), and a reader retries until it reads the same even count before and after, so it never
acts on half of one job and half of another. The run's flags (stop, pause, the job budget) are
the gate's (``_limit_gate``), shared with the thread pool.
"""

from __future__ import annotations

import mmap
import struct
import time
from dataclasses import dataclass

from ._slot import OUTCOMES

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
    def __init__(self, slots: int) -> None:
        self._map = mmap.mmap(-1, slots * _SLOT_SIZE)  # MAP_SHARED | MAP_ANONYMOUS

    # -- slots (each child writes its own) -------------------------------------------------------
    def _offset(self, index: int) -> int:
        return index * _SLOT_SIZE

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
