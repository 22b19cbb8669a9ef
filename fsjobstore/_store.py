"""JobStore: create jobs, lease them to workers, commit results, and hand results to notifiers."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import os
import stat
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from . import _fsops as fs
from . import _syscalls as sc
from ._codec import check_job_id, check_queue, dumps
from ._errors import (
    CorruptJob,
    InvalidRequest,
    InvalidState,
    JobExists,
    JobNotFound,
    JobStoreError,
    LeaseLost,
    StorageError,
    StoreClosed,
    StoreFormatError,
    UntrustedStore,
    ValueTooLarge,
)
from ._handles import NotificationLease, OnCompromised, WorkLease
from ._layout import (
    FORMAT_VERSION,
    MAX_PRIORITY,
    MIN_PRIORITY,
    PENDING_RE,
    SCHEDULED_RE,
    Layout,
    seq_field,
    token_owner,
)
from ._leases import OwnerLease, OwnerProbe
from ._notify import Notifier
from ._pending import Pending
from ._records import Job, JobState, Record
from ._recovery import RecoveryReport, new_counts, recover, take_over
from ._tree import Location, Tree
from ._values import MAX_ERROR_CHARS, as_bytes, default_backoff, due_time, error_text, retry_delay
from ._verify import locks_prove_death
from ._wakeup import Waker

log = logging.getLogger("fsjobstore")

_LIVE_STORES: weakref.WeakSet[JobStore] = weakref.WeakSet()


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """A snapshot of one store's counts, from a single listing of each directory."""

    pending: int
    scheduled: int
    active: int
    fulfilled: int
    failed: int
    notifications: int  # final jobs with targets still waiting
    quarantined: int
    pending_by_queue: Mapping[str, int]
    oldest_pending_age: float | None  # seconds since the oldest pending job was created
    watching: bool  # whether this process gets inotify wake-ups


