"""One small adapter per queue under test, so every workload drives them all the same way.

Each adapter is used the way its own documentation shows: a producer call, and a worker that
claims one item, does nothing, and completes it. Where a library has no acknowledgement (huey's
storages and diskcache's Deque delete on dequeue), "claim and complete" is that one call, and
the table says the item is lost if the worker dies holding it.

``durable`` selects each library's own fsync option. Where there is none the adapter says so:
``fsync`` is True (always syncs), False (never does) or "option" (it has a switch). A queue whose
``records_durability`` is true fixes the setting when it is made (an fsjobstore store refuses
durable=False once made durable): every open of one directory must then pass the same setting,
which :func:`fill` does.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Any


class Adapter:
    name = ""
    mp_safe = True  # may several processes share the queue?
    fsync: bool | str = "option"
    acks = True  # does completing differ from claiming (is an item safe while worked on)?
    records_durability = False  # is ``durable`` fixed when the queue is made (then pass it to every open)?
    note = ""  # how items are claimed and completed (the drain tables)
    put_note = ""  # how an item is added (the enqueue tables)

    def __init__(self, path: str, durable: bool) -> None:
        self.path = path
        self.durable = durable
        self.claimed_at = 0.0  # monotonic time the last take() held its item (for W3)

    def put(self, i: int) -> None:
        raise NotImplementedError

    def take(self) -> int | None:
        """Claim one item, complete it, and return its number; None when the queue looks empty."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def _payload(i: int) -> dict[str, Any]:
    return {"i": i, "payload": "x" * 50}


def _blob(i: int) -> bytes:
    return json.dumps(_payload(i)).encode()


class FsJobStore(Adapter):
    name = "fsjobstore"
    records_durability = True
    note = "claim = rename into active/, complete = fulfil (the result is kept)"
    put_note = "create = write a temp file, rename it into pending/<queue>/ (fsync of file and directory when durable)"

    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        from fsjobstore import JobStore

        self.store = JobStore(path, durable=durable)

    def put(self, i: int) -> None:
        self.store.create(_payload(i))

    def take(self) -> int | None:
        return self.wait_take(0)

    def wait_take(self, timeout: float) -> int | None:
        """Block (inotify, then a rescan every poll_interval) until an item arrives; 0 never waits."""
        lease = self.store.pull_work(timeout=timeout)
        if lease is None:
            return None
        self.claimed_at = time.monotonic()
        lease.fulfill(b"")
        return int(lease.request["i"])

    def close(self) -> None:
        self.store.close()


class Dirq(Adapter):
    name = "dirq"
    fsync = False
    note = "QueueSimple; lock = link, remove = two unlinks; no fsync option"
    put_note = "QueueSimple add = write a temp file, rename it into place; no fsync option"

    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        from dirq.QueueSimple import QueueSimple

        self.q = QueueSimple(path)
        self._names: list[str] = []

    def put(self, i: int) -> None:
        self.q.add(_blob(i))

    def take(self) -> int | None:
        for _ in range(2):  # the names we listed, then one fresh listing
            while self._names:
                name = self._names.pop()
                if self.q.lock(name):
                    self.claimed_at = time.monotonic()
                    data = self.q.get(name)
                    self.q.remove(name)
                    return int(json.loads(data)["i"])
            self._names = list(self.q)[::-1]
        return None


class PersistQueue(Adapter):
    name = "persist-queue"
    mp_safe = False  # get() selects then updates under a thread lock only
    fsync = True  # SQLite WAL with the default synchronous=FULL: no switch
    note = "SQLiteAckQueue get+ack; one process only (its lock is a thread lock)"
    put_note = "SQLiteAckQueue put = one INSERT, committed (always fsyncs)"

    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        import persistqueue

        self._empty = persistqueue.Empty
        self.q = persistqueue.SQLiteAckQueue(path, multithreading=True)

    def put(self, i: int) -> None:
        self.q.put(_payload(i))

    def take(self) -> int | None:
        try:
            item = self.q.get(block=False)
        except self._empty:
            return None
        self.claimed_at = time.monotonic()
        self.q.ack(item)
        return int(item["i"])

    def close(self) -> None:
        self.q.close()


class HueySqlite(Adapter):
    name = "huey-sqlite"
    acks = False
    note = "SqliteStorage enqueue/dequeue; fsync=True|False"
    put_note = "SqliteStorage enqueue = one INSERT; fsync=True or False"

    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        from huey.storage import SqliteStorage

        os.makedirs(path, exist_ok=True)
        self.s = SqliteStorage(name="bench", filename=os.path.join(path, "huey.db"), fsync=durable)

    def put(self, i: int) -> None:
        self.s.enqueue(_blob(i))

    def take(self) -> int | None:
        data = self.s.dequeue()
        self.claimed_at = time.monotonic()
        return None if data is None else int(json.loads(bytes(data))["i"])

    def close(self) -> None:
        self.s.close()


