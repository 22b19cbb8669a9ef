"""The blocking waits: a pull that sleeps until work may be there, and a wait for a job's result.

They sit above what they use: the heartbeat (a store's first pull starts it, after a recovery
pass), and the wake-ups they sleep on (inotify through ``_inotify``, other hosts' rings through
``_doorbell``), all reached through the store's shared :class:`Core`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from .._core import _buckets
from .._core._core import Core
from .._core._doorbell import POLL as DOORBELL_POLL
from .._core._doorbell import Listener
from .._errors import InvalidRequest
from .._format._layout import FINAL_RE
from .._format._values import number
from .._os._inotify import Waker
from ._background import Background

T = TypeVar("T")


def due_in(core: Core) -> float:
    """Seconds until the soonest scheduled job known is due: how long a waiting pull may sleep
    for it (inf: none; at least 1 ms, so a job due now is not looked for in a busy loop)."""
    return max(0.001, core.pending.next_due - core.wall())


class Waiting:
    def __init__(self, core: Core, background: Background) -> None:
        self._core = core
        self._background = background

    def pull(self, attempt: Callable[[], T | None], timeout: float | None) -> T | None:
        """Call ``attempt`` until it returns something or ``timeout`` runs out, sleeping between
        tries until a wake-up, the next due job, or ``poll_interval``, whichever comes first."""
        core = self._core
        if timeout is not None:
            timeout = number(timeout, "timeout (seconds, or None)", at_least=0)
        self._background.start()
        deadline = None if timeout is None else core.clock() + timeout
        bell = core.doorbell.listener(("work",)) if core.doorbell.enabled else None
        while True:
            waker = core.waker
            generation = waker.generation if waker else 0
            got = attempt()
            if got is not None or timeout == 0:
                return got
            remaining = float("inf") if deadline is None else deadline - core.clock()
            if remaining <= 0:
                return None
            if waker is None and core.settings.watch:
                # Started only when a pull has to wait: watching costs a busy process a thread
                # hop per event it causes itself. Start, then look again before sleeping.
                core.start_waker()
                continue
            pause = min(remaining, core.settings.poll_interval, due_in(core))
            self._sleep(waker, generation, pause, bell)
            core.check_open()

    def _sleep(self, waker: Waker | None, generation: int, pause: float, bell: Listener | None) -> None:
        """Wait up to ``pause`` for a local event (inotify) or, with a doorbell, a ring from
        another host; past ``pause`` (or at a ring) the next look lists the directories anew."""
        core = self._core
        end = core.clock() + pause
        if bell is not None:
            bell.rang()  # the first look only learns the names there are
        while True:
            left = end - core.clock()
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
        core.pending.invalidate()

    def wait_final(self, job_id: str, timeout: float | None) -> bool:
        """Wait until job ``job_id`` is in a final state; False if ``timeout`` ran out first.
        Raises JobNotFound if there is no such job. Woken by inotify on the final directories
        (a watcher of its own: pullers are not woken by every result), with a rescan every
        ``poll_interval`` for what inotify cannot see."""
        core = self._core
        if timeout is not None:
            timeout = number(timeout, "timeout (seconds, or None)", at_least=0)
        deadline = None if timeout is None else core.clock() + timeout
        waker = core.start_final_waker()
        bell = core.doorbell.listener(("done",)) if core.doorbell.enabled else None
        try:
            while True:
                generation = waker.generation if waker else 0
                if core.tree.require(job_id).state.is_final:
                    return True
                remaining = float("inf") if deadline is None else deadline - core.clock()
                if remaining <= 0:
                    return False
                self._sleep(waker, generation, min(remaining, core.settings.poll_interval), bell)
                core.check_open()
        finally:
            if bell is not None:
                bell.close()


class Wakeups:
    """An event loop's wake-ups of one kind (``"work"``: something to pull may have arrived;
    ``"done"``: jobs became final), for waiting without a thread per waiter (``fsjobstore.aio``).

    Its own watcher (the store's sync waits keep theirs): :meth:`fileno` is an inotify descriptor
    for the loop's reader, :meth:`take` reads what arrived without blocking. What inotify cannot
    see (another host's work, or no inotify at all) is covered as in the sync waits: by the
    doorbell, looked at every :attr:`interval` seconds, and by retrying at least every
    ``poll_interval``.
    """

    def __init__(self, core: Core, kind: str) -> None:
        if kind not in ("work", "done"):
            raise InvalidRequest(f"wakeups kind must be 'work' or 'done', got {kind!r}")
        self._core = core
        lay = core.layout
        self._ids: set[str] = set()
        self._anything = False
        if kind == "work":
            self._waker = Waker(lay.jobs, core.pending.on_arrival, self._overflowed, skip=_buckets.past_bucket)
        else:
            self._waker = Waker((lay.fulfilled, lay.failed, lay.cancelled), self._finished, self._overflowed)
        self._work = kind == "work"
        if core.settings.watch:
            self._waker.start()
        self._seen = self._waker.generation
        self._bell = core.doorbell.listener((kind,)) if core.doorbell.enabled else None
        if self._bell is not None:
            self._bell.rang()  # the first look only learns the names there are

    def _finished(self, path: str) -> None:
        m = FINAL_RE.match(os.path.basename(path))
        if m is not None:
            self._ids.add(m["id"])

    def _overflowed(self) -> None:
        self._anything = True  # events were lost: anything may have arrived
        if self._work:
            self._core.pending.invalidate()

    def fileno(self) -> int | None:
        """A descriptor that is readable when something arrived (then call :meth:`take`), or
        None (watchdog's thread, or no watching: rely on :attr:`interval`)."""
        return self._waker.fileno()

    @property
    def interval(self) -> float:
        """Seconds between calls of :meth:`take` when nothing is readable: the doorbell's look,
        watchdog's hand-over, else ``poll_interval``."""
        if self._bell is not None:
            return DOORBELL_POLL
        return DOORBELL_POLL if self._waker.mechanism == "watchdog" else self._core.settings.poll_interval

    def due_in(self) -> float:
        """Seconds until the soonest scheduled job known is due (inf: none)."""
        return due_in(self._core)

    # RACE: with watchdog, _finished runs in its thread and may add an id between take()'s copy
    # and its reset: that id is lost, and its waiter looks again after poll_interval anyway.
    def take(self) -> tuple[bool, frozenset[str]]:
        """What arrived since the last call, without blocking: ``(anything, ids)``. ``anything``
        is True when something may have arrived that ids cannot name (new work, a ring from
        another host, lost events); ``ids``: the jobs seen becoming final (kind ``"done"``)."""
        self._waker.poll()
        if self._bell is not None and self._bell.rang():
            self._overflowed()
        generation = self._waker.generation
        anything = self._anything or (self._work and generation != self._seen)
        ids, self._ids, self._anything, self._seen = frozenset(self._ids), set(), False, generation
        return anything, ids

    def close(self) -> None:
        self._waker.stop()
        if self._bell is not None:
            self._bell.close()
