"""This machine's raw limits, measured with bare syscalls in the same run as the workloads."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import select
import struct
import time

_DATA = b'{"i": 1, "payload": "' + b"x" * 50 + b'"}\n'


def rename(base: str, n: int) -> float:
    """Renames per second between two directories."""
    a, b = os.path.join(base, "a"), os.path.join(base, "b")
    os.makedirs(a)
    os.makedirs(b)
    for i in range(n):
        with open(os.path.join(a, str(i)), "wb") as fh:
            fh.write(_DATA)
    t = time.perf_counter()
    for i in range(n):
        os.rename(os.path.join(a, str(i)), os.path.join(b, str(i)))
    return n / (time.perf_counter() - t)


def create(base: str, n: int, *, then_rename: bool) -> float:
    """create+write+close (and optionally a rename into a second directory) per second."""
    a, b = _pair(base)
    return n / create_block(a, b, 0, n, then_rename=then_rename, durable=False)


def durable_create(base: str, n: int) -> float:
    """create+write+fsync+close+rename+dir-fsync per second (the least a durable enqueue costs)."""
    a, b = _pair(base)
    return n / create_block(a, b, 0, n, then_rename=True, durable=True)


def _pair(base: str) -> tuple[str, str]:
    a, b = os.path.join(base, "a"), os.path.join(base, "b")
    os.makedirs(a)
    os.makedirs(b)
    return a, b


def create_block(a: str, b: str, start: int, count: int, *, then_rename: bool, durable: bool) -> float:
    """Seconds to create files ``start .. start+count`` in ``a`` (moving each into ``b``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    dfd = os.open(b, os.O_RDONLY | os.O_DIRECTORY)
    try:
        t = time.perf_counter()
        for i in range(start, start + count):
            p = os.path.join(a, str(i))
            fd = os.open(p, flags, 0o600)
            os.write(fd, _DATA)
            if durable:
                os.fsync(fd)
            os.close(fd)
            if then_rename:
                os.rename(p, os.path.join(b, str(i)))
                if durable:
                    os.fsync(dfd)
        return time.perf_counter() - t
    finally:
        os.close(dfd)


# -- inotify round trip: one process creates a file, another blocked in read() sees it ---------
_IN_CREATE, _IN_MOVED_TO = 0x100, 0x80


def _watcher(directory: str, n: int, ready: mp.synchronize.Event, out: mp.Queue) -> None:  # type: ignore[name-defined,type-arg]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    libc.inotify_add_watch(fd, directory.encode(), _IN_CREATE | _IN_MOVED_TO)
    ready.set()
    seen: list[float] = []
    while len(seen) < n:
        select.select([fd], [], [])
        buf = os.read(fd, 65536)
        now = time.monotonic()
        off = 0
        while off < len(buf):
            _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf, off)
            seen.append(now)
            off += 16 + length
    out.put(seen)


def inotify_round_trip(base: str, n: int = 200, gap: float = 0.02) -> float:
    """Median milliseconds from just before rename() to a watcher in another process waking."""
    d = os.path.join(base, "w")
    os.makedirs(d)
    ctx = mp.get_context("fork")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_watcher, args=(d, n, ready, out))
    proc.start()
    ready.wait(10)
    sent = []
    for i in range(n):
        p = os.path.join(base, f"f{i}")
        with open(p, "wb") as fh:
            fh.write(_DATA)
        sent.append(time.monotonic())
        os.rename(p, os.path.join(d, str(i)))
        time.sleep(gap)
    got = out.get(timeout=60)
    proc.join()
    lat = sorted(g - s for s, g in zip(sent, got, strict=True))
    return lat[len(lat) // 2] * 1000
