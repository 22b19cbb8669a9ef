"""The bell a supervisor sleeps on between looks at its slots."""

from __future__ import annotations

import contextlib
import math
import os
import select
import weakref
from collections.abc import Sequence


class Bell:
    """What the supervisor (or the thread pool's monitor) sleeps on between looks: a pipe that
    anyone rings (a stop or pause, a signal handler, a slot thread, a child process starting a
    job: all may write to a pipe), so an idle worker wakes only when something happened or a
    known time (a deadline, a publish) comes, not every few milliseconds."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        weakref.finalize(self, _close_both, self._read, self._write)

    def ring(self) -> None:
        with contextlib.suppress(OSError):  # full: it has been rung already
            os.write(self._write, b"\0")

    def wait(self, timeout: float, fds: Sequence[int] = ()) -> None:
        """Until rung, one of ``fds`` is readable, or ``timeout`` seconds pass."""
        # poll(), not select(): select() refuses descriptors past 1023, which a busy process has.
        poller = select.poll()
        for fd in (self._read, *fds):
            poller.register(fd, select.POLLIN)
        with contextlib.suppress(InterruptedError):
            poller.poll(max(0, math.ceil(timeout * 1000)))
        with contextlib.suppress(OSError):
            while os.read(self._read, 4096):
                pass


def _close_both(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
