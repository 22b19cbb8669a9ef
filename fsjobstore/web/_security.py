"""Who may do what: the hosts the app answers for, the access token, cross-site request forgery,
and the headers every answer carries.

- **Hosts.** The app answers only requests whose ``Host`` names it: the loopback names
  (``localhost``, ``127.0.0.1``, ``[::1]``), the address the connection arrived at, and the
  names given in ``allowed_hosts`` (on any port: an SSH tunnel or a proxy changes it). Any other
  host is refused (400 ``DisallowedHost``) before anything is read, pages, API, ``/metrics`` and
  ``/static`` alike. This closes DNS rebinding: a page on ``evil.example`` whose name is made to
  resolve to 127.0.0.1 reaches the port, but its requests say ``Host: evil.example``. Jupyter
  and Django (``ALLOWED_HOSTS``) check the same way.
- **Token.** Without one, the app serves whoever reaches it (``fsjobstore web`` refuses to bind
  anything but loopback then). With one, every request but ``/login`` and ``/static`` must show
  it: ``Authorization: Bearer <token>`` (API clients, Prometheus), or the cookie a browser gets
  from ``/login`` or from opening the URL ``fsjobstore web`` prints (``/?token=...``, as Jupyter
  does). The cookie holds an HMAC of the token, not the token.
- **Cross-site requests.** Every request that changes something is a POST. A page's form carries
  a CSRF token (an HMAC of a random per-browser value kept in a ``SameSite=Strict`` cookie, under
  the app's secret); the JSON API takes ``application/json`` bodies only, which no cross-site form
  can send without a CORS preflight this app never grants. Either way, a request whose
  ``Origin`` (or, without one, ``Referer``) names another site is refused: it must name the
  host and port the request was sent to, which the host check has already found allowed.
- **Guessing the token.** :class:`Throttle`: after ``FAILURES`` wrong tokens within ``WINDOW``
  seconds from one address (sign-in form, ``?token=``, ``Authorization: Bearer``), that address
  is answered 429 for the rest of the window, whatever it shows.
- **Headers.** A Content-Security-Policy that allows only this app's own scripts and styles (no
  inline script: a job's text can never run, even if escaping failed), no framing, no sniffing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import deque
from urllib.parse import urlsplit

from starlette.requests import Request

log = logging.getLogger("fsjobstore.web")

SESSION_COOKIE = "fsjobstore_session"  # HMAC of the access token (only when a token is set)
CSRF_COOKIE = "fsjobstore_csrf"  # a random value per browser; forms carry its HMAC
CSRF_FIELD = "csrf"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


class Throttle:
    """Wrong tokens counted per client address: after ``FAILURES`` of them within ``WINDOW``
    seconds, that address is refused (:meth:`wait` says how long) until the oldest of them is
    ``WINDOW`` seconds old. Bounded: at most ``ADDRESSES`` addresses are remembered."""

    FAILURES, WINDOW, ADDRESSES = 10, 60.0, 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed: dict[str, deque[float]] = {}

    def wait(self, who: str) -> float:
        """Seconds before ``who`` may try a token again (0: now)."""
        now = time.monotonic()
        with self._lock:
            times = self._failed.get(who)
            if times is None:
                return 0.0
            while times and times[0] <= now - self.WINDOW:
                times.popleft()
            if not times:
                del self._failed[who]
                return 0.0
            return times[0] + self.WINDOW - now if len(times) >= self.FAILURES else 0.0

    def failed(self, who: str) -> None:
        now = time.monotonic()
        with self._lock:
            if who not in self._failed and len(self._failed) >= self.ADDRESSES:
                # Forget the address whose newest failure is oldest: a flood of addresses
                # cannot grow this without bound (each still counts up to its own limit).
                del self._failed[min(self._failed, key=lambda k: self._failed[k][-1])]
            times = self._failed.setdefault(who, deque(maxlen=self.FAILURES))
            times.append(now)
            refused = len(times) == self.FAILURES and times[0] > now - self.WINDOW
        if refused:
            log.warning("%d wrong tokens from %s within %g s: its requests are refused (429) for up to %g s",
                        self.FAILURES, who, self.WINDOW, self.WINDOW)


class Guard:
    """The app's secret and access token, and the checks made with them."""

    def __init__(self, token: str | None) -> None:
        if token is not None and (not isinstance(token, str) or len(token) < 8 or not token.isprintable()
                                  or any(c.isspace() for c in token)):
            raise ValueError("the access token must be a printable string of at least 8 characters, without spaces")
        self.token = token
        self._secret = secrets.token_bytes(32)
        self.throttle = Throttle()

    def _mac(self, what: str, value: str) -> str:
        return hmac.new(self._secret, f"{what}:{value}".encode(), hashlib.sha256).hexdigest()

    # -- the access token ---------------------------------------------------------------------------
    def session_value(self) -> str:
        assert self.token is not None
        return self._mac("session", self.token)

    def token_matches(self, given: str | None) -> bool:
        return self.token is not None and given is not None and hmac.compare_digest(given.encode(),
                                                                                   self.token.encode())

    def allowed(self, request: Request) -> bool:
        """Whether ``request`` shows the access token (always, without one)."""
        if self.token is None:
            return True
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer ") and self.token_matches(auth[7:].strip()):
            return True
        cookie = request.cookies.get(SESSION_COOKIE)
        return cookie is not None and hmac.compare_digest(cookie, self.session_value())

    # -- cross-site requests ------------------------------------------------------------------------
    def csrf_for(self, browser: str) -> str:
        return self._mac("csrf", browser)

    def csrf_ok(self, request: Request, given: str | None) -> bool:
        browser = request.cookies.get(CSRF_COOKIE)
        return bool(browser and given and hmac.compare_digest(given, self.csrf_for(browser)))


def new_browser_value() -> str:
    return secrets.token_urlsafe(24)


def same_origin(request: Request) -> bool:
    """False when the request says it comes from another site (``Origin``, else ``Referer``);
    True when it says nothing (curl, a Prometheus scraper) or names the host and port it was
    sent to. The gate has checked that ``Host`` is one of the allowed hosts before this runs, so
    an ``Origin`` equal to it is an allowed host too; a rebound name never gets this far."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or (source == "null" and "origin" not in request.headers):
        return True
    if source == "null":
        return False  # a sandboxed or file: page
    parts = urlsplit(source)
    host = request.headers.get("host", "")
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower() != ""
