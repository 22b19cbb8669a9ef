"""Celery on a directory: the result backend, and a Celery app run by a real ``celery worker``
process with the store as its broker and its backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from celery import Celery, states

from fsjobstore import JobState, JobStore
from fsjobstore.contrib.celery import RESULTS_QUEUE, FSJobStoreBackend


def _app(tmp_path: Path, **conf: object) -> Celery:
    url = f"fsjobstore://{tmp_path}/store"
    app = Celery("t", broker=url, backend=url, set_as_current=False)
    app.conf.update(conf)
    return app


def test_celery_finds_the_backend_by_the_urls_scheme(tmp_path: Path) -> None:
    assert isinstance(_app(tmp_path).backend, FSJobStoreBackend)


def test_a_backend_url_that_names_no_store_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    from celery.exceptions import ImproperlyConfigured

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a store")
    app = Celery("t", backend=f"fsjobstore://{tmp_path}/mine", set_as_current=False)
    with pytest.raises(ImproperlyConfigured, match=r"cannot open the store at .*mine"):
        app.backend  # noqa: B018


def test_a_final_result_is_a_job_of_its_own_named_by_the_task_id_and_readable(tmp_path: Path) -> None:
    backend = _app(tmp_path).backend
    backend.store_result("task-1", {"total": 3}, states.SUCCESS)
    assert backend.get_task_meta("task-1")["result"] == {"total": 3}
    store = JobStore(tmp_path / "store", create=False)
    job = store.get("task-1")
    store.close()
    assert job.state is JobState.FULFILLED and job.queue == RESULTS_QUEUE
    assert job.value["status"] == "SUCCESS" and job.value["result"] == {"total": 3}  # JSON, not a blob


def test_a_failed_task_ends_failed_and_a_revoked_one_cancelled_as_the_stores_own_jobs_do(tmp_path: Path) -> None:
    app = _app(tmp_path)
    backend = app.backend
    try:
        raise ValueError("boom")
    except ValueError as exc:
        backend.store_result("bad", exc, states.FAILURE, traceback="Traceback ...\nValueError: boom")
    backend.store_result("gone", None, states.REVOKED)
    store = JobStore(tmp_path / "store", create=False)
    failed, revoked = store.get("bad"), store.get("gone")
    store.close()
    counted = backend.store.counters().queues[RESULTS_QUEUE].failed  # the backend's own process's counts
    assert failed.state is JobState.FAILED and failed.error == "Traceback ...\nValueError: boom"
    assert revoked.state is JobState.CANCELLED
    assert counted == 1  # what status, the dashboard and /metrics show as failed
    result = app.AsyncResult("bad")
    assert result.state == states.FAILURE
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=5)
    assert app.AsyncResult("gone").state == states.REVOKED


def test_a_state_before_the_end_is_readable_and_gone_once_the_task_ends(tmp_path: Path) -> None:
    backend = _app(tmp_path).backend
    backend.store_result("t2", {"done": 5}, "PROGRESS")
    meta = backend.get_task_meta("t2", cache=False)
    assert meta["status"] == "PROGRESS" and meta["result"] == {"done": 5}
    backend.store_result("t2", 42, states.SUCCESS)
    assert backend.get_task_meta("t2", cache=False)["result"] == 42
    assert not (tmp_path / "store" / "contrib" / "celery" / "states" / "t2.json").exists()


def test_the_first_final_state_stands_as_a_success_is_never_overwritten(tmp_path: Path) -> None:
    backend = _app(tmp_path).backend
    backend.store_result("t3", "first", states.SUCCESS)
    backend.store_result("t3", ValueError("second"), states.FAILURE)  # a redelivered run, late
    assert backend.get_task_meta("t3", cache=False)["result"] == "first"


def test_a_result_is_removed_after_result_expires_by_the_stores_retention(tmp_path: Path) -> None:
    backend = _app(tmp_path, result_expires=1).backend
    backend.store_result("t4", 1, states.SUCCESS)
    backend.store_result("t4-also", 1, states.SUCCESS)
    store = JobStore(tmp_path / "store", create=False)
    try:
        store.pull_work(queues="celery", timeout=0)  # a store that pulls runs retention, as a worker's does
        deadline = time.monotonic() + 30
        # Each result expires a second after its own end, so wait for the queue, not for one of them.
        while time.monotonic() < deadline and list(store.jobs(queue=RESULTS_QUEUE)):
            time.sleep(0.2)
        assert [j.id for j in store.jobs(queue=RESULTS_QUEUE)] == []
    finally:
        store.close()
    assert _app(tmp_path).backend.get_task_meta("t4")["status"] == states.PENDING  # forgotten, as Redis forgets


def test_a_pending_task_is_pending_and_a_planted_states_file_says_nothing_wrong(tmp_path: Path) -> None:
    backend = _app(tmp_path).backend
    assert backend.get_task_meta("nobody")["status"] == states.PENDING
    folder = tmp_path / "store" / "contrib" / "celery" / "states"
    folder.mkdir(parents=True)
    (folder / "evil.json").symlink_to("/etc/passwd")
    os.mkfifo(folder / "fifo.json")
    (folder / "torn.json").write_bytes(b'{"status": "SUCC')
    for task_id in ("evil", "fifo", "torn"):
        assert backend.get_task_meta(task_id, cache=False)["status"] == states.PENDING


def test_get_is_woken_by_the_store_not_by_its_poll_interval(tmp_path: Path) -> None:
    # The store's poll interval is 30 s and the wait 10: only an inotify wake-up ends it in time.
    app = _app(tmp_path, result_backend_transport_options={"poll_interval": 30})
    backend = app.backend
    threading.Timer(0.5, backend.store_result, ("t5", "late", states.SUCCESS)).start()
    meta = backend.wait_for("t5", timeout=10, interval=30)
    assert meta["result"] == "late"


_TASKS = textwrap.dedent("""
    import fsjobstore.contrib.kombu  # an editable install has no .pth (an installed wheel does)
    import os
    from celery import Celery
    url = os.environ["STORE_URL"]
    app = Celery("tasks", broker=url, backend=url)
    app.conf.update(task_acks_late=True, worker_prefetch_multiplier=2)

    @app.task
    def add(x, y):
        return x + y

    @app.task
    def tsum(xs):
        return sum(xs)

    @app.task(bind=True, max_retries=3)
    def flaky(self, n):
        if self.request.retries < n:
            raise self.retry(countdown=0.1)
        return self.request.retries

    @app.task
    def boom():
        raise KeyError("boom")