class HueyFile(Adapter):
    name = "huey-file"
    acks = False
    fsync = False
    note = "FileStorage (flock around every call; lists the queue per dequeue); no fsync option"
    put_note = "FileStorage enqueue = one file written under its flock; no fsync option"

    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        from huey.storage import FileStorage

        self.s = FileStorage(name="bench", path=path)

    def put(self, i: int) -> None:
        self.s.enqueue(_blob(i))

    def take(self) -> int | None:
        data = self.s.dequeue()
        self.claimed_at = time.monotonic()
        return None if data is None else int(json.loads(data)["i"])


class LiteQueue(Adapter):
    name = "litequeue"
    fsync = False  # sets synchronous=NORMAL (WAL) itself: no switch
    note = "pop + done; synchronous=NORMAL is hard-wired"
    put_note = "put = one INSERT; synchronous=NORMAL is hard-wired"

    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        from litequeue import LiteQueue as LQ

        os.makedirs(path, exist_ok=True)
        self.q = LQ(os.path.join(path, "lq.db"), timeout=30)

    def put(self, i: int) -> None:
        self.q.put(json.dumps(_payload(i)))

    def take(self) -> int | None:
        msg = self.q.pop()
        if msg is None:
            return None
        self.claimed_at = time.monotonic()
        self.q.done(msg.message_id)
        return int(json.loads(msg.data)["i"])

    def close(self) -> None:
        self.q.close()


class DiskcacheDeque(Adapter):
    name = "diskcache"
    acks = False
    note = "Deque append/popleft; durable = sqlite_synchronous=2 (FULL)"
    put_note = "Deque append = one INSERT; durable = sqlite_synchronous=2 (FULL)"

    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        from diskcache import Cache, Deque

        self.cache = Cache(path, sqlite_synchronous=2 if durable else 1, timeout=60)
        self.d = Deque.fromcache(self.cache)

    def put(self, i: int) -> None:
        self.d.append(_payload(i))

    def take(self) -> int | None:
        try:
            item = self.d.popleft()
        except IndexError:
            return None
        self.claimed_at = time.monotonic()
        return int(item["i"])

    def close(self) -> None:
        self.cache.close()


ADAPTERS: dict[str, type[Adapter]] = {
    a.name: a for a in (FsJobStore, Dirq, PersistQueue, HueySqlite, HueyFile, LiteQueue, DiskcacheDeque)
}


def has_durable_mode(cls: type[Adapter]) -> bool:
    return cls.fsync is not False


def fill(cls: type[Adapter], path: str, n: int, durable: bool) -> None:
    """Put items 0 .. n-1, for a drain that opens the queue with ``durable``. Filling is not what
    is measured, so it runs without fsync, except where the queue records its durability when
    made: then it is made with the drain's setting (and fills at that setting's speed)."""
    q = cls(path, durable if cls.records_durability else False)
    try:
        for i in range(n):
            q.put(i)
    finally:
        q.close()


def take_until_idle(q: Adapter, start: Any) -> tuple[list[int], float, int]:
    """The drains' loop: wait for ``start``, take items until two empty looks in a row (others
    may still be committing); (items taken, monotonic end, errors). Used by W2/W4's worker
    processes and by W7's bare loop in threads."""
    taken: list[int] = []
    errors = 0
    start.wait()
    idle = 0
    while idle < 2:
        try:
            i = q.take()
        except Exception:  # lock contention in SQLite peers ("database is locked"): count, retry
            errors += 1
            time.sleep(0.001)
            continue
        if i is None:
            idle += 1
            continue
        idle = 0
        taken.append(i)
    return taken, time.monotonic(), errors


def tally(results: list[tuple[list[int], float, int]], n: int, t0: float) -> tuple[float, int, int, int]:
    """(items/s, duplicates, losses, errors) of a drain of items 0 .. n-1 that started at ``t0``,
    from what each of its workers returned (``take_until_idle``)."""
    counts = Counter(i for taken, _, _ in results for i in taken)
    dups = sum(c - 1 for c in counts.values() if c > 1)
    lost = sum(1 for i in range(n) if i not in counts)
    return n / (max(f for _, f, _ in results) - t0), dups, lost, sum(e for _, _, e in results)
