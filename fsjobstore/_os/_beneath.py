"""Paths inside a store resolved beneath its root, never through a link (FORMAT.md, "Trust").

Every member of a shared store's group can write each of its directories, so any of them can
replace ``jobs/fulfilled`` or ``runs/<id>`` by a symbolic link to a directory of someone else's,
a FIFO or a file. A path handed to the kernel whole would follow such a link, and a worker
running as another user (or root) would then write, rename or delete there. So :mod:`_syscalls`
never hands over a path inside an attached store: it asks :func:`split` for a descriptor of the
*parent* directory, reached from the root's descriptor without following any link, and does the
call relative to it with only the last name (``openat``, ``renameat``, ``unlinkat``, ...). The
last name is never followed either (opens add ``O_NOFOLLOW``).

The parent is reached with one ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` where the
kernel has it (Linux 5.6), or else one ``openat(O_NOFOLLOW | O_DIRECTORY)`` per component: the
same guarantee, one more call per level. A component that is not a real directory is moved into
``quarantine/`` (with a ``.reason`` file) and a real, empty directory made in its place, so a
job is written into the store or not at all, never acknowledged in a place the store does not
read. A planted ``quarantine`` itself cannot be moved anywhere: that is refused with
:class:`UntrustedStore` naming it.

Descriptors of the directories the store never removes (the skeleton and the queue directories)
are cached, so the hot path costs no extra call; each one is looked up afresh once it is
:data:`RECHECK_AFTER` seconds old. RACE: a member who renames such a directory away and plants a
link in its place has writes made within that window land in the *real* directory they moved
(wherever they put it); never in the link's target, and no worse than moving the files
themselves, which every member may do.

The store's buckets (``jobs/pending/<queue>/<bucket>``, ``finished/<bucket>``) are cached too, the
:data:`BUCKETS_KEPT` last used: a create, a claim and a finished-index entry each saved an
``openat`` and a ``close`` (PERFORMANCE.md). A bucket is removed (rmdir) once empty, and may be
made again under the same name, so a descriptor kept of a removed one names a directory that no
longer holds anything: a call through it fails with ENOENT (or ESTALE on a network filesystem),
and :func:`drop_bucket` then has the bucket looked up afresh, so the caller (``_syscalls``) asks
once more through the directory now at that name. Only those errors can come of a dead bucket's
descriptor: creating in it, renaming from or into it and looking a name up in it all fail so.
Evicted and replaced descriptors are closed only :data:`_RETIRE_AFTER` seconds later (a thread
may be about to use one): a process holds at most ``BUCKETS_KEPT`` of them, and those retired
in the last half minute (at most one evicted a second; replaced ones, of buckets made again).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator

from .._errors import UntrustedStore

log = logging.getLogger("fsjobstore")
_monotonic = time.monotonic

RECHECK_AFTER = 1.0  # seconds a cached directory descriptor is trusted to still be at its name
BUCKETS_KEPT = 8  # bucket descriptors cached at most (the current second's, the head's, the hour's)
KEPT, CLOSE, BUCKET = 0, 1, 2  # what split() says of the descriptor it gives (Root.split)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_DIR_FLAGS = _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR, errno.EXDEV)  # a link, a file or FIFO, an escape
# A FUSE client that died (SIGKILL, a crash) answers every call through its mount, and through
# every descriptor opened there, with these, for good: even once the volume is mounted again.
DISCONNECTED = (errno.ENOTCONN, errno.ECONNABORTED)
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
_SYS_OPENAT2 = 437  # the same number on every Linux architecture (asm-generic)
_REPAIRS = 8  # rounds of repair before a directory planted over and over is refused
_RETIRE_AFTER = 30.0  # a replaced cached descriptor is closed this long after (no call takes that long)
# True while a read-only store (``JobStore(read_only=True)``) makes one of its calls, in that
# call's thread only: ``_syscalls`` then refuses every call that would change anything, and a
# directory found planted is read as missing, never repaired (:meth:`Root.repair`).
READ_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("fsjobstore_read_only", default=False)


@contextlib.contextmanager
def reading_only() -> Iterator[None]:
    """Within it (in this thread), every call that would change a file or directory raises
    :class:`StorageError` (EROFS), and a planted directory is read as missing: what a read-only
    store's every call runs in."""
    token = READ_ONLY.set(True)
    try:
        yield
    finally:
        READ_ONLY.reset(token)


