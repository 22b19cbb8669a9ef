"""fsjobstore: a resilient job store that lives entirely in a directory.

Producers :meth:`~JobStore.create` jobs, workers :meth:`~JobStore.pull_work` them and
fulfil them through the returned :class:`WorkLease`, and notifiers
:meth:`~JobStore.pull_notification` results for the targets that asked for them.
The on-disk format is specified in FORMAT.md.
"""

from ._errors import (
    CorruptJob,
    InvalidJobId,
    InvalidRequest,
    InvalidState,
    JobExists,
    JobNotFound,
    JobStoreError,
    LeaseLost,
    StorageError,
    StorageFull,
    StoreClosed,
    StoreFormatError,
    UntrustedStore,
    ValueTooLarge,
)
from ._handles import NotificationLease, WorkLease
from ._layout import FORMAT_VERSION, MAX_PRIORITY, MIN_PRIORITY
from ._records import Job, JobState
from ._recovery import RecoveryReport
from ._store import JobStore, StoreStatistics
from ._values import default_backoff

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "CorruptJob",
    "InvalidJobId",
    "InvalidRequest",
    "InvalidState",
    "Job",
    "JobExists",
    "JobNotFound",
    "JobState",
    "JobStore",
    "JobStoreError",
    "LeaseLost",
    "NotificationLease",
    "RecoveryReport",
    "StorageError",
    "StorageFull",
    "StoreClosed",
    "StoreFormatError",
    "StoreStatistics",
    "UntrustedStore",
    "ValueTooLarge",
    "WorkLease",
    "__version__",
    "default_backoff",
]
