"""Durable, hostile-file-safe file operations: the only module that writes job data.

Contract of the write path (see FORMAT.md, "Durability"): data is written to a fresh file in
the store's own ``tmp/`` (never the OS temp dir, so rename never crosses filesystems), fsynced
and closed with errors checked, then renamed or linked into place, then the destination
directory is fsynced. A failed fsync or close is never retried: the file is removed and the
error raised, because a second fsync can report success for data that never reached the disk.
With ``durable=False`` the fsyncs are skipped; renames keep every step atomic under process
crashes, but a power loss may lose recent acknowledged work.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from dataclasses import dataclass

from .._errors import StorageError, UntrustedStore
from . import _syscalls as sc

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
FILE_MODE = 0o600
GONE = sc.GONE  # the errnos of a name that is not there (ENOENT; ESTALE on a network filesystem)
DIR_MODE = 0o700


@dataclass(frozen=True, slots=True)
class Perms:
    """Who may use a store: its owner only (``gid`` None), or every member of group ``gid``.

    A group store's directories are setgid (new entries inherit the group) and group-writable,
    its files group-readable and -writable. The process umask would mask those bits, so they
    are set explicitly (one fchmod per new file, only in group stores).
    """

    gid: int | None = None

    @property
    def file_mode(self) -> int:
        return FILE_MODE if self.gid is None else 0o660

    @property
    def dir_mode(self) -> int:
        return DIR_MODE if self.gid is None else 0o2770


PRIVATE = Perms()


class Unreadable(Exception):
    """A file that is not a readable regular file of acceptable size; the message says why."""


def fsync_dir(path: str) -> None:
    fd = sc.open(path, os.O_RDONLY | _O_DIRECTORY | O_CLOEXEC)
    try:
        sc.fsync(fd)
    finally:
        sc.close_read(fd)


def sync_applied(path: str, *, durable: bool) -> None:
    """fsync the directory ``path`` after a change to it; a failure is marked ``applied``."""
    if not durable:
        return
    try:
        fsync_dir(path)
    except StorageError as exc:
        exc.applied = True
        raise


def write_new(path: str, data: bytes, *, durable: bool, mode: int = FILE_MODE) -> None:
    """Create ``path`` exclusively and write ``data`` to it; remove it again on any error."""
    fd = sc.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
    try:
        if mode != FILE_MODE:
            sc.fchmod(fd, mode)  # the umask took the group bits off
        view = memoryview(data)
        while view:
            written = sc.write(fd, view)
            view = view[written:]
        if durable:
            sc.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            sc.close(fd)
        unlink_quietly(path)
        raise
    try:
        sc.close(fd)
    except OSError:
        unlink_quietly(path)
        raise


def replace_with(tmp: str, dst: str, data: bytes, *, durable: bool, mode: int) -> None:
    """Write ``data`` to the new file ``tmp``, then rename it over ``dst`` (a small declaration: a
    schedule, a limit, a subscription), fsynced where ``durable``; ``tmp`` goes if that fails."""
    write_new(tmp, data, durable=durable, mode=mode)
    try:
        sc.rename(tmp, dst)
    except BaseException:
        unlink_quietly(tmp)
        raise
    sync_applied(os.path.dirname(dst), durable=durable)


def open_lock(path: str, perms: Perms) -> int:
    """A descriptor of the lock file ``path`` (``control/boot.lock``, ``retention.lock``,
    ``migrate.lock``), made if missing, for ``flock`` only; non-blocking (a FIFO planted there
    must not hang us). Read-write where allowed (NFS emulates flock with POSIX locks, whose
    exclusive kind needs it), else read-only: in a group store another member may have made it
    under a umask that cut the group's write bit, which we then also set if we are its owner."""
    flags = O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC | os.O_CREAT
    try:
        fd = sc.open(path, os.O_RDWR | flags, perms.file_mode)
    except OSError as exc:  # a StorageError carrying EACCES, from the one door
        if exc.errno != errno.EACCES:
            raise
        fd = sc.open(path, os.O_RDONLY | flags, perms.file_mode)
    if perms.gid is not None:
        with contextlib.suppress(OSError):
            sc.fchmod(fd, perms.file_mode)  # EPERM: another member's file
    return fd


