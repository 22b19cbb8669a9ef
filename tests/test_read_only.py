"""``JobStore(read_only=True)`` is a reader that changes nothing: over a store full of planted
files and directories, every read leaves every name, type, size, mode, mtime and link target of
the tree as it was; every call that would change the store is refused, naming itself."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hostile_corpus as corpus
import pytest
from fastapi.testclient import TestClient

from fsjobstore import CorruptJob, JobNotFound, JobStore, StorageError, StoreNotFound, WaitTimeout
from fsjobstore.web import create_app


def _tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry below ``root`` (itself included): type, size, mode, mtime, link target."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            out[os.path.relpath(path, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mode, st.st_mtime_ns,
                                                st.st_nlink, target)
    return out


@pytest.fixture
def hostile_store(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A store holding jobs in every state, targets, run logs, a group and a schedule, with the
    hostile corpus planted in its directories and three directories replaced by a link, a FIFO
    and a file; and the ids worth reading."""
    root = tmp_path / "store"
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret.json").write_text('{"format": 2, "id": "secret"}\n')
    ids: list[str] = []
    with JobStore(str(root), backoff=lambda attempt: 0.0, lease_duration=2.0) as store:
        victim = store.create({"victim": True}, job_id="victim")
        store.queue(victim.id, "victim-target")
        for state in ("fulfilled", "failed", "cancelled"):
            job = store.create({"ends": state}, queue=state)
            ids.append(job.id)
            if state == "cancelled":
                store.cancel(job.id)
                continue
            lease = store.pull_work(queues=state)
            assert lease is not None
            lease.progress(1, 2, "half")
            lease.log("a line")
            if state == "fulfilled":
                lease.fulfill({"ok": True})
            else:
                lease.fail("boom", retry=False)
        ids.append(store.create(1, delay=3600).id)
        ids.append(store.create(2, after=[ids[0]]).id)
        ids += store.create_group([{"request": 3}, {"request": 4}]).ids
        store.pause("paused")
        store.publish_worker({"name": "w"})
        running = store.create({"runs": True}, queue="running")
        assert store.pull_work(queues="running") is not None  # its holder is gone with this store
        ids += [victim.id, running.id]
    corpus.HARD_LINK_SOURCE = str(tmp_path / "link-source")
    Path(corpus.HARD_LINK_SOURCE).write_bytes(b"not a job")
    n = 0
    for directory in corpus.DIRECTORIES:
        where = root / ("leases" if directory == "leases/owner" else directory)
        where.mkdir(parents=True, exist_ok=True)
        for kind in corpus.KINDS:
            n += 1
            path = str(where / corpus.name_for(directory, n))
            if kind in corpus.CONTENT:
                Path(path).write_bytes(corpus.CONTENT[kind])
            else:
                corpus.SPECIAL[kind](path)
            ids.append(f"bad{n:03d}")
    (root / "jobs" / "cancelled").rename(tmp_path / "cancelled-aside")
    os.symlink(canary, root / "jobs" / "cancelled")
    (root / "control" / "paused").rename(tmp_path / "paused-aside")
    os.mkfifo(root / "control" / "paused")
    (root / "runs").rename(tmp_path / "runs-aside")
    (root / "runs").write_bytes(b"not a directory\n")
    try:
        yield root, ids
    finally:
        for sock in corpus.SOCKETS:
            sock.close()
        corpus.SOCKETS.clear()


