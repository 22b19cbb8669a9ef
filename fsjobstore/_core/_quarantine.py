"""Quarantine: a file the store cannot use is moved aside, never deleted, with a note saying why.

``quarantine/<ns>.<path with / as ~>`` keeps the file, ``... .reason`` a JSON note (``from``,
``reason``, ``at``), as FORMAT.md describes under quarantine/.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass

from .._format._layout import Layout
from .._format._values import dumps, loads
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
        doc = {"from": _text(os.path.relpath(path, lay.root)), "reason": _text(reason), "at": time.time()}
        fs.write_new(dest + ".reason", dumps(doc) + b"\n", durable=False, mode=file_mode)
    _tally.n = made_here() + 1
    log.warning("quarantined %s: %s", path, reason)
    return True


def _text(text: str) -> str:
    """``text`` as JSON can hold it: a planted name that is not UTF-8 (read as lone surrogates)
    with its bytes written as ``\\x9b``."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


NOTE_CAP = 64 * 1024  # a reason note is a line of JSON: a bigger one was not written by a store


@dataclass(frozen=True, slots=True)
class QuarantinedFile:
    """A file the store moved aside (see :meth:`JobStore.quarantined`)."""

    name: str  # its name in quarantine/
    origin: str  # where it was, relative to the store's directory
    reason: str  # why it was moved, as the store logged it
    at: float  # when (seconds since the epoch, wall clock)


def names(lay: Layout) -> list[str]:
    """The names of the files in quarantine/, oldest first (their notes left out)."""
    return sorted(n for n in fs.scan_names(lay.quarantine) if not n.endswith(".reason"))


def read_all(lay: Layout, limit: int | None = None) -> list[QuarantinedFile]:
    """The files in quarantine/, oldest first (the first ``limit`` of them), each with its note.
    A note that is missing (its write failed) or not a store's (planted, torn, not JSON) is
    answered from the file's own name, with a reason saying so."""
    return [_entry(lay, name) for name in names(lay)[:limit]]


def _entry(lay: Layout, name: str) -> QuarantinedFile:
    stamp, _, rel = name.partition(".")
    at = int(stamp) / 1e9 if stamp.isdigit() else 0.0
    guess = _text(rel.replace("~", os.sep) or name)  # the name's own account ("~" was "/")
    try:
        doc = loads(fs.read_regular(os.path.join(lay.quarantine, name + ".reason"), NOTE_CAP))
    except FileNotFoundError:
        return QuarantinedFile(name, guess, "(no note: its write failed)", at)
    except (fs.Unreadable, ValueError) as exc:
        return QuarantinedFile(name, guess, f"(its note is unreadable: {exc})", at)
    if not isinstance(doc, dict):
        return QuarantinedFile(name, guess, "(its note is unreadable: not a JSON object)", at)
    origin, reason, when = doc.get("from"), doc.get("reason"), doc.get("at")
    return QuarantinedFile(
        name, origin if isinstance(origin, str) else guess,
        reason if isinstance(reason, str) else "(its note gives no reason)",
        float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) and math.isfinite(when) else at)
