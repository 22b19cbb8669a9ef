"""Which ``Host`` a server answers: a page on another site whose name is rebound to a loopback
address reaches the port, but still says its own name in ``Host``. Apart from the rest of the
app's checks so that a worker's metrics server, which needs prometheus-client alone, checks
hosts the same way."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_of(netloc: str) -> str | None:
    """The host a ``Host`` header or URL authority names, compared as the allowed hosts are:
    lowercase, no port, brackets or final dot, an IP address in its short form. None when it is
    not a plain ``host[:port]`` (user info, a path, a bad port)."""
    if not netloc or any(c in netloc for c in "@/\\?# \t"):
        return None
    try:
        parts = urlsplit("//" + netloc)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        return None
    return _normal(parts.hostname or "")


def _normal(name: str) -> str | None:
    name = name.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")
    if not name:
        return None
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


class Hosts:
    """The hosts an app answers for: the loopback names, ``allowed`` (names or addresses; ``*``
    any; ``.example.com`` that domain and every name under it), and the address each connection
    arrived at (it cannot be a rebound name)."""

    def __init__(self, allowed: Iterable[str] | str | None = None) -> None:
        if isinstance(allowed, str):
            allowed = [allowed]
        names: set[str] = set(LOOPBACK_NAMES)
        domains: list[str] = []
        wildcard = False
        for entry in allowed or ():
            if not isinstance(entry, str):
                raise ValueError(f"an allowed host must be a str, not {type(entry).__name__}")
            text = entry.strip().lower()
            if text == "*":
                wildcard = True
                continue
            name = _normal(text.removeprefix("."))
            if name is None or any(c in text for c in "@/\\?# \t") or (":" in name and not _is_ip(name)):
                raise ValueError(f"allowed host {entry!r} is not a host name or address (give no scheme or "
                                 "port: any port is accepted)")
            if text.startswith("."):
                domains.append(name)
            else:
                names.add(name)
        self.names, self.domains, self.wildcard = frozenset(names), tuple(domains), wildcard

    def allows(self, host: str | None, server: str | None = None) -> bool:
        """Whether a request with ``Host: host`` is answered; ``server`` is the address the
        connection arrived at (the ASGI scope's ``server``)."""
        if self.wildcard:
            return True
        name = host_of(host) if host is not None else None
        if name is None:
            return False
        if name in self.names or (server is not None and name == _normal(server)):
            return True
        return any(name == d or name.endswith("." + d) for d in self.domains)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True

