"""A replicated volume on the bed: three bricks (three storage servers) on loopback, one glusterd.

    with gluster.GlusterBed() as bed:
        vol = replica.Replicated(bed)                  # replica 3, QUORUM options
        a, b, c = (bed.mount(n, volume=vol.name) for n in "abc")
        vol.kill_brick(1)                              # SIGKILL of that brick's glusterfsd: a server lost
        vol.start_bricks()                             # the dead brick comes back, as its server restarts it
        vol.wait_healed(120)                           # no entries left to heal, none in split-brain

One glusterd serves every volume of the bed (bricks fetch their volfile from port 24007), so a
replicated volume is a second volume beside the bed's single-brick one, and the session's fixture
and a test's replicated volume live side by side.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from distfs import gluster

REPLICA_VOLUME = "fsjs3"
GLFSHEAL = "/usr/lib/x86_64-linux-gnu/glusterfs/glfsheal"  # Debian's path; the CLI's heal info runs it
# What a user should run a job store's replicated volume with (MULTIHOST.md, "A replicated volume"):
# client quorum "auto" refuses writes on a side holding fewer than half the bricks (2 of 3 here), so
# two sides of a partition never both write one file (split-brain); "fixed" at 2 says the same with
# no exception for the first brick. Server quorum needs several glusterd peers, so one machine cannot
# show it; on real servers set cluster.server-quorum-type server as well.
QUORUM = {
    "cluster.quorum-type": "auto",
    "cluster.self-heal-daemon": "on",
    "cluster.heal-timeout": "5",  # seconds between the heal daemon's index crawls (default 600)
}


@dataclass(frozen=True)
class HealState:
    pending: tuple[int, ...]  # entries each brick holds to heal (-1: brick not answering)
    split_brain: int

    @property
    def healed(self) -> bool:
        return not any(self.pending) and self.split_brain == 0


class Replicated:
    """A replica-N volume of the bed, created and started; its bricks are run/<name>-brick<i>."""

    def __init__(self, bed: gluster.GlusterBed, name: str = REPLICA_VOLUME, bricks: int = 3,
                 options: dict[str, str] | None = None) -> None:
        self.bed, self.name = bed, name
        self.paths = [bed.run / f"{name}-brick{i}" for i in range(bricks)]
        bed.gluster("volume", "create", name, "replica", str(bricks),
                    *(f"{bed.host}:{path}" for path in self.paths), "force")  # force: bricks on one server, on /
        for key, value in (QUORUM if options is None else options).items():
            bed.gluster("volume", "set", name, key, value)
        bed.gluster("volume", "start", name)
        self._commands: dict[int, list[str]] = {}  # brick -> its command line, while it is down

    def brick_pid(self, i: int) -> int | None:
        """The glusterfsd serving brick ``i``, found by the brick path its command line names."""
        for pid in gluster.processes_of(self.bed.run):
            with contextlib.suppress(OSError):
                args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                if "--brick-name" in args and args[args.index("--brick-name") + 1] == str(self.paths[i]):
                    return pid
        return None

    def kill_brick(self, i: int) -> None:
        """SIGKILL brick ``i``'s server process, as a storage server that died."""
        pid = self.brick_pid(i)
        if pid is None:
            raise RuntimeError(f"brick {i} of {self.name} is not running")
        self._commands[i] = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + gluster.CMD_TIMEOUT
        while self.brick_pid(i) == pid and time.monotonic() < deadline:
            time.sleep(0.05)

    def start_bricks(self) -> None:
        """Start again every brick killed here, with the command line glusterd gave it, as a
        server's service manager would. Not `volume start force`: on this bed the brick that
        started for it died within seconds of starting in 3 tries of 8 (the brick's log ends with
        clients accepted, glusterd's says it disconnected), while the brick's own command line
        started it every time (6 of 6, each healed within 10 s)."""
        for i, cmd in sorted(self._commands.items()):
            if self.brick_pid(i) is None:
                done = self.bed.in_namespace(*cmd)  # glusterfsd daemonizes: this returns once it serves
                if done.returncode != 0:
                    raise RuntimeError(f"brick {i} of {self.name} did not start: {done.stderr.strip()}")
            del self._commands[i]

    def heal_state(self) -> HealState:
        # `gluster volume heal VOL info` runs glfsheal without the CLI's --glusterd-sock, so it looks for
        # the system's glusterd and fails: run it here with the bed's socket.
        out = self.bed.in_namespace(GLFSHEAL, self.name, "info-summary", "glusterd-sock", str(self.bed.sock),
                                    timeout=30).stdout
        pending: list[int] = []
        for block in out.split("Brick ")[1:]:
            found = re.search(r"Total Number of entries: (\d+)", block)
            pending.append(int(found.group(1)) if found else -1)
        split = sum(int(n) for n in re.findall(r"Number of entries in split-brain: (\d+)", out))
        return HealState(tuple(pending) or (-1,), split)

    def wait_healed(self, timeout: float) -> HealState:
        """Ask the heal daemon to heal now, then wait until nothing is left to heal (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        state = self.heal_state()
        while not state.healed and time.monotonic() < deadline:
            # Refused while the heal daemon reconnects to a brick just started: the daemon heals anyway,
            # every cluster.heal-timeout seconds.
            self.bed.gluster("volume", "heal", self.name, check=False, timeout=30)
            time.sleep(1.0)
            state = self.heal_state()
        return state

    def remove(self) -> None:
        """Stop and delete the volume (its mounts first: :meth:`GlusterBed.drop_mount`)."""
        self.start_bricks()
        self.bed.gluster("volume", "stop", self.name, "force", check=False)
        self.bed.gluster("volume", "delete", self.name, check=False)
