"""Store statistics: the counts ``JobStore.statistics()`` returns, from one listing of each directory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from . import _fsops as fs
from ._control import Control
from ._layout import PENDING_RE
from ._shared import Core


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """A snapshot of one store's counts, from a single listing of each directory."""

    pending: int
    scheduled: int
    active: int
    fulfilled: int
    failed: int
    cancelled: int
    notifications: int  # final jobs with targets still waiting
    quarantined: int
    pending_by_queue: Mapping[str, int]
    oldest_pending_age: float | None  # seconds since the oldest pending job was created
    paused: frozenset[str]  # queues no worker takes jobs from
    watching: bool  # whether *this process* gets inotify wake-ups (it has waited in a pull)


def statistics(core: Core, control: Control) -> StoreStatistics:
    """Count each state's directory, the pending jobs per queue and the oldest of them."""
    lay = core.layout
    by_queue: dict[str, int] = {}
    oldest: int | None = None
    for q in fs.scan_names(lay.pending):
        try:
            names = [n for n in fs.scan_names(lay.pending_dir(q)) if PENDING_RE.match(n)]
        except NotADirectoryError:
            continue  # a file planted where a queue belongs: the next pull quarantines it
        by_queue[q] = len(names)
        for n in names:
            seq = int(n.split(".", 2)[1])
            oldest = seq if oldest is None else min(oldest, seq)
    quarantined = sum(1 for n in fs.scan_names(lay.quarantine) if not n.endswith(".reason"))
    waker = core.waker
    return StoreStatistics(
        pending=sum(by_queue.values()),
        scheduled=len(fs.scan_names(lay.scheduled)),
        active=len(fs.scan_names(lay.active)),
        fulfilled=len(fs.scan_names(lay.fulfilled)),
        failed=len(fs.scan_names(lay.failed)),
        cancelled=len(fs.scan_names(lay.cancelled)),
        notifications=len(fs.scan_names(lay.notify)),
        quarantined=quarantined,
        pending_by_queue=by_queue,
        oldest_pending_age=None if oldest is None else max(0.0, core.wall() - oldest / 1e9),
        paused=control.paused(),
        watching=bool(waker and waker.watching),
    )
