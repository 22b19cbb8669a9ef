"""Creating a job on disk: the temp file, the id reservation, and the publishing rename.

A generated id needs no reservation (it is random); a chosen id is reserved by hard-linking the
temp file to ``ids/<id>`` before the job is published, so a second create with that id fails
with EEXIST (``JobExists``) in every process, for as long as the job exists. A removed job's
reservation goes with it (``_removal``), so its id is free again; one whose job is nowhere (its
file deleted by hand, or a removal a power cut undid in part) is freed by the create that meets
it (:func:`free_orphan`). A chosen id in the shape of a generated
one (32 lowercase hex digits) is also checked against the jobs that exist, so a generated id
cannot be created twice either. FORMAT.md, "Transitions", has the steps.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from .._core._core import Core
from .._core._hooks import Hooks
from .._errors import JobExists, StorageError, ValueTooLarge
from .._format._job import Job
from .._format._layout import GENERATED_ID_RE, MAX_PRIORITY, MIN_PRIORITY, generated_id
from .._format._records import Record
from .._format._values import (
    Duration,
    canonical,
    check_after,
    check_job_id,
    check_key,
    check_queue_name,
    check_timeout,
    due_time,
    integer,
    retain_seconds,
)
from .._os import _files as fs
from .._os import _syscalls as sc

log = logging.getLogger("fsjobstore")


def new_record(core: Core, request: Any, *, queue: str, priority: int, max_attempts: int | None, job_id: str | None,
               timeout: Duration | None, retain: Duration | None, default_timeout: float | None,
               default_retain: float, delay: Duration | None = None,
               run_at: float | datetime | None = None, unique_key: str | None = None,
               after: Sequence[str] | None = None, on_parent_failure: str = "cancel",
               concurrency_key: str | None = None) -> Record:
    """The record of a new job, every argument checked (``JobStore.create`` documents them):
    bad input raises here, before anything is written."""
    settings = core.settings
    queue = check_queue_name(queue)
    priority = integer(priority, "priority", at_least=MIN_PRIORITY, at_most=MAX_PRIORITY)
    attempts_cap = settings.max_attempts if max_attempts is None else integer(
        max_attempts, "max_attempts", at_least=1, at_most=1_000_000)
    seq = core.next_seq()  # a generated id begins with its seq
    job_id = generated_id(seq) if job_id is None else check_job_id(job_id)
    # What is returned is what was stored: a reader of the file gets exactly this request.
    request_bytes, request = canonical(request, what="request")
    if len(request_bytes) > settings.max_request_bytes:
        raise ValueTooLarge(f"request is {len(request_bytes)} bytes; max_request_bytes is {settings.max_request_bytes}")
    limit = default_timeout if timeout is None else check_timeout(timeout, "timeout")
    kept = retain_seconds(retain)
    key = None if unique_key is None else check_key(unique_key)
    limited = None if concurrency_key is None else check_key(concurrency_key, "concurrency_key")
    parents, if_failed = check_after(after, on_parent_failure)
    now = core.wall()
    return Record(id=job_id, queue=queue, priority=priority, request=request, created_at=now, seq=seq,
                  max_attempts=attempts_cap, not_before=due_time(now, delay, run_at), timeout=limit,
                  retain=default_retain if kept is None else kept, request_json=request_bytes, unique_key=key,
                  after=parents, on_parent_failure=if_failed, concurrency_key=limited)


def publish_new(core: Core, hooks: Hooks, record: Record, *, explicit: bool,
                still_due: Callable[[], bool] | None = None,
                member: bool = False) -> str | Job:
    """Write ``record`` and publish it into pending or scheduled; returns that state's name.
    Returns only once the job is durable (in a durable store). ``still_due`` (a periodic tick,
    ``_ticks.make``): asked once the id is reserved; False gives it back and raises JobExists.
    ``member``: a group's member, reserved as a chosen id is, with an id its maker generated.
    A record with a unique key whose key a job that is not final holds is not published: that
    job's snapshot is returned instead (``_unique_keys``)."""
    lay = core.layout
    dest = "scheduled" if record.not_before is not None and record.not_before > record.created_at else "pending"
    if record.after and hooks.parents.place(record) == "deferred":
        dest = "deferred"
    token = core.new_token()
    tmp = lay.tmp_path(token, "newid" if explicit else "new", f"{record.id}.json")
    core.tree.write_new(tmp, record.to_bytes())
    if record.unique_key is not None:
        try:
            holder = hooks.keys.take(tmp, record)
        except BaseException:
            fs.unlink_quietly(tmp)
            raise
        if holder is not None:
            fs.unlink_quietly(tmp)
            return holder
    reserved = False
    marker = lay.id_marker(record.id) if explicit else ""
    try:
        if explicit:
            for tries_left in (1, 0):
                try:
                    core.tree.link_into(tmp, marker)
                    break
                except FileExistsError:
                    if not tries_left or not free_orphan(core, record.id):
                        raise JobExists(f"a job with id {record.id!r} exists in this store") from None
                except StorageError as exc:
                    if exc.applied:  # reserved but not durably: give the id back, as if never taken
                        fs.unlink_quietly(marker)
                        exc.applied = False
                    raise
            reserved = True
            # (A group's member is reserved too, with an id its maker generated: nothing else can
            # have it, and looking in every state for each member cost a group 3/4 of its time.)
            if not member and GENERATED_ID_RE.match(record.id) and core.tree.exists(record.id):
                # A generated id is not reserved under ids/ (that would cost every create a
                # link and a directory fsync); one chosen by hand in the same shape may be a
                # job's generated id. Give the reservation back and refuse.
                raise JobExists(f"a job with id {record.id!r} already exists in this store")
            if still_due is not None and not still_due():
                raise JobExists(f"tick job {record.id!r} was made already (and removed since)")
        if dest == "deferred":
            hooks.parents.link(record)  # before it is seen: whoever ends a parent then finds it
        core.tree.publish(tmp, record, dest)
    except Exception as exc:
        if isinstance(exc, StorageError) and exc.applied:
            # The job is in place; only the fsync that makes it durable failed.
            core.pending.note_published(record, dest)
        elif fs.unlink_quietly(tmp):
            # The temp file was still here, so the job was never published: give the id (and
            # its key) back. (Had it gone, the job would be in place and the id spent.)
            if reserved:
                fs.unlink_quietly(marker)
            if record.unique_key is not None:
                hooks.keys.release(record)
        if type(exc) is FileNotFoundError:
            # Our temp file, or the directory it was going to, was moved away meanwhile (a member
            # of a shared store may): the job was not stored. Said as the store's error, never
            # as a bare OSError.
            err = StorageError(exc.errno, exc.strerror, exc.filename)
            err.op = "create"
            raise err from None
        raise
    core.pending.note_published(record, dest)
    if dest == "deferred":
        hooks.parents.recheck(record)
    return dest


