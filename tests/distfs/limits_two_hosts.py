"""Keyed jobs worked from both mounts of the GlusterFS bed: does any job end up claimed by nobody?

    python tests/distfs/limits_two_hosts.py [--rounds 12] [--jobs 30] [--processes 6]

Each round makes a fresh store, a key limited to 2 and ``--jobs`` jobs with that key, then runs
``--processes`` workers, alternately on mount A and mount B, until nothing is left for 8 s. It
prints, per round, how many jobs ran and what is left in ``jobs/active/`` and ``jobs/waiting/`` as the
brick itself holds them (the truth, whatever either client caches). Used for FORMAT.md, "Limits":
before parked names carried the claim's token, some rounds left one job in ``active/``.
Exit status 1 if any round left a job unrun.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from distfs import gluster
from fsjobstore import JobStore

WORKER = textwrap.dedent("""
    import json, sys, time
    from fsjobstore import JobStore
    ran = []
    with JobStore(sys.argv[1], lease_duration=5) as store:
        while (lease := store.pull_work(timeout=8)) is not None:
            time.sleep(0.05)
            ran.append(lease.id)
            lease.fulfill(None)
    with open(sys.argv[2], "w") as fh:
        json.dump(ran, fh)
""")


def names(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.is_dir() else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--processes", type=int, default=6)
    args = parser.parse_args()
    reason = gluster.available()
    if reason is not None:
        print(f"the GlusterFS bed is unavailable: {reason}", file=sys.stderr)
        return 2
    bad = 0
    with gluster.GlusterBed() as bed, tempfile.TemporaryDirectory() as work:
        mount_a, mount_b = bed.mount("a"), bed.mount("b")
        for r in range(args.rounds):
            (mount_a.path / f"r{r}").mkdir()
            roots = [str(mount_a.path / f"r{r}" / "store"), str(mount_b.path / f"r{r}" / "store")]
            brick = bed.run / "brick" / f"r{r}" / "store" / "jobs"
            with JobStore(roots[0]) as store:
                store.set_limit(key="k", concurrency=2)
                ids = {store.create(i, concurrency_key="k").id for i in range(args.jobs)}
            outs = [f"{work}/{r}-{i}.json" for i in range(args.processes)]
            procs = [subprocess.Popen([sys.executable, "-c", WORKER, roots[i % 2], out]) for i, out in enumerate(outs)]
            codes = [p.wait(300) for p in procs]
            ran = [job for out in outs for job in json.loads(Path(out).read_text())]
            left = ids - set(ran)
            bad += bool(left)
            print(f"round {r}: exit codes {codes}, {len(ran)} of {len(ids)} ran ({len(ran) - len(set(ran))} twice); "
                  f"on the brick, active/ {names(brick / 'active')}, waiting/ {names(brick / 'waiting')}", flush=True)
    print(f"{bad} of {args.rounds} rounds left a job unrun")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
