"""Child-process roles for the multi-process tests: python tests/_proc.py ROLE ROOT LOG [args]."""

from __future__ import annotations

import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fsjobstore import JobStore, LeaseLost


def log(path: str, line: str) -> None:
    with open(path, "a") as fh:
        fh.write(line + "\n")


def drain(root: str, logpath: str, max_sleep: float, lease: float) -> None:
    """Fulfil jobs until the queue stays empty; log every fulfil that returned."""
    with JobStore(root, lease_duration=lease, backoff=lambda a: 0.0) as store:
        idle = 0
        while idle < 3:
            job = store.pull_work(timeout=0.5)
            if job is None:
                idle += 1
                continue
            idle = 0
            if max_sleep:
                time.sleep(random.uniform(0, max_sleep))
            try:
                job.fulfill(job.token)
            except LeaseLost:
                log(logpath, f"lost {job.id}")
                continue
            log(logpath, f"ok {job.id} {job.token}")


def hold(root: str, logpath: str, lease: float) -> None:
    """Claim one job, wait for a go file, then try to fulfil it (for the SIGSTOP test)."""
    with JobStore(root, lease_duration=lease, heartbeat_interval=lease / 4) as store:
        job = store.pull_work(timeout=10, on_compromised=lambda exc: log(logpath, f"compromised {exc.reason}"))
        assert job is not None
        log(logpath, f"claimed {job.id}")
        while not os.path.exists(logpath + ".go"):
            time.sleep(0.02)
        deadline = time.monotonic() + 10
        while job.compromised is None and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            job.fulfill(b"late")
            log(logpath, "fulfilled")
        except LeaseLost:
            log(logpath, "LeaseLost")


def notify_hold(root: str, logpath: str) -> None:
    store = JobStore(root)
    note = store.pull_notification(timeout=10)
    assert note is not None
    log(logpath, f"claimed {note.id}")
    time.sleep(60)


def claim_and_die(root: str, logpath: str) -> None:
    store = JobStore(root)
    job = store.pull_work(timeout=10)
    assert job is not None
    log(logpath, f"claimed {job.id}")
    os._exit(9)


def pull_once(root: str, logpath: str) -> None:
    """A cron-style worker: open, pull once without waiting, say what it got, exit."""
    with JobStore(root) as store:
        lease = store.pull_work(timeout=0)
        log(logpath, "none" if lease is None else f"got {lease.id} attempt {lease.attempt}")
        if lease is not None:
            lease.fulfill("by the one-shot worker")


if __name__ == "__main__":
    role, root, logpath, *rest = sys.argv[1:]
    if role == "drain":
        drain(root, logpath, float(rest[0]), float(rest[1]))
    elif role == "hold":
        hold(root, logpath, float(rest[0]))
    elif role == "notify_hold":
        notify_hold(root, logpath)
    elif role == "claim_and_die":
        claim_and_die(root, logpath)
    elif role == "pull_once":
        pull_once(root, logpath)
    else:
        raise SystemExit(f"unknown role {role}")
