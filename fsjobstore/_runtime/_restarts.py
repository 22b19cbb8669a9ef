"""When a worker's slot (a child process or a thread) that died is started again.

A slot that fails at once, every time (a queue that cannot be read, a store that was removed, a
handler module whose import fails in the child), must not be restarted as fast as the machine can
fork: each restart waits twice as long as the one before (0.1 s up to 5 s), and after
``limit`` failures in a row that each came within ``settle`` seconds of the slot's start, the
worker gives up with :class:`WorkerFailing`. A slot that ran for ``settle`` seconds, or finished
a job, starts the count afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import WorkerFailing

FIRST_DELAY = 0.1
MAX_DELAY = 5.0


class Restarts:
    def __init__(self, *, settle: float = 2.0, limit: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        self._settle, self._limit, self._clock = settle, limit, clock
        self._born: dict[int, float] = {}
        self._due: dict[int, float] = {}
        self._in_a_row = 0
        self._jobs_seen = 0

    def born(self, index: int) -> None:
        self._born[index] = self._clock()

    def look(self, jobs_ended: int, *, stopping: bool) -> list[int]:
        """Each tick of the pool: ``jobs_ended`` is its count of jobs done or failed so far (a
        slot that ended one was no failure at start); returns the slots whose restart is due
        now, each once, or none while stopping (then no slot is started again)."""
        if jobs_ended > self._jobs_seen:
            self._jobs_seen = jobs_ended
            self._in_a_row = 0
        if stopping:
            self._due.clear()
            return []
        now = self._clock()
        ready = [i for i, at in self._due.items() if at <= now]
        for i in ready:
            del self._due[i]
        return ready

    def died(self, index: int, what: str) -> None:
        """Slot ``index`` died unexpectedly; schedule its restart, or raise WorkerFailing."""
        now = self._clock()
        if now - self._born.get(index, now) >= self._settle:
            self._in_a_row = 0
        self._in_a_row += 1
        if self._in_a_row >= self._limit:
            raise WorkerFailing(f"{what} failed {self._in_a_row} times in a row within {self._settle:g}s of "
                                "starting; stopping (the log above has their errors)")
        self._due[index] = now + min(FIRST_DELAY * 2 ** (self._in_a_row - 1), MAX_DELAY)

    def waiting(self) -> bool:
        return bool(self._due)

    def next_due(self) -> float:
        """When the soonest restart is due (on the clock given), or infinity."""
        return min(self._due.values(), default=float("inf"))
