"""The one place the tests reach into a store's private parts: to stop its threads, kill its
owner identity as process death would, make it rescan, or count what its claims do. Everything
else goes through the API.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from fsjobstore import JobStore
from fsjobstore._core._liveness import OwnerLease
from fsjobstore._os import _beneath


def open_fds() -> int:
    """This process's open descriptors, less those the stores' path cache holds by design (a
    few bucket directories, and the ones it retired in the last half minute: ``_beneath``)."""
    held = {fd for root in _beneath._roots for fd, *_ in root.cache.values()}
    held |= {fd for root in _beneath._roots for fd, _ in root.retired}
    return len(set(map(int, os.listdir("/proc/self/fd"))) - held)


def owner(store: JobStore) -> OwnerLease:
    """The store's liveness file (made on first use)."""
    return store._core.ensure_owner()


def owner_or_none(store: JobStore) -> OwnerLease | None:
    return store._core.owner


def freeze(store: JobStore) -> None:
    """Stop the store's threads (its background recovery among them), as a hung process would."""
    store._background.stop()
    store._core.stop_waker()


def die(store: JobStore) -> None:
    """Stop every thread and release the owner's flock without cleaning up, as process death does."""
    freeze(store)
    lease = store._core.owner
    assert lease is not None and lease._fd is not None
    os.close(lease._fd)
    lease._fd = None
    store._core.closed = True
    store._detach()  # death closes its descriptors: the store root's among them


def die_unlinked(store: JobStore) -> None:
    """Like :func:`die`, but the owner file goes too (a dead owner that was cleaned up)."""
    freeze(store)
    lease = store._core.owner
    assert lease is not None
    lease.close()
    store._core.closed = True
    store._detach()  # death closes its descriptors: the store root's among them


def no_background(store: JobStore) -> None:
    """Never start the background thread (nor its first recovery pass): recovery then runs
    only when the test calls it."""
    store._background.start = lambda: None  # type: ignore[method-assign]


def rescan(store: JobStore) -> None:
    """Forget the pending index: what inotify or the next poll would make a worker do."""
    store._core.pending.invalidate()


def temp_path(store: JobStore, purpose: str, rest: str) -> str:
    """A name in the store's tmp/ that belongs to this store's owner."""
    core = store._core
    return core.layout.tmp_path(core.new_token(), purpose, rest)


def count_paused_listings(store: JobStore) -> list[int]:
    """Count the listings of control/paused/ this store makes from now on (in ``[0]``)."""
    control = store._control
    count = [0]
    listing = control.paused

    def counted() -> frozenset[str]:
        count[0] += 1
        return listing()

    control.paused = counted  # type: ignore[method-assign]
    return count


def pretend_paused_dir_unchanged(store: JobStore, changed_at: float) -> None:
    """Make this store see control/paused/ with one stat from now on, last changed at
    ``changed_at`` (epoch seconds): as when a change lands in the clock tick of a listing, or an
    attribute cache hides it."""
    from fsjobstore._os._files import SETTLE

    store._control._paused_stat = lambda: ((1, 1, 1), time.time() - changed_at >= SETTLE)  # type: ignore[method-assign]


def count_lost_races(monkeypatch: Any) -> list[int]:
    """Count (in ``[0]``) the claims any store in this process loses to another claimer."""
    from fsjobstore._core._pending import QueueIndex

    count = [0]
    lost = QueueIndex.lost

    def counted(index: QueueIndex, name: str) -> None:
        count[0] += 1
        lost(index, name)

    monkeypatch.setattr(QueueIndex, "lost", counted)
    return count


@contextlib.contextmanager
def count_listings(directory: str, *, below: bool = False) -> Iterator[list[int]]:
    """Count (in ``[0]``) the listings of ``directory`` (and, with ``below``, of the directories
    under it: a queue's buckets) any store in this process makes inside."""
    from fsjobstore._os import _syscalls

    count = [0]

    class Hook:
        def before(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "listdir" and (args[0] == directory or (below and str(args[0]).startswith(directory + os.sep))):
                count[0] += 1

        def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
            pass

    _syscalls.set_hook(Hook())
    try:
        yield count
    finally:
        _syscalls.set_hook(None)



def small_pending_index(monkeypatch: Any, size: int) -> None:
    """Make every store opened from now on keep only ``size`` names of a queue between
    listings (4,096 in use): a few files then stand for thousands."""
    from fsjobstore._core import _pending

    monkeypatch.setattr(_pending, "INDEX_SIZE", size)


# -- where pending jobs live on disk (FORMAT.md, "Tree": pending/<queue>/<P>.<S>/<name>) --------
def pending_files(root: str, queue: str = "default") -> list[str]:
    """The paths of the files in a queue's pending buckets, in run order (bucket, then name);
    files written flat in the queue's directory (an older store's) are not among them."""
    qdir = os.path.join(root, "jobs", "pending", queue)
    found = []
    for bucket in sorted(_ls(qdir)):
        bdir = os.path.join(qdir, bucket)
        if os.path.isdir(bdir) and not os.path.islink(bdir):
            found += [os.path.join(bdir, n) for n in sorted(_ls(bdir))]
    return found


def pending_file(root: str, job_id: str, queue: str = "default") -> str:
    """The path of a pending job's file in its bucket (it must be there, and only there)."""
    [path] = [p for p in pending_files(root, queue) if p.endswith(f".{job_id}.json")]
    return path


def pending_buckets(root: str, queue: str = "default") -> list[str]:
    """The names of a queue's pending buckets (directories), sorted."""
    qdir = os.path.join(root, "jobs", "pending", queue)
    return sorted(b for b in _ls(qdir) if os.path.isdir(os.path.join(qdir, b)))


def _ls(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def keep_emptied_buckets(monkeypatch: Any) -> None:
    """Make claimers keep emptied pending buckets for an hour after their second (2 s in use):
    a test that needs one kept does not then depend on how fast the machine runs it."""
    from fsjobstore._core import _buckets

    monkeypatch.setattr(_buckets, "LINGER", 3600.0)


def retention_walker(store: JobStore) -> tuple[Any, list[str]]:
    """A retention remover of its own over ``store`` (the store's threads are not started), and
    the list the index entries its passes look at are appended to."""
    from fsjobstore._transitions._retention import Retention

    no_background(store)
    remover = Retention(store._core, store._hooks)
    looked: list[str] = []
    consider = remover._consider

    def counted(bdir: str, name: str, now: int) -> Any:
        looked.append(name)
        return consider(bdir, name, now)

    remover._consider = counted  # type: ignore[method-assign]
    return remover, looked


def name_watch(store: JobStore) -> Any:
    """The store's watch of the names in ``control/cancel/``, ``targets/``, ``deps/`` and
    ``control/paused/`` (``_inotify.NameWatch``)."""
    return store._core.names
