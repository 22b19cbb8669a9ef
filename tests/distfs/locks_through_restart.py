"""Does a file held locked through a brick's restart hang its mount? The owner file, without the store.

    python tests/distfs/locks_through_restart.py            # one process holds an flock, as a store's owner file
    python tests/distfs/locks_through_restart.py --no-lock  # the same file held open and beaten, never locked

Two mounts of a replica-3 volume. On each, one process opens ``leases/<host>.owner``, takes an
exclusive ``flock`` on it (unless ``--no-lock``) and rewrites its first bytes every 0.5 s, as a
store's owner file is held and beaten for the store's whole life; another makes, renames and
unlinks files and fsyncs their directory in a loop, as claims and commits do, writing when each
call returned. Then brick 2 is killed, left down ``--down`` seconds, started again and healed, and
the run waits ``--after`` seconds more. A mount whose looping process made no call for 15 s by
then is reported hung, with how many times its client logged ``Failed getlk`` (AFR refusing to
reopen a file with locks on the brick that came back). Exits 1 if a mount hung.
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing
import os
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]

from distfs import gluster, replica  # noqa: E402


def hold(path: str, lock: bool) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    if lock:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    while True:
        os.pwrite(fd, f"{time.time():.6f}\n".encode(), 0)
        time.sleep(0.5)


def loop(root: str, host: str, log: str) -> None:
    n = 0
    while True:
        n += 1
        a, b = f"{root}/work/{host}-{n}.a", f"{root}/work/{host}-{n}.b"
        with open(a, "w") as fh:
            fh.write("x")
        os.rename(a, b)
        os.unlink(b)
        dfd = os.open(f"{root}/work", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        Path(log).write_text(f"{time.time():.3f}\n")
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-lock", action="store_true", help="hold the owner files open and beaten, never locked")
    parser.add_argument("--down", type=float, default=15.0, help="seconds brick 2 stays down (default 15)")
    parser.add_argument("--after", type=float, default=30.0, help="seconds to watch after the heal (default 30)")
    args = parser.parse_args()
    with gluster.GlusterBed() as bed:
        volume = replica.Replicated(bed)
        mounts = [bed.mount(f"host-{n}", volume=volume.name) for n in "ab"]
        procs: list[multiprocessing.Process] = []
        try:
            root = mounts[0].path
            for d in ("leases", "work"):
                (root / d).mkdir()
            time.sleep(1.5)
            logs = []
            for m in mounts:
                procs.append(multiprocessing.Process(target=hold, args=(f"{m.path}/leases/{m.name}.owner",
                                                                        not args.no_lock), daemon=True))
                log = f"{bed.run}/loop-{m.name}.log"
                logs.append(log)
                procs.append(multiprocessing.Process(target=loop, args=(str(m.path), m.name, log), daemon=True))
            for p in procs:
                p.start()
            time.sleep(5)
            volume.kill_brick(2)
            time.sleep(args.down)
            volume.start_bricks()
            state = volume.wait_healed(180)
            time.sleep(args.after)
            now = time.time()
            hung = 0
            for m, log in zip(mounts, logs, strict=True):
                last = float(Path(log).read_text() or 0)
                getlk = m.log.read_text(errors="replace").count("Failed getlk") if m.log.exists() else -1
                quiet = now - last
                hung += quiet > 15
                print(f"{m.name}: last call {quiet:.1f} s ago ({'HUNG' if quiet > 15 else 'ok'}); "
                      f"'Failed getlk' logged {getlk} times")
            print(f"lock held: {not args.no_lock}; heal: {state}")
            return 1 if hung else 0
        finally:
            for p in procs:
                p.kill()
            for m in mounts:
                bed.drop_mount(m.name)  # a hung call fails once its client is gone
            volume.remove()


if __name__ == "__main__":
    sys.exit(main())
