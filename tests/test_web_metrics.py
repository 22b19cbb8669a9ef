"""``/metrics`` (and ``fsjobstore worker --metrics-port``): the Prometheus text format, parsed with
prometheus-client's own parser, counting every process's work and surviving their restarts."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from webkit import web_app

from fsjobstore import JobStore

parser = pytest.importorskip("prometheus_client.parser")


def _families(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """{sample name: {labels: value}} of a scrape, through prometheus-client's parser."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _scrape(store: JobStore) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with web_app(store) as api:
        r = api.client.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        return _families(r.text)


HANDLERS = textwrap.dedent("""
    import time

    def work(job):
        if job.request.get("fail"):
            raise ValueError("no")
        time.sleep(job.request.get("sleep", 0))
        return "ok"
""")


def _run_worker(root: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp / "metric_handlers.py").write_text(HANDLERS)
    return subprocess.run([sys.executable, "-m", "fsjobstore", "worker", root, "--handler", "metric_handlers:work",
                           "--queue", "m", "--burst", "--concurrency", "2", *extra], cwd=tmp, capture_output=True,
                          text=True, timeout=120)


def test_metrics_show_jobs_per_state_and_queue_and_the_counters_of_every_process(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root, backoff=lambda a: 0.0) as store:
        for _ in range(5):
            store.create({"sleep": 0.01}, queue="m")
        store.create({"fail": True}, queue="m", max_attempts=1)
        store.create({"n": 1}, queue="idle")
        store.pause("idle")
    done = _run_worker(root, tmp_path)  # another process; it exits before the scrape
    assert done.returncode == 0, done.stderr
    with JobStore(root) as store:
        m = _scrape(store)
    assert m["fsjobstore_jobs"][(("queue", "m"), ("state", "fulfilled"))] == 5
    assert m["fsjobstore_jobs"][(("queue", "m"), ("state", "failed"))] == 1
    assert m["fsjobstore_jobs"][(("queue", "idle"), ("state", "pending"))] == 1
    assert m["fsjobstore_queue_paused"][(("queue", "idle"),)] == 1
    assert m["fsjobstore_oldest_pending_age_seconds"][(("queue", "idle"),)] >= 0
    assert m["fsjobstore_jobs_created_total"][(("queue", "m"),)] == 6
    assert m["fsjobstore_jobs_completed_total"][(("queue", "m"),)] == 5
    assert m["fsjobstore_jobs_failed_total"][(("queue", "m"),)] == 1
    buckets = m["fsjobstore_job_duration_seconds_bucket"]
    ordered = sorted(((float(dict(k)["le"]), v) for k, v in buckets.items() if dict(k)["queue"] == "m"))
    assert [v for _, v in ordered] == sorted(v for _, v in ordered)  # cumulative
    assert ordered[-1] == (float("inf"), 6.0) == (float("inf"), m["fsjobstore_job_duration_seconds_count"][
        (("queue", "m"),)])
    assert m["fsjobstore_workers"][()] == 0


def test_counters_survive_a_restart_of_the_web_process_and_of_the_workers(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        for _ in range(3):
            store.create({}, queue="m")
    assert _run_worker(root, tmp_path).returncode == 0
    with JobStore(root) as store:
        first = _scrape(store)["fsjobstore_jobs_completed_total"][(("queue", "m"),)]
    with JobStore(root) as store:  # the web process again: the same count
        assert _scrape(store)["fsjobstore_jobs_completed_total"][(("queue", "m"),)] == first == 3
        for _ in range(2):
            store.create({}, queue="m")
    assert _run_worker(root, tmp_path).returncode == 0  # a new worker adds to it, never restarts it
    with JobStore(root) as store:
        again = _scrape(store)
        assert again["fsjobstore_jobs_completed_total"][(("queue", "m"),)] == 5
        store.purge()  # removing finished jobs leaves what was counted
        after = _scrape(store)
    assert after["fsjobstore_jobs_completed_total"][(("queue", "m"),)] == 5
    assert after["fsjobstore_jobs"][(("queue", "m"), ("state", "fulfilled"))] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_worker_serves_the_same_metrics_on_its_metrics_port(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        store.create({"sleep": 0.01}, queue="m")
    (tmp_path / "metric_handlers.py").write_text(HANDLERS)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fsjobstore", "worker", root, "--handler", "metric_handlers:work",
                             "--queue", "m", "--metrics-port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                m = _families(text)
                if m["fsjobstore_jobs_completed_total"].get((("queue", "m"),)) == 1:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        m = _families(text)
        assert m["fsjobstore_jobs_completed_total"][(("queue", "m"),)] == 1
        assert m["fsjobstore_workers"][()] == 1
        # Bound to loopback, it answers only this host's names: a page whose name is rebound to
        # 127.0.0.1 says its own name in Host and reads nothing.
        for name, status in (("localhost", 200), ("evil.example", 400)):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics", headers={"Host": f"{name}:{port}"})
            answer = conn.getresponse()
            body = answer.read().decode()
            conn.close()
            assert (answer.status, "fsjobstore_jobs" in body) == (status, status == 200), (name, body)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    with socket.socket() as taken:  # a port in use: one line, exit 2, before any job is taken
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = subprocess.run([sys.executable, "-m", "fsjobstore", "worker", root, "--handler",
                               "metric_handlers:work", "--metrics-port", str(taken.getsockname()[1])],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert busy.returncode == 2 and "--metrics-port" in busy.stderr and "Traceback" not in busy.stderr


def test_the_grafana_dashboard_asks_only_for_metrics_and_labels_the_store_exports(tmp_path: Path) -> None:
    import json
    import re

    dashboard = json.loads((Path(__file__).parent.parent / "examples" / "grafana" / "fsjobstore-dashboard.json")
                           .read_text())
    with JobStore(str(tmp_path / "s")) as store:
        job = store.create({"n": 1}, queue="mail")
        lease = store.pull_work()
        assert lease is not None and lease.id == job.id
        lease.fulfill(b"")
        store.create({"n": 2}, queue="mail")
        exported = _scrape(store)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        names = set(re.findall(r"\bfsjobstore_\w+", expr))
        assert names, expr
        for name in names:
            assert name in exported, f"{name} (in {expr!r}) is not a metric the store exports"
            labels = {k for row in exported[name] for k, _ in row}
            for used in re.findall(r"(\w+)\s*=~?\s*\"", expr) + re.findall(r"by \(([\w, ]+)\)", expr):
                for label in re.split(r",\s*", used):
                    assert label in labels, f"{name} has no label {label!r} ({expr!r})"
    query = dashboard["templating"]["list"][1]["query"]["query"]
    assert re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
