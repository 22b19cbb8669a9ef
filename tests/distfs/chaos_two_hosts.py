"""Chaos with workers on two "hosts" (the GlusterFS bed's two mounts) while host B's mount hangs
and once dies: tests/torture/chaos.py's run, with the store reached through both mounts.

    bash tests/distfs/install.sh
    python tests/distfs/chaos_two_hosts.py --jobs 2000 --kills 300 --workers 4 --seed 5 [--runtime asyncio]

Prints the checker's report (lost, unexpected and duplicate commits must all be 0) and what host
B went through; exits 1 if anything was lost or committed twice. tests/distfs/test_multihost.py
runs a short one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "torture")]

import chaos  # noqa: E402

from distfs import gluster  # noqa: E402


class HangOrKill:
    """chaos.run's ``extra``: host B's mount hangs now and then (SIGSTOP of its FUSE client, its
    workers with it) for 2-4 s, and dies outright (SIGKILL of the client: ENOTCONN for everything
    on B) every ``kill_every`` steps, until remounted 2-4 s later."""

    def __init__(self, mount: gluster.Mount, kill_every: int = 15) -> None:
        self.mount, self.kill_every = mount, kill_every
        self.back_at = 0.0
        self.steps = self.hangs = self.outages = 0

    def __call__(self, rng: random.Random | None) -> None:
        now = time.monotonic()
        if rng is None or now > self.back_at:
            if self.mount.stopped:
                self.mount.cont()
            elif not self.mount.alive:
                self.mount.remount()
        if rng is None or self.mount.stopped or not self.mount.alive:
            return
        self.steps += 1
        if self.steps % self.kill_every == 0:
            self.mount.kill()
            self.outages += 1
            self.back_at = now + rng.uniform(2.0, 4.0)
        elif rng.random() < 0.05:
            self.mount.stop()
            self.hangs += 1
            self.back_at = now + rng.uniform(2.0, 4.0)

    def summary(self) -> dict[str, int]:
        return {"host_b_hangs": self.hangs, "host_b_outages": self.outages}


def run_on(a: str, b: str, mount_b: gluster.Mount, *, kill_every: int, workdir: str,
           **kwargs: Any) -> dict[str, Any]:
    """One chaos run with the store at ``a`` (host A's view) and ``b`` (host B's)."""
    extra = HangOrKill(mount_b, kill_every)
    report = chaos.run(workdir=workdir, roots=[a, b], extra=extra, **kwargs)
    report.update(extra.summary())
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=300)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--kill-mount-every", type=int, default=60,
                        help="steps between SIGKILLs of host B's FUSE client (default 60)")
    parser.add_argument("--runtime", choices=["processes", "threads", "asyncio"], default=None,
                        help="workers are fsjobstore.Worker in this mode (default: plain pull/fulfil loops)")
    parser.add_argument("--retention", action="store_true",
                        help="odd-numbered jobs are made with retain=0: removed while the chaos runs")
    parser.add_argument("--relations", action="store_true",
                        help="dependencies and unique keys (tests/torture/chaos.py --relations)")
    parser.add_argument("--limits", action="store_true",
                        help="concurrency keys, checked for runs past a limit (tests/torture/chaos.py --limits)")
    args = parser.parse_args()
    reason = gluster.available()
    if reason is not None:
        print(f"the GlusterFS bed is unavailable: {reason}", file=sys.stderr)
        return 2
    with gluster.GlusterBed() as bed, tempfile.TemporaryDirectory(prefix="fsjs-chaos2-") as work:
        a, b = bed.mount("a"), bed.mount("b")
        (a.path / "chaos").mkdir()
        time.sleep(1.5)
        report = run_on(str(a.path / "chaos" / "store"), str(b.path / "chaos" / "store"), b,
                        kill_every=args.kill_mount_every, workdir=work, jobs=args.jobs, workers=args.workers,
                        kills=args.kills, lease=args.lease, seed=args.seed, retention=args.retention,
                        runtime=args.runtime, relations=args.relations, limits=args.limits)
    print(json.dumps(report, indent=1))
    bad = (report["lost"] or report["unexpected"] or report["duplicate_commits"] or report["created_ok"] != args.jobs
           or report["removal_leftovers"] or report.get("over_limit") or report.get("early_children"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
