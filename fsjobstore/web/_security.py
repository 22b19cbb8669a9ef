"""Who may do what: the access token, cross-site request forgery, and the headers every answer
carries.

- **Token.** Without one, the app serves whoever reaches it (``fsjobstore web`` refuses to bind
  anything but loopback then). With one, every request but ``/login`` and ``/static`` must show
  it: ``Authorization: Bearer <token>`` (API clients, Prometheus), or the cookie a browser gets
  from ``/login`` or from opening the URL ``fsjobstore web`` prints (``/?token=...``, as Jupyter
  does). The cookie holds an HMAC of the token, not the token.
- **Cross-site requests.** Every request that changes something is a POST. A page's form carries
  a CSRF token (an HMAC of a random per-browser value kept in a ``SameSite=Strict`` cookie, under
  the app's secret); the JSON API takes ``application/json`` bodies only, which no cross-site form
  can send without a CORS preflight this app never grants. Either way, a request whose
  ``Origin`` (or, without one, ``Referer``) names another site is refused.
- **Headers.** A Content-Security-Policy that allows only this app's own scripts and styles (no
  inline script: a job's text can never run, even if escaping failed), no framing, no sniffing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

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


class Guard:
    """The app's secret and access token, and the checks made with them."""

    def __init__(self, token: str | None) -> None:
        if token is not None and (not isinstance(token, str) or len(token) < 8 or not token.isprintable()
                                  or any(c.isspace() for c in token)):
            raise ValueError("the access token must be a printable string of at least 8 characters, without spaces")
        self.token = token
        self._secret = secrets.token_bytes(32)

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
    True when it says nothing (curl, a Prometheus scraper) or names this host."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or (source == "null" and "origin" not in request.headers):
        return True
    if source == "null":
        return False  # a sandboxed or file: page
    parts = urlsplit(source)
    host = request.headers.get("host", "")
    return parts.scheme in ("http", "https") and parts.netloc == host
