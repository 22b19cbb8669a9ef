"""The kombu transport's bindings, shared by every process on the directory: one file per binding
under ``<store>/contrib/kombu/bindings/`` (FORMAT.md, "Files of the contrib layer")."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from typing import Any

from fsjobstore import JobStore, JobStoreError

from ._contrib_files import contrib_dir, read_file, write_file
from ._stores import queue_name

_BINDING_CAP = 64 * 1024  # a binding file is a few hundred bytes; anything bigger is not ours
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
        self._dir = os.path.join(store.path, "contrib", "kombu", "bindings")
        self._seen: tuple[int, int] | None = None
        self._all: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def _file(self, exchange: str, routing_key: str, queue: str) -> str:
        digest = hashlib.sha256(json.dumps([exchange, routing_key, queue]).encode()).hexdigest()[:32]
        return os.path.join(self._dir, f"{digest}.json")

    def add(self, exchange: str, kind: str, routing_key: str, pattern: str, queue: str, *, live: bool) -> None:
        contrib_dir(self._store, "kombu", "bindings")
        doc = json.dumps({"exchange": exchange, "type": kind, "routing_key": routing_key, "pattern": pattern,
                          "queue": queue, "live": live}).encode()
        # RACE: two binders of the same binding write the same text; either rename wins.
        write_file(self._store, self._file(exchange, routing_key, queue), doc, fsync=True)

    def touch(self, queues: set[str]) -> None:
        """A consumer of ``queues`` is alive: renew their live bindings (making again any that
        were taken for dead while this process was stopped)."""
        for b in self.all():
            if b["live"] and b["queue"] in queues:
                try:
                    os.utime(self._file(b["exchange"], b["routing_key"], b["queue"]))
                except FileNotFoundError:
                    self.add(b["exchange"], b["type"], b["routing_key"], b["pattern"], b["queue"], live=True)

    def remove(self, exchange: str, routing_key: str, queue: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file(exchange, routing_key, queue))

    def remove_queue(self, queue: str) -> None:
        for b in self.all():
            if b["queue"] == queue:
                self.remove(b["exchange"], b["routing_key"], queue)

    def all(self) -> list[dict[str, Any]]:
        try:
            st = os.stat(self._dir)
        except FileNotFoundError:
            return []
        with self._lock:
            if self._seen == (st.st_mtime_ns, st.st_ino):
                return self._all
            found = []
            for name in os.listdir(self._dir):
                if name.endswith(".json") and (doc := self._read(os.path.join(self._dir, name))) is not None:
                    found.append(doc)
            # RACE: a binding made between the stat and the listing is read now and read again next
            # time (the mtime moved on); one made after the listing moves the mtime too.
            self._seen, self._all = (st.st_mtime_ns, st.st_ino), found
            return found

    @staticmethod
    def _read(path: str) -> dict[str, Any] | None:
        """One binding, or None for anything that is not one (a planted link, FIFO or junk)."""
        data = read_file(path, _BINDING_CAP)
        try:
            doc = json.loads(data) if data is not None else None
        except ValueError:
            return None
        keys = ("exchange", "type", "routing_key", "pattern", "queue")
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in keys):
            return None
        return {**{k: doc[k] for k in keys}, "live": doc.get("live") is True}

    def _alive(self, b: dict[str, Any]) -> bool:
        if not b["live"]:
            return True
        path = self._file(b["exchange"], b["routing_key"], b["queue"])
        try:
            fresh = time.time() - os.stat(path).st_mtime < LIVE_FOR
        except FileNotFoundError:
            return False
        if not fresh:
            # RACE: its consumer may touch it between the stat and the unlink; it then makes the
            # binding again at its next touch, and what was published meanwhile went nowhere, as it
            # would while a consumer that was not there was missed.
            self.remove(b["exchange"], b["routing_key"], b["queue"])
            with contextlib.suppress(JobStoreError):
                self._store.purge(states=("pending", "scheduled"), queue=queue_name(b["queue"]))
        return fresh

    def table(self, exchange: str) -> list[tuple[str, str, str]]:
        return [(b["routing_key"], b["pattern"], b["queue"]) for b in self.all()
                if b["exchange"] == exchange and self._alive(b)]

    def is_live(self, queue: str) -> bool:
        """Whether ``queue`` is bound live (an auto-delete or exclusive queue)."""
        return any(b["live"] and b["queue"] == queue for b in self.all())

    def kind(self, exchange: str) -> str | None:
        return next((b["type"] for b in self.all() if b["exchange"] == exchange), None)
