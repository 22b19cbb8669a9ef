"""Fault injection: every errno a disk can throw, at every filesystem call of every operation.

For each operation and each call index N, the N-th call fails with the errno. The operation must
either absorb the fault (a failed cleanup, say) and complete, or raise a StorageError that names
the errno; nothing may be left half-published, no good file may be quarantined, and once the
fault is gone a retry and a full create-claim-fulfil-notify cycle must work on the same store.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from faultkit import SCENARIOS, CountingHook, Ctx, Scenario, check_store, full_cycle, hooked, raise_errno

from fsjobstore import JobState, JobStore, JobStoreError, StorageError, StorageFull

ERRNOS = {
    "ENOSPC": errno.ENOSPC, "EDQUOT": errno.EDQUOT, "EIO": errno.EIO, "EROFS": errno.EROFS,
    "EMFILE": errno.EMFILE, "EINTR": errno.EINTR,
}


def inject_everywhere(scenario: Scenario, code: int) -> tuple[int, list[str]]:
    """Run the scenario once per call index with the fault there; (indexes tried, problems)."""
    problems: list[str] = []
    n = 0
    while True:
        n += 1
        root = tempfile.mkdtemp(prefix="fsjs-fault-")
        try:
            store = JobStore(root, backoff=lambda attempt: 0.0)
            try:
                ctx = Ctx()
                scenario.setup(store, ctx)
                hook = CountingHook(n, raise_errno(code))
                raised: BaseException | None = None
                with hooked(hook):
                    try:
                        scenario.run(store, ctx)
                    except Exception as exc:  # judged below
                        raised = exc
                where = f"{scenario.name} {errno.errorcode[code]} at call {n} ({hook.fired})"
                if hook.fired is None:
                    assert raised is None, f"{scenario.name} failed without a fault: {raised!r}"
                    return n - 1, problems
                if raised is not None:
                    if not isinstance(raised, StorageError) or raised.errno != code:
                        problems.append(f"{where}: raised {type(raised).__name__}: {raised}")
                    elif errno.errorcode[code] not in str(raised):
                        problems.append(f"{where}: the message does not name the cause: {raised}")
                    elif code in (errno.ENOSPC, errno.EDQUOT) and not isinstance(raised, StorageFull):
                        problems.append(f"{where}: a full disk is not reported as StorageFull")
                    if code == errno.EINTR:
                        problems.append(f"{where}: EINTR surfaced instead of being retried")
                problems += [f"{where}: {p}" for p in check_store(root, ctx, settled=False, litter_ok=True)]
                # The fault is gone: retrying and a full cycle must work on the same store.
                try:
                    if raised is not None:
                        (scenario.retry or scenario.run)(store, ctx)
                    problems += [f"{where}, then: {p}" for p in full_cycle(store)]
                    store.recover()
                except JobStoreError as exc:
                    problems.append(f"{where}: after the fault was gone: {type(exc).__name__}: {exc}")
                problems += [f"{where}, after recovery: {p}" for p in check_store(root, ctx, settled=False)]
            finally:
                store.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        assert n < 500, f"{scenario.name} never completed"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
@pytest.mark.parametrize("name", list(ERRNOS))
def test_a_fault_at_any_call_raises_a_named_error_and_leaves_nothing_half_done(scenario: Scenario,
                                                                                name: str) -> None:
    covered, problems = inject_everywhere(scenario, ERRNOS[name])
    assert covered > 0
    assert problems == []


def test_a_really_full_tmpfs_fails_cleanly_and_the_store_works_once_space_is_freed(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here to mount a private tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    script = os.path.join(os.path.dirname(__file__), "fullfs.py")
    done = subprocess.run(
        [unshare, "-rm", "sh", "-c", f'mount -t tmpfs -o size=256k tmpfs "{mount}" && exec "$0" "$1" "$2"',
         sys.executable, script, str(mount)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and "mount" in done.stderr and "fullfs" not in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [o.split(":")[0] for o in report["outcomes"]] == ["ok create", "ok fulfill"], report
    assert all("ENOSPC" in o for o in report["outcomes"]), report
    assert report["problems"] == []


def test_a_fault_reading_a_live_owners_lease_file_never_takes_its_jobs(open_store: Callable[..., JobStore]) -> None:
    worker, rescuer = open_store(), open_store()
    worker.create("x")
    lease = worker.pull_work()
    assert lease is not None

    class OwnerFilesFail(CountingHook):
        def before(self, op: str, args: tuple[object, ...]) -> None:
            if op == "open" and str(args[0]).endswith(".owner"):
                raise OSError(errno.EMFILE, "Too many open files")

    with hooked(OwnerFilesFail()), pytest.raises(StorageError) as raised:
        rescuer.recover()
    assert raised.value.errno == errno.EMFILE
    assert lease.compromised is None
    lease.fulfill(b"mine")
    assert rescuer.get(lease.id).value == b"mine"


if __name__ == "__main__":
    import logging

    logging.disable(logging.CRITICAL)
    total = problems = 0
    for code in ERRNOS.values():
        for scenario in SCENARIOS:
            covered, found = inject_everywhere(scenario, code)
            total, problems = total + covered, problems + len(found)
    print(f"faults injected: {total}, problems: {problems}")


def test_a_fulfil_by_id_that_fails_gives_its_job_back_uncounted(tmp_path: Path) -> None:
    # The claim a fulfil by id makes for itself is undone on a fault: nobody ran or released the
    # job, so nothing is counted (a worker's release counts given_back).
    with JobStore(str(tmp_path / "s")) as store:
        job = store.create(1, queue="q")

        class CommitFails(CountingHook):
            def before(self, op: str, args: tuple[object, ...]) -> None:
                if op == "write":  # the result line appended to the claimed file
                    raise OSError(errno.EIO, "Input/output error")

        with hooked(CommitFails()), pytest.raises(StorageError):
            store.fulfill(job.id, "done")
        assert store.get(job.id).state is JobState.PENDING
        c = store.counters().queues["q"]
        assert (c.created, c.given_back, c.fulfilled) == (1, 0, 0)