def touch(path: str, mode: int = FILE_MODE) -> None:
    """Make ``path`` exist as a file: created empty if missing, left as it is otherwise (a
    deadline, a doorbell, a boot marker: the name is what counts). Not fsynced."""
    sc.close(sc.open(path, os.O_WRONLY | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode))


def names_file(path: str, st: os.stat_result) -> bool | None:
    """Whether ``path`` names the file ``st`` describes (a rename keeps it); None if ``path``
    is gone."""
    try:
        cur = sc.lstat(path)
    except FileNotFoundError:
        return None
    return (cur.st_dev, cur.st_ino) == (st.st_dev, st.st_ino)


def foreign_links(st: os.stat_result, linked_as: str | None) -> int:
    """How many hard links the file of ``st`` has beyond its own name and ``linked_as`` (the
    one other name it may legitimately have: a job's ``ids/<id>``); 0 for a file of ours.

    A member of a shared store can hard-link into it any file of the filesystem where
    ``fs.protected_hardlinks`` is 0, or another job's file (a final result, say); the store
    appends to a claimed file in place, so such a file is never written to."""
    if st.st_nlink <= 1:
        return 0
    if linked_as is not None and st.st_nlink == 2 and names_file(linked_as, st):
        return 0
    return st.st_nlink - 1


def write_at(path: str, offset: int, data: bytes, *, durable: bool, clean: bool,
             linked_as: str | None = None) -> None:
    """Write ``data`` into the existing file ``path`` at ``offset`` and fsync it if durable.
    Unless the caller knows the file ends at ``offset`` (``clean``), anything past it is cut off
    first. On any error the file is cut back to ``offset`` where that is still possible, and
    the error is raised: the file then reads as it did before. FileNotFoundError means
    ``path`` is gone and nothing was written. :class:`Unreadable` (nothing written): the file
    is not a regular file, or has hard links other than ``linked_as`` (:func:`foreign_links`)."""
    fd = sc.open(path, os.O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
    try:
        # Checked on the descriptor written through, so a file swapped in after the claim's
        # read is caught too.
        st = sc.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"is not a regular file (mode {stat.filemode(st.st_mode)})")
        extra = foreign_links(st, linked_as)
        if extra:
            raise Unreadable(f"has {extra} hard link(s) elsewhere: a planted link, never written to")
    except BaseException:
        sc.close_read(fd)
        raise
    try:
        if not clean:
            sc.ftruncate(fd, offset)  # a torn tail or an earlier attempt's: never write after it
        view = memoryview(data)
        at = offset
        while view:
            written = sc.pwrite(fd, view, at)
            view, at = view[written:], at + written
        if durable:
            sc.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            _truncate(fd, offset, durable=durable)
        with contextlib.suppress(OSError):
            sc.close(fd)
        raise
    try:
        sc.close(fd)
    except OSError:
        cut_back(path, offset, durable=durable)
        raise


def cut_back(path: str, offset: int, *, durable: bool) -> bool:
    """Truncate ``path`` to ``offset`` bytes (undoing an appended line), durably if ``durable``;
    False if that failed."""
    try:
        fd = sc.open(path, os.O_WRONLY | O_NOFOLLOW | O_CLOEXEC)
    except OSError:
        return False
    try:
        _truncate(fd, offset, durable=durable)
        return True
    except OSError:
        return False
    finally:
        sc.close_read(fd)


def _truncate(fd: int, offset: int, *, durable: bool) -> None:
    # Durably: the line being cut off may already be on disk (its fsync can have run before the
    # step that failed), and a power cut must not bring back a result the caller was told was not
    # committed (a claim of a file that ends in a whole result line publishes it).
    sc.ftruncate(fd, offset)
    if durable:
        sc.fsync(fd)


