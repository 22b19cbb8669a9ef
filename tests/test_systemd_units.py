"""The systemd units of examples/systemd/: systemd-analyze verify accepts each, and each one's
command line, run as the unit runs it (its user's environment, directory and FSJOBSTORE_DIR),
starts, serves, and stops cleanly on the unit's stop signal within its TimeoutStopSec."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "examples" / "systemd"
APP = "/opt/myapp"
FSJOBSTORE = f"{APP}/venv/bin/fsjobstore"


def _unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    unit.read(UNITS / name)
    return unit


def _here(text: str, app: Path) -> str:
    """A unit's paths made this machine's: the app directory, and the fsjobstore this suite runs."""
    return text.replace(FSJOBSTORE, shutil.which("fsjobstore", path=os.path.dirname(sys.executable)) or "fsjobstore") \
        .replace(APP, str(app))


def test_every_example_unit_is_one_systemd_accepts(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    for unit in UNITS.iterdir():
        (tmp_path / unit.name).write_text(_here(unit.read_text(), tmp_path))
    done = subprocess.run([analyze, "verify", *sorted(str(p) for p in tmp_path.iterdir())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "fsjobstore" not in done.stderr, done.stderr
    assert {p.suffix for p in UNITS.iterdir()} == {".service", ".timer"}
    timer = _unit("fsjobstore-notifier.timer")
    assert (UNITS / timer["Timer"]["Unit"]).is_file()


def _app(tmp_path: Path) -> Path:
    """The app directory the units name: a tasks module, a deliver function and a schedule."""
    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(ROOT / "examples" / "tasks.py", app / "tasks.py")
    shutil.copy(ROOT / "examples" / "cron_notifier.py", app / "notify.py")
    (app / "periodic.py").write_text("from datetime import timedelta\n\nfrom fsjobstore import Schedule\n\n"
                                     "schedule = Schedule()\n"
                                     "schedule.every(timedelta(minutes=5), queue='digest', name='digest')\n")
    return app


@pytest.mark.parametrize("name", ["fsjobstore-worker.service", "fsjobstore-notifier.service",
                                  "fsjobstore-scheduler.service", "fsjobstore-web.service",
                                  "fsjobstore-notifier-burst.service"])
def test_each_units_command_runs_and_stops_on_its_stop_signal_in_time(tmp_path: Path, name: str) -> None:
    if name == "fsjobstore-web.service":
        pytest.importorskip("fastapi")
    service = _unit(name)["Service"]
    app = _app(tmp_path)
    store = tmp_path / "jobs"
    subprocess.run([sys.executable, "-m", "fsjobstore", "init", str(store)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSJOBSTORE")}
    for line in service.get("Environment", "").splitlines():
        key, _, value = line.strip().partition("=")
        env[key] = str(store) if key == "FSJOBSTORE_DIR" else value
    argv = shlex.split(_here(service["ExecStart"], app))
    if name == "fsjobstore-web.service":
        argv[argv.index("--port") + 1] = "0"  # any free port: the suite runs in parallel
    cwd = _here(service.get("WorkingDirectory", str(tmp_path)), app)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if service.get("Type") == "oneshot":
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        return
    time.sleep(2.0)  # it parsed its options, opened the store and is serving
    assert proc.poll() is None, proc.communicate()[0]
    proc.send_signal(getattr(signal, service.get("KillSignal", "SIGTERM")))
    stop = float(service.get("TimeoutStopSec", "90"))
    started = time.monotonic()
    out, _ = proc.communicate(timeout=stop)
    assert proc.returncode == 0, out
    assert time.monotonic() - started < stop
