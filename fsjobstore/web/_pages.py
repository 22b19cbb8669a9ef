"""The dashboard: server-rendered pages (Jinja2, autoescaped), a little script of our own for live
updates, and every action a POST form carrying a CSRF token (``_security``).

Pages: the overview (queues, workers, schedules; its middle part is fetched again every few
seconds), the jobs table (by state and queue, searched, a page at a time), a job (updated live
from ``/api/jobs/{id}/events``), the create form, and purge (a dry run first, then a confirm).
With ``read_only`` no form is shown and every POST answers 403.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from .. import InvalidRequest, JobNotFound, JobState, JobStore, JobStoreError, ScheduleInfo, check_queue_name
from ._context import Context, ctx, queue_rows, search_page
from ._security import CSRF_FIELD, SESSION_COOKIE, same_origin
from ._views import FILTERS, age, when

router = APIRouter(include_in_schema=False)
env = Environment(loader=PackageLoader("fsjobstore.web", "templates"), autoescape=select_autoescape(default=True))
env.filters.update(FILTERS)
STATES = [s.value for s in JobState]
PAGE = 50
_AGE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)\Z")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def warm_up(store: JobStore) -> None:
    """What a server's first request would otherwise pay for: every template compiled, the
    store's statistics and the newest final jobs read once (the newest finished-index bucket's
    names are then sorted and cached, see ``_buckets.FinishedLists``)."""
    for name in env.list_templates(extensions=["html"]):
        env.get_template(name)
    store.statistics()
    store.counters()
    next(store.jobs(state=JobState.FULFILLED, limit=1), None)


class CrossSiteRequest(PermissionError):
    """A form posted from another site, or without this browser's CSRF token."""


