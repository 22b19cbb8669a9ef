"""Probes of what holds between two mounts of the bed, used by test_bed.py and `python gluster.py selftest`.

Anything that might block on a hung FUSE client runs in a child process with a timeout, so a probe
can fail but never hang its caller.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import fcntl
import json
import multiprocessing
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

PY = sys.executable
_libc = ctypes.CDLL(None, use_errno=True)


_unanswered: list[subprocess.Popen[bytes]] = []  # killed stat children a hung mount still holds


def answers_within(path: Path, timeout: float) -> bool:
    """True if a stat of path returns (found or not) within timeout; done in a child that is killed if not.

    The killed child is not waited for: a FUSE request the stopped client had already read leaves
    its caller in uninterruptible sleep (``request_wait_answer``) until the client answers, and
    waiting here would then keep the test from ever sending the SIGCONT that lets it answer (a
    CI run hung there, 2026-11-25). It is reaped by a later call once it has ended."""
    for child in list(_unanswered):
        if child.poll() is not None:
            _unanswered.remove(child)
    child = subprocess.Popen(["stat", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        _unanswered.append(child)
        return False
    return True


def _readline(stream: IO[bytes], timeout: float) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


# --- locks ------------------------------------------------------------------------------------------------

_HOLD = """import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX) if sys.argv[2] == "flock" else fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


class LockHolder:
    """A child process holding an exclusive flock or lockf (POSIX record lock) on path, as a process on another
    host would. Used as a context manager; kill() simulates that process dying."""

    def __init__(self, path: Path, kind: str = "flock") -> None:
        self.proc = subprocess.Popen([PY, "-c", _HOLD, str(path), kind], stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        if _readline(self.proc.stdout, 15.0) != b"locked\n":
            self.kill()
            raise RuntimeError(f"could not take a {kind} lock on {path}")

    def kill(self, wait: bool = True) -> None:
        """SIGKILL the holder. Do not wait while its mount's client is stopped: its exit blocks on the mount."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        if wait:
            self.proc.wait(timeout=30)

    def __enter__(self) -> LockHolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def try_lock(path: Path, kind: str = "flock") -> bool:
    """Take and at once drop an exclusive lock without waiting: True if it was free."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    finally:
        os.close(fd)


def seconds_until_lockable(path: Path, kind: str, timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if try_lock(path, kind):
            return time.monotonic() - t0
        time.sleep(0.0005)
    return None


# --- rename race ------------------------------------------------------------------------------------------


def _race_worker(directory: str, tag: str, rounds: int, barrier: object, out: object) -> None:
    results = []
    for i in range(rounds):
        barrier.wait(timeout=30)  # type: ignore[attr-defined]  # both contenders rename the same file at once
        try:
            os.rename(f"{directory}/src-{i}", f"{directory}/won-{i}-{tag}")
            results.append(0)
        except OSError as exc:
            results.append(exc.errno or -1)
    out.put((tag, results))  # type: ignore[attr-defined]


def rename_race(dir_a: Path, dir_b: Path, rounds: int) -> dict[str, object]:
    """Claim each of `rounds` files by renaming it, through A and through B in lockstep (how the store's
    workers claim a job): each race should have exactly one winner, the loser getting ENOENT."""
    for i in range(rounds):
        (dir_a / f"src-{i}").write_bytes(b"job")
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(str(d), tag, rounds, barrier, out))
             for d, tag in ((dir_a, "A"), (dir_b, "B"))]
    for proc in procs:
        proc.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    names = set(os.listdir(dir_a))
    one_winner = [i for i in range(rounds) if (results["A"][i] == 0) != (results["B"][i] == 0)
                  and (f"won-{i}-A" in names) != (f"won-{i}-B" in names) and f"src-{i}" not in names]
    losers = collections.Counter(errno.errorcode.get(e, str(e)) for e in results["A"] + results["B"] if e)
    return {"rounds": rounds, "one_winner": len(one_winner), "wins_a": results["A"].count(0),
            "wins_b": results["B"].count(0), "loser_errors": dict(losers)}


# --- inotify, renameat2 -----------------------------------------------------------------------------------

IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100


