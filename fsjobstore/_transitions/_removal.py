"""Removing a job and every file of it: the one primitive retention and purge share (FORMAT.md,
"Transitions", *remove*).

0. The ``removing`` hooks run first, while the job can still be read: a periodic tick's job
   has its tick recorded (``_ticks.note_removed``), so the id this frees cannot make that tick a
   second time, and the jobs waiting for it are resolved as its state says.
1. The fence: the job's file is renamed to ``tmp/<token>.gone.<id>.json``. Whoever wins that
   rename owns the removal; a loser sees ENOENT (the job was claimed, retried or removed by
   someone else) and skips it. From here on the job is in no state: no lookup finds it.
2. ``ids/<id>`` (so the id is free again, and ``ids/`` does not grow), ``runs/<id>/``, a cancel
   request, and for a job removed with its targets (a purged waiting job) ``targets/<id>/`` and
   its notify entry are unlinked.
3. The job's finished-index entry, then the temp file, are unlinked (in that order, so a
   removal cut short before its last step still has its temp file, from which recovery
   finishes it, and never leaves an entry naming no job).
4. The ``removed`` hooks: a group whose last member this was loses its manifest, and the jobs
   that waited for a job that never ended hear it is gone.

Recovery finishes a ``gone`` temp of a gone owner by steps 2-4 (:func:`finish_gone`): it never
publishes it back. So a process killed at any instant leaves nothing half-removed once the next
pass has run, and the job never comes back. Nothing here is fsynced: a power cut may bring back
files of a removed job (a stray ``runs/<id>`` or ``ids/<id>``), which are what removal leaves
after a crash too, and are removed again by the next create or removal that meets them.
"""

from __future__ import annotations

import errno
import logging
import os

from .._core._core import Core
from .._core._hooks import Hooks
from .._format._layout import FINISHED_RE, bucket_field, micros
from .._format._records import Record
from .._os import _files as fs
from .._os import _syscalls as sc
from ._notify import has_targets

log = logging.getLogger("fsjobstore")


def remove_job(core: Core, hooks: Hooks, path: str, job_id: str, *, drop_targets: bool,
               entry: str | None = None) -> bool:
    """Remove the job whose file is at ``path`` (``<state>/<id>.json``, ``pending/<q>/<name>``
    or ``scheduled/<name>``) with every file of it; True if this call removed it.

    False if the file was gone (someone else moved it first), or if ``drop_targets`` is false
    and the job turned out to have a notification due after the fence: it is put back, since a
    target queued meanwhile must still be delivered. ``entry`` is the job's finished-index
    entry, if the caller knows it (found from the job's record otherwise)."""
    hooks.remove(job_id)  # while it can still be read (see the module docstring)
    token = core.new_token()
    gone = core.layout.gone_tmp_path(token, job_id)
    try:
        sc.rename(path, gone)
    except FileNotFoundError:
        return False
    if path.startswith(core.layout.pending + "/"):
        core.tree.note_bucket_change(os.path.dirname(path))
        core.pending.gone(path)
    try:
        if not drop_targets and notification_due(core, job_id):
            # RACE: a target was queued between the caller's look and our fence. Put the job
            # back (the name is free: the id's reservation still stands, so nobody made another
            # job there); a later pass removes it once the target was delivered.
            try:
                sc.rename_noreplace(gone, path)
                return False
            except FileExistsError as exc:
                log.warning("could not put job %s back after finding a target queued for it (%s); "
                            "removing it with its targets", job_id, exc)
        finish_gone(core, hooks, gone, job_id, entry=entry)
    except BaseException:
        # A fault midway (EIO, say): the job is removed for every reader already; the rest is
        # retried by this store's next recovery pass (another's once this process is gone).
        with core.mutex:
            core.unfinished_removals[gone] = (job_id, entry)
        raise
    return True


