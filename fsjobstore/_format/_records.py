"""Job records: the JSON document in each job file, read and written (the snapshots handed to
users, :class:`Job`, are in ``_job``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ._job import AttemptError, Job, JobState
from ._layout import FORMAT_VERSION, MAX_PRIORITY, MIN_PRIORITY
from ._values import (
    MAX_ATTEMPT_ERRORS,
    MAX_PARENTS,
    Duration,
    attempt_error_text,
    check_job_id,
    check_queue_name,
    dumps,
    encode_value,
    error_text,
    integer,
    loads,
    number,
    retry_delay,
)

FINAL_STATES = ("fulfilled", "failed", "cancelled")
FOREVER = float("inf")  # a retain that keeps a job forever


LOST_DATA = ("its data never reached the disk, as after a power cut in a store opened with durable=False "
             "(the job is lost)")
# A store that fsyncs every job file before naming it empties none at a power cut of its own.
LOST_DURABLE = ("its data is not on the disk, though the store fsyncs every job file before naming it: a power "
                "cut on a disk that lost what it had acknowledged, or a file made by something else? (the job is lost)")


def lost_data(emptiable: bool) -> str:
    """Why a job file holds no data (or stops short), as far as the store can tell: a store
    made with durable=False (``emptiable``) loses it to a power cut; a durable one should not."""
    return LOST_DATA if emptiable else LOST_DURABLE


class LostJobData(ValueError):
    """A job file whose name reached the disk and whose data did not (all of it, or its end).
    Said without its cause (``"is empty"``); the store's reader adds it (:func:`lost_data`)."""


