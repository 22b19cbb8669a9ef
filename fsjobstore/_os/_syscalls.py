"""The one door to the filesystem: every call fsjobstore makes on the store goes through here.

Three reasons for one small module (and the cost, a Python call per syscall, is a fraction of a
microsecond against syscalls of several):

* **Errors that say what failed.** A fault (ENOSPC, EIO, EROFS, EMFILE, ...) becomes a
  :class:`~fsjobstore.StorageError` naming the call, the path and the errno. The errnos the store
  uses for control flow (ENOENT, EEXIST, EWOULDBLOCK, ...) pass through unchanged.
* **EINTR.** Python retries most calls interrupted by a signal (PEP 475); here every call is
  retried too, so a spurious EINTR can never surface. ``close`` is the exception: on Linux the
  descriptor is gone even when close reports EINTR or EIO, so it is never retried.
* **Testing.** :func:`set_hook` installs an observer that sees each call before it runs (and may
  raise an injected ``OSError`` or end the process there) and after it succeeds. The
  reliability suite uses it for crash points, fault injection and power-loss recording. With no
  hook installed the only cost is one ``is None`` test.

* **Never through a link.** A path inside an attached store (:func:`attach`) is never handed to
  the kernel whole: the call is made relative to a descriptor of its parent directory, reached
  from the store's root without following any link (:mod:`._beneath`), with the last name not
  followed either. So no module can forget: a link, FIFO or file planted where a store
  directory belongs is quarantined and replaced, never followed. The hook still sees the
  call's original arguments (paths), so crash points, faults and power-loss records are as before.

The inotify calls of ``_inotify`` are not routed here (only their C functions are looked up by
:func:`libc_function`): wake-ups are hints, never state.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import stat
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from filelock import lock_descriptor, unlock_descriptor

from .._errors import StorageError, StorageFull
from . import _beneath

T = TypeVar("T")

# Errnos that are answers, not faults: the store's logic expects and handles them.
_CONTROL = frozenset({
    errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.EAGAIN, errno.EWOULDBLOCK, errno.ELOOP,
    errno.ENOTDIR, errno.EISDIR, errno.ENXIO, errno.EINTR,
})
_FULL = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


class Hook(Protocol):
    def before(self, op: str, args: tuple[Any, ...]) -> None: ...
    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None: ...


_hook: Hook | None = None


def set_hook(hook: Hook | None) -> None:
    """Install (or with None remove) the test observer for this process."""
    global _hook
    _hook = hook


# Calls that look a name up afresh each time, so that a stale file handle (ESTALE: a network
# filesystem whose cached handle for the name went stale, when another host replaced or
# renamed it) is answered by simply asking again. Never a call on a descriptor (its handle
# stays stale: the caller reopens, as _fsops.read_regular does), never one that changes anything.
_RELOOK = frozenset({"stat", "listdir"})
_STALE_TRIES = 5


# The calls that change something: refused while a read-only store is calling (_beneath.READ_ONLY).
_CHANGES = frozenset({"chmod", "chown", "fsync", "link", "mkdir", "mknod", "rename", "rmdir", "truncate", "unlink",
                      "utime", "write"})


def _call(op: str, fn: Callable[..., T], *args: Any) -> T:
    if _beneath.READ_ONLY.get() and (op in _CHANGES or (op == "open" and not _read_only(args))):
        paths = [a for a in args if isinstance(a, str)]
        err = StorageError(errno.EROFS, "refused: this JobStore is read-only (read_only=True) and changes nothing "
                           "in the store", paths[0] if paths else None)
        err.op = op
        raise err
    stale = 0
    reconnected = False
    while True:
        try:
            if _hook is not None:
                _hook.before(op, args)
            result = fn(*args)
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.ESTALE and stale < _STALE_TRIES and (
                (op in _RELOOK and isinstance(args[0], str)) or (op == "open" and _read_only(args))
            ):
                stale += 1
                continue
            # ENOTCONN: the mount's client was dead, so nothing was done (ECONNABORTED may have been).
            if (exc.errno == errno.ENOTCONN and not reconnected and args and isinstance(args[0], str)
                    and _beneath.reconnect(args[0])):
                reconnected = True  # the mount came back: once more, through the directory opened again
                continue
            raise _translate(op, args, exc) from None
        if _hook is not None:
            _hook.after(op, args, result)
        return result


def _read_only(args: tuple[Any, ...]) -> bool:
    flags = args[1] if len(args) > 1 and isinstance(args[1], int) else 0
    return not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)


def _translate(op: str, args: tuple[Any, ...], exc: OSError) -> OSError:
    if exc.errno is None or exc.errno in _CONTROL or isinstance(exc, StorageError):
        return exc
    cls = StorageFull if exc.errno in _FULL else StorageError
    paths = [a for a in args if isinstance(a, str)]
    err = cls(exc.errno, exc.strerror or os.strerror(exc.errno), paths[0] if paths else None)
    err.op = op
    err.filename2 = paths[1] if len(paths) > 1 else None
    return err


# -- store roots ------------------------------------------------------------------------------
def attach(root: str, dir_mode: int, fd: int | None = None) -> None:
    """Resolve every path below ``root`` beneath it (beneath the directory ``fd`` is open on, if
    given) without following links, until :func:`detach`."""
    _beneath.attach(root, dir_mode, fd)


def prime(root: str) -> None:
    """Open (and cache) the descriptors of ``root``'s skeleton directories now."""
    _beneath.prime(root)


