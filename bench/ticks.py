"""What a periodic tick costs: one scheduler pass that makes a tick, against a plain create.

    python bench/ticks.py [--ticks 500] [--rounds 5] [--dir /tmp] [--no-fsync]

Each round makes ``--ticks`` ticks of one schedule with ``JobStore.make_tick`` (list the
schedule's records, create the job with its tick id, which reserves the id in ``ids/``, list
again, record the tick) and as many jobs with ``create(job_id=...)`` (the same reservation,
without the records), alternating, in fresh stores. Prints the median microseconds per call of
each, and the ratio. A tick also costs what its pass reads (the declaration, one listing): a
schedule's pass runs once per tick, not per job, so this is the whole of its cost.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from fsjobstore import JobStore


def run(base: str, ticks: int, durable: bool, kind: str) -> float:
    root = tempfile.mkdtemp(dir=base)
    with JobStore(os.path.join(root, "s"), durable=durable) as store:
        started = time.perf_counter()
        for i in range(ticks):
            if kind == "tick":
                store.make_tick("bench", 1_800_000_000 + 60 * i, {"n": i}, queue="q")
            else:
                store.create({"n": i}, queue="q", job_id=f"chosen-{i}")
        return (time.perf_counter() - started) / ticks * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--no-fsync", action="store_true")
    args = parser.parse_args()
    base = tempfile.mkdtemp(dir=args.dir, prefix="fsjs-bench-ticks-")
    got: dict[str, list[float]] = {"tick": [], "create": []}
    try:
        for _ in range(args.rounds):
            for kind in ("tick", "create"):
                got[kind].append(run(base, args.ticks, not args.no_fsync, kind))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    tick, create = statistics.median(got["tick"]), statistics.median(got["create"])
    print(f"make_tick {tick:,.0f} us, create(job_id=...) {create:,.0f} us per call "
          f"(median of {args.rounds} rounds of {args.ticks}; durable={not args.no_fsync}, {base}): "
          f"{tick / create:.2f}x")


if __name__ == "__main__":
    main()