def render(request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
    c = ctx(request)
    page = env.get_template(template).render(
        request=request, title=c.title, read_only=c.read_only, path=c.store.path,
        csrf=getattr(request.state, "csrf", ""), csrf_field=CSRF_FIELD, message=_banner(request),
        base=base_of(request),
        states=STATES, **values)
    return HTMLResponse(page, status_code=status)


async def _form(request: Request) -> dict[str, str]:
    """The posted form, once its origin and CSRF token are checked (and the app is writable)."""
    c = ctx(request)
    if c.read_only:
        raise PermissionError("this server is read-only: it changes nothing in the store")
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    if not same_origin(request) or not c.guard.csrf_ok(request, fields.get(CSRF_FIELD)):
        raise CrossSiteRequest("this form did not come from this dashboard (a missing or stale CSRF token): "
                               "reload the page and try again")
    return fields


def base_of(request: Request) -> str:
    """Where the app is mounted ("" at the root): every link, form and redirect starts with it."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


# What an action's redirect may say at the top of the next page, by code (``?done=<code>``): a
# link with free text in it would let any page make the dashboard say anything. ``{q}`` is a
# queue name and ``{n}`` a count, each shown only when it is one.
BANNERS = {
    "created": "Job created.",
    "cancelled": "Job cancelled.",
    "stop-asked": "The job was asked to stop: it ends cancelled once its worker stops it.",
    "retried": "The job will run again.",
    "paused": "Queue {q} paused.",
    "resumed": "Queue {q} resumed.",
    "purged": "Purged {n} job(s).",
}


def _banner(request: Request) -> str | None:
    """The banner ``?done=`` asks for, or None for a code that is not one of :data:`BANNERS`,
    or whose queue or count is not one."""
    params = request.query_params
    text = BANNERS.get(params.get("done", ""))
    if text is None:
        return None
    q, n = params.get("q", ""), params.get("n", "")
    if ("{q}" in text and not _is_queue(q)) or ("{n}" in text and not (n.isascii() and n.isdigit() and len(n) < 12)):
        return None
    return text.format(q=q, n=n)


def _is_queue(name: str) -> bool:
    try:
        check_queue_name(name)
    except JobStoreError:
        return False
    return True


def _back(request: Request, to: str, done: str, **params: str) -> RedirectResponse:
    assert done in BANNERS, done
    sep = "&" if "?" in to else "?"
    return RedirectResponse(f"{base_of(request)}{to}{sep}{urlencode({'done': done, **params})}", status_code=303)


def _seconds(text: str, what: str) -> float | None:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w``; blank is None."""
    text = text.strip()
    if not text:
        return None
    m = _AGE_RE.match(text)
    if not m:
        raise InvalidRequest(f"{what} must be a number of seconds or like 90s, 15m, 12h, 7d, 2w; got {text!r}")
    return float(m[1]) * _UNITS[m[2]]


def _int(text: str, what: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(f"{what} must be a whole number, got {text!r}") from None


# -- pages ------------------------------------------------------------------------------------------
@router.get("/", response_class=HTMLResponse)
def overview(request: Request) -> HTMLResponse:
    return render(request, "overview.html", **_overview(ctx(request)))


@router.get("/partials/overview", response_class=HTMLResponse)
def overview_part(request: Request) -> HTMLResponse:
    return render(request, "_overview.html", **_overview(ctx(request)))


def _overview(c: Context) -> dict[str, Any]:
    stats = c.store.statistics()
    now = time.time()
    return {"stats": stats, "queues": queue_rows(c.store, stats), "workers": c.store.workers(),
            "schedules": [_schedule(s, now) for s in c.store.schedules()], "now": now, "durable": c.store.durable,
            "keep": "forever" if math.isinf(c.store.retain) else age(c.store.retain)}


def _schedule(info: ScheduleInfo, now: float) -> dict[str, Any]:
    """A schedule as the overview shows it: its timing in words, its last and next tick."""
    from ..schedule import timing_of

    try:
        nxt: float | None = timing_of(info.spec).next_after(max(now, info.last_tick or 0))
    except (InvalidRequest, ModuleNotFoundError):  # a spec of a later version; cron without cronsim
        nxt = None
    spec = info.spec
    m = re.fullmatch(r"every (\d+)s(?: from (\d+))?", spec)
    if m:
        spec = f"every {age(int(m[1]))}" + (f" from {when(float(m[2]))}" if m[2] else "")
    return {"name": info.name, "spec": spec, "queue": info.queue, "last_tick": info.last_tick,
            "last_job": info.last_job, "next_tick": nxt}


@router.get("/jobs", response_class=HTMLResponse)
def jobs(request: Request, state: str = "", queue: str = "", q: str = "", after: str = "") -> Response:
    c = ctx(request)
    if state and state not in STATES:
        raise InvalidRequest(f"no state {state!r}: use one of {', '.join(STATES)}")
    if q and not after:  # an id: straight to its page
        try:
            job = c.store.get(q.strip())
        except (InvalidRequest, JobNotFound):
            pass
        else:
            return RedirectResponse(f"{base_of(request)}/jobs/{job.id}", status_code=303)
    page, nxt, scanned = search_page(c.store, state=state or None, queue=queue or None, limit=PAGE,
                                     after=after or None, search=q or None)
    queues = sorted(set(c.store.statistics().by_queue))
    return render(request, "jobs.html", jobs=page, next=nxt, scanned=scanned, state=state, queue=queue, q=q,
                  after=after, queues=queues, now=time.time(),
                  next_url="/jobs?" + urlencode({k: v for k, v in (("state", state), ("queue", queue), ("q", q),
                                                                    ("after", nxt or "")) if v}))


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str) -> HTMLResponse:
    job = ctx(request).store.get(job_id)
    return render(request, "job.html", job=job, doc=job.to_dict(), now=time.time())


@router.get("/new", response_class=HTMLResponse)
def new_form(request: Request, queue: str = "default") -> HTMLResponse:
    if ctx(request).read_only:
        return render(request, "read_only.html", what="create jobs")
    return render(request, "new.html", form={"queue": queue, "request": "{}", "priority": "0"}, error=None)


@router.post("/new", response_model=None)
async def new_job(request: Request) -> Response:
    fields = await _form(request)
    c = ctx(request)
    try:
        try:
            body = json.loads(fields.get("request", ""))
        except ValueError as exc:
            raise InvalidRequest(f"the request is not JSON: {exc}") from None
        job = c.store.create(body, queue=fields.get("queue", "default").strip() or "default",
                             priority=_int(fields.get("priority", ""), "priority") or 0,
                             delay=_seconds(fields.get("delay", ""), "delay"),
                             max_attempts=_int(fields.get("max_attempts", ""), "max attempts"),
                             timeout=_seconds(fields.get("timeout", ""), "timeout"),
                             job_id=fields.get("job_id", "").strip() or None)
    except JobStoreError as exc:  # shown on the form, with what was typed
        return render(request, "new.html", status=422, form=fields, error=f"{type(exc).__name__}: {exc}")
    return _back(request, f"/jobs/{job.id}", "created")


@router.post("/jobs/{job_id}/{action}", response_model=None)
async def job_action(request: Request, job_id: str, action: str) -> Response:
    fields = await _form(request)
    store = ctx(request).store
    if action == "cancel":
        job = store.cancel(job_id, fields.get("reason") or None)
        done = "cancelled" if job.state is JobState.CANCELLED else "stop-asked"
    elif action == "retry":
        store.retry(job_id)
        done = "retried"
    else:
        raise JobNotFound(f"no action {action!r}")
    return _back(request, f"/jobs/{job_id}", done)


@router.post("/queues/{queue}/{action}", response_model=None)
async def queue_action(request: Request, queue: str, action: str) -> Response:
    await _form(request)
    store = ctx(request).store
    if action == "pause":
        store.pause(queue)
    elif action == "resume":
        store.resume(queue)
    else:
        raise JobNotFound(f"no action {action!r}")
    return _back(request, "/", f"{action}d", q=queue)


@router.get("/purge", response_class=HTMLResponse)
def purge_form(request: Request, queue: str = "") -> HTMLResponse:
    if ctx(request).read_only:
        return render(request, "read_only.html", what="purge jobs")
    return render(request, "purge.html", form={"queue": queue, "states": ["fulfilled", "failed", "cancelled"]},
                  count=None, error=None)


@router.post("/purge", response_model=None)
async def purge(request: Request) -> Response:
    fields = await _form(request)
    form = await request.form()
    states = [s for s in form.getlist("states") if isinstance(s, str)]
    shown = dict(fields, states=states)
    store = ctx(request).store
    try:
        if not states:
            raise InvalidRequest("choose at least one state to purge")
        queue = fields.get("queue", "").strip() or None
        older_than = _seconds(fields.get("older_than", ""), "older than")
        match = fields.get("match") or None
        dry_run = fields.get("confirm") != "yes"  # first a dry run: say how many would go, and ask
        # Confirmed: never more than were counted (jobs that matched since are left for another purge).
        limit = None if dry_run else _int(fields.get("counted", ""), "counted")
        n = store.purge(states=states, queue=queue, older_than=older_than, match=match, dry_run=dry_run,
                        limit=limit)
        if dry_run:
            return render(request, "purge.html", form=shown, count=n, error=None)
    except JobStoreError as exc:
        return render(request, "purge.html", status=422, form=shown, count=None, error=f"{type(exc).__name__}: {exc}")
    return _back(request, "/", "purged", n=str(n))


# -- signing in (only when a token is set) ----------------------------------------------------------
@router.get("/login", response_class=HTMLResponse, response_model=None)
def login_form(request: Request) -> Response:
    if ctx(request).guard.token is None:
        return RedirectResponse(f"{base_of(request)}/", status_code=303)  # nothing to sign in to
    return render(request, "login.html", error=None)


@router.post("/login", response_model=None)
async def login(request: Request) -> Response:
    c = ctx(request)
    form = await request.form()
    given = form.get("token")
    if not same_origin(request) or not isinstance(given, str) or not c.guard.token_matches(given):
        return render(request, "login.html", status=403, error="that is not this server's token")
    response = RedirectResponse(f"{base_of(request)}/", status_code=303)
    response.set_cookie(SESSION_COOKIE, c.guard.session_value(), httponly=True, samesite="strict")
    return response


@router.get("/api/docs", response_class=HTMLResponse)
def docs(request: Request) -> HTMLResponse:
    spec = request.app.openapi()
    ops = []
    for path, methods in spec.get("paths", {}).items():
        for method, op in methods.items():
            ops.append({"method": method.upper(), "path": path, "summary": op.get("summary", ""),
                        "doc": op.get("description", ""), "tags": op.get("tags", []),
                        "params": op.get("parameters", []),
                        "body": op.get("requestBody", {}).get("content", {}).get("application/json", {})
                        .get("schema", {}).get("$ref", "").rsplit("/", 1)[-1],
                        "responses": sorted(op.get("responses", {}))})
    return render(request, "docs.html", ops=ops, schemas=spec.get("components", {}).get("schemas", {}))
