"""Chaos on three "hosts" sharing a replicated volume while its storage servers fail: a brick
killed mid-run, left down, started again and healed, twice, a different brick each time; host
C's mount hangs now and then and its client is killed and remounted; workers are SIGKILLed and
SIGSTOPped throughout (tests/torture/chaos.py's run, through three mounts).

    bash tests/distfs/install.sh
    python tests/distfs/chaos_three_hosts.py --jobs 2000 --kills 200 --seed 1

Three producers, one per host, give every seventh job an id of their own (retried until it
stands); relations, limits and retention are on unless turned off. Prints the checker's report
and the bricks' story; exits 1 if anything was lost, committed twice, run early or past a limit,
left behind, or if a brick is not healed at the end (entries left to heal, any in split-brain,
or the bricks' copies of the store differing). tests/distfs/test_replicated.py runs a short one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "torture")]

import chaos  # noqa: E402

from distfs import gluster, replica  # noqa: E402
from distfs.chaos_two_hosts import HangOrKill  # noqa: E402


class BrickOutages:
    """chaos.run's ``extra``: at each of ``at`` (seconds into the run) one brick is SIGKILLed, a
    different one each time; it stays down ``down`` seconds, is started again, and the heal is
    timed (from the start until no entry is left to heal)."""

    def __init__(self, volume: replica.Replicated, at: list[float], down: float) -> None:
        self.volume, self.at, self.down = volume, sorted(at), down
        self.started = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.brick: int | None = None  # the brick down now, or being healed
        self.back_at = self.healing_since = self.last_look = 0.0

    def __call__(self, rng: random.Random | None) -> None:
        now = time.monotonic()
        if self.brick is not None and self.healing_since == 0.0 and (rng is None or now >= self.back_at):
            self.volume.start_bricks()
            self.healing_since = now
        elif self.brick is not None and self.healing_since and now - self.last_look > 2.0:
            self.last_look = now
            state = self.volume.heal_state()
            if state.healed:
                self.events[-1].update(healed_after_s=round(now - self.healing_since, 1))
                self.brick = None
        elif rng is not None and self.brick is None and self.at and now - self.started >= self.at[0]:
            self.at.pop(0)
            used = {e["brick"] for e in self.events}
            self.brick = rng.choice([i for i in range(len(self.volume.paths)) if i not in used] or [0])
            self.volume.kill_brick(self.brick)
            self.events.append({"brick": self.brick, "killed_at_s": round(now - self.started, 1),
                                "down_s": self.down})
            self.back_at, self.healing_since, self.last_look = now + self.down, 0.0, now

    def finish(self, timeout: float) -> dict[str, Any]:
        """Every brick up, then wait for the heal; the bricks' story and the heal's state at the end."""
        if self.brick is not None and not self.healing_since:
            self.healing_since = time.monotonic()  # still down: started again just below
        self.volume.start_bricks()
        state = self.volume.wait_healed(timeout)
        if self.brick is not None and state.healed:  # (a heal seen by __call__ set brick to None)
            self.events[-1].update(healed_after_s=round(time.monotonic() - self.healing_since, 1))
        return {"brick_kills": self.events, "heal_pending_at_end": list(state.pending),
                "split_brain_at_end": state.split_brain}


def differing_copies(volume: replica.Replicated, under: str) -> list[str]:
    """Names under ``under`` (a directory of the volume) that not every brick holds alike: a file
    on some bricks only, or of different sizes. GlusterFS's own metadata (.glusterfs) is skipped."""
    seen: list[dict[str, int]] = []
    for brick in volume.paths:
        files: dict[str, int] = {}
        top = brick / under
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d != ".glusterfs"]
            for name in filenames + dirnames:
                path = Path(dirpath) / name
                rel = str(path.relative_to(top))
                files[rel] = -1 if name in dirnames else path.lstat().st_size
        seen.append(files)
    names = set().union(*seen)
    return sorted(n for n in names if len({copy.get(n) for copy in seen}) > 1)


def quarantined_copies(volume: replica.Replicated, store: str) -> dict[str, list[str]]:
    """What each brick holds of every job file the store quarantined: a file's lines, cut short,
    so a stale read on a host (every brick's copy whole) can be told from a lost write."""
    copies: dict[str, list[str]] = {}
    for brick in volume.paths:
        quarantine = brick / store / "quarantine"
        for name in sorted(os.listdir(quarantine)) if quarantine.is_dir() else []:
            if name.endswith(".json"):
                lines = (quarantine / name).read_text(errors="replace").splitlines()
                copies.setdefault(name, []).append(f"{brick.name}: {len(lines)} line(s), "
                                                   f"last {lines[-1][:120] if lines else ''!r}")
    return copies


