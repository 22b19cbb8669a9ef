"""The deep pass of recovery: job files a power cut emptied, in a store made with durable=False.

A power cut can keep a file's name and lose its data (FORMAT.md, "What survives what"). Once
per boot, the first process that recovers looks at every job file's size and quarantines the
empty ones; every job file recovery meets as ``LostJobData`` is reported the same way
(``RecoveryReport.lost_to_power_loss`` counts them, ``lost_ids`` names them).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable

from .._core import _buckets
from .._core._core import Core
from .._format._layout import ACTIVE_RE, FINAL_RE, PENDING_RE, QUEUE_RE, SCHEDULED_RE, TMP_RE
from .._format._records import LOST_DATA
from .._os import _files as fs
from .._os import _syscalls as sc

MAX_LOST_IDS = 1000  # a report stays small even after a cut that emptied a huge backlog


def note_lost(counts: dict[str, int], job_id: str | None) -> None:
    """Count a job file lost to a power cut, and name its job while the pass's list has room."""
    counts["lost_to_power_loss"] += 1
    ids: list[str] | None = getattr(counts, "lost_ids", None)  # _recovery.Counts
    if job_id is not None and ids is not None and len(ids) < MAX_LOST_IDS:
        ids.append(job_id)


def job_id_of(name: str) -> str | None:
    """The job id a job file's name carries, in any state directory or as a create's temp file."""
    for pattern in (ACTIVE_RE, PENDING_RE, SCHEDULED_RE, FINAL_RE):
        m = pattern.match(name)
        if m:
            return m["id"]
    m = TMP_RE.match(name)
    final = FINAL_RE.match(m["rest"]) if m else None  # tmp/<token>.newid.<id>.json
    return final["id"] if final else None


def _boot_marker(core: Core) -> str:
    """``control/boot-<id>``: this boot's deep pass was made. A power cut means a boot, so one
    deep pass per boot finds what it emptied; every later process skips it."""
    return core.layout.boot_marker()


def deep_pass(core: Core, counts: dict[str, int], *, explicit: bool,
              stop: Callable[[], bool] = lambda: False) -> None:
    """Make the deep pass: always when ``explicit``, else once per boot of this host. The
    process making it holds ``control/boot.lock`` (flock) meanwhile, and marks the boot only
    when it is done: workers started together make one pass, not one each (16 children on a
    10,000-job backlog read 160,000 sizes), and a pass cut short (its process exited or died,
    or the pass failed) is made again by the next process that starts."""
    marker = _boot_marker(core)
    if marker.endswith("-unknown"):  # no boot id: nothing to mark, so every first pass is deep
        _sweep_emptied(core, counts, stop)
        return
    if not explicit and sc.lexists(marker):
        return  # made since this host booted
    lock = _sweep_lock(core)
    if lock is None and not explicit:
        return  # another process is making it right now
    try:
        if not explicit and sc.lexists(marker):
            return  # made while we waited for the lock
        if _sweep_emptied(core, counts, stop):
            _mark_boot(core, marker)  # (a pass stopped midway is made again by the next process)
    finally:
        if lock is not None and lock != _NO_LOCK:
            sc.close_read(lock)  # releases the flock


_NO_LOCK = -1  # control/boot.lock cannot be opened (a read-only control/): sweep without it


def _sweep_lock(core: Core) -> int | None:
    """A descriptor holding ``control/boot.lock`` (flock); None if another process holds it;
    ``_NO_LOCK`` if it cannot be opened or locked. Where locks do not exclude (some network
    filesystems), two processes may both make the pass: it is idempotent, only repeated."""
    try:
        fd = fs.open_lock(os.path.join(core.layout.control, "boot.lock"), core.tree.perms)
    except OSError:
        return _NO_LOCK
    try:
        if sc.try_lock(fd):
            return fd
        held = True
    except OSError:
        held = False
    sc.close_read(fd)
    return None if held else _NO_LOCK


def _mark_boot(core: Core, marker: str) -> None:
    for name in fs.scan_names(core.layout.control):
        if name.startswith("boot-") and name != os.path.basename(marker):  # earlier boots' markers
            fs.unlink_quietly(os.path.join(core.layout.control, name))
    with contextlib.suppress(OSError):
        fs.touch(marker, core.tree.perms.file_mode)


def _sweep_emptied(core: Core, counts: dict[str, int], stop: Callable[[], bool] = lambda: False) -> bool:
    """Job files a power cut left empty (the rename reached the disk, the data did not), queued
    or final: quarantine them now with the reason, and report them, rather than let a worker or
    a ``get`` trip on each. One lstat per job file, once per boot: the same cost per file for
    final jobs as for queued ones. (Active ones are met by the take-over of their claim.)"""
    lay = core.layout
    # Each directory with the grammar of its job files: only a name of that grammar is a job
    # file. Anything else there (a queue's ".changed" marker, empty by design; a bucket; a name
    # planted by hand) is no job, and an empty one is no lost job: it is left to whoever owns it.
    dirs: list[tuple[str, re.Pattern[str]]] = []
    for q in fs.scan_names(lay.pending):
        qdir = lay.pending_dir(q)
        if QUEUE_RE.match(q) and fs.is_real_dir(qdir):
            buckets, _ = _buckets.list_queue(qdir)
            # (the queue's directory too: flat jobs of older stores)
            dirs += [(qdir, PENDING_RE), *((os.path.join(qdir, b), PENDING_RE) for b in buckets)]
    dirs += [(lay.scheduled, SCHEDULED_RE), *((d, FINAL_RE) for d in (lay.fulfilled, lay.failed, lay.cancelled))]
    for directory, grammar in dirs:
        for k, name in enumerate(fs.scan_names(directory)):
            if k % 1024 == 0 and stop():  # its store is closing: a deep backlog must not hold it up
                return False
            if not grammar.match(name):
                continue
            path = os.path.join(directory, name)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                st = sc.lstat(path)
                empty = stat.S_ISREG(st.st_mode) and st.st_size == 0  # (a bucket is a directory)
                if empty and core.tree.quarantine(path, f"job file is empty: {LOST_DATA}"):
                    note_lost(counts, job_id_of(name))  # (the pass counts every quarantine: _recovery)
    return True
