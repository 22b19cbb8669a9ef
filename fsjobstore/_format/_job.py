"""What users get of a job: :class:`Job`, a frozen snapshot (``JobStore.get``, ``create``,
``jobs``), and :class:`JobState`, where a job is. ``_records`` reads job files into these."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .._errors import InvalidState, JobCancelled, JobFailed
from ._values import encode_value


class JobState(enum.StrEnum):
    """Where a job is. The state is the directory its file is in; see FORMAT.md."""

    PENDING = "pending"  # due, waiting for a worker
    SCHEDULED = "scheduled"  # waiting for its run_at, or for a retry backoff
    DEFERRED = "deferred"  # waiting for the jobs it was made after (create(after=...))
    ACTIVE = "active"  # leased by a worker
    FULFILLED = "fulfilled"  # final, with a value
    FAILED = "failed"  # final, attempts exhausted or failed without retry
    CANCELLED = "cancelled"  # final, cancelled before it could finish

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({JobState.FULFILLED, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True, slots=True)
class Progress:
    """How far an attempt got, as its handler last said (``lease.progress``)."""

    done: float
    total: float | None
    message: str | None
    at: float  # epoch seconds
    attempt: int


@dataclass(frozen=True, slots=True)
class LogLine:
    """One ``lease.log`` line, with the attempt that wrote it."""

    at: float  # epoch seconds
    attempt: int
    line: str


@dataclass(frozen=True, slots=True)
class AttemptError:
    """How one failed attempt ended (``Job.attempt_errors``): its number, when, and its error
    (a traceback or a string, cut in the middle past 4 KiB)."""

    attempt: int
    at: float  # epoch seconds
    error: str


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one job, as :meth:`JobStore.get` and :meth:`JobStore.create` return it.

    ``request`` is the request as stored (JSON: tuples come back as lists, keys as strings).
    ``attempts`` counts the attempts begun, the running one included (a running job's first
    attempt: 1, as its worker numbers it); resolving a job by id (``JobStore.fulfill``) is not an
    attempt. ``value`` is the result of a fulfilled job: ``bytes`` if it was given as bytes, otherwise
    the JSON value it was given as. ``error`` is the last failure's text (for a cancelled job,
    the reason). ``history`` lists the earlier lives of a job that was retried after it failed
    or was cancelled (oldest first), each a dict with ``state``, ``attempts``, ``error`` and
    ``finished_at``. For a final job whose ``waiting`` targets have not all been delivered to,
    ``delivery_attempts`` counts the deliveries that left targets waiting (they are retried with
    backoff, without limit, until a notifier delivers or ``unqueue`` removes them) and
    ``delivery_error`` is the last one's error; ``delivery_due_at`` is when the next delivery is
    due (epoch seconds: now or past once due, later while a failed one's backoff runs).
    ``attempt_errors`` lists how each failed
    attempt of the job's current life ended (oldest first; the last 10, each cut to 4 KiB), as
    RQ's and Celery's per-execution results would: a retried job shows every attempt's error,
    not only the last (which ``error`` also holds, whole). A life ended by ``retry`` keeps only
    its last error, in ``history``.
    """

    id: str
    state: JobState
    queue: str
    priority: int
    request: Any
    attempts: int
    max_attempts: int
    created_at: float
    run_at: float | None = None
    value: Any = None
    error: str | None = None
    finished_at: float | None = None
    waiting: tuple[Any, ...] = field(default=())
    timeout: float | None = None
    history: tuple[dict[str, Any], ...] = field(default=())
    progress: Progress | None = None  # the latest an attempt reported
    logs: tuple[LogLine, ...] = field(default=())  # every attempt's log lines, oldest first
    logs_dropped: int = 0  # the oldest lines, removed to keep each attempt's log small
    cancel_requested: bool = False  # a running job that was asked to stop
    delivery_attempts: int = 0  # final, targets waiting: deliveries so far that left them waiting
    delivery_error: str | None = None  # ... and the last one's error
    delivery_due_at: float | None = None  # ... and when its next delivery is due (epoch seconds)
    attempt_errors: tuple[AttemptError, ...] = field(default=())  # each failed attempt's, oldest first
    unique_key: str | None = None  # create(unique_key=...): no two jobs that are not final share it
    after: tuple[str, ...] = field(default=())  # create(after=...): the jobs it waits for
    on_parent_failure: str = "cancel"  # ... and whether it is cancelled or runs when one fails
    group: str | None = None  # create_group: the group it was made in
    concurrency_key: str | None = None  # create(concurrency_key=...): at most its limit of these run at once
    topic: str | None = None  # a subscription's copy: the queue the job was created into (subscribe())

    def result(self) -> Any:
        """The value of a fulfilled job; raises :class:`JobFailed` (with the error) for a failed
        one, :class:`JobCancelled` for a cancelled one, and :class:`InvalidState` for a job that
        has not ended (``store.wait(job_id).result()`` waits first)."""
        if self.state is JobState.FULFILLED:
            return self.value
        if self.state is JobState.FAILED:
            raise JobFailed(f"job {self.id} failed after {self.attempts} attempt(s): {_first_line(self.error)}",
                            self.error)
        if self.state is JobState.CANCELLED:
            raise JobCancelled(f"job {self.id} was {self.error or 'cancelled'}")
        raise InvalidState(f"job {self.id} has no result yet: it is {self.state.value}")

    def to_dict(self) -> dict[str, Any]:
        """This snapshot as plain JSON types (what ``fsjobstore get --json`` prints): ``state``
        as its string, ``waiting`` and ``history`` as lists, and ``value`` in the form job files
        store it, so bytes and JSON results print alike: null unless the job is fulfilled, then
        ``{"encoding": "json", "data": ...}``, or ``{"encoding": "utf-8" | "base64", "data":
        "..."}`` for bytes."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["state"] = self.state.value
        doc["value"] = encode_value(self.value) if self.state is JobState.FULFILLED else None
        doc["waiting"] = list(self.waiting)
        doc["history"] = list(self.history)
        doc["progress"] = None if self.progress is None else asdict(self.progress)
        doc["logs"] = [asdict(line) for line in self.logs]
        doc["attempt_errors"] = [asdict(e) for e in self.attempt_errors]
        doc["after"] = list(self.after)
        return doc


def _first_line(text: str | None) -> str:
    lines = (text or "no error recorded").strip().splitlines()
    return lines[-1] if lines else "no error recorded"  # a traceback's last line says what happened
