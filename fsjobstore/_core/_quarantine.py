"""Quarantine: a file the store cannot use is moved aside, never deleted, with a note saying why.

``quarantine/<ns>.<path with / as ~>`` keeps the file, ``... .reason`` a JSON note (``from``,
``reason``, ``at``), as FORMAT.md describes under quarantine/.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

from .._format._layout import Layout
from .._format._values import dumps
from .._os import _files as fs
from .._os import _syscalls as sc

log = logging.getLogger("fsjobstore")
_tally = threading.local()


def made_here() -> int:
    """How many files this thread has moved aside. A recovery pass reports the difference across
    it: its count is then the quarantines it made, whichever of its steps made them (and never
    another thread's, a worker's claim quarantining a file meanwhile)."""
    n: int = getattr(_tally, "n", 0)
    return n


def move_aside(lay: Layout, file_mode: int, path: str, reason: str) -> bool:
    """Move ``path`` into quarantine with a reason file; False if it was already gone (or
    cannot be moved: then it is logged and left). A read-only store leaves it, and says so only
    at debug level: its readers meet the same file at every read, and report it themselves."""
    if sc.only_reading():
        log.debug("left %s where it is (a read-only store quarantines nothing): %s", path, reason)
        return False
    rel = os.path.relpath(path, lay.root).replace(os.sep, "~")
    stamp = f"{time.time_ns():020d}"
    dest = os.path.join(lay.quarantine, f"{stamp}.{rel}")
    try:
        sc.rename(path, dest)
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("cannot quarantine %s (%s): %s", path, reason, exc)
        return False
    with contextlib.suppress(OSError):
        doc = {"from": os.path.relpath(path, lay.root), "reason": reason, "at": time.time()}
        fs.write_new(dest + ".reason", dumps(doc) + b"\n", durable=False, mode=file_mode)
    _tally.n = made_here() + 1
    log.warning("quarantined %s: %s", path, reason)
    return True
