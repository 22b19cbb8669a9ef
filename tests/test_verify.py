"""``fsjobstore verify``: each check passes here and can fail, and the heartbeat-only mode it
reports for network filesystems really waits for a lease instead of trusting free locks."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FakeWall, die
from faultkit import CountingHook, hooked

from fsjobstore import InvalidRequest, JobState, JobStore, verify
from fsjobstore._os import _syscalls, _verify


def test_verify_passes_on_this_machine_and_names_the_modes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "fsjobstore", "verify", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("atomic rename", "hard links", "fsync", "lock exclusion", "inotify wake-ups"):
        assert any(line.startswith(f"PASS  {name}:") for line in lines), lines
    assert any(line.startswith("take-over: lock-based") for line in lines)
    assert any(line.startswith("wake-ups: inotify") for line in lines)
    assert any(line.startswith("PASS  inotify wake-ups:") and line.endswith("(inotify)") for line in lines)
    assert lines[-1] == "result: PASS"
    assert os.listdir(tmp_path) == []  # it cleans up after itself


def test_verify_fails_where_locks_do_not_exclude(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_syscalls, "try_lock", lambda fd: True)  # every lock "succeeds": no exclusion
    report = verify(str(tmp_path))
    out = report.lines()
    assert report.safe is False
    assert any(line.startswith("FAIL  lock exclusion") for line in out)
    assert out[-1] == "result: FAIL"


def test_verify_fails_where_hard_links_are_refused(tmp_path: Path) -> None:
    class NoLinks(CountingHook):
        def before(self, op: str, args: tuple[object, ...]) -> None:
            if op == "link":
                raise OSError(errno.EPERM, "links not supported")

    with hooked(NoLinks()):
        report = verify(str(tmp_path))
    assert report.safe is False
    assert any(line.startswith("FAIL  hard links") for line in report.lines())


def test_local_filesystems_trust_locks_and_network_ones_do_not(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert _verify.filesystem_type(str(tmp_path)) != "unknown"
    assert _verify.locks_prove_death(str(tmp_path))
    for network in ("nfs4", "cifs", "fuse.sshfs", "ceph"):
        monkeypatch.setattr(_verify, "filesystem_type", lambda path, t=network: t)
        assert not _verify.locks_prove_death(str(tmp_path))


def test_a_heartbeat_only_store_takes_a_dead_workers_job_only_after_a_whole_lease(
    open_store: Callable[..., JobStore],
) -> None:
    worker = open_store(lease_duration=30.0)
    clock = FakeWall(0.0)
    rescuer = open_store(lease_duration=30.0, lock_takeover=False, clock=clock)
    assert rescuer.lock_takeover is False
    job = worker.create("x")
    assert worker.pull_work() is not None
    die(worker)  # its lock is free, its heartbeat frozen
    assert rescuer.recover().requeued == 0  # a free lock is not proof here
    clock.advance(29.0)
    assert rescuer.recover().requeued == 0
    clock.advance(1.5)
    assert rescuer.recover().requeued == 1
    assert rescuer.get(job.id).state is JobState.PENDING


def _exit_without_creating(path: str) -> None:
    os._exit(0)


def test_the_wakeup_check_fails_when_no_event_arrives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_verify, "_touch_later", _exit_without_creating)  # the child creates nothing
    check = _verify.check_inotify(str(tmp_path), wait=0.3)
    assert not check.passed and "no event within 0.3 s" in check.detail


def test_verify_of_something_that_is_not_a_writable_directory_is_a_clear_error(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(InvalidRequest, match="is not a directory"):
        verify(str(afile))
    with pytest.raises(InvalidRequest, match="does not exist"):
        verify(str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()  # verify makes nothing
    with pytest.raises(InvalidRequest, match="cannot write in /proc"):
        verify("/proc")
    for target in ("/proc", str(afile)):  # and from the shell: one line, no traceback
        done = subprocess.run([sys.executable, "-m", "fsjobstore", "verify", target], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("usage: fsjobstore verify "), done.stderr  # an error of its arguments
        assert "\nfsjobstore verify: error: " in done.stderr, done.stderr


def test_verify_warns_that_tmpfs_loses_everything_at_a_reboot(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_verify, "filesystem_type", lambda path: "tmpfs")
    report = verify(str(tmp_path))
    assert report.safe  # a store works there; it just does not outlive a reboot
    assert any("tmpfs keeps everything in memory" in w for w in report.warnings)
    assert any(line.startswith("warning: tmpfs") for line in report.lines())


def test_verify_removes_its_scratch_directory_even_when_a_check_fails(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(scratch: str) -> _verify.VerifyCheck:
        with open(os.path.join(scratch, "left-open"), "w"):  # a file, and an exception mid-check
            raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(_verify, "CHECKS", (("atomic rename", broken, True), *_verify.CHECKS[1:]))
    report = verify(str(tmp_path))
    assert not report.safe and report.checks[0].detail.startswith("OSError")
    assert os.listdir(tmp_path) == []


def test_verify_says_when_it_could_not_remove_its_scratch_directory(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def busy(path: str, **kwargs: object) -> None:  # kwargs: dir_fd (the scratch's descriptor)
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(_verify, "CHECKS", _verify.CHECKS[1:2])  # hard links only: quick
    monkeypatch.setattr(_verify.shutil, "rmtree", busy)
    monkeypatch.setattr(_verify.time, "sleep", lambda s: None)
    report = verify(str(tmp_path))
    assert any(w.startswith("could not remove the scratch directory") and "busy" in w for w in report.warnings)
