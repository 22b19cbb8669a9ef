"""Taking over a claim: the fence, then finishing or undoing what its holder left.

A take-over renames the holder's ``active/`` entry to one of ours (``.recover``): from then on
the holder's commit, if it comes, fails. What follows depends on how far the holder got: a
commit whose new version is in ``tmp/`` is published from it (or, if that was published
already, the fenced entry is only dropped); a whole result line is published as the holder
would have; otherwise the attempt is over, and the job goes back to pending, or to failed or
cancelled. Used by every recovery pass (``_recovery``) and by operations by id (``_by_id``).
FORMAT.md, "take-over", is the contract.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from .._core._control import Control
from .._core._core import Core
from .._core._hooks import Ended, Hooks
from .._core._tree import DESTS
from .._errors import StorageError
from .._format._records import FINAL_STATES, LostJobData, Record
from .._format._values import time_limit_error
from .._os import _files as fs
from .._os import _syscalls as sc
from ._notify import Notifier
from ._power_loss import job_id_of, note_lost

log = logging.getLogger("fsjobstore")


def take_over(core: Core, hooks: Hooks, notifier: Notifier, control: Control, path: str, job_id: str,
              old_token: str, kind: str, why: str, counts: dict[str, int], *, timed_out: bool = False,
              deadline: float | None = None) -> None:
    """Fence out the old holder with a rename, then finish its commit or requeue the job (or,
    if its cancellation was requested, end it cancelled).

    ``why`` says what happened to the holder; ``timed_out``: its attempt's deadline has passed,
    so the attempt's error is the time-out's (``TimeLimitExceeded: ...``), whatever ended the
    holder. A time-out or a cancel is what a worker runtime does on purpose (it kills the child
    running the attempt), so it is logged at INFO and says so; a crash or a hang is a WARNING.
    ``deadline`` (epoch seconds): when that attempt's time limit ran out, for how long it ran.

    What it ends is counted at the ``ended`` point: an attempt ``lost`` (or ``timed_out``), then
    ``retried`` or ``failed`` as the job goes on, or ``cancelled``; a commit it finishes, as
    that commit would have been counted.

    A fault (StorageError) before anything is published hands the entry back under its old
    name, so the next pass (ours or anyone's) tries again; after publishing, only our fenced
    copy is left to drop, which ``Core.drop`` retries if it must.
    """
    token = core.new_token()
    mine = core.layout.active_path(job_id, token, "recover")
    try:
        sc.rename(path, mine)
    except FileNotFoundError:
        return  # another recoverer, or the holder itself, got there first
    cancel = control.cancel_reason(job_id)  # read after the fence: a later request is too late
    if cancel is not None:
        log.info("job %s was cancelled (%s): ending it cancelled, taking it over from %s (%s)",
                 job_id, cancel, old_token, why)
    elif timed_out:
        log.info("job %s ran past its time limit: taking it over from %s (%s); the attempt failed",
                 job_id, old_token, why)
    else:
        log.warning("taking over job %s from %s: %s", job_id, old_token, why)
    try:
        _taken_over(core, hooks, notifier, control, mine, job_id, old_token, kind, why, token, counts,
                    cancel=cancel, timed_out=timed_out, deadline=deadline)
    except StorageError as exc:
        if exc.applied:
            core.drop(mine)
        else:
            try:
                sc.rename(mine, path)
            except OSError:
                log.warning("could not undo the take-over of %s; retried when this process exits", path)
        raise


def _taken_over(core: Core, hooks: Hooks, notifier: Notifier, control: Control, mine: str, job_id: str,
                old_token: str, kind: str, why: str, token: str, counts: dict[str, int], *, cancel: str | None,
                timed_out: bool, deadline: float | None) -> None:
    tree, lay = core.tree, core.layout
    # RACE: only a ".commit" entry's temp file is committed. A ".recover" holder (a take-over like
    # ours) writes its temp file before it renames to ".commit"; woken from a hang, it finds its
    # entry gone and removes that file, so finishing from it could publish nothing and then drop
    # the job's only copy. Its claim is judged from the job's file instead, as the holder's was.
    if kind == "commit" and _finish_commit(core, hooks, notifier, job_id, old_token, mine, counts):
        return
    # RACE: a copy may exist elsewhere only if a previous recoverer published it and died
    # before unlinking its ".recover" entry; the job cannot move into pending meanwhile because
    # only the holder of a claim publishes it, and we hold this one.
    if tree.exists_elsewhere(job_id, mine):
        core.drop(mine)
        counts["duplicates_dropped"] += 1
        return
    try:
        parsed = tree.read_parsed(mine)
    except FileNotFoundError:
        return
    except (fs.Unreadable, ValueError) as exc:
        quarantine_job(core, mine, f"active job file {exc}", exc, counts)
        return
    if parsed.final is not None:
        _finish_final(core, hooks, notifier, mine, parsed.record, parsed.final, counts)
        return
    # A torn result line (the holder died mid-append) is ignored: the job is requeued from
    # its record line into a fresh file, so the tail never reaches the queue.
    record = parsed.record
    attempts = record.attempts + 1
    error = time_limit_error(attempts, record.timeout) if timed_out else f"attempt {attempts} lost: {why}"
    if cancel is not None:
        new = dataclasses.replace(record, attempts=attempts, error=cancel, committed_by=token,
                                  finished_at=core.wall(), not_before=None)
        dest = "cancelled"
    elif attempts >= record.max_attempts:
        new = dataclasses.replace(record, attempts=attempts, error=error,
                                  committed_by=token, finished_at=core.wall(), not_before=None)
        dest = "failed"
    else:
        new = dataclasses.replace(record, attempts=attempts, error=error, committed_by=token, not_before=None,
                                  attempt_errors=record.with_failed_attempt(attempts, core.wall(), error))
        dest = "pending"
    tmp = lay.commit_tmp_path(token, job_id, dest)
    try:
        tree.write_new(tmp, new.to_bytes())
    except StorageError as exc:
        if not exc.applied:
            fs.unlink_quietly(tmp)
        raise
    # As a worker's commit: ".commit" says our new version is in tmp/, so a crash from here on
    # is finished from it, or, once it is published (gone from tmp/), dropped (FORMAT.md).
    committing = lay.active_path(job_id, token, "commit")
    try:
        sc.rename(mine, committing)
    except FileNotFoundError:
        fs.unlink_quietly(tmp)  # RACE: we hung, and another recoverer took it from us: ours is void
        return
    except OSError:
        fs.unlink_quietly(tmp)
        raise
    try:
        tree.publish(tmp, new, dest)
    except FileExistsError:  # a result appeared meanwhile: keep it, drop our copy
        fs.unlink_quietly(tmp)
        counts["duplicates_dropped"] += 1
    except FileNotFoundError as exc:
        if not sc.lexists(tmp):
            # RACE: we hung after our take-over, and another recoverer took it over from us and
            # finished it from our temp file. Its work stands; ours is void.
            return
        # Our temp file is still here, so nobody published it: the destination was not there
        # to rename into (a pending bucket removed again each time we made it). A fault, not a
        # finished job: undone, and the caller hands the entry back for a later pass.
        tree.unfence(committing, mine, tmp)
        err = StorageError(exc.errno, exc.strerror or "no such directory", exc.filename)
        err.op = "take-over"
        raise err from None
    except StorageError as exc:
        if exc.applied:  # published; only its fsync failed
            core.drop(committing)
        else:
            tree.unfence(committing, mine, tmp)
        raise
    else:
        counts["requeued" if dest == "pending" else dest] += 1
        if cancel is not None:
            count(hooks, record.queue, "cancelled")
        else:
            # How long the attempt ran: from its start (its deadline less its time limit) to now.
            timeout = record.timeout
            ran = None if deadline is None or timeout is None else max(0.0, core.wall() - deadline + timeout)
            count(hooks, record.queue, "timed_out" if timed_out else "lost", ran)
            count(hooks, record.queue, "retried" if dest == "pending" else "failed")
    core.drop(committing)
    if dest in FINAL_STATES:
        control.clear_cancel(job_id)
        notifier.after_final(job_id)


def _finish_final(core: Core, hooks: Hooks, notifier: Notifier, mine: str, record: Record, state: str,
                  counts: dict[str, int]) -> None:
    """The holder appended its whole result line and died (or hung) before the rename that
    publishes it: publish it."""
    tree, job_id = core.tree, record.id
    try:
        tree.publish_found_result(mine, record, state)
    except FileExistsError:  # a result exists already: ours was a stray copy
        core.drop(mine)
        counts["duplicates_dropped"] += 1
        return
    except FileNotFoundError:
        return  # RACE: another recoverer took it from us after we judged it; it finishes the job
    counts["commits_finished"] += 1
    count(hooks, record.queue, state)
    notifier.after_final(job_id, record.queue)


def _finish_commit(core: Core, hooks: Hooks, notifier: Notifier, job_id: str, old_token: str, mine: str,
                   counts: dict[str, int]) -> bool:
    """Finish a commit of claim ``old_token`` that we took over (``mine``); False when there is
    none to finish and the job is to be judged from its file.

    The committer wrote the job's new version to its temp file before the rename to
    ``.commit``, and publishes that file before it drops ``.commit``. So a whole temp file is
    published now; one a power cut tore was never published (the claim is judged afresh); and
    a ``.commit`` whose temp file is gone had it published already: requeueing the claim then
    would make a second copy of a job that may have run, finished and been removed since (seen
    in the GlusterFS chaos with a retention of 0: a job committed twice)."""
    tree, lay = core.tree, core.layout
    for dest in DESTS:  # a claim commits once, so at most one of these exists
        tmp = lay.commit_tmp_path(old_token, job_id, dest)
        try:
            record = tree.read_record(tmp)
        except FileNotFoundError:
            continue
        except (fs.Unreadable, ValueError):
            return False  # torn by a power cut, so never published: requeue instead
        # Ours (".recover") is named for our token, the temp file for the committer's: named
        # ".commit" of its token again, a crash of ours leaves what the rule above finishes.
        # RACE: a committer judged hung may wake and drop this name once its own publish found
        # the temp file gone: by then it is published, so that drop is right.
        committing = lay.active_path(job_id, old_token, "commit")
        try:
            sc.rename(mine, committing)
        except FileNotFoundError:
            return True  # taken from us meanwhile: whoever took it finishes it
        mine = committing
        try:
            tree.publish(tmp, record, dest)  # a fault leaves the temp file: the next pass uses it
        except (FileExistsError, FileNotFoundError):
            fs.unlink_quietly(tmp)  # the holder finished it itself while we looked
        core.drop(mine)
        counts["commits_finished"] += 1
        count(hooks, record.queue, dest if dest in FINAL_STATES else "retried")
        if dest in FINAL_STATES:
            notifier.after_final(job_id, record.queue)
        return True
    if not tree.commit_pending(old_token, job_id):
        core.drop(mine)  # its new version went out; the fence is all that is left of the claim
        counts["duplicates_dropped"] += 1
        return True
    return False


def quarantine_job(core: Core, path: str, reason: str, exc: Exception, counts: dict[str, int]) -> None:
    # Counted with every quarantine of its pass (_recovery); lost to a power cut only in a store
    # that does not fsync (a durable store's reason says what else it may be).
    if core.tree.quarantine(path, reason) and isinstance(exc, LostJobData) and core.tree.emptiable:
        note_lost(counts, job_id_of(os.path.basename(path)))


def publish_found_result(core: Core, notifier: Notifier, active: str, record: Record, state: str) -> None:
    """A queued file that already ends in a whole result line is a commit whose renames a
    power cut undid (its claim's rename back into the queue too: nothing fsyncs a claim).
    The result stands, so it is published, as recovery publishes a dead holder's; running
    the job again would make a second result for it. Nothing here fails the pull."""
    tree = core.tree
    try:
        tree.publish_found_result(active, record, state)
    except FileExistsError:
        # A result exists already: this was a second copy (a restored backup). Kept aside.
        tree.quarantine(active, f"a second copy of job {record.id}, which is already final")
        return
    except FileNotFoundError:
        return  # RACE: taken over in the instant since our claim; the recoverer finishes it
    except StorageError as exc:
        # Not applied: recovery publishes it from active/ once this process is gone, as it
        # does any claim that ends in a whole result line. Applied: it is in its final
        # directory, only not known durable.
        log.warning("job %s was queued with its result already written; publishing it: %s", record.id, exc)
        if not exc.applied:
            return
    else:
        log.warning("job %s was queued with its %s result already written (a power cut undid the renames of "
                    "its commit); it is published as %s", record.id, state, state)
    try:
        notifier.after_final(record.id, record.queue)
    except StorageError as exc:  # every recovery pass restores missing index entries
        log.warning("job %s is published but its notification was not indexed: %s", record.id, exc)


def count(hooks: Hooks, queue: str, what: str, ran: float | None = None) -> None:
    """The ``ended`` point: ``what`` happened to a job of ``queue`` (a counter's name), after an
    attempt that ran ``ran`` seconds, if one did."""
    for hook in hooks.ended:
        hook(Ended(queue, what, ran))
