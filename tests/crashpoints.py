"""Crash points: end a real process at the N-th filesystem call of an operation, for every N.

Run as ``python tests/crashpoints.py SCENARIO [--durable|--fast]``; prints one JSON line with the
number of crash points tried and every invariant broken. For each N, a forked child opens a fresh
store, runs the scenario's setup (whose results are acknowledged), then runs the operation with a
hook that calls ``os._exit`` at call N: no cleanup, no flush, no ``finally``. The parent opens the
directory again, recovers, checks the invariants (faultkit.check_store) and that the store still
works. N grows until the operation completes without reaching the crash point.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from faultkit import (
    BY_NAME,
    CRASH_EXIT,
    CountingHook,
    Ctx,
    Scenario,
    check_store,
    die_now,
    drain_survivors,
    full_cycle,
    hooked,
)

from fsjobstore import JobStore


def _lose_the_job(store: JobStore, ctx: Ctx) -> None:
    """A planted bug for the self-test: a "create" that acknowledges, then loses its file."""
    job = store.create({"doomed": True})
    ctx.outcome = job.id
    for dirpath, _dirs, names in os.walk(os.path.join(store.path, "jobs")):
        for name in names:
            if job.id in name:
                os.unlink(os.path.join(dirpath, name))


BY_NAME["create_losing_selftest"] = Scenario("create_losing_selftest", BY_NAME["create"].setup, _lose_the_job)


def child(root: str, name: str, n: int, durable: bool, ack_path: str) -> None:
    scenario = BY_NAME[name]
    store = JobStore(root, durable=durable, backoff=lambda attempt: 0.0)
    ctx = Ctx()
    scenario.setup(store, ctx)
    _write_ack(ack_path, ctx)
    with hooked(CountingHook(n, die_now)):
        scenario.run(store, ctx)
    # Reaching here: the operation completed and returned, so what it created is acknowledged.
    if name.startswith("create"):
        ctx.jobs.append(ctx.outcome)
    if name in ("fulfill", "fulfill_by_id"):
        ctx.results[ctx.jobs[0]] = "fulfilled"
    if name == "fail_final":
        ctx.results[ctx.jobs[0]] = "failed"
    _write_ack(ack_path, ctx)
    os._exit(0)


def _write_ack(path: str, ctx: Ctx) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump({"jobs": ctx.jobs, "results": ctx.results}, fh)
    os.rename(path + ".tmp", path)


def sweep(name: str, durable: bool) -> dict[str, object]:
    problems: list[str] = []
    n = 0
    while n < 400:
        n += 1
        root = tempfile.mkdtemp(prefix=f"fsjs-crash-{name}-")
        ack = root + ".ack"
        try:
            pid = os.fork()
            if pid == 0:
                try:
                    child(root, name, n, durable, ack)
                finally:
                    os._exit(3)  # an exception in the child: reported below
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            if code not in (0, CRASH_EXIT):
                problems.append(f"{name} N={n}: child exited with {code}")
                break
            with open(ack) as fh:
                doc = json.load(fh)
            ctx = Ctx(jobs=doc["jobs"], results=doc["results"])
            with JobStore(root, durable=durable, backoff=lambda attempt: 0.0) as store:
                store.recover()
                problems += [f"{name} N={n}: {p}" for p in check_store(root, ctx, settled=True)]
                problems += [f"{name} N={n}: {p}" for p in full_cycle(store)]
                problems += [f"{name} N={n}: {p}" for p in drain_survivors(store, root, ctx)]
            if code == 0:
                return {"scenario": name, "crash_points": n - 1, "problems": problems}
        finally:
            shutil.rmtree(root, ignore_errors=True)
            for leftover in (ack, ack + ".tmp"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    problems.append(f"{name}: never completed within {n} calls")
    return {"scenario": name, "crash_points": n, "problems": problems}


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    durable = "--fast" not in sys.argv
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or [n for n in BY_NAME if "selftest" not in n]
    for scenario_name in names:
        print(json.dumps(sweep(scenario_name, durable)), flush=True)
