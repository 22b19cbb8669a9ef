"""Operations on one store's tree that both the store and recovery perform.

Every transition ends in :meth:`Tree.publish` or :meth:`Tree.publish_final`: a fully written
file is renamed (for final states, with a rename that never replaces an existing result) into
the directory of its new state, and that directory is fsynced before the caller removes any old
entry. A crash between the two leaves the job in two places, which recovery resolves; never in
none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import _fsops as fs
from . import _syscalls as sc
from ._codec import dumps, loads
from ._errors import JobNotFound
from ._layout import ACTIVE_RE, PENDING_RE, SCHEDULED_RE, TARGET_RE, Layout
from ._records import JobState, Parsed, Record

log = logging.getLogger("fsjobstore")

DESTS = ("pending", "scheduled", "fulfilled", "failed")


@dataclass(frozen=True, slots=True)
class Location:
    state: JobState
    path: str
    token: str | None = None  # for ACTIVE: the claim token in the name
    kind: str | None = None  # for ACTIVE: json | commit | recover


class Tree:
    def __init__(self, layout: Layout, *, durable: bool, record_cap: int, target_cap: int) -> None:
        self.layout = layout
        self.durable = durable
        self.record_cap = record_cap
        self.target_cap = target_cap

    # -- reading -------------------------------------------------------------------------------
    def read_record(self, path: str) -> Record:
        """Raises FileNotFoundError, or fs.Unreadable / ValueError naming what is wrong."""
        return self.read_parsed(path).record

    def read_parsed(self, path: str) -> Parsed:
        """Like :meth:`read_record`, with the result line's final state and the whole length."""
        return Record.parse(fs.read_regular(path, self.record_cap))

    def publish_final(self, path: str, job_id: str, state: str) -> str:
        """Move a claimed file that ends in its result line into ``state``'s directory in one
        rename that never replaces an existing result (FileExistsError instead), then make
        the new entry durable. FileNotFoundError: ``path`` was moved (taken over)."""
        dst = self.layout.final_path(state, job_id)
        sc.rename_noreplace(path, dst)
        fs.sync_applied(os.path.dirname(dst), durable=self.durable)
        return dst

    def dest_path(self, record: Record, dest: str) -> str:
        lay = self.layout
        if dest == "pending":
            return lay.pending_path(record.queue, record.priority, record.seq, record.id)
        if dest == "scheduled":
            return lay.scheduled_path(record.not_before or 0.0, record.queue, record.priority,
                                      record.seq, record.id)
        return lay.final_path(dest, record.id)

    def publish(self, tmp_path: str, record: Record, dest: str) -> str:
        """Move a complete temp file into ``dest`` durably; returns the new path.

        Final states go by :meth:`publish_final`: if a result already exists we raise
        FileExistsError instead of replacing it, so at most one result per job can ever exist.
        """
        if dest in ("fulfilled", "failed"):
            return self.publish_final(tmp_path, record.id, dest)
        dst = self.dest_path(record, dest)
        try:
            fs.rename_into(tmp_path, dst, durable=self.durable)
        except FileNotFoundError:
            # A queue's first job: its directory is made on demand (one mkdir per queue, not
            # one failed mkdir per job). Any other ENOENT (our temp file went) is the caller's.
            parent = os.path.dirname(dst)
            if dest != "pending" or fs.is_real_dir(parent):
                raise
            fs.ensure_dir(parent, durable=self.durable)
            fs.rename_into(tmp_path, dst, durable=self.durable)
        return dst

    # -- finding a job by id -------------------------------------------------------------------
    def locate(self, job_id: str) -> Location | None:
        """Find a job's file. Jobs move while we look, so a miss is retried a few times."""
        for _ in range(3):
            found = self._locate_once(job_id)
            if found is not None:
                return found
        return None

    def _locate_once(self, job_id: str) -> Location | None:
        return next(self._locations(job_id), None)

    def _locations(self, job_id: str) -> Iterator[Location]:
        """Every file that is this job under the grammar, later states first: a job moves
        forward, so it cannot slip past us backwards except on retry/release, which the
        callers' repeats cover. Names that merely end like the job's are not it."""
        lay = self.layout
        for state, directory in ((JobState.FULFILLED, lay.fulfilled), (JobState.FAILED, lay.failed)):
            path = os.path.join(directory, f"{job_id}.json")
            if sc.lexists(path):
                yield Location(state, path)
        for name in fs.scan_names(lay.active):
            if name.startswith(f"{job_id}."):
                m = ACTIVE_RE.match(name)
                if m and m["id"] == job_id:
                    yield Location(JobState.ACTIVE, os.path.join(lay.active, name), m["token"], m["kind"])
        tail = f".{job_id}.json"
        for queue in fs.scan_names(lay.pending):
            qdir = lay.pending_dir(queue)
            for name in fs.scan_names(qdir):
                if name.endswith(tail) and PENDING_RE.match(name):
                    yield Location(JobState.PENDING, os.path.join(qdir, name))
        for name in fs.scan_names(lay.scheduled):
            if name.endswith(tail) and SCHEDULED_RE.match(name):
                yield Location(JobState.SCHEDULED, os.path.join(lay.scheduled, name))

    def require(self, job_id: str) -> Location:
        """Like :meth:`locate`, but an unknown id raises :class:`JobNotFound`."""
        loc = self.locate(job_id)
        if loc is None:
            raise JobNotFound(f"no job with id {job_id!r} in {self.layout.root}")
        return loc

    def exists_elsewhere(self, job_id: str, not_path: str) -> bool:
        """True if a copy of the job exists at any path other than ``not_path``."""
        for _ in range(2):  # a copy in motion can be missed once, as in locate()
            for loc in self._locations(job_id):
                if loc.path != not_path:
                    return True
        return False

    # -- notification targets and the notify index --------------------------------------------
    def read_targets(self, job_id: str) -> list[tuple[str, Any, float]]:
        """(key, target, queued_at) of every waiting target, oldest first; bad files quarantined."""
        tdir = self.layout.target_dir(job_id)
        out = []
        for name in fs.scan_names(tdir):
            m = TARGET_RE.match(name)
            if not m:
                continue
            path = os.path.join(tdir, name)
            try:
                doc = loads(fs.read_regular(path, self.target_cap))
                if not isinstance(doc, dict) or "target" not in doc:
                    raise ValueError("not a target document")
                queued = doc.get("queued_at")
                out.append((m["key"], doc["target"], float(queued) if isinstance(queued, int | float) else 0.0))
            except FileNotFoundError:
                continue
            except (fs.Unreadable, ValueError) as exc:
                self.quarantine(path, f"target file {exc}")
        out.sort(key=lambda item: (item[2], item[0]))
        return out

    def has_targets(self, job_id: str) -> bool:
        tdir = self.layout.target_dir(job_id)
        # Most jobs never have targets: one stat answers for them without listing anything.
        return sc.lexists(tdir) and any(TARGET_RE.match(n) for n in fs.scan_names(tdir))

    def write_notify_entry(self, job_id: str, tmp_path: str, not_before: float, attempts: int,
                           error: str | None) -> None:
        """Create or replace ``jobs/notify/<id>.json`` atomically."""
        doc = {"id": job_id, "not_before": not_before, "attempts": attempts, "error": error}
        fs.write_new(tmp_path, dumps(doc) + b"\n", durable=self.durable)
        fs.rename_into(tmp_path, self.layout.notify_path(job_id), durable=self.durable)

    def read_notify_entry(self, job_id: str) -> tuple[float, int] | None:
        """(not_before, attempts), or None if there is no usable entry. An unusable one (not a
        regular file, not our JSON) is quarantined; the caller decides whether to write anew."""
        path = self.layout.notify_path(job_id)
        try:
            doc = loads(fs.read_regular(path, 64 * 1024))
            not_before, attempts = doc["not_before"], doc["attempts"]
            if isinstance(not_before, bool) or not isinstance(not_before, int | float):
                raise ValueError("not_before is not a number")
            if isinstance(attempts, bool) or not isinstance(attempts, int):
                raise ValueError("attempts is not an integer")
            return float(not_before), attempts
        except FileNotFoundError:
            return None
        except (fs.Unreadable, ValueError, TypeError, KeyError) as exc:
            self.quarantine(path, f"notify entry {exc}")
            return None

    def is_final(self, job_id: str) -> bool:
        return any(sc.lexists(self.layout.final_path(s, job_id)) for s in ("fulfilled", "failed"))

    # -- quarantine ----------------------------------------------------------------------------
    def quarantine(self, path: str, reason: str) -> bool:
        """Move ``path`` aside with a reason file; False if it was already gone."""
        lay = self.layout
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
            fs.write_new(dest + ".reason", dumps(doc) + b"\n", durable=False)
        log.warning("quarantined %s: %s", path, reason)
        return True
