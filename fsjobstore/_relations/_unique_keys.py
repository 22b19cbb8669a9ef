"""Unique keys (``create(unique_key=K)``): while a job with key K is not final, a create with K
returns that job instead of making another; once it is final, K is free again (FORMAT.md,
"Unique keys").

``unique/<H>`` (``H``: the first 32 hex digits of K's SHA-256) is a hard link to the holder's
first file, its create's temp file, linked before the job is published, as ``ids/<id>`` is for
a chosen id: one ``link`` has exactly one winner in every process and on every host, so two
creates with K make one job. The entry's record line names the holder (and K, to tell two keys
apart should their hashes meet).

The entry is not removed when its job becomes final: it is *stale* then, and the next create
with K frees it (under the entry's flock, so two that meet it take turns) and links its own.
So no commit pays for unique keys. A job's removal (retention, purge) unlinks the entry if it
still names that job, so ``unique/`` holds one entry per key in use or recently used. ``retry``
of a final job with a key takes its key again, or is refused if another job holds it now.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time

from .._core._core import Core
from .._errors import InvalidState, StorageError
from .._format._job import Job, JobState
from .._format._records import Record
from .._os import _files as fs
from .._os import _syscalls as sc

log = logging.getLogger("fsjobstore")



def key_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def entry_path(core: Core, key: str) -> str:
    return f"{core.layout.unique}/{key_name(key)}"


def _link_making_dir(core: Core, tmp: str, path: str) -> None:
    """Link ``tmp`` to ``path``, making ``unique/`` for the first key of a store.

    RACE: on a network filesystem a client can keep answering ENOENT for ``unique/`` for a moment
    after another host made it (its cached "no such name"; the mkdir here then meets EEXIST and
    changes nothing). Seen on GlusterFS when both hosts took their first key at once
    (tests/distfs/test_relations_hosts.py, 1 run in 5): tried again after short pauses."""
    for pause in (0.0, 0.05, 0.2, 0.5, 1.0, None):
        try:
            sc.link(tmp, path)
            return
        except FileNotFoundError:
            if pause is None or not sc.lexists(tmp):
                raise
            core.tree.ensure_dir(core.layout.unique)
        time.sleep(pause)


def take(core: Core, tmp: str, record: Record) -> Job | None:
    """Make this create's temp file the holder of its key; None once it is, or the snapshot of
    the job that holds the key (no job is made then: the caller drops its temp file)."""
    assert record.unique_key is not None
    path = entry_path(core, record.unique_key)
    for _ in range(50):
        try:
            # Not fsynced on its own: the publish that follows fsyncs its directory, which makes
            # this earlier name durable too (names reach the disk in program order: FORMAT.md,
            # "What survives what"); a power cut before it leaves a stale entry or none, never a
            # published job without its entry. A third fsync per create cost 0.79x of a plain rate.
            _link_making_dir(core, tmp, path)
            return None
        except FileExistsError:
            pass
        except StorageError as exc:
            if exc.applied:  # linked but not durably: give it back, as if never taken
                fs.unlink_quietly(path)
                exc.applied = False
            raise
        holder = _holder_or_free(core, path, record.unique_key)
        if holder is not None:
            return holder
    raise InvalidState(f"the holder of unique key {record.unique_key!r} kept changing; try again")


def _holder_or_free(core: Core, path: str, key: str) -> Job | None:
    """The live job the entry at ``path`` names, or None once the entry was found stale and
    freed (or gone meanwhile): then the caller links its own."""
    try:
        # O_NONBLOCK: a FIFO planted here must not hang us.
        fd = sc.open(path, os.O_RDONLY | fs.O_NOFOLLOW | os.O_NONBLOCK | fs.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(exc.errno or 0, f"unique key entry {path} cannot be opened: {exc.strerror}",
                           path) from None
    try:
        st = sc.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            # Planted (a member of a shared store may): it holds the key for nobody. Moved aside.
            core.tree.quarantine(path, "a unique key's entry that is not a regular file")
            return None
        sc.lock_blocking(fd)  # two creates meeting a stale entry take turns
        if fs.names_file(path, st) is not True:
            return None  # freed (and maybe taken) meanwhile: look again
        try:
            held = Record.parse(fs.read_regular(path, core.tree.record_cap)).record
        except (FileNotFoundError, fs.Unreadable, ValueError):
            held = None
        if held is not None and held.unique_key == key:
            job = _live(core, held, st)
            if job is not None:
                return job
        fs.unlink(path)
        return None
    finally:
        sc.close_read(fd)  # releases the flock


def _live(core: Core, held: Record, st: os.stat_result) -> Job | None:
    """The holder's snapshot while it is not final; None if it is final or gone."""
    loc = core.tree.locate(held.id)
    if loc is None:
        if st.st_nlink > 1 or _being_created(core, held.id):
            # Linked, not published yet (its create is between the link and the rename): it
            # is as good as pending. Shown from its record, as its create will return it.
            state = JobState.SCHEDULED if held.not_before and held.not_before > held.created_at \
                else JobState.PENDING
            return held.snapshot(state)
        return None
    if loc.state.is_final:
        return None
    try:
        return core.tree.read_job(loc).snapshot(loc.state)
    except (FileNotFoundError, fs.Unreadable, ValueError):
        return held.snapshot(loc.state)


