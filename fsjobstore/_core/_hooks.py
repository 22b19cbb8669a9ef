"""The named points of a job's transitions where features attach.

A transition calls the hooks of its points without knowing what is behind them; the store
(``_store._jobstore``) builds them once, when it opens, from the features of ``_relations`` and
the counters (``_store._features``), and hands them to each transition it makes. The points:

========================  ===========================================================  ==================
point                     when                                                         a plain job
========================  ===========================================================  ==================
``keys``                  before create (a record with a unique key), at a retry,     not called
                          after a removal
``parents``               before create and at a retry (a record with ``after``),     one stat (``after_final``)
                          after a job is final or removed, each recovery pass
``gate``                  when choosing what to claim, and when a claim ends          a look at the declared limits
``after_final``           a job became final (after it is durable), on every path     called
``removing``              before a job's removal is fenced (while it can be read)     called
``removed``               a job's removal finished (retention, purge, recovery)       called
``ended``                 a commit, release, time-out, take-over or call by id        called (counting)
                          ended an attempt or a job
``sweeps``                each recovery pass                                           called
========================  ===========================================================  ==================

A plain job (no unique key, no parent, no concurrency key) meets only the points every job
meets; what a feature costs a job that does not use it is the look its hook takes (one stat for
children waiting, a cached read of the declared limits).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from .._format._job import Job
from .._format._records import Record
from ._liveness import NotifyLock


class UniqueKeys(Protocol):
    """Unique keys (``_relations._unique_keys``)."""

    def take(self, tmp: str, record: Record) -> Job | None:
        """Before create: take ``record``'s key for the temp file ``tmp``, or return the job that
        holds it (then nothing is published)."""

    def release(self, record: Record) -> None:
        """Give back the key of a job that was not published, or was removed."""

    def retake(self, record: Record, new_file: str) -> None:
        """At a retry of a final job: take its key again, or refuse (:class:`InvalidState`)."""


class Parents(Protocol):
    """Jobs that wait for others (``_relations._dependencies``)."""

    def place(self, record: Record) -> str | None:
        """Before create: ``"deferred"`` while a parent is not fulfilled, else None; refuses
        parents that do not exist."""

    def place_retry(self, record: Record) -> str:
        """At a retry: ``"pending"`` or ``"deferred"``; refuses one that would be cancelled again."""

    def link(self, record: Record) -> None:
        """Before a deferred job is published: note it under each parent, durably."""

    def recheck(self, record: Record) -> None:
        """After a deferred job is published: resolve it against parents that ended meanwhile."""

    def resolve_children(self, parent: str) -> None:
        """A job became final or is gone: promote or cancel the jobs waiting for it."""


class ClaimGate(Protocol):
    """The limits a claim passes (``_relations._limit_gate``)."""

    def promote_due(self) -> None:
        """Before a claim looks at the queues: jobs parked for a rate whose period turned go back."""

    def watch_lines(self) -> None:
        """An idle claim: be the one that sees a holder of a slot die."""

    def queue_turn(self, queue: str) -> list[NotifyLock] | None:
        """The slots of ``queue``'s limit for one claim ([] with no limit), or None while it is full."""

    def admit(self, record: Record, active: str, token: str, source: str, held: list[NotifyLock]) -> bool:
        """A claimed job's own limits: False if it was parked to wait for them (``held`` let go)."""

    def release(self, record: Record | None, held: list[NotifyLock]) -> None:
        """A claim ended (or never ran): let go of its slots, and promote what waited for them."""

    def after_fork(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Ended:
    """What the ``ended`` point hears: ``what`` happened to a job of ``queue`` (one of the
    counters' names, ``_counters.NAMES``), and how long its attempt ran, if one did."""

    queue: str
    what: str
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class Sweep:
    """What a recovery pass hands each feature's sweep: whether it is ``deep`` (after a reboot,
    or asked for), whether an owner is ``gone`` (what it left may be finished or undone), how
    to ``publish`` a job a dead maker left half-made (a group's member), and ``each``, the guard
    of one repair (``with sweep.each(what):``): a fault inside it is kept for the pass to raise
    once every step was tried, and the sweep goes on to its next file."""

    deep: bool
    gone: Callable[[str], bool]
    publish: Callable[[Record], None]
    each: Callable[[str], AbstractContextManager[None]]


@dataclass(frozen=True, slots=True)
class Hooks:
    """Every point of the transitions, with what attaches there (see the module docstring). The
    points a plain job meets on its way (``after_final``, ``ended``) are called by the transitions
    in a loop of their own; those of removal and recovery through the methods below."""

    keys: UniqueKeys
    parents: Parents
    gate: ClaimGate
    after_final: tuple[Callable[[str], None], ...] = ()  # (job id)
    removing: tuple[Callable[[str], None], ...] = ()  # (job id)
    removed: tuple[Callable[[str, Record | None], None], ...] = ()  # (job id, its record if it could be read)
    ended: tuple[Callable[[Ended], None], ...] = ()
    sweeps: tuple[tuple[str, Callable[[Sweep], int]], ...] = ()  # (RecoveryReport's count, the sweep)

    def remove(self, job_id: str) -> None:
        for hook in self.removing:
            hook(job_id)

    def gone(self, job_id: str, record: Record | None) -> None:
        for hook in self.removed:
            hook(job_id, record)
