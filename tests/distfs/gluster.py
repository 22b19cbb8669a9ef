"""A loopback GlusterFS test bed: one glusterd, one single-brick volume, mounted through FUSE once per "host".

Two mounts of the same volume are two independent FUSE clients (two processes with their own caches and
their own connection to the brick), which is as close to two hosts sharing one directory as one machine
gets. Everything binds to 127.0.0.1 and lives under one fresh directory per run (see README.md).

    with GlusterBed() as bed:
        a, b = bed.mount("a"), bed.mount("b", STRICT)
        ...                      # a.path / b.path are the same directory; a.stop(), a.kill(), a.remount()

Command line: `python gluster.py up` (two mounts until Ctrl-C) and `python gluster.py selftest`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

BASE = Path(os.environ.get("FSJOBSTORE_DISTFS_BASE", "/tmp/fsjobstore-distfs"))
VOLUME = "fsjs"
# Bricks fetch their volfile from "<host>:24007" with no way to pass another port, so glusterd must use it.
GLUSTERD_PORT = 24007
CMD_TIMEOUT = 60.0  # seconds; a cap for every external command, so nothing can hang a CI run

DEFAULT: tuple[str, ...] = ()
STRICT: tuple[str, ...] = ("--attribute-timeout=0", "--entry-timeout=0", "--fopen-keep-cache=off")
UNSAFE: tuple[str, ...] = ("--attribute-timeout=0", "--entry-timeout=0")  # serves stale pages: see README
# STRICT mounts still read contents and sizes up to 1 s stale through the client's md-cache (README, "caches");
# with md-cache off they are fresh, but then DEFAULT and UNSAFE mounts can stay stale indefinitely.
STRICT_VOLUME = {"performance.stat-prefetch": "off"}

_SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _tool(name: str) -> str:
    found = shutil.which(name, path=_SBIN)
    if found is None:
        raise FileNotFoundError(f"{name} not found; run tests/distfs/install.sh")
    return found


def brick_host() -> str | None:
    """A host name that resolves to 127.0.0.1 (the gluster CLI refuses "localhost" and "127.0.0.1")."""
    names = [socket.gethostname()]
    with contextlib.suppress(OSError), open("/etc/hosts") as hosts:
        for line in hosts:
            fields = line.split("#", 1)[0].split()
            if len(fields) > 1 and fields[0] == "127.0.0.1":
                names += fields[1:]
    for name in names:
        if name.startswith("localhost"):
            continue
        with contextlib.suppress(OSError):
            if socket.gethostbyname(name) == "127.0.0.1":
                return name
    return None


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def available() -> str | None:
    """None if the bed can run here, else a one-line reason to skip."""
    if not sys.platform.startswith("linux"):
        return "the GlusterFS bed needs Linux"
    if os.geteuid() != 0:
        return "the GlusterFS bed needs root (glusterd, FUSE mounts, a mount namespace)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    tools = ("glusterd", "glusterfs", "gluster", "umount", "nsenter")
    missing = [t for t in tools if shutil.which(t, path=_SBIN) is None]
    if missing:
        return f"GlusterFS not installed (no {', '.join(missing)}): run tests/distfs/install.sh"
    if brick_host() is None:
        return "no host name resolves to 127.0.0.1 (gluster refuses localhost): add one to /etc/hosts"
    if _port_in_use(GLUSTERD_PORT) and not _stale_runs():
        return f"127.0.0.1:{GLUSTERD_PORT} is taken (another glusterd or a live bed is running)"
    return None


# --- processes: ours are recognised by their command line naming the run directory ---------------------


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, after the command name (which may hold spaces)


def _names_run(pid: int, run: Path) -> bool:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(arg == str(run) or f"{run}/" in arg for arg in args)


def processes_of(run: Path) -> list[int]:
    pids = (int(p) for p in os.listdir("/proc") if p.isdigit())
    return [pid for pid in pids if pid != os.getpid() and _names_run(pid, run)]


def _kill_all(run: Path) -> None:
    """SIGKILL every process of this run still there (SIGKILL works on stopped processes too)."""
    for _ in range(50):
        for pid in processes_of(run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not processes_of(run):
            return
        time.sleep(0.1)


def mounts_under(run: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    points = (line.split()[4].encode().decode("unicode_escape") for line in lines)  # unescapes \040 and such
    return [point for point in points if point.startswith(f"{run}/")]


def _lazy_umount(point: str) -> None:
    # -l detaches at once without talking to the FUSE client, so it cannot hang on a stopped or dead one.
    subprocess.run([_tool("umount"), "-l", point], capture_output=True, timeout=CMD_TIMEOUT, check=False)


def _discard(run: Path) -> None:
    _kill_all(run)
    for point in mounts_under(run):
        _lazy_umount(point)
    if mounts_under(run):
        print(f"distfs: mounts remain under {run}; not removing it", file=sys.stderr)
        return
    shutil.rmtree(run, ignore_errors=True)


def _owner_alive(run: Path) -> bool:
    try:
        pid, started = (run / "owner").read_text().split()
    except (OSError, ValueError):
        return False
    return _start_time(int(pid)) == started


def _stale_runs() -> list[Path]:
    return [run for run in BASE.glob("run-*") if run.is_dir() and not _owner_alive(run)]


def reap_stale() -> None:
    """Clean up after earlier runs whose owning process died without cleaning up (crash, SIGKILL)."""
    for run in _stale_runs():
        _discard(run)


def _die_with_parent() -> None:
    # Runs in the child before exec: if the test process dies, its FUSE clients get SIGTERM and unmount.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


class Mount:
    """One FUSE client of the volume: one "host". pid is the glusterfs client process itself (run with -N)."""

    def __init__(self, bed: GlusterBed, name: str, options: tuple[str, ...], volume: str = VOLUME) -> None:
        self.bed, self.name, self.options, self.volume = bed, name, options, volume
        self.path = bed.run / "mnt" / name
        self.log = bed.run / "log" / f"mount-{name}.log"
        self.stopped = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._start()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _start(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        cmd = [_tool("glusterfs"), "-N", f"--volfile-server={self.bed.host}", f"--volfile-id={self.volume}",
               f"--log-file={self.log}", *self.options, str(self.path)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True,
                                      preexec_fn=_die_with_parent)
        self.stopped = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"glusterfs client for {self.path} exited:\n{_tail(self.log)}")
            # Ready once the kernel has the mount and a stat through it returns (the client reached the brick).
            if str(self.path) in mounts_under(self.bed.run) and self._answers(5.0):
                return
            time.sleep(0.05)
        raise RuntimeError(f"mount {self.path} not ready after 30 s:\n{_tail(self.log)}")

    def _answers(self, timeout: float) -> bool:
        try:  # in a child: a stat through a hung client would block this process for good
            subprocess.run(["stat", str(self.path)], capture_output=True, timeout=timeout, check=True)
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
            return False
        return True

    # pid is our own unreaped child's, so it cannot have been reused by another process: signalling it is safe.
    def stop(self) -> None:
        """SIGSTOP the client: every operation through this mount hangs, as on a frozen host.

        Returns once every thread of the client is stopped: kill() returns before they are, and
        a thread still running on a busy machine answered a lookup after it (a CI run, 2026-11-27)."""
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True
        deadline = time.monotonic() + CMD_TIMEOUT
        while not _all_threads_stopped(self.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the client {self.pid} did not stop within {CMD_TIMEOUT} s of SIGSTOP")
            time.sleep(0.01)

    def cont(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.stopped = False

    def kill(self) -> None:
        """SIGKILL the client, as on a host that died: the mount then answers ENOTCONN until remount()."""
        os.kill(self.pid, signal.SIGKILL)
        assert self._proc is not None
        self._proc.wait(timeout=CMD_TIMEOUT)
        self.stopped = False

    def remount(self) -> None:
        self.unmount()
        self._start()

    def unmount(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            if self.stopped:
                self.cont()
            # A plain umount lets the client exit by itself; it fails if files are still open (EBUSY).
            try:
                plain = subprocess.run([_tool("umount"), str(self.path)], capture_output=True, timeout=10).returncode
            except subprocess.TimeoutExpired:
                plain = -1
            if plain != 0:
                _lazy_umount(str(self.path))
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=CMD_TIMEOUT)
        if str(self.path) in mounts_under(self.bed.run):
            _lazy_umount(str(self.path))  # a killed client leaves its mount behind (ENOTCONN)
        self.stopped = False


@dataclass
class SharedDir:
    """One directory of the volume seen through two mounts: `a` through mount A, `b` through mount B."""

    a: Path
    b: Path
    mount_a: Mount
    mount_b: Mount


class GlusterBed:
    """glusterd + one single-brick volume in a fresh directory under BASE; a context manager."""

    def __init__(self, volume_options: dict[str, str] | None = None) -> None:
        """volume_options: `gluster volume set` before the volume starts, e.g. STRICT_VOLUME."""
        self.volume_options = dict(volume_options or {})
        self.mounts: dict[str, Mount] = {}
        self.cold_start_s = 0.0
        self._reaper: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GlusterBed:
        reason = available()
        if reason is not None:
            raise RuntimeError(reason)
        reap_stale()
        t0 = time.monotonic()
        self.host = brick_host() or ""
        BASE.mkdir(parents=True, exist_ok=True)
        self.run = Path(tempfile.mkdtemp(prefix="run-", dir=BASE))
        (self.run / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        try:
            self._start_glusterd()
            self.gluster("volume", "create", VOLUME, f"{self.host}:{self.run / 'brick'}", "force")
            for key, value in self.volume_options.items():
                self.gluster("volume", "set", VOLUME, key, value)
            self.gluster("volume", "start", VOLUME)
        except BaseException:
            self.close()
            raise
        self.cold_start_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _start_glusterd(self) -> None:
        for sub in ("work", "rundir", "log", "brick", "mnt", "ns"):
            (self.run / sub).mkdir()
        (self.run / "glusterd.vol").write_text(
            "volume management\n    type mgmt/glusterd\n"
            f"    option working-directory {self.run / 'work'}\n"
            f"    option run-directory {self.run / 'rundir'}\n"
            f"    option logging-directory {self.run / 'log'}\n"
            f"    option glusterd-sockfile {self.run / 'rundir' / 'glusterd.socket'}\n"
            "    option transport-type socket\n"
            "    option transport.socket.bind-address 127.0.0.1\n"  # also passed on to the brick
            f"    option transport.socket.listen-port {GLUSTERD_PORT}\n"
            "    option ping-timeout 0\n    option event-threads 1\nend-volume\n")
        with open(self.run / "log" / "reaper.log", "wb") as log:
            self._reaper = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("nsreaper.py")), str(self.run), str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + CMD_TIMEOUT
        while True:  # glusterd answers the CLI a few seconds after it starts
            if self._reaper.poll() is not None:
                logs = self.run / "log"
                raise RuntimeError(f"glusterd exited:\n{_tail(logs / 'reaper.log')}\n{_tail(logs / 'glusterd.log')}")
            sock = self.run / "rundir" / "glusterd.socket"  # made by glusterd, so the namespace is in place
            if sock.exists() and self.gluster("volume", "list", check=False, timeout=10).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"glusterd not answering:\n{_tail(self.run / 'log' / 'glusterd.log')}")
            time.sleep(0.1)

    def gluster(self, *args: str, check: bool = True, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Run the gluster CLI against this bed's glusterd (its own socket, never the system one).

        The CLI runs inside the reaper's mount namespace: on its own it creates /var/lib/glusterd/geo-replication.
        """
        done = self.in_namespace(_tool("gluster"), "--mode=script", f"--glusterd-sock={self.sock}",
                                 f"--log-file={self.run / 'log' / 'cli.log'}", f"--timeout={int(timeout)}", *args,
                                 timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"gluster {' '.join(args)}: {done.stdout.strip()} {done.stderr.strip()}")
        return done

    @property
    def sock(self) -> Path:
        """glusterd's CLI socket (never the system's /var/run/glusterd.socket)."""
        return self.run / "rundir" / "glusterd.socket"

    def in_namespace(self, *cmd: str, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Run a command inside the reaper's mount namespace, where glusterd's fixed paths are the run's."""
        assert self._reaper is not None
        cmd = (_tool("nsenter"), f"--target={self._reaper.pid}", "--mount", "--", *cmd)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 5)
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess(cmd, -1, "", f"timed out after {timeout} s")
        return done

    @property
    def brick_pid(self) -> int | None:
        for pidfile in (self.run / "rundir" / "vols" / VOLUME).glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text())
                return pid if _names_run(pid, self.run) else None
        return None

    def mount(self, name: str, options: tuple[str, ...] = DEFAULT, volume: str = VOLUME) -> Mount:
        """A FUSE client of ``volume`` (the bed's single-brick volume, or one made by replica.py)."""
        if name in self.mounts:
            raise ValueError(f"mount {name!r} exists")
        mount = self.mounts[name] = Mount(self, name, options, volume)
        return mount

    def drop_mount(self, name: str) -> None:
        """Unmount ``name`` and forget it."""
        self.mounts.pop(name).unmount()

    def heal(self) -> None:
        """Bring every mount back to working order after a test stopped or killed its client."""
        for mount in self.mounts.values():
            if mount.stopped:
                mount.cont()
            if not mount.alive:
                mount.remount()

    def close(self) -> None:
        """Unmount, stop the volume, end exactly this run's processes, remove its directory. Never raises."""
        if not hasattr(self, "run"):
            return
        steps = [mount.unmount for mount in self.mounts.values()] + [self._stop_server, lambda: _discard(self.run)]
        for step in steps:  # each step runs even if an earlier one failed; the last sweep ends whatever is left
            try:
                step()
            except Exception as exc:
                print(f"distfs: cleanup of {self.run}: {exc!r}", file=sys.stderr)
        self.mounts.clear()

    def _stop_server(self) -> None:
        if self._reaper is not None and self._reaper.poll() is None:
            self.gluster("volume", "stop", VOLUME, "force", check=False, timeout=20)
            self._reaper.terminate()  # the reaper stops glusterd and the brick (its children), then exits
            try:
                self._reaper.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait(timeout=CMD_TIMEOUT)


def main(argv: list[str]) -> int:
    sys.modules.setdefault("gluster", sys.modules[__name__])  # cli imports this module by name
    import cli  # run as a script, this file's directory is on sys.path

    commands = {"up": cli.up, "selftest": cli.selftest}
    if len(argv) != 1 or argv[0] not in commands:
        print("usage: gluster.py up | selftest", file=sys.stderr)
        return 2
    return commands[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is in state T (stopped), read from /proc."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as fh:
                state = fh.read().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        if state not in ("T", "t"):
            return False
    return True