def rename_into(src: str, dst: str, *, durable: bool) -> None:
    """Atomically move ``src`` to ``dst`` (replacing it) and make the new entry durable."""
    sc.rename(src, dst)
    if durable:  # (not computing the directory otherwise: the hot path of a non-durable store)
        sync_applied(os.path.dirname(dst), durable=True)


def link_into(src: str, dst: str, *, durable: bool) -> None:
    """Publish ``src`` at ``dst`` only if ``dst`` does not exist (FileExistsError otherwise).

    ``src`` is left in place; the caller unlinks it once the new entry is durable.
    """
    sc.link(src, dst)
    if durable:
        sync_applied(os.path.dirname(dst), durable=True)


def unlink(path: str, *, missing_ok: bool = True) -> bool:
    try:
        sc.unlink(path)
        return True
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False
    except OSError as exc:
        # ESTALE: on a network filesystem, the name's directory went on another host (seen on the
        # GlusterFS bed for a deps/<parent>/ entry, killing a worker): gone, as ENOENT says.
        if not missing_ok or exc.errno not in GONE:
            raise
        return False


def unlink_quietly(path: str) -> bool:
    """Remove a file we no longer need (a temp file, a dropped copy); a failure only leaves
    litter that recovery sweeps, so it is logged by the caller's sweep, never raised."""
    try:
        sc.unlink(path)
        return True
    except OSError:
        return False


def read_regular(path: str, cap: int) -> bytes:
    """:func:`read_regular_stat`'s data."""
    return read_regular_stat(path, cap)[0]


def read_regular_stat(path: str, cap: int) -> tuple[bytes, os.stat_result]:
    """Read a regular file without following links, blocking on FIFOs, or reading past ``cap``.

    Raises FileNotFoundError if it is gone, :class:`Unreadable` for anything else wrong. A
    stale handle (ESTALE: another host replaced or moved the file on a network filesystem) is
    met by opening the name again, a few times, before it is reported as a fault.
    """
    for tries in range(5):
        try:
            return _read_regular_once(path, cap)
        except StorageError as exc:
            if exc.errno != errno.ESTALE or tries == 4:
                raise
            time.sleep(0.002 * (tries + 1))
    raise AssertionError("unreachable")


