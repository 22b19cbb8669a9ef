"""Files planted in the store by others are quarantined or ignored; good jobs keep flowing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest
from internals import open_fds, pending_file

from fsjobstore import CorruptJob, JobNotFound, JobStore
from fsjobstore._format._layout import PENDING_RE, bucket_of_name

GOOD_NAME = "0000000.00000000000000000001.planted.json"


def _pending(store: JobStore, name: str = GOOD_NAME, *, flat: bool = False) -> str:
    """Where to plant ``name`` in the default queue: in the bucket a job of that name belongs in
    (``pending/default/<P>.<S>/``; any name not of the grammar goes into the oldest bucket a
    job could have), or, with ``flat``, in the queue's directory itself, as an older store wrote."""
    d = os.path.join(store.path, "jobs", "pending", "default")
    if not flat:
        d = os.path.join(d, bucket_of_name(name) if PENDING_RE.match(name) else "0000000.00000000000")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


def _drain(store: JobStore) -> list[str]:
    done = []
    while (lease := store.pull_work()) is not None:
        lease.fulfill(b"ok")
        done.append(lease.id)
    return done


def _plant_file(path: str, content: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(content)


PLANTS = {
    "empty": lambda p: _plant_file(p, b""),
    "truncated": lambda p: _plant_file(p, b'{"format":1,"id":"planted"'),
    "garbage": lambda p: _plant_file(p, b"\x00\xff\xfe garbage"),
    "bom": lambda p: _plant_file(p, b"\xef\xbb\xbf{}"),
    "nan": lambda p: _plant_file(p, b'{"format":1,"x":NaN}'),
    "dupkeys": lambda p: _plant_file(p, b'{"format":1,"format":1}'),
    "deep": lambda p: _plant_file(p, b"[" * 100_000 + b"]" * 100_000),
    "future": lambda p: _plant_file(p, b'{"format":99}'),
    "symlink_passwd": lambda p: os.symlink("/etc/passwd", p),
    "symlink_zero": lambda p: os.symlink("/dev/zero", p),
    "dangling": lambda p: os.symlink("/nonexistent/x", p),
    "fifo": lambda p: os.mkfifo(p),
    "directory": lambda p: os.mkdir(p),
    "sparse_huge": lambda p: os.truncate(_plant_file(p, b"") or p, 1 << 30),
}


@pytest.mark.parametrize("flat", [False, True], ids=["in-its-bucket", "flat"])
@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_a_planted_pending_file_is_quarantined_and_good_jobs_flow(store: JobStore, kind: str, flat: bool) -> None:
    assert store.pull_work(timeout=0.01) is None  # start the watcher and heartbeat before counting
    fds_before = open_fds()
    rounds = 10
    for n in range(rounds):
        good = store.create("good")
        PLANTS[kind](_pending(store, GOOD_NAME.replace("planted", f"planted{n}"), flat=flat))
        assert _drain(store) == [good.id]
    # Background threads may hold a descriptor for a moment; a leak per bad file would show as +10.
    assert open_fds() - fds_before < rounds // 2
    assert store.statistics().quarantined == rounds
    reasons = [n for n in os.listdir(os.path.join(store.path, "quarantine")) if n.endswith(".reason")]
    assert len(reasons) == rounds
    assert os.path.exists("/etc/passwd")


def test_a_socket_in_pending_is_quarantined(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _pending(store)
    monkeypatch.chdir(os.path.dirname(path))  # AF_UNIX paths are limited to 108 bytes
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(os.path.basename(path))
        good = store.create("good")
        assert _drain(store) == [good.id]
        assert store.statistics().quarantined == 1
    finally:
        sock.close()


@pytest.mark.parametrize("flat", [False, True], ids=["in-a-bucket", "beside-the-buckets"])
def test_files_with_unknown_names_are_moved_aside(store: JobStore, flat: bool) -> None:
    good = store.create("good")
    for name in ("junk.txt", "notes"):
        _plant_file(_pending(store, name, flat=flat), b"hello")
    assert _drain(store) == [good.id]
    assert store.statistics().quarantined == 2


def test_a_valid_job_file_under_the_wrong_name_is_quarantined(store: JobStore) -> None:
    real = store.create("real")
    os.link(pending_file(store.path, real.id), _pending(store))  # content says "real", name says "planted"
    assert _drain(store) == [real.id]
    assert store.statistics().quarantined == 1


def test_get_of_a_corrupt_final_job_raises_corrupt_job_and_quarantines_it(store: JobStore) -> None:
    path = os.path.join(store.path, "jobs", "fulfilled", "broken.json")
    _plant_file(path, b"{nope")
    with pytest.raises(CorruptJob):
        store.get("broken")
    assert not os.path.exists(path)


def test_planted_files_in_other_directories_are_quarantined_by_recovery(store: JobStore) -> None:
    for rel in ("jobs/active/whatever", "tmp/whatever", "leases/whatever", "targets/bad.name"):
        _plant_file(os.path.join(store.path, rel), b"x")
    report = store.recover()
    assert report.quarantined == 4
    assert store.recover().quarantined == 0


@pytest.mark.parametrize("kind", ["fifo", "garbage", "symlink_passwd", "directory"])
def test_planted_files_in_scheduled_and_notify_do_not_stop_work_or_notifications(store: JobStore, kind: str) -> None:
    job = store.create("x")
    store.queue(job.id, "t")
    jobs = os.path.join(store.path, "jobs")
    PLANTS[kind](os.path.join(jobs, "scheduled", "00000000000000001.default.1000000.00000000000000000001.p.json"))
    PLANTS[kind](os.path.join(jobs, "notify", "planted.json"))
    PLANTS[kind](os.path.join(jobs, "notify", "not-a-notify-name"))
    assert _drain(store) == [job.id]
    note = store.pull_notification()
    assert note is not None and note.id == job.id
    note.done(["t"])
    assert store.pull_notification() is None


def _corpus(**env: str) -> dict[str, Any]:
    script = os.path.join(os.path.dirname(__file__), "hostile_corpus.py")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, **env}).stdout
    report: dict[str, Any] = json.loads(out)
    return report


