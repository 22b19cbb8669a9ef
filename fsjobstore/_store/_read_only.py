"""A read-only store (``JobStore(read_only=True)``): a reader that never changes the store.

Its reads run under :func:`_syscalls.reading_only`, where every call that would change a file or a
directory is refused (StorageError, EROFS) and a directory found planted reads as missing: so a
bad file a read meets is skipped or reported, never quarantined, and nothing is repaired,
recovered, cached or counted. Every other public method is refused whole, before it starts,
naming itself; ``purge`` with ``dry_run=True`` only counts, and is a read.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable, Generator, Iterator
from typing import Any

from .._errors import StorageError
from .._os import _syscalls as sc

# What a read-only store does: the calls that only read. Each runs with every call that would
# change the store refused (_syscalls.reading_only); every other public method is refused whole.
_READS = frozenset({"cancel_requested", "counters", "get", "get_group", "jobs", "limits", "notifications", "paused",
                    "schedules",
                    "statistics", "subscriptions", "wait", "wait_group", "wakeups", "workers"})


def reading_only(store: object) -> None:
    """Make ``store`` a reader: its reads run under ``reading_only``, its changes are refused."""
    for klass in type(store).__mro__:
        for name, attr in vars(klass).items():
            if name.startswith("_") or name == "close" or not callable(attr) or name in vars(store):
                continue
            bound = getattr(store, name)
            if name in _READS:
                setattr(store, name, _guarded(bound))
            elif name == "purge":
                setattr(store, name, _dry_run_only(bound))
            else:
                setattr(store, name, _refused(name))


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with sc.reading_only():
            result = method(*args, **kwargs)
        return _guarded_walk(result) if isinstance(result, Generator) else result
    return call


def _guarded_walk(walk: Generator[Any, None, None]) -> Iterator[Any]:
    """A listing (``jobs()``) reads as it is walked: each step under ``reading_only`` too."""
    while True:
        with sc.reading_only():
            try:
                item = next(walk)
            except StopIteration:
                return
        yield item


def _dry_run_only(method: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(method)
    def purge(**kwargs: Any) -> int:
        if kwargs.get("dry_run") is not True:
            raise _read_only_error("purge")
        with sc.reading_only():
            return method(**kwargs)
    return purge


def _refused(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise _read_only_error(name)
    refuse.__name__ = name
    return refuse


def _read_only_error(name: str) -> StorageError:
    err = StorageError(errno.EROFS, f"refused: this JobStore is read-only (read_only=True) and {name}() would change "
                       "the store")
    err.op = name
    return err