def inotify_names(watched: Path, action: Callable[[], None], wait: float = 1.0) -> list[str]:
    """Names inotify reports in `watched` while `action` runs and for `wait` seconds after."""
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    try:
        if _libc.inotify_add_watch(fd, str(watched).encode(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {watched}")
        action()
        names: list[str] = []
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([fd], [], [], left)[0]:
                break
            data = os.read(fd, 65536)
            while data:
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data)
                names.append(data[16:16 + size].rstrip(b"\0").decode())
                data = data[16 + size:]
        return names
    finally:
        os.close(fd)


def rename_noreplace(src: Path, dst: Path) -> int:
    """renameat2(RENAME_NOREPLACE): 0 or the errno."""
    at_fdcwd, rename_noreplace_flag = -100, 1
    if _libc.renameat2(at_fdcwd, str(src).encode(), at_fdcwd, str(dst).encode(), rename_noreplace_flag) == 0:
        return 0
    return ctypes.get_errno()


# --- caches and replaced names ----------------------------------------------------------------------------


def _cached_then_moved(dir_a: Path, dir_b: Path, name: str) -> tuple[Path, Path]:
    """Mount A makes ``x/N`` and looks it up; mount B renames that file to ``y/M``. Returns the
    directory as A and as B see it."""
    a, b = dir_a / name, dir_b / name
    (a / "x").mkdir(parents=True)
    (a / "y").mkdir()
    (a / "x" / "N").write_bytes(b"")
    os.stat(a / "x" / "N")
    os.rename(b / "x" / "N", b / "y" / "M")
    return a, b


def links_onto_a_name_moved_away(dir_a: Path, dir_b: Path, rounds: int, age: float = 0.0) -> int:
    """How many of ``rounds`` links said EEXIST for a name that no longer exists: after
    :func:`_cached_then_moved`, (``age`` seconds later) A links a new file to ``x/N``."""
    said_eexist = 0
    for i in range(rounds):
        a, _ = _cached_then_moved(dir_a, dir_b, f"linked-{i}")
        time.sleep(age)
        (a / "y" / "new").write_bytes(b"")
        try:
            os.link(a / "y" / "new", a / "x" / "N")
        except FileExistsError:
            said_eexist += 1
    return said_eexist


def renames_onto_a_cached_name(dir_a: Path, dir_b: Path, rounds: int, age: float = 0.0) -> int:
    """How many of ``rounds`` renames back to a file's old name did nothing: after
    :func:`_cached_then_moved`, (``age`` seconds later) A renames ``y/M`` back to ``x/N``. The
    kernel answers a rename onto a name its entry cache holds for the same file without asking
    the filesystem; the cache is A's, and stale."""
    did_nothing = 0
    for i in range(rounds):
        a, b = _cached_then_moved(dir_a, dir_b, f"cached-{i}")
        time.sleep(age)
        os.rename(a / "y" / "M", a / "x" / "N")  # returns 0 either way
        if os.path.exists(b / "y" / "M"):  # asked through B: the file never moved
            did_nothing += 1
    return did_nothing


def staleness_ms(writer: Path, reader: Path, timeout: float = 5.0) -> float | None:
    """How long after an append through one mount the other still reports the old size (attribute caches)."""
    name = f"grow-{time.monotonic_ns()}"  # a name the reader has never seen
    (writer / name).write_bytes(b"x")
    os.stat(reader / name)  # the reader's caches now hold size 1
    with open(writer / name, "ab") as f:
        f.write(b"y")
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if os.stat(reader / name).st_size == 2:
            return (time.monotonic() - t0) * 1000
        time.sleep(0.002)
    return None


def rewrite_lags_ms(writer: Path, reader: Path, rounds: int = 3, timeout: float = 10.0) -> list[float]:
    """Per round: a fresh file is written through one mount and read through the other (which now caches
    it); the writer rewrites it in place (pwrite, same size); ms until the reader, re-reading every 2 ms,
    gets the new bytes (timeout * 1000 if it never did)."""
    lags = []
    for i in range(rounds):
        old, new = f"old-{i}-".encode() * 200, f"new-{i}-".encode() * 200
        name = f"page-{time.monotonic_ns()}"  # a name the reader has never seen: nothing cached yet
        (writer / name).write_bytes(old)
        assert (reader / name).read_bytes() == old
        fd = os.open(writer / name, os.O_WRONLY)
        os.pwrite(fd, new, 0)
        os.close(fd)
        t0 = time.monotonic()
        while (reader / name).read_bytes() != new and time.monotonic() - t0 < timeout:
            time.sleep(0.002)
        lags.append((time.monotonic() - t0) * 1000)
    return lags


_REPLACER = """import os, sys, time
d, end, n = sys.argv[1], time.time() + float(sys.argv[2]), 0
while time.time() < end:
    with open(f"{d}/next", "wb") as f: f.write(b"x" * 100)
    os.rename(f"{d}/next", f"{d}/name"); n += 1
print(n)
"""
_OPENER = """import collections, errno, json, os, sys, time
d, end, seen = sys.argv[1], time.time() + float(sys.argv[2]), collections.Counter()
while time.time() < end:
    try:
        with open(f"{d}/name", "rb") as f: f.read()
        seen["ok"] += 1
    except OSError as exc: seen[errno.errorcode.get(exc.errno, str(exc.errno))] += 1
print(json.dumps(seen))
"""


def replace_while_open(dir_a: Path, dir_b: Path, seconds: float = 2.0) -> dict[str, int]:
    """Replace a name by rename through A while B keeps opening and reading it: counts B's outcomes."""
    (dir_a / "name").write_bytes(b"x" * 100)
    procs = [subprocess.Popen([PY, "-c", code, str(d), str(seconds)], stdout=subprocess.PIPE, text=True)
             for code, d in ((_REPLACER, dir_a), (_OPENER, dir_b))]
    outs = [p.communicate(timeout=seconds + 60)[0] for p in procs]
    return {"replacements": int(outs[0]), **json.loads(outs[1])}


# --- rates ------------------------------------------------------------------------------------------------

_CREATE = """import json, os, sys, time
d, tag, secs, payload, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), b"x" * 200, 0
sys.stdin.readline()
t0 = time.time()
while time.time() - t0 < secs:
    fd = os.open(f"{d}/.{tag}.{n}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, payload); os.close(fd)
    os.rename(f"{d}/.{tag}.{n}.tmp", f"{d}/{tag}.{n}"); n += 1
print(json.dumps({"n": n, "t0": t0, "t1": time.time()}))
"""


def create_rate(dirs: list[Path], seconds: float = 3.0) -> float:
    """Files/s of create+write(200 B)+close+rename, one process per directory, all started at once (no fsync)."""
    procs = [subprocess.Popen([PY, "-c", _CREATE, str(d), f"w{i}", str(seconds)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for i, d in enumerate(dirs)]
    time.sleep(0.5)  # every interpreter is up and waiting on its stdin
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    runs = [json.loads(proc.communicate(timeout=seconds + 120)[0]) for proc in procs]
    return sum(r["n"] for r in runs) / (max(r["t1"] for r in runs) - min(r["t0"] for r in runs))
