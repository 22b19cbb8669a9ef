"""Which store a URL names, one per process and directory, and the store's name for a kombu name."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import logging
import os
import select
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from fsjobstore import JobStore

log = logging.getLogger(__name__)

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


# What a URL's options may set: JobStore's own.
STORE_OPTIONS = ("lease_duration", "heartbeat_interval", "poll_interval", "max_request_bytes", "max_value_bytes",
                 "durable", "group", "lock_takeover", "doorbell", "retain")
# kombu's own transport options (read by kombu, not by the transport), and Redis's that mean
# nothing here, each with what to use instead.
_KOMBU_OPTIONS = frozenset({"max_retries", "interval_start", "interval_step", "interval_max", "polling_interval",
                            "confirm_publish", "client_properties", "body_encoding", "deadletter_queue"})
_INSTEAD = {"visibility_timeout": "a held message is heartbeated; a hung consumer's is taken over after "
                                  "lease_duration without heartbeats",
            "queue_order_strategy": "priorities are always honoured (0-9, higher first)",
            "priority_steps": "priorities are always honoured (0-9, higher first)",
            "sep": "queue names are escaped, not joined", "global_keyprefix": "use another directory"}
_warned: set[str] = set()


def store_options(given: Mapping[str, Any] | None, setting: str) -> dict[str, Any]:
    """The options of ``setting`` (kombu's transport options, Celery's) that are the store's own;
    each of the others that kombu does not read either is named once per process in a warning (a
    typo, a Redis leftover)."""
    given = dict(given or {})
    for key in sorted(set(given) - set(STORE_OPTIONS) - _KOMBU_OPTIONS - _warned):
        _warned.add(key)
        close = difflib.get_close_matches(str(key), STORE_OPTIONS, n=1)
        hint = _INSTEAD.get(key) or (f"did you mean {close[0]!r}? " if close else "") + \
            "the store's options are " + ", ".join(STORE_OPTIONS)
        log.warning("fsjobstore: %s[%r] is ignored: %s", setting, key, hint)
    return {k: v for k, v in given.items() if k in STORE_OPTIONS}


def warn_relative(url: str, path: str) -> None:
    """A relative directory is each process's own: say where it is, and the likely slip."""
    if not os.path.isabs(path) and path not in _warned:
        _warned.add(path)
        log.warning("fsjobstore: %s names %s, relative to this process's working directory; processes started "
                    "elsewhere use another store. An absolute path has three slashes: fsjobstore:///%s",
                    url, os.path.abspath(path), path.lstrip("./"))
