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
from typing import Any, TypeVar

from .._errors import StorageError
from .._os import _syscalls as sc

T = TypeVar("T")

# What a read-only store does: the calls that only read. Each runs with every call that would
# change the store refused (_syscalls.reading_only); every other public method is refused whole.
_READS = frozenset({"cancel_requested", "counters", "get", "get_group", "jobs", "limits", "notifications", "paused",
                    "schedules",
                    "statistics", "subscriptions", "wait", "wait_group", "wakeups", "workers"})


def read_only_class(base: type[T]) -> type[T]:
    """The class of a reader of ``base``'s kind (``JobStore(read_only=True)`` makes one of these):
    a subclass whose reads run under ``reading_only`` and whose changes are refused, each public
    method wrapped once, here, rather than on each store."""
    namespace: dict[str, Any] = {"__doc__": base.__doc__, "__module__": base.__module__,
                                 "__qualname__": base.__qualname__}
    for klass in base.__mro__:
        for name, attr in vars(klass).items():
            if name.startswith("_") or name == "close" or not callable(attr) or name in namespace:
                continue
            if name in _READS:
                namespace[name] = _guarded(attr)
            elif name == "purge":
                namespace[name] = _dry_run_only(attr)
            else:
                namespace[name] = _refused(name)
    return type(base.__name__, (base,), namespace)


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
    def purge(self: object, **kwargs: Any) -> int:
        if kwargs.get("dry_run") is not True:
            raise _read_only_error("purge")
        with sc.reading_only():
            return method(self, **kwargs)
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
