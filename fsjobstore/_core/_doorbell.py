"""The doorbell: prompt wake-ups across hosts, where inotify sees nothing another host does.

    control/doorbell/<owner>.<kind>.<n>     kind: "work" (a job or notification became due),
                                            "done" (a job became final)
    control/doorbell/<owner>.ear.done       a process that waits for jobs to become final

Each process keeps at most one bell per kind and rings it by renaming it to the next ``n``.
Waiters list the directory every ``POLL`` seconds and wake when a name they have not seen
appears. Names, not contents or times: on network filesystems a new name shows in the other
host's listing promptly, where a changed file's attributes and contents can be served from the
client's caches for a while. The delays measured on the GlusterFS bed, each with its command,
are in MULTIHOST.md ("What the two-host check tests", "Mount options") and
tests/distfs/README.md ("Facts about two mounts"): kept next to the commands that measure
them, not here, where they would go stale. Rings are made by a thread of their own, at most one per kind
every ``GAP`` seconds, so a burst of creates or commits costs a rename per GAP, not one each (a
ring per commit was an extra rename through FUSE per job: PERFORMANCE.md, "Across hosts"), and
a create never waits for one.

The ``done`` bell rings only while some other process waits for results, which it says with an
ear, an empty file it keeps while it waits: a drain that nobody waits on pays no rename for the
feature (on the replicated bed that rename cost a tenth of the drain: PERFORMANCE.md, "Across
hosts"). A ringer looks for ears at most every ``EAR_LOOK`` seconds, so a wait that begins
meanwhile may go unrung that long (it still finds its job by ``poll_interval``).

It is a hint, like inotify: a missed ring costs a wait of ``poll_interval``, never a job.
On by default on network filesystems only (``JobStore(doorbell=...)``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

from .._format._layout import BELL_RE, EAR_RE, Layout
from .._os import _files as fs
from .._os import _syscalls as sc

KINDS = ("work", "done")
POLL = 0.025  # seconds between looks while waiting: p50 ~ half of it, plus the filesystem's delay
GAP = POLL  # seconds at least between two rings of one process: a waiter cannot tell them apart sooner
EAR_LOOK = 1.0  # seconds a ringer trusts its last look for ears: one listing a second while it rings


class Doorbell:
    def __init__(self, layout: Layout, owner_id: Callable[[], str], *, enabled: bool, file_mode: int) -> None:
        self._layout = layout
        self._owner_id = owner_id
        self.enabled = enabled
        self._mode = file_mode
        self._reset()

    def _reset(self) -> None:
        self._mutex = threading.Lock()
        self._due: set[str] = set()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._mine: dict[str, tuple[str, int]] = {}  # kind -> (owner, n) of our bell
        self._closed = False
        self._hearing = 0  # this process's waits for "done" under way
        self._ear: str | None = None  # the path of our ear, while we have one
        self._heard: tuple[float, bool] = (-EAR_LOOK, False)  # (when, answer) of the last look for ears

    def after_fork(self) -> None:
        self._reset()

    # -- ringing ---------------------------------------------------------------------------------
    def ring(self, kind: str) -> None:
        if not self.enabled:
            return
        with self._mutex:
            self._due.add(kind)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._ringer, name="fsjobstore-doorbell", daemon=True)
                self._thread.start()
        self._wake.set()

    def _ringer(self) -> None:
        while True:
            self._wake.wait()
            with self._mutex:
                if self._closed:
                    return
                due, self._due = self._due, set()
                self._wake.clear()
            for kind in due:
                if kind == "done" and not self._anyone_hears():
                    continue
                with contextlib.suppress(OSError):  # a missed ring costs a poll interval, nothing more
                    self._ring_now(kind)
            # Rings asked for meanwhile wait and go out as one. The first ring after a quiet spell
            # is never delayed: this only thins a stream.
            time.sleep(GAP)

    def _ring_now(self, kind: str) -> None:
        owner = self._owner_id()
        mine = self._mine.get(kind)
        n = 0 if mine is None or mine[0] != owner else mine[1] + 1
        new = os.path.join(self._layout.doorbell, f"{owner}.{kind}.{n:x}")
        if mine is not None and mine[0] == owner:
            old = os.path.join(self._layout.doorbell, f"{owner}.{kind}.{mine[1]:x}")
            try:
                sc.rename(old, new)
                self._mine[kind] = (owner, n)
                return
            except FileNotFoundError:
                pass  # swept (we were judged gone once): make it anew
        fs.touch(new, self._mode)
        self._mine[kind] = (owner, n)

    def _anyone_hears(self) -> bool:
        """Whether another process waits for results (has an ear): looked up at most every
        EAR_LOOK seconds. A look that fails says yes: a ring too many costs a rename."""
        now = time.monotonic()
        at, answer = self._heard
        if now - at < EAR_LOOK:
            return answer
        me = self._owner_id()
        try:
            answer = any((m := EAR_RE.match(name)) is not None and m["owner"] != me for name in self.names())
        except OSError:
            answer = True
        self._heard = (now, answer)
        return answer

    # -- ears: the "done" bell's listeners --------------------------------------------------------
    def hear(self) -> None:
        """A wait for results begins in this process: keep an ear while any does."""
        with self._mutex:
            self._hearing += 1
            if self._hearing == 1 and not self._closed:
                self._touch_ear()

    def unhear(self) -> None:
        with self._mutex:
            self._hearing -= 1
            ear, self._ear = (self._ear, None) if self._hearing == 0 else (None, self._ear)
        if ear is not None:
            fs.unlink_quietly(ear)

    def keep_ear(self) -> None:
        """While a wait goes on (called at each of its looks): make the ear again under this
        process's identity if that changed (a mount lost and mounted again: the old one is a gone
        owner's, swept by recovery). No call while it has not."""
        with self._mutex:
            if self._hearing and not self._closed and self._ear != self._ear_path():
                old = self._ear
                self._touch_ear()
                if old is not None:
                    fs.unlink_quietly(old)

    def _ear_path(self) -> str:
        return os.path.join(self._layout.doorbell, f"{self._owner_id()}.ear.done")

    def _touch_ear(self) -> None:
        path = self._ear_path()
        try:
            fs.touch(path, self._mode)
        except OSError:
            return  # unheard: its waits find their jobs by poll_interval
        self._ear = path

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            mine, self._mine = self._mine, {}
            ear, self._ear = self._ear, None
        self._wake.set()
        for kind, (owner, n) in mine.items():
            fs.unlink_quietly(os.path.join(self._layout.doorbell, f"{owner}.{kind}.{n:x}"))
        if ear is not None:
            fs.unlink_quietly(ear)

    # -- listening -------------------------------------------------------------------------------
    def listener(self, kinds: tuple[str, ...]) -> Listener:
        return Listener(self, kinds)

    def names(self) -> list[str]:
        return fs.scan_names(self._layout.doorbell)


class Listener:
    """One waiter's view of the doorbell: :meth:`rang` is true once a bell of one of its kinds
    (of another process) changed since the previous look. One that listens for ``done`` keeps
    its process's ear until :meth:`close` (but in a read-only store: its waits are not rung)."""

    def __init__(self, bell: Doorbell, kinds: tuple[str, ...]) -> None:
        self._bell = bell
        self._kinds = kinds
        self._seen: set[str] | None = None
        self._hears = "done" in kinds and not sc.only_reading()  # a read-only store writes no ear
        if self._hears:
            bell.hear()

    def close(self) -> None:
        if self._hears:
            self._hears = False
            self._bell.unhear()

    def rang(self) -> bool:
        if self._hears:
            self._bell.keep_ear()
        me = self._bell._owner_id()
        now = set()
        for name in self._bell.names():
            m = BELL_RE.match(name)
            if m and m["kind"] in self._kinds and m["owner"] != me:
                now.add(name)
        before, self._seen = self._seen, now
        return before is not None and bool(now - before)
