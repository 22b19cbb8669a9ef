"""Owner liveness: who holds what, and how the others can tell the holder is gone.

Two facts decide whether a claim's holder is gone (FORMAT.md, "Leases"):

* **Dead.** Each open store holds an exclusive ``flock`` (taken through filelock's
  ``lock_descriptor``) on its own ``leases/<owner>.owner`` file for as long as it lives. The
  kernel drops that lock the instant the process exits, however it exits, so any process on the
  same host can prove the owner dead with one non-blocking lock attempt.
* **Hung.** The owner's heartbeat thread rewrites a counter in that file every
  ``heartbeat_interval``. An observer that sees the counter unchanged for ``lease_duration``
  seconds of *its own* monotonic clock declares the owner expired. Wall clocks and file mtimes
  are never compared, so clock jumps and skew cannot expire a live owner early.

We do not use filelock's ``SoftFileLease``: it detects a dead holder only by expiry (not at once
via flock), and runs a thread per lease; here one heartbeat covers every claim of a process.
Leases only say who *should* work; what stops a superseded holder from committing is the
fencing rename in ``_store`` (the claim token is part of the claimed file's name).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Literal

from .._errors import StorageError
from .._format._layout import Layout
from .._os import _syscalls as sc
from .._os._beneath import DISCONNECTED
from .._os._files import FILE_MODE, GONE, O_CLOEXEC, O_NOFOLLOW, names_file, unlink

log = logging.getLogger("fsjobstore")

_BEAT_WIDTH = 255  # fixed width so a heartbeat is one pwrite, never a truncate + write

Status = Literal["alive", "dead", "expired"]


class OwnerGone(OSError):
    """Our owner file is gone: another process judged us dead or expired and cleaned up."""


class OwnerLease:
    """This store instance's liveness file, locked for its lifetime and beaten by its thread."""

    def __init__(self, layout: Layout, lease_duration: float, mode: int = FILE_MODE) -> None:
        self.owner = secrets.token_hex(8)
        self.path = layout.owner_path(self.owner)
        self._lease_duration = lease_duration
        self._beats = 0
        self._lock = threading.Lock()
        # The file must never be visible under its real name unlocked, or a prober could judge
        # us dead in the instant between create and flock. So: create and lock it under a hidden
        # name that no sweep looks at, then rename it into place already locked.
        hidden = os.path.join(os.path.dirname(self.path), f".{self.owner}.init")
        fd = sc.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
        try:
            if mode != FILE_MODE:
                sc.fchmod(fd, mode)  # group stores: other members must be able to probe it
            if not sc.try_lock(fd):  # a fresh random name: nobody else has it
                raise OSError(errno.EAGAIN, "could not lock a fresh owner file", hidden)
            self._fd: int | None = fd
            self._write_beat(fd)  # under its hidden name still: beat() would find it "gone"
            sc.rename(hidden, self.path)
        except BaseException:
            with contextlib.suppress(OSError):  # must not hide the error that brought us here
                sc.close(fd)
            with contextlib.suppress(OSError):
                sc.unlink(hidden)
            raise

    def beat(self) -> None:
        """Publish a new heartbeat value; raises OSError if it cannot be written, and
        :class:`OwnerGone` if our file is no longer there (another process removed it)."""
        with self._lock:
            if self._fd is None:
                return
            try:
                self._write_beat(self._fd)
            except OSError as exc:
                # On a network filesystem, a file another host removed fails the write with
                # ESTALE rather than succeeding: a fresh lookup tells that from a storage fault.
                if exc.errno in GONE and not sc.lexists(self.path):
                    raise OwnerGone(f"owner {self.owner}'s file was removed: another process judged it gone "
                                    "and took over its claims") from None
                if exc.errno in DISCONNECTED and _reachable(self.path):
                    # Our file was opened through a mount whose client died; the volume is mounted
                    # again, but our descriptor (and the locks it held) died with the old client.
                    raise OwnerGone(f"owner {self.owner}'s file was opened through a mount that was lost and "
                                    "mounted again: its locks went with it") from None
                raise
            # A write to an unlinked file succeeds: check that the name is still ours.
            if not names_file(self.path, sc.fstat(self._fd)):
                raise OwnerGone(f"owner {self.owner}'s file was removed: another process judged it gone "
                                "and took over its claims")

    def _write_beat(self, fd: int) -> None:
        self._beats += 1
        doc = {
            "owner": self.owner, "pid": os.getpid(), "host": socket.gethostname(),
            "lease_duration": self._lease_duration, "beat": self._beats,
        }
        line = json.dumps(doc, separators=(",", ":")).encode()[:_BEAT_WIDTH]
        sc.pwrite(fd, line.ljust(_BEAT_WIDTH) + b"\n", 0)

    def close(self) -> None:
        """Unlink first, then unlock: an observer never sees our file unlocked while it exists."""
        with self._lock:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            _unlink_then_let_go(self.path, fd)

    def abandon_after_fork(self) -> None:
        """In a forked child: drop our copy of the parent's descriptor without unlocking it."""
        with contextlib.suppress(OSError):
            if self._fd is not None:
                sc.close(self._fd)
        self._fd = None


