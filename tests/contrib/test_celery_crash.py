"""A real ``celery worker`` on the fsjobstore transport, SIGKILLed while it runs ``acks_late`` tasks,
loses none of them: tests/torture/celery_crash.py in a short form (its docstring says how it works;
run it by hand for the long form). The script is run in a process of its own, as is each worker it
starts; whatever happens here, no worker is left running.

The check can say no: the same run on kombu's own ``filesystem://`` transport, which drops what a
killed worker had taken, must report lost tasks.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent.parent / "torture" / "celery_crash.py"
WORKER_PGID = "worker-groups.txt"  # as the script names it


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def crash_run(tmp_path: Path, *args: str, timeout: float = 150.0) -> dict[str, Any]:
    """Run the script; its JSON summary. The script and every worker group it started are killed
    on the way out, whatever happened (a worker runs in a session of its own)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--dir", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            # SIGTERM first: the script then kills its worker itself; SIGKILL if it does not end.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
        with contextlib.suppress(FileNotFoundError):
            for line in (run_dir / WORKER_PGID).read_text().split():
                _kill_group(int(line))
    lines = out.decode().strip().splitlines()
    assert lines, f"no summary; exit {proc.returncode}; stderr:\n{err.decode()[-4000:]}"
    summary: dict[str, Any] = json.loads(lines[-1])
    summary["exit"] = proc.returncode
    return summary


def test_a_celery_worker_killed_mid_run_loses_no_acks_late_task(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    summary = crash_run(tmp_path, "--transport", "fsjobstore", "--tasks", "300", "--kills", "3",
                        "--seed", str(seed), "--idle-timeout", "30")
    assert summary["kills"] >= 1, json.dumps(summary)  # else the worker was never killed while it ran
    assert (summary["lost"], summary["unexpected"], summary["results_missing"]) == (0, 0, 0), json.dumps(summary)
    assert summary["recorded"] == 300 and summary["exit"] == 0, json.dumps(summary)


def test_the_crash_check_reports_the_tasks_kombus_filesystem_transport_loses(tmp_path: Path) -> None:
    summary = crash_run(tmp_path, "--transport", "filesystem", "--tasks", "300", "--kills", "3",
                        "--seed", str(random.randrange(2**32)), "--idle-timeout", "5")
    assert summary["kills"] >= 1, json.dumps(summary)
    assert summary["lost"] > 0 and summary["recorded"] + summary["lost"] == 300, json.dumps(summary)
    assert summary["exit"] == 1, json.dumps(summary)  # losses fail the run unless --expect-loss says they are expected
