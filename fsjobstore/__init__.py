"""fsjobstore: a resilient job store that lives entirely in a directory.

Producers :meth:`~JobStore.create` jobs, workers :meth:`~JobStore.pull_work` them and
fulfil them through the returned :class:`WorkLease` (or run a :class:`Worker`, which does it
for them), and notifiers :meth:`~JobStore.pull_notification` results for the targets that asked
for them. The on-disk format is specified in FORMAT.md.

The worker runtime (``Worker``, ``JobContext``, ``Deliverer``, ``RunSummary``, from
``fsjobstore.worker``) is imported on first use, not by ``import fsjobstore``: a command that only
reads a job (``fsjobstore get``) should not pay for it.
"""

import sys as _sys
from os import _exit as _exit_now
from os import write as _write  # not `import os as _os`: the subpackage fsjobstore._os takes that name


def _cli_interrupted(kind: type[BaseException], value: BaseException, tb: object,
                     _default: object = _sys.excepthook) -> None:
    """The command line's Ctrl-C, however early: ``fsjobstore`` imports this package before any
    of its own code can catch anything, and a traceback must never reach a CLI user."""
    if issubclass(kind, KeyboardInterrupt):
        _write(2, b"fsjobstore: interrupted\n")
        _exit_now(130)  # an exception raised in an excepthook is only printed
    _default(kind, value, tb)  # type: ignore[operator]


def _cli_loading_sigint(signum: int, frame: object) -> None:
    """SIGINT while the command line loads, before it has touched anything: end at once. Not a
    KeyboardInterrupt: one raised inside an import's lock callback is discarded by Python
    ("Exception ignored in ..."), and ``fsjobstore wait`` then waited forever. It stays for the
    command itself (every store operation is safe to end at any instant, as under SIGKILL), except
    where the command installs its own (worker, notify) or puts Python's back (verify: ``_cli.main``)."""
    _write(2, b"fsjobstore: interrupted\n")
    _exit_now(130)


if _sys.argv[0].endswith("/fsjobstore") or _sys.orig_argv[1:3] == ["-m", "fsjobstore"]:
    _sys.excepthook = _cli_interrupted  # the command line only: a library user's hook is theirs
    # The builtin _signal, not signal: importing signal builds its enums, a few ms of Python a
    # Ctrl-C would interrupt with a traceback.
    import _signal  # type: ignore[import-not-found]  # typeshed has no stub for the builtin

    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # not if ignored (a background job)
        _signal.signal(_signal.SIGINT, _cli_loading_sigint)

from typing import TYPE_CHECKING, Any  # after the guard: these imports take a while

from ._core._counters import QueueCounters, StoreCounters
from ._core._quarantine import QuarantinedFile
from ._core._worker_registry import WorkerInfo
from ._errors import (
    CorruptJob,
    InvalidJobId,
    InvalidName,
    InvalidQueueName,
    InvalidRequest,
    InvalidState,
    JobCancelled,
    JobExists,
    JobFailed,
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
    WaitTimeout,
    WorkerFailing,
)
from ._format._job import AttemptError, Job, JobState, LogLine, Progress
from ._format._layout import FORMAT_VERSION, MAX_PRIORITY, MIN_PRIORITY
from ._format._values import (
    MAX_NESTING,
    check_interest,
    check_queue_name,
    check_queues,
    default_backoff,
    parse_duration,
)
from ._os._verify import VerifyCheck, VerifyReport, verify
from ._os._verify_peer import verify_across_hosts
from ._relations._groups import Group
from ._relations._limits import Limit
from ._relations._subscriptions import Subscription
from ._relations._ticks import ScheduleInfo, tick_of
from ._store._jobstore import JobStore
from ._store._waiting import Wakeups
from ._transitions._leases import NotificationLease, WorkLease
from ._transitions._notify import MAX_TARGETS
from ._transitions._recovery import RecoveryReport
from ._transitions._stats import StoreStatistics

__version__ = "0.2.0"

# The runtime sits above the store and imports it: loaded on first use (PEP 562), so that
# ``import fsjobstore`` costs only the store. Type checkers see the names as plain imports.
if TYPE_CHECKING:
    from .schedule import Schedule
    from .worker import Deliverer, JobContext, JobEvent, RunSummary, Worker

_LAZY = frozenset({"Deliverer", "JobContext", "JobEvent", "RunSummary", "Schedule", "Worker"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(".schedule" if name == "Schedule" else ".worker", __name__), name)
        globals()[name] = value  # later lookups no longer come here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)


__all__ = [
    "AttemptError",
    "FORMAT_VERSION",
    "Group",
    "Limit",
    "Subscription",
    "check_interest",
    "check_queues",
    "MAX_NESTING",
    "MAX_TARGETS",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "CorruptJob",
    "Deliverer",
    "InvalidJobId",
    "InvalidName",
    "InvalidQueueName",
    "InvalidRequest",
    "InvalidState",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobEvent",
    "JobExists",
    "JobFailed",
    "JobNotFound",
    "JobState",
    "JobStore",
    "JobStoreError",
    "LeaseLost",
    "LogLine",
    "NotificationLease",
    "Progress",
    "QuarantinedFile",
    "QueueCounters",
    "RecoveryReport",
    "RunSummary",
    "Schedule",
    "ScheduleInfo",
    "StorageError",
    "StorageFull",
    "StoreClosed",
    "StoreCounters",
    "StoreFormatError",
    "StoreNotFound",
    "StoreStatistics",
    "UntrustedStore",
    "ValueTooLarge",
    "VerifyCheck",
    "VerifyReport",
    "WaitTimeout",
    "Wakeups",
    "WorkLease",
    "Worker",
    "WorkerFailing",
    "WorkerInfo",
    "__version__",
    "check_queue_name",
    "default_backoff",
    "parse_duration",
    "tick_of",
    "verify",
    "verify_across_hosts",
]