def _reachable(path: str) -> bool:
    """Whether ``path``'s directory answers now (through the store's root opened again if the
    mount was: ``_beneath.reconnect``)."""
    try:
        sc.lstat(os.path.dirname(path))
    except OSError:
        return False
    return True


class OwnerProbe:
    """Judges other owners: dead (lock free or file gone), expired (beat frozen), or alive.

    Expiry needs observation over time, so a probe kept by a long-lived process (the store's
    heartbeat thread, a waiting worker) detects hung owners; a one-shot ``recover()`` from cron
    detects dead owners only. That is by design: a short run has no honest way to tell a hung
    process from a slow one.
    """

    def __init__(self, layout: Layout, lease_duration: float, clock: Callable[[], float], *,
                 trust_locks: bool = True) -> None:
        self.trust_locks = trust_locks  # False: heartbeat-only (see _verify)
        self._layout = layout
        self._lease_duration = lease_duration
        self._clock = clock
        self._seen: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    def status(self, owner: str) -> Status:
        """Whether ``owner`` is alive, dead, or past its lease without a beat. A stale handle
        means the file was replaced on another host: look again, a few times; one that stays
        stale (a network mount that keeps failing, seen on GlusterFS while a client was cut off)
        tells nothing about the owner, so it is taken as alive: never take a live one's jobs for
        it, and the next recovery pass looks again. Any other storage error is raised."""
        for tries in range(5):
            try:
                return self._status_once(owner)
            except StorageError as exc:
                if exc.errno != errno.ESTALE:
                    raise
                time.sleep(0.002 * 2**tries)
            except FileNotFoundError:  # the file went since our open and is back: look again
                time.sleep(0.002 * 2**tries)
        log.info("owner %s: its file stayed stale through 5 looks; taken as alive for now", owner)
        return "alive"

    def _status_once(self, owner: str) -> Status:
        path = self._layout.owner_path(owner)
        try:
            fd = sc.open(path, os.O_RDONLY | O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC)
        except FileNotFoundError:
            return "dead"
        except StorageError as exc:
            # A stale handle for a name that a fresh lookup no longer finds: the file is gone
            # (removed on another host), so its owner is. EMFILE or EIO says nothing about the
            # owner: never take a live one's jobs for it.
            if exc.errno == errno.ESTALE and not sc.lexists(path):
                return "dead"
            raise
        except OSError:
            return "dead"  # a planted symlink or worse is no live owner of ours
        try:
            # A *shared* lock: probers running at once must not see each other as the owner. The
            # owner holds an exclusive lock, so this succeeds only once the owner has exited;
            # the owner's file appears already locked (see OwnerLease), so no startup window.
            if self.trust_locks and sc.try_lock_shared(fd):
                return "dead"
            content = sc.pread(fd, _BEAT_WIDTH + 1, 0)
        except FileNotFoundError:
            # The file went since our open (GlusterFS answers a read of it ENOENT; seen in the
            # two-host chaos, failing a recovery pass): as for a stale handle, a fresh look decides.
            if not sc.lexists(path):
                return "dead"
            raise
        finally:
            sc.close_read(fd)
        now = self._clock()
        with self._lock:
            seen = self._seen.get(owner)
            if seen is None or seen[0] != content:
                self._seen[owner] = (content, now)
                return "alive"
            duration = max(self._lease_duration, _declared_duration(content))
            return "expired" if now - seen[1] >= duration else "alive"

    def forget(self, owner: str) -> None:
        with self._lock:
            self._seen.pop(owner, None)


def _declared_duration(content: bytes) -> float:
    """The holder's own lease_duration: never expire a peer sooner than it agreed to."""
    try:
        value = json.loads(content.decode("utf-8", "replace").strip() or "{}").get("lease_duration", 0)
        return float(value) if isinstance(value, int | float) else 0.0
    except (ValueError, AttributeError):
        return 0.0


