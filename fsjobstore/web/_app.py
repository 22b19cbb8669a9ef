"""``create_app(store)``: the dashboard, the JSON API and ``/metrics`` as one ASGI app (FastAPI).

Every request goes through :class:`_Gate` first: the allowed hosts and the access token
(``_security``), a CSRF cookie for the pages' forms, JSON-only and same-origin POSTs for the API,
the security headers, and ``HEAD`` answered as ``GET`` without its body.
Errors of the store become answers by their exception's name (:data:`STATUS`): JSON under
``/api``, a page elsewhere; anything unexpected is logged and answered 500 without its details.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterable
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import (
    MAX_NESTING,
    CorruptJob,
    InvalidRequest,
    InvalidState,
    JobExists,
    JobNotFound,
    JobStore,
    JobStoreError,
    LeaseLost,
    StorageFull,
    StoreClosed,
    ValueTooLarge,
    WaitTimeout,
    __version__,
)
from ..aio import AsyncJobStore
from . import _api, _pages
from ._context import Context
from ._hosts import Hosts, host_of
from ._metrics import registry_for, render
from ._pages import base_of
from ._remote import RemoteLeases
from ._security import CSRF_COOKIE, HEADERS, SESSION_COOKIE, Guard, new_browser_value, same_origin

log = logging.getLogger("fsjobstore.web")

STATUS: list[tuple[type[BaseException], int]] = [
    (JobNotFound, 404), (CorruptJob, 410), (ValueTooLarge, 413), (InvalidRequest, 422), (JobExists, 409),
    (InvalidState, 409), (LeaseLost, 409), (WaitTimeout, 408), (StoreClosed, 503), (StorageFull, 507),
    (_api.ReadOnly, 403), (_pages.CrossSiteRequest, 403), (PermissionError, 403),
]
"""Each error's status, first match wins; any other JobStoreError is a 500 that names it. A
CorruptJob is 410: the store could not read the job's file and moved it to quarantine/ (and
logged that, as a warning); the next request for it finds no such job (404)."""

_OPEN = ("/static/", "/login")  # served without the token
WARM_UP = 2.0  # seconds a server's start waits for its warm-up (_pages.warm_up)


def create_app(store: JobStore | str | os.PathLike[str], *, read_only: bool = False, token: str | None = None,
               title: str | None = None, allowed_hosts: Iterable[str] | str | None = None) -> FastAPI:
    """The app for ``store`` (a :class:`JobStore`, or a path opened with ``create=False`` and
    closed with the app). Mount it in your own ASGI app, or serve it (``fsjobstore web DIR``).

    ``read_only``: no action is offered, and every request that would change the store answers 403;
    a path is opened ``JobStore(read_only=True)``, which changes nothing in the store (pass a
    store opened so to get that guarantee with a ``JobStore`` of your own).
    ``token``: required from every client (a bearer token, or the session cookie ``/login`` sets);
    without one, anyone who reaches the app may use it, so bind it to loopback only.
    ``allowed_hosts``: the names (or addresses) clients reach the app by, beyond ``localhost``,
    ``127.0.0.1``, ``[::1]`` and the address a connection arrived at, which are always answered
    (any port); ``.example.com`` allows that domain and its subdomains, ``*`` any host (only
    behind a proxy that checks ``Host`` itself). A request for another host is refused (400)."""
    hosts = Hosts(allowed_hosts)  # first: a bad entry is refused before the store is opened
    owned = not isinstance(store, JobStore)
    opened = JobStore(os.fspath(store), create=False, read_only=read_only) if not isinstance(store, JobStore) else store
    guard = Guard(token)
    context = Context(store=opened, astore=AsyncJobStore(opened), guard=guard, read_only=read_only,
                      leases=RemoteLeases(), title=title or f"fsjobstore \u00b7 {os.path.basename(opened.path)}",
                      hosts=hosts)
    metrics = registry_for(opened)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        expiry = asyncio.create_task(_expire(context))
        # Warm up before serving, up to WARM_UP seconds (a large store's newest hour of final
        # jobs takes a while to list): past that, serving starts and the warm-up goes on beside.
        warming = asyncio.get_running_loop().run_in_executor(None, _pages.warm_up, opened)
        warming.add_done_callback(_log_warm_up)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(warming), WARM_UP)
        try:
            yield
        finally:
            expiry.cancel()
            context.leases.release_all(opened)
            await context.astore.aclose()
            if owned:
                opened.close()

    app = FastAPI(title="fsjobstore", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="The JSON API of an fsjobstore directory. Errors answer "
                              "`{\"error\": \"<fsjobstore exception>\", \"message\": \"...\"}`.")
    app.state.fsjobstore = context
    app.include_router(_api.router)
    app.include_router(_pages.router)
    app.mount("/static", StaticFiles(directory=str(files("fsjobstore.web") / "static")), name="static")

    @app.get("/metrics", include_in_schema=False)
    def metrics_text() -> Response:
        return PlainTextResponse(render(metrics), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(_Gate, context=context)

    @app.exception_handler(JobStoreError)
    @app.exception_handler(PermissionError)
    async def store_error(request: Request, exc: Exception) -> Response:
        return _error(request, exc)

    @app.exception_handler(RequestValidationError)
    async def bad_input(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return _error(request, InvalidRequest(problems or "the request is not valid"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's json.loads of the body
            return _error(request, InvalidRequest(f"the body nests arrays and objects too deeply to be read; the "
                                                  f"store takes {MAX_NESTING} levels (fsjobstore.MAX_NESTING)"))
        name = {404: "NotFound", 405: "MethodNotAllowed", 413: "ValueTooLarge"}.get(exc.status_code, "HTTPError")
        return _answer(request, exc.status_code, name, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        return _answer(request, 500, type(exc).__name__, "the server failed this request; its log says why")

    return app


def _log_warm_up(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:  # the pages will say it again, to their reader
        log.warning("warming up failed: %s", done.exception())


async def _expire(context: Context) -> None:
    """Fail the attempts of HTTP workers that stopped touching their leases, every second."""
    while True:
        await asyncio.sleep(1.0)
        with contextlib.suppress(Exception):
            await asyncio.get_running_loop().run_in_executor(None, context.leases.expire, context.store)


class _Gate:
    """The gate as plain ASGI middleware, not ``@app.middleware("http")``: Starlette's
    BaseHTTPMiddleware runs each request in a task group behind memory streams, which cost the
    JSON API's creates about a third of the server's CPU (bench/web.py)."""

    def __init__(self, app: ASGIApp, context: Context) -> None:
        self.app, self.context = app, context
        # The largest body worth reading: a value or request at the store's caps, JSON-escaped
        # (base64 makes bytes 4/3 as long), and room for the rest. Anything longer is refused
        # before it is read (by its Content-Length) or as soon as it passes the limit.
        store = context.store
        self.max_body = 2 * max(store.max_value_bytes, store.max_request_bytes) + (1 << 20)

    def _too_big(self, request: Request) -> Response | None:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            return _answer(request, 413, "ValueTooLarge", f"the body is {int(length):,} bytes; this server reads "
                           f"at most {self.max_body:,}")
        return None

    def _counted(self, receive: Receive, request: Request) -> Receive:
        """``receive``, failing once a body without (or beyond) its Content-Length passes the limit."""
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:  # an HTTPException: FastAPI passes it on as it is
                    raise StarletteHTTPException(413, f"the body passed {self.max_body:,} bytes, the most this "
                                                      "server reads")
            return message

        return counted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path = _inner_path(request)
        api = path.startswith("/api/") or path in ("/metrics", "/openapi.json")
        refusal = _wrong_host(self.context, request, api) or _refusal(self.context, request, path, api) \
            or self._too_big(request)
        if refusal is not None:
            await _headers(refusal)(scope, receive, send)
            return
        receive = self._counted(receive, request)
        cookie: bytes | None = None
        if not api:  # the pages' forms carry a CSRF token made from the browser's cookie
            browser = request.cookies.get(CSRF_COOKIE)
            if browser is None:  # its first visit: the cookie is set on this answer
                browser = new_browser_value()
                setter = Response()
                setter.set_cookie(CSRF_COOKIE, browser, httponly=True, samesite="strict")
                cookie = setter.headers["set-cookie"].encode("latin-1")
            request.state.csrf = self.context.guard.csrf_for(browser)
        signing_in = self.context.guard.token is not None and path == "/login" and request.method == "POST"
        head = request.method == "HEAD"
        ended = False

        async def send_with_headers(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in HEADERS.items():
                    headers.setdefault(key, value)
                if cookie is not None:
                    headers.raw.append((b"set-cookie", cookie))
                if signing_in and message["status"] == 403:  # a wrong token (_pages.login)
                    self.context.guard.throttle.failed(_client(request))
            elif head:  # GET's status and headers (its Content-Length too), and no body
                if ended:
                    return
                message, ended = {"type": "http.response.body", "body": b"", "more_body": False}, True
            await send(message)

        async def receive_until_ended() -> Message:
            # A HEAD answered: a streaming route (events) hears that its client left, and stops.
            return {"type": "http.disconnect"} if ended else await receive()

        if head:  # FastAPI's routes answer GET only; HEAD is GET without the body (RFC 9110)
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive_until_ended if head else receive, send_with_headers)


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"


def _wrong_host(c: Context, request: Request, api: bool) -> Response | None:
    """The answer to a request for a host the app is not for (DNS rebinding), or None."""
    host = request.headers.get("host")
    server = request.scope.get("server")
    if c.hosts.allows(host, server[0] if server else None):
        return None
    name = host_of(host or "")
    if host is None:
        text = "a request without a Host header is refused"
    else:
        allow = f"--allowed-host {name}" if name else "--allowed-host NAME"
        text = (f"this server does not answer for the host {host!r}: if clients reach it by that name, start it "
                f"with {allow} (create_app(allowed_hosts=[...]) where it is mounted)")
    # Plain text or JSON, not the error page: an answer to a host not allowed carries nothing
    # of the store, not even its name.
    if api:
        return JSONResponse({"error": "DisallowedHost", "message": text}, status_code=400)
    return PlainTextResponse(f"400 DisallowedHost: {text}\n", status_code=400)


def _refusal(c: Context, request: Request, path: str, api: bool) -> Response | None:
    """The answer to a request the gate stops (no token, too many wrong ones, another site, not
    JSON), or None."""
    if c.guard.token is not None and _shows_a_token(request, path):
        wait = c.guard.throttle.wait(_client(request))
        if wait > 0:  # whatever it shows: a right token must not tell a guesser it was right
            refused = _answer(request, 429, "TooManyAttempts", f"too many wrong tokens from {_client(request)}: "
                              f"try again in {wait:.0f} s", force_json=api)
            refused.headers["Retry-After"] = str(int(wait) + 1)
            return refused
    if not path.startswith(_OPEN) and not c.guard.allowed(request):
        given = request.query_params.get("token")
        if given is not None and c.guard.token_matches(given) and not api:  # the URL `fsjobstore web` prints
            response: Response = RedirectResponse(base_of(request) + path, status_code=303)
            response.set_cookie(SESSION_COOKIE, c.guard.session_value(), httponly=True, samesite="strict")
            return response
        if given is not None or request.headers.get("authorization"):
            c.guard.throttle.failed(_client(request))
        if api or request.method not in ("GET", "HEAD"):
            wrong = "this token is not the server's" if request.headers.get("authorization") else \
                "this server needs its token"
            refused = _answer(request, 401, "Unauthorized", f"{wrong}: Authorization: Bearer <token>", force_json=api)
            refused.headers["WWW-Authenticate"] = 'Bearer realm="fsjobstore"'
            return refused
        return RedirectResponse(base_of(request) + "/login", status_code=303)
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        if not same_origin(request):
            return _answer(request, 403, "CrossSiteRequest", "a request from another site is refused")
        if c.read_only and path != "/login":  # before its body is read: nothing here changes the store
            return _answer(request, 403, "ReadOnly", "this server is read-only: it changes nothing in the store")
        if path.startswith("/api/") and request.headers.get("content-length", "0") != "0" \
                and request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            return _answer(request, 415, "InvalidRequest", "send the body as application/json")  # any case: RFC 9110
    return None


def _shows_a_token(request: Request, path: str) -> bool:
    """Whether the request offers a token to be checked (what a guesser sends)."""
    return (request.headers.get("authorization") is not None or "token" in request.query_params
            or (path == "/login" and request.method == "POST"))


def _headers(response: Response) -> Response:
    for key, value in HEADERS.items():
        response.headers.setdefault(key, value)
    return response


def _error(request: Request, exc: BaseException) -> Response:
    status = next((code for kind, code in STATUS if isinstance(exc, kind)), 500)
    name = type(exc).__name__
    if status == 500:
        log.error("%s %s: %s: %s", request.method, request.url.path, name, exc)
    return _answer(request, status, name, str(exc))


def _inner_path(request: Request) -> str:
    """The path within the app: Starlette's ``scope["path"]`` keeps the prefix of a mount."""
    root, path = request.scope.get("root_path", ""), request.scope["path"]
    return path[len(root):] if root and path.startswith(root) else path  # type: ignore[no-any-return]


def _answer(request: Request, status: int, name: str, message: str, *, force_json: bool = False) -> Response:
    path = _inner_path(request)
    if force_json or path.startswith("/api/") or path in ("/metrics", "/openapi.json"):
        return JSONResponse({"error": name, "message": message}, status_code=status)
    try:
        return _pages.render(request, "error.html", status=status, error=name, text=message)
    except Exception:  # the page itself cannot be drawn (no CSRF state yet): plain text, still no details
        return HTMLResponse(f"<h1>{status}</h1>", status_code=status)

