"""The peer benchmark's own machinery: its exactly-once check must be able to say no, and its
fsjobstore workloads must run. (Speed itself is measured by bench/peers.py, never asserted here.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import _adapters
import _runtime_cells
import peers
import steps

from fsjobstore import JobContext, JobStore

ROOT = Path(__file__).resolve().parent.parent


class _HandsOutEverythingTwice(_adapters.Adapter):
    """Every worker process believes it took every item: duplicates the check must count."""

    name = "twice"

    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        self._left = list(range(100))

    def put(self, i: int) -> None:
        pass

    def take(self) -> int | None:
        return self._left.pop() if self._left else None


class _LosesOddItems(_HandsOutEverythingTwice):
    def __init__(self, path: str, durable: bool) -> None:
        super().__init__(path, durable)
        self._left = list(range(0, 100, 2))


def test_the_drain_check_counts_duplicates(tmp_path: Path) -> None:
    _, dups, lost, errors = peers.w2_drain(_HandsOutEverythingTwice, str(tmp_path / "q"), 100, 2, False)
    assert (dups, lost, errors) == (100, 0, 0)


def test_the_drain_check_counts_losses(tmp_path: Path) -> None:
    _, dups, lost, _ = peers.w2_drain(_LosesOddItems, str(tmp_path / "q"), 100, 1, False)
    assert (dups, lost) == (0, 50)


def test_fsjobstore_drains_exactly_once_under_the_bench(tmp_path: Path) -> None:
    rate, dups, lost, errors = peers.w2_drain(_adapters.FsJobStore, str(tmp_path / "q"), 300, 2, True)
    assert (dups, lost, errors) == (0, 0, 0) and rate > 0


def test_the_wakeup_workload_returns_ordered_latencies(tmp_path: Path) -> None:
    p50, p99, worst, cpu, after = peers.w3_wakeup(_adapters.FsJobStore, str(tmp_path / "q"), 20, False, 0.005, 0.2)
    assert 0 < p50 <= p99 <= worst and cpu >= 0
    assert 0 < after < p50  # from the put's return is later than from just before it


def test_the_depth_and_memory_workloads_run(tmp_path: Path) -> None:
    assert peers.w5_depth(_adapters.FsJobStore, str(tmp_path / "a"), 50, 20) > 0
    small, big = peers.w6_memory(_adapters.FsJobStore, str(tmp_path / "b"), 10, 60)
    assert small > 0 and big > 0


def test_the_floor_moves_every_job_file_once_into_done(tmp_path: Path) -> None:
    base = tmp_path / "floor"
    rate = peers._raw.drain_floor(str(base), 40, 2, durable=True)
    assert rate > 0
    counts = [len(os.listdir(base / d)) for d in ("pending", "active", "done")]
    assert counts == [0, 0, 40]
    assert all((base / "done" / name).read_bytes().endswith(b'{"result":"fulfilled"}\n')
               for name in os.listdir(base / "done"))


def test_a_target_above_the_floor_is_reported_out_of_reach() -> None:
    figures = {"W2-drain": {("fsjobstore", 1): 10_000.0, ("dirq", 1): 30_000.0},
               "W2-floor": {1: 33_000.0}}
    text = peers.verdicts(figures, {"fsjobstore": _adapters.FsJobStore, "dirq": _adapters.Dirq}, (100,), (1, 2))
    assert "- [ ] W2 drain, 1 worker(s)" in text and "is above the floor: out of reach" in text
    figures["W2-floor"] = {1: 50_000.0}  # 1/36,000 s - 1/50,000 s = 7.8 us to spare
    text = peers.verdicts(figures, {"fsjobstore": _adapters.FsJobStore, "dirq": _adapters.Dirq}, (100,), (1, 2))
    assert "leaves 7.8 us of CPU per job" in text and "out of reach" not in text


def test_rotation_runs_each_queue_once_per_round_and_changes_who_goes_first(tmp_path: Path) -> None:
    order: list[tuple[str, str]] = []
    fns = {k: (lambda d, k=k: order.append((k, d)) or len(order)) for k in ("a", "b", "c")}
    results = peers.Runner(str(tmp_path), 3).rotate(fns)
    assert [k for k, _ in order] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert results == {"a": [1, 6, 8], "b": [2, 4, 9], "c": [3, 5, 7]}
    assert len({d for _, d in order}) == 9 and os.listdir(tmp_path) == []  # fresh directories, removed


# -- W7/W8: the worker runtime's cells ----------------------------------------------------------
def test_the_runtime_cell_drains_exactly_once_in_both_modes(tmp_path: Path) -> None:
    for mode in ("processes", "threads"):
        cell = _runtime_cells.runtime_drain(str(tmp_path / mode), 60, 2, mode, False)
        assert (cell.dups, cell.lost, cell.left) == (0, 0, 0) and cell.seconds > 0


def test_the_runtime_check_catches_a_planted_duplicate(tmp_path: Path) -> None:
    path = str(tmp_path / "q")

    def enqueue_job_7_again(ctx: JobContext) -> bytes:
        if ctx.request["i"] == 7 and ctx.request.get("again") is None:
            with JobStore(path) as store:  # a second job for item 7: the handler will run it too
                store.create({"i": 7, "again": True})
        return _runtime_cells.empty(ctx)

    cell = _runtime_cells.runtime_drain(path, 40, 2, "processes", False, enqueue_job_7_again)
    assert (cell.dups, cell.lost, cell.left) == (1, 0, 0)


def test_the_runtime_check_catches_planted_losses(tmp_path: Path) -> None:
    def fail_odd_jobs(ctx: JobContext) -> bytes:
        _runtime_cells.mark(ctx)
        if ctx.request["i"] % 2:
            raise RuntimeError("planted")  # retried after a backoff: still scheduled when the burst ends
        return b""

    cell = _runtime_cells.runtime_drain(str(tmp_path / "q"), 40, 2, "threads", False, fail_odd_jobs)
    assert (cell.dups, cell.lost, cell.left) == (0, 20, 20)


def test_the_runtime_check_counts_a_duplicate_the_counters_missed() -> None:
    # Two runs of job 2 raced on its counter (both wrote 1); the worker still counted 5 attempts.
    assert _runtime_cells.exactly_once(bytes([1, 1, 1, 1]), 5, 4, 0) == (1, 0, 0)
    assert _runtime_cells.exactly_once(bytes([1, 0, 2, 1]), 4, 4, 0) == (1, 1, 0)


def test_the_w8_verdict_says_met_and_not_met_from_the_figures() -> None:
    fsj = {"fsjobstore": _adapters.FsJobStore}
    w8 = {("fsjobstore Worker (processes)", 4): (3_000.0, 0, 0, 0),
          ("fsjobstore Worker (threads)", 2): (2_500.0, 0, 0, 0),
          ("huey-sqlite", 2): (5_000.0, 0, 0, 0), ("diskcache", 1): (4_000.0, 0, 0, 0),
          ("diskcache", 8): (9_000.0, 0, 3, 0)}  # lost jobs: does not count as the best
    text = peers.verdicts({"W8": w8}, fsj, (100,), (1, 2))
    assert ("- [ ] W8 fsjobstore worker best: 3,000 jobs/s (processes, 4) vs best durable peer: 5,000 jobs/s "
            "(huey-sqlite, 2): not met") in text
    w8[("fsjobstore Worker (threads)", 16)] = (5_500.0, 0, 0, 0)
    text = peers.verdicts({"W8": w8}, fsj, (100,), (1, 2))
    assert ("- [x] W8 fsjobstore worker best: 5,500 jobs/s (threads, 16) vs best durable peer: 5,000 jobs/s "
            "(huey-sqlite, 2): met") in text


def test_the_w7_verdict_holds_the_rate_per_job_to_80_percent_of_the_bare_loop() -> None:
    rate = _runtime_cells.RuntimeRate
    figures = {"W7-bare": {1: 10_000.0, 2: 10_000.0},
               "W7-runtime": {("processes", 1): rate(7_000.0, 8_500.0, 0.1, 0, 0, 0),
                              ("processes", 2): rate(7_000.0, 7_900.0, 0.1, 0, 0, 0),
                              ("threads", 1): rate(8_000.0, 9_000.0, 0.01, 1, 0, 0)}}
    text = peers.verdicts(figures, {"fsjobstore": _adapters.FsJobStore}, (100,), (1, 2))
    assert "- [x] W7 Worker (processes), 1 worker(s): 8,500 jobs/s per job = 85% of the bare loop's" in text
    assert "- [ ] W7 Worker (processes), 2 worker(s): 7,900 jobs/s per job = 79%" in text
    assert "- [ ] W7 Worker (threads), 1 worker(s): 9,000 jobs/s per job = 90%" in text  # but a duplicate
    assert "1 duplicates, 0 losses, 0 left" in text


def test_the_w8_cpu_breakdown_and_the_threads_bare_loop_run(tmp_path: Path) -> None:
    import subprocess

    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "w8_cpu.py")
    done = subprocess.run([sys.executable, bench, "--jobs", "40", "--workers", "1,2", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.endswith("0 duplicates, 0 lost") for line in lines)
    assert os.listdir(tmp_path) == []  # its scratch is removed
    rate, dups, lost, _ = _runtime_cells.bare_threads_drain(str(tmp_path / "t"), 60, 3)
    assert rate > 0 and (dups, lost) == (0, 0)


def test_the_w8_references_are_shown_but_never_count_as_ours_or_as_a_peer() -> None:
    class Canned:
        repeat = 1

        def rotate(self, fns: dict[Any, Any]) -> dict[Any, list[Any]]:
            out: dict[Any, list[Any]] = {}
            for key in fns:
                if key == _runtime_cells.W8_FLOOR:
                    out[key] = [(90_000.0, 0, 0, 0)]
                elif key == _runtime_cells.W8_NO_FSYNC:
                    out[key] = [_runtime_cells.Drained(100 / 80_000, 0, 0, 0)]  # 80,000 jobs/s
                elif key.startswith("fsjobstore"):
                    out[key] = [_runtime_cells.Drained(100 / 2_000, 0, 0, 0)]
                else:
                    out[key] = [(3_000.0, 0, 0, 0)]
            return out

    figures: dict[str, Any] = {}
    text = _runtime_cells.w8(Canned(), 100, {"huey-sqlite": _adapters.HueySqlite}, peers.w2_drain, figures)
    assert "| reference: floor, bare syscalls with fsync " in text and "90,000" in text
    assert all(not k[0].startswith("reference") for k in figures["W8"])
    verdict = peers.verdicts(figures, {"fsjobstore": _adapters.FsJobStore}, (100,), (1, 2))
    assert "W8 fsjobstore worker best: 2,000 jobs/s" in verdict and "peer: 3,000 jobs/s (huey-sqlite" in verdict


def test_the_w8_ceiling_script_drains_each_layout_exactly_once_in_both_variants(tmp_path: Path) -> None:
    import subprocess

    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "w8_ceiling.py")
    # --no-peer: the tests install fsjobstore[test], not the peers of fsjobstore[bench]
    done = subprocess.run([sys.executable, bench, "--jobs", "30", "--rounds", "1", "--no-peer", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cells = [line for line in done.stdout.splitlines() if line.startswith("  ")]
    assert len(cells) == 2 * 6 and all(line.endswith("(0/0)") for line in cells)
    assert sum("no directory fsync" in line for line in cells) == 6
    assert done.stdout.count("best of ") == 2
    assert os.listdir(tmp_path) == []


def test_the_lean_sketch_drains_every_job_in_each_of_its_variants(tmp_path: Path) -> None:
    import _lean_sketch

    for k, (shared, strict) in enumerate([(False, False), (True, False), (False, True), (True, True)]):
        # drain() raises unless every job ends in fulfilled/; with shared names, claims race
        assert _lean_sketch.drain(str(tmp_path / str(k)), 40, 3, shared=shared, strict=strict) > 0


def test_the_claim_order_bench_finds_one_claimer_exactly_in_order(tmp_path: Path) -> None:
    import claim_order

    rate, median, p99, worst = claim_order.measure(60, 1, str(tmp_path))
    assert rate > 0 and (median, p99, worst) == (0, 0, 0)
    _, _, _, worst = claim_order.measure(60, 3, str(tmp_path))  # several: roughly, and every job once
    assert worst >= 0


def test_the_hooks_benchmark_runs_and_checks_every_hook_call(tmp_path: Path) -> None:
    import subprocess

    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "hooks.py")
    done = subprocess.run([sys.executable, bench, "--jobs", "30", "--rounds", "1", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["threads", "processes"] and "ratio" in lines[1]
    assert os.listdir(tmp_path) == []  # its scratch is removed


def test_the_web_benchmark_runs_with_quick_sizes(tmp_path: Path) -> None:
    import subprocess

    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "web.py")
    done = subprocess.run([sys.executable, bench, "--quick", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.split("summary (", 1)[1].splitlines()
    assert [line.split()[0] for line in summary[1:6]] == ["overview", "jobs", "jobs", "jobs", "api"]
    assert summary[6].startswith("  creates: API ") and "ratio" in summary[6]
    assert os.listdir(tmp_path) == []  # its store, servers' output and scratch are removed


def test_the_relations_benchmark_runs_with_quick_sizes(tmp_path: Path) -> None:
    import subprocess

    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "relations.py")
    done = subprocess.run([sys.executable, bench, "--quick", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["unique", "unique", "keyed", "chain", "fan-out", "group"]
    assert all("ratio" in lines[i] for i in (1, 3, 4, 5, 6)) and "answers/s" in lines[2]
    assert os.listdir(tmp_path) == []  # its stores and scratch are removed


def test_the_step_tracer_sees_each_step_of_a_plain_job_enter_the_package_in_order(tmp_path: Path) -> None:
    measured = steps.measure(str(tmp_path / "store"))
    assert list(measured) == ["create", "pull_work", "lease.fulfill", "queue+pull_notification", "done"]
    for name, trace in measured.items():
        assert trace.modules[0] in ("_store._jobstore", "_transitions._leases"), (name, trace.modules)
        assert all((Path(steps.PACKAGE) / (m.replace(".", "/") + ".py")).is_file() for m in trace.modules)
        assert len(trace.crossings) >= len(trace.modules) - 1
    assert "_transitions._create" in measured["create"].modules
    assert "_transitions._work" in measured["pull_work"].modules


def test_the_step_tracer_counts_a_module_entered_twice_once() -> None:
    def step() -> None:
        from fsjobstore._format import _layout, _values
        _values.check_job_id("a")
        _layout.micros(1.0)
        _values.check_job_id("b")

    trace = steps.trace(step)
    assert trace.modules == ["_format._values", "_format._layout"]
    assert trace.returns == 0  # entered from outside the package each time: no module was left for another


def _bench(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-P", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_long_drain_drains_every_job_once_and_prints_a_rate_per_stretch(tmp_path: Path) -> None:
    out = _bench(str(ROOT / "bench" / "long_drain.py"), "--jobs", "2000", "--every", "500", "--dir", str(tmp_path),
                 cwd=tmp_path)
    assert "2,000 of 2,000 jobs drained" in out and out.count(" jobs/s") == 4 and "against the first" in out
    assert os.listdir(tmp_path) == []  # its store is removed


def test_the_cold_count_counts_a_store_it_made_and_removes_it(tmp_path: Path) -> None:
    out = _bench(str(ROOT / "bench" / "cold_count.py"), "--size", "3000", "--claims", "100", "--creates", "50",
                 "--rounds", "2", "--settle", "0", cwd=tmp_path)
    # Each round claims 100 and creates 50.
    assert "round 1" in out and "2,950 pending" in out and "round 2" in out and "2,900 pending" in out
    assert os.listdir(tmp_path) == []


def test_the_index_entry_bench_runs_the_three_ways(tmp_path: Path) -> None:
    out = _bench(str(ROOT / "bench" / "index_entry.py"), "--jobs", "200", "--batches", "2", "--rounds", "1",
                 "--dir", str(tmp_path), cwd=tmp_path)
    assert "entry a link" in out and "(mknod)" in out and "no entry" in out and "append alone" in out
    assert os.listdir(tmp_path) == []


def test_the_step_cost_bench_takes_each_step_out_in_turn(tmp_path: Path) -> None:
    out = _bench(str(ROOT / "bench" / "step_cost.py"), "--jobs", "200", "--rounds", "1", "--dir", str(tmp_path),
                 cwd=tmp_path)
    for label in ("as is", "without entry", "without count", "without questions", "without all"):
        assert label in out, label
    assert os.listdir(tmp_path) == []


def test_a_quick_peers_run_writes_its_figures_as_json_and_the_charts_are_drawn_from_them(tmp_path: Path) -> None:
    import json

    # fsjobstore alone: the peers' packages are the bench extra's, which the suite does not install.
    _bench(str(ROOT / "bench" / "peers.py"), "--quick", "--workloads", "W1,W2", "--peers", "fsjobstore",
           "--dir", str(tmp_path / "run"), "--json", str(tmp_path / "run.json"), cwd=tmp_path)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["run"]["jobs"] == 1000 and doc["run"]["workloads"] == ["W1", "W2"]
    drain = doc["figures"]["W2-drain"]
    assert set(drain) == {"fsjobstore/1", "fsjobstore/2", "fsjobstore/4"}
    assert all(rate > 0 for rate in drain.values())
    out = _bench(str(ROOT / "bench" / "charts.py"), str(tmp_path / "run.json"), str(tmp_path / "charts"),
                 cwd=tmp_path)
    assert sorted(os.listdir(tmp_path / "charts")) == ["charts.md", "create.svg", "w2-drain.svg"]
    svg = (tmp_path / "charts" / "w2-drain.svg").read_text()
    assert svg.count("<rect x=") == 3 + 1  # a bar per worker count, and the legend's mark
    assert f"fsjobstore, 4 workers: {drain['fsjobstore/4']:,.0f} jobs/s" in svg
    assert "python bench/peers.py --quick" in (tmp_path / "charts" / "charts.md").read_text()
    assert "w2-drain.svg" in out


def test_the_celery_benchmark_runs_each_transport_and_runs_every_task_once(tmp_path: Path) -> None:
    import json

    # Redis left out: its server is not among the suite's dependencies.
    out = _bench(str(ROOT / "bench" / "celery_peers.py"), "--quick", "--transports", "fsjobstore,filesystem",
                 "--dir", str(tmp_path / "run"), "--json", str(tmp_path / "run.json"), cwd=tmp_path)
    cells = json.loads((tmp_path / "run.json").read_text())["cells"]
    assert set(cells) == {"fsjobstore", "filesystem"}
    assert all((c["duplicates"], c["lost"]) == (0, 0) and c["rate"] > 0 for cs in cells.values() for c in cs), cells
    assert cells["fsjobstore"][0]["p50_ms"] > 0 and "p50_ms" not in cells["filesystem"][0]
    assert "| fsjobstore " in out and os.listdir(tmp_path / "run") == []  # the table, and no cell left