def _read_regular_once(path: str, cap: int) -> tuple[bytes, os.stat_result]:
    try:
        fd = sc.open(path, os.O_RDONLY | O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC)
    except FileNotFoundError:
        raise
    except StorageError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM):
            raise  # a fault (EIO, EMFILE, ...) says nothing about the file: never quarantine for it
        raise Unreadable(f"cannot be opened: {os.strerror(exc.errno)}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable("is a symbolic link") from None
        raise Unreadable(f"cannot be opened: {os.strerror(exc.errno or 0)}") from None
    try:
        st = sc.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > cap:
            raise Unreadable(f"is {st.st_size} bytes, over the cap of {cap}")
        # One read usually does it: a regular file returning fewer bytes than asked is at EOF.
        want = min(cap + 1, st.st_size + 1)
        data = sc.read(fd, want)
        if len(data) == want:  # the file grew since fstat, or is big: read on to EOF or the cap
            chunks = [data]
            remaining = cap + 1 - len(data)
            while remaining > 0:
                chunk = sc.read(fd, min(remaining, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
        if len(data) > cap:
            raise Unreadable(f"grew past the cap of {cap} bytes while being read")
        return data, st
    finally:
        sc.close_read(fd)


def ensure_dir(path: str, *, durable: bool, mode: int = DIR_MODE) -> None:
    """Create ``path`` (one level) if missing; fsync its parent when it was created."""
    try:
        sc.mkdir(path, mode)
    except FileExistsError:
        return
    if mode != DIR_MODE:
        sc.chmod(path, mode)  # the umask took the group bits off (and mkdir ignores setgid)
    if durable:  # an empty directory is no state: a failure here is a plain, unapplied error
        fsync_dir(os.path.dirname(path))


# A directory's mtime moves on every entry added or removed, but in clock ticks (a few ms; whole
# seconds on some filesystems, two on vfat), so a change in the tick of a listing can leave it as
# it was. A cache keyed by the stat is only trusted for a directory whose mtime was already
# SETTLE seconds old when it was listed: any later change then shows as a new mtime (git's
# "racily clean" rule). Attribute caches (NFS, FUSE) and a server clock behind ours can still
# hide a change: callers also list again at least every poll interval.
SETTLE = 2.0


def dir_signature(path: str) -> tuple[tuple[int, int, int], bool]:
    """A directory's (mtime_ns, ctime_ns, inode), and whether its last change was SETTLE
    seconds ago or more, for one stat; a missing directory is ((0, 0, 0), True). Take it
    *before* the listing it vouches for: a change in between then shows as a different stat."""
    try:
        st = sc.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return (0, 0, 0), True
    # Real wall time, not a store's injectable clock: it is compared with the filesystem's.
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino), time.time() - st.st_mtime >= SETTLE


def scan_names(path: str) -> list[str]:
    """Names in a directory, or [] if it does not exist."""
    try:
        return sc.listdir(path)
    except FileNotFoundError:
        return []


def check_trusted(path: str, perms: Perms = PRIVATE) -> None:
    """Refuse a store directory that others could write into or that is not ours.

    A private store's directories must be ours. A group store's may also belong to another
    member of the group, which shows as the store's group on a directory nobody else can write:
    only members (or root) can give a directory a group.
    """
    st = sc.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedStore(f"{path} is a symbolic link; store directories must be real directories")
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedStore(f"{path} is not a directory")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UntrustedStore(f"{path} is world-writable without the sticky bit")
    if st.st_uid == os.geteuid():
        return
    if perms.gid is None:
        raise UntrustedStore(
            f"{path} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()}); a store shared by "
            "several users must be created with JobStore(path, group=...)"
        )
    if st.st_gid != perms.gid or st.st_mode & stat.S_IWOTH:
        raise UntrustedStore(
            f"{path} is owned by uid {st.st_uid} and group {st.st_gid}, outside this store's group {perms.gid}"
        )


def is_real_dir(path: str) -> bool:
    """A directory and not a symbolic link to one."""
    try:
        return stat.S_ISDIR(sc.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def is_regular(path: str) -> bool:
    """A regular file (not a link, directory, FIFO, socket or device); False if gone."""
    try:
        return stat.S_ISREG(sc.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def makedirs(path: str) -> None:
    """Create the missing parents of a store root as ``mkdir -p`` would (the umask decides their
    mode: they are outside the store, and other users may need to pass through them)."""
    parent = os.path.dirname(path)
    if parent != path and not sc.lexists(parent):
        makedirs(parent)
    try:
        sc.mkdir(path, 0o777)
    except FileExistsError:
        pass
    except FileNotFoundError as exc:  # a parent that lists but takes no directory (procfs), or one removed meanwhile
        err = StorageError(exc.errno, f"cannot make the store's parent directory: {exc.strerror}", path)
        err.op = "mkdir"
        raise err from None


def gone_after(exc: OSError, path: str) -> bool:
    """Whether a failure on the file at ``path`` means it is gone: on a network filesystem a file
    another host renamed away fails with ESTALE (a stale handle) rather than ENOENT. A fresh
    lookup of the name decides: gone (a claim's commit: the lease is lost), or still there (a
    real storage fault, and the caller may retry)."""
    if exc.errno not in GONE:
        return False
    try:
        return not sc.lexists(path)
    except OSError:
        return False  # the lookup failed too: a fault, not proof that the file is gone
