"""Files of the contrib layer (FORMAT.md, "Files of the contrib layer"): ``<store>/contrib/``, made
with the store's modes, each file replaced whole and read without trusting what is there.

A member of a group store may plant anything in it: a symbolic link in place of ``contrib/`` or of
a folder under it, a file where a folder should be. So every path is walked one component at a
time from the store's root, each opened ``O_NOFOLLOW | O_DIRECTORY``, and every call works on the
last one's descriptor (``dir_fd``): nothing follows a link out of the store, and modes are set on
the descriptor just opened (``fchmod``), never on a name that may have been swapped meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import stat
from collections.abc import Iterator

from fsjobstore import JobStore

log = logging.getLogger(__name__)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ContribDir:
    """One folder under ``<store>/contrib/``: ``ContribDir(store, "kombu", "bindings")``."""

    def __init__(self, store: JobStore, *parts: str) -> None:
        self._store = store
        self._parts = ("contrib", *parts)
        self._mode = 0o2770 if store.group is not None else 0o700

    @contextlib.contextmanager
    def opened(self, *, create: bool) -> Iterator[int | None]:
        """The folder's descriptor, or None when it is not there (and ``create`` is false)."""
        fd = os.open(self._store.path, _DIR)
        try:
            for part in self._parts:
                inner = self._step(fd, part, create)
                os.close(fd)
                fd = inner
                if fd < 0:
                    break
            yield fd if fd >= 0 else None
        finally:
            if fd >= 0:
                os.close(fd)

    def _step(self, parent: int, name: str, create: bool) -> int:
        for _ in range(3):
            try:
                return os.open(name, _DIR, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    return -1
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):  # a file, or a symbolic link
                    raise
                if not create:
                    return -1
                # RACE: a member planted a link or a file here; moved aside (its name says so), then
                # the folder is made. Planted again at once, it is moved again, at most three times.
                aside = f"{name}.planted.{secrets.token_hex(4)}"
                log.warning("%s/%s was not a folder (planted?): moved aside to %s", self._store.path, name, aside)
                with contextlib.suppress(FileNotFoundError):
                    os.rename(name, aside, src_dir_fd=parent, dst_dir_fd=parent)
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, self._mode, dir_fd=parent)
                made = os.open(name, _DIR, dir_fd=parent)
                if self._store.group is not None:  # the umask clears the group bits
                    os.fchown(made, -1, self._store.group)
                    os.fchmod(made, self._mode)
                return made
        raise NotADirectoryError(f"{self._store.path}: {name} keeps being replaced by something else")

    def write(self, name: str, data: bytes, *, fsync: bool) -> None:
        """Replace ``name`` whole: a temp file beside it, then a rename (a reader sees old or new)."""
        with self.opened(create=True) as d:
            assert d is not None
            tmp = f".{name}.{secrets.token_hex(8)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
            try:
                if self._store.group is not None:
                    os.fchmod(fd, 0o660)
                os.write(fd, data)
                if fsync and self._store.durable:
                    os.fsync(fd)
                os.close(fd)
                fd = -1
                os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=d)
                raise

    def read(self, name: str, cap: int) -> bytes | None:
        """A regular file's first ``cap`` bytes, or None for anything else there (a planted link,
        FIFO, folder) or nothing."""
        with self.opened(create=False) as d:
            if d is None:
                return None
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
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

    def unlink(self, name: str) -> None:
        with self.opened(create=False) as d:
            if d is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=d)

    def touch(self, name: str) -> bool:
        """Set ``name``'s mtime to now; False if it is not there."""
        with self.opened(create=False) as d:
            if d is None:
                return False
            try:
                os.utime(name, dir_fd=d, follow_symlinks=False)
            except FileNotFoundError:
                return False
            return True

    def mtime(self, name: str) -> float | None:
        with self.opened(create=False) as d:
            if d is None:
                return None
            try:
                return os.stat(name, dir_fd=d, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                return None

    def listing(self, known: tuple[int, int] | None) -> tuple[tuple[int, int] | None, list[str] | None]:
        """The folder's (mtime_ns, inode), to know when to list it again, and its names: None
        for the names when the key is ``known`` (nothing changed), [] when the folder is not there."""
        with self.opened(create=False) as d:
            if d is None:
                return None, []
            st = os.fstat(d)
            key = (st.st_mtime_ns, st.st_ino)
            return key, (None if key == known else os.listdir(d))
