"""What the filesystem under a store can do, and the self-test behind ``fsjobstore verify DIR``.

The store leans on four facts of a local POSIX filesystem: rename is atomic, hard links work,
fsync works, and an ``flock`` held by a process is seen by every other process and released
when the holder dies. On network filesystems (NFS, CIFS, CephFS, FUSE mounts, 9p, ...) the last
one may hold only within one host, and inotify sees nothing another host does. There the store
runs **heartbeat-only**: a free lock is not taken as proof that its holder died, so a holder is
only replaced after a whole ``lease_duration`` without heartbeats; and pullers rely on polling.

``verify`` checks each fact on the user's own mount with real processes, and says which mode
the store will choose there.
"""

from __future__ import annotations

import dataclasses
import errno
import multiprocessing
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from .._errors import InvalidRequest
from . import _syscalls as sc
from ._files import DIR_MODE, FILE_MODE, O_CLOEXEC, fsync_dir
from ._inotify import Waker

# Filesystem types on which flock may not reach other hosts and inotify misses remote changes.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p", "afs", "gpfs",
    "beegfs", "ocfs2", "gfs2", "davfs", "sshfs", "virtiofs",
})


def filesystem_type(path: str) -> str:
    """The type of the filesystem holding ``path`` (from /proc/self/mountinfo), or "unknown"."""
    path = os.path.realpath(path)
    best, best_type = "", "unknown"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if "-" not in fields:
                    continue
                mount = fields[4].replace("\\040", " ")
                fstype = fields[fields.index("-") + 1]
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, best_type = mount, fstype
    except OSError:
        return "unknown"
    return best_type


def locks_prove_death(path: str) -> bool:
    """The default for ``JobStore(lock_takeover=None)``: trust flock on local filesystems only."""
    fstype = filesystem_type(path)
    return not (fstype in NETWORK_FS or fstype.startswith("fuse"))