def test_the_whole_corpus_in_every_directory_is_quarantined_or_ignored_and_good_jobs_flow() -> None:
    report = _corpus()
    assert report["planted"] == report["kinds"] * report["directories"] >= 200
    assert report["errors"] == []
    assert report["good_fulfilled"] == report["good_notified"] == report["good_created"]
    assert report["other_fulfilled"] == []
    assert report["quarantined"] > 100
    # Only ids/ keeps what was planted: it is read solely to repair a create, and a planted
    # file there just spends that id.
    assert all(p.startswith("ids/") for p in report["left_in_place"]), report["left_in_place"]
    assert report["fd_growth"] <= 2
    assert report["outside_root"] == []


def test_the_corpus_audit_notices_a_read_outside_the_store() -> None:
    assert _corpus(HOSTILE_SELFTEST="1")["outside_root"] == ["open /etc/hostname"]


@pytest.mark.parametrize("doc", [b'{"a":1,"b":2,"a":3}', b'{"x":[{"k":1},{"k":1,"k":2}]}', b'{"a":{"a":1,"a":1}}'])
def test_a_duplicate_key_at_any_depth_is_refused_by_name(doc: bytes) -> None:
    from fsjobstore._format._values import loads

    with pytest.raises(ValueError, match="duplicate key"):
        loads(doc)


def test_the_same_key_in_sibling_objects_is_no_duplicate() -> None:
    from fsjobstore._format._values import loads

    assert loads(b'{"x":[{"k":1},{"k":2}],"k":3}') == {"x": [{"k": 1}, {"k": 2}], "k": 3}


def test_a_file_where_a_queue_directory_belongs_is_quarantined_and_every_queue_keeps_working(store: JobStore) -> None:
    with open(os.path.join(store.path, "jobs", "pending", "images"), "w") as fh:
        fh.write("not a directory")
    job = store.create({"n": 1})
    assert store.statistics().pending == 1
    assert store.recover(deep=True) is not None
    lease = store.pull_work()
    assert lease is not None and lease.id == job.id
    lease.fulfill(b"ok")
    assert store.create({"n": 2}, queue="other").queue == "other"
    # Moved aside, and a real (empty) queue directory made in its place (issue 23).
    images = os.path.join(store.path, "jobs", "pending", "images")
    assert os.path.isdir(images) and not os.path.islink(images) and os.listdir(images) == []
    assert any("images" in name for name in os.listdir(os.path.join(store.path, "quarantine")))


def test_stats_and_purge_count_only_jobs_and_purge_leaves_planted_names_alone(store: JobStore) -> None:
    """Names planted beside jobs are no jobs: statistics() does not count them, and a purge
    neither counts nor removes them (one named like a job of another id would free that id)."""
    real = [store.create({"n": i}) for i in range(4)]
    later = store.create("later", delay=3600)
    jobs = os.path.join(store.path, "jobs")
    os.makedirs(os.path.join(jobs, "pending", "bad.queue", "1000000.00000000001"))
    _plant_file(os.path.join(jobs, "pending", "bad.queue", "1000000.00000000001",
                             "1000000.00000000001000000000.x.json"), b"{}")  # in no queue's directory
    for name in ("junk.txt", "notes"):
        _plant_file(_pending(store, name), b"hello")
    _plant_file(_pending(store, f"0000000.00000000000000000001.{later.id}.json"), b"not a job")  # names a real id
    _plant_file(_pending(store, "0000000.00000000000000000002.notjson.json"), b"{nope")
    for rel in ("scheduled/junk.txt", "active/junk.txt", "notify/junk.txt", "deferred/junk.txt"):
        _plant_file(os.path.join(jobs, rel), b"x")
    stats = store.statistics()
    assert (stats.scheduled, stats.active, stats.notifications, stats.deferred) == (1, 0, 0, 0)
    assert "bad.queue" not in stats.pending_by_queue and "bad.queue" not in stats.by_queue
    assert store.purge(states="pending", dry_run=True) == 4
    assert store.purge(states=["pending", "scheduled"]) == 5
    assert os.path.exists(_pending(store, f"0000000.00000000000000000001.{later.id}.json"))
    assert os.path.exists(_pending(store, "0000000.00000000000000000002.notjson.json"))
    assert all(os.path.exists(os.path.join(jobs, rel)) for rel in ("scheduled/junk.txt", "deferred/junk.txt"))
    with pytest.raises(JobNotFound):
        store.get(real[0].id)
