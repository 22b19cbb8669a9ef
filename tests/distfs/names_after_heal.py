"""Does a name renamed away come back after a brick's heal? The store's claim and commit, without the store.

    python tests/distfs/names_after_heal.py --files 3000 --bucket 40 --put-back 0.1 --append --hang-c

Three mounts of a replica-3 volume. A producer on host A makes ``pending/<n>`` files (``--bucket``:
in ``pending/<bucket>/`` directories, removed once emptied, as the store's are); two claimers on each
host list them and rename each to ``active/<n>.<claimer>``; the one whose rename succeeds is its
only claimer. It may put it back (``--put-back``: a release, into its bucket, made again if it was
removed), or append a result line, fsynced (``--append``), link it into ``done/<n>`` (EEXIST there:
a second claim) and ``index/<n>``, then unlink every name, as a commit and a removal by retention
do. Meanwhile a brick is killed, left down, started again and healed, twice, a different brick each
time; ``--hang-c`` also stops host C's client now and then, and kills and remounts it. Prints how
many names were claimed more than once, or claimed with a result already in them: on a filesystem
that keeps its names, 0. Exits 1 otherwise. RELIABILITY.md has the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import sys
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]

from distfs import gluster, replica  # noqa: E402
from distfs.chaos_two_hosts import HangOrKill  # noqa: E402


def bucket_of(n: int, per: int) -> str:
    return f"{n // per:06d}" if per else ""


def produce(root: str, files: int, rate: float, per: int) -> None:
    for n in range(files):
        tmp = f"{root}/tmp.{n}"
        with open(tmp, "w") as f:
            f.write(f"{n}\n")
        bdir = f"{root}/pending/{bucket_of(n, per)}"
        if per:
            with contextlib.suppress(FileExistsError):
                os.mkdir(bdir)
        os.rename(tmp, f"{bdir}/{n}")
        time.sleep(1 / rate)


def names(root: str, per: int) -> list[str]:
    if not per:
        return os.listdir(f"{root}/pending")
    found = []
    for bucket in sorted(os.listdir(f"{root}/pending")):
        try:
            inside = os.listdir(f"{root}/pending/{bucket}")
        except OSError:
            continue
        if not inside:
            with contextlib.suppress(OSError):  # emptied: removed, as the store removes its buckets
                if time.time() - os.stat(f"{root}/pending/{bucket}").st_mtime > 2:
                    os.rmdir(f"{root}/pending/{bucket}")
        found += inside
        if len(found) > 40:
            break
    return found


def claim(root: str, me: str, log: str, stop_at: float, per: int, put_back: float, append: bool) -> None:
    rng = random.Random(me)
    with open(log, "a", buffering=1) as out:
        while time.time() < stop_at:
            try:
                found = names(root, per)
            except OSError:
                time.sleep(0.1)
                continue
            rng.shuffle(found)
            for name in found[:20]:
                mine = f"{root}/active/{name}.{me}"
                pending = f"{root}/pending/{bucket_of(int(name), per)}/{name}".replace("//", "/")
                try:
                    os.rename(pending, mine)
                except OSError:
                    continue
                if rng.random() < put_back:  # a release: back into its own bucket, made again if removed
                    with contextlib.suppress(OSError):
                        if per:
                            with contextlib.suppress(FileExistsError):
                                os.mkdir(os.path.dirname(pending))
                        os.rename(mine, pending)
                        out.write(f"back {name} {me}\n")
                        continue
                out.write(f"claim {name} {me} {time.time():.3f}\n")
                if append:  # as a commit: read the claimed file, append a result line durably, index it
                    try:
                        with open(mine, "r+") as f:
                            if len(f.read().splitlines()) > 1:
                                out.write(f"hadresult {name} {me}\n")
                            f.write(f"result {me}\n")
                            f.flush()
                            os.fsync(f.fileno())
                        os.link(mine, f"{root}/index/{name}")
                    except OSError as exc:
                        out.write(f"appenderr {name} {me} {exc.errno}\n")
                try:
                    os.link(mine, f"{root}/done/{name}")
                except FileExistsError:
                    out.write(f"second {name} {me}\n")
                except OSError as exc:
                    out.write(f"linkerr {name} {me} {exc.errno}\n")
                for path in (mine, f"{root}/done/{name}", f"{root}/index/{name}"):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            if not found:
                time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=40.0, help="files made a second")
    parser.add_argument("--claimers", type=int, default=2, help="claimers on each host")
    parser.add_argument("--down", type=float, default=15.0)
    parser.add_argument("--bucket", type=int, default=0, metavar="N",
                        help="files in pending/<bucket>/ directories of N each, emptied ones removed (default: none)")
    parser.add_argument("--put-back", type=float, default=0.0, help="the share of claims released back")
    parser.add_argument("--append", action="store_true",
                        help="each claim appends a line to its file (fsynced) and links it into index/ too")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--mount", choices=["default", "strict"], default="default")
    parser.add_argument("--workdir", default="/tmp/names-after-heal")
    parser.add_argument("--hang-c", action="store_true",
                        help="host C's client hangs now and then (SIGSTOP), and is killed and remounted")
    args = parser.parse_args()
    options = {**replica.QUORUM, **dict(kv.split("=", 1) for kv in args.set)}
    os.makedirs(args.workdir, exist_ok=True)
    with gluster.GlusterBed() as bed:
        volume = replica.Replicated(bed, options=options)
        mopts = gluster.STRICT if args.mount == "strict" else gluster.DEFAULT
        mounts = [bed.mount(f"host-{n}", mopts, volume=volume.name) for n in "abc"]
        try:
            roots = [str(m.path / "t") for m in mounts]
            for d in ("pending", "active", "done", "index"):
                os.makedirs(f"{roots[0]}/{d}")
            time.sleep(1.5)
            length = args.files / args.rate
            stop_at = time.time() + length + 120
            procs = [multiprocessing.Process(target=produce, args=(roots[0], args.files, args.rate, args.bucket))]
            logs = []
            for h, root in enumerate(roots):
                for k in range(args.claimers):
                    log = f"{args.workdir}/claims-{h}-{k}.log"
                    Path(log).write_text("")
                    logs.append(log)
                    procs.append(multiprocessing.Process(target=claim, args=(root, f"{h}{k}", log, stop_at, args.bucket,
                                                                                args.put_back, args.append)))
            for p in procs:
                p.start()
            events = []
            hanging = threading.Event()
            if args.hang_c:
                host_c = HangOrKill(mounts[2], kill_every=40)

                def hang() -> None:
                    rng = random.Random(2)
                    while not hanging.wait(0.25):
                        host_c(rng)
                    host_c(None)
                hanger = threading.Thread(target=hang)
                hanger.start()
            for brick in random.Random(1).sample(range(3), 2):
                time.sleep(length / 3)
                volume.kill_brick(brick)
                t = time.time()
                time.sleep(args.down)
                volume.start_bricks()
                state = volume.wait_healed(300)
                events.append({"brick": brick, "down_s": args.down, "healed": state.healed,
                               "healed_after_s": round(time.time() - t - args.down, 1)})
            procs[0].join()
            hanging.set()
            if args.hang_c:
                hanger.join()
            while time.time() < stop_at and names(roots[0], args.bucket):
                time.sleep(1)
            for p in procs[1:]:
                p.terminate()
                p.join()
            final = volume.wait_healed(300)
            claims: dict[str, int] = {}
            seconds, errors, had_result = 0, 0, 0
            for log in logs:
                for line in Path(log).read_text().splitlines():
                    kind, name, *_ = line.split()
                    if kind == "claim":
                        claims[name] = claims.get(name, 0) + 1
                    elif kind == "back":
                        pass
                    elif kind == "hadresult":
                        had_result += 1
                    elif kind == "second":
                        seconds += 1
                    else:
                        errors += 1
            twice = sorted((n for n, c in claims.items() if c > 1), key=int)
            report = {"files": args.files, "claimed": len(claims), "claimed_more_than_once": len(twice),
                      "examples": twice[:10], "second_claims_met_at_link": seconds,
                      "claimed_with_a_result_in_it": had_result, "link_errors": errors,
                      "left_in_pending": len(names(roots[0], args.bucket)), "brick_kills": events,
                      "healed_at_end": final.healed, "options": options, "mount": args.mount,
                      "host_c": host_c.summary() if args.hang_c else None}
            print(json.dumps(report, indent=1))
            return 1 if twice or had_result or report["claimed"] != args.files else 0
        finally:
            for m in mounts:
                bed.drop_mount(m.name)
            volume.remove()


if __name__ == "__main__":
    sys.exit(main())