def detach(root: str) -> None:
    _beneath.detach(root)


reading_only, only_reading = _beneath.reading_only, _beneath.only_reading


_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC


_KEPT, _CLOSE, _BUCKET = _beneath.KEPT, _beneath.CLOSE, _beneath.BUCKET
# The errnos of a name that is not there: ENOENT, or, on a network filesystem, ESTALE for a name
# (or its directory) another host removed or renamed away since this client looked it up. Also
# what a call through a removed bucket's cached descriptor gets.
GONE = (errno.ENOENT, errno.ESTALE)


def _again(exc: OSError, how: int, path: str, first: bool) -> bool:
    """Whether a call that raised ``exc`` should be made once more: it went through a cached
    bucket descriptor, which may be a removed bucket's (``_beneath``'s docstring)."""
    return first and how == _BUCKET and exc.errno in GONE and _beneath.drop_bucket(path)


def _open_at(path: str, flags: int, mode: int) -> int:
    for first in (True, False):
        dfd, name, how, root = _beneath.split(path)
        if root is None or dfd is None:
            return os.open(path, flags, mode)
        try:
            if flags & os.O_DIRECTORY:  # a directory of the store: repaired if something else is there
                return root.open_dir(dfd, name, path[len(root.prefix):], flags | _O_NOFOLLOW)
            # Never through a link; never blocked by a FIFO (regular files ignore O_NONBLOCK).
            return os.open(name, flags | _O_NOFOLLOW | _O_NONBLOCK, mode, dir_fd=dfd)
        except OSError as exc:
            if not _again(exc, how, path, first):
                raise
        finally:
            if how == _CLOSE:
                os.close(dfd)
    raise AssertionError("unreachable: the second round returns or raises")


# -- descriptors ------------------------------------------------------------------------------
def open(path: str, flags: int, mode: int = 0o600) -> int:
    return _call("open", _open_at, path, flags, mode)


def write(fd: int, data: bytes | memoryview) -> int:
    return _call("write", os.write, fd, data)


def pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
    return _call("write", os.pwrite, fd, data, offset)


def read(fd: int, size: int) -> bytes:
    return _call("read", os.read, fd, size)


def pread(fd: int, size: int, offset: int) -> bytes:
    return _call("read", os.pread, fd, size, offset)


def fsync(fd: int) -> None:
    _call("fsync", os.fsync, fd)


def ftruncate(fd: int, size: int) -> None:
    _call("truncate", os.ftruncate, fd, size)


def fstat(fd: int) -> os.stat_result:
    return _call("stat", os.fstat, fd)


def fchmod(fd: int, mode: int) -> None:
    _call("chmod", os.fchmod, fd, mode)


def close(fd: int) -> None:
    """Close ``fd``; it is released even when this raises (Linux semantics), so never retry."""
    failure: OSError | None = None
    if _hook is not None:
        try:
            _hook.before("close", (fd,))
        except InterruptedError:
            pass
        except OSError as exc:  # an injected EIO: the real close still happens, as on Linux
            failure = exc
    try:
        os.close(fd)
    except InterruptedError:
        pass
    except OSError as exc:
        failure = exc
    if failure is not None:
        raise _translate("close", (fd,), failure)
    if _hook is not None:
        _hook.after("close", (fd,), None)


