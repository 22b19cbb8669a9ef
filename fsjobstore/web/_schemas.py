"""The JSON API's bodies and answers, as pydantic models: what ``/openapi.json`` documents and
what every request is checked against before the store checks it again (the store's own checks
are the rule; these give a client the shape). Strict: ``"5"`` is not a number, ``true`` is not 1."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fsjobstore import MAX_TARGETS

JsonValue = Any  # any JSON document

State = Literal["pending", "scheduled", "deferred", "active", "fulfilled", "failed", "cancelled"]
Removable = Literal["pending", "scheduled", "deferred", "fulfilled", "failed", "cancelled"]


_FINAL: tuple[Removable, ...] = ("fulfilled", "failed", "cancelled")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# -- bodies ----------------------------------------------------------------------------------------
class CreateJob(_Strict):
    """A new job: ``JobStore.create``'s arguments, and targets to notify once it is final."""

    request: JsonValue = Field(description="any JSON: what the job is about")
    queue: str = "default"
    priority: int = Field(0, description="lower runs sooner, -999,999 .. 999,999")
    delay: float | None = Field(None, description="seconds before it may run")
    run_at: float | None = Field(None, description="epoch seconds before which it does not run")
    max_attempts: int | None = None
    job_id: str | None = Field(None, description="an id of your choosing (an idempotency key)")
    timeout: float | None = Field(None, description="seconds one attempt may run")
    retain: float | Literal["forever"] | None = Field(None, description="seconds kept once final, or \"forever\"")
    notify: list[JsonValue] = Field(default_factory=list, max_length=MAX_TARGETS,
                                    description=f"targets to deliver the result to (at most {MAX_TARGETS})")
    unique_key: str | None = Field(None, description="while a job with this key is not final, answer it "
                                   "instead of making another")
    after: list[str] = Field(default_factory=list, description="ids of jobs this one waits for (deferred "
                             "until all are fulfilled)")
    on_parent_failure: Literal["cancel", "run"] = Field("cancel", description="when one of `after` fails or "
                                                        "is cancelled: cancel this job, or run it anyway")
    concurrency_key: str | None = Field(None, description="run at most the key's limit of these at once "
                                        "(one, unless a limit is declared)")


class Reason(_Strict):
    reason: str | None = None


class Value(_Strict):
    value: JsonValue = Field(description="the job's value: any JSON")


class Target(_Strict):
    target: JsonValue = Field(description="any JSON: whom to tell")


class Purge(_Strict):
    """``JobStore.purge``'s arguments; ``older_than`` in seconds."""

    states: list[Removable] = Field(default_factory=lambda: list(_FINAL))
    queue: str | None = None
    older_than: float | None = None
    match: str | None = Field(None, description="a regular expression searched in the id and request")
    limit: int | None = None
    dry_run: bool = False


class Failure(_Strict):
    error: str
    retry: bool = True
    delay: float | None = None


class ProgressBody(_Strict):
    done: float
    total: float | None = None
    message: str | None = None


class LogBody(_Strict):
    line: str


class Touch(_Strict):
    extend: float | None = Field(None, description="seconds from now the time limit moves to")


# -- answers ---------------------------------------------------------------------------------------
class ProgressOut(BaseModel):
    done: float
    total: float | None
    message: str | None
    at: float
    attempt: int


class LogLineOut(BaseModel):
    at: float
    attempt: int
    line: str


class AttemptErrorOut(BaseModel):
    attempt: int
    at: float
    error: str


class JobOut(BaseModel):
    """A job's snapshot (``Job.to_dict()``): ``value`` is null unless fulfilled, then
    ``{"encoding": "json", "data": ...}`` or, for bytes, ``{"encoding": "utf-8" | "base64", "data": "..."}``."""

    id: str
    state: State
    queue: str
    priority: int
    request: JsonValue
    attempts: int
    max_attempts: int
    created_at: float
    run_at: float | None
    value: dict[str, Any] | None
    error: str | None
    finished_at: float | None
    waiting: list[JsonValue]
    timeout: float | None
    history: list[dict[str, Any]]
    progress: ProgressOut | None
    logs: list[LogLineOut]
    logs_dropped: int
    cancel_requested: bool
    delivery_attempts: int
    delivery_error: str | None
    delivery_due_at: float | None
    attempt_errors: list[AttemptErrorOut]
    unique_key: str | None
    after: list[str]
    on_parent_failure: str
    group: str | None
    concurrency_key: str | None
    topic: str | None


class GroupMember(_Strict):
    """One job of a group: ``CreateJob`` without ``job_id``, ``unique_key`` and ``notify``
    (members get generated ids); ``after`` names jobs in the store by id, or earlier members of
    the group by their index in ``jobs``."""

    request: JsonValue
    queue: str = "default"
    priority: int = 0
    delay: float | None = None
    run_at: float | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    retain: float | Literal["forever"] | None = None
    after: list[str | int] = Field(default_factory=list)
    on_parent_failure: Literal["cancel", "run"] = "cancel"
    concurrency_key: str | None = None


class CreateGroup(_Strict):
    """``JobStore.create_group``: the jobs are made all or none."""

    jobs: list[GroupMember] = Field(min_length=1)
    group_id: str | None = Field(None, description="an id of your choosing; using it twice is JobExists")


class GroupOut(BaseModel):
    id: str
    jobs: list[JobOut] = Field(description="the members, in the order given")
    done: bool = Field(description="whether every member is final")


class JobPage(BaseModel):
    jobs: list[JobOut]
    next: str | None = Field(description="the id to pass as `after` for the next page; null on the last")
    scanned: int | None = Field(None, description="with `search`: jobs looked at for this page")


class Removed(BaseModel):
    removed: bool


class Purged(BaseModel):
    purged: int
    dry_run: bool


class Paused(BaseModel):
    queue: str
    paused: bool
    changed: bool


class QueueOut(BaseModel):
    name: str
    counts: dict[str, int]
    paused: bool
    oldest_pending_age: float | None
    created: int
    fulfilled: int
    failed: int
    throughput: list[list[int]] = Field(description="[minute, fulfilled, failed] for each of the last 60 minutes")


class StatisticsOut(BaseModel):
    pending: int
    scheduled: int
    deferred: int
    active: int
    fulfilled: int
    failed: int
    cancelled: int
    notifications: int
    quarantined: int
    pending_by_queue: dict[str, int]
    oldest_pending_age: float | None
    paused: list[str]
    by_queue: dict[str, dict[str, int]]
    oldest_pending_by_queue: dict[str, float]


class WorkerOut(BaseModel):
    owner: str
    name: str
    host: str
    pid: int
    queues: list[str] | None
    concurrency: int
    mode: str
    paused: bool
    started_at: float
    last_heartbeat: float
    jobs_done: int
    jobs_failed: int
    current: list[dict[str, Any]]


class ScheduleOut(BaseModel):
    name: str
    spec: str
    queue: str
    since: float
    last_tick: float | None
    last_job: str | None
    declared_at: float | None


class LeaseOut(BaseModel):
    """A job leased to an HTTP worker: commit it through ``/api/leases/{lease}/...`` before
    ``expires_at``, or touch the lease; otherwise the attempt fails and the job runs again."""

    lease: str = Field(description="the lease's secret handle")
    token: str = Field(description="the claim's token: the idempotency key for side effects")
    expires_at: float
    job: JobOut


class ErrorOut(BaseModel):
    """Every error: ``error`` is the name of fsjobstore's exception (``JobNotFound``,
    ``InvalidState``, ...), ``message`` says what was wrong."""

    error: str
    message: str
