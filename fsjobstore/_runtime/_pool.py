"""What a worker's pool is: the one shape ``Worker`` drives, whatever runs the handlers.

The worker (the thread that called ``run``) is the pool's supervisor: it starts the pool, sets
the run's :class:`Gate` (stop, pause; the slots take the job budget from it), and between
naps on its bell calls :meth:`Pool.tick` (time limits, cancel requests, slots that died,
recovery). It knows no more of the pool than this protocol, so a new kind of pool (an asyncio
one) is one class, not another branch in ``Worker``.
"""

from __future__ import annotations

from typing import Protocol

from ._slot import Tally


class Pool(Protocol):
    def start(self) -> None:
        """Start every slot (again, for a burst's next round)."""

    def alive(self) -> bool:
        """Whether any slot still runs, or is to be started again, or has an attempt still to tell."""

    def tick(self) -> None:
        """One look at every slot: time limits, cancel requests, slots that died or ended.
        Raises WorkerFailing when slots keep dying at start."""

    def next_tick(self, now: float) -> float:
        """Seconds until the next :meth:`tick` is due if nothing rings the supervisor's bell."""

    def wait_fds(self) -> list[int]:
        """Descriptors that become readable when the pool wants a :meth:`tick` (a child exited)."""

    def give_back(self) -> None:
        """The grace period is over: every job still running goes back to pending, uncounted."""

    def close(self) -> None:
        """``run()`` is ending (normally, or on an error): leave nothing running that could still
        claim a job."""

    def running(self) -> list[dict[str, object]]:
        """What runs now: ``{"id", "queue", "attempt", "started_at"}`` (and ``"pid"`` in a child)."""

    def tally(self) -> Tally:
        """How the attempts of this run ended so far."""
