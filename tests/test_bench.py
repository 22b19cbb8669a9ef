"""The peer benchmark's own machinery: its exactly-once check must be able to say no, and its
fsjobstore workloads must run. (Speed itself is measured by bench/peers.py, never asserted here.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import _adapters
import peers


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
