"""Files of the contrib layer (FORMAT.md, "Files of the contrib layer"): ``<store>/contrib/``, made
with the store's modes, each file replaced whole and read without trusting what is there."""

from __future__ import annotations

import contextlib
import os
import stat
import threading

from fsjobstore import JobStore


def contrib_dir(store: JobStore, *parts: str) -> str:
    """``<store>/contrib/<parts...>``, made with the store's modes (a group store's are setgid and
    group-writable, set by chmod since the umask would clear them)."""
    path = os.path.join(store.path, "contrib")
    mode = 0o2770 if store.group is not None else 0o700
    for part in ("", *parts):
        path = os.path.join(path, part) if part else path
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            continue
        if store.group is not None:
            os.chown(path, -1, store.group)
            os.chmod(path, mode)
    return path


def write_file(store: JobStore, path: str, data: bytes, *, fsync: bool) -> None:
    """Replace ``path`` whole: a temp file beside it, then a rename (a reader sees old or new)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if store.group is not None:
            os.fchmod(fd, 0o660)
        os.write(fd, data)
        if fsync and store.durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)


def read_file(path: str, cap: int) -> bytes | None:
    """A regular file's first ``cap`` bytes, or None for anything else there (a planted link,
    FIFO, directory) or nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, cap)
    except OSError:
        return None
    finally:
        os.close(fd)