def remove_now(core: Core, hooks: Hooks, record: Record, dest: str, finished_at: float) -> None:
    """A job kept 0 s is removed by the commit that made it final, not
    at retention's next pass: a drain of ``retain=0`` jobs faster than passes remove would grow
    the final directories, which never shrink. One with targets waiting stays (``remove_job``
    puts it back); a fault leaves it to retention."""
    entry = core.tree.finished_entry(record, dest, finished_at)
    try:
        remove_job(core, hooks, core.layout.final_path(dest, record.id), record.id, drop_targets=False, entry=entry)
    except OSError as exc:
        log.info("job %s (kept 0 s) was committed; retention removes it (%s)", record.id, exc)


def finish_unfinished(core: Core, hooks: Hooks) -> int:
    """Retry the removals of this store that a fault cut short (:func:`remove_job`)."""
    with core.mutex:
        todo, core.unfinished_removals = core.unfinished_removals, {}
    done = 0
    for gone, (job_id, entry) in todo.items():
        try:
            finish_gone(core, hooks, gone, job_id, entry=entry)
            done += 1
        except OSError:
            with core.mutex:
                core.unfinished_removals[gone] = (job_id, entry)
    return done


def notification_due(core: Core, job_id: str) -> bool:
    """Whether some target still waits to hear about the job (it must not be removed)."""
    return core.exists(core.layout.notify_path(job_id)) or has_targets(core, job_id)


def finish_gone(core: Core, hooks: Hooks, gone: str, job_id: str, *, entry: str | None = None) -> None:
    """Steps 2 to 4 of a removal whose fence (``gone``, the temp file) is done. Idempotent:
    a removal cut short is finished by running this again (recovery does, for a gone owner)."""
    lay = core.layout
    record = _record(core, gone)
    if entry is None and record is not None and record.finished_at is not None:
        entry = _find_entry(core, record, job_id)
    if record is not None and record.unique_key is not None:
        hooks.keys.release(record)  # its unique key's entry, if it still names this job
    # The job is ours since the fence, so ids/<id> names it whatever inode it is: no create can
    # have replaced it (a create frees an id only when no gone temp names it: _create).
    fs.unlink(lay.id_marker(job_id))
    _remove_dir(lay.run_dir(job_id))
    # Each of these is almost never there, and the name watch says so without a call. RACE: one
    # made after the look is left, as one made after the unlink always was: the same window.
    if core.exists(lay.cancel_path(job_id)):
        fs.unlink(lay.cancel_path(job_id))
    # A removed job has no notification left to make: a waiting job's targets were never to
    # hear (purge says so), a final job is removed only once they have heard.
    if core.exists(lay.target_dir(job_id)):
        _remove_dir(lay.target_dir(job_id))
    if core.exists(lay.notify_path(job_id)):
        fs.unlink(lay.notify_path(job_id))
    if entry is not None:
        fs.unlink(entry)
    fs.unlink(gone)  # last: until here, recovery can find this removal and finish it
    hooks.gone(job_id, record)


def _remove_dir(path: str) -> None:
    for name in fs.scan_names(path):
        fs.unlink(os.path.join(path, name))
    try:
        sc.rmdir(path)
    except OSError as exc:
        # RACE: ENOTEMPTY, something arrived meanwhile (a late log line of a fenced-out holder):
        # left, as a crash would leave it. Anything else is a fault: the removal is retried.
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
            raise


def _record(core: Core, gone: str) -> Record | None:
    try:
        return core.tree.read_record(gone)
    except (FileNotFoundError, fs.Unreadable, ValueError):
        return None


def _find_entry(core: Core, record: Record, job_id: str) -> str | None:
    """The finished-index entry of the final job ``record``, from its ``finished_at``; None if
    it has none (a stale entry left anyway is unlinked when met)."""
    assert record.finished_at is not None
    fin = micros(record.finished_at)
    bucket = core.layout.finished_bucket(bucket_field(fin))
    for name in fs.scan_names(bucket):
        m = FINISHED_RE.match(name)
        if m and m["id"] == job_id and int(m["fin"]) == fin:
            return os.path.join(bucket, name)
    return None
