"""The JSON API under ``/api``: create, lease, fulfil and watch jobs in REST form, on ``JobStore``'s public calls.

Errors answer ``{"error": "<fsjobstore exception>", "message": "..."}`` (``_app`` maps each
exception to its status: 404 not found, 409 exists or wrong state, 422 bad input, ...). Every
call that changes something is a POST of ``application/json`` (``_security``); with
``read_only`` they answer 403 ``ReadOnly``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from .. import CorruptJob, Group, InvalidRequest, Job, JobNotFound, JobStoreError, StoreClosed
from ._context import Context, ctx, queue_rows, search_page
from ._remote import MAX_LEASE, MIN_LEASE
from ._schemas import (
    CreateGroup,
    CreateJob,
    ErrorOut,
    Failure,
    GroupOut,
    JobOut,
    JobPage,
    LeaseOut,
    LogBody,
    Paused,
    ProgressBody,
    Purge,
    Purged,
    QueueOut,
    Reason,
    Removed,
    ScheduleOut,
    State,
    StatisticsOut,
    Target,
    Touch,
    Value,
    WorkerOut,
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text} for code, text in (
        (400, "DisallowedHost: the Host header names a host this server is not for"),
        (401, "Unauthorized: the server's token is missing"), (403, "ReadOnly, or CrossSiteRequest"),
        (404, "JobNotFound"), (409, "InvalidState, JobExists, LeaseLost"),
        (410, "CorruptJob: the job's file could not be read and was moved to quarantine"),
        (415, "InvalidRequest: not JSON"), (422, "InvalidRequest (bad input: nothing was changed)"),
        (429, "TooManyAttempts: too many wrong tokens from this address; see Retry-After"))
}
router = APIRouter(prefix="/api", responses=_ERRORS)


async def _context(request: Request) -> Context:
    """``ctx`` as a dependency: async, so FastAPI calls it on the loop, not in a worker thread."""
    return ctx(request)


Ctx = Annotated[Context, Depends(_context)]
MAX_WAIT = 300.0  # seconds a long poll may ask for


class ReadOnly(PermissionError):
    """The app serves reads only (``--read-only``)."""


def _writable(c: Context) -> None:
    if c.read_only:
        raise ReadOnly("this server is read-only: it changes nothing in the store")


def _out(job: Job) -> dict[str, Any]:
    return job.to_dict()


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class _Text(str):
    """JSON text already written, in :func:`_encode_deep`'s work list."""


def encode(doc: Any) -> str:
    """``doc`` as JSON, however deeply a job file nests its request, value or targets. The
    store accepts ``MAX_NESTING`` levels, which pydantic's serialiser and the C encoder serve;
    a job nested deeper (written before that limit, or by hand) passes Python's recursion limit
    in both, and is written by a loop instead, so it is served rather than answered 500."""
    try:
        return _ENCODER.encode(doc)
    except RecursionError:
        return _encode_deep(doc)


def _encode_deep(doc: Any) -> str:
    out: list[str] = []
    todo: list[Any] = [doc]
    while todo:
        item = todo.pop()
        if type(item) is _Text:
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = [_Text("{")]
            for i, (key, value) in enumerate(item.items()):
                parts += [_Text(("," if i else "") + _ENCODER.encode(str(key)) + ":"), value]
            todo.extend(reversed([*parts, _Text("}")]))
        elif isinstance(item, list | tuple):
            parts = [_Text("[")]
            for i, value in enumerate(item):
                parts += [_Text(","), value] if i else [value]
            todo.extend(reversed([*parts, _Text("]")]))
        else:
            out.append(_ENCODER.encode(item))
    return "".join(out)


def _json(doc: Any, status_code: int = 200) -> Response:
    """An answer of JSON made by :func:`encode`, not by FastAPI's serialiser. Its shape is the
    route's ``response_model`` still: the tests check every answer against the OpenAPI document."""
    return Response(encode(doc), status_code=status_code, media_type="application/json")


