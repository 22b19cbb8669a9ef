"""A store shared by several Unix users through a group: real processes under real uids.

Each role runs in a forked child that drops to its own uid (with the shared group as a
supplementary group, and a umask of 022 that would strip group bits if the store did not set
them), so the kernel's permission checks are the ones a deployment meets. Needs root to switch
users; skipped otherwise.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import stat
import tempfile
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fsjobstore import JobState, JobStore, UntrustedStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

GROUP = 47_000  # a gid no one else uses; no /etc/group entry is needed by the kernel
WEB, WORKER, OUTSIDER = 47_001, 47_002, 47_003


def _as_user(uid: int, groups: list[int], fn: Callable[[], Any], conn: Any) -> None:
    try:
        os.setgroups(groups)
        os.setgid(uid)  # a primary group of its own: membership of GROUP is supplementary only
        os.setuid(uid)
        os.umask(0o022)
        conn.send(("ok", fn()))
    except BaseException as exc:  # report, do not hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        os._exit(0)


def run_as(uid: int, fn: Callable[[], Any], *, member: bool = True) -> Any:
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_as_user, args=(uid, [GROUP] if member else [], fn, send))
    child.start()
    assert receive.poll(60), "the child said nothing"
    kind, payload = receive.recv()
    child.join(10)
    if kind == "error":
        raise AssertionError(f"as uid {uid}: {payload}")
    return payload


@pytest.fixture
def root() -> Iterator[str]:
    base = tempfile.mkdtemp(prefix="fsjs-group-")
    os.chmod(base, 0o755)  # every user may pass through to the store
    os.chown(base, WEB, WEB)  # the directory an admin gave the web app, where it makes the store
    try:
        yield os.path.join(base, "store")
    finally:
        shutil.rmtree(base)


def test_users_of_one_group_share_a_store(root: str) -> None:
    def produce() -> str:
        with JobStore(root, group=GROUP) as store:
            job = store.create({"resize": "cat.png"})
            store.queue(job.id, {"notify": "web"})
            return job.id

    job_id = run_as(WEB, produce)

    def work() -> Any:
        with JobStore(root) as store:  # the group comes from the store
            lease = store.pull_work()
            assert lease is not None and lease.id == job_id
            lease.progress(1, 2, "halfway")  # runs/<id>/: the next attempt may be another member's
            lease.log("resized")
            lease.fulfill({"width": 640})
            note = store.pull_notification()
            assert note is not None and note.waiting == ({"notify": "web"},)
            note.done(note.waiting)
            return store.group

    assert run_as(WORKER, work) == GROUP

    def read() -> Any:
        with JobStore(root) as store:
            got = store.get(job_id)
            return got.state.value, got.value

    assert run_as(WEB, read) == ("fulfilled", {"width": 640})
    for dirpath, _dirs, filenames in os.walk(root):
        st = os.stat(dirpath)
        assert st.st_gid == GROUP and stat.S_IMODE(st.st_mode) == 0o2770, dirpath
        for name in filenames:
            fst = os.stat(os.path.join(dirpath, name))
            if name.startswith(".") or os.path.relpath(dirpath, root).startswith("finished"):
                continue  # finished-index entries are empty: the umask may cut their mode (FORMAT.md)
            assert fst.st_gid == GROUP and stat.S_IMODE(fst.st_mode) & 0o060 == 0o060, (name, oct(fst.st_mode))


def test_a_worker_of_another_user_that_died_has_its_job_taken_by_a_member(root: str) -> None:
    def produce() -> str:
        with JobStore(root, group=GROUP) as store:
            return store.create("x").id

    job_id = run_as(WEB, produce)

    def claim_and_die() -> None:
        store = JobStore(root)
        assert store.pull_work() is not None
        os._exit(0)  # dies holding the lease; its owner file and claim are left behind

    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_as_user, args=(WORKER, [GROUP], claim_and_die, ctx.Pipe(duplex=False)[1]))
    child.start()
    child.join(30)

    def rescue() -> Any:
        with JobStore(root) as store:
            report = store.recover()
            return report.requeued, report.locks_removed, store.get(job_id).state.value

    assert run_as(WEB, rescue) == (1, 1, JobState.PENDING.value)


def test_a_user_outside_the_group_is_refused(root: str) -> None:
    run_as(WEB, lambda: JobStore(root, group=GROUP).close())

    def intrude() -> str:
        try:
            JobStore(root)
        except (UntrustedStore, PermissionError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "opened"

    said = run_as(OUTSIDER, intrude, member=False)
    assert said.startswith(("UntrustedStore", "PermissionError", "StorageError")), said


def test_a_private_store_tells_another_user_how_to_share_one(root: str) -> None:
    run_as(WEB, lambda: JobStore(root).close())
    os.chmod(root, 0o755)  # let the other user reach it, so the store's own check speaks

    def other() -> str:
        try:
            JobStore(root)
        except UntrustedStore as exc:
            return str(exc)
        return "opened"

    said = run_as(WORKER, other)
    assert "created with JobStore(path, group=...)" in said and "JobStore(path, read_only=True)" in said, said
