"""The kombu transport's bindings, shared by every process on the directory: one file per binding
under ``<store>/contrib/kombu/bindings/`` (FORMAT.md, "Files of the contrib layer")."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from typing import Any

from fsjobstore import JobStore, JobStoreError

from ._contrib_files import ContribDir
from ._stores import queue_name

_BINDING_CAP = 64 * 1024  # a binding file is a few hundred bytes; anything bigger is not ours
_TYPES = frozenset({"direct", "topic", "fanout"})  # the exchange types the transport routes
_SKEW = 5.0  # seconds a touch may seem to come from the future (another host's clock)
LIVE_FOR = 60.0  # seconds a live binding (of an auto-delete queue) lasts without its consumer's touch
TOUCH_EVERY = LIVE_FOR / 4


class Bindings:
    """Every exchange's bindings, one file each under ``<store>/contrib/kombu/bindings/``, read
    again whenever the directory's mtime changes.

    A binding of an auto-delete or exclusive queue (Celery's remote-control and event queues, a
    kombu reply queue) is *live*: it lasts while a consumer of the queue touches its file (every
    15 s), and one untouched for ``LIVE_FOR`` is gone, with the queue's waiting messages, as AMQP
    deletes such a queue when its last consumer goes. Without that, a worker that died would keep
    receiving every broadcast into a queue nobody reads."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._dir = ContribDir(store, "kombu", "bindings")
        self._seen: tuple[int, int] | None = None
        self._all: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @staticmethod
    def _name(exchange: str, routing_key: str, queue: str) -> str:
        return hashlib.sha256(json.dumps([exchange, routing_key, queue]).encode()).hexdigest()[:32] + ".json"

    def add(self, exchange: str, kind: str, routing_key: str, pattern: str, queue: str, *, live: bool) -> None:
        name = self._name(exchange, routing_key, queue)
        if live and any(not b["live"] for b in self.all() if self._name(b["exchange"], b["routing_key"],
                                                                          b["queue"]) == name):
            live = False  # declared durable first: an auto-delete declaration does not make it mortal
        doc = json.dumps({"exchange": exchange, "type": kind, "routing_key": routing_key, "pattern": pattern,
                          "queue": queue, "live": live}).encode()
        # RACE: two binders of the same binding write the same text; either rename wins.
        self._dir.write(name, doc, fsync=True)

    def touch(self, queues: set[str]) -> None:
        """A consumer of ``queues`` is alive: renew their live bindings (making again any that
        were taken for dead while this process was stopped)."""
        for b in self.all():
            if b["live"] and b["queue"] in queues and not self._dir.touch(self._name(b["exchange"], b["routing_key"],
                                                                                      b["queue"])):
                self.add(b["exchange"], b["type"], b["routing_key"], b["pattern"], b["queue"], live=True)

    def remove(self, exchange: str, routing_key: str, queue: str) -> None:
        self._dir.unlink(self._name(exchange, routing_key, queue))

    def remove_queue(self, queue: str) -> None:
        for b in self.all():
            if b["queue"] == queue:
                self.remove(b["exchange"], b["routing_key"], queue)

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            key, names = self._dir.listing(self._seen)
            if names is None:
                return self._all
            found = [doc for name in names if name.endswith(".json") and not name.startswith(".")
                     if (doc := self._read(name)) is not None]
            # RACE: a binding made between the listing's stat and its names is read now and read
            # again next time (the mtime moved on); one made after them moves the mtime too.
            self._seen, self._all = key, found
            return found

    def _read(self, name: str) -> dict[str, Any] | None:
        """One binding, or None for anything that is not one (a planted link, FIFO or junk)."""
        data = self._dir.read(name, _BINDING_CAP)
        try:
            doc = json.loads(data) if data is not None else None
        except (ValueError, RecursionError):
            return None
        keys = ("exchange", "type", "routing_key", "pattern", "queue")
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in keys):
            return None
        if doc["type"] not in _TYPES:
            return None
        return {**{k: doc[k] for k in keys}, "live": doc.get("live") is True}

    def _alive(self, b: dict[str, Any]) -> bool:
        if not b["live"]:
            return True
        touched = self._dir.mtime(self._name(b["exchange"], b["routing_key"], b["queue"]))
        if touched is None:
            return False
        age = time.time() - touched
        fresh = -_SKEW <= age < LIVE_FOR  # a touch far in the future is no consumer's: stale too
        if not fresh:
            # RACE: its consumer may touch it between the stat and the unlink; it then makes the
            # binding again at its next touch, and what was published meanwhile went nowhere, as it
            # would while a consumer that was not there was missed.
            self.remove(b["exchange"], b["routing_key"], b["queue"])
            others = [o for o in self.all() if o["queue"] == b["queue"] and o is not b
                      and (not o["live"] or o["exchange"] != b["exchange"] or o["routing_key"] != b["routing_key"])]
            if not others:  # its last binding: the queue goes, with what waits in it, as AMQP's would
                with contextlib.suppress(JobStoreError):
                    self._store.purge(states=("pending", "scheduled"), queue=queue_name(b["queue"]))
        return fresh

    def sweep(self) -> None:
        """Drop every live binding whose consumer is gone (and its queue's waiting messages), not
        only those of an exchange being published to: a dead worker's remote-control queue
        would otherwise hold its broadcasts, and age the store's oldest pending job, until the next."""
        for b in self.all():
            if b["live"]:
                self._alive(b)

    def table(self, exchange: str) -> list[tuple[str, str, str]]:
        return [(b["routing_key"], b["pattern"], b["queue"]) for b in self.all()
                if b["exchange"] == exchange and self._alive(b)]

    def is_live(self, queue: str) -> bool:
        """Whether ``queue`` is bound live (an auto-delete or exclusive queue)."""
        return any(b["live"] and b["queue"] == queue for b in self.all())

    def kind(self, exchange: str) -> str | None:
        return next((b["type"] for b in self.all() if b["exchange"] == exchange), None)
