"""``fsjobstore web``: serve a store's dashboard, JSON API and metrics (``fsjobstore.web``) with
uvicorn; and the worker's ``--metrics-port``. Both need the web extra, imported only here."""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import logging
import os
import re
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import quote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ._args import OK, UsageError, log_level, number, store_options, subcommand
from ._terminal import TerminalFormatter, configure_logging, printable

ENV_TOKEN = "FSJOBSTORE_WEB_TOKEN"
ENV_ALLOWED_HOSTS = "FSJOBSTORE_WEB_ALLOWED_HOSTS"
DEFAULT_PORT = 8650
log = logging.getLogger("fsjobstore.web")


def add(subparsers: Any) -> None:
    p = subcommand(subparsers, "web", web, help="serve a store's dashboard, JSON API and Prometheus metrics",
                   example="fsjobstore web ./jobs --port 8650",
                   description="Serve a dashboard (queues, workers, jobs; retry, cancel, pause, purge, create), "
                               "a JSON API (described at /openapi.json and /api/docs) and /metrics for a store, "
                               "until Ctrl-C or SIGTERM (exit 0). Loopback only unless --token is given. Needs "
                               "the web extra: pip install 'fsjobstore[web]'.")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1; any other needs --token)")
    p.add_argument("--port", type=number(low=0, high=65535, integer=True), default=DEFAULT_PORT, metavar="N",
                   help=f"the port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--token", default=None,
                   help=f"required from every client (a bearer token, or the browser signs in once; at least 8 "
                        f"characters); default ${ENV_TOKEN}")
    p.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a name clients reach the server by, besides localhost, 127.0.0.1, [::1] and the address "
                        "it listens on (any port; .example.com: the domain and its subdomains); requests for "
                        f"any other host are refused, against DNS rebinding. Repeatable; default "
                        f"${ENV_ALLOWED_HOSTS} (comma-separated)")
    p.add_argument("--read-only", action="store_true", help="offer no action: the store is only read")
    log_level(p, "default INFO: one line per request")


