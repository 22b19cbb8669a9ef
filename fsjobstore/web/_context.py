"""What every route of one app shares: the store, its asyncio face, the guard, the options, and
what the overview and the API both show of a queue."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from .. import InvalidRequest, Job, JobNotFound, JobStore, StoreStatistics
from ..aio import AsyncJobStore
from ._hosts import Hosts
from ._remote import RemoteLeases
from ._security import Guard

SCAN_CAP = 5_000  # jobs a search looks at for one page


@dataclass
class Context:
    store: JobStore
    astore: AsyncJobStore
    guard: Guard
    read_only: bool
    leases: RemoteLeases
    title: str
    hosts: Hosts = field(default_factory=Hosts)  # the Host names answered (the gate checks)
    # Set when the server begins to stop: long polls answer 503 and event streams end then, not
    # when the graceful period runs out and their tasks are cancelled (a 500, and a traceback).
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


def ctx(request: Request) -> Context:
    context: Context = request.app.state.fsjobstore
    return context


def queue_rows(store: JobStore, stats: StoreStatistics | None = None) -> list[dict[str, Any]]:
    """Every queue the store knows (jobs in any state, counters, paused), by name: its counts per
    state, paused or not, oldest pending age, counters, and throughput over the last hour."""
    stats = stats or store.statistics()
    counters = store.counters()
    names = sorted(set(stats.by_queue) | set(counters.queues) | stats.paused)
    rows = []
    for name in names:
        c = counters.queues.get(name)
        rows.append({
            "name": name,
            "counts": dict(stats.by_queue.get(name, dict.fromkeys(
                ("pending", "scheduled", "deferred", "active", "fulfilled", "failed", "cancelled"), 0))),
            "paused": name in stats.paused,
            "oldest_pending_age": stats.oldest_pending_by_queue.get(name),
            "created": c.created if c else 0,
            "fulfilled": c.fulfilled if c else 0,
            "failed": c.failed if c else 0,
            "throughput": [list(t) for t in counters.throughput(name, minutes=60)],
        })
    return rows


def search_page(store: JobStore, *, state: str | None, queue: str | None, limit: int, after: str | None,
                search: str | None) -> tuple[list[Job], str | None, int | None]:
    """A page of jobs (``JobStore.jobs``), and the cursor of the next one. With ``search``: an id
    (that job alone), or text looked for in the ids and compact JSON requests of at most
    ``SCAN_CAP`` jobs; the cursor then continues the scan, and the third value says how many
    were looked at."""
    if not search:
        jobs = list(store.jobs(state=state, queue=queue, limit=limit + 1, after=after))
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return jobs, jobs[-1].id if more and jobs else None, None
    if after is None:
        try:
            job = store.get(search)
        except (InvalidRequest, JobNotFound):
            pass
        else:
            if (state is None or job.state == state) and (queue is None or job.queue == queue):
                return [job], None, 1
    found: list[Job] = []
    scanned = 0
    last: str | None = None
    exhausted = True
    for job in store.jobs(state=state, queue=queue, limit=None, after=after):
        scanned += 1
        last = job.id
        if search in job.id or search in json.dumps(job.request, separators=(",", ":"), ensure_ascii=False):
            found.append(job)
        if len(found) >= limit or scanned >= SCAN_CAP:
            exhausted = False
            break
    return found, None if exhausted else last, scanned
