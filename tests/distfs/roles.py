"""Processes the multi-host tests start on one "host" (a mount): python roles.py ROLE ARGS...

Each runs in a process of its own, so that a hung mount hangs it and not the test, and logs
what it saw to a file on local disk (never on the mount under test), one line at a time, each
with this process's monotonic time (one clock for every process of the machine).
"""

from __future__ import annotations

import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]

from internals import owner, temp_path  # noqa: E402

from fsjobstore import JobStore  # noqa: E402
from fsjobstore._os import _files as _fsops  # noqa: E402


def log(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{time.monotonic():.3f} {text}\n".encode())
    finally:
        os.close(fd)


def reserve_and_die(root: str, job_id: str) -> None:
    """create(job_id=...) that dies right after reserving the id, before publishing the job."""
    real = _fsops.link_into

    def link_then_die(src: str, dst: str, *, durable: bool) -> None:
        real(src, dst, durable=durable)
        if os.sep + "ids" + os.sep in dst:
            os._exit(9)

    _fsops.link_into = link_then_die  # type: ignore[assignment]
    with JobStore(root, lease_duration=2.0) as store:  # others may judge it gone 2 s after its last beat
        store.create({"chosen": True}, job_id=job_id)


def hold(root: str, logpath: str, lease: float) -> None:
    """Claim a job and keep it, saying when it is told its lease may be lost."""
    store = JobStore(root, lease_duration=lease)
    job = store.pull_work(timeout=30, on_compromised=lambda exc: log(logpath, f"compromised {exc.reason}"))
    if job is None:
        log(logpath, "nothing")
        return
    log(logpath, f"claimed {job.id}")
    time.sleep(3600)


def own_and_die(root: str, logpath: str) -> None:
    """Become an owner with a temp file of a create in flight, then die."""
    store = JobStore(root, lease_duration=2.0)
    job = store.pull_work(timeout=30)
    with open(temp_path(store, "new", "x.json"), "wb") as fh:  # as a create cut short
        fh.write(b"{}")
    log(logpath, f"owner {owner(store).owner} holds {job.id if job else None}")
    os._exit(9)


def wait_for_jobs(root: str, logpath: str, count: int) -> None:
    """An idle worker: take ``count`` jobs as they come, saying when each arrived."""
    with JobStore(root) as store:
        store.pull_work()  # the first pull (and its recovery pass) before we say we are ready
        log(logpath, "ready")
        for _ in range(count):
            job = store.pull_work(timeout=30)
            if job is None:
                log(logpath, "timeout")
                return
            log(logpath, f"got {job.id} {job.request['made']}")
            job.fulfill(None)


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "reserve_and_die":
        reserve_and_die(args[0], args[1])
    elif role == "hold":
        hold(args[0], args[1], float(args[2]))
    elif role == "own_and_die":
        own_and_die(args[0], args[1])
    elif role == "wait_for_jobs":
        wait_for_jobs(args[0], args[1], int(args[2]))
    else:
        raise SystemExit(f"unknown role {role}")