def free_orphan(core: Core, job_id: str) -> bool:
    """Unlink ``ids/<id>`` if no job holds it: the job is in no state and no removal or create
    is under way for it. True if the id is free now (the caller links its own reservation).

    Such a reservation is what a job's file deleted by hand leaves (or a removal a power cut
    undid in part): the job is gone, and is never brought back from it. The marker's flock
    makes two creates that meet it take turns; a live create's reservation shares its inode
    with that create's temp file or published job, so it has a second link and is never taken.
    A final job's file has one more, its finished-index entry, which holds no job: when the file
    itself was deleted by hand, that entry is the link left, and it does not spend the id."""
    marker = core.layout.id_marker(job_id)
    try:
        # O_NONBLOCK: a FIFO planted here must not hang us.
        fd = sc.open(marker, os.O_RDONLY | fs.O_NOFOLLOW | os.O_NONBLOCK | fs.O_CLOEXEC)
    except FileNotFoundError:
        return True  # freed meanwhile (a removal finished): try again
    except OSError:
        return False
    try:
        st = sc.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False  # planted: it still spends the id
        sc.lock_blocking(fd)
        # RACE: the job may be moving while we look (a claim, a retry that rewrote it under a new
        # inode, leaving this marker's link count at 1); exists() looks in both directions of
        # travel, so only four opposed moves timed into its passes could hide it. A removal
        # holds the job in tmp/ as a gone temp from its fence until after it unlinked ids/<id>:
        # looking for one after exists() cannot miss a job that is being removed.
        now = sc.fstat(fd)
        links = now.st_nlink - 1 - (core.tree.index_links(marker, now) if now.st_nlink > 1 else 0)
        if links > 0 or core.tree.exists(job_id) or _being_removed(core, job_id):
            return False
        same = fs.names_file(marker, st)
        if same is None:
            return True
        if not same:
            return False  # another create freed it and reserved it anew meanwhile
        fs.unlink(marker)
        log.warning("the reservation of id %s named no job (its file removed by hand, or the reservation brought "
                    "back by a power cut or a network filesystem's heal): the id is free again", job_id)
        return True
    finally:
        sc.close_read(fd)  # releases the flock


def _being_removed(core: Core, job_id: str) -> bool:
    tail = f".gone.{job_id}.json"
    return any(name.endswith(tail) for name in fs.scan_names(core.layout.tmp))