# -- jobs -------------------------------------------------------------------------------------------
@router.post("/jobs", status_code=201, response_model=JobOut, tags=["jobs"])
def create_job(body: CreateJob, c: Ctx) -> Response:
    """Create a job (``JobStore.create``); its targets in ``notify`` are queued at once. With a
    ``unique_key`` that a job which is not final holds, that job is the answer (and gets the
    targets). With ``after``, the job is ``deferred`` until those jobs are fulfilled. A create
    that fans out answers its first copy, and every copy gets the targets."""
    _writable(c)
    job = c.store.create(body.request, queue=body.queue, priority=body.priority, delay=body.delay,
                         run_at=body.run_at, max_attempts=body.max_attempts, job_id=body.job_id,
                         timeout=body.timeout, retain=body.retain, unique_key=body.unique_key,
                         after=body.after or None, on_parent_failure=body.on_parent_failure,
                         concurrency_key=body.concurrency_key)
    if body.notify:
        # A create that fanned out made one copy per subscription (a group): each gets the targets
        # (each copy's result is delivered on its own), not only the copy answered here.
        made: tuple[str, ...] = (job.id,)
        if job.topic is not None and job.group is not None:
            made = c.store.get_group(job.group).ids
        for job_id in made:
            for target in body.notify:
                c.store.queue(job_id, target)
    # Answered as is, not validated again against JobOut: the busiest endpoint skips that work
    # (bench/web.py), and the tests check every answer's shape against the OpenAPI document.
    return _json(_out(c.store.get(job.id) if body.notify else job), status_code=201)


@router.post("/groups", status_code=201, response_model=GroupOut, tags=["jobs"])
def create_group(body: CreateGroup, c: Ctx) -> Response:
    """Make several jobs at once, all or none (``JobStore.create_group``)."""
    _writable(c)
    members = [m.model_dump(exclude_defaults=True) for m in body.jobs]
    return _json(_group(c.store.create_group(members, group_id=body.group_id)), status_code=201)


@router.get("/groups/{group_id}", response_model=GroupOut, tags=["jobs"])
def get_group(group_id: str, c: Ctx) -> Response:
    """A group's members as they are now (``JobStore.get_group``)."""
    return _json(_group(c.store.get_group(group_id)))


@router.get("/limits", tags=["limits"])
def list_limits(c: Ctx) -> list[dict[str, Any]]:
    """Every declared limit, and every concurrency key with jobs waiting, with the jobs running and
    waiting under each (``JobStore.limits``); ``rate`` is ``{"starts", "per_seconds"}`` or null,
    as ``fsjobstore limits --json`` shows it."""
    return [{"kind": lim.kind, "name": lim.name, "concurrency": lim.concurrency,
             "rate": None if lim.rate is None else {"starts": lim.rate[0], "per_seconds": lim.rate[1]},
             "running": lim.running, "waiting": lim.waiting}
            for lim in c.store.limits()]


@router.get("/subscriptions", tags=["limits"])
def list_subscriptions(c: Ctx) -> list[dict[str, Any]]:
    """Every subscription (``JobStore.subscriptions``): each gets its own copy, in the queue of its
    name, of every job created into a queue its pattern matches."""
    return [{"name": s.name, "pattern": s.pattern, "since": s.since} for s in c.store.subscriptions()]


def _group(group: Group) -> dict[str, Any]:
    return {"id": group.id, "jobs": [_out(j) for j in group.jobs], "done": group.done}


@router.get("/jobs", response_model=JobPage, tags=["jobs"])
def list_jobs(c: Ctx, state: State | None = None, queue: str | None = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 50, after: str | None = None,
              search: Annotated[str | None, Query(max_length=1000)] = None) -> Response:
    """A page of jobs (``JobStore.jobs``): active, pending in run order, scheduled, then final ones
    newest first; ``after`` is the previous page's ``next``. ``search``: a job's id, or text looked
    for in ids and requests (at most 5,000 jobs a page; ``scanned`` says how many). Each job is
    its file alone: its ``logs``, ``progress`` and ``waiting`` are empty here (``GET
    /api/jobs/{job_id}`` has them)."""
    jobs, nxt, scanned = search_page(c.store, state=state, queue=queue, limit=limit, after=after, search=search)
    return _json({"jobs": [_out(j) for j in jobs], "next": nxt, "scanned": scanned})


