"""Exceptions raised by fsjobstore.

Every exception the library raises on purpose derives from :class:`JobStoreError`. Where one
also means what a builtin means, it subclasses that builtin too, so ``except KeyError`` and
``except ValueError`` keep working in code that does not know fsjobstore::

    JobStoreError
    ├── InvalidRequest (ValueError)        bad input, rejected before anything is written
    │   ├── InvalidName                    a name that is not a safe filename:
    │   │   ├── InvalidJobId               a job id
    │   │   └── InvalidQueueName           a queue name
    │   └── ValueTooLarge                  a request, value or error over its size cap
    ├── JobNotFound (KeyError)             no job with that id in this store
    ├── JobExists (ValueError)             create(job_id=...) with an id already used
    ├── InvalidState (RuntimeError)        the job is in a state that forbids the operation
    ├── LeaseLost                          this handle's lease was taken over, timed out or released
    │   └── JobCancelled                   the job was cancelled (a commit, or Job.result())
    ├── JobFailed                          Job.result() of a job that failed
    ├── WaitTimeout (TimeoutError)         wait() gave up before the job was final
    ├── CorruptJob (ValueError)            a stored file could not be parsed (quarantined, unless read-only)
    ├── UntrustedStore (PermissionError)   the store is writable by others, or not ours to use
    ├── StoreNotFound (FileNotFoundError)  no store at that path, and none may be made there
    ├── StoreFormatError                   the store was written by an incompatible format version
    ├── StoreClosed (RuntimeError)         the JobStore was closed
    ├── WorkerFailing (RuntimeError)       a Worker's processes or threads keep dying at start, or
    │                                      every thread is held by handlers past their time limit
    └── StorageError (OSError)             the filesystem failed a call: EIO, EROFS, EMFILE, ...
        └── StorageFull                    ENOSPC or EDQUOT

A :class:`StorageError` leaves nothing half-published: the operation either had no effect, or
(``applied`` is True) its change is complete and visible but the directory fsync that would make
it survive a power loss failed. Either way the store keeps working once the fault is gone.
"""

from __future__ import annotations

import errno


class JobStoreError(Exception):
    """Root of every error fsjobstore raises on purpose."""


class InvalidRequest(JobStoreError, ValueError):
    """Input was rejected before anything was stored; the store is unchanged."""


class InvalidName(InvalidRequest):
    """A job id or queue name is not a safe filename (see FORMAT.md, "Names")."""


class InvalidJobId(InvalidName):
    """A job id is not a safe filename."""


class InvalidQueueName(InvalidName):
    """A queue name is not a safe filename."""


class ValueTooLarge(InvalidRequest):
    """A request, result value, error text or target exceeds its configured cap."""


class JobNotFound(JobStoreError, KeyError):
    """No job with this id exists in the store."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence.
        return str(self.args[0]) if self.args else "job not found"


class JobExists(JobStoreError, ValueError):
    """``create(job_id=...)`` named an id that the store has already used."""


class InvalidState(JobStoreError, RuntimeError):
    """The job's current state forbids the operation (for example fulfilling a fulfilled job)."""


class LeaseLost(JobStoreError):
    """The lease behind a handle is no longer ours; the operation committed nothing.

    Also the value passed to ``on_compromised`` callbacks. ``reason`` is a short machine
    readable word (``"taken-over"``, ``"stalled"``, ``"heartbeat-failed"``, ``"timeout"``,
    ``"cancelled"``, ``"closed"``), the message says the rest.
    """

    def __init__(self, message: str, *, reason: str = "taken-over") -> None:
        super().__init__(message)
        self.reason = reason


class JobCancelled(LeaseLost):
    """The job was cancelled (``JobStore.cancel``).

    Raised by a holder's ``fulfill`` or ``fail`` once a cancel was requested (the job was
    committed as cancelled instead), and by :meth:`Job.result` of a cancelled job.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="cancelled")


class JobFailed(JobStoreError):
    """:meth:`Job.result` of a job that failed; ``error`` is its last error text."""

    def __init__(self, message: str, error: str | None = None) -> None:
        super().__init__(message)
        self.error = error


class WaitTimeout(JobStoreError, TimeoutError):
    """:meth:`JobStore.wait` reached its timeout before the job was final."""


class CorruptJob(JobStoreError, ValueError):
    """A file in the store could not be read as a job; it has been moved to ``quarantine/`` (a
    read-only store leaves it where it is: the message says which)."""


class UntrustedStore(JobStoreError, PermissionError):
    """The store directory could be written by other users, or belongs to another user (or to a
    group this process is not a member of)."""


class StoreNotFound(JobStoreError, FileNotFoundError):
    """There is no store at the path: it is missing (and ``create=False``), a file, or a
    directory that holds other things and no ``fsjobstore.json``. Nothing was created."""

    def __str__(self) -> str:  # FileNotFoundError formats its args as (errno, text); we want the sentence.
        return str(self.args[0]) if self.args else "no store here"


class StoreFormatError(JobStoreError):
    """The directory holds a store of a format version this library does not understand."""


class StoreClosed(JobStoreError, RuntimeError):
    """The JobStore was closed; open a new one."""


class WorkerFailing(JobStoreError, RuntimeError):
    """A :class:`~fsjobstore.Worker` stopped because its processes or threads kept failing
    within moments of their start (their errors are in the log), or (threads mode) because
    every thread was held by a handler that ran on past its time limit (``max_hung``). Nothing
    was lost: every job they held was given back, recovered, or timed out."""


class StorageError(JobStoreError, OSError):
    """The filesystem failed a call (EIO, EROFS, EMFILE, ENOSPC, ...); ``errno`` says which.

    ``op`` names the call (``"write"``, ``"fsync"``, ``"rename"``, ...). ``applied`` is False when
    the operation had no effect, True when its change is in place but could not be made durable
    (only a failed directory fsync after the rename or link can cause that).
    """

    op: str = "?"
    applied: bool = False

    def __str__(self) -> str:
        name = errno_name(self.errno)
        where = "" if self.filename is None else f" {self.filename}"
        if self.filename2 is not None:
            where += f" -> {self.filename2}"
        text = f"{self.op}{where} failed: {name} ({self.strerror})"
        if self.applied:
            text += "; the change is in place but may not survive a power loss"
        return text


class StorageFull(StorageError):
    """No space left (ENOSPC) or quota exceeded (EDQUOT). Nothing was stored."""


def errno_name(code: int | None) -> str:
    return errno.errorcode.get(code or 0, str(code))
