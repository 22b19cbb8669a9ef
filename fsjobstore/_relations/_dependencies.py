"""Jobs that wait for others (``create(after=[...])``): FORMAT.md, "Dependencies".

A job made after parents that are not all fulfilled waits in ``jobs/deferred/<SEQ>.<queue>.<id>.json``
(state ``deferred``). ``deps/<parent>/<child>`` (an empty file per parent and child) says who waits
for whom; it is made before the child is published, so whoever makes a parent final finds every
child that was waiting for it.

**Resolving** a child (:meth:`Deps.resolve`): once every parent is final, it is *promoted* (a rename
out of ``deferred/`` into pending, or scheduled if its ``run_at`` is still to come) if they were all
fulfilled, or if it was made with ``on_parent_failure="run"``; otherwise it is cancelled, saying
which parent failed, was cancelled or is gone. Then its ``deps/`` entries go. Whoever makes a job
final resolves its children at once (``Notifier.after_final``, on every path a job becomes final),
so a chain runs without waiting for a sweep; a child cancelled this way resolves its own children
in turn (iteratively: a chain of thousands does not recurse). A create resolves its child once
more after publishing it, for parents that became final meanwhile. Two processes resolving one
child race on its rename (promotion) or its claim (cancel): one wins, the other finds it gone.

**Sweeps** (every recovery pass) resolve the children of every parent in ``deps/`` that is final or
gone, and drop ``deferred/`` copies of jobs that also exist elsewhere (a promotion a power cut half
undid). A job's removal resolves its children first, while it is still there to be read (a purged
parent that never ran is *gone*: its children are cancelled, or run).

Cycles cannot be made: a parent must exist when its child is made, or be made before it in the
same group (``_groups``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from .._core._core import Core
from .._errors import InvalidRequest, InvalidState, JobNotFound, JobStoreError
from .._format._job import JobState
from .._format._layout import DEFERRED_RE, DEP_RE
from .._format._records import Record
from .._os import _files as fs
from .._os import _syscalls as sc

log = logging.getLogger("fsjobstore")

# Seconds after which a deps/ entry naming a job found nowhere is taken for a removed job's, not
# for one being created (whose entries come just before its publish).
STALE_ENTRY = 60.0

Cancel = Callable[[str, str], object]  # cancel(job_id, reason): ById.cancel

class Deps:
    """Resolution of waiting children, for one store (see the module docstring)."""

    def __init__(self, core: Core, cancel: Cancel) -> None:
        self._core = core
        self._cancel = cancel
        self._local = threading.local()

    # -- before create, at a retry (the store's hooks: _core._hooks.Parents) -------------------------
    def states(self, after: Iterable[str]) -> dict[str, str]:
        """Each parent's state name, or ``"gone"``."""
        states = {}
        for parent in after:
            loc = self._core.tree.locate(parent)
            states[parent] = "gone" if loc is None else loc.state.value
        return states

    def place(self, record: Record) -> str | None:
        """Refuse parents that do not exist; the destination a new job with ``after`` takes:
        None when every parent is fulfilled already (its usual one), else ``"deferred"``."""
        if record.id in record.after:
            raise InvalidRequest(f"job {record.id} cannot be made after itself")
        states = self.states(record.after)
        missing = [p for p, s in states.items() if s == "gone"]
        if missing:
            raise JobNotFound(f"after names no job {missing[0]!r} in {self._core.layout.root}: a job can be made "
                              "after jobs that exist, or after jobs made before it in the same group")
        if all(s == "fulfilled" for s in states.values()):
            return None
        return "deferred"

    def place_retry(self, record: Record) -> str:
        """Where a retried job goes: ``pending``, or ``deferred`` while a parent is not final;
        :class:`InvalidState` while a parent failed, was cancelled or is gone, and the job would be
        cancelled again at once."""
        states = self.states(record.after)
        bad = [(p, s) for p, s in states.items() if s in ("failed", "cancelled", "gone")]
        if bad and record.on_parent_failure == "cancel":
            parent, state = bad[0]
            how = "is gone" if state == "gone" else f"is {state}"
            raise InvalidState(f"job {record.id} waits for job {parent}, which {how}: it would be cancelled "
                               "again. Retry that job first (or make this one with on_parent_failure=\"run\")")
        if any(s not in ("fulfilled", "failed", "cancelled", "gone") for s in states.values()):
            return "deferred"
        return "pending"

    def link(self, record: Record) -> None:
        """``deps/<parent>/<child>`` for each parent, durably, before the child is published."""
        core = self._core
        tree, lay = core.tree, core.layout
        for parent in record.after:
            path = lay.dep_path(parent, record.id)
            for _ in range(3):
                try:
                    sc.mknod(path, tree.perms.file_mode)
                    break
                except FileExistsError:
                    break  # a create of this very record that was tried again
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):
                        tree.ensure_dir(lay.deps)
                        tree.ensure_dir(lay.dep_dir(parent))
            else:
                raise InvalidState(f"could not note that job {record.id} waits for {parent}; try again")
            fs.sync_applied(lay.dep_dir(parent), durable=core.durable)

    def recheck(self, record: Record) -> None:
        """After a deferred job is published: resolve it against parents that became final
        meanwhile. RACE: one that ended between this job's ``deps/`` entries and its publish
        found the entry and no deferred job, and its resolution went by (and left the entries
        alone: :meth:`resolve`); so this job resolves itself, against every parent at once."""
        if any(s in ("fulfilled", "failed", "cancelled", "gone") for s in self.states(record.after).values()):
            self.resolve(record.id)

    # -- resolving ------------------------------------------------------------------------------
    def resolve_children(self, parent: str) -> None:
        """Resolve the children waiting for ``parent`` (it became final, or is gone). Nested
        calls (a cancelled child's own children) are queued and done by the outermost one."""
        queue: list[str] | None = getattr(self._local, "queue", None)
        if queue is not None:
            queue.append(parent)
            return
        if not self._core.exists(self._core.layout.dep_dir(parent)):
            return  # the common case: nobody waits for it (asked on every final job)
        self._local.queue = queue = [parent]
        try:
            while queue:
                self._resolve_children_of(queue.pop(0))
        finally:
            self._local.queue = None

    def _resolve_children_of(self, parent: str) -> None:
        directory = self._core.layout.dep_dir(parent)
        for child in fs.scan_names(directory):
            if DEP_RE.match(child):
                try:
                    self.resolve(child)
                except JobStoreError as exc:  # a fault: the entry stays, for the next sweep
                    log.warning("job %s waits for %s and could not be resolved now: %s", child, parent, exc)
        with contextlib.suppress(OSError):
            sc.rmdir(directory)  # ENOTEMPTY: a child made meanwhile, or one left for the sweep

    def resolve(self, child: str) -> str | None:
        """Promote or cancel ``child`` if all its parents are final: ``"promoted"``,
        ``"cancelled"``, or None (still waiting, or not deferred any more)."""
        core = self._core
        loc = next(core.tree.in_deferred(child), None)
        if loc is None:
            # Promoted or cancelled already: its entries are stale. RACE: or not published yet
            # (a create between its deps/ entries and its publish, whose recheck then resolves
            # it), or gone: a child found nowhere keeps its entries until they are old, so a
            # parent that ends later still finds it.
            other = core.tree.locate(child)
            if other is None:
                self._unlink_entries(child, None, older_than=STALE_ENTRY)
            elif other.state is not JobState.DEFERRED:
                self._unlink_entries(child, None)
            return None
        try:
            record = core.tree.read_record(loc.path)
        except FileNotFoundError:
            return None
        except (fs.Unreadable, ValueError) as exc:
            core.tree.quarantine(loc.path, f"deferred job file {exc}")
            return None
        states = self.states(record.after)
        if any(s not in ("fulfilled", "failed", "cancelled", "gone") for s in states.values()):
            return None
        bad = [(p, s) for p, s in states.items() if s != "fulfilled"]
        if bad and record.on_parent_failure == "cancel":
            parent, state = bad[0]
            why = f"its parent {parent} was removed before it was fulfilled" if state == "gone" \
                else f"its parent {parent} {'was cancelled' if state == 'cancelled' else 'failed'}"
            try:
                self._cancel(child, why)
            except InvalidState:
                return None  # it moved on meanwhile (another resolver, a purge)
            done = "cancelled"
        elif not self._promote(loc.path, record):
            return None
        else:
            done = "promoted"
        self._unlink_entries(child, record.after)
        return done

    def _promote(self, path: str, record: Record) -> bool:
        core = self._core
        due = record.not_before is not None and record.not_before > core.wall()
        dest = "scheduled" if due else "pending"
        try:
            if dest == "pending":
                core.tree.into_pending(path, core.tree.dest_path(record, dest))
                core.tree.bell("work")
            else:
                core.tree.rename_into(path, core.tree.dest_path(record, dest))
        except FileNotFoundError:
            return False  # another process promoted or cancelled it first
        core.pending.note_published(record, dest)
        return True

    def _unlink_entries(self, child: str, parents: Iterable[str] | None, older_than: float | None = None) -> None:
        """Unlink the ``deps/`` entries naming ``child``: under ``parents``, or (None) under every
        parent that has one, only those made more than ``older_than`` seconds ago if given."""
        lay = self._core.layout
        if parents is None:  # not deferred any more: whatever entries name it are stale
            oldest = math.inf if older_than is None else self._core.wall() - older_than
            made = {p: _entry_made(lay.dep_path(p, child)) for p in fs.scan_names(lay.deps) if DEP_RE.match(p)}
            parents = [p for p, at in made.items() if at is not None and at < oldest]
        for parent in parents:
            fs.unlink(lay.dep_path(parent, child))
            with contextlib.suppress(OSError):
                sc.rmdir(lay.dep_dir(parent))  # ENOTEMPTY: others still wait for it

    # -- sweeps (recovery) ------------------------------------------------------------------------
    def sweep(self, *, deep: bool, each: Callable[[str], AbstractContextManager[None]]) -> int:
        """Resolve the children of parents that are final or gone; ``deep`` (after a reboot):
        also drop deferred copies of jobs that exist elsewhere. How many were resolved. ``each``
        guards the repairs of one parent (``Sweep.each``)."""
        core, lay = self._core, self._core.layout
        resolved = 0
        parents = [p for p in fs.scan_names(lay.deps) if DEP_RE.match(p)]
        # Most parents are still to run: seen so in one listing per directory, not looked for one
        # by one (on a network filesystem that took this sweep minutes, past a lease).
        unfinished = core.tree.seen_unfinished(parents) if parents else set()
        for parent in parents:
            if parent in unfinished:
                continue
            with each(parent):
                loc = core.tree.locate(parent)
                if loc is not None and not loc.state.is_final:
                    continue
                for child in fs.scan_names(lay.dep_dir(parent)):
                    if DEP_RE.match(child) and self.resolve(child) is not None:
                        resolved += 1
                with contextlib.suppress(OSError):
                    sc.rmdir(lay.dep_dir(parent))
        if deep:  # promoted, and its old name came back (a power cut): the copy goes
            copies = {m["id"]: os.path.join(lay.deferred, name)
                      for name in fs.scan_names(lay.deferred) if (m := DEFERRED_RE.match(name))}
            elsewhere = core.tree.seen_unfinished(copies, deferred=False) if copies else set()
            for job_id, path in copies.items():
                with each(job_id):
                    if job_id in elsewhere or core.tree.is_final(job_id):
                        core.drop(path)
        return resolved


def _entry_made(path: str) -> float | None:
    """When the ``deps/<parent>/<child>`` entry at ``path`` was made (its mtime), or None if it is
    not there. ESTALE (past lstat's own retries): its parent's directory was removed on another
    host (seen on the GlusterFS bed, where it killed a worker): no entry is left there. Only here:
    elsewhere a stale answer is no proof of absence."""
    try:
        return sc.lstat(path).st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ESTALE):
            raise
        return None