@router.get("/jobs/{job_id}", response_model=JobOut, tags=["jobs"])
def get_job(job_id: str, c: Ctx) -> Response:
    """One job, whole: value or error, attempts, progress, logs, targets. 410 ``CorruptJob`` if
    its file cannot be read: the store has moved it to quarantine (a 404 from then on)."""
    return _json(_out(c.store.get(job_id)))


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, tags=["jobs"])
def cancel_job(job_id: str, c: Ctx, body: Reason | None = None) -> Response:
    """Cancel: a waiting job at once, a running one by asking its worker (``cancel_requested``)."""
    _writable(c)
    return _json(_out(c.store.cancel(job_id, body.reason if body else None)))


@router.post("/jobs/{job_id}/retry", response_model=JobOut, tags=["jobs"])
def retry_job(job_id: str, c: Ctx) -> Response:
    """A failed or cancelled job back to pending, with its whole attempt budget."""
    _writable(c)
    return _json(_out(c.store.retry(job_id)))


@router.post("/jobs/{job_id}/fulfill", response_model=JobOut, tags=["jobs"])
def fulfill_job(job_id: str, body: Value, c: Ctx) -> Response:
    """Fulfil a job by id, without its lease (work done elsewhere)."""
    _writable(c)
    c.store.fulfill(job_id, body.value)
    return _json(_out(c.store.get(job_id)))


@router.post("/jobs/{job_id}/queue", response_model=JobOut, tags=["notifications"])
def queue_target(job_id: str, body: Target, c: Ctx) -> Response:
    """Ask for the job's result to be delivered to ``target`` once it is final."""
    _writable(c)
    c.store.queue(job_id, body.target)
    return _json(_out(c.store.get(job_id)))


@router.post("/jobs/{job_id}/unqueue", response_model=Removed, tags=["notifications"])
def unqueue_target(job_id: str, body: Target, c: Ctx) -> dict[str, Any]:
    """Stop waiting to notify ``target``; ``removed`` says whether it was waiting."""
    _writable(c)
    return {"removed": c.store.unqueue(job_id, body.target)}


@router.get("/jobs/{job_id}/wait", response_model=JobOut, tags=["waiting"],
            responses={408: {"model": ErrorOut, "description": "WaitTimeout: not final within timeout"},
                       503: {"model": ErrorOut, "description": "StoreClosed: the server is stopping"}})
async def wait_job(job_id: str, c: Ctx, timeout: Annotated[float, Query(ge=0, le=MAX_WAIT)] = 30.0
                   ) -> Response:
    """Long poll: answers once the job is final (woken by inotify, not by polling), or 408
    ``WaitTimeout`` after ``timeout`` seconds (at most 300); 503 ``StoreClosed`` if the server
    stops meanwhile (ask again)."""
    waiting = asyncio.ensure_future(c.astore.wait(job_id, timeout=timeout))
    stopping = asyncio.ensure_future(c.stopping.wait())
    try:
        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not waiting.done():
            waiting.cancel()
    if not waiting.done() or waiting.cancelled():
        raise StoreClosed("the server is stopping: ask again once it is back")
    return _json(_out(waiting.result()))


@router.get("/jobs/{job_id}/events", tags=["waiting"], response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}},
                             "description": "`job` events (a JobOut each) as it changes; ends when it is final"}})
