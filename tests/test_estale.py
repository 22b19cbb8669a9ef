"""A commit whose claimed file is gone is a lost lease, whatever errno the filesystem gives.

On GlusterFS a holder whose claim another host took over gets ESTALE (a stale file handle) from
the write or rename of its claimed file, not ENOENT. These tests inject ESTALE through the
``_syscalls`` hook (as ``faultkit`` injects faults), with and without the claim still there.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest
from faultkit import hooked

from fsjobstore import JobState, JobStore, LeaseLost, StorageError, WorkLease
from fsjobstore._core._liveness import OwnerGone


class Stale:
    """Fail every call of ``ops`` with ESTALE while installed, as a stale handle would."""

    def __init__(self, *ops: str) -> None:
        self.ops = ops
        self.fired = 0

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if op in self.ops:
            self.fired += 1
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), *[a for a in args if isinstance(a, str)][:1])

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        pass


def _claim(store: JobStore) -> tuple[WorkLease, str]:
    job = store.create("x", max_attempts=3)
    lease = store.pull_work()
    assert lease is not None and lease.id == job.id
    return lease, os.path.join(store.path, "jobs", "active", f"{job.id}.{lease.token}.json")


def _taken_elsewhere(active: str) -> None:
    """What a recoverer on another host does first: rename the claim away (here: aside)."""
    os.rename(active, active + ".elsewhere")


@pytest.mark.parametrize("commit", ["fulfill", "fail-final", "fail-retry", "release"])
@pytest.mark.parametrize("ops", [("open",), ("write",), ("rename",)])
def test_a_commit_meeting_a_stale_handle_on_a_claim_that_is_gone_raises_lease_lost(
        store: JobStore, commit: str, ops: tuple[str, ...]) -> None:
    lease, active = _claim(store)
    _taken_elsewhere(active)
    with hooked(Stale(*ops)), pytest.raises(LeaseLost):
        _commit(lease, commit)
    assert lease.finished and lease.compromised is not None


@pytest.mark.parametrize("commit", ["fulfill", "fail-final", "fail-retry", "release"])
def test_a_stale_handle_on_a_claim_still_there_is_a_storage_fault_and_the_lease_stays_ours(
        store: JobStore, commit: str) -> None:
    lease, active = _claim(store)
    hook = Stale("open", "rename")
    with hooked(hook), pytest.raises(StorageError) as info:
        _commit(lease, commit)
    assert hook.fired and info.value.errno == errno.ESTALE and not isinstance(info.value, LeaseLost)
    assert os.path.exists(active) and not lease.finished
    lease.fulfill("after the fault")  # the fault is gone: the same lease commits
    assert store.get(lease.id).state is JobState.FULFILLED


def _commit(lease: WorkLease, commit: str) -> None:
    if commit == "fulfill":
        lease.fulfill(1)
    elif commit == "release":
        lease.release()
    else:
        lease.fail("boom", retry=commit == "fail-retry")


def test_a_heartbeat_meeting_a_stale_handle_on_a_removed_owner_file_says_the_owner_is_gone(store: JobStore) -> None:
    owner = store._core.ensure_owner()
    os.unlink(owner.path)  # another host judged this process gone and removed its owner file
    with hooked(Stale("write")), pytest.raises(OwnerGone):
        owner.beat()


def test_a_heartbeat_meeting_a_stale_handle_on_its_own_file_still_there_is_a_storage_fault(store: JobStore) -> None:
    owner = store._core.ensure_owner()
    with hooked(Stale("write")), pytest.raises(StorageError) as info:
        owner.beat()
    assert not isinstance(info.value, OwnerGone) and os.path.exists(owner.path)
    owner.beat()


def test_a_probe_meeting_a_stale_handle_for_a_removed_owner_file_finds_the_owner_dead(
        open_store: Any) -> None:
    a, b = open_store(), open_store()
    gone = a._core.ensure_owner()
    name = gone.owner
    os.unlink(gone.path)
    with hooked(Stale("open")):
        assert b._core.probe.status(name) == "dead"


def test_a_probe_whose_owner_file_stays_stale_takes_the_owner_as_alive_and_recovery_goes_on(
        open_store: Any) -> None:
    # Seen on GlusterFS in a chaos run: while a client was cut off, the open of a live owner's
    # file kept failing with ESTALE and every recovery pass failed with it. It tells nothing about
    # the owner: never take its jobs for it, and do not stop the rest of the sweep.
    a, b = open_store(), open_store()
    lease = a.create("x") and a.pull_work()
    assert lease is not None
    owner = a._core.ensure_owner().owner
    b.recover(deep=False)  # b's own owner file, made before the fault

    class StaleOwner(Stale):
        def before(self, op: str, args: tuple[Any, ...]) -> None:
            if any(isinstance(x, str) and x.endswith(f"{owner}.owner") for x in args):
                super().before(op, args)

    with hooked(StaleOwner("open")) as stale:
        assert b._core.probe.status(owner) == "alive"
        b.recover(deep=False)  # raised StorageError before
    assert stale.fired >= 10
    assert a.get(lease.id).state is JobState.ACTIVE
    lease.fulfill(1)
    assert a.get(lease.id).state is JobState.FULFILLED