""")


@pytest.fixture
def worker(tmp_path: Path) -> object:
    (tmp_path / "tasks.py").write_text(_TASKS)
    env = {**os.environ, "STORE_URL": f"fsjobstore://{tmp_path}/store", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "prefork", "-c", "2",
                             "-l", "warning", "--without-mingle", "--without-gossip"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    sys.path.insert(0, str(tmp_path))
    os.environ["STORE_URL"] = env["STORE_URL"]
    try:
        yield proc
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tasks", None)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_a_celery_app_runs_on_a_directory_with_a_real_worker_process(tmp_path: Path, worker: subprocess.Popen) -> None:
    import tasks  # type: ignore[import-not-found]
    from celery import chord, group

    assert tasks.add.delay(2, 3).get(timeout=60) == 5
    assert tasks.flaky.delay(2).get(timeout=60) == 2
    with pytest.raises(KeyError):
        tasks.boom.delay().get(timeout=60)
    assert group(tasks.add.s(i, 1) for i in range(5))().get(timeout=60) == [1, 2, 3, 4, 5]
    assert chord(tasks.add.s(i, i) for i in range(4))(tasks.tsum.s()).get(timeout=60) == 12
    result = tasks.add.delay(20, 22)
    assert result.get(timeout=60) == 42
    # What fsjobstore shows of it: the result as JSON, under the task's id.
    shown = subprocess.run([sys.executable, "-m", "fsjobstore", "get", f"{tmp_path}/store", result.id, "--json"],
                           capture_output=True, text=True, check=True)
    assert json.loads(shown.stdout)["value"]["data"]["result"] == 42
    # The message's job: its request is Celery's message, its body readable JSON.
    store = JobStore(tmp_path / "store", create=False)
    messages = [j for j in store.jobs(state="fulfilled", queue="celery", limit=None)]
    store.close()
    assert any(j.request["headers"].get("id") == result.id and j.request["body"][0] == [20, 22] for j in messages)
    # A warm shutdown: SIGTERM, exit 0.
    os.killpg(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.stdout.read().decode() if worker.stdout else ""


def test_the_worker_leaves_no_job_running_or_waiting_behind(tmp_path: Path, worker: subprocess.Popen) -> None:
    import tasks

    results = [tasks.add.delay(i, i) for i in range(40)]
    assert [r.get(timeout=60) for r in results] == [2 * i for i in range(40)]
    deadline = time.monotonic() + 30
    store = JobStore(tmp_path / "store", create=False)
    try:
        while time.monotonic() < deadline:
            by_queue = store.statistics().by_queue["celery"]
            workers = store.workers()  # published about once a second
            if by_queue["active"] == 0 and [w.jobs_done for w in workers] == [40]:
                break
            time.sleep(0.1)
    finally:
        store.close()
    # The Celery worker shows as the store's own workers do (fsjobstore workers, the dashboard).
    assert [(w.mode, "celery" in (w.queues or ()), w.jobs_done) for w in workers] == [("kombu", True, 40)]
    assert by_queue["active"] == 0 and by_queue["pending"] == 0
    assert by_queue["fulfilled"] >= 40


def test_a_failure_that_beat_a_success_to_the_job_reads_as_a_failure_never_pending(tmp_path: Path) -> None:
    backend = _app(tmp_path).backend
    store = backend.store
    store.create({"celery": "result", "task_id": "race"}, queue=RESULTS_QUEUE, job_id="race", delay=3600)
    store.fail("race", "Traceback ...\nKeyError: 'x'")  # as the FAILURE side of the race does
    meta = backend.get_task_meta("race", cache=False)
    assert meta["status"] == states.FAILURE and "KeyError" in str(meta["result"])


def test_a_final_state_planted_in_a_states_file_is_not_believed(tmp_path: Path) -> None:
    backend = _app(tmp_path).backend
    backend.store_result("t9", None, "STARTED")  # makes the folder
    folder = tmp_path / "store" / "contrib" / "celery" / "states"
    (folder / "t9.json").write_text('{"status": "SUCCESS", "result": "planted"}')
    (folder / "t10.json").write_text('{"status": 5}')
    assert backend.get_task_meta("t9", cache=False)["status"] == states.PENDING
    assert backend.get_task_meta("t10", cache=False)["status"] == states.PENDING


def test_threads_that_wait_for_results_and_end_leave_no_inotify_descriptor_behind(tmp_path: Path) -> None:
    import gc

    backend = _app(tmp_path).backend
    for n in range(3):
        backend.store_result(f"w{n}", n, states.SUCCESS)
    backend.wait_for("w0", timeout=5)  # this thread's own, kept
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        threads = [threading.Thread(target=backend.wait_for, args=(f"w{n}",), kwargs={"timeout": 5}) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2, "each thread's wake-ups must close with it"