async def job_events(job_id: str, request: Request, c: Ctx) -> StreamingResponse:
    """Server-sent events: the job's snapshot each time it changes (state, progress, logs), until
    it is final. What the dashboard's job page listens to."""
    first = await c.astore.get(job_id)  # an unknown id is a 404, not an empty stream

    async def stream() -> AsyncIterator[bytes]:
        job, last, quiet = first, "", 0.0
        while True:
            doc = encode(_out(job))
            if doc != last:
                yield f"event: job\ndata: {doc}\n\n".encode()
                last, quiet = doc, 0.0
            elif quiet >= 15.0:
                yield b": still here\n\n"
                quiet = 0.0
            if job.state.is_final or c.stopping.is_set() or await request.is_disconnected():
                return
            await asyncio.sleep(0.5)
            quiet += 0.5
            try:
                job = await c.astore.get(job_id)
            except (JobNotFound, CorruptJob):  # removed (a purge) or quarantined while followed: nothing more
                return

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


# -- HTTP workers -----------------------------------------------------------------------------------
@router.post("/queues/{queue}/lease", response_model=LeaseOut, tags=["http workers"],
             responses={204: {"description": "no job became due within timeout"}})
async def lease_job(queue: str, c: Ctx, response: Response,
                    timeout: Annotated[float, Query(ge=0, le=MAX_WAIT)] = 30.0,
                    lease: Annotated[float, Query(ge=MIN_LEASE, le=MAX_LEASE)] = 60.0) -> Any:
    """Long poll for the queue's next due job, leased to you for ``lease`` seconds (renewed by
    each call on it: touch, progress, log). 204 if none came within ``timeout``."""
    _writable(c)
    got = await c.astore.pull_work(queues=queue, timeout=timeout)
    if got is None:
        return Response(status_code=204)
    handle, held = c.leases.add(got, lease)
    try:
        job = await c.astore.get(got.id)
        return _json({"lease": handle, "token": got.token, "expires_at": held.expires_at, "job": _out(job)})
    except BaseException:
        # The client never hears of this lease (the job could not be read, or it went away):
        # the job goes back now, no attempt counted, not after the lease as a failed attempt.
        c.leases.drop(handle)
        with contextlib.suppress(JobStoreError):
            await asyncio.shield(c.astore.run(got.release))
        raise


@router.post("/leases/{handle}/fulfill", response_model=JobOut, tags=["http workers"])
async def lease_fulfill(handle: str, body: Value, c: Ctx) -> Response:
    """Commit the job's value (409 ``LeaseLost`` if the lease ended: nothing committed)."""
    held = c.leases.get(handle)
    await c.astore.run(held.lease.fulfill, body.value)
    c.leases.drop(handle)
    return _json(_out(await c.astore.get(held.lease.id)))


@router.post("/leases/{handle}/fail", response_model=JobOut, tags=["http workers"])
async def lease_fail(handle: str, body: Failure, c: Ctx) -> Response:
    """Fail the attempt: it runs again after its backoff (or ``delay``) while attempts remain and
    ``retry`` is true; otherwise the job fails for good."""
    held = c.leases.get(handle)
    await c.astore.run(held.lease.fail, body.error, retry=body.retry, delay=body.delay)
    c.leases.drop(handle)
    return _json(_out(await c.astore.get(held.lease.id)))


@router.post("/leases/{handle}/release", response_model=JobOut, tags=["http workers"])
async def lease_release(handle: str, c: Ctx) -> Response:
    """Give the job back untouched (no attempt counted)."""
    held = c.leases.get(handle)
    await c.astore.run(held.lease.release)
    c.leases.drop(handle)
    return _json(_out(await c.astore.get(held.lease.id)))


@router.post("/leases/{handle}/touch", response_model=LeaseOut, tags=["http workers"])
async def lease_touch(handle: str, c: Ctx, body: Touch | None = None) -> Response:
    """Keep the lease (and, with ``extend``, move the job's time limit that far from now)."""
    held = c.leases.touched(handle)
    if body is not None and body.extend is not None:
        await c.astore.run(held.lease.touch, body.extend)
    job = await c.astore.get(held.lease.id)
    return _json({"lease": handle, "token": held.lease.token, "expires_at": held.expires_at, "job": _out(job)})


@router.post("/leases/{handle}/progress", status_code=204, tags=["http workers"])
async def lease_progress(handle: str, body: ProgressBody, c: Ctx) -> Response:
    """Report progress (shown live on the job's page); keeps the lease."""
    held = c.leases.touched(handle)
    await c.astore.run(held.lease.progress, body.done, body.total, body.message)
    return Response(status_code=204)