@dataclass(frozen=True, slots=True)
class Record:
    """The content of a job file (format 2, which also reads format 1). Immutable: a transition
    writes a new file, or, for a final commit, appends one result line to the claimed one."""

    id: str
    queue: str
    priority: int
    request: Any
    created_at: float
    seq: str
    max_attempts: int
    attempts: int = 0
    not_before: float | None = None
    error: str | None = None
    value: Any = None  # bytes, or a JSON value (see encode_value)
    finished_at: float | None = None
    committed_by: str | None = None
    timeout: float | None = None  # seconds one attempt may run
    history: tuple[dict[str, Any], ...] = ()  # earlier lives (see Job)
    # Errors of the attempts that were retried, oldest first: {"attempt", "at", "error"} each, at
    # most MAX_ATTEMPT_ERRORS. A final failure's error is the record's ``error``, not listed here
    # (it is written on the result line, whose fields are fixed: see FORMAT.md).
    attempt_errors: tuple[dict[str, Any], ...] = ()
    # Seconds the job is kept once final (``math.inf``: forever, null on disk), resolved at
    # create; None: a file written before format 3, which gets the store's recorded default.
    retain: float | None = None
    # A key no two jobs that are not final share (``create(unique_key=)``; ``_unique_keys``); None: none.
    unique_key: str | None = None
    # The jobs it waits for (``create(after=)``; ``_dependencies``), and what it does if one of them fails
    # or is cancelled: "cancel" (it is cancelled too) or "run" (it runs anyway).
    after: tuple[str, ...] = ()
    on_parent_failure: str = "cancel"
    # The group it was made in (``create_group``; ``_groups``), or None.
    group: str | None = None
    # Jobs sharing it run at most the key's limit at once (``create(concurrency_key=)``; ``_limit_gate``).
    concurrency_key: str | None = None
    # The queue it was created into, for a copy a subscription got (``_values``); None otherwise.
    topic: str | None = None
    # The request already serialised (create has it): spares serialising it a second time.
    request_json: bytes | None = field(default=None, compare=False, repr=False)

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "id": self.id,
            "queue": self.queue,
            "priority": self.priority,
            "created_at": self.created_at,
            "seq": self.seq,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "not_before": self.not_before,
            "error": self.error,
            "finished_at": self.finished_at,
            "committed_by": self.committed_by,
            "value": None if self.value is None else encode_value(self.value),
            "timeout": self.timeout,
            "history": list(self.history),
        }
        if self.attempt_errors:  # optional: files without it read as an empty list
            doc["attempt_errors"] = list(self.attempt_errors)
        if self.retain is not None:
            doc["retain"] = None if self.retain == FOREVER else self.retain
        if self.unique_key is not None:  # optional, as every field added since format 1 is
            doc["unique_key"] = self.unique_key
        if self.after:
            doc["after"] = list(self.after)
            doc["on_parent_failure"] = self.on_parent_failure
        if self.group is not None:
            doc["group"] = self.group
        if self.concurrency_key is not None:
            doc["concurrency_key"] = self.concurrency_key
        if self.topic is not None:
            doc["topic"] = self.topic
        if self.request_json is not None:  # "request" comes last either way
            return dumps(doc, what="job record")[:-1] + b',"request":' + self.request_json + b"}\n"
        doc["request"] = self.request
        return dumps(doc, what="job record") + b"\n"

    def result_bytes(self, state: str) -> bytes:
        """The line a final commit appends to the claimed file (see FORMAT.md, "Job file"):
        what changed, and the final state it names. Together with the first line it reads
        back as this record."""
        return result_line(state, self.attempts, self.error, self.finished_at, self.committed_by,
                           self.not_before, self.value)

    @classmethod
    def from_bytes(cls, data: bytes) -> Record:
        """Parse and validate; raises ``ValueError`` naming the first problem."""
        return cls.parse(data).record

    @classmethod
    def parse(cls, data: bytes) -> Parsed:
        """Parse a job file: its record line, then at most one appended result line.

        A last line without its newline is an append that a crash cut short: it is ignored
        (``Parsed.complete`` says how many bytes are whole). Anything else wrong raises
        ``ValueError`` naming the first problem.
        """
        end = data.find(b"\n")
        if end < 0:
            end = len(data) - 1  # one record with no newline (written by hand, say)
        try:
            doc = loads(data[: end + 1])
        except ValueError:
            # Told apart only once parsing failed, to keep the common path free of it.
            if not data.strip(b"\0 \t\r\n"):
                raise LostJobData("is empty") from None
            if data.endswith(b"\n") or not _cut_short(data[: end + 1]):
                raise  # not JSON, the parser says why ("invalid JSON: ...")
            raise LostJobData("stops inside its first line") from None
        if not isinstance(doc, dict):
            raise ValueError("top level is not an object")
        version = doc.get("format")
        if version not in _READABLE:
            raise ValueError(f"unknown format version {version!r}")
        complete = end + 1
        state = None
        last = data.rfind(b"\n")
        if last > end:
            if data.find(b"\n", end + 1) != last:
                raise ValueError("more than one result line")
            result = loads(data[end + 1 : last + 1])
            if not isinstance(result, dict) or result.get("result") not in FINAL_STATES:
                raise ValueError("the result line does not name a final state")
            state = result.pop("result")
            if set(result) != _RESULT_FIELDS:
                raise ValueError(f"the result line has fields {sorted(result)}")
            doc.update(result)
            complete = last + 1
        # Optional fields are checked only when set: a plain job's are null, and a call per
        # field is a sizeable share of a claim's cost.
        get = doc.get
        try:
            rec = cls(
                id=check_job_id(doc["id"]),
                queue=check_queue_name(doc["queue"]),
                priority=_int(doc["priority"], "priority", MIN_PRIORITY, MAX_PRIORITY),
                request=doc["request"],
                created_at=_num(doc["created_at"], "created_at"),
                seq=_seq(doc["seq"]),
                max_attempts=_int(doc["max_attempts"], "max_attempts", 1, 1_000_000),
                attempts=_int(doc["attempts"], "attempts", 0, 1_000_000),
                not_before=None if (v := get("not_before")) is None else _num(v, "not_before"),
                error=None if (v := get("error")) is None else _opt_str(v, "error"),
                value=None if (v := get("value")) is None else _opt_value(v),
                finished_at=None if (v := get("finished_at")) is None else _num(v, "finished_at"),
                committed_by=None if (v := get("committed_by")) is None else _opt_str(v, "committed_by"),
                timeout=None if (v := get("timeout")) is None else _opt_seconds(v, "timeout"),
                history=() if (v := get("history")) is None or v == [] else _history(v),
                attempt_errors=() if (v := get("attempt_errors")) is None else _attempt_errors(v),
                retain=_retain(doc),
                unique_key=None if (v := get("unique_key")) is None else _opt_key(v, "unique_key"),
                after=() if (v := get("after")) is None else _after(v),
                on_parent_failure="cancel" if (v := get("on_parent_failure")) is None else _on_parent_failure(v),
                group=None if (v := get("group")) is None else check_job_id(v),
                concurrency_key=None if (v := get("concurrency_key")) is None else _opt_key(v, "concurrency_key"),
                topic=None if (v := get("topic")) is None else check_queue_name(v),
            )
        except KeyError as exc:
            raise ValueError(f"missing field {exc.args[0]!r}") from None
        except Exception as exc:  # InvalidJobId is a ValueError; keep one error type out
            raise ValueError(str(exc)) from None
        if state is not None and (rec.finished_at is None or rec.committed_by is None):
            raise ValueError("the result line lacks finished_at or committed_by")
        return Parsed(rec, state, complete, complete < len(data))

    def snapshot(self, state: JobState, waiting: tuple[Any, ...] = (), **extra: Any) -> Job:
        # The file counts attempts that ended; a user counts attempts begun, so a running job's
        # attempt is included (as its worker numbers it). RACE: an active file whose holder has
        # appended its result line but not yet renamed it already counts that attempt, and shows
        # one more for the instant until the rename (or, after a crash, until recovery).
        begun = self.attempts + 1 if state is JobState.ACTIVE else self.attempts
        return Job(
            id=self.id, state=state, queue=self.queue, priority=self.priority,
            request=self.request, attempts=begun, max_attempts=self.max_attempts,
            created_at=self.created_at, run_at=self.not_before, value=self.value,
            error=self.error, finished_at=self.finished_at, waiting=waiting,
            timeout=self.timeout, history=self.history, attempt_errors=self._errors_shown(state),
            unique_key=self.unique_key, after=self.after, on_parent_failure=self.on_parent_failure,
            group=self.group, concurrency_key=self.concurrency_key, topic=self.topic, **extra,
        )

    def with_failed_attempt(self, attempt: int, at: float, error: str) -> tuple[dict[str, Any], ...]:
        """``attempt_errors`` with this attempt's error added (the last MAX_ATTEMPT_ERRORS kept)."""
        entry = {"attempt": attempt, "at": at, "error": attempt_error_text(error)}
        return (*self.attempt_errors, entry)[-MAX_ATTEMPT_ERRORS:]

    def _errors_shown(self, state: JobState) -> tuple[AttemptError, ...]:
        shown = [AttemptError(e["attempt"], e["at"], e["error"]) for e in self.attempt_errors]
        if state is JobState.FAILED and self.error is not None and self.attempts > 0:
            # The final failure: its error is on the result line, as the record's ``error``.
            shown.append(AttemptError(self.attempts, self.finished_at or 0.0, attempt_error_text(self.error)))
        return tuple(shown[-MAX_ATTEMPT_ERRORS:])