def _read_everything(store: JobStore, ids: list[str]) -> list[str]:
    """Every read once; JobNotFound and CorruptJob are answers, anything else is reported (a
    StorageError too: a read that meets a bad file reports the file, it does not try to move it)."""
    problems: list[str] = []

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (JobNotFound, CorruptJob, WaitTimeout):
            return None
        except Exception as exc:  # the point is to report it
            problems.append(f"{what}: {type(exc).__name__}: {exc}")
            return None

    for job_id in ids:
        attempt(f"get {job_id}", lambda j=job_id: store.get(j))
        attempt(f"cancel_requested {job_id}", lambda j=job_id: store.cancel_requested(j))
        attempt(f"wait {job_id}", lambda j=job_id: store.wait(j, timeout=0))
    for state in (None, "pending", "scheduled", "deferred", "active", "fulfilled", "failed", "cancelled"):
        attempt(f"jobs {state}", lambda s=state: list(store.jobs(state=s, limit=None)))
        attempt(f"jobs {state} by 2", lambda s=state: [list(store.jobs(state=s, limit=2))])
    for call in (store.statistics, store.counters, store.workers, store.schedules, store.paused, store.limits,
                 store.subscriptions):
        attempt(call.__name__, call)
    attempt("purge dry_run", lambda: store.purge(states=["pending", "failed"], match="a", dry_run=True))
    return problems


def test_reading_a_hostile_store_read_only_changes_nothing_in_it(hostile_store: tuple[Path, list[str]]) -> None:
    root, ids = hostile_store
    before = _tree(root.parent)
    with JobStore(str(root), read_only=True) as store:
        assert _read_everything(store, ids) == []
        assert [store.get(i).state for i in ids[:2]] == ["fulfilled", "failed"]
        with pytest.raises(JobNotFound):
            store.get(ids[2])  # cancelled: jobs/cancelled is a planted link, read as no directory
        with pytest.raises(CorruptJob, match=r"left at .*/jobs/fulfilled/bad089\.json"):
            store.get("bad089")  # a file planted in fulfilled/: reported, left where it is
    assert _tree(root.parent) == before


def test_the_api_of_a_read_only_app_changes_nothing_in_a_hostile_store(hostile_store: tuple[Path, list[str]]) -> None:
    root, ids = hostile_store
    before = _tree(root.parent)
    # A path: the app opens it JobStore(read_only=True), as `fsjobstore web --read-only` does.
    with TestClient(create_app(str(root), read_only=True)) as client:
        for job_id in ids:  # a bad file's answer is the API's business; that it changes nothing is the store's
            client.get(f"/api/jobs/{job_id}")
        for url in ("/api/jobs", "/api/jobs?state=fulfilled", "/api/jobs?state=failed", "/api/stats", "/api/workers",
                    "/", f"/jobs/{ids[0]}"):
            client.get(url)
        assert client.get(f"/api/jobs/{ids[0]}").json()["state"] == "fulfilled"
    assert _tree(root.parent) == before


def test_a_read_only_store_refuses_every_change_naming_it_before_anything_is_written(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with JobStore(str(root)) as writer:
        job = writer.create(1)
    before = _tree(root)
    with JobStore(str(root), read_only=True) as store:
        for name, call in [("create", lambda: store.create(1)), ("cancel", lambda: store.cancel(job.id)),
                           ("pull_work", lambda: store.pull_work()), ("recover", lambda: store.recover()),
                           ("purge", lambda: store.purge()), ("queue", lambda: store.queue(job.id, "t")),
                           ("pause", lambda: store.pause("q")), ("publish_worker", lambda: store.publish_worker({}))]:
            with pytest.raises(StorageError, match=rf"read-only \(read_only=True\) and {name}\(\) would change"):
                call()
        assert store.purge(dry_run=True, states="pending") == 1
        assert store.get(job.id).state == "pending" and [j.id for j in store.jobs()] == [job.id]
        assert store.read_only is True
    assert _tree(root) == before


def test_a_read_only_open_makes_no_store_and_no_directory(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound):
        JobStore(str(tmp_path / "none"), read_only=True)
    assert not (tmp_path / "none").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreNotFound):
        JobStore(str(tmp_path / "empty"), read_only=True)
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_read_only_store_reads_a_store_missing_directories_as_empty(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with JobStore(str(root)) as writer:
        job = writer.create(1)
    os.rmdir(root / "jobs" / "scheduled")
    before = _tree(root)
    with JobStore(str(root), read_only=True) as store:
        assert [j.id for j in store.jobs()] == [job.id] and store.statistics().pending == 1
        with pytest.raises(JobNotFound):
            store.get("nothing")
    assert _tree(root) == before
