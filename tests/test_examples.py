"""The examples in the README run and do what they say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fsjobstore import JobStore

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_quickstart_runs_producer_workers_and_notifier(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "delivered 20 results" in out.stdout and out.stdout.rstrip().endswith("OK")


def test_the_cron_notifier_delivers_due_notifications_and_keeps_failures(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    good, bad = tmp_path / "good.jsonl", tmp_path / "no-such-dir" / "x.jsonl"
    with JobStore(root) as store:
        job = store.create("x")
        store.queue(job.id, {"file": str(good)})
        store.queue(job.id, {"file": str(bad)})
        store.fulfill(job.id, "42")
    out = subprocess.run([sys.executable, str(EXAMPLES / "cron_notifier.py"), root],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "delivered 1, will retry 1" in out.stdout
    assert json.loads(good.read_text())["value"] == "42"
    with JobStore(root) as store:
        assert store.get(job.id).waiting == ({"file": str(bad)},)
