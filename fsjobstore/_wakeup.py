"""Wake-ups: watchdog tells idle pullers that something arrived; a timer covers what it misses.

inotify is a hint, never the source of truth: its queue overflows (and watchdog drops the
overflow signal), and it sees nothing another host does on a network filesystem. Every wait is
therefore bounded by ``poll_interval``, after which the caller rescans the directories.

We watch ``jobs/`` recursively because watchdog holds back the events of a directory for about
half a second after a file is renamed *out* of it, unless the destination is watched too
(it waits to pair the two halves of the move). Every routine move stays inside ``jobs/``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fsjobstore")


class Waker:
    """Counts arrivals under a directory tree and lets threads wait for the next one."""

    def __init__(self, root: str, on_arrival: Callable[[str], None]) -> None:
        self._root = root
        self._on_arrival = on_arrival
        self._cond = threading.Condition()
        self._generation = 0
        self._observer: Any = None
        self.watching = False

    def start(self) -> None:
        try:
            from watchdog.events import FileCreatedEvent, FileMovedEvent, FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:  # pragma: no cover - watchdog is a dependency
            log.warning("watchdog is not importable; pullers will poll")
            return
        waker = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.is_directory or event.event_type not in ("created", "moved"):
                    return
                path = event.dest_path if event.event_type == "moved" else event.src_path
                waker.arrived(os.fsdecode(path))

        try:
            observer = Observer()
            observer.daemon = True
            # Only creations and moves can mean new work. Filtering here narrows the inotify mask
            # itself, so the kernel never queues the open/modify/close events of every write.
            observer.schedule(_Handler(), self._root, recursive=True,
                              event_filter=[FileCreatedEvent, FileMovedEvent])
            observer.start()
        except Exception as exc:  # inotify limits, unsupported filesystems: degrade to polling
            log.warning("cannot watch %s (%s); pullers will poll", self._root, exc)
            return
        self._observer = observer
        self.watching = True

    def arrived(self, path: str) -> None:
        try:
            self._on_arrival(path)
        finally:
            with self._cond:
                self._generation += 1
                self._cond.notify_all()

    @property
    def generation(self) -> int:
        return self._generation

    def wait(self, since: int, timeout: float) -> None:
        """Return when an arrival happens after generation ``since``, or after ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation != since, timeout=max(0.0, timeout))

    def stop(self) -> None:
        observer, self._observer = self._observer, None
        self.watching = False
        if observer is not None:
            observer.stop()
            if observer.is_alive() and threading.current_thread() is not observer:
                observer.join(timeout=2.0)
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