def close_read(fd: int) -> None:
    """Close a descriptor we only read, locked or fsynced a directory through: an error from
    this close cannot mean lost data, so it is ignored (the descriptor is released anyway)."""
    with contextlib.suppress(OSError):
        close(fd)


def try_lock(fd: int) -> bool:
    """Exclusive non-blocking flock (through filelock); False if someone else holds it."""
    return _call("flock", _lock_nb, fd)


def lock_blocking(fd: int) -> None:
    _call("flock", _lock_wait, fd)


def try_lock_shared(fd: int) -> bool:
    # filelock's lock_descriptor only takes exclusive locks; probes need a shared one.
    try:
        _call("flock", fcntl.flock, fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def wait_lock_shared(fd: int) -> None:
    """Block until a shared flock is ours (a watcher waiting for a holder to let go)."""
    _call("flock", fcntl.flock, fd, fcntl.LOCK_SH)


def _lock_nb(fd: int) -> bool:
    return lock_descriptor(fd, blocking=False)


def _lock_wait(fd: int) -> bool:
    return lock_descriptor(fd, blocking=True)


def unlock(fd: int) -> None:
    _call("flock", unlock_descriptor, fd)


# -- names ------------------------------------------------------------------------------------
def _two(fn: Callable[[int | None, str, int | None, str], T], src: str, dst: str) -> T:
    for first in (True, False):
        sfd, sname, show, _ = _beneath.split(src)
        try:
            dfd, dname, dhow, _ = _beneath.split(dst)
            try:
                return fn(sfd, sname, dfd, dname)
            except OSError as exc:
                # Either side's bucket may be a removed one's (both are forgotten: `|`, not `or`).
                if not (_again(exc, show, src, first) | _again(exc, dhow, dst, first)):
                    raise
            finally:
                if dhow == _CLOSE:
                    os.close(dfd)  # type: ignore[arg-type]
        finally:
            if show == _CLOSE:
                os.close(sfd)  # type: ignore[arg-type]
    raise AssertionError("unreachable: the second round returns or raises")


def _one(fn: Callable[[int | None, str], T], path: str) -> T:
    for first in (True, False):
        dfd, name, how, _ = _beneath.split(path)
        try:
            return fn(dfd, name)
        except OSError as exc:
            if not _again(exc, how, path, first):
                raise
        finally:
            if how == _CLOSE:
                os.close(dfd)  # type: ignore[arg-type]
    raise AssertionError("unreachable: the second round returns or raises")


def _renameat(sfd: int | None, s: str, dfd: int | None, d: str) -> None:
    os.rename(s, d, src_dir_fd=sfd, dst_dir_fd=dfd)


def _rename(src: str, dst: str) -> None:
    # A module function, not a closure made on every call (the hot path); _two opens and closes an uncached parent.
    _two(_renameat, src, dst)


def rename(src: str, dst: str) -> None:
    _call("rename", _rename, src, dst)


def rename_noreplace(src: str, dst: str) -> None:
    """Move ``src`` to ``dst`` in one atomic step that fails with FileExistsError if ``dst``
    exists (Linux renameat2 with RENAME_NOREPLACE).

    Where the C library or the filesystem lacks it, link() then unlink() does the same job in
    two steps: a crash between them leaves both names on one inode, which recovery resolves
    (FORMAT.md, "Recovery"). The hook sees either one "rename" or a "link" and an "unlink".
    """
    global _renameat2
    if _renameat2 is not None:
        try:
            _call("rename", _noreplace, src, dst)
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            _renameat2 = None  # this filesystem (or kernel) has no RENAME_NOREPLACE
    link(src, dst)
    try:
        unlink(src)
    except StorageError as exc:
        # The link published the file (the old name is left, as after a crash between the two):
        # unmarked, a commit took this for "nothing moved" and cut its result off what it published.
        exc.applied = True
        raise


def noreplace_emulated() -> bool:
    """Whether :func:`rename_noreplace` links then unlinks here (renameat2 refused, or absent)."""
    return _renameat2 is None


def libc_function(name: str, argtypes: list[Any]) -> Any:
    """A C library function that sets errno (read with ctypes.get_errno()), or None where the
    C library cannot be loaded or lacks it. For the calls Python's os module does not offer."""
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_renameat2 = libc_function("renameat2", [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint])
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def _noreplace(src: str, dst: str) -> None:
    def at(sfd: int | None, s: str, dfd: int | None, d: str) -> None:
        assert _renameat2 is not None
        if _renameat2(_AT_FDCWD if sfd is None else sfd, os.fsencode(s), _AT_FDCWD if dfd is None else dfd,
                      os.fsencode(d), _RENAME_NOREPLACE) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), src, None, dst)

    _two(at, src, dst)


