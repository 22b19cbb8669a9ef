"""The examples in the README run and do what they say."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from fsjobstore import JobStore

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_quickstart_runs_producer_workers_and_notifier(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "delivered 20 results" in out.stdout and out.stdout.rstrip().endswith("OK")


def test_the_readme_python_example_runs_and_prints_the_value(tmp_path: Path) -> None:
    readme = (EXAMPLES.parent / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", readme, re.S)[0]
    (tmp_path / "example.py").write_text(code)
    out = subprocess.run([sys.executable, "example.py"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'width': 640}"


def fsjobstore(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as the examples' docstrings run it: from the examples directory."""
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True,
                          timeout=120, cwd=EXAMPLES)


def test_the_example_worker_module_runs_under_the_cli_with_progress_failures_and_reports(tmp_path: Path) -> None:
    root, data = str(tmp_path / "jobs"), tmp_path / "data.bin"
    data.write_bytes(b"x" * 3_000_000)
    ok = fsjobstore("create", root, json.dumps({"path": str(data)}), "--queue", "digest", "--init").stdout.strip()
    missing = fsjobstore("create", root, json.dumps({"path": str(tmp_path / "nope")}), "--queue", "digest",
                         "--max-attempts", "1").stdout.strip()
    report = fsjobstore("create", root, json.dumps({"paths": [str(data)]}), "--queue", "report").stdout.strip()
    out = fsjobstore("worker", root, "--handlers", "tasks:handlers", "--burst")
    assert out.returncode == 0, out.stderr
    assert f"job {missing} queue=digest attempt=1 failed" in out.stderr and "FileNotFoundError" in out.stderr
    with JobStore(root) as store:
        done = store.get(ok)
        assert done.value["bytes"] == 3_000_000 and len(done.value["hexdigest"]) == 64
        assert done.progress is not None and done.progress.done == done.progress.total == 3_000_000
        assert store.get(missing).state.value == "failed"
        assert store.get(report).value.endswith(f"{data!s}\n") and "3000000" in store.get(report).value


def test_the_cron_notifier_delivers_due_notifications_and_keeps_failures(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    good, bad = tmp_path / "good.jsonl", tmp_path / "no-such-dir" / "x.jsonl"
    made = fsjobstore("create", root, '"x"', "--notify", json.dumps({"file": str(good)}),
                      "--notify", json.dumps({"file": str(bad)}), "--init")
    assert made.returncode == 0, made.stderr
    job_id = made.stdout.strip()
    with JobStore(root) as store:
        store.fulfill(job_id, "42")
    out = fsjobstore("notify", root, "--handler", "cron_notifier:deliver", "--burst")
    assert out.returncode == 0, out.stderr
    assert "delivered 1, will retry 1" in out.stderr
    assert json.loads(good.read_text())["value"] == "42"
    with JobStore(root) as store:
        assert store.get(job_id).waiting == ({"file": str(bad)},)


def _crontab_line(store: str) -> str:
    """The cron recipe's line from cron_notifier.py, with its placeholders pointed at this checkout."""
    doc = (EXAMPLES / "cron_notifier.py").read_text()
    (line,) = re.findall(r"^ *(\*/5 \* \* \* \* .*)$", doc, re.M)
    schedule, command = line[: len("*/5 * * * *")], line[len("*/5 * * * * "):]
    assert schedule == "*/5 * * * *"
    return (command.replace("/path/to/examples", str(EXAMPLES))
            .replace("/path/to/venv/bin", sysconfig.get_path("scripts"))
            .replace("/var/lib/myapp/jobs", store))


def test_the_cron_recipe_runs_with_crons_path_and_prints_nothing_when_idle_or_all_delivered(tmp_path: Path) -> None:
    # As cron runs it: sh -c, from the home directory, with cron's PATH (no virtualenv on it).
    root, out_file = str(tmp_path / "s"), tmp_path / "out.jsonl"
    JobStore(root).close()
    cron = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHELL": "/bin/sh"}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/sh", "-c", _crontab_line(root)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=cron)

    idle = run()
    assert (idle.returncode, idle.stdout, idle.stderr) == (0, "", "")  # cron mails any output
    with JobStore(root) as store:
        job = store.create("x")
        store.queue(job.id, {"file": str(out_file)})
        store.fulfill(job.id, "42")
    delivered = run()
    assert (delivered.returncode, delivered.stdout, delivered.stderr) == (0, "", "")
    assert json.loads(out_file.read_text())["value"] == "42"


def test_the_cron_recipe_still_prints_a_failed_delivery_so_cron_mails_it(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        job = store.create("x")
        store.queue(job.id, {"file": str(tmp_path / "no-such-dir" / "x.jsonl")})
        store.fulfill(job.id, "42")
    out = subprocess.run(["/bin/sh", "-c", _crontab_line(root)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert job.id in out.stderr and "FileNotFoundError" in out.stderr