class NotifyLock:
    """Exclusive, per-job lock on ``leases/<id>.notify`` that is safe to unlink while held.

    The classic pattern: open-or-create, flock, then check that the path still names the inode we
    locked; if a previous holder unlinked it in between, we locked a ghost and retry. Holders
    unlink the path before unlocking, so the lock file never outlives the notification.
    """

    def __init__(self, fd: int, path: str, ino: tuple[int, int]) -> None:
        self._fd: int | None = fd
        self.path = path
        self._ino = ino

    @classmethod
    def try_acquire(cls, path: str, owner: str, mode: int = FILE_MODE) -> NotifyLock | None:
        for _ in range(3):
            try:
                fd = sc.open(path, os.O_RDWR | os.O_CREAT | O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC, mode)
            except StorageError:
                raise
            except OSError:  # a planted symlink or directory: recovery quarantines it
                return None
            keep = False
            try:
                try:
                    st = sc.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or not sc.try_lock(fd):
                        return None
                except OSError as exc:
                    # ESTALE: another host broke (unlinked) the lock file between our open and our
                    # flock (seen on the GlusterFS bed for a limit's slot, killing the claimer):
                    # look the name up again.
                    if exc.errno not in sc.GONE:  # ENOENT: GlusterFS says it too
                        raise
                    continue
                try:
                    cur = sc.lstat(path)
                except FileNotFoundError:
                    continue
                if (st.st_dev, st.st_ino) != (cur.st_dev, cur.st_ino):
                    continue
                if mode != FILE_MODE and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
                    sc.fchmod(fd, mode)  # we made it; the umask took the group bits off
                sc.ftruncate(fd, 0)
                sc.pwrite(fd, owner.encode() + b"\n", 0)
                keep = True
                return cls(fd, path, (st.st_dev, st.st_ino))
            finally:
                if not keep:  # closed exactly once: a second close could hit a reused descriptor
                    with contextlib.suppress(OSError):
                        sc.close(fd)
        return None

    def still_ours(self) -> bool:
        if self._fd is None:
            return False
        try:
            cur = sc.lstat(self.path)
        except FileNotFoundError:
            return False
        return (cur.st_dev, cur.st_ino) == self._ino

    def release(self) -> None:
        if self._fd is None:
            return
        ours = self.still_ours()
        fd, self._fd = self._fd, None
        _unlink_then_let_go(self.path if ours else None, fd)

    def empty_and_release(self) -> None:
        """Let go but keep the file, emptied first: a limit's slot (``_limit_gate``), taken and let go
        of on every claim, changes no directory that way (an unlink and a create per claim cost
        a keyed claim 0.5 ms). A lock let go of with its file still full was a holder that died."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            sc.ftruncate(fd, 0)
        _unlink_then_let_go(None, fd)


def _unlink_then_let_go(path: str | None, fd: int) -> None:
    """Unlink ``path`` (a lock file of ours; None: it is not ours any more), then unlock and close
    ``fd``: in that order an observer never sees our file unlocked while it exists. Errors are
    swallowed (a clean-up), and the descriptor is released even when close fails."""
    if path is not None:
        with contextlib.suppress(OSError):
            sc.unlink(path)
    with contextlib.suppress(OSError):
        sc.unlock(fd)
    with contextlib.suppress(OSError):
        sc.close(fd)


def break_if_expired(path: str, me: str, probe: OwnerProbe, *,
                     unless: Callable[[str], bool] | None = None) -> bool:
    """Unlink a notify lock whose holder's heartbeat stopped; True if it was broken.

    Where locks are not trusted (heartbeat-only), a holder judged gone whose owner file someone
    already removed is "dead", and its lock may still be held (a hung client keeps its locks on
    GlusterFS until it resumes): it is broken as an expired one's would be. Where locks are
    trusted, a dead holder's lock is free already and needs no breaking.

    RACE: the hung holder may wake and call done(); it rechecks its lock's inode first and
    raises LeaseLost, so at worst its targets are delivered twice (delivery is at least once).
    """
    holder = notify_lock_holder(path)
    if not holder or holder == me:
        return False
    status = probe.status(holder)
    if status == "expired" or (status == "dead" and not probe.trust_locks):
        # ``unless(holder)``: the caller's last word, asked only of a holder judged gone.
        return False if unless is not None and unless(holder) else unlink(path)
    return False


def notify_lock_holder(path: str) -> str | None:
    """The owner named in a notify lock file, if it can be read."""
    try:
        fd = sc.open(path, os.O_RDONLY | O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC)
    except OSError:
        return None
    try:
        text = sc.read(fd, 64).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        sc.close_read(fd)
    return text if len(text) == 16 and all(c in "0123456789abcdef" for c in text) else None
