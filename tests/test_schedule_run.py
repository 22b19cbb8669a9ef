"""Periodic jobs as users run them: a Worker's every()/cron(), `fsjobstore scheduler` and
`fsjobstore schedules`, and the mistakes a user makes on the way."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FakeWall

from fsjobstore import JobStore, Schedule, Worker, tick_of
from fsjobstore.worker import JobContext

pytestmark = pytest.mark.slow


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd)


def test_a_worker_makes_and_runs_its_every_second_ticks_while_it_runs(open_store: Callable[..., JobStore]) -> None:
    store = open_store()
    ran: list[str] = []

    def tick(job: JobContext) -> str:
        ran.append(job.id)
        return "ok"

    worker = Worker(store, {"ticks": tick}, mode="threads")
    worker.every(1, queue="ticks", name="each-second")
    worker.run(duration=3.6)
    assert 3 <= len(ran) <= 4, ran
    made = [tick_of(i) for i in ran]
    assert all(m is not None and m[0] == "each-second" for m in made)
    seconds = sorted(int(m[1].timestamp()) for m in made if m is not None)
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))


def test_a_burst_worker_makes_the_newest_missed_tick_then_runs_it_and_exits(
        root: str, open_store: Callable[..., JobStore]) -> None:
    JobStore(root, wall_clock=FakeWall(time.time() - 3600)).declare_schedule(
        "hourly", spec="every 600s", queue="reports")  # declared an hour ago; nobody ran it since
    store = open_store()
    worker = Worker(store, {"reports": lambda job: "done"}, mode="threads")
    worker.every(600, queue="reports", name="hourly")
    summary = worker.run(burst=True)
    assert summary.fulfilled == 1  # the newest of the missed ticks only (catch_up=1)
    [info] = store.schedules()
    assert info.last_job is not None and store.get(info.last_job).state == "fulfilled"


SCHEDULE_MODULE = textwrap.dedent("""
    from fsjobstore import Schedule, Worker
    schedule = Schedule()
    schedule.every(1, queue="q", name="fast", request={"from": "cli"})
    schedule.cron("0 3 * * *", tz="Europe/Paris", queue="q", name="nightly")
    empty = Schedule()
    not_a_schedule = {"every": 1}
""")


def test_the_scheduler_command_makes_ticks_and_schedules_lists_them(tmp_path: Path) -> None:
    (tmp_path / "myjobs.py").write_text(SCHEDULE_MODULE)
    root = str(tmp_path / "store")
    assert cli("init", root, cwd=tmp_path).returncode == 0
    none = cli("schedules", root, cwd=tmp_path)
    assert none.returncode == 0 and "no schedules" in none.stdout
    running = subprocess.Popen([sys.executable, "-m", "fsjobstore", "scheduler", root, "--schedule",
                                "myjobs:schedule"], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    time.sleep(3.5)
    running.terminate()
    _, err = running.communicate(timeout=30)
    assert running.returncode == 0, err
    assert "schedule fast: tick" in err and "Traceback" not in err
    listed = json.loads(cli("schedules", root, "--json", cwd=tmp_path).stdout)
    by_name = {row["name"]: row for row in listed}
    assert set(by_name) == {"fast", "nightly"}
    assert by_name["nightly"]["spec"] == "cron 0 3 * * * Europe/Paris" and by_name["nightly"]["last_tick"] is None
    assert by_name["nightly"]["next_tick"] > time.time()
    fast = by_name["fast"]
    with JobStore(root) as store:
        jobs = list(store.jobs(queue="q"))
        assert 2 <= len(jobs) <= 4 and {j.request["from"] for j in jobs} == {"cli"}
        assert fast["last_job"] == max(j.id for j in jobs)
    text = cli("schedules", root, cwd=tmp_path).stdout
    assert "fast  every 1s  queue q  last " in text and "nightly  cron 0 3 * * * Europe/Paris" in text


@pytest.mark.parametrize(("target", "says"), [
    ("myjobs:empty", "declares no periodic jobs"),
    ("myjobs:not_a_schedule", "is neither a fsjobstore.schedule.Schedule nor a Worker"),
    ("myjobs:nope", "has no 'nope'"),
    ("nomodule:schedule", "cannot import 'nomodule'"),
])
def test_a_scheduler_pointed_at_the_wrong_thing_says_so_in_one_line(tmp_path: Path, target: str, says: str) -> None:
    (tmp_path / "myjobs.py").write_text(SCHEDULE_MODULE)
    root = str(tmp_path / "store")
    cli("init", root, cwd=tmp_path)
    done = cli("scheduler", root, "--schedule", target, "--once", cwd=tmp_path)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_schedule_with_a_bad_job_option_stops_the_scheduler_at_once(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("from fsjobstore import Schedule\nschedule = Schedule()\n"
                                     "schedule.every(60, queue='q', max_attempts=0)\n")
    root = str(tmp_path / "store")
    cli("init", root, cwd=tmp_path)
    done = cli("scheduler", root, "--schedule", "bad:schedule", cwd=tmp_path)
    assert done.returncode == 2 and "max_attempts" in done.stderr and "Traceback" not in done.stderr


def test_cron_without_the_cron_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # as if it were not installed
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'fsjobstore\[cron\]'"):
        Schedule().cron("0 3 * * *")


def test_a_worker_run_by_the_worker_command_brings_its_periodic_jobs(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        from fsjobstore import JobStore, Worker
        worker = Worker(JobStore("own-store"), mode="threads")  # the command runs it on DIR
        worker.handler("reports")(lambda job: "made")
        worker.every(600, queue="reports", name="ten-minutes")
    """))
    root = str(tmp_path / "store")
    JobStore(root, wall_clock=FakeWall(time.time() - 3600)).declare_schedule(
        "ten-minutes", spec="every 600s", queue="reports")
    done = cli("worker", root, "--handlers", "app:worker", "--burst", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "schedule ten-minutes: tick" in done.stderr
    with JobStore(root) as store:
        [info] = store.schedules()
        assert info.last_job is not None and store.get(info.last_job).value == "made"
