"""Where a store may be made, what it records about itself, and how older stores are read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import files_under

from fsjobstore import (
    FORMAT_VERSION,
    InvalidRequest,
    JobState,
    JobStore,
    StoreFormatError,
    StoreNotFound,
    UntrustedStore,
)


def test_an_empty_path_is_refused_not_taken_as_the_current_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for path in ("", "   "):
        with pytest.raises(InvalidRequest, match="store path must be a non-empty string"):
            JobStore(path)
    assert os.listdir(tmp_path) == []


def test_a_path_of_the_wrong_type_is_refused_with_an_error_that_names_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for path in (123, None, ["jobs"]):
        with pytest.raises(InvalidRequest, match=r"store path must be a str or os.PathLike \(a directory\), got "):
            JobStore(path)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="store path must be a str, not bytes"):
        JobStore(b"jobs")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="create must be True or False, got 'yes'"):
        JobStore("jobs", create="yes")  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_a_directory_with_other_things_in_it_never_becomes_a_store(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("print('hi')")
    (project / "docs").mkdir()
    before = files_under(str(project))
    with pytest.raises(StoreNotFound, match=r"is not empty and holds no fsjobstore\.json") as info:
        JobStore(project)
    assert isinstance(info.value, FileNotFoundError)
    assert files_under(str(project)) == before and sorted(os.listdir(project)) == ["docs", "main.py"]
    with pytest.raises(StoreNotFound):
        JobStore("/")  # the root directory is no exception


def test_a_missing_or_empty_directory_becomes_a_store_unless_create_is_false(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound, match="there is no store at"):
        JobStore(tmp_path / "a" / "b", create=False)
    assert not (tmp_path / "a").exists()  # nothing was made on the way
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StoreNotFound, match="the directory is empty"):
        JobStore(empty, create=False)
    assert os.listdir(empty) == []
    with JobStore(tmp_path / "a" / "b") as made:
        made.create(1)
    with JobStore(tmp_path / "a" / "b", create=False) as again:
        assert again.statistics().pending == 1
    with JobStore(empty) as store:
        assert store.statistics().pending == 0
    mount = tmp_path / "mount"
    (mount / "lost+found").mkdir(parents=True)  # the root of a dedicated filesystem
    JobStore(mount).close()


def test_a_file_in_place_of_the_store_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(StoreNotFound, match="is a file"):
        JobStore(afile)


def test_a_path_below_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(StoreNotFound, match=f"{afile} is a file, not a directory"):
        JobStore(afile / "a" / "jobs")
    assert afile.read_text() == "x"


def test_durability_belongs_to_the_store(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with JobStore(root) as store:
        assert store.durable is True
    assert json.loads((root / "fsjobstore.json").read_text())["durable"] is True
    with pytest.raises(InvalidRequest, match="durable=False asks for less"):
        JobStore(root, durable=False)
    fast = tmp_path / "fast"
    JobStore(fast, durable=False).close()
    with JobStore(fast) as follows, JobStore(fast, durable=True) as stricter:
        assert follows.durable is False  # the store's own setting
        assert stricter.durable is True  # asking for more is always allowed


def test_a_store_of_format_one_is_read_and_upgraded(tmp_path: Path) -> None:
    root = tmp_path / "old"
    # A store as format 1 wrote it: no durability in the marker, a pending job and a result
    # whose value was stored as UTF-8 bytes (format 1 had no JSON values).
    for sub in ("jobs/pending/default", "jobs/fulfilled", "jobs/active", "jobs/scheduled", "jobs/failed",
                "jobs/notify", "targets", "leases", "ids", "tmp", "quarantine"):
        (root / sub).mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (root / "fsjobstore.json").write_text('{"format": 1, "created_at": 1795000000.0}\n')
    record = {"format": 1, "id": "old1", "queue": "default", "priority": 0, "created_at": 1795000000.0,
              "seq": "01795000000000000000", "attempts": 0, "max_attempts": 3, "not_before": None,
              "error": None, "finished_at": None, "committed_by": None, "value": None, "request": {"n": 1}}
    (root / "jobs/pending/default/1000000.01795000000000000000.old1.json").write_text(json.dumps(record) + "\n")
    done = dict(record, id="old2")
    result = {"result": "fulfilled", "attempts": 1, "error": None, "finished_at": 1795000001.0,
              "committed_by": "0123456789abcdef-1", "not_before": None,
              "value": {"encoding": "utf-8", "data": "six"}}
    (root / "jobs/fulfilled/old2.json").write_text(json.dumps(done) + "\n" + json.dumps(result) + "\n")
    with JobStore(root) as store:
        assert store.get("old2").value == b"six"  # format 1 values were bytes, and stay bytes
        lease = store.pull_work()
        assert lease is not None and lease.id == "old1" and lease.request == {"n": 1}
        lease.fulfill({"n": 2})
        assert store.get("old1").value == {"n": 2}
    marker = json.loads((root / "fsjobstore.json").read_text())
    assert (marker["format"], marker["durable"], marker["migrated_from"]) == (FORMAT_VERSION, True, 1)


def test_an_empty_marker_left_by_a_power_cut_in_an_older_version_is_rewritten(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with JobStore(root) as store:
        job = store.create({"keep": "me"})
    (root / "fsjobstore.json").write_bytes(b"")  # what a power cut left with durable=False before format 2
    with JobStore(root) as store:
        assert store.get(job.id).state is JobState.PENDING
    assert json.loads((root / "fsjobstore.json").read_text())["format"] == FORMAT_VERSION


def test_garbage_in_the_marker_is_refused_and_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "s"
    JobStore(root).close()
    (root / "fsjobstore.json").write_text("not json at all")
    before = files_under(str(root))
    with pytest.raises(StoreFormatError, match="is not valid JSON"):
        JobStore(root)
    assert files_under(str(root)) == before


def test_the_skeleton_is_fsynced_even_in_a_store_that_does_not_fsync(tmp_path: Path) -> None:
    from faultkit import hooked

    class Syncs:
        def __init__(self) -> None:
            self.synced: list[str] = []
            self.fds: dict[int, str] = {}

        def before(self, op: str, args: tuple[object, ...]) -> None:
            pass

        def after(self, op: str, args: tuple[object, ...], result: object) -> None:
            if op == "open" and isinstance(result, int):
                self.fds[result] = str(args[0])
            elif op == "fsync" and isinstance(args[0], int):
                self.synced.append(self.fds.get(args[0], "?"))

    root = str(tmp_path / "s")
    with hooked(Syncs()) as hook:
        JobStore(root, durable=False).close()
    synced = hook.synced
    assert any(p.startswith(os.path.join(root, ".fsjobstore.json.")) for p in synced), synced  # the marker's data
    assert root in synced and str(tmp_path) in synced  # its name, and the root's own entry
    assert os.path.join(root, "jobs") in synced  # the directories, as they are made


def test_a_world_writable_empty_directory_is_still_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UntrustedStore, match="world-writable"):
        JobStore(shared)
    assert os.listdir(shared) == []


def test_a_root_whose_parent_cannot_be_made_is_a_storage_error_not_a_bare_os_error() -> None:
    from fsjobstore import JobStore, JobStoreError, StorageError

    if not os.path.isdir("/proc/self"):
        pytest.skip("needs procfs, whose directories take no new entries")
    with pytest.raises(StorageError, match="cannot make the store's parent directory") as caught:
        JobStore("/proc/no-such-dir/jobs")
    assert isinstance(caught.value, JobStoreError)


def test_a_store_this_user_can_read_but_not_write_is_refused_saying_so_and_opens_read_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A copy made read-only: the hint for stores shared by several users would mislead. (As
    # root, which CI runs as, permissions do not refuse: the answer of access() stands in.)
    from fsjobstore._core import _opening

    root = tmp_path / "s"
    with JobStore(str(root)) as store:
        job = store.create("x")
    real = os.access
    monkeypatch.setattr(_opening.os, "access", lambda path, mode, **kw: not mode & os.W_OK and real(path, mode))
    with pytest.raises(UntrustedStore, match=r"can be read but not written by this user .*, its owner.*read_only=True"):
        JobStore(str(root), create=False)
    with JobStore(str(root), read_only=True) as reader:
        assert reader.get(job.id).request == "x"
    monkeypatch.setattr(_opening.os, "access", lambda path, mode, **kw: False)
    with pytest.raises(UntrustedStore, match=r"cannot be read and written .*, and each user be in that group\Z"):
        JobStore(str(root), create=False)