def _being_created(core: Core, job_id: str) -> bool:
    tails = (f".new.{job_id}.json", f".newid.{job_id}.json")
    return any(name.endswith(tails) for name in fs.scan_names(core.layout.tmp))


def release(core: Core, record: Record) -> None:
    """A job is being removed, or its create gave up: unlink its key's entry if it names this
    job, so ``unique/`` does not grow with old keys."""
    if record.unique_key is None:
        return
    path = entry_path(core, record.unique_key)
    try:
        fd = sc.open(path, os.O_RDONLY | fs.O_NOFOLLOW | os.O_NONBLOCK | fs.O_CLOEXEC)
    except OSError:
        return  # none, or not ours to judge: a create that meets it frees it
    try:
        st = sc.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        sc.lock_blocking(fd)
        if fs.names_file(path, st) is not True:
            return
        try:
            held = Record.parse(fs.read_regular(path, core.tree.record_cap)).record
        except (FileNotFoundError, fs.Unreadable, ValueError):
            return
        if held.id == record.id:
            fs.unlink(path)
    finally:
        sc.close_read(fd)


def retake(core: Core, record: Record, new_file: str) -> None:
    """``retry`` of a final job with a key: link its new file as the key's entry, freeing a
    stale one; :class:`InvalidState` if another job that is not final holds the key."""
    assert record.unique_key is not None
    path = entry_path(core, record.unique_key)
    for _ in range(50):
        try:
            sc.lstat(path)
        except FileNotFoundError:
            try:
                core.tree.link_into(new_file, path)
                return
            except FileNotFoundError:
                core.tree.ensure_dir(core.layout.unique)
                continue
            except FileExistsError:
                continue
        holder = _holder_or_free(core, path, record.unique_key)
        if holder is None:
            continue
        if holder.id != record.id:
            raise InvalidState(f"job {record.id} cannot run again: its unique key {record.unique_key!r} is held "
                               f"by job {holder.id}, which is {holder.state.value}")
        return
    raise InvalidState(f"the holder of unique key {record.unique_key!r} kept changing; try again")


class UniqueKeys:
    """The store's hooks for unique keys (``_core._hooks.UniqueKeys``): before create, at a
    retry, and when a job's create gave up or the job was removed."""

    def __init__(self, core: Core) -> None:
        self._core = core

    def take(self, tmp: str, record: Record) -> Job | None:
        return take(self._core, tmp, record)

    def release(self, record: Record) -> None:
        release(self._core, record)

    def retake(self, record: Record, new_file: str) -> None:
        retake(self._core, record, new_file)