def web(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    _own_the_log()
    token = args.token if args.token is not None else os.environ.get(ENV_TOKEN) or None
    if token is not None and (len(token) < 8 or not token.isprintable() or any(c.isspace() for c in token)):
        raise UsageError("--token must be at least 8 printable characters, without spaces")
    if not _loopback(args.host) and token is None:
        does = "read" if args.read_only else "read and change"
        raise UsageError(f"listening on {args.host} lets anyone who reaches it {does} the store: give "
                         f"--token (or set {ENV_TOKEN}), or listen on 127.0.0.1 (the default)")
    try:
        import uvicorn

        from ..web import create_app
    except ImportError as exc:
        raise UsageError(f"fsjobstore web needs the web extra: pip install 'fsjobstore[web]' ({exc.name} is "
                         "missing)") from None
    _Server = _server_class()
    sock = _listen(args.host, args.port)
    from .. import JobStore

    allowed = _allowed_hosts(args)
    with JobStore(args.dir, create=False, read_only=args.read_only, **store_options(args)) as store:
        try:
            app = create_app(store, read_only=args.read_only, token=token, allowed_hosts=allowed)
        except ValueError as exc:
            raise UsageError(f"--allowed-host: {exc}") from None
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")
        print(printable(f"fsjobstore web: serving {store.path} at {url}{' (read-only)' if args.read_only else ''}",
                        newlines=False), flush=True)
        log.info("answering requests for localhost, 127.0.0.1, [::1], the address each connection arrives at%s "
                 "(any port); other hosts are refused", "".join(f", {h}" for h in allowed))
        # log_config=None: uvicorn's lines go through our logging, in our format.
        # timeout_graceful_shutdown: a page following a running job keeps its event stream open
        # until the job ends; a stop must not wait for that.
        config = uvicorn.Config(app, log_level=args.log_level.lower(), access_log=args.log_level in ("DEBUG", "INFO"),
                                lifespan="on", log_config=None, timeout_graceful_shutdown=1)
        server = _Server(config)
        server.on_stop = app.state.fsjobstore.stopping.set  # long polls and event streams end at once
        server.run(sockets=[sock])
    return OK


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, stopped by SIGTERM or Ctrl-C (a second one: at once) with exit 0, as
        ``worker`` is; uvicorn's own handlers raise the signal again once it has stopped.
        ``on_stop`` is called on the loop as the stop begins, before open requests are waited for."""

        on_stop: Callable[[], None] = staticmethod(lambda: None)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            self.on_stop()
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            def stop(signum: int, frame: object) -> None:
                if self.should_exit and signum == signal.SIGINT:
                    self.force_exit = True
                self.should_exit = True

            previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _allowed_hosts(args: argparse.Namespace) -> list[str]:
    """--allowed-host (or its environment twin), and the name or address given to --host: a
    browser that opens the URL of that name sends it as the Host."""
    given = args.allowed_host if args.allowed_host is not None else \
        [h for h in re.split(r"[,\s]+", os.environ.get(ENV_ALLOWED_HOSTS, "")) if h]
    bound = [] if args.host in ("0.0.0.0", "::", "") or _loopback(args.host) else [args.host]
    return list(dict.fromkeys([*given, *bound]))


# uvicorn's lines, under this command's names: its start and stop are the web server's.
_RENAMED = {"uvicorn.error": "fsjobstore.web", "uvicorn.asgi": "fsjobstore.web",
            "uvicorn.access": "fsjobstore.web.access"}
_CHATTER = ("Waiting for application startup.", "Waiting for application shutdown.")  # DEBUG, not INFO
_TOKEN_IN_URL = re.compile(r"([?&]token=)[^&\s\"]*")


class _Renamed(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.name = _RENAMED.get(record.name, record.name)
        if record.msg in _CHATTER:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


class _Formatter(TerminalFormatter):
    """What every log line of ``fsjobstore web`` goes through: a request's path may carry
    terminal control characters too (escaped, as every command's lines are), and the token in a
    URL (``/?token=...``, the link the command prints) is replaced by ``[redacted]``."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return _TOKEN_IN_URL.sub(r"\1[redacted]", super().formatMessage(record))


def _own_the_log() -> None:
    for handler in logging.getLogger().handlers:
        old = handler.formatter or logging.Formatter()
        handler.setFormatter(_Formatter(old._fmt, old.datefmt))
    for name in _RENAMED:
        logging.getLogger(name).addFilter(_Renamed())


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, made here so a port in use is one clear line, not a traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is in use: choose another with --port") from None
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def serve_metrics(store: Any, host: str, port: int) -> None:
    """``fsjobstore worker --metrics-port``: the store's metrics on ``http://host:port/metrics``,
    from a thread of the worker's supervisor. Bound to a loopback address (the default), it
    answers only a ``Host`` that names this host, as ``fsjobstore web`` does: a page on another
    site whose name is rebound to 127.0.0.1 reads nothing. Bound to another address it answers
    any name, as Jupyter does for a server listening beyond loopback: the scraper names the host
    as it likes, and such a server is reachable without a browser's help anyway."""
    try:
        from prometheus_client import make_wsgi_app

        from ..web import registry_for
        from ..web._hosts import Hosts
    except ImportError as exc:
        raise UsageError(f"--metrics-port needs the web extra: pip install 'fsjobstore[web]' ({exc.name} is "
                         "missing)") from None
    metrics = make_wsgi_app(registry_for(store))
    hosts = Hosts([host]) if _loopback(host) else Hosts("*")

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if not hosts.allows(environ.get("HTTP_HOST"), host):
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"DisallowedHost: this metrics server answers only its loopback names\n"]
        return metrics(environ, start_response)

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("_MetricsServer", (_ThreadingWSGIServer,), {"address_family": family})
        server: WSGIServer = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    except OSError as exc:
        raise UsageError(f"--metrics-port {port}: cannot listen on {host}:{port}: {exc.strerror}") from None
    threading.Thread(target=server.serve_forever, name="fsjobstore-metrics", daemon=True).start()
    log.info("metrics of %s at http://%s:%d/metrics", store.path, host, port)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds up the worker's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """One line per scrape on stderr is noise in a worker's log."""