def run(bed: gluster.GlusterBed, *, jobs: int, kills: int, seed: int, brick_kills: int, down: float,
        workdir: str, mount_options: tuple[str, ...] = gluster.DEFAULT,
        volume_options: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
    volume = replica.Replicated(bed, options={**replica.QUORUM, **(volume_options or {})})
    mounts = [bed.mount(f"host-{n}", mount_options, volume=volume.name) for n in "abc"]
    (mounts[0].path / "chaos").mkdir()
    time.sleep(1.5)
    expected = max(1.0, kills * 0.275)  # chaos.run's own estimate of its length
    bricks = BrickOutages(volume, [expected * (i + 1) / (brick_kills + 1) for i in range(brick_kills)], down)
    host_c = HangOrKill(mounts[2], kill_every=40)

    def extra(rng: random.Random | None) -> None:
        bricks(rng)
        host_c(rng)

    try:
        try:
            report = chaos.run(workdir=workdir, roots=[str(m.path / "chaos" / "store") for m in mounts],
                               extra=extra, jobs=jobs, kills=kills, seed=seed, producers=3, chosen=True, **kwargs)
        except OSError as exc:  # the checker's own calls failed: what the bricks hold, before they go
            print(f"chaos: {exc}\n{bricks_story(volume, exc.filename, [m.path for m in mounts])}", file=sys.stderr)
            raise
        report.update({"host_c_" + k.split("_", 2)[2]: v for k, v in host_c.summary().items()})
        report.update(bricks.finish(timeout=300))
        for leftover in report["examples"]["removal_leftovers"]:  # "ids/<id> names no job", say
            name = str(mounts[0].path / "chaos" / "store" / leftover.split(" ", 1)[0])
            print(f"chaos: removal leftover {leftover}\n{bricks_story(volume, name, [m.path for m in mounts])}\n"
                  f"{bricks_story(volume, os.path.dirname(name), [m.path for m in mounts])}", file=sys.stderr)
        report["bricks_differ"] = differing_copies(volume, "chaos/store")[:10]
        report["quarantined"] = quarantined_copies(volume, "chaos/store")
        return report
    finally:
        for mount in mounts:
            bed.drop_mount(mount.name)
        volume.remove()


def bricks_story(volume: replica.Replicated, path: object, mounts: list[Path]) -> str:
    """For a name the volume failed on: the heal's state, and each brick's copy of that name
    (its GlusterFS attributes: a gfid or pending marker that differs shows a split-brain)."""
    lines = [f"heal state: {volume.heal_state()}"]
    rel = next((os.path.relpath(str(path), m) for m in mounts if isinstance(path, str)
                and str(path).startswith(f"{m}/")), None)
    for brick in volume.paths if rel is not None else []:
        try:
            done = subprocess.run(["getfattr", "-h", "-d", "-m", ".", "-e", "hex", str(brick / rel)],
                                  capture_output=True, text=True, check=False, timeout=30)
            lines.append(f"{brick.name}/{rel}: {(done.stdout or done.stderr).strip()}")
        except (OSError, subprocess.SubprocessError) as exc:  # getfattr missing (Debian's attr package)
            lines.append(f"{brick.name}/{rel}: getfattr failed: {exc}")
    return "\n".join(lines)


def failed(report: dict[str, Any], jobs: int, brick_kills: int) -> bool:
    return bool(report["lost"] or report["unexpected"] or report["duplicate_commits"] or report["created_ok"] < jobs
                or report["producer_exit"]
                or report["removal_leftovers"] or report["over_limit"] or report["early_children"]
                or report["left_pending_or_active"] or any(report["heal_pending_at_end"])
                or report["split_brain_at_end"] or report["bricks_differ"]
                or len(report["brick_kills"]) != brick_kills)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--brick-kills", type=int, default=2, help="bricks killed in turn during the run (default 2)")
    parser.add_argument("--down", type=float, default=15.0, help="seconds each killed brick stays down (default 15)")
    parser.add_argument("--workdir", help="keep the histories here (default: a temporary directory, removed)")
    parser.add_argument("--mount", choices=["default", "strict"], default="default",
                        help="the hosts' mount options: default, or strict (no entry or attribute caching)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a volume option besides the quorum settings (repeatable)")
    parser.add_argument("--no-relations", action="store_true")
    parser.add_argument("--no-limits", action="store_true")
    parser.add_argument("--no-retention", action="store_true")
    args = parser.parse_args()
    reason = gluster.available()
    if reason is not None:
        print(f"the GlusterFS bed is unavailable: {reason}", file=sys.stderr)
        return 2
    with gluster.GlusterBed() as bed, tempfile.TemporaryDirectory(prefix="fsjs-chaos3-") as temp:
        work = args.workdir or temp
        os.makedirs(work, exist_ok=True)
        report = run(bed, jobs=args.jobs, kills=args.kills, seed=args.seed, brick_kills=args.brick_kills,
                     down=args.down, workdir=work,
                     mount_options=gluster.STRICT if args.mount == "strict" else gluster.DEFAULT,
                     volume_options=dict(kv.split("=", 1) for kv in args.set), workers=args.workers, lease=args.lease,
                     retention=not args.no_retention, relations=not args.no_relations, limits=not args.no_limits)
    print(json.dumps(report, indent=1))
    return 1 if failed(report, args.jobs, args.brick_kills) else 0


if __name__ == "__main__":
    sys.exit(main())