@dataclass(frozen=True, slots=True)
class Parsed:
    """A parsed job file: the record as of its last whole line, the final state an appended
    result line names (None if there is none), and how many leading bytes are whole lines."""

    record: Record
    final: str | None
    complete: int
    torn: bool  # bytes follow the whole lines (an append cut short)


_READABLE = frozenset({1, 2, FORMAT_VERSION})
_RESULT_FIELDS = frozenset({"attempts", "error", "finished_at", "committed_by", "not_before", "value"})


def result_line(state: str, attempts: int, error: str | None, finished_at: float | None,
                committed_by: str | None, not_before: float | None, value: Any) -> bytes:
    """A result line (:meth:`Record.result_bytes`), from its fields: a commit of the usual
    kind (fulfil) writes it without building the new record first."""
    doc: dict[str, Any] = {
        "result": state,
        "attempts": attempts,
        "error": error,
        "finished_at": finished_at,
        "committed_by": committed_by,
        "not_before": not_before,
        # A fulfilled job always says what its value is, even JSON null.
        "value": encode_value(value) if state == "fulfilled" else None,
    }
    return dumps(doc, what="job result") + b"\n"


def _cut_short(line: bytes) -> bool:
    """Whether a first line that did not parse is JSON cut short (a write a crash or power cut
    stopped), rather than something that is not JSON at all: the parser ran out of input. NULs
    at the end are what some filesystems leave of blocks a power cut did not write."""
    try:
        text = line.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data"  # a character cut in two at the end
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
    except (ValueError, RecursionError):
        return False
    return False  # (parsed here: it was refused for what it holds, not for being cut short)


