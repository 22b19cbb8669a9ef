from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from internals import die, freeze  # noqa: F401  (re-exported for the tests)

from fsjobstore import JobStore

# A suite started in the background of a non-interactive shell (``bash .ci/run &``) inherits
# SIGINT and SIGQUIT ignored, as would every process a test starts; Python keeps an inherited
# SIG_IGN, so the tests that press Ctrl-C on a command waited for it until their timeout (9 of
# them in one such run). Each test process takes back what an interactive run has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The suite runs in 4 xdist processes (pyproject's addopts), each test on its own, except the
    GlusterFS bed's (tests/distfs): one process runs them all, since a bed listens on glusterd's
    fixed port and reaps stale beds as it starts, so two at once fight. A scheduler of our own, not
    ``xdist_group``: with pytest 9.2 and xdist 3.8 that marker groups nothing (xdist renames
    ``item._nodeid``, which pytest 9 no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class _OneBed(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "tests/distfs" if nodeid.startswith("tests/distfs/") else nodeid

    return _OneBed(config, log)


class FakeWall:
    """An injectable wall clock that only moves when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "store")


@pytest.fixture
def open_store(root: str) -> Iterator[Callable[..., JobStore]]:
    """Open stores on one directory (each one is like a separate process); all closed at the end."""
    stores: list[JobStore] = []

    def _open(path: str | None = None, **kwargs: Any) -> JobStore:
        kwargs.setdefault("durable", True)
        store = JobStore(path or root, **kwargs)
        stores.append(store)
        return store

    yield _open
    for store in stores:
        store.close()


@pytest.fixture
def store(open_store: Callable[..., JobStore]) -> JobStore:
    return open_store(backoff=lambda attempt: 0.0)


def in_background(call: Callable[[], Any], settle: float = 0.2) -> Callable[[], Any]:
    """Start ``call`` in a thread, give it ``settle`` seconds to begin waiting; return a function
    that joins it and returns what it returned."""
    import threading

    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(call()))
    thread.start()
    threading.Event().wait(settle)

    def result() -> Any:
        thread.join(30)
        assert got, "the call did not return within 30 s"
        return got[0]

    return result


def files_under(path: str) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(path):
        out.extend(os.path.relpath(os.path.join(dirpath, n), path) for n in names)
    return sorted(out)
