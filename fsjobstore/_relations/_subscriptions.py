"""Subscriptions: FORMAT.md, "Interest and subscriptions".

A **subscription** (``JobStore.subscribe(name, pattern)``), persisted in
``control/subscriptions/<name>.json``, gets its own copy of every job created into a queue its
pattern matches (scope **all**), made while it is declared, whether or not anything works on it
then. The copy is a job of its own, with its own lease, attempts and result, in the queue named as
the subscription: its workers are that queue's. A create that subscriptions fan out makes the
copies all or none (a group, ``_groups``) and no job in the queue it named.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .._errors import InvalidRequest
from .._format._layout import Layout
from .._format._values import QUEUE_PATTERN, check_interest, dumps, matches
from .._os import _files as fs

_NAME_RE = re.compile(rf"(?P<name>{QUEUE_PATTERN})\.json\Z")
_CAP = 4096
REFRESH = 1.0  # seconds a process trusts the subscriptions it read


@dataclass(frozen=True, slots=True)
class Subscription:
    """A persisted interest of scope ``all`` (``JobStore.subscribe``): every job created into a
    queue ``pattern`` matches is copied into the queue ``name``. ``since``: when it was declared."""

    name: str
    pattern: str
    since: float


class Subscriptions:
    """What ``control/subscriptions/`` declares, read at most every ``REFRESH`` seconds (a
    subscription declared in another process applies to this one's creates within it)."""

    def __init__(self, layout: Layout, clock: Callable[[], float]) -> None:
        self._dir = f"{layout.control}/subscriptions"
        self._layout = layout
        self._clock = clock
        self._mutex = threading.Lock()
        self._read_at = float("-inf")
        self._all: list[Subscription] = []

    def path(self, name: str) -> str:
        return f"{self._dir}/{name}.json"

    def matching(self, queue: str) -> list[Subscription]:
        """The subscriptions a job created into ``queue`` is copied for, by name; none for a queue
        that is itself a subscription's (a copy is never copied again)."""
        subs = self.all(fresh=False)
        if any(s.name == queue for s in subs):
            return []
        return [s for s in subs if matches(s.pattern, queue)]

    def all(self, *, fresh: bool = True) -> list[Subscription]:
        now = self._clock()
        with self._mutex:
            if fresh or now - self._read_at >= REFRESH:
                found = []
                for entry in fs.scan_names(self._dir):
                    m = _NAME_RE.match(entry)
                    sub = _read(self.path(m["name"]), m["name"]) if m else None
                    if sub is not None:
                        found.append(sub)
                self._all = sorted(found, key=lambda s: s.name)
                self._read_at = now
            return list(self._all)

    def write(self, sub: Subscription, *, token: str, durable: bool, perms: fs.Perms,
              ensure_dir: Callable[[str], None]) -> None:
        doc = {"name": sub.name, "pattern": sub.pattern, "since": sub.since}
        ensure_dir(self._dir)
        fs.replace_with(self._layout.tmp_path(token, "aux", "subscription.json"), self.path(sub.name),
                        dumps(doc, what="subscription") + b"\n", durable=durable, mode=perms.file_mode)
        self.forget()

    def remove(self, name: str, *, durable: bool) -> bool:
        found = fs.unlink(self.path(name))
        if found:
            fs.sync_applied(self._dir, durable=durable)
        self.forget()
        return found

    def forget(self) -> None:
        with self._mutex:
            self._read_at = float("-inf")


def _read(path: str, name: str) -> Subscription | None:
    """The subscription at ``path``; None if planted, torn or foreign (ignored)."""
    try:
        doc = json.loads(fs.read_regular(path, _CAP))
        if doc["name"] != name or not isinstance(doc["since"], int | float):
            return None
        return Subscription(name, check_interest(doc["pattern"], "pattern"), float(doc["since"]))
    except (FileNotFoundError, NotADirectoryError, fs.Unreadable, ValueError, KeyError, TypeError, InvalidRequest):
        return None
