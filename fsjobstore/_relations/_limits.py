"""Declared limits and their start tickets: FORMAT.md, "Limits".

A **limit** caps the jobs of one queue, or of one concurrency key (``create(concurrency_key=)``):
at most ``concurrency`` running at once, and at most ``rate = (n, per)`` starts in any ``per``
seconds. Declarations live in ``control/limits/<H>.json``; ``<H>`` names the limit everywhere on
disk (:func:`limit_name`). A key nobody declared runs one job at a time, as huey's
``lock_task`` does: a concurrency key is a request to be limited.

Rates are kept as ``n`` **start tickets**, ``limits/<H>/r<i>``: a start takes a ticket whose last
start is ``per`` seconds old or more, under an exclusive ``flock`` held while its time is read
and written, so two processes (or two hosts: GlusterFS carries flock between clients) never
spend one ticket twice. The time is the wall clock's, in µs: hosts that share a limit must agree
on the time (NTP), as they already must for ``run_at``. The slots that carry ``concurrency`` are
``_limit_gate``'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .._errors import InvalidRequest
from .._format._layout import LIMIT_RE, Layout
from .._format._values import check_key, check_queue_name, dumps
from .._os import _files as fs
from .._os import _syscalls as sc

KINDS = ("key", "queue")
MAX_CONCURRENCY = 10_000
MAX_RATE = 100_000  # starts per period: each is a file
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE_RE = re.compile(r"\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([smhd])\s*\Z")
_DECL_CAP = 4096
REFRESH = 1.0  # seconds a process trusts the declarations it read (a new limit applies within it)


@dataclass(frozen=True, slots=True)
class Limit:
    """A declared limit (``JobStore.set_limit``), and what holds it now (``JobStore.limits``).

    ``kind`` is ``"key"`` (jobs made with ``concurrency_key=name``) or ``"queue"``. ``concurrency``:
    jobs running at once, None for no cap (a key declared with a rate only). ``rate``: ``(starts,
    per_seconds)``, None for none. ``running``: slots held when read; ``waiting``: jobs that met
    the limit and wait in ``jobs/waiting/`` (a queue's jobs wait in the queue instead: 0)."""

    kind: str
    name: str
    concurrency: int | None
    rate: tuple[int, float] | None
    running: int = 0
    waiting: int = 0

    @property
    def id(self) -> str:
        """``<H>``: the limit's name on disk."""
        return limit_name(self.kind, self.name)


def limit_name(kind: str, name: str) -> str:
    """``<H>``: the first 64 bits of SHA-256 of ``<kind>:<name>``, in hex."""
    return hashlib.sha256(f"{kind}:{name}".encode()).hexdigest()[:16]


def check_target(key: str | None, queue: str | None) -> tuple[str, str]:
    """``(kind, name)`` of ``set_limit(key=...)`` or ``set_limit(queue=...)``: exactly one."""
    if (key is None) == (queue is None):
        raise InvalidRequest("give exactly one of key= (a concurrency key) or queue= (a queue name)")
    if key is not None:
        return "key", check_key(key, "key")
    return "queue", check_queue_name(queue)


def check_concurrency(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise InvalidRequest(f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY:,}; got {value!r}")
    return value


def parse_rate(value: object) -> tuple[int, float] | None:
    """``rate``: None, ``(starts, per_seconds)``, or a string such as ``"10/m"``, ``"3/s"``,
    ``"100/h"``, ``"5/30s"`` (5 starts per 30 seconds)."""
    if value is None:
        return None
    if isinstance(value, str):
        m = _RATE_RE.match(value)
        if m is None:
            raise InvalidRequest(f'rate must look like "10/m" (starts per s, m, h or d; "5/30s" for a span), '
                                 f"or be (starts, seconds); got {value!r}")
        n, span = int(m[1]), float(m[2]) if m[2] else 1.0
        value = (n, span * _UNITS[m[3]])
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidRequest(f"rate must be (starts, seconds) or a string such as \"10/m\"; got {value!r}")
    n, per = value
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_RATE:
        raise InvalidRequest(f"rate must have starts from 1 to {MAX_RATE:,} (a whole number); got {n!r}")
    if isinstance(per, bool) or not isinstance(per, int | float) or not (math.isfinite(per) and 0 < per <= 1e7):
        raise InvalidRequest(f"rate must have a period above 0 seconds (at most 1e7); got {per!r}")
    return n, float(per)


class Declarations:
    """What ``control/limits/`` declares, read at most every ``REFRESH`` seconds. Thread-safe."""

    def __init__(self, layout: Layout, clock: Callable[[], float]) -> None:
        self._layout = layout
        self._clock = clock
        self._mutex = threading.Lock()
        self._read_at = float("-inf")
        self._by_id: dict[str, Limit] = {}
        self._queues: frozenset[str] = frozenset()

    def queues(self) -> frozenset[str]:
        """The queues with a declared limit (a claim from any other needs nothing more)."""
        self._refresh()
        return self._queues

    def get(self, kind: str, name: str) -> Limit | None:
        self._refresh()
        return self._by_id.get(limit_name(kind, name))

    def all(self) -> list[Limit]:
        self.forget()
        self._refresh()
        return sorted(self._by_id.values(), key=lambda lim: (lim.kind, lim.name))

    def forget(self) -> None:
        with self._mutex:
            self._read_at = float("-inf")

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._read_at < REFRESH:
            return
        with self._mutex:
            if now - self._read_at < REFRESH:
                return
            found: dict[str, Limit] = {}
            for entry in fs.scan_names(self._layout.limit_decls):
                m = LIMIT_RE.match(entry)
                limit = read_declaration(self._layout.limit_decl(m["limit"])) if m else None
                if limit is not None and limit.id == m["limit"]:  # type: ignore[index]
                    found[limit.id] = limit
            self._by_id = found
            self._queues = frozenset(lim.name for lim in found.values() if lim.kind == "queue")
            self._read_at = now


def read_declaration(path: str) -> Limit | None:
    """The limit declared at ``path``; None if missing, planted or not one (it is then ignored:
    ``set_limit`` writes it again)."""
    try:
        doc = json.loads(fs.read_regular(path, _DECL_CAP))
        kind, name = doc["kind"], doc["name"]
        if kind not in KINDS:
            return None
        kind, name = check_target(name if kind == "key" else None, name if kind == "queue" else None)
        rate = doc.get("rate")
        return Limit(kind, name, check_concurrency(doc.get("concurrency")),
                     parse_rate(None if rate is None else tuple(rate)))
    except (FileNotFoundError, NotADirectoryError, fs.Unreadable, ValueError, KeyError, TypeError, InvalidRequest):
        return None


def write_declaration(layout: Layout, limit: Limit, *, token: str, durable: bool, perms: fs.Perms,
                      ensure_dir: Callable[[str], None]) -> None:
    """Write (or replace) ``control/limits/<H>.json``: a temp file renamed over it."""
    doc = {"kind": limit.kind, "name": limit.name, "concurrency": limit.concurrency,
           "rate": None if limit.rate is None else list(limit.rate)}
    ensure_dir(layout.limit_decls)
    fs.replace_with(layout.tmp_path(token, "aux", "limit.json"), layout.limit_decl(limit.id),
                    dumps(doc, what="limit") + b"\n", durable=durable, mode=perms.file_mode)


# -- slots (``_liveness.NotifyLock``s whose files stay: ``_limit_gate``) -----------------------------------
def holder_died(fd: int, path: str) -> bool:
    """After a watcher got the lock of slot ``path`` (its descriptor ``fd``): whether the holder
    let go without emptying it, as only a process that died does."""
    try:
        st = sc.fstat(fd)
    except OSError:
        return False
    return st.st_size > 0 and fs.names_file(path, st) is True


# -- start tickets --------------------------------------------------------------------------------
class Ticket:
    """A start ticket held (its flock taken), not yet spent: :meth:`spend` writes the start and
    lets go; :meth:`give_back` lets go, as if never taken."""

    def __init__(self, fd: int, now_us: int) -> None:
        self._fd: int | None = fd
        self._now = now_us

    def spend(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            sc.ftruncate(fd, 0)
            sc.pwrite(fd, f"{self._now}\n".encode(), 0)
        finally:
            _let_go(fd)

    def give_back(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            _let_go(fd)


def _let_go(fd: int) -> None:
    with contextlib.suppress(OSError):
        sc.unlock(fd)
    with contextlib.suppress(OSError):
        sc.close(fd)


def take_ticket(layout: Layout, limit: str, rate: tuple[int, float], now: float, perms: fs.Perms,
                ensure_dir: Callable[[str], None]) -> Ticket | float:
    """A ticket of ``limit`` free to start now, held; or, when all ``n`` were spent less than
    ``per`` seconds ago, the wall time the first of them frees. A ticket another process holds
    this instant is passed over (it is being spent or looked at)."""
    n, per = rate
    directory = layout.limit_dir(limit)
    now_us = int(now * 1_000_000)
    frees = math.inf
    for i in range(n):
        path = f"{directory}/r{i}"
        try:
            fd = fs.open_lock(path, perms)
        except FileNotFoundError:
            ensure_dir(directory)
            fd = fs.open_lock(path, perms)
        except OSError:  # a planted link or directory: that ticket is out of use
            continue
        keep = False
        try:
            if not sc.try_lock(fd):
                continue
            text = sc.pread(fd, 32, 0).strip()
            last = int(text) if text.isdigit() else 0
            if now_us - last >= per * 1_000_000 or last > now_us + per * 1_000_000:
                keep = True  # (a start in the far future: a clock that jumped back; the ticket is free)
                return Ticket(fd, now_us)
            frees = min(frees, last / 1_000_000 + per)
        finally:
            if not keep:
                _let_go(fd)
    return frees if math.isfinite(frees) else now + per


def remove_files(layout: Layout, limit: str) -> None:
    """A cleared limit's tickets and leftover slot files (``clear_limit``): unlinked, then its
    directory if it emptied. Slots held now stay; their holders unlink them as they end."""
    directory = layout.limit_dir(limit)
    for name in fs.scan_names(directory):
        if name.startswith("r"):
            fs.unlink_quietly(os.path.join(directory, name))
    with contextlib.suppress(OSError):
        sc.rmdir(directory)