# == the self-test =================================================================================
@dataclass(frozen=True, slots=True)
class VerifyCheck:
    """One finding of :func:`verify`."""

    name: str
    passed: bool
    detail: str
    required: bool  # the store cannot work safely without it
    mechanism: str = ""  # the wake-up check: what delivered the event ("inotify" or "watchdog")


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` found, and what a store in that directory will do there."""

    directory: str
    filesystem: str  # from /proc/self/mountinfo
    checks: tuple[VerifyCheck, ...]
    lock_takeover: bool  # the take-over mode a store opened there will choose
    wakeups: str  # "inotify", "watchdog" or "polling"
    warnings: tuple[str, ...]  # things that do not fail the check but a user must know
    safe: bool  # every required check passed, and locks work wherever the store trusts them
    peer: str | None = None  # with --peer/--wait-for-peer: the other host
    min_lease: float | None = None  # ... the shortest safe lease_duration between the two hosts
    clock_skew: float | None = None  # ... the other host's wall clock minus ours, in seconds

    def lines(self) -> list[str]:
        """The report as ``fsjobstore verify`` prints it."""
        # A check the store does not rely on cannot fail the verdict: it is a note, not a FAIL.
        out = [f"{'PASS' if c.passed else 'FAIL' if c.required else 'NOTE'}  {c.name}: {c.detail}"
               for c in self.checks]
        out.append(f"filesystem: {self.filesystem}")
        out.append("take-over: " + (
            "lock-based (a dead holder's jobs are taken at once; a hung one's after lease_duration)"
            if self.lock_takeover else
            "heartbeat-only (a holder is replaced after lease_duration without heartbeats)"))
        if self.wakeups == "polling":
            wakeups = "polling every poll_interval (inotify events did not arrive)"
        elif self.lock_takeover:
            wakeups = f"{self.wakeups}, with a rescan every poll_interval"
        else:  # a network filesystem: inotify hears this host only
            wakeups = (f"{self.wakeups.replace(' (this host only)', '')} from this host; from other hosts the "
                       "doorbell (a listing every 25 ms), and a rescan every poll_interval")
        out.append(f"wake-ups: {wakeups}")
        if self.peer is not None:
            out.append(f"peer: {self.peer}")
        if self.clock_skew is not None:
            ms = round(self.clock_skew * 1000) or 0  # never "-0"
            out.append(f"clock skew: the peer's wall clock is {ms:+d} ms from the leader's")
        if self.min_lease is not None:
            out.append(f"lease: use lease_duration >= {self.min_lease:g} s between these hosts")
        out.extend(f"warning: {w}" for w in self.warnings)
        out.append("result: " + ("PASS" if self.safe else "FAIL"))
        return out


def _lock_holder(path: str, ready: multiprocessing.synchronize.Event, done: multiprocessing.synchronize.Event) -> None:
    fd = sc.open(path, os.O_RDWR | O_CLOEXEC)
    if sc.try_lock(fd):
        ready.set()
        done.wait(10)
    os._exit(0)  # dies holding the lock: the kernel must release it


def _lock_tester(path: str, result: Connection) -> None:
    fd = sc.open(path, os.O_RDWR | O_CLOEXEC)
    result.send(sc.try_lock(fd))  # a pipe, not a Queue: send() is done before _exit
    os._exit(0)


def check_locks(scratch: str) -> VerifyCheck:
    ctx = multiprocessing.get_context("fork")
    path = os.path.join(scratch, "lock")
    sc.close(sc.open(path, os.O_RDWR | os.O_CREAT | O_CLOEXEC, FILE_MODE))
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_lock_holder, args=(path, ready, done))
    holder.start()
    try:
        if not ready.wait(10):
            return VerifyCheck("lock exclusion", False, "a process could not take a lock at all", False)
        receive, send = ctx.Pipe(duplex=False)

        def probe() -> bool:
            tester = ctx.Process(target=_lock_tester, args=(path, send))
            tester.start()
            try:
                return bool(receive.recv()) if receive.poll(10) else False
            finally:
                _reap(tester)

        got_while_held = probe()
        done.set()
        holder.join(10)
        got_after_death = probe()
    finally:
        _reap(holder)
    if got_while_held:
        return VerifyCheck("lock exclusion", False, "a second process took a lock another process held", False)
    if not got_after_death:
        return VerifyCheck("lock exclusion", False, "a lock was not released when its holder died", False)
    return VerifyCheck("lock exclusion", True, "held locks exclude other processes and die with their holder", False)


def _renamer(scratch: str, rounds: int) -> None:
    target = os.path.join(scratch, "target")
    for i in range(rounds):
        tmp = os.path.join(scratch, f"tmp{i}")
        fd = sc.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC, FILE_MODE)
        sc.write(fd, (f"{i:08d}" * 64).encode())
        sc.close(fd)
        sc.rename(tmp, target)
    os._exit(0)


def check_rename(scratch: str, rounds: int = 2000) -> VerifyCheck:
    """A reader never sees half of one version and half of another of a name being replaced.

    Whether the name is ever missing for a moment is reported but does not fail the check: the
    store never relies on it (job files are renamed to fresh names; the few names it replaces,
    a notification's due time or a worker's status, are read by code that treats a missing file
    as "look again"), and some network filesystems (GlusterFS) do show it."""
    target = os.path.join(scratch, "target")
    _write_file(target, b"00000000" * 64)
    ctx = multiprocessing.get_context("fork")
    writer = ctx.Process(target=_renamer, args=(scratch, rounds))
    writer.start()
    reads = stale = missing = 0
    try:
        while writer.is_alive() or reads == 0:
            try:
                data = _read_file(target)
            except OSError as exc:
                if exc.errno == errno.ESTALE:  # a network filesystem's stale handle: the store opens again
                    stale += 1
                    continue
                if not isinstance(exc, FileNotFoundError):
                    raise
                missing += 1
                continue
            reads += 1
            if len(data) != 512 or data != data[:8] * 64:
                return VerifyCheck("atomic rename", False,
                                   f"a reader saw a mixed or partial file ({len(data)} bytes)", True)
    finally:
        _reap(writer)
    notes = [f"{n} {what}" for n, what in ((stale, "stale handles, opened again"),
                                           (missing, "times the replaced name was missing for a moment")) if n]
    extra = f" ({'; '.join(notes)}: the store does not rely on either)" if notes else ""
    return VerifyCheck("atomic rename", True,
                       f"{rounds} replacing renames, {reads} concurrent reads, all whole{extra}", True)


def check_links(scratch: str) -> VerifyCheck:
    src, dst = os.path.join(scratch, "linksrc"), os.path.join(scratch, "linkdst")
    _write_file(src, b"x")
    try:
        sc.link(src, dst)
        sc.link(src, dst)
    except FileExistsError:
        return VerifyCheck("hard links", True, "link() works and refuses an existing name", True)
    except OSError as exc:
        return VerifyCheck("hard links", False, f"link() failed: {exc}", True)
    return VerifyCheck("hard links", False, "link() replaced an existing name", True)


def check_fsync(scratch: str, rounds: int = 20) -> VerifyCheck:
    try:
        started = time.perf_counter()
        for i in range(rounds):
            path = os.path.join(scratch, f"sync{i}")
            fd = sc.open(path, os.O_WRONLY | os.O_CREAT | O_CLOEXEC, FILE_MODE)
            sc.write(fd, b"x" * 100)
            sc.fsync(fd)
            sc.close(fd)
            fsync_dir(scratch)
        each = (time.perf_counter() - started) / rounds
    except OSError as exc:
        return VerifyCheck("fsync", False, f"fsync failed: {exc}", True)
    return VerifyCheck("fsync", True,
                       f"file and directory fsync work ({each * 1000:.2f} ms per write+fsync+dir fsync)", True)


def _touch_later(path: str) -> None:
    time.sleep(0.2)
    _write_file(path, b"")
    os._exit(0)


# Files in the scratch directory go through _syscalls like the store's own, so they are reached
# beneath the scratch directory's descriptor (verify attaches it), never through a link.
def _write_file(path: str, data: bytes) -> None:
    fd = sc.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, FILE_MODE)
    try:
        if data:
            sc.write(fd, data)
    finally:
        sc.close(fd)


def _read_file(path: str) -> bytes:
    fd = sc.open(path, os.O_RDONLY | O_CLOEXEC)
    try:
        return sc.read(fd, 1 << 16)
    finally:
        sc.close_read(fd)


def check_inotify(scratch: str, wait: float = 3.0) -> VerifyCheck:
    """Watch a directory with the store's own :class:`Waker` (inotify, or watchdog where inotify
    cannot be used) and let another process create a file in it: the waiting thread must wake."""
    seen: list[float] = []
    watched = os.path.join(scratch, "watched")
    sc.mkdir(watched, DIR_MODE)
    waker = Waker(watched, lambda path: seen.append(time.perf_counter()))
    waker.start()
    try:
        if not waker.watching:
            return VerifyCheck("inotify wake-ups", False, "cannot watch the directory (see the log)", False)
        proc = multiprocessing.get_context("fork").Process(target=_touch_later,
                                                           args=(os.path.join(watched, "f"),))
        started = time.perf_counter()
        deadline = started + 0.2 + wait
        proc.start()
        try:
            while time.perf_counter() < deadline:
                # The generation is read before looking: an arrival in between (watchdog's
                # thread) then ends the wait at once instead of at the deadline.
                generation = waker.generation
                if seen:
                    break
                waker.wait(generation, deadline - time.perf_counter())
        finally:
            _reap(proc)
        how = waker.mechanism
    finally:
        waker.stop()
    if not seen:
        return VerifyCheck("inotify wake-ups", False,
                           f"no event within {wait} s of another process creating a file", False)
    latency = (seen[0] - started - 0.2) * 1000
    return VerifyCheck("inotify wake-ups", True,
                 f"another process's create woke a waiting thread after about {max(latency, 0.0):.1f} ms ({how})",
                 False, how)


def _reap(proc: multiprocessing.process.BaseProcess) -> None:
    """End a check's child and wait for it: a child still holding files open in the scratch
    directory would keep it from being removed (NFS renames such files to .nfsXXXX)."""
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


CHECKS: tuple[tuple[str, Callable[[str], VerifyCheck], bool], ...] = (
    ("atomic rename", check_rename, True),
    ("hard links", check_links, True),
    ("fsync", check_fsync, True),
    ("lock exclusion", check_locks, False),
    ("inotify wake-ups", check_inotify, False),
)

# Filesystems that keep everything in memory: a store there loses everything at a reboot.
VOLATILE_FS = frozenset({"tmpfs", "ramfs"})


def verify(directory: str) -> VerifyReport:
    """VerifyCheck, with real processes, what the store relies on in ``directory`` (which must exist
    and be writable), in a scratch directory that is removed afterwards, however the checks end.

    Raises :class:`InvalidRequest` if ``directory`` is not a directory one can write in.
    """
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        what = "does not exist" if not os.path.lexists(directory) else "is not a directory"
        raise InvalidRequest(f"{directory} {what}; verify checks the filesystem of an existing directory")
    scratch = os.path.join(directory, f".fsjobstore-verify-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    try:
        dfd = _make_scratch(scratch)
    except OSError as exc:
        raise InvalidRequest(f"cannot write in {directory} ({exc.strerror}); verify needs to make a "
                             "scratch directory there") from None
    warnings: list[str] = []
    checks = []
    # Everything below the scratch directory is reached from its descriptor, never through a
    # link: in a shared directory another user may swap it for a link meanwhile.
    sc.attach(scratch, DIR_MODE, dfd)
    try:
        for name, test, required in CHECKS:
            sub = os.path.join(scratch, test.__name__)
            try:
                sc.mkdir(sub, DIR_MODE)
                checks.append(test(sub))
            except Exception as exc:  # a check that cannot even run has failed
                checks.append(VerifyCheck(name, False, f"{type(exc).__name__}: {exc}", required))
    finally:
        sc.detach(scratch)
        problem = _remove_scratch(scratch, dfd)
        if problem:
            warnings.append(f"could not remove the scratch directory {scratch}: {problem}")
    fstype = filesystem_type(directory)
    if fstype in VOLATILE_FS:
        warnings.append(f"{fstype} keeps everything in memory: a reboot or power cut loses the whole store, "
                        "durable=True or not")
    trust = locks_prove_death(directory)
    if trust:  # a store here takes a free lock as proof of death: locks must work
        checks = [dataclasses.replace(c, required=True) if c.name == "lock exclusion" else c for c in checks]
    locks_ok = all(c.passed for c in checks if c.name == "lock exclusion")
    watch = next((c for c in checks if c.name == "inotify wake-ups"), None)
    wakeups = watch.mechanism if watch is not None and watch.passed else "polling"
    if trust and not locks_ok:
        warnings.append("the store would trust locks here, but they do not work: open it with lock_takeover=False")
    safe = all(c.passed for c in checks if c.required) and (locks_ok or not trust)
    return VerifyReport(directory, fstype, tuple(checks), trust, wakeups, tuple(warnings), safe)


def _make_scratch(path: str) -> int:
    """Make directory ``path`` and return a descriptor of it, checked to be the one just made
    (ours, mode 0700): not a link, nor a directory someone renamed into its place."""
    os.mkdir(path, DIR_MODE)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        os.close(fd)
        raise OSError(errno.EEXIST, "the scratch directory was replaced as it was made", path)
    return fd


def _remove_scratch(path: str, fd: int) -> str | None:
    """Empty the scratch directory through its descriptor, then remove its name if that is still
    it. On a network filesystem a just-closed file can be busy for a moment, so try a few times.
    Returns what went wrong, or None."""
    try:
        last: OSError | None = None
        for delay in (0.0, 0.1, 0.5, 1.0):
            time.sleep(delay)
            try:
                for name in os.listdir(fd):
                    # rmtree with dir_fd never follows a link, at the top or below it.
                    if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        shutil.rmtree(name, dir_fd=fd)
                    else:
                        os.unlink(name, dir_fd=fd)
                last = None
                break
            except FileNotFoundError:
                continue
            except OSError as exc:
                last = exc
        if last is not None:
            return f"{last.strerror or last}"
        mine = os.fstat(fd)
        try:
            named = os.lstat(path)
        except FileNotFoundError:
            return "it was moved away while verify ran (left there, empty)"
        if (named.st_dev, named.st_ino) != (mine.st_dev, mine.st_ino):
            return "it was moved away while verify ran, and something else put in its place (both left)"
        # RACE: a swap between this lstat and the rmdir makes rmdir fail (a link, a file: ENOTDIR;
        # a non-empty directory: ENOTEMPTY): it never removes anything but an empty directory.
        try:
            os.rmdir(path)
        except OSError as exc:
            return f"{exc.strerror or exc}"
        return None
    finally:
        os.close(fd)