class JobStore:
    """A job store in one directory, shared by any number of threads and processes.

    :param path: the store's directory; created if missing. Relative paths are resolved once.
    :param durable: fsync files and directories before acknowledging (see FORMAT.md). With
        False, every operation is still atomic under process crashes, but a power loss may undo
        recent acknowledged operations.
    :param lease_duration: seconds without a heartbeat after which another process may take a
        hung holder's job. A dead holder's jobs are taken at once, whatever this says.
    :param heartbeat_interval: seconds between heartbeats (default ``lease_duration / 4``).
    :param max_attempts: default for jobs that do not set their own.
    :param backoff: ``attempt -> seconds`` before a failed job (or notification) is retried.
    :param poll_interval: longest a waiting puller sleeps before rescanning, whether or not
        inotify said anything (it cannot see other hosts, and it can overflow).
    :param lock_takeover: whether a free ``flock`` proves a holder dead, so its jobs are taken at
        once. None (the default) trusts locks on local filesystems and not on network ones
        (NFS, CIFS, FUSE, ...), where they may not reach other hosts; untrusted, a holder is
        replaced only after ``lease_duration`` without heartbeats. ``fsjobstore verify`` checks.
    :param clock: monotonic seconds, for leases and timeouts (injectable for tests).
    :param wall_clock: epoch seconds, for ``run_at``/``delay`` and timestamps.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durable: bool = True,
        lease_duration: float = 30.0,
        heartbeat_interval: float | None = None,
        max_attempts: int = 3,
        backoff: Callable[[int], float] = default_backoff,
        max_value_bytes: int = 16 * 1024 * 1024,
        max_request_bytes: int = 1024 * 1024,
        poll_interval: float = 1.0,
        watch: bool = True,
        lock_takeover: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not lease_duration > 0:
            raise InvalidRequest(f"lease_duration must be positive, got {lease_duration!r}")
        heartbeat = lease_duration / 4 if heartbeat_interval is None else heartbeat_interval
        if not 0 < heartbeat <= lease_duration / 2:
            # A holder judges itself stalled after 0.75 x lease_duration without a beat, so beats
            # must come well within that, or every beat would look like a stall.
            raise InvalidRequest(
                f"heartbeat_interval must be positive and at most lease_duration / 2 ({lease_duration / 2}), "
                f"got {heartbeat!r}"
            )
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidRequest(f"max_attempts must be a positive integer, got {max_attempts!r}")
        # The caller chose this path, so a symlink to the store is resolved once; inside the
        # store, symlinked directories are refused (see _fsops.check_trusted).
        self.path = os.path.realpath(os.path.abspath(os.fspath(path)))
        self.durable = durable
        self.lease_duration = float(lease_duration)
        self.heartbeat_interval = float(heartbeat)
        self.max_attempts = max_attempts
        self.max_value_bytes = max_value_bytes
        self.max_request_bytes = max_request_bytes
        self.poll_interval = poll_interval
        self._backoff = backoff
        self._watch = watch
        self._clock = clock
        self._wall = wall_clock
        self._layout = Layout(self.path)
        # Worst cases once serialised: a text value doubles ('"' escapes), an error's
        # characters can take 6 bytes each (\uXXXX); the request was measured serialised.
        record_cap = 2 * max_value_bytes + max_request_bytes + MAX_ERROR_CHARS * 6 + 65536
        self._tree = Tree(self._layout, durable=durable, record_cap=record_cap,
                          target_cap=max_request_bytes + 4096)
        self.lock_takeover = locks_prove_death(self.path) if lock_takeover is None else lock_takeover
        self._probe = OwnerProbe(self._layout, self.lease_duration, clock, trust_locks=self.lock_takeover)
        self._mutex = threading.RLock()
        self._owner: OwnerLease | None = None
        self._tokens = itertools.count(1)
        self._last_seq = 0
        self._held_work: dict[str, WorkLease] = {}
        self._litter: set[str] = set()
        self._pending = self._new_pending()
        self._notifier = self._new_notifier()
        self._waker: Waker | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_beat = clock()
        self._closed = False
        self._pid = os.getpid()
        try:
            self._open_tree()
        except BaseException:
            if self._owner is not None:  # writing the marker may have made us an owner
                self._owner.close()
            raise
        _LIVE_STORES.add(self)

    # == opening ===================================================================================
    def _open_tree(self) -> None:
        lay = self._layout
        fs.makedirs(lay.root)
        if not fs.is_real_dir(lay.root):
            raise UntrustedStore(f"{lay.root} exists and is not a directory")
        fs.check_trusted(lay.root)
        for directory in lay.all_dirs():
            fs.ensure_dir(directory, durable=self.durable)
            fs.check_trusted(directory)
        self._check_marker()

    def _check_marker(self) -> None:
        lay = self._layout
        try:
            data = fs.read_regular(lay.marker, 65536)
        except FileNotFoundError:
            tmp = lay.tmp_path(self._new_token(), "aux", "marker")
            fs.write_new(tmp, dumps({"format": FORMAT_VERSION, "created_at": time.time()}) + b"\n",
                         durable=self.durable)
            try:
                fs.link_into(tmp, lay.marker, durable=self.durable)
            except FileExistsError:
                pass  # another process initialised the store at the same moment
            finally:
                fs.unlink(tmp)
            data = fs.read_regular(lay.marker, 65536)
        except fs.Unreadable as exc:
            raise StoreFormatError(f"{lay.marker} {exc}") from None
        try:
            version = json.loads(data).get("format")
        except (ValueError, AttributeError):
            raise StoreFormatError(f"{lay.marker} is not valid JSON") from None
        if version != FORMAT_VERSION:
            raise StoreFormatError(
                f"{lay.root} holds a format {version!r} store; this fsjobstore reads format {FORMAT_VERSION}"
            )

    # == small internals used by the handles and by recovery ========================================
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"the JobStore at {self.path} is closed")
        if os.getpid() != self._pid:
            self._after_fork()

    def _ensure_owner(self) -> OwnerLease:
        with self._mutex:
            if self._owner is None:
                self._owner = OwnerLease(self._layout, self.lease_duration)
            return self._owner

    def _owner_id(self) -> str:
        return self._ensure_owner().owner

    def _new_token(self) -> str:
        return f"{self._owner_id()}-{next(self._tokens):x}"

    def _next_seq(self) -> str:
        with self._mutex:
            # Strictly increasing within a process, so FIFO holds even when the clock repeats.
            self._last_seq = max(time.time_ns(), self._last_seq + 1)
            return seq_field(self._last_seq)

    def _new_pending(self) -> Pending:
        return Pending(self._layout, self._tree, durable=self.durable, poll_interval=self.poll_interval,
                       clock=self._clock, wall=self._wall)

    def _new_notifier(self) -> Notifier:
        return Notifier(self._tree, self._probe, wall=self._wall, backoff=self._backoff,
                        new_token=self._new_token, owner_id=self._owner_id, note_due=self._pending.note_due)

    def _after_fork(self) -> None:
        """A forked child must not reuse the parent's owner lock, claims or threads."""
        self._pid = os.getpid()
        if self._owner is not None:
            self._owner.abandon_after_fork()
        self._owner = None
        self._held_work = {}
        self._litter = set()
        self._thread = None
        if self._waker is not None:
            self._waker.abandon_after_fork()
        self._waker = None
        self._mutex = threading.RLock()
        self._stop = threading.Event()
        self._pending = self._new_pending()
        self._notifier = self._new_notifier()

    # == creating ==================================================================================
    def create(
        self,
        request: Any,
        *,
        queue: str = "default",
        priority: int = 0,
        delay: float | timedelta | None = None,
        run_at: float | datetime | None = None,
        max_attempts: int | None = None,
        job_id: str | None = None,
    ) -> Job:
        """Store a new job and return its snapshot once it is durable.

        ``priority``: lower runs sooner (-999,999 .. 999,999); equal priorities run in creation
        order. ``delay`` (seconds or timedelta) or ``run_at`` (epoch seconds or an aware
        datetime) holds the job back until then. ``job_id`` lets the caller choose the id; using
        an id twice raises :class:`JobExists`, so it doubles as an idempotency key.
        """
        self._check_open()
        queue = check_queue(queue)
        if isinstance(priority, bool) or not isinstance(priority, int) or not (
            MIN_PRIORITY <= priority <= MAX_PRIORITY
        ):
            raise InvalidRequest(f"priority must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {priority!r}")
        attempts_cap = self.max_attempts if max_attempts is None else max_attempts
        if isinstance(attempts_cap, bool) or not isinstance(attempts_cap, int) or not 1 <= attempts_cap <= 1_000_000:
            raise InvalidRequest(f"max_attempts must be an integer in [1, 1000000], got {max_attempts!r}")
        explicit = job_id is not None
        job_id = check_job_id(job_id) if explicit else uuid.uuid4().hex
        request_bytes = dumps(request, what="request")
        if len(request_bytes) > self.max_request_bytes:
            raise ValueTooLarge(f"request is {len(request_bytes)} bytes; max_request_bytes is {self.max_request_bytes}")
        now = self._wall()
        not_before = due_time(now, delay, run_at)
        record = Record(id=job_id, queue=queue, priority=priority, request=request, created_at=now,
                        seq=self._next_seq(), max_attempts=attempts_cap, not_before=not_before)
        dest = "scheduled" if not_before is not None and not_before > now else "pending"
        token = self._new_token()
        tmp = self._layout.tmp_path(token, "newid" if explicit else "new", f"{job_id}.json")
        fs.write_new(tmp, record.to_bytes(), durable=self.durable)
        reserved = False
        marker = self._layout.id_marker(job_id)
        try:
            if explicit:
                try:
                    fs.link_into(tmp, marker, durable=self.durable)
                except FileExistsError:
                    self._republish_orphan(job_id)
                    raise JobExists(f"a job with id {job_id!r} was already created in this store") from None
                except StorageError as exc:
                    if exc.applied:  # reserved but not durably: give the id back, as if never taken
                        fs.unlink_quietly(marker)
                        exc.applied = False
                    raise
                reserved = True
            self._tree.publish(tmp, record, dest)
        except Exception as exc:
            if isinstance(exc, StorageError) and exc.applied:
                # The job is in place; only the fsync that makes it durable failed.
                self._pending.note_published(record, dest)
            elif fs.unlink_quietly(tmp) and reserved:
                # The temp file was still here, so the job was never published: give the id
                # back. (Had it gone, the job would be in place and the id spent.)
                fs.unlink_quietly(marker)
            raise
        self._pending.note_published(record, dest)
        return record.snapshot(JobState(dest))

    def _republish_orphan(self, job_id: str) -> None:
        """If ``ids/<id>`` is the only copy of a job (a create lost its temp file to a crash or
        power loss after reserving the id), publish the job from it: the id is spent, so the job
        it names must exist. The marker's flock makes concurrent repairs take turns."""
        marker = self._layout.id_marker(job_id)
        try:
            # O_NONBLOCK: a FIFO planted here must not hang us (it then fails the checks below).
            fd = sc.open(marker, os.O_RDONLY | fs.O_NOFOLLOW | os.O_NONBLOCK | fs.O_CLOEXEC)
        except OSError:
            return
        try:
            if not stat.S_ISREG(sc.fstat(fd).st_mode):
                return  # planted: it still spends the id, but there is nothing to publish
            sc.lock_blocking(fd)
            if sc.fstat(fd).st_nlink > 1 or self._tree.locate(job_id) is not None:
                return  # published, or a create is between its link and its rename
            try:
                record = self._tree.read_record(marker)
            except (FileNotFoundError, fs.Unreadable, ValueError):
                return
            if record.id != job_id:
                return
            due = record.not_before is not None and record.not_before > self._wall()
            dst = self._tree.dest_path(record, "scheduled" if due else "pending")
            fs.ensure_dir(os.path.dirname(dst), durable=self.durable)
            with contextlib.suppress(FileExistsError):
                fs.link_into(marker, dst, durable=self.durable)
                log.warning("job %s was reserved but never published; published it from ids/", job_id)
        finally:
            sc.close_read(fd)  # releases the flock

    # == claiming work =============================================================================
    def pull_work(
        self,
        *,
        queues: str | Sequence[str] | None = None,
        timeout: float | None = 0,
        on_compromised: OnCompromised | None = None,
    ) -> WorkLease | None:
        """Lease one due job, or return None.

        ``queues``: a name or a list in priority order (all queues when None). ``timeout``: 0
        never waits; a positive number waits up to that many seconds; None waits forever.
        ``on_compromised`` is installed before the lease is visible, so no loss is missed.
        """
        self._check_open()
        names = None if queues is None else [check_queue(q) for q in ([queues] if isinstance(queues, str) else queues)]
        lease: WorkLease | None = self._pull(lambda: self._claim_work(names, on_compromised), timeout)
        return lease

    def _pull(self, attempt: Callable[[], Any], timeout: float | None) -> Any:
        if timeout is not None and timeout < 0:
            raise InvalidRequest(f"timeout must be >= 0 or None, got {timeout!r}")
        self._start_background()
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            waker = self._waker
            generation = waker.generation if waker else 0
            got = attempt()
            if got is not None or timeout == 0:
                return got
            remaining = float("inf") if deadline is None else deadline - self._clock()
            if remaining <= 0:
                return None
            if waker is None and self._watch:
                # Started only when a pull has to wait: watching costs a busy process a thread
                # hop per event it causes itself. Start, then look again before sleeping.
                self._start_waker()
                continue
            pause = min(remaining, self.poll_interval, max(0.001, self._pending.next_due - self._wall()))
            if waker is not None and waker.watching:
                waker.wait(generation, pause)
            else:
                time.sleep(pause)
                self._pending.invalidate()
            self._check_open()

    def _claim_work(self, queues: list[str] | None, on_compromised: OnCompromised | None) -> WorkLease | None:
        self._pending.promote_due()
        for _ in range(10_000):  # bounded: every turn consumes one name
            index = self._pending.pick(queues)
            if index is None:
                return None
            name = index.pop()
            if name is None:
                continue
            m = PENDING_RE.match(name)
            assert m is not None  # the index only holds valid names
            token = self._new_token()
            active = self._layout.active_path(m["id"], token)
            try:
                sc.rename(os.path.join(index.directory, name), active)
            except FileNotFoundError:
                continue  # another worker claimed it first
            lease = self._lease_from_active(active, m["id"], os.path.basename(index.directory), token,
                                            on_compromised, give_back=os.path.join(index.directory, name))
            if lease is not None:
                return lease
        return None

    def _lease_from_active(self, active: str, job_id: str, queue: str, token: str,
                           on_compromised: OnCompromised | None, *, give_back: str) -> WorkLease | None:
        try:
            parsed = self._tree.read_parsed(active)
        except FileNotFoundError:
            return None
        except StorageError:
            # Reading failed, not the file: put the claim back where it was and report the fault.
            # RACE: none for the rename back: the claim's token is ours and we are alive, so no
            # recoverer moves it; a puller can see the job again only once it is back.
            try:
                sc.rename(active, give_back)
            except OSError:
                log.warning("could not return job %s after a read error; it returns to the queue when "
                            "this process exits", job_id)
            raise
        except (fs.Unreadable, ValueError) as exc:
            self._tree.quarantine(active, f"claimed job file {exc}")
            return None
        record = parsed.record
        if record.id != job_id or record.queue != queue:
            self._tree.quarantine(active, f"file content names job {record.id!r} in queue {record.queue!r}")
            return None
        if parsed.final is not None:
            self._tree.quarantine(active, f"a queued job file already holds a {parsed.final} result")
            return None
        lease = WorkLease(self, record, token, on_compromised, size=parsed.complete, clean=not parsed.torn)
        with self._mutex:
            self._held_work[token] = lease
        return lease

    # == committing work (called by WorkLease) =====================================================
    def _commit_work(self, lease: WorkLease, kind: str, payload: Any, retry: bool, delay: float | None) -> None:
        if lease.finished:
            raise InvalidState(f"the lease on job {lease.id} was already committed")
        if os.getpid() != self._pid:
            raise LeaseLost("this lease belongs to the parent process", reason="closed")
        record, token, lay = lease._record, lease.token, self._layout
        active = lay.active_path(record.id, token)
        if kind == "release":
            dst = lay.pending_path(record.queue, record.priority, record.seq, record.id)
            fs.ensure_dir(os.path.dirname(dst), durable=self.durable)
            lease._committing = True
            try:
                fs.rename_into(active, dst, durable=self.durable)
            except FileNotFoundError:
                raise self._lost(lease) from None
            except StorageError as exc:
                if not exc.applied:
                    lease._committing = False  # nothing moved: the lease is still ours
                    raise
                self._finish(lease)  # released; only the fsync failed
                self._pending.note_published(record, "pending")
                raise
            self._finish(lease)
            self._pending.note_published(record, "pending")
            return
        new, dest = self._next_record(record, token, kind, payload, retry, delay)
        if dest in ("fulfilled", "failed"):
            self._commit_final(lease, active, new, dest)
            return
        tmp = lay.commit_tmp_path(token, record.id, dest)
        fs.unlink_quietly(tmp)  # a failed earlier attempt of this very commit may have left it
        fs.write_new(tmp, new.to_bytes(), durable=self.durable)
        lease._committing = True
        committing = lay.active_path(record.id, token, "commit")
        try:
            sc.rename(active, committing)  # the fence: fails if our claim was taken over
        except FileNotFoundError:
            fs.unlink_quietly(tmp)
            raise self._lost(lease) from None
        except OSError:
            fs.unlink_quietly(tmp)
            lease._committing = False
            raise
        try:
            self._tree.publish(tmp, new, dest)
        except (FileExistsError, FileNotFoundError):
            # RACE: we were judged hung after fencing, and a recoverer finished our commit from
            # our own temp file. That is our result; anything else is someone else's.
            fs.unlink_quietly(tmp)
            if not self._published_by(token, new, dest):
                raise self._lost(lease) from None
        except StorageError as exc:
            if not exc.applied:
                self._unfence(lease, committing, active, tmp)
                raise
            self._committed(lease, committing, new, dest)
            raise
        self._committed(lease, committing, new, dest)

    def _commit_final(self, lease: WorkLease, active: str, new: Record, dest: str) -> None:
        """A result is final: append it to the claimed file as one line, then move that file
        into ``fulfilled/`` or ``failed/`` with one rename that never replaces a result.

        No temp file is created and nothing is unlinked (both cost far more than a rename on
        most filesystems). The rename is the fence: once a recoverer has moved our claim, it
        fails with ENOENT. Durable order: write, fsync the file, rename, fsync the directory.
        """
        lease._committing = True
        try:
            fs.write_at(active, lease._size, new.result_bytes(dest), durable=self.durable, clean=lease._clean)
        except FileNotFoundError:
            raise self._lost(lease) from None
        except OSError:
            lease._committing = False  # the line was cut back (if it could be): a retry truncates first
            lease._clean = False
            raise
        try:
            self._tree.publish_final(active, new.id, dest)
        except FileNotFoundError:
            # RACE: we were judged hung and a recoverer moved our claim. If it saw our whole
            # result line it published that (our commit stands); otherwise it requeued the job
            # from the record line and ours is void.
            if not self._published_by(lease.token, new, dest):
                raise self._lost(lease) from None
        except FileExistsError:
            # A result exists already, so this claim was a stray second copy of a final job
            # (a restored backup, a hand-made copy): it goes, and nothing was committed.
            self._drop(active)
            raise self._lost(lease) from None
        except StorageError as exc:
            if not exc.applied:
                # Nothing moved. Cut the line back so a release or a retry starts clean; if even
                # that fails, a line that is not followed by the rename is what a crash leaves,
                # and readers and recovery already handle it.
                fs.cut_back(active, lease._size)
                lease._committing = False
                lease._clean = False
                raise
            self._committed_final(lease, new)
            raise
        self._committed_final(lease, new)

    def _committed_final(self, lease: WorkLease, new: Record) -> None:
        self._finish(lease)
        try:
            self._after_final(new.id)
        except StorageError as exc:
            # The result is committed and durable; only its notify index entry is missing,
            # and every recovery pass restores those (_recovery._sweep_targets).
            log.warning("job %s is committed but its notification was not indexed: %s", new.id, exc)

    def _committed(self, lease: WorkLease, committing: str, new: Record, dest: str) -> None:
        self._drop(committing)
        self._finish(lease)
        self._pending.note_published(new, dest)  # a retry: final results go by _commit_final

    def _unfence(self, lease: WorkLease, committing: str, active: str, tmp: str) -> None:
        """Undo a commit that failed before anything was published: the claim is ours again
        and the caller may retry. If even the undo fails, the ``.commit`` entry stays until this
        process exits; recovery then requeues it (its temp file is gone, so nothing is lost)."""
        fs.unlink_quietly(tmp)
        try:
            sc.rename(committing, active)
        except OSError:
            log.warning("could not undo the fence of job %s; it returns to the queue when this process exits",
                        lease.id)
            return
        lease._committing = False

    def _drop(self, path: str) -> bool:
        """Remove a superseded copy of a job; True once it is gone. If that fails the copy stays
        until the next recovery pass of this store retries it (see FORMAT.md, "Faults")."""
        if fs.unlink_quietly(path) or not sc.lexists(path):
            return True
        with self._mutex:
            self._litter.add(path)
        return False

    def _sweep_litter(self) -> int:
        """Retry the copies :meth:`_drop` could not remove; how many are gone now."""
        with self._mutex:
            litter, self._litter = self._litter, set()
        return sum(self._drop(path) for path in litter)

    def _next_record(self, record: Record, token: str, kind: str, payload: Any, retry: bool,
                     delay: float | None) -> tuple[Record, str]:
        now = self._wall()
        if kind == "fulfill":
            value = as_bytes(payload)
            if len(value) > self.max_value_bytes:
                raise ValueTooLarge(f"value is {len(value)} bytes; max_value_bytes is {self.max_value_bytes}")
            return dataclasses.replace(record, value=value, attempts=record.attempts + 1, finished_at=now,
                                       committed_by=token, not_before=None), "fulfilled"
        error = error_text(payload)
        attempts = record.attempts + 1
        delay = retry_delay(delay)
        if retry and attempts < record.max_attempts:
            wait = self._backoff(attempts) if delay is None else delay
            due = now + wait if wait > 0 else None
            return dataclasses.replace(record, attempts=attempts, error=error, committed_by=token,
                                       not_before=due), ("scheduled" if due is not None else "pending")
        return dataclasses.replace(record, attempts=attempts, error=error, committed_by=token,
                                   finished_at=now, not_before=None), "failed"

    def _published_by(self, token: str, record: Record, dest: str) -> bool:
        try:
            return self._tree.read_record(self._tree.dest_path(record, dest)).committed_by == token
        except (FileNotFoundError, fs.Unreadable, ValueError):
            return False

    def _lost(self, lease: WorkLease) -> LeaseLost:
        error = LeaseLost(f"the lease on job {lease.id} (token {lease.token}) was taken over; nothing was committed")
        lease._compromise(error)
        self._finish(lease)
        return error

    def _finish(self, lease: WorkLease) -> None:
        lease._mark_finished()
        with self._mutex:
            self._held_work.pop(lease.token, None)

    def _after_final(self, job_id: str) -> None:
        self._notifier.after_final(job_id)

    # == resolving by id ===========================================================================
    def fulfill(self, job_id: str, value: bytes | str) -> None:
        """Fulfil a job without holding its lease (for jobs resolved elsewhere).

        Raises :class:`InvalidState` if a live worker holds it or it is already final, and
        :class:`JobNotFound` for an unknown id. A job held by a dead or hung worker is taken
        over first.
        """
        self._check_open()
        check_job_id(job_id)
        data = as_bytes(value)
        if len(data) > self.max_value_bytes:
            raise ValueTooLarge(f"value is {len(data)} bytes; max_value_bytes is {self.max_value_bytes}")
        for _ in range(20):
            loc = self._tree.require(job_id)
            if loc.state.is_final:
                raise InvalidState(f"job {job_id} is already {loc.state.value}")
            if loc.state is JobState.ACTIVE:
                assert loc.token is not None and loc.kind is not None
                owner = token_owner(loc.token)
                status = "alive" if owner == self._owner_id() else self._probe.status(owner)
                if status == "alive":
                    raise InvalidState(f"job {job_id} is leased by a live worker")
                take_over(self, loc.path, job_id, loc.token, loc.kind, "fulfilled by id", new_counts())
                continue
            token = self._new_token()
            active = self._layout.active_path(job_id, token)
            try:
                sc.rename(loc.path, active)
            except FileNotFoundError:
                continue
            lease = self._lease_from_active(active, job_id, _queue_of(loc), token, None, give_back=loc.path)
            if lease is None:
                raise CorruptJob(f"job {job_id} could not be read and was quarantined")
            try:
                lease.fulfill(data)
            except StorageError:
                if not lease.finished:  # nobody else holds this lease: give the job back
                    with contextlib.suppress(JobStoreError):
                        lease.release()
                raise
            return
        raise InvalidState(f"job {job_id} kept moving; try again")

    def get(self, job_id: str) -> Job:
        """A snapshot of the job (state, request, value or error, attempts, waiting targets)."""
        self._check_open()
        check_job_id(job_id)
        for _ in range(5):
            loc = self._tree.require(job_id)
            try:
                record = self._tree.read_record(loc.path)
            except FileNotFoundError:
                continue  # it moved while we read it
            except (fs.Unreadable, ValueError) as exc:
                self._tree.quarantine(loc.path, f"job file {exc}")
                raise CorruptJob(f"job {job_id}: {exc}; moved to quarantine") from None
            waiting = tuple(t for _, t, _ in self._tree.read_targets(job_id))
            return record.snapshot(loc.state, waiting)
        raise JobNotFound(f"job {job_id!r} kept moving while being read")

    # == notifications =============================================================================
    def queue(self, job_id: str, target: Any) -> None:
        """Ask for the job's result to be delivered to ``target`` (any JSON value) once final.

        Queueing the same target twice has no further effect. If the job is already final the
        notification is available at once.
        """
        self._check_open()
        self._notifier.queue(check_job_id(job_id), target)

    def unqueue(self, job_id: str, target: Any) -> bool:
        """Stop waiting to notify ``target``; True if it was waiting. A notifier already
        delivering it may still do so."""
        return self.unqueue_all(job_id, [target]) == 1

    def unqueue_all(self, job_id: str, targets: Iterable[Any]) -> int:
        """Batch :meth:`unqueue`; returns how many of ``targets`` were waiting."""
        self._check_open()
        return self._notifier.unqueue_all(check_job_id(job_id), targets)

    def pull_notification(
        self, *, timeout: float | None = 0, on_compromised: OnCompromised | None = None
    ) -> NotificationLease | None:
        """Lease one final job whose result is waiting to be delivered, or return None."""
        self._check_open()
        lease: NotificationLease | None = self._pull(lambda: self._notifier.claim(on_compromised), timeout)
        return lease

    # == maintenance ===============================================================================
    def recover(self) -> RecoveryReport:
        """Repair what crashed or hung processes left behind; safe to run anywhere, any time."""
        self._check_open()
        return recover(self)

    def statistics(self) -> StoreStatistics:
        self._check_open()
        lay = self._layout
        by_queue: dict[str, int] = {}
        oldest: int | None = None
        for q in fs.scan_names(lay.pending):
            names = [n for n in fs.scan_names(lay.pending_dir(q)) if PENDING_RE.match(n)]
            by_queue[q] = len(names)
            for n in names:
                seq = int(n.split(".", 2)[1])
                oldest = seq if oldest is None else min(oldest, seq)
        quarantined = sum(1 for n in fs.scan_names(lay.quarantine) if not n.endswith(".reason"))
        return StoreStatistics(
            pending=sum(by_queue.values()),
            scheduled=len(fs.scan_names(lay.scheduled)),
            active=len(fs.scan_names(lay.active)),
            fulfilled=len(fs.scan_names(lay.fulfilled)),
            failed=len(fs.scan_names(lay.failed)),
            notifications=len(fs.scan_names(lay.notify)),
            quarantined=quarantined,
            pending_by_queue=by_queue,
            oldest_pending_age=None if oldest is None else max(0.0, self._wall() - oldest / 1e9),
            watching=bool(self._waker and self._waker.watching),
        )

    def _start_background(self) -> None:
        with self._mutex:
            if self._thread is not None or self._closed:
                return
            self._ensure_owner()
            self._last_beat = self._clock()
            self._thread = threading.Thread(target=self._heart, name=f"fsjobstore-heartbeat-{self._pid}",
                                            daemon=True)
            self._thread.start()

    def _start_waker(self) -> None:
        with self._mutex:
            if self._waker is None and not self._closed:
                waker = Waker(self._layout.jobs, self._pending.on_arrival, self._pending.invalidate)
                waker.start()
                self._waker = waker

    def _heart(self) -> None:
        next_recovery = self._clock()
        while not self._stop.is_set():
            if self._clock() >= next_recovery:
                try:
                    recover(self)
                except Exception:
                    log.exception("background recovery failed; will try again")
                next_recovery = self._clock() + max(self.heartbeat_interval, self.lease_duration / 2)
            if self._stop.wait(self.heartbeat_interval):
                return
            self._beat_once()

    def _beat_once(self) -> None:
        owner = self._owner
        if owner is None:
            return
        now = self._clock()
        gap, self._last_beat = now - self._last_beat, now
        problem: LeaseLost | None = None
        try:
            owner.beat()
        except OSError as exc:
            problem = LeaseLost(f"heartbeat could not be written: {exc}", reason="heartbeat-failed")
        if problem is None and gap > 0.75 * self.lease_duration:
            problem = LeaseLost(f"this process did not beat for {gap:.1f}s (lease {self.lease_duration}s); "
                                "its claims may have been taken over", reason="stalled")
        with self._mutex:
            work = list(self._held_work.values())
        notes = self._notifier.held()
        for lease in work:
            if problem is not None:
                lease._compromise(problem)
            elif not lease._committing and not sc.lexists(
                self._layout.active_path(lease.id, lease.token)
            ):
                lease._compromise(LeaseLost(f"job {lease.id} was taken over by another process"))
        for note in notes:
            if problem is not None:
                note._compromise(problem)
            elif not note.finished and not note._lock.still_ours():
                note._compromise(LeaseLost(f"the notification lease on job {note.id} was broken"))

    def close(self) -> None:
        """Release held leases (giving their jobs back), stop the threads, drop the owner lock."""
        if self._closed:
            return
        if os.getpid() != self._pid:
            self._after_fork()
        with self._mutex:
            work = list(self._held_work.values())
        for lease in work:
            try:
                lease.release()
            except Exception:  # already lost: nothing of ours to give back
                log.debug("release on close failed for %s", lease.id, exc_info=True)
        self._notifier.close()
        self._closed = True
        self._stop.set()
        if self._waker is not None:
            self._waker.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self._owner is not None:
            self._owner.close()
        _LIVE_STORES.discard(self)

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<JobStore {self.path!r} durable={self.durable}>"


# == helpers =======================================================================================
def _queue_of(loc: Location) -> str:
    name = os.path.basename(loc.path)
    if loc.state is JobState.PENDING:
        return os.path.basename(os.path.dirname(loc.path))
    m = SCHEDULED_RE.match(name)
    assert m is not None
    return m["queue"]


def _reset_after_fork() -> None:
    for store in list(_LIVE_STORES):
        store._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
