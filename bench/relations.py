"""What jobs that know about each other cost (issue 22): unique keys, concurrency keys, chains made
with ``after=``, groups and fan-out to subscriptions, each against the plain jobs they replace, in
one run.

    python bench/relations.py [--creates 1000] [--claims 1000] [--chain 1000] [--group 100] [--groups 5]
                              [--fanouts 100] [--subscriptions 10]
                              [--payload 100] [--rounds 5] [--dir /tmp] [--no-fsync]
    python bench/relations.py --rounds 3                 # what bench/last_*_run.txt files keep
    python bench/relations.py --quick                    # small sizes: that it runs (tests)

Every figure is taken on a fresh store (durable, the default; ``--no-fsync``: ``durable=False``)
in a scratch directory, removed at the end. Each round measures every variant of a part once;
the order of the variants rotates from round to round, so slow and fast moments of the machine
fall on all of them. The summary gives the median of the rounds, and the ratio of the medians
with the range of the rounds' own ratios.

**Unique create.** ``--creates`` jobs each with its own ``unique_key`` against as many plain
creates, the same request (``--payload`` bytes of text in a small JSON object) and queue. A key
costs a link into ``unique/`` before the job is published. Target: unique at least 0.8x of
plain's rate. Then, on its own line, ``--creates`` creates that all give one key whose holder is
pending (made first, not timed): each makes nothing and answers the holder, which is checked.

**Claim with a concurrency key.** ``--claims`` jobs made first (not timed), then claimed and
fulfilled one at a time by one process (``pull_work()``, ``fulfill``), against as many plain
jobs. The keyed jobs share one key of the default limit (one at a time): each claim takes the
key's slot (a lock file: open, flock, write) and each fulfil lets it go (unlink, unlock) and looks
for jobs waiting for it (a listing of ``jobs/waiting/``).

**Chain.** ``--chain`` jobs, each made ``after=[the previous one]`` (all but the first wait in
``deferred/``), drained by an in-process ``Worker`` (one thread, a handler that returns at once,
``run(count=C)``: a job becomes pending only as its parent is fulfilled), against as many
independent jobs drained the same way. Timed from just before the first create to the last
job's ``finished_at``; every job is checked fulfilled. The creates' share is shown apart.

**Fan-out.** ``--fanouts`` creates into a queue that ``--subscriptions`` subscriptions match
(each makes a copy per subscription, all or none: a group), against as many plain creates: the
rate of creates (not of copies) of each.

**Group.** ``--groups`` calls of ``create_group`` with ``--group`` members each, against as many
plain creates one by one: the rate per job of each.

Prints a header (commit, date, cores, load average, durability, scratch directory), then one
line per measurement. The figures are never asserted: tests/test_bench.py only checks that
``--quick`` runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import commit

from fsjobstore import JobState, JobStore
from fsjobstore.worker import Worker

QUEUE = "bench"
TARGET_UNIQUE = 0.8  # unique creates at least this share of plain creates' rate


def handle(job: Any) -> str:
    return "ok"


def fresh(base: str, durable: bool) -> JobStore:
    return JobStore(os.path.join(tempfile.mkdtemp(dir=base), "s"), durable=durable)


def count(store: JobStore) -> int:
    return sum(1 for _ in store.jobs(queue=QUEUE, limit=None))


def request(i: int, payload: int) -> dict[str, Any]:
    return {"i": i, "text": "x" * payload}


# -- the parts: each call makes one fresh store and returns its figure --------------------------
def creates(base: str, durable: bool, kind: str, n: int, payload: int) -> float:
    """Jobs/s of n creates: "plain", "unique" (a key each) or "reuse" (one key, held by a pending job)."""
    with fresh(base, durable) as store:
        holder = store.create(request(-1, payload), queue=QUEUE, unique_key="held") if kind == "reuse" else None
        answers = []
        started = time.perf_counter()
        for i in range(n):
            if kind == "plain":
                store.create(request(i, payload), queue=QUEUE)
            elif kind == "unique":
                store.create(request(i, payload), queue=QUEUE, unique_key=f"key-{i}")
            else:
                answers.append(store.create(request(i, payload), queue=QUEUE, unique_key="held").id)
        seconds = time.perf_counter() - started
        if holder is not None:
            assert answers == [holder.id] * n and count(store) == 1, "a reused key made a job"
        elif kind == "unique":
            assert count(store) == n
    return n / seconds


def claims(base: str, durable: bool, kind: str, n: int, payload: int) -> float:
    """Jobs/s claimed and fulfilled by one process: "plain", or "keyed" (one concurrency key)."""
    with fresh(base, durable) as store:
        key = "bench-key" if kind == "keyed" else None
        for i in range(n):
            store.create(request(i, payload), queue=QUEUE, concurrency_key=key)
        started = time.perf_counter()
        for _ in range(n):
            lease = store.pull_work(queues=QUEUE)
            assert lease is not None, "a job was not claimable"
            lease.fulfill("ok")
        seconds = time.perf_counter() - started
        assert store.statistics().fulfilled == n
    return n / seconds


def drain(base: str, durable: bool, kind: str, c: int, payload: int) -> tuple[float, float]:
    """Seconds from the first create to the last job fulfilled, and of it the creates', for c jobs
    chained ("chain") or not ("independent"), drained by one worker thread."""
    with fresh(base, durable) as store:
        ids: list[str] = []
        started = time.time()
        for i in range(c):
            after = ids[-1:] if kind == "chain" and ids else None
            ids.append(store.create(request(i, payload), queue=QUEUE, after=after).id)
        created = time.time()
        summary = Worker(store, {QUEUE: handle}, concurrency=1, mode="threads").run(count=c)
        assert summary.fulfilled == c, summary
        jobs = [store.get(i) for i in ids]
        assert all(j.state is JobState.FULFILLED and j.finished_at for j in jobs), "a job was left unfulfilled"
        end = max(j.finished_at or 0.0 for j in jobs)
    return end - started, created - started


def group(base: str, durable: bool, kind: str, g: int, groups: int, payload: int) -> float:
    """Jobs/s of `groups` groups of g members ("group") or as many plain creates ("plain")."""
    with fresh(base, durable) as store:
        started = time.perf_counter()
        for k in range(groups):
            if kind == "group":
                made = store.create_group([{"request": request(k * g + i, payload), "queue": QUEUE}
                                           for i in range(g)])
                assert len(made.jobs) == g
            else:
                for i in range(g):
                    store.create(request(k * g + i, payload), queue=QUEUE)
        seconds = time.perf_counter() - started
    return g * groups / seconds


def fanout(base: str, durable: bool, kind: str, n: int, subs: int, payload: int) -> float:
    """Creates/s: n creates into a queue that `subs` subscriptions fan out ("fanout"), or plain."""
    with fresh(base, durable) as store:
        if kind == "fanout":
            for i in range(subs):
                store.subscribe(f"sub-{i:02d}", f"{QUEUE}*")
        started = time.perf_counter()
        for i in range(n):
            store.create(request(i, payload), queue=QUEUE)
        seconds = time.perf_counter() - started
        made = store.statistics().pending
        assert made == n * (subs if kind == "fanout" else 1), made
    return n / seconds


def rounds(n: int, variants: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    """Each variant once a round, the order rotating from round to round."""
    got: dict[str, list[Any]] = {k: [] for k in variants}
    keys = list(variants)
    for r in range(n):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            got[key].append(variants[key]())
    return got


def spread(ratios: list[float]) -> str:
    return f"rounds {min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else "1 round"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--creates", type=int, default=1000, help="creates per round for each unique-key variant")
    ap.add_argument("--claims", type=int, default=1000, help="jobs claimed per round, with a key and without")
    ap.add_argument("--chain", type=int, default=1000, help="jobs in the chain (and the independent jobs)")
    ap.add_argument("--group", type=int, default=100, help="members of each group")
    ap.add_argument("--groups", type=int, default=5, help="groups made per round")
    ap.add_argument("--fanouts", type=int, default=100, help="creates into a fanned-out queue per round")
    ap.add_argument("--subscriptions", type=int, default=10, help="subscriptions that fan it out")
    ap.add_argument("--payload", type=int, default=100, help="bytes of text in each job's request")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="scratch directory (default: the system's temp dir)")
    ap.add_argument("--no-fsync", action="store_true", help="stores made with durable=False")
    ap.add_argument("--quick", action="store_true", help="small sizes, to check that it runs")
    args = ap.parse_args()
    if args.quick:
        args.creates, args.claims, args.chain, args.group, args.groups, args.rounds = 20, 20, 10, 10, 1, 1
        args.fanouts, args.subscriptions = 5, 3
    durable = not args.no_fsync
    logging.getLogger("fsjobstore").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="fsjs-bench-relations-", dir=args.dir) as base:
        measured = commit(os.path.dirname(os.path.abspath(__file__))) or "?"
        print(f"fsjobstore relations bench at {measured}, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} "
              f"cores, load {os.getloadavg()[0]:.2f}; durable={durable}, median of {args.rounds} rounds, "
              f"scratch {base}", flush=True)
        n, p = args.creates, args.payload
        made = rounds(args.rounds, {k: partial(creates, base, durable, k, n, p) for k in ("plain", "unique", "reuse")})
        claimed = rounds(args.rounds, {k: partial(claims, base, durable, k, args.claims, p)
                                       for k in ("plain", "keyed")})
        chained = rounds(args.rounds, {k: partial(drain, base, durable, k, args.chain, p)
                                       for k in ("independent", "chain")})
        fanned = rounds(args.rounds, {k: partial(fanout, base, durable, k, args.fanouts, args.subscriptions, p)
                                      for k in ("plain", "fanout")})
        grouped = rounds(args.rounds, {k: partial(group, base, durable, k, args.group, args.groups, p)
                                       for k in ("plain", "group")})
    plain, unique, reuse = (statistics.median(made[k]) for k in ("plain", "unique", "reuse"))
    ratios = [u / q for u, q in zip(made["unique"], made["plain"], strict=True)]
    print(f"  unique create  {n:,} creates: a key each {unique:8,.0f} jobs/s vs plain {plain:8,.0f} jobs/s: "
          f"ratio {unique / plain:.2f}x ({spread(ratios)}), "
          f"{'met' if unique / plain >= TARGET_UNIQUE else 'NOT met'} (target {TARGET_UNIQUE}x)")
    print(f"  unique reuse   {n:,} creates of one key held by a pending job: {reuse:8,.0f} answers/s "
          f"({reuse / plain:.2f}x plain's rate)")
    keyed, free = (statistics.median(claimed[k]) for k in ("keyed", "plain"))
    ratios = [a / b for a, b in zip(claimed["keyed"], claimed["plain"], strict=True)]
    print(f"  keyed claim    {args.claims:,} claims + fulfils by one process: one concurrency key {keyed:8,.0f} jobs/s "
          f"vs plain {free:8,.0f} jobs/s: ratio {keyed / free:.2f}x ({spread(ratios)})")
    chain, alone = (statistics.median(t for t, _ in chained[k]) for k in ("chain", "independent"))
    chain_c, alone_c = (statistics.median(c for _, c in chained[k]) for k in ("chain", "independent"))
    ratios = [a[0] / b[0] for a, b in zip(chained["chain"], chained["independent"], strict=True)]
    print(f"  chain          {args.chain:,} jobs, create to last fulfilled: chained {chain:.2f} s (creates "
          f"{chain_c:.2f} s) vs independent {alone:.2f} s (creates {alone_c:.2f} s): ratio {chain / alone:.2f}x "
          f"({spread(ratios)})")
    out, one = (statistics.median(fanned[k]) for k in ("fanout", "plain"))
    ratios = [a / b for a, b in zip(fanned["fanout"], fanned["plain"], strict=True)]
    print(f"  fan-out        {args.fanouts:,} creates to {args.subscriptions} subscriptions: {out:8,.0f} creates/s "
          f"({out * args.subscriptions:,.0f} copies/s) vs plain {one:8,.0f} creates/s: ratio {out / one:.2f}x "
          f"({spread(ratios)})")
    in_groups, one_by_one = (statistics.median(grouped[k]) for k in ("group", "plain"))
    ratios = [a / b for a, b in zip(grouped["group"], grouped["plain"], strict=True)]
    print(f"  group          {args.groups} x create_group of {args.group}: {in_groups:8,.0f} jobs/s vs plain "
          f"{one_by_one:8,.0f} jobs/s: ratio {in_groups / one_by_one:.2f}x ({spread(ratios)})")


if __name__ == "__main__":
    main()
