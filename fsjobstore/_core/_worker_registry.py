"""Who is working: ``workers/<owner>.json``, one entry per running worker (``fsjobstore.Worker``).

An entry is named after the owner identity of the store that wrote it, so it lives exactly as
long as that owner does: readers skip it once the owner is dead or its heartbeat has stopped,
and recovery deletes it. The worker rewrites it (atomically, never fsynced: it is a status, not
state) every second or so with what it is doing; each rewrite also beats the owner.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import StorageError
from .._format._layout import WORKER_RE
from .._format._values import check_nesting, dumps, loads
from .._os import _files as fs
from .._os import _syscalls as sc
from ._core import Core
from ._liveness import OwnerGone


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a running worker published about itself (see :meth:`JobStore.workers`)."""

    owner: str  # the owner identity of the worker's store (its entry's name)
    name: str
    host: str
    pid: int
    queues: tuple[str, ...] | None  # None: every queue it has a handler for... or all
    concurrency: int
    mode: str  # "threads" or "processes"
    paused: bool
    started_at: float
    last_heartbeat: float  # wall clock of its last rewrite
    jobs_done: int
    jobs_failed: int
    current: tuple[dict[str, Any], ...]  # the jobs it runs now: id, queue, attempt, started_at


def publish(core: Core, info: dict[str, Any], on_owner_gone: Callable[[], None]) -> None:
    """Write this store's worker entry (and beat its owner, so the entry stays alive).

    ``on_owner_gone`` is the heartbeat's own answer to an owner file found gone (held leases
    told, the identity dropped); the entry is then published under a new identity."""
    owner = core.ensure_owner()
    try:
        owner.beat()
    except OwnerGone:
        # Another process judged us gone; or a member of a shared store moved leases/ away
        # (FORMAT.md, "Trust"). Never a bare OSError to the caller.
        on_owner_gone()
        owner = core.ensure_owner()
        try:
            owner.beat()
        except OwnerGone as exc:  # gone again at once: refused, as the store's own error
            err = StorageError(errno.ENOENT, str(exc), core.layout.leases)
            err.op = "publish_worker"
            raise err from None
    doc = dict(info, owner=owner.owner, host=socket.gethostname(), pid=os.getpid(),
               last_heartbeat=core.wall())
    path = core.layout.worker_path(owner.owner)
    tmp = core.layout.tmp_path(core.new_token(), "aux", "worker.json")
    data = dumps(doc, what="worker info")
    check_nesting(doc, what="worker info", encoded=data)  # served as is by every listing of workers
    fs.write_new(tmp, data + b"\n", durable=False, mode=core.tree.perms.file_mode)
    try:
        sc.rename(tmp, path)
    except BaseException:
        fs.unlink_quietly(tmp)
        raise


def retract(core: Core) -> None:
    if core.owner is not None:
        fs.unlink_quietly(core.layout.worker_path(core.owner.owner))


def read_all(core: Core) -> list[WorkerInfo]:
    """Entries of live workers, oldest first. Entries of dead or silent owners are skipped."""
    out = []
    me = core.owner.owner if core.owner is not None else None
    for name in fs.scan_names(core.layout.workers):
        m = WORKER_RE.match(name)
        if not m:
            continue
        if m["owner"] != me and core.probe.status(m["owner"]) != "alive":
            continue
        info = _parse(os.path.join(core.layout.workers, name))
        if info is not None:
            out.append(info)
    out.sort(key=lambda w: (w.started_at, w.owner))
    return out


def sweep(core: Core, me: str) -> int:
    """Delete the entries of dead (or expired) owners; how many went."""
    gone = 0
    for name in fs.scan_names(core.layout.workers):
        m = WORKER_RE.match(name)
        if m and m["owner"] != me and core.probe.status(m["owner"]) != "alive":
            gone += fs.unlink(os.path.join(core.layout.workers, name))
    return gone


def _parse(path: str) -> WorkerInfo | None:
    try:
        doc = loads(fs.read_regular(path, 256 * 1024))
    except (FileNotFoundError, fs.Unreadable, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    try:
        queues = doc.get("queues")
        return WorkerInfo(
            owner=str(doc["owner"]), name=str(doc.get("name", "")), host=str(doc.get("host", "")),
            pid=int(doc.get("pid", 0)), queues=None if queues is None else tuple(map(str, queues)),
            concurrency=int(doc.get("concurrency", 1)), mode=str(doc.get("mode", "")),
            paused=bool(doc.get("paused", False)), started_at=float(doc.get("started_at", 0.0)),
            last_heartbeat=float(doc.get("last_heartbeat", 0.0)), jobs_done=int(doc.get("jobs_done", 0)),
            jobs_failed=int(doc.get("jobs_failed", 0)),
            current=tuple(c for c in doc.get("current", ()) if isinstance(c, dict)),
        )
    except (KeyError, TypeError, ValueError):
        return None