def link(src: str, dst: str) -> None:
    _call("link", _link, src, dst)


def _link(src: str, dst: str) -> None:
    # follow_symlinks=False: a planted link at src is linked as the link, never as its target.
    _two(lambda sfd, s, dfd, d: os.link(s, d, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False), src, dst)


def unlink(path: str) -> None:
    _call("unlink", _unlink, path)


def _unlink(path: str) -> None:
    _one(lambda dfd, name: os.unlink(name, dir_fd=dfd), path)


def mkdir(path: str, mode: int) -> None:
    _call("mkdir", _mkdir, path, mode)


def _mkdir(path: str, mode: int) -> None:
    _one(lambda dfd, name: os.mkdir(name, mode, dir_fd=dfd), path)


def mknod(path: str, mode: int) -> None:
    """Create an empty regular file ``path`` (``mode``'s permission bits, less the umask);
    FileExistsError if the name exists. One call where open and close are two: for the store's
    index entries, whose name is all they say."""
    _call("mknod", _mknod, path, mode)


def _mknod(path: str, mode: int) -> None:
    _one(lambda dfd, name: os.mknod(name, stat.S_IFREG | (mode & 0o7777), dir_fd=dfd), path)


def rmdir(path: str) -> None:
    _call("rmdir", _rmdir, path)


def _rmdir(path: str) -> None:
    _one(lambda dfd, name: os.rmdir(name, dir_fd=dfd), path)


def chmod(path: str, mode: int) -> None:
    _call("chmod", _chmod, path, mode)


def _chmod(path: str, mode: int) -> None:
    # chmod follows a link at the last name (Linux has no lchmod): change it through a descriptor.
    fd = _open_at(path, os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC, 0)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def touch(path: str) -> None:
    """Set a file's times to now, never following a link at its name (utimensat)."""
    _call("utime", _touch, path)


def _touch(path: str) -> None:
    _one(lambda dfd, name: os.utime(name, dir_fd=dfd, follow_symlinks=False), path)


def chown(path: str, uid: int, gid: int) -> None:
    _call("chown", _chown, path, uid, gid)


def _chown(path: str, uid: int, gid: int) -> None:
    _one(lambda dfd, name: os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False), path)


def lstat(path: str) -> os.stat_result:
    return _call("stat", _lstat, path)


def _lstat(path: str) -> os.stat_result:
    dfd, name, how, _ = _beneath.split(path)
    if how == _KEPT:  # the hot path (a commit asks three of these): no descriptor to close or retry
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if how == _CLOSE:  # a bucket not cached: this descriptor is ours to close (it leaked, one a
        try:           # lookup, and a store with 40 queues would run out of descriptors)
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(dfd)  # type: ignore[arg-type]
    return _one(_stat_at, path)


def _stat_at(dfd: int | None, name: str) -> os.stat_result:
    return os.stat(name, dir_fd=dfd, follow_symlinks=False)


def lexists(path: str) -> bool:
    if _hook is None:
        # A commit asks this three times (a pause, a cancel request, targets), and the answer
        # is almost always no: _call's layers around a raised FileNotFoundError cost more
        # than the system call. Any other error takes the full path below (ESTALE is asked
        # again there, and faults are translated).
        try:
            _lstat(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError:
            pass
    try:
        lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def listdir(path: str) -> list[str]:
    return _call("listdir", _listdir, path)


def _listdir(path: str) -> list[str]:
    fd = _open_at(path, _LIST_FLAGS, 0)  # a link, FIFO or file there is quarantined, never listed
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)
