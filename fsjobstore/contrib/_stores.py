"""Which store a URL names, one per process and directory, and the store's name for a kombu name."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import threading
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from fsjobstore import JobStore

_KEEP = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")


def queue_name(name: str, *, limit: int = 64) -> str:
    """The store's queue name (or job id, with ``limit=128``) for a kombu queue name: letters,
    digits and ``-`` kept, ``_`` doubled, any other byte ``_`` and two hex digits, so two kombu
    names never share one (``celery@host.celery.pidbox`` -> ``celery_40host_2ecelery_2epidbox``).
    A name that would be ``limit`` or longer keeps its start and ends in a hash of the whole."""
    out = []
    for i, ch in enumerate(name):
        if ch in _KEEP and not (i == 0 and ch == "-"):
            out.append(ch)
        elif ch == "_":
            out.append("__")
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8"))
    text = "".join(out) or "_"
    # An escaped name is shorter than ``limit``; a longer one is cut to exactly ``limit``, so a cut
    # name never equals an escaped one (a name crafted to look cut is escaped, and stays shorter).
    if len(text) >= limit:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        text = f"{text[:limit - 17]}-{digest}"
    return text


def store_path(url_or_path: str) -> str:
    """The directory a ``fsjobstore://`` URL names: everything after ``fsjobstore://``."""
    if "://" not in url_or_path:
        return url_or_path
    scheme, rest = url_or_path.split("://", 1)
    if scheme != "fsjobstore":
        raise ValueError(f"not a fsjobstore URL: {url_or_path!r} (use fsjobstore:///absolute/path)")
    path = unquote(urlsplit("x://" + rest).netloc + urlsplit("x://" + rest).path)
    if not path:
        raise ValueError(f"{url_or_path!r} names no directory: use fsjobstore:///absolute/path "
                         "or fsjobstore://relative/path")
    return path


_STORES: dict[tuple[int, str, str], JobStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(path: str, **options: Any) -> JobStore:
    """This process's store for ``path`` (one per directory and options, shared by every kombu
    connection and result backend of the process; a forked child opens its own)."""
    real = os.path.realpath(os.path.abspath(path))
    key = (os.getpid(), real, json.dumps(options, sort_keys=True, default=str))
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = JobStore(real, **options)
        return store


def wait_readable(fd: int | None, seconds: float) -> None:
    """Sleep until ``fd`` is readable or ``seconds`` pass (poll: select() refuses a descriptor
    numbered 1024 or more, which a process with many open files has)."""
    if fd is None:
        time.sleep(max(seconds, 0.0))
        return
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    with contextlib.suppress(InterruptedError):
        poller.poll(max(seconds, 0.0) * 1000.0)


def close_stores() -> None:
    """Close this process's stores (``store_for``): for a process that is done with them, and
    for tests, each of which uses a directory of its own."""
    with _STORES_LOCK:
        stores = list(_STORES.values())
        _STORES.clear()
    for store in stores:
        with contextlib.suppress(Exception):
            store.close()


def _forget_parents_stores() -> None:
    _STORES.clear()  # the parent's: their threads did not survive the fork


os.register_at_fork(after_in_child=_forget_parents_stores)
