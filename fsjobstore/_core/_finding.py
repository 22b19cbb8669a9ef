"""Finding a job by id: the one place each state can hold it, looked up in the order a job moves
(FORMAT.md, "Finding jobs by id, and counting them"). A mixin of :class:`_tree.Tree`, which has
the layout and the record cap it reads with."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .._errors import JobNotFound
from .._format._job import JobState
from .._format._layout import (
    ACTIVE_RE,
    DEFERRED_RE,
    GENERATED_ID_RE,
    PENDING_RE,
    SCHEDULED_RE,
    SEQ_PER_BUCKET,
    WAITING_RE,
    Layout,
    pending_bucket,
    prio_field,
    seq_of_generated,
)
from .._format._records import FINAL_STATES, Record
from .._os import _files as fs
from .._os import _syscalls as sc
from . import _buckets


@dataclass(frozen=True, slots=True)
class Location:
    state: JobState
    path: str
    token: str | None = None  # for ACTIVE: the claim token in the name
    kind: str | None = None  # for ACTIVE: json | commit | recover


class Finding:
    layout: Layout
    record_cap: int

    def locate(self, job_id: str) -> Location | None:
        """Find a job's file. Jobs move while we look, so a miss is retried a few times."""
        for _ in range(3):
            found = next(self._locations(job_id), None)
            if found is not None:
                return found
        return None

    def _locations(self, job_id: str, *, forward: bool = False, thorough: bool = False) -> Iterator[Location]:
        """Every file that is this job under the grammar. Names that merely end like the job's
        are not it. By default later states come first, so that a job left in two places by a
        crash is reported in the later one; ``forward`` looks in the order a job moves."""
        def pending(job_id: str) -> Iterator[Location]:
            return self._in_pending(job_id, thorough=thorough)

        places = (self._in_final, self._in_active, pending, self._in_waiting, self._in_scheduled, self.in_deferred)
        for look in reversed(places) if forward else places:
            yield from look(job_id)

    def seen_unfinished(self, job_ids: Iterable[str], *, deferred: bool = True) -> set[str]:
        """Those of ``job_ids`` seen, at some moment of this call, in a state that is not final:
        for a sweep that asks it of many jobs at once, where a :meth:`locate` each would list
        ``active/`` and more per job (a listing is one call locally and a dozen milliseconds on a
        network filesystem). ``active/``, ``waiting/``, ``scheduled/`` and ``deferred/`` are listed
        once; pending jobs are looked up by id, or, where that takes more calls, read from a
        listing of every bucket. A job not returned may be final, gone, or may have moved while
        we looked: ask :meth:`locate`. RACE: a returned job may have ended since it was seen;
        a caller only passes over those, so the worst is a pass that leaves one for the next.
        ``deferred=False``: seen anywhere but ``deferred/`` (not final, nor waiting for parents)."""
        lay = self.layout
        seen: set[str] = set()
        places = [(lay.active, ACTIVE_RE), (lay.waiting, WAITING_RE), (lay.scheduled, SCHEDULED_RE)]
        for directory, pattern in places + [(lay.deferred, DEFERRED_RE)] * deferred:
            for name in fs.scan_names(directory):
                m = pattern.match(name)
                if m:
                    seen.add(m["id"])
        rest = [job_id for job_id in job_ids if job_id not in seen]
        buckets = [(qdir, bucket) for qdir in (lay.pending_dir(q) for q in fs.scan_names(lay.pending))
                   for bucket in _buckets.list_queue(qdir)[0]] if rest else []
        if len(buckets) < 3 * len(rest):  # a lookup by id takes about three calls
            for qdir, bucket in buckets:
                for name in _buckets.names_in(os.path.join(qdir, bucket)):
                    m = PENDING_RE.match(name)
                    if m:
                        seen.add(m["id"])
            return {job_id for job_id in job_ids if job_id in seen}
        return {job_id for job_id in job_ids
                if job_id in seen or next(self._in_pending(job_id), None) is not None}

    def _in_final(self, job_id: str) -> Iterator[Location]:
        for state, directory in self.layout.final_dirs():
            path = os.path.join(directory, f"{job_id}.json")
            if sc.lexists(path):
                yield Location(JobState(state), path)

    def _in_active(self, job_id: str) -> Iterator[Location]:
        active = self.layout.active
        for name in fs.scan_names(active):
            if name.startswith(f"{job_id}."):
                m = ACTIVE_RE.match(name)
                if m and m["id"] == job_id:
                    yield Location(JobState.ACTIVE, os.path.join(active, name), m["token"], m["kind"])

    def _in_pending(self, job_id: str, *, thorough: bool = False) -> Iterator[Location]:
        """A pending job's file by id, reading the names of buckets, not of jobs: where its
        name is found from the id (FORMAT.md, "Finding jobs by id"). ``thorough`` also looks
        everywhere for a job an older version generated with this id (a uuid4), as a create
        of a chosen id of that shape must."""
        seen: set[str] = set()
        for queue, prio, seq in self._pending_keys(job_id, thorough):
            for loc in self._pending_at(job_id, queue, prio, seq):
                if loc.path not in seen:
                    seen.add(loc.path)
                    yield loc

    def _pending_keys(self, job_id: str, thorough: bool) -> list[tuple[str | None, str | None, str]]:
        """Where a pending job with this id can be, as ``(queue, P, SEQ)``, None for any:
        where its reservation says (a chosen id), in the second a generated id begins with,
        and ``SEQ`` "" for anywhere (an id of an older version, a damaged reservation)."""
        keys: list[tuple[str | None, str | None, str]] = []
        try:
            record = Record.parse(fs.read_regular(self.layout.id_marker(job_id), self.record_cap)).record
        except FileNotFoundError:
            record = None
        except (NotADirectoryError, fs.Unreadable, ValueError):
            return [(None, None, "")]  # a planted or damaged reservation: look everywhere
        if record is not None:
            if record.id != job_id:
                return [(None, None, "")]
            keys.append((record.queue, prio_field(record.priority), record.seq))
        # A reservation may be a create's of a chosen id that is another job's generated id
        # (it is refused once found: _create): look where the generated one would be too.
        seq = seq_of_generated(job_id)
        if seq is not None:
            keys.append((None, None, seq))
        elif GENERATED_ID_RE.match(job_id) and (record is None or thorough):
            keys.append((None, None, ""))  # generated by a version before buckets: anywhere
        return keys

    def _pending_at(self, job_id: str, queue: str | None, prio: str | None, seq: str) -> Iterator[Location]:
        lay = self.layout
        name_tail = f".{seq}.{job_id}.json" if seq else f".{job_id}.json"
        for q in [queue] if queue is not None else fs.scan_names(lay.pending):
            qdir = lay.pending_dir(q)
            if prio is not None:
                buckets = [pending_bucket(prio, seq)]  # the one place it can be, but for:
                flat = f"{qdir}/{prio}{name_tail}"  # a store from before buckets (Tree.settle_flat)
                if sc.lexists(flat):
                    yield Location(JobState.PENDING, flat)
            else:
                buckets, others = _buckets.list_queue(qdir)
                if seq:  # a generated id: the buckets of its second, one per priority in use
                    sec = f".{int(seq) // SEQ_PER_BUCKET:011d}"
                    buckets = [b for b in buckets if b.endswith(sec)]
                else:  # anywhere: every bucket is listed, and the flat names
                    for name in others:
                        if name.endswith(name_tail) and PENDING_RE.match(name):
                            yield Location(JobState.PENDING, os.path.join(qdir, name))
            for bucket in buckets:
                bdir = os.path.join(qdir, bucket)
                if seq:
                    path = f"{bdir}/{bucket[:7]}{name_tail}"
                    if sc.lexists(path):
                        yield Location(JobState.PENDING, path)
                    continue
                for name in _buckets.names_in(bdir):
                    if name.endswith(name_tail) and PENDING_RE.match(name):
                        yield Location(JobState.PENDING, os.path.join(bdir, name))

    def _in_scheduled(self, job_id: str) -> Iterator[Location]:
        return self._named(self.layout.scheduled, SCHEDULED_RE, JobState.SCHEDULED, job_id)

    def _in_waiting(self, job_id: str) -> Iterator[Location]:  # parked by a limit (_limit_gate): pending
        return self._named(self.layout.waiting, WAITING_RE, JobState.PENDING, job_id)

    def in_deferred(self, job_id: str) -> Iterator[Location]:
        return self._named(self.layout.deferred, DEFERRED_RE, JobState.DEFERRED, job_id)

    @staticmethod
    def _named(directory: str, pattern: re.Pattern[str], state: JobState, job_id: str) -> Iterator[Location]:
        """The files of ``job_id`` in a directory whose names hold ``.<id>.`` (then ``json``, or
        for a parked job its claim's token)."""
        part = f".{job_id}."
        for name in fs.scan_names(directory):
            m = pattern.match(name) if part in name else None
            if m and m["id"] == job_id:
                yield Location(state, os.path.join(directory, name))

    def exists(self, job_id: str) -> bool:
        """Whether a job with this id exists, even while it moves.

        One pass in the order a job moves (scheduled, pending, active, final) sees it however far
        forward it moves meanwhile; only a move back (a release, a retry) during the pass can hide
        it, and a pass in the opposite order sees those. Twice each, so a miss would take four
        moves in opposite directions, each timed into one pass.
        """
        for _ in range(2):
            for forward in (True, False):
                if next(self._locations(job_id, forward=forward, thorough=True), None) is not None:
                    return True
        return False

    def require(self, job_id: str) -> Location:
        """Like :meth:`locate`, but an unknown id raises :class:`JobNotFound`."""
        loc = self.locate(job_id)
        if loc is None:
            raise JobNotFound(f"no job with id {job_id!r} in {self.layout.root}")
        return loc

    def exists_elsewhere(self, job_id: str, not_path: str, not_file: os.stat_result | None = None) -> bool:
        """True if a copy of the job exists at any path other than ``not_path``; with
        ``not_file``, a name of that file (moved there from ``not_path`` by someone else: a
        rename keeps the inode) is not a copy either. A spent ``.commit`` (its new version
        published, a crash before its drop) is no copy: the job went on from what it
        published, and taking it for one dropped the job's only copy (seen in the chaos run of
        the worker runtime: the spent fence was then dropped in its turn, and the job lost)."""
        for _ in range(2):  # a copy in motion can be missed once, as in locate()
            for loc in self._locations(job_id):
                # (a name gone meanwhile moved on: the second round finds it where it went)
                if (loc.path != not_path and (loc.state is not JobState.PENDING or self._listed(loc.path))
                        and (loc.kind != "commit" or self.commit_pending(loc.token or "", job_id))
                        and (not_file is None or fs.names_file(loc.path, not_file) is False)):
                    return True
        return False

    def commit_pending(self, token: str, job_id: str) -> bool:
        """Whether tmp/ lists a commit temp file of claim ``token`` for ``job_id``, so that its
        ``.commit`` still stands for the job (FORMAT.md, "fail with retry"). "Gone" is judged
        from a listing, which asks the server, not from a name lookup a network filesystem's
        client may answer from its cache (as :meth:`_listed` does)."""
        prefix = os.path.basename(self.layout.tmp_path(token, "commit", f"{job_id}."))
        return any(name.startswith(prefix) for name in fs.scan_names(self.layout.tmp))

    @staticmethod
    def _listed(path: str) -> bool:
        """Whether ``path``'s name is in its directory's listing. A pending job is found by id
        with an lstat of the one name it can have (_in_pending), and a network filesystem's
        client may answer that from a cache for a moment after another host renamed the name
        away (FUSE's entry timeout: seen on GlusterFS, where a take-over then dropped the only
        copy of a job another host had just claimed). A listing asks the server. One bucket."""
        directory, name = os.path.split(path)
        return name in _buckets.names_in(directory)

    def is_final(self, job_id: str) -> bool:
        return any(sc.lexists(self.layout.final_path(s, job_id)) for s in FINAL_STATES)
