"""Wake-ups: idle pullers learn at once that something arrived; a timer covers what they miss.

Wake-ups are hints, never the source of truth: inotify's queue overflows, and it sees nothing
another host does on a network filesystem. Every wait is therefore bounded by
``poll_interval``, after which the caller rescans the directories.

On Linux the waiting thread itself blocks on an inotify descriptor (the kernel API, through
ctypes): the event that makes a job visible wakes the very thread that will claim it. An
earlier version used watchdog's observer, which hands each event through three threads and a
queue; that cost 1.5-2 ms per wake-up here against the kernel's 0.1-0.3 ms (PERFORMANCE.md).
watchdog remains the fallback where inotify cannot be used (other systems, no ctypes). In
both cases ``jobs/`` is watched as a tree: its queue directories, ``scheduled`` and ``notify``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import math
import os
import select
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import _syscalls as sc
from ._syscalls import libc_function

log = logging.getLogger("fsjobstore")

_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_ISDIR = 0x40000000
# Never through a link (FORMAT.md, "Trust"): the watched directory is opened beneath the store's root by
# _syscalls (a link, FIFO or file planted there is quarantined and a directory made in its
# place), and the watch is added on that very descriptor through /proc/self/fd, so no component
# of the path is looked up again. Without /proc the path is used, with IN_DONT_FOLLOW on its
# last name and the components above it checked just before by the open.
_MASK = _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_BY_FD = os.path.isdir("/proc/self/fd")
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len
# Pullers wait on pending, scheduled and notify; nobody waits for a claim, and waiting for
# results (JobStore.wait) uses a Waker of its own on the final directories.
# Jobs parked by a limit (waiting/) wake nobody either: their promotion into a queue does.
_UNWATCHED = frozenset({"active", "fulfilled", "failed", "cancelled", "waiting"})


_INIT = libc_function("inotify_init1", [ctypes.c_int])
_ADD_WATCH = libc_function("inotify_add_watch", [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32])


def _add_watch(inotify_fd: int, dfd: int, directory: str, mask: int) -> int:
    """Watch the directory open on ``dfd`` (named ``directory``); the watch descriptor, or -1
    with the reason in ``ctypes.get_errno()``. Through /proc/self/fd, the very directory opened,
    whatever happens to its path meanwhile; without /proc, the path, not following a link at its
    last name (the components above were checked by the open just before)."""
    assert _ADD_WATCH is not None
    if _BY_FD:
        wd: int = _ADD_WATCH(inotify_fd, f"/proc/self/fd/{dfd}".encode(), mask)
    else:
        wd = _ADD_WATCH(inotify_fd, os.fsencode(directory), mask | _IN_DONT_FOLLOW)
    return wd


def _events(buf: bytes) -> Iterator[tuple[int, int, bytes]]:
    """The (watch descriptor, mask, name) of each event record in ``buf``, as read from an
    inotify descriptor."""
    off = 0
    while off < len(buf):
        wd, mask, _cookie, length = _HEADER.unpack_from(buf, off)
        yield wd, mask, buf[off + _HEADER.size: off + _HEADER.size + length].rstrip(b"\0")
        off += _HEADER.size + length


class Waker:
    """Counts arrivals under ``jobs/`` and lets threads wait for the next one.

    ``on_arrival(path)`` is called for each file that appears; ``on_overflow()`` when events
    were lost (the caller then rescans). Thread-safe; one waiting thread at a time reads the
    descriptor and the others wait on a condition it signals.
    """

    def __init__(self, root: str | tuple[str, ...], on_arrival: Callable[[str], None],
                 on_overflow: Callable[[], None] = lambda: None,
                 skip: Callable[[str, str], bool] = lambda parent, name: False) -> None:
        self._roots = (root,) if isinstance(root, str) else root
        self._skip = skip  # (parent, name) of a directory found at start that need not be watched
        self._on_arrival = on_arrival
        self._on_overflow = on_overflow
        self._cond = threading.Condition()
        self._generation = 0
        self._fd = -1
        self._pipe: tuple[int, int] | None = None  # wakes the reader when we stop
        # poll(), not select(): select() refuses descriptors past 1023, which a busy process has.
        self._poller: select.poll | None = None
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory
        self._reading = False
        self._stopped = False
        self._observer: Any = None
        self.watching = False

    # -- starting ---------------------------------------------------------------------------
    def start(self) -> None:
        if _INIT is not None and _ADD_WATCH is not None and self._start_inotify():
            return
        self._start_watchdog()

    def _start_inotify(self) -> bool:
        fd = _INIT(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            log.warning("inotify_init1 failed (%s); trying watchdog", os.strerror(ctypes.get_errno()))
            return False
        self._fd = fd
        self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._poller.register(self._pipe[0], select.POLLIN)
        self.watching = True
        try:
            for root in self._roots:
                self._watch_tree(root)
        except OSError as exc:  # fs.inotify.max_user_watches, say: degrade to polling
            log.warning("cannot watch %s (%s); pullers will poll", self._roots[0], exc)
            self._close_fds()
            self.watching = False
            return True  # watchdog would hit the same limit
        return True

    def _watch(self, directory: str) -> list[str] | None:
        """Watch ``directory``; returns the names of the directories in it (None: not watched)."""
        try:
            dfd = sc.open(directory, _DIR_OPEN)
        except (FileNotFoundError, NotADirectoryError):
            return None  # gone: nothing to watch
        try:
            wd = _add_watch(self._fd, dfd, directory, _MASK)
            code = ctypes.get_errno() if wd < 0 else 0
            subdirs: list[str] = []
            if wd >= 0:
                # Listed through the same descriptor (d_type, no stat per entry), so a link
                # planted in place of the directory meanwhile is never listed either.
                with contextlib.suppress(OSError), os.scandir(dfd) as it:
                    subdirs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        finally:
            sc.close_read(dfd)
        if wd < 0:
            if code in (errno.ENOENT, errno.ENOTDIR):
                return None  # gone, or not a directory: nothing to watch
            raise OSError(code, os.strerror(code), directory)
        self._dirs[wd] = directory
        return subdirs

    def _watch_tree(self, directory: str) -> None:
        """Watch ``directory`` and the directories below it (queue directories, ...)."""
        subdirs = self._watch(directory)
        for name in subdirs or ():
            if name not in _UNWATCHED and not self._skip(directory, name):
                self._watch_tree(os.path.join(directory, name))

    def _start_watchdog(self) -> None:
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
            for root in self._roots:
                observer.schedule(_Handler(), root, recursive=True,
                                  event_filter=[FileCreatedEvent, FileMovedEvent])
            observer.start()
        except Exception as exc:  # inotify limits, unsupported filesystems: degrade to polling
            log.warning("cannot watch %s (%s); pullers will poll", self._roots[0], exc)
            return
        self._observer = observer
        self.watching = True

    # -- events -----------------------------------------------------------------------------
    def arrived(self, path: str) -> None:
        try:
            self._on_arrival(path)
        finally:
            with self._cond:
                self._generation += 1
                self._cond.notify_all()

    def _read_events(self) -> bool:
        """Read everything queued on the descriptor and dispatch it (no lock held); True if
        anything was read."""
        overflow = read = False
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                log.warning("reading inotify events failed: %s; pullers will poll", exc)
                self.watching = False
                break
            read = True
            for wd, mask, name in _events(buf):
                if mask & _IN_Q_OVERFLOW:
                    overflow = True
                elif mask & _IN_IGNORED:
                    self._dirs.pop(wd, None)  # its directory went (quarantined)
                elif wd in self._dirs and not overflow:
                    path = os.path.join(self._dirs[wd], os.fsdecode(name))
                    if mask & _IN_ISDIR:
                        # A new queue directory: watch it, and rescan, since files may have
                        # landed in it before the watch existed.
                        with contextlib.suppress(OSError):
                            self._watch_tree(path)
                        overflow = True
                    else:
                        self._on_arrival(path)
        if overflow:
            self._on_overflow()
        return read

    def fileno(self) -> int | None:
        """The inotify descriptor, readable when events wait (for an event loop's reader; then
        call :meth:`poll`), or None when wake-ups come from watchdog's thread or not at all."""
        return self._fd if self._fd >= 0 and self.watching else None

    def poll(self) -> None:
        """Read and dispatch what waits on the descriptor, without blocking: one caller at a
        time (an event loop's reader), never beside a thread in :meth:`wait`."""
        if self._fd >= 0 and not self._stopped and self._read_events():
            with self._cond:
                self._generation += 1
                self._cond.notify_all()

    @property
    def mechanism(self) -> str:
        """What delivers wake-ups: "inotify" (our own reader), "watchdog" (the fallback) or "none"."""
        if not self.watching:
            return "none"
        return "inotify" if self._fd >= 0 else "watchdog"

    @property
    def generation(self) -> int:
        return self._generation

    def wait(self, since: int, timeout: float) -> None:
        """Return when an arrival happens after generation ``since``, or after ``timeout``."""
        if self._fd < 0:
            with self._cond:
                self._cond.wait_for(lambda: self._generation != since, timeout=max(0.0, timeout))
            return
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._generation == since and not self._stopped:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                if self._reading:
                    self._cond.wait(remaining)
                    continue
                self._reading = True
                self._cond.release()
                try:
                    self._read_once(remaining)
                finally:
                    self._cond.acquire()
                    self._reading = False
                    self._cond.notify_all()

    def kick(self) -> None:
        """Wake every waiting thread, as an arrival would (a limit's slot freed: nothing on disk
        changed that inotify could see)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            if self._pipe is not None and not self._stopped:
                with contextlib.suppress(OSError):
                    os.write(self._pipe[1], b"k")

    def _read_once(self, timeout: float) -> None:
        assert self._poller is not None
        ready = {fd for fd, _ in self._poller.poll(max(0, math.ceil(timeout * 1000)))}
        if self._pipe is not None and self._pipe[0] in ready and not self._stopped:
            with contextlib.suppress(OSError):
                os.read(self._pipe[0], 4096)  # kicks: drained, or every later poll would return at once
        if self._fd in ready and not self._stopped:
            self._read_events()
            with self._cond:
                self._generation += 1

    # -- stopping ---------------------------------------------------------------------------
    def stop(self) -> None:
        observer, self._observer = self._observer, None
        self.watching = False
        if observer is not None:
            observer.stop()
            if observer.is_alive() and threading.current_thread() is not observer:
                observer.join(timeout=2.0)
        with self._cond:
            self._stopped = True
            self._generation += 1
            if self._pipe is not None:
                with contextlib.suppress(OSError):
                    os.write(self._pipe[1], b"x")
            self._cond.wait_for(lambda: not self._reading, timeout=2.0)
            self._cond.notify_all()
            if not self._reading:
                self._close_fds()

    def abandon_after_fork(self) -> None:
        """In a forked child: close our copies of the parent's descriptors, start nothing."""
        self._observer = None
        self._close_fds()

    def _close_fds(self) -> None:
        fds = [self._fd, *(self._pipe or ())]
        self._fd, self._pipe, self._poller = -1, None, None
        self._dirs = {}
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)



