"""The blocking waits: a pull that sleeps until work may be there, and a wait for a job's result.

They sit above what they use: the heartbeat (a store's first pull starts it, after a recovery
pass), and the wake-ups they sleep on (inotify through ``_wakeup``, other hosts' rings through
``_doorbell``), all reached through the store's shared :class:`Core`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ._checks import number
from ._doorbell import POLL as DOORBELL_POLL
from ._doorbell import Listener
from ._heart import Heart
from ._shared import Core
from ._wakeup import Waker

T = TypeVar("T")


class Waiting:
    def __init__(self, core: Core, heart: Heart) -> None:
        self._core = core
        self._heart = heart

    def pull(self, attempt: Callable[[], T | None], timeout: float | None) -> T | None:
        """Call ``attempt`` until it returns something or ``timeout`` runs out, sleeping between
        tries until a wake-up, the next due job, or ``poll_interval``, whichever comes first."""
        core = self._core
        if timeout is not None:
            timeout = number(timeout, "timeout (seconds, or None)", at_least=0)
        self._heart.start()
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
            pause = min(remaining, core.settings.poll_interval, max(0.001, core.pending.next_due - core.wall()))
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
        while True:
            generation = waker.generation if waker else 0
            if core.tree.require(job_id).state.is_final:
                return True
            remaining = float("inf") if deadline is None else deadline - core.clock()
            if remaining <= 0:
                return False
            self._sleep(waker, generation, min(remaining, core.settings.poll_interval), bell)
            core.check_open()
