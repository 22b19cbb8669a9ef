"""A real process killed (os._exit) at every filesystem call of every public operation.

The sweep itself lives in crashpoints.py (it forks, so it runs in a fresh interpreter with no
pytest threads around); these tests run it and judge its report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_sweep(*args: str) -> list[dict[str, object]]:
    out = subprocess.run([sys.executable, os.path.join(HERE, "crashpoints.py"), *args], capture_output=True,
                         text=True, timeout=600, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("mode", ["--durable", "--fast"])
def test_a_crash_at_any_call_of_any_operation_loses_no_acknowledged_job(mode: str) -> None:
    reports = run_sweep(mode)
    assert len(reports) == 21  # every scenario of crashpoints.py: retention, remove_job, buckets and a retry included
    for report in reports:
        assert report["problems"] == [], report
        assert isinstance(report["crash_points"], int) and report["crash_points"] > 0, report


def test_the_crash_sweep_reports_a_planted_loss() -> None:
    (report,) = run_sweep("create_losing_selftest")
    assert any("is lost" in p for p in report["problems"]), report  # type: ignore[union-attr]
