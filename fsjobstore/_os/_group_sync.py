"""Directory fsyncs shared by the threads that ask for them at once: a group commit.

A rename is durable once its directory has been fsynced after it. When several threads of a
process (a worker's slots) commit into one directory at once, one fsync begun after all of their
renames makes every one of them durable. So the first thread to ask runs it; a thread that asks
while it runs waits for the next one, which the first of the waiters runs for every thread that
asked by then. Each caller returns only once an fsync that began after it asked has succeeded.

A failed fsync is never followed by a second one that could be taken as proof (FORMAT.md,
"Durability": the kernel may have dropped what the first one failed to write, and the second then
succeeds with nothing to write): every caller that the failed fsync was to cover gets its error.

Across processes the filesystem's journal merges concurrent fsyncs on its own; this adds that
merging within a process, where the threads' fsyncs of one directory otherwise queue on its lock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from .._errors import StorageError


class _Directory:
    """The shared fsync of one directory: tickets asked, and how far fsyncs have covered them."""

    __slots__ = ("asked", "done", "failed", "running", "users")

    def __init__(self) -> None:
        self.asked = 0  # tickets handed out: every change made before its ticket is to be covered
        self.done = 0  # every ticket up to this one is durable
        self.failed: tuple[int, int, StorageError] | None = None  # tickets (lo, hi] the last failure was to cover
        self.running = False
        self.users = 0  # threads in sync() for it: the entry goes when none are


class GroupSync:
    """Run ``fsync(path)`` for every thread that asks, as few times as that takes (see the module
    docstring). Thread-safe; rebuild it in a forked child (its lock may be held by a thread that
    the child does not have)."""

    def __init__(self, fsync: Callable[[str], None]) -> None:
        self._fsync = fsync
        self._cond = threading.Condition(threading.Lock())
        self._dirs: dict[str, _Directory] = {}

    def sync(self, path: str) -> None:
        """Return once an fsync of ``path`` begun after this call has succeeded; StorageError if
        the one that was to cover it failed."""
        with self._cond:
            entry = self._dirs.get(path)
            if entry is None:
                entry = self._dirs[path] = _Directory()
            entry.users += 1
            entry.asked += 1
            ticket = entry.asked
            leading = False
            try:
                while True:
                    if entry.done >= ticket:
                        return
                    if entry.failed is not None and entry.failed[0] < ticket <= entry.failed[1]:
                        raise _copy(entry.failed[2])
                    if not entry.running:
                        # Ours to run, for every ticket asked so far. RACE: a ticket asked after
                        # this point may be a change made after the fsync began: it waits for the next.
                        entry.running = leading = True
                        batch, before = entry.asked, entry.done
                        break
                    self._cond.wait()
            finally:
                if not leading:
                    self._leave(path, entry)
        error: StorageError | None = None
        synced = False
        try:
            self._fsync(path)
            synced = True
        except StorageError as exc:
            error = exc
            raise
        finally:
            # Anything else that stopped it (an interrupt) proves nothing and reports no failure:
            # a waiter runs the fsync again.
            with self._cond:
                entry.running = False
                if synced:
                    entry.done = max(entry.done, batch)
                elif error is not None:
                    entry.failed = (before, batch, error)
                self._leave(path, entry)
                self._cond.notify_all()

    def _leave(self, path: str, entry: _Directory) -> None:
        entry.users -= 1
        if entry.users == 0 and not entry.running:
            del self._dirs[path]  # tickets are per burst: the next caller starts a fresh count


def _copy(error: StorageError) -> StorageError:
    """The error of the fsync that failed for several callers, raised anew in each."""
    copy = type(error)(error.errno, error.strerror, error.filename)
    copy.op = error.op
    return copy


_GROUP: GroupSync | None = None


def group(fsync: Callable[[str], None]) -> GroupSync:
    """This process's GroupSync (made on first use, and again in a forked child)."""
    global _GROUP
    if _GROUP is None:
        _GROUP = GroupSync(fsync)
    return _GROUP


def _forget_after_fork() -> None:
    global _GROUP
    _GROUP = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
