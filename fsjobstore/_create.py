"""Creating a job on disk: the temp file, the id reservation, and the publishing rename.

A generated id needs no reservation (it is random); a chosen id is reserved by hard-linking the
temp file to ``ids/<id>`` before the job is published, so a second create with that id fails
with EEXIST (``JobExists``) in every process, forever. A chosen id in the shape of a generated
one (32 lowercase hex digits) is also checked against the jobs that exist, so a generated id
cannot be created twice either. FORMAT.md, "Transitions", has the steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat

from . import _fsops as fs
from . import _syscalls as sc
from ._core import Core
from ._errors import JobExists, StorageError
from ._layout import GENERATED_ID_RE
from ._records import Record

log = logging.getLogger("fsjobstore")


def publish_new(core: Core, record: Record, *, explicit: bool) -> str:
    """Write ``record`` and publish it into pending or scheduled; returns that state's name.
    Returns only once the job is durable (in a durable store)."""
    lay = core.layout
    dest = "scheduled" if record.not_before is not None and record.not_before > record.created_at else "pending"
    token = core.new_token()
    tmp = lay.tmp_path(token, "newid" if explicit else "new", f"{record.id}.json")
    core.tree.write_new(tmp, record.to_bytes())
    reserved = False
    marker = lay.id_marker(record.id) if explicit else ""
    try:
        if explicit:
            try:
                core.tree.link_into(tmp, marker)
            except FileExistsError:
                republish_orphan(core, record.id)
                raise JobExists(f"a job with id {record.id!r} was already created in this store") from None
            except StorageError as exc:
                if exc.applied:  # reserved but not durably: give the id back, as if never taken
                    fs.unlink_quietly(marker)
                    exc.applied = False
                raise
            reserved = True
            if GENERATED_ID_RE.match(record.id) and core.tree.exists(record.id):
                # A generated id is not reserved under ids/ (that would cost every create a
                # link and a directory fsync); one chosen by hand in the same shape may be a
                # job's generated id. Give the reservation back and refuse.
                raise JobExists(f"a job with id {record.id!r} already exists in this store")
        core.tree.publish(tmp, record, dest)
    except Exception as exc:
        if isinstance(exc, StorageError) and exc.applied:
            # The job is in place; only the fsync that makes it durable failed.
            core.pending.note_published(record, dest)
        elif fs.unlink_quietly(tmp) and reserved:
            # The temp file was still here, so the job was never published: give the id
            # back. (Had it gone, the job would be in place and the id spent.)
            fs.unlink_quietly(marker)
        if type(exc) is FileNotFoundError:
            # Our temp file, or the directory it was going to, was moved away meanwhile (a member
            # of a shared store may): the job was not stored. Said as the store's error, never
            # as a bare OSError (issue 23).
            err = StorageError(exc.errno, exc.strerror, exc.filename)
            err.op = "create"
            raise err from None
        raise
    core.pending.note_published(record, dest)
    return dest


def republish_orphan(core: Core, job_id: str) -> None:
    """If ``ids/<id>`` is the only copy of a job (a create lost its temp file to a crash or
    power loss after reserving the id), publish the job from it: the id is spent, so the job
    it names must exist. The marker's flock makes concurrent repairs take turns."""
    marker = core.layout.id_marker(job_id)
    try:
        # O_NONBLOCK: a FIFO planted here must not hang us (it then fails the checks below).
        fd = sc.open(marker, os.O_RDONLY | fs.O_NOFOLLOW | os.O_NONBLOCK | fs.O_CLOEXEC)
    except OSError:
        return
    try:
        if not stat.S_ISREG(sc.fstat(fd).st_mode):
            return  # planted: it still spends the id, but there is nothing to publish
        sc.lock_blocking(fd)
        # RACE: the job may be moving while we look (a claim, a retry that rewrote it under a new
        # inode, leaving this marker's link count at 1); exists() looks in both directions of
        # travel, so only four opposed moves timed into its passes could hide it.
        if sc.fstat(fd).st_nlink > 1 or core.tree.exists(job_id):
            return  # published, or a create is between its link and its rename
        try:
            record = core.tree.read_record(marker)
        except (FileNotFoundError, fs.Unreadable, ValueError):
            return
        if record.id != job_id:
            return
        due = record.not_before is not None and record.not_before > core.wall()
        dst = core.tree.dest_path(record, "scheduled" if due else "pending")
        core.tree.ensure_dir(os.path.dirname(dst))
        with contextlib.suppress(FileExistsError):
            core.tree.link_into(marker, dst)
            log.warning("job %s was reserved but never published; published it from ids/", job_id)
    finally:
        sc.close_read(fd)  # releases the flock
