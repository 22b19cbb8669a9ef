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

The inotify calls of ``_wakeup`` are not routed here (only their C functions are looked up by
:func:`libc_function`): wake-ups are hints, never state.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from filelock import lock_descriptor, unlock_descriptor

from ._errors import StorageError, StorageFull

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


def _call(op: str, fn: Callable[..., T], *args: Any) -> T:
    stale = 0
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


# -- descriptors ------------------------------------------------------------------------------
def open(path: str, flags: int, mode: int = 0o600) -> int:
    return _call("open", os.open, path, flags, mode)


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


def _lock_nb(fd: int) -> bool:
    return lock_descriptor(fd, blocking=False)


def _lock_wait(fd: int) -> bool:
    return lock_descriptor(fd, blocking=True)


def unlock(fd: int) -> None:
    _call("flock", unlock_descriptor, fd)


# -- names ------------------------------------------------------------------------------------
def rename(src: str, dst: str) -> None:
    _call("rename", os.rename, src, dst)


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
    unlink(src)


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
    assert _renameat2 is not None
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src, None, dst)


def link(src: str, dst: str) -> None:
    _call("link", os.link, src, dst)


def unlink(path: str) -> None:
    _call("unlink", os.unlink, path)


def mkdir(path: str, mode: int) -> None:
    _call("mkdir", os.mkdir, path, mode)


def rmdir(path: str) -> None:
    _call("rmdir", os.rmdir, path)


def chmod(path: str, mode: int) -> None:
    _call("chmod", os.chmod, path, mode)


def chown(path: str, uid: int, gid: int) -> None:
    _call("chown", os.chown, path, uid, gid)


def lstat(path: str) -> os.stat_result:
    return _call("stat", os.lstat, path)


def lexists(path: str) -> bool:
    if _hook is None:
        # A commit asks this three times (a pause, a cancel request, targets), and the answer
        # is almost always no: _call's layers around a raised FileNotFoundError cost more
        # than the system call. Any other error takes the full path below (ESTALE is asked
        # again there, and faults are translated).
        try:
            os.lstat(path)
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
    return _call("listdir", os.listdir, path)
