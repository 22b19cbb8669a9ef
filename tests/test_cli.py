"""The command line, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True, timeout=60)


def test_create_get_fulfill_and_stats_from_the_shell(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    made = cli("create", root, '{"n": 1}', "--queue", "q", "--priority", "-2")
    assert made.returncode == 0, made.stderr
    job_id = made.stdout.strip()
    assert cli("queue", root, job_id, '"http://x"').returncode == 0
    assert cli("fulfill", root, job_id, "done").returncode == 0
    got = json.loads(cli("get", root, job_id).stdout)
    assert (got["state"], got["value"], got["priority"], got["waiting"]) == ("fulfilled", "done", -2, ["http://x"])
    stats = json.loads(cli("stats", root).stdout)
    assert stats["fulfilled"] == 1 and stats["notifications"] == 1
    assert json.loads(cli("recover", root).stdout)["requeued"] == 0


def test_errors_are_one_line_and_exit_nonzero(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    missing = cli("get", root, "nope")
    assert missing.returncode == 1 and "JobNotFound" in missing.stderr
    bad = cli("create", root, "{not json")
    assert bad.returncode != 0 and "not JSON" in bad.stderr
