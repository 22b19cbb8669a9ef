"""This machine's raw limits, measured with bare syscalls in the same run as the workloads."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import select
import struct
import time
from collections.abc import Callable
from typing import Any

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


# -- the floor of a rename-claim design: what one claim+complete costs in bare syscalls ---------
def _floor_worker(names: list[str], pend: str, act: str, done: str, durable: bool, burn_us: float,
                  start: mp.synchronize.Event, out: mp.Queue) -> None:  # type: ignore[name-defined,type-arg]
    dfd = os.open(done, os.O_RDONLY | os.O_DIRECTORY)
    line = b'{"result":"fulfilled"}\n'
    start.wait()
    for name in names:
        claimed = os.path.join(act, name)
        os.rename(os.path.join(pend, name), claimed)
        fd = os.open(claimed, os.O_RDWR)
        size = len(os.read(fd, 65536))
        if burn_us:  # CPU a job costs beyond these syscalls (bench/w8_budget.py): spin, never sleep
            until = time.perf_counter() + burn_us / 1e6
            while time.perf_counter() < until:
                pass
        os.pwrite(fd, line, size)
        if durable:
            os.fsync(fd)
        os.close(fd)
        os.rename(claimed, os.path.join(done, name))
        if durable:
            os.fsync(dfd)
    out.put(time.monotonic())


def drain_floor(base: str, n: int, workers: int, *, durable: bool, burn_us: float = 0.0) -> float:
    """Claims+completes per second, by ``workers`` processes, in bare syscalls: rename the job file
    into active/, open, read, append a result, (fsync,) close, rename it into done/ (, fsync that
    directory). That is the least any design costs that claims a job by renaming its file and
    publishes the result by renaming it again, as fsjobstore does. It does no parsing, no checks
    and no fencing, and each worker owns a share of the names, so it never contends. ``burn_us``:
    spin that many microseconds of CPU in each job, between the read and the append."""
    pend, act, done = (os.path.join(base, x) for x in ("pending", "active", "done"))
    for d in (pend, act, done):
        os.makedirs(d)
    # Names as long as fsjobstore's: directory lookups cost by name length.
    names = [f"1000000.{i:020d}.{os.urandom(16).hex()}.json" for i in range(n)]
    for name in names:
        with open(os.path.join(pend, name), "wb") as fh:
            fh.write(_DATA * 4)  # about as long as a job file
    os.sync()  # as the queues' drains do after their fill: the write-back must not land inside the drain
    t0, finished = run_together(_floor_worker, [(names[k::workers], pend, act, done, durable, burn_us)
                                                   for k in range(workers)])
    return n / (max(finished) - t0)


def run_together(target: Callable[..., None], arg_lists: list[tuple[Any, ...]],
                 timeout: float = 900) -> tuple[float, list[Any]]:
    """Fork one process per argument tuple, let them all start at one signal, and return the
    monotonic time of that signal and what each put on its queue. ``target`` is called as
    ``target(*args, start, out)``: it waits on ``start`` and puts one result on ``out``."""
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, start, out)) for args in arg_lists]
    for p in procs:
        p.start()
    time.sleep(0.3)  # every process has opened what it needs
    t0 = time.monotonic()
    start.set()
    results = [out.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join()
    return t0, results
