"""Exceptions raised by fsjobstore.

Every exception the library raises on purpose derives from :class:`JobStoreError`. Where one
also means what a builtin means, it subclasses that builtin too, so ``except KeyError`` and
``except ValueError`` keep working in code that does not know fsjobstore::

    JobStoreError
    ├── InvalidRequest (ValueError)        bad input, rejected before anything is written
    │   ├── InvalidJobId                   an id or queue name that is not a safe filename
    │   └── ValueTooLarge                  a request, value or error over its size cap
    ├── JobNotFound (KeyError)             no job with that id in this store
    ├── JobExists (ValueError)             create(job_id=...) with an id already used
    ├── InvalidState (RuntimeError)        the job is in a state that forbids the operation
    ├── LeaseLost                          this handle's lease was taken over or released
    ├── CorruptJob (ValueError)            a stored file could not be parsed (it is quarantined)
    ├── UntrustedStore (PermissionError)   the store root is writable or owned by someone else
    ├── StoreFormatError                   the store was written by an incompatible format version
    └── StoreClosed (RuntimeError)         the JobStore was closed
"""

from __future__ import annotations


class JobStoreError(Exception):
    """Root of every error fsjobstore raises on purpose."""


class InvalidRequest(JobStoreError, ValueError):
    """Input was rejected before anything was stored; the store is unchanged."""


class InvalidJobId(InvalidRequest):
    """A job id or queue name is not a safe filename (see FORMAT.md, "Names")."""


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

    Also the value passed to ``on_compromised`` callbacks. :attr:`reason` is a short machine
    readable word (``"taken-over"``, ``"stalled"``, ``"heartbeat-failed"``, ``"released"``,
    ``"closed"``), the message says the rest.
    """

    def __init__(self, message: str, *, reason: str = "taken-over") -> None:
        super().__init__(message)
        self.reason = reason


class CorruptJob(JobStoreError, ValueError):
    """A file in the store could not be read as a job; it has been moved to ``quarantine/``."""


class UntrustedStore(JobStoreError, PermissionError):
    """The store directory could be written by other users, or is owned by another user."""


class StoreFormatError(JobStoreError):
    """The directory holds a store of a format version this library does not understand."""


class StoreClosed(JobStoreError, RuntimeError):
    """The JobStore was closed; open a new one."""