class NameWatch:
    """Which names a few flat directories hold, kept current by inotify, so that asking whether
    one name is there costs a poll of one descriptor, not a lookup of the name.

    Exact on this host: the kernel queues an event inside the very system call that makes or
    removes a name, so once that call has returned in any process, the next question here sees
    it. So a check made after a step of ours (a commit's rename) is ordered against another
    process's name made before its own check, as a lookup would be. Blind to other hosts: a
    store that may be shared by several (reads may lag) must not use one.

    A directory is watched from the first question about it: the watch first, then one
    listing (an event for a name listed already changes nothing, as each event states what a
    name became). Whatever the events cannot follow (a queue overflow, a watched directory or
    one between it and ``root`` removed or moved away: a repair, a planted swap; a failed read)
    starts it over: the next question about each directory watches and lists anew what the
    store's path names then. (A directory's events go with its inode, so the directories above
    it, up to the root the store holds open, are watched for their own move or removal too.)
    :meth:`has` answers None, and the caller looks the name up, for a directory not asked for at
    construction, or whose watch cannot be made (it is missing; inotify's limits). Thread-safe.
    In a forked child call :meth:`abandon_after_fork` (the parent's descriptor is shared:
    reading it would take the parent's events) and build a new one."""

    _MASK = (_IN_CREATE | _IN_MOVED_TO | _IN_DELETE | _IN_MOVED_FROM | _IN_DELETE_SELF | _IN_MOVE_SELF
             | _IN_ONLYDIR)
    _GUARD_MASK = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR

    def __init__(self, root: str, directories: tuple[str, ...]) -> None:
        """``directories``: paths below ``root`` (the store's root, which it holds open)."""
        self._lock = threading.Lock()
        self._root = root.rstrip("/")
        self._all = frozenset(directories)
        self._wanted = set(directories)
        self._fd = -1
        self._poller: select.poll | None = None
        self._names: dict[str, set[str]] = {}  # watched directory -> the names in it
        self._frozen: dict[str, frozenset[str]] = {}  # listing() answers, until the next change
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory
        self._guards: set[int] = set()  # watch descriptors of the directories above them

    def has(self, directory: str, name: str) -> bool | None:
        """Whether ``directory`` holds ``name`` now; None: unknown here (look it up)."""
        with self._lock:
            names = self._current(directory)
            return None if names is None else name in names

    def listing(self, directory: str) -> frozenset[str] | None:
        """Every name ``directory`` holds now; None: unknown here (list it)."""
        with self._lock:
            names = self._current(directory)
            if names is None:
                return None
            frozen = self._frozen.get(directory)  # (dropped by every change)
            if frozen is None:
                frozen = self._frozen[directory] = frozenset(names)
            return frozen

    def _current(self, directory: str) -> set[str] | None:
        names = self._names.get(directory)
        if names is not None and self._poller is not None and self._poller.poll(0):
            self._read()  # (which may start over)
            names = self._names.get(directory)
        if names is None:
            # A listing made now, after the watch: it holds every change made before this question.
            if directory not in self._wanted or not self._start(directory):
                return None
            names = self._names[directory]
        return names

    def _start(self, directory: str) -> bool:
        self._wanted.discard(directory)  # tried once: if it fails, lookups answer for it from now on
        if self._fd < 0:
            if _INIT is None or _ADD_WATCH is None:
                return False
            fd = _INIT(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:  # fs.inotify.max_user_instances, say: lookups it is
                log.debug("inotify_init1 failed (%s); names are looked up", os.strerror(ctypes.get_errno()))
                return False
            self._fd, self._poller = fd, select.poll()
            self._poller.register(fd, select.POLLIN)
        # Down from the root, each directory opened by its one name in the one above, never from
        # a cache of paths: the directories above it are watched first (guards), so one moved
        # after its guard is made starts the watch over, and the directory watched is the one
        # inside the guarded ones.
        if not directory.startswith(self._root + "/"):
            return False
        parts = directory[len(self._root) + 1:].split("/")
        try:
            fd = sc.open(f"{self._root}/{parts[0]}", _DIR_OPEN)  # beneath the root, its name looked up afresh
        except OSError:
            return False
        try:
            for k, part in enumerate(parts):
                if k:
                    below = os.open(part, _DIR_OPEN, dir_fd=fd)  # one name, no link followed
                    sc.close_read(fd)
                    fd = below
                last = k == len(parts) - 1
                path = f"{self._root}/{'/'.join(parts[:k + 1])}"
                wd = _add_watch(self._fd, fd, path, self._MASK if last else self._GUARD_MASK)
                if wd < 0:
                    log.debug("cannot watch %s (%s); its names are looked up", path,
                              os.strerror(ctypes.get_errno()))
                    return False
                if not last:
                    self._guards.add(wd)
                    continue
                with os.scandir(fd) as it:
                    self._names[directory] = {e.name for e in it}
                self._dirs[wd] = directory
        except OSError:
            return False  # (a watch made stays, unused: its events name no watched directory)
        finally:
            sc.close_read(fd)
        return True

    def _read(self) -> None:
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:  # never expected
                log.warning("reading inotify events failed: %s; the names are listed again", exc)
                self._start_over()
                return
            for wd, mask, name in _events(buf):
                directory = self._dirs.get(wd)
                watched = directory is not None or wd in self._guards
                gone = watched and mask & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED)
                if mask & _IN_Q_OVERFLOW or gone:
                    # Events were lost, or the directory watched is no longer the one the store
                    # names (or soon will not be): what the path names now is watched anew.
                    self._start_over()
                    return
                if directory is None:
                    continue
                self._frozen.pop(directory, None)
                if mask & (_IN_CREATE | _IN_MOVED_TO):
                    self._names[directory].add(os.fsdecode(name))
                elif mask & (_IN_DELETE | _IN_MOVED_FROM):
                    self._names[directory].discard(os.fsdecode(name))

    def _start_over(self) -> None:
        fd, self._fd, self._poller = self._fd, -1, None
        self._names, self._frozen, self._dirs, self._wanted = {}, {}, {}, set(self._all)
        self._guards = set()
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def abandon_after_fork(self) -> None:
        """In a forked child: close our copy of the parent's descriptor without reading it. Takes
        no lock: a thread of the parent may have held it at the fork, and no thread of the child
        would ever let it go (the child uses a new NameWatch)."""
        self._stop()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        self._all = frozenset()  # nothing to start over with: every question is looked up
        self._start_over()