@router.post("/leases/{handle}/log", status_code=204, tags=["http workers"])
async def lease_log(handle: str, body: LogBody, c: Ctx) -> Response:
    """Add a line to the attempt's log; keeps the lease."""
    held = c.leases.touched(handle)
    await c.astore.run(held.lease.log, body.line)
    return Response(status_code=204)


# -- queues and the store ---------------------------------------------------------------------------
@router.get("/queues", response_model=list[QueueOut], tags=["store"])
def list_queues(c: Ctx) -> list[dict[str, Any]]:
    """Every queue: jobs per state, paused, oldest pending age, counters, the last hour's throughput."""
    return queue_rows(c.store)


@router.post("/queues/{queue}/pause", response_model=Paused, tags=["store"])
def pause_queue(queue: str, c: Ctx) -> dict[str, Any]:
    """Stop every worker on the directory taking this queue's jobs (``changed``: it was not paused)."""
    _writable(c)
    return {"queue": queue, "paused": True, "changed": c.store.pause(queue)}


@router.post("/queues/{queue}/resume", response_model=Paused, tags=["store"])
def resume_queue(queue: str, c: Ctx) -> dict[str, Any]:
    """Undo a pause (``changed``: it was paused)."""
    _writable(c)
    return {"queue": queue, "paused": False, "changed": c.store.resume(queue)}


@router.post("/purge", response_model=Purged, tags=["store"])
def purge(body: Purge, c: Ctx) -> dict[str, Any]:
    """Remove the selected jobs for good (``JobStore.purge``; never a running one). ``dry_run``
    counts what would go."""
    _writable(c)
    if body.older_than is not None and body.older_than < 0:
        raise InvalidRequest("older_than must be at least 0 seconds")
    n = c.store.purge(states=list(body.states), queue=body.queue, older_than=body.older_than, match=body.match,
                      limit=body.limit, dry_run=body.dry_run)
    return {"purged": n, "dry_run": body.dry_run}


@router.get("/statistics", response_model=StatisticsOut, tags=["store"])
def statistics(c: Ctx) -> dict[str, Any]:
    """Counts per state, per queue, notifications waiting, quarantined files, paused queues."""
    s = c.store.statistics()
    return {"pending": s.pending, "scheduled": s.scheduled, "deferred": s.deferred, "active": s.active,
            "fulfilled": s.fulfilled, "failed": s.failed, "cancelled": s.cancelled, "notifications": s.notifications,
            "quarantined": s.quarantined, "pending_by_queue": dict(s.pending_by_queue),
            "oldest_pending_age": s.oldest_pending_age, "paused": sorted(s.paused),
            "by_queue": {q: dict(row) for q, row in s.by_queue.items()},
            "oldest_pending_by_queue": dict(s.oldest_pending_by_queue)}


@router.get("/workers", response_model=list[WorkerOut], tags=["store"])
def workers(c: Ctx) -> list[dict[str, Any]]:
    """The live workers on the directory (any host), as each last published itself."""
    return [{"owner": w.owner, "name": w.name, "host": w.host, "pid": w.pid,
             "queues": None if w.queues is None else list(w.queues), "concurrency": w.concurrency,
             "mode": w.mode, "paused": w.paused, "started_at": w.started_at, "last_heartbeat": w.last_heartbeat,
             "jobs_done": w.jobs_done, "jobs_failed": w.jobs_failed, "current": list(w.current)}
            for w in c.store.workers()]


@router.get("/schedules", response_model=list[ScheduleOut], tags=["store"])
def schedules(c: Ctx) -> list[dict[str, Any]]:
    """The periodic schedules declared in the store, with their newest tick."""
    return [{"name": s.name, "spec": s.spec, "queue": s.queue, "since": s.since, "last_tick": s.last_tick,
             "last_job": s.last_job, "declared_at": s.declared_at} for s in c.store.schedules()]

