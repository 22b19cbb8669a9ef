"""The bed's server-side supervisor: `python nsreaper.py RUN_DIR OWNER_PID`, started by GlusterBed.

It enters a private mount namespace with RUN_DIR/ns/* bound over the paths glusterd writes to whatever its
options say, starts `glusterd -N` as its child, and as a child subreaper also becomes the parent of the brick
(glusterfsd daemonizes). On SIGTERM, or when its owner dies (PR_SET_PDEATHSIG), it stops glusterd, then ends
the brick, reaps everything and exits. If it is SIGKILLed itself, glusterd still gets SIGTERM (PDEATHSIG) and
the brick is left to the next run's sweep of stale runs (gluster.reap_stale).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# glusterd writes here whatever its options say: the geo-replication template and ss_brick under
# /var/lib/glusterd, brick sockets and snaps/ under /var/run/gluster. Bound over, they land in the run dir.
HARDCODED_DIRS = ("/var/lib/glusterd", "/var/log/glusterfs", "/var/run/gluster")
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x20000, 4096, 16384, 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)


def _ccall(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _isolate(run: Path) -> None:
    _ccall(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _ccall(_libc.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "make / private")
    for fixed in HARDCODED_DIRS:
        target = os.path.realpath(fixed)
        os.makedirs(target, exist_ok=True)  # the packages ship these (empty); only a missing /run/gluster is made
        source = run / "ns" / fixed.strip("/").replace("/", "_")
        source.mkdir(exist_ok=True)
        _ccall(_libc.mount(str(source).encode(), target.encode(), None, ctypes.c_ulong(MS_BIND), None), target)


def _die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # if this reaper is SIGKILLed, glusterd stops too


def _children() -> list[int]:
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            parent = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]
            if int(parent) == os.getpid():
                kids.append(int(entry))
    return kids


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def main(run: Path, owner: int) -> int:
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # owner died: shut down rather than linger
    if os.getppid() != owner:
        return 1
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # the brick daemonizes: make it our child, not init's
    _isolate(run)
    glusterd_bin = shutil.which("glusterd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") or "glusterd"
    cmd = [glusterd_bin, "-N", "-f", str(run / "glusterd.vol"), "-p", str(run / "rundir" / "glusterd.pid"),
           "-l", str(run / "log" / "glusterd.log")]
    glusterd = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    while not stop and glusterd.poll() is None:
        time.sleep(0.2)
        _reap()
    glusterd.terminate()  # glusterd leaves bricks running when it stops, so end them too
    with contextlib.suppress(subprocess.TimeoutExpired):
        glusterd.wait(timeout=10)
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + grace
        while _children() and time.monotonic() < deadline:
            for pid in _children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, sig)
            time.sleep(0.1)
            _reap()
    _reap()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