def _opt_value(doc: Any) -> Any:
    if doc is None:
        return None
    if not isinstance(doc, dict) or "data" not in doc:
        raise ValueError("value is not an {encoding, data} object")
    if doc.get("encoding") == "json":
        return doc["data"]
    if not isinstance(doc["data"], str):
        raise ValueError("the data of a utf-8 or base64 value is not a string")
    if doc.get("encoding") == "utf-8":
        return str(doc["data"]).encode("utf-8")
    if doc.get("encoding") == "base64":
        return base64.b64decode(doc["data"], validate=True)
    raise ValueError(f"unknown value encoding {doc.get('encoding')!r}")


def _int(v: Any, name: str, lo: int, hi: int) -> int:
    if type(v) is int and lo <= v <= hi:  # the common case, without the full check's calls
        return v
    return integer(v, name, at_least=lo, at_most=hi, error=ValueError)


def _num(v: Any, name: str) -> float:
    if type(v) is float and 0 <= v < 1e11:  # the common case (NaN fails the comparisons)
        return v
    return number(v, f"{name} (a timestamp)", at_least=0, below=1e11, error=ValueError)


def _opt_num(v: Any, name: str) -> float | None:
    return None if v is None else _num(v, name)


def _opt_str(v: Any, name: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{name} must be a string or null")
    return v


def _opt_seconds(v: Any, name: str) -> float | None:
    return None if v is None else number(v, f"{name} (seconds, or null)", above=0, below=1e9, error=ValueError)


def _history(v: Any) -> tuple[dict[str, Any], ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(e, dict) for e in v):
        raise ValueError("history must be a list of objects")
    return tuple(v)


def _attempt_errors(v: Any) -> tuple[dict[str, Any], ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError("attempt_errors must be a list")
    out = []
    for e in v[-MAX_ATTEMPT_ERRORS:]:
        if not isinstance(e, dict) or not isinstance(e.get("error"), str):
            raise ValueError("an attempt_errors entry must be an object with an error string")
        out.append({"attempt": integer(e.get("attempt"), "attempt_errors' attempt", at_least=1, error=ValueError),
                    "at": number(e.get("at"), "attempt_errors' at", at_least=0, error=ValueError),
                    "error": e["error"]})
    return tuple(out)


def _retain(doc: dict[str, Any]) -> float | None:
    if "retain" not in doc:
        return None  # format 2: the store's default applies
    v = doc["retain"]
    if type(v) is float and 0 <= v < 1e11:  # the common case, without the full check's calls
        return v
    return FOREVER if v is None else number(v, "retain (seconds, or null)", at_least=0, below=1e11, error=ValueError)


def _opt_key(v: Any, name: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not 0 < len(v) <= 512 or not v.isprintable():
        raise ValueError(f"{name} must be a printable string of 1 to 512 characters")
    return v


def _after(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) > MAX_PARENTS:
        raise ValueError(f"after must be a list of at most {MAX_PARENTS} job ids")
    return tuple(check_job_id(p) for p in v)


def _on_parent_failure(v: Any) -> str:
    if v is None:
        return "cancel"
    if v not in ("cancel", "run"):
        raise ValueError('on_parent_failure must be "cancel" or "run"')
    return str(v)



def _seq(v: Any) -> str:
    if not isinstance(v, str) or len(v) != 20 or not v.isdigit() or not v.isascii():
        raise ValueError(f"seq must be 20 decimal digits, got {v!r}")
    return v


def next_record(record: Record, token: str, kind: str, payload: Any, retry: bool, delay: Duration | None,
                now: float, backoff: Callable[[int], float]) -> tuple[Record, str]:
    """The record a commit of ``kind`` (fail, cancel or withdraw) by claim ``token`` leaves, and
    its state (``_work`` commits it)."""
    error = error_text(payload)
    attempts = record.attempts + 1
    if kind in ("cancel", "withdraw"):  # withdraw: cancelled before any attempt ran
        return replace(record, attempts=attempts if kind == "cancel" else record.attempts,
                       error=error, committed_by=token, finished_at=now, not_before=None), "cancelled"
    delay = retry_delay(delay)
    if retry and attempts < record.max_attempts:
        wait = backoff(attempts) if delay is None else delay
        due = now + wait if wait > 0 else None
        return replace(record, attempts=attempts, error=error, committed_by=token, not_before=due,
                       attempt_errors=record.with_failed_attempt(attempts, now, error)), (
            "scheduled" if due is not None else "pending")
    return replace(record, attempts=attempts, error=error, committed_by=token,
                   finished_at=now, not_before=None), "failed"
