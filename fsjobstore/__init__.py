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
    StoreNotFound,
    UntrustedStore,
    ValueTooLarge,
)
from ._handles import NotificationLease, WorkLease
from ._layout import FORMAT_VERSION, MAX_PRIORITY, MIN_PRIORITY
from ._records import Job, JobState
from ._recovery import RecoveryReport
from ._store import JobStore, StoreStatistics
from ._values import default_backoff
from ._verify import VerifyCheck, VerifyReport, verify

__version__ = "0.2.0"

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
    "StoreNotFound",
    "StoreStatistics",
    "UntrustedStore",
    "ValueTooLarge",
    "VerifyCheck",
    "VerifyReport",
    "WorkLease",
    "__version__",
    "default_backoff",
    "verify",
]
