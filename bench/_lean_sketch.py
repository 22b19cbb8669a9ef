"""A sketch, for bench/w8_budget.py only: the least Python a durable claim+commit on fsjobstore's
layout does, with every fsync the store makes, in a store that fsjobstore itself filled.

Per job: stat control/paused; rename the pending file into active/ under a fresh token; open,
read and close it; parse its record line (json) and check its id and queue and that no result
line follows; stat its cancel request; append a result line (json) with pwrite, fsync, close;
renameat2(RENAME_NOREPLACE) it into fulfilled/; fsync that directory; stat its targets.

What it leaves out, so its rate is a bound the real store cannot beat: it is generous to itself.
Each process owns a share of the names (no claimer ever loses a race), nothing checks the
record's other fields, there is no lease object, no heartbeat, no worker runtime, no fault
handling, and the directories are not fsynced after the claim's rename (the store does not
either). It is not a store: the jobs it drains keep no deadline, progress or notification.

Two switches put back, one at a time, what a store cannot leave out; each uses fsjobstore's own
(private) code, so the row measures exactly what the store pays for it:

* ``shared``: the names come from the store's pending index (``fsjobstore._core._pending.QueueIndex``:
  a listing, claims from its front, a random point after a lost race, a new listing after
  several), as in any queue whose workers do not know each other: every process claims from the
  one directory and some claims are lost to others.
* ``strict``: the claimed file is read as the store reads it (``fsjobstore._format._records.Record.parse``:
  every field checked, a torn tail told apart) instead of one ``json.loads`` and three checks.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import time
from typing import Any

import _raw
from _adapters import FsJobStore, fill

from fsjobstore._core._pending import QueueIndex
from fsjobstore._format._records import Record

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def _worker(root: str, k: int, workers: int, shared: bool, strict: bool, start: Any, out: Any) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = libc.renameat2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    pend, act, ful = (f"{root}/jobs/{x}" for x in ("pending/default", "active", "fulfilled"))
    cancel, targets, paused = f"{root}/control/cancel", f"{root}/targets", f"{root}/control/paused"
    owner, tokens = os.urandom(8).hex(), itertools.count(1)
    index = QueueIndex(pend, 4096, 1.0, time.monotonic, _bad_name) if shared else None
    # "<bucket>/<name>" in run order (pending/<queue>/<P>.<S>/<P>.<SEQ>.<id>.json), as the index gives them
    names = iter([f"{b}/{n}" for b in sorted(os.listdir(pend)) for n in sorted(os.listdir(f"{pend}/{b}"))][k::workers])
    loads, dumps = json.loads, json.dumps
    start.wait()
    while True:
        os.lstat(paused)
        name = next(names, None) if index is None else index.pop()
        if name is None:
            break
        job_id = name.rpartition("/")[2].split(".")[2]
        token = f"{owner}-{next(tokens):x}"
        claimed = f"{act}/{job_id}.{token}.json"
        try:
            os.rename(f"{pend}/{name}", claimed)
        except FileNotFoundError:
            if index is None:
                raise
            index.lost(name)
            continue
        if index is not None:
            index.won()
        fd = os.open(claimed, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        data = os.read(fd, 65536)
        os.close(fd)
        end = data.find(b"\n")
        if strict:
            parsed = Record.parse(data)
            doc = {"id": parsed.record.id, "queue": parsed.record.queue, "attempts": parsed.record.attempts}
            done = parsed.final is not None
        else:
            doc = loads(data[: end + 1])
            done = data.rfind(b"\n") != end
        if doc["id"] != job_id or doc["queue"] != "default" or done:
            raise ValueError(f"{claimed}: not the job its name says, or already final")
        try:  # noqa: SIM105  (contextlib.suppress costs more, and this is the least Python)
            os.lstat(f"{cancel}/{job_id}.json")
        except FileNotFoundError:
            pass
        line = dumps({"result": "fulfilled", "attempts": doc["attempts"] + 1, "error": None,
                      "finished_at": time.time(), "committed_by": token, "not_before": None, "value": ""},
                     separators=(",", ":")).encode() + b"\n"
        fd = os.open(claimed, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.pwrite(fd, line, end + 1)
        os.fsync(fd)
        os.close(fd)
        if renameat2(_AT_FDCWD, claimed.encode(), _AT_FDCWD, f"{ful}/{job_id}.json".encode(), _RENAME_NOREPLACE):
            raise OSError(ctypes.get_errno(), "renameat2", claimed)
        dfd = os.open(ful, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        os.fsync(dfd)
        os.close(dfd)
        try:  # noqa: SIM105
            os.lstat(f"{targets}/{job_id}")
        except FileNotFoundError:
            pass
    out.put(time.monotonic())


def _bad_name(name: str) -> None:
    raise ValueError(f"a name the sketch does not expect in the queue: {name!r}")


def drain(root: str, n: int, workers: int, *, shared: bool = False, strict: bool = False) -> float:
    """Fill a durable store with ``n`` jobs (fsjobstore's create), sync, and drain it with the
    sketch in ``workers`` processes; jobs per second. Raises if any job is left or missing."""
    fill(FsJobStore, root, n, True)
    os.sync()
    t0, finished = _raw.run_together(_worker, [(root, k, workers, shared, strict) for k in range(workers)])
    done = len(os.listdir(f"{root}/jobs/fulfilled"))
    if done != n:
        raise RuntimeError(f"the sketch fulfilled {done} of {n} jobs")
    return n / (max(finished) - t0)
