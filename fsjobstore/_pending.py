"""A process-local index of the first few pending names per queue, so a claim is O(log n).

Listing a directory of 100,000 entries costs tens of milliseconds; doing it per claim would make
a claim slower the deeper the queue. We keep only the ``limit`` smallest names (the next jobs to
run, since names sort by priority then creation) and list again when they run out, when the
cached view is older than ``rescan_interval``, or never sooner. Arrivals reported by the waker
are merged in at once, so a new urgent job does not wait for the next listing.

The index is only a hint: a name in it may already be claimed by another process (the claim's
rename then fails with ENOENT and we move on), and the directory stays the truth.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable

from . import _fsops as fs
from ._layout import PENDING_RE


class QueueIndex:
    def __init__(self, directory: str, limit: int, rescan_interval: float,
                 clock: Callable[[], float], on_bad_name: Callable[[str], None]) -> None:
        self.directory = directory
        self._limit = limit
        self._rescan = rescan_interval
        self._clock = clock
        self._on_bad_name = on_bad_name
        self._heap: list[str] = []
        self._known: set[str] = set()
        self._truncated = False
        self._ceiling = ""  # when truncated: the largest name we kept
        self._listed_at = float("-inf")
        self._mutex = threading.Lock()

    def _refill(self) -> None:
        names = []
        for name in fs.scan_names(self.directory):
            if PENDING_RE.match(name):
                names.append(name)
            elif not name.startswith("."):
                self._on_bad_name(name)
        kept = heapq.nsmallest(self._limit, names)
        self._truncated = len(names) > len(kept)
        self._ceiling = kept[-1] if kept else ""
        self._heap = kept  # nsmallest returns a sorted list, which is a valid heap
        self._known = set(kept)
        self._listed_at = self._clock()

    def add(self, name: str) -> None:
        """Merge an arrival reported by the waker."""
        if not PENDING_RE.match(name):
            return
        with self._mutex:
            if name in self._known or (self._truncated and name > self._ceiling):
                return  # the next listing will find it in order
            heapq.heappush(self._heap, name)
            self._known.add(name)

    def peek(self) -> str | None:
        with self._mutex:
            self._maybe_refill()
            return self._heap[0] if self._heap else None

    def pop(self) -> str | None:
        with self._mutex:
            self._maybe_refill()
            if not self._heap:
                return None
            name = heapq.heappop(self._heap)
            self._known.discard(name)
            return name

    def _maybe_refill(self) -> None:
        if not self._heap or self._clock() - self._listed_at >= self._rescan:
            self._refill()

    def invalidate(self) -> None:
        with self._mutex:
            self._listed_at = float("-inf")