def only_reading() -> bool:
    """Whether this thread is inside :func:`reading_only`."""
    return READ_ONLY.get()


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load_syscall() -> object | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_syscall = _load_syscall() if os.uname().sysname == "Linux" else None
_HOW = _OpenHow(_DIR_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
_HOW_REF = ctypes.byref(_HOW)
_HOW_SIZE = ctypes.sizeof(_HOW)


def _openat2(dirfd: int, rel: str) -> int | None:
    """A descriptor of directory ``rel`` beneath ``dirfd``, or None where openat2 is unusable."""
    global _syscall
    if _syscall is None:
        return None
    encoded = os.fsencode(rel)
    for _ in range(16):
        fd = _syscall(_SYS_OPENAT2, dirfd, encoded, _HOW_REF, _HOW_SIZE)  # type: ignore[operator]
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code in (errno.EINTR, errno.EAGAIN):  # EAGAIN: a rename raced the lookup; ask again
            continue
        if code in (errno.ENOSYS, errno.EPERM, errno.E2BIG, errno.EINVAL):
            _syscall = None  # an older kernel, or a sandbox that forbids it: walk instead
            return None
        raise OSError(code, os.strerror(code), rel)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), rel)


class Root:
    """One attached store root: its descriptor and the cached descriptors below it."""

    def __init__(self, path: str, dir_mode: int, fd: int | None = None) -> None:
        self.path = path
        self.prefix = path.rstrip("/") + "/"
        self.dir_mode = dir_mode
        self.uses = 1
        self.fd = os.open(path, _DIR_FLAGS) if fd is None else os.dup(fd)
        self.ino = os.fstat(self.fd).st_ino  # the directory this root is, found again by reconnect()
        # The directory's path (absolute, as callers spell it: the module's split() finds it
        # with one dict lookup) -> fd, when looked up, dev, ino, KEPT or BUCKET.
        self.cache: dict[str, tuple[int, float, int, int, int]] = {}
        self.retired: list[tuple[int, float]] = []
        self.buckets: list[str] = []  # the bucket keys of cache, oldest first
        self._lock = threading.Lock()  # the slow path's: cache misses, evictions, retirements
        self._evicted = -RECHECK_AFTER  # when a bucket's descriptor was last evicted (monotonic)

    # -- the hot path --------------------------------------------------------------------------
    def split(self, rel: str) -> tuple[int, str, int]:
        """(descriptor of ``rel``'s parent, last name, KEPT, CLOSE (the caller closes it) or
        BUCKET (cached, but a bucket's: see :func:`drop_bucket`))."""
        head, sep, name = rel.rpartition("/")
        if not sep:
            return self.fd, rel, KEPT
        entry = self.cache.get(self.prefix + head)
        if entry is not None and _monotonic() - entry[1] < RECHECK_AFTER:
            return entry[0], name, entry[4]
        kind = _cacheable(head)
        if kind is not None:
            fd, how = self._cache(head, kind)
            return fd, name, how
        # A per-job directory (runs/<id>, targets/<id>): from its parent's cached descriptor
        # when that is fresh, so a call here and one made in the parent (the mkdir of this very
        # directory) reach the same directory even within RECHECK_AFTER of a swap of the parent.
        up, _, last = head.rpartition("/")
        parent = self.cache.get(self.prefix + up)
        if parent is not None and _monotonic() - parent[1] < RECHECK_AFTER:
            return self.open_dir(parent[0], last, head, _DIR_FLAGS), name, CLOSE
        return self.resolve(head), name, CLOSE

    def _cache(self, head: str, kind: int) -> tuple[int, int]:
        """A descriptor of ``head`` (a directory of ``kind``, KEPT or BUCKET) looked up now and
        cached: (it, ``kind``); (it, CLOSE) when it is a bucket's and no slot could be freed for
        it: not cached, the caller closes it."""
        bucket = kind == BUCKET
        key = self.prefix + head
        fd = self.resolve(head)
        st = os.fstat(fd)
        with self._lock:
            entry = self.cache.get(key)  # another thread may have looked it up meanwhile
            if entry is not None and (entry[2], entry[3]) == (st.st_dev, st.st_ino):
                os.close(fd)  # still the same directory
                self.cache[key] = (entry[0], time.monotonic(), entry[2], entry[3], kind)
                if bucket:
                    self._used(key)
                return entry[0], kind
            if bucket and entry is None and not self._slot():
                return fd, CLOSE
            self.cache[key] = (fd, time.monotonic(), st.st_dev, st.st_ino, kind)
            if entry is not None:
                self._retire(entry[0])
            if bucket:
                self._used(key)
        return fd, kind

    def _used(self, key: str) -> None:
        if key in self.buckets:
            self.buckets.remove(key)
        self.buckets.append(key)

    def _slot(self) -> bool:
        """Whether a bucket may be cached: a slot is free, or the least recently looked-up one
        may be evicted. At most one eviction a RECHECK_AFTER, so that a process spreading jobs
        over many buckets (many priorities) retires descriptors no faster than one a second:
        an evicted one stays open for _RETIRE_AFTER. Under the lock."""
        if len(self.buckets) < BUCKETS_KEPT:
            return True
        now = time.monotonic()
        if now - self._evicted < RECHECK_AFTER:
            return False
        self._evicted = now
        old = self.cache.pop(self.buckets.pop(0), None)
        if old is not None:
            self._retire(old[0])
        return True

    def _retire(self, fd: int) -> None:
        """Close ``fd`` (a replaced or evicted cached descriptor) later: another thread may be
        about to use it, and a number closed now could be reused for another directory or file
        by the time that call runs. Closes the ones retired long enough ago. Under the lock."""
        now = time.monotonic()
        keep = []
        for old, at in self.retired:
            if now - at > _RETIRE_AFTER:
                with contextlib.suppress(OSError):
                    os.close(old)
            else:
                keep.append((old, at))
        keep.append((fd, now))
        self.retired = keep

    def drop_bucket(self, head: str) -> bool:
        """A call through the cached descriptor of bucket ``head`` failed: the bucket may have
        been removed (and made again). Have the next :meth:`split` look it up afresh, which
        keeps the descriptor if it is the same directory (most such failures are answers: no
        job by that name), and retires it otherwise. True if there was one."""
        with self._lock:
            key = self.prefix + head
            entry = self.cache.get(key)
            if entry is None:
                return False
            self.cache[key] = (entry[0], float("-inf"), entry[2], entry[3], entry[4])
            return True

    # -- resolving -----------------------------------------------------------------------------
    def resolve(self, rel: str) -> int:
        """A new O_PATH descriptor of the directory ``rel``, repairing what is planted on the way."""
        try:
            fd = _openat2(self.fd, rel)
        except OSError as exc:
            # Something planted on the way, or a directory of the skeleton missing (moved away,
            # or below one just repaired): the walk finds which, and repairs it.
            if exc.errno not in _NOT_A_DIR and exc.errno != errno.ENOENT:
                raise
            fd = None
        return fd if fd is not None else self._walk(rel)

    def _walk(self, rel: str) -> int:
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise OSError(errno.EINVAL, f"not a path inside the store: {rel!r}")
        cur = self.fd
        try:
            for i, part in enumerate(parts):
                nxt = self.open_dir(cur, part, "/".join(parts[: i + 1]), _DIR_FLAGS)
                if cur != self.fd:
                    os.close(cur)
                cur = nxt
        except BaseException:
            if cur != self.fd:
                os.close(cur)
            raise
        return cur if cur != self.fd else os.dup(self.fd)

    def open_dir(self, parent: int, name: str, rel: str, flags: int) -> int:
        """Open directory ``name`` in ``parent`` with ``flags`` (which hold O_NOFOLLOW); a
        link, FIFO or file found there is quarantined and a directory made in its place."""
        for _ in range(_REPAIRS):
            try:
                return os.open(name, flags, dir_fd=parent)
            except OSError as exc:
                if exc.errno not in _NOT_A_DIR and not (exc.errno == errno.ENOENT and rel in _SKELETON):
                    raise
            # RACE: a member may plant again between the repair and the open; each round moves
            # the new plant away too, and a member who keeps winning gets a refusal naming it
            # (never a raw ENOTDIR, which callers would read as an answer about the last name).
            self.repair(parent, name, rel)
        raise UntrustedStore(
            f"{self.prefix}{rel}: something is planted again each time it is replaced by a directory "
            f"({_REPAIRS} times in a row); refused")

    def repair(self, parent: int, name: str, rel: str) -> None:
        """Move what sits at directory ``rel`` (``name`` in ``parent``) into quarantine and make
        a real directory there."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            return  # someone else repaired it meanwhile
        what = "nothing" if st is None else _kind(st.st_mode)
        if READ_ONLY.get():  # a reader changes nothing: what is not a directory is read as no directory
            raise FileNotFoundError(errno.ENOENT, f"{what} where a directory belongs (a read-only store leaves it)",
                                    f"{self.prefix}{rel}")
        if rel == "quarantine" or rel.startswith("quarantine/"):
            raise UntrustedStore(
                f"{self.prefix}{rel} is {what} where the store's quarantine directory belongs; "
                "remove it (a link, FIFO or file there is never followed)")
        if st is not None:
            qfd = self.resolve("quarantine")
            try:
                dest = f"{time.time_ns():020d}.{rel.replace('/', '~')}"
                with contextlib.suppress(FileNotFoundError):  # another process moved it first
                    os.rename(name, dest, src_dir_fd=parent, dst_dir_fd=qfd)
                    self._reason(qfd, dest, rel, f"{what} where a directory belongs")
            finally:
                os.close(qfd)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, self.dir_mode, dir_fd=parent)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC, dir_fd=parent)
            try:
                os.fchmod(fd, self.dir_mode)  # the umask took the group bits off
            finally:
                os.close(fd)
        if st is not None:
            log.warning("quarantined %s%s: %s where a directory belongs; made a directory there",
                        self.prefix, rel, what)

    def _reason(self, qfd: int, dest: str, rel: str, reason: str) -> None:
        doc = json.dumps({"from": rel, "reason": reason, "at": time.time()}).encode() + b"\n"
        mode = 0o660 if self.dir_mode & 0o070 else 0o600
        with contextlib.suppress(OSError):
            fd = os.open(dest + ".reason", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC,
                         mode, dir_fd=qfd)
            try:
                os.fchmod(fd, mode)
                os.write(fd, doc)
            finally:
                os.close(fd)

    def reconnect(self) -> bool:
        """The root's descriptor died with the connection of the mount it was opened through (a
        network filesystem's client killed and the volume mounted again at the same path): open
        the root again by its path and drop every cached descriptor. Only the same directory
        (its inode number, which a GlusterFS or NFS remount keeps) is taken; True if it was."""
        with self._lock:
            try:  # (an fstat of an O_PATH descriptor is answered without the filesystem: open)
                os.close(os.open(".", os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC, dir_fd=self.fd))
                return False  # the descriptor still answers: the fault is elsewhere
            except OSError as exc:
                if exc.errno not in DISCONNECTED:
                    return False
            try:
                fd = os.open(self.path, _DIR_FLAGS)
            except OSError:
                return False  # still unmounted, or not reachable: the caller's error stands
            try:
                same = os.fstat(fd).st_ino == self.ino
            except OSError:
                same = False
            if not same:
                os.close(fd)
                log.warning("%s: the store's directory was mounted again, but another directory is now at "
                            "that path: not taken", self.path)
                return False
            self._retire(self.fd)
            for entry in self.cache.values():
                self._retire(entry[0])
            self.fd, self.cache, self.buckets = fd, {}, []
            log.warning("%s: the mount's connection was lost and the store's directory is reachable again: "
                        "its descriptors were opened afresh", self.path)
            return True

    def close(self) -> None:
        fds = [self.fd] + [e[0] for e in self.cache.values()] + [r[0] for r in self.retired]
        self.cache, self.retired = {}, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISREG(mode):
        return "a file"
    return f"a {stat.filemode(mode)[0]!r} entry"


def _cacheable(head: str) -> int | None:
    """KEPT for a directory the store never removes (the skeleton, a queue's in jobs/pending),
    BUCKET for a bucket (removed once empty: see the module docstring), None for the others."""
    if head in _SKELETON:
        return KEPT
    if head.startswith("jobs/pending/"):
        depth = head.count("/")
        return KEPT if depth == 2 else BUCKET if depth == 3 else None
    return BUCKET if head.startswith("finished/") and head.count("/") == 1 else None


_SKELETON = frozenset({
    "jobs", "jobs/pending", "jobs/scheduled", "jobs/active", "jobs/fulfilled", "jobs/failed",
    "jobs/cancelled", "jobs/notify", "targets", "control", "control/paused", "control/cancel",
    "control/deadlines", "control/doorbell", "runs", "workers", "leases", "ids", "tmp", "quarantine",
    "finished", "unique", "deps",
})

_roots: list[Root] = []  # longest prefix first, so a store inside another's directory is found


def attach(path: str, dir_mode: int, fd: int | None = None) -> None:
    """From now on, resolve every path beneath ``path`` (a store root) without following links;
    beneath the directory ``fd`` is open on, if given (whatever is at ``path`` meanwhile)."""
    for root in _roots:
        if root.path == path:
            root.uses += 1
            return
    _roots.append(Root(path, dir_mode, fd))
    _roots.sort(key=lambda r: -len(r.prefix))


def prime(path: str) -> None:
    """Open the skeleton's directories of attached root ``path`` now, so the number of open
    descriptors a store holds is settled from its start (one more per queue directory)."""
    for root in _roots:
        if root.path == path:
            for rel in sorted(_SKELETON):
                if root.prefix + rel not in root.cache:
                    root.split(f"{rel}/-")
            return


def detach(path: str) -> None:
    """Undo one :func:`attach`; the last one closes the root's descriptors."""
    for root in _roots:
        if root.path == path:
            root.uses -= 1
            if root.uses <= 0:
                _roots.remove(root)
                root.close()
            return


def reconnect(path: str) -> bool:
    """A call on ``path`` failed with a lost connection (:data:`DISCONNECTED`): if its root's
    descriptor died with the mount's client and the directory is reachable again, reopen it
    (:meth:`Root.reconnect`) and say True (ask again)."""
    for root in _roots:
        if path.startswith(root.prefix) or path == root.path:
            return root.reconnect()
    return False


def drop_bucket(path: str) -> bool:
    """A call on ``path`` through a cached descriptor of its parent failed with ENOENT or ESTALE:
    if that parent is a bucket, have it looked up afresh and say True (ask again: see the module
    docstring)."""
    for root in _roots:
        if path.startswith(root.prefix):
            head = path[len(root.prefix):].rpartition("/")[0]
            return _cacheable(head) == BUCKET and root.drop_bucket(head)
    return False


def split(path: str) -> tuple[int | None, str, int, Root | None]:
    """(directory descriptor or None, name relative to it, KEPT, CLOSE or BUCKET (see
    :meth:`Root.split`), its root)."""
    # The hot path, about ten times per claim and commit: the parent's descriptor is cached
    # and fresh. One dict lookup on the parent's path as given (a cached path is a root's
    # prefix and a relative path, so it is below that root).
    head, _, name = path.rpartition("/")
    for root in _roots:
        entry = root.cache.get(head)
        if entry is not None and _monotonic() - entry[1] < RECHECK_AFTER:
            return entry[0], name, entry[4], root
    if len(_roots) == 1:  # the usual case: one store in the process
        root = _roots[0]
        if path.startswith(root.prefix):
            fd, name, how = root.split(path[len(root.prefix):])
            return fd, name, how, root
        return None, path, KEPT, None
    for root in _roots:
        if path.startswith(root.prefix):
            fd, name, how = root.split(path[len(root.prefix):])
            return fd, name, how, root
    return None, path, KEPT, None
