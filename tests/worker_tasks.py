"""Handlers the worker tests run, in-process and through ``fsjobstore worker --handler``.

Each request is a dict; handlers that record what they did append a line to the file named in
``request["log"]`` (one write per line, so lines from several processes never interleave).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from fsjobstore import JobContext, Worker


def bounded_run(worker: Worker, limit: float = 30.0, **run: Any) -> Any:
    """``worker.run(burst=True, **run)``, stopped after ``limit`` s: a run that a bug would keep
    going forever fails the test on its assertions rather than hanging it."""
    timer = threading.Timer(limit, lambda: worker.stop(now=True))
    timer.start()
    try:
        return worker.run(**({"burst": True} | run))
    finally:
        timer.cancel()


def note(job: JobContext, text: str) -> None:
    path = job.request.get("log") if isinstance(job.request, dict) else None
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{text} {job.id} {job.attempt} {os.getpid()}\n".encode())
        finally:
            os.close(fd)


def echo(job: JobContext) -> Any:
    note(job, "ran")
    return {"echo": job.request.get("n"), "pid": os.getpid()}


def slow(job: JobContext) -> Any:
    note(job, "started")
    time.sleep(float(job.request.get("seconds", 1.0)))
    note(job, "finished")
    return "slept"


def hang(job: JobContext) -> Any:
    """Hangs on its first attempt (past any time limit); returns at once on later ones."""
    note(job, "started")
    if job.attempt == 1:
        time.sleep(3600)
    return "second time"


def careful(job: JobContext) -> Any:
    """Works in small steps and stops when asked to (a cooperative handler, for threads)."""
    note(job, "started")
    for step in range(600):
        job.progress(step, 600)
        job.raise_if_cancelled()
        time.sleep(0.05)
    return "never cancelled"


def flaky(job: JobContext) -> Any:
    note(job, "ran")
    if job.attempt < 2:
        raise RuntimeError("flaky: first attempt fails")
    return "fine"


def deliver(target: Any, note_lease: Any) -> None:
    """For ``fsjobstore notify``: append the result to the file the target names."""
    if not isinstance(target, dict) or "file" not in target:
        raise ValueError(f"not a deliverable target: {target!r}")
    with open(target["file"], "a") as fh:
        fh.write(f"{note_lease.id} {note_lease.state.value} {note_lease.value!r}\n")


HANDLERS = {"echo": echo, "slow": slow, "hang": hang, "careful": careful, "flaky": flaky}


def unstorable(job: JobContext) -> Any:
    """Returns what JSON cannot hold."""
    return {1, 2, 3}


def exits(job: JobContext) -> Any:
    """Handler code that calls sys.exit(): a failed attempt, like any other exception."""
    note(job, "ran")
    raise SystemExit(3)


def interrupts(job: JobContext) -> Any:
    note(job, "ran")
    raise KeyboardInterrupt


def forks(job: JobContext) -> Any:
    """Forks and returns in both processes: only the worker's own process may commit."""
    pid = os.fork()
    note(job, "forked-child" if pid == 0 else "forked-parent")
    if pid:
        os.waitpid(pid, 0)
    return "forked"


def ends_its_process(job: JobContext) -> Any:
    """Ends its whole process at once with the status it was asked for (``os._exit``: what a C
    library calling ``exit()`` does): in a child of the processes runtime, a crash of that
    attempt whatever the status."""
    note(job, "ran")
    os._exit(job.request["status"])


HOSTILE = {"exits": exits, "interrupts": interrupts, "forks": forks, "echo": echo, "ends": ends_its_process}
