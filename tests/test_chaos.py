"""The chaos torture run, short: workers killed and stopped while jobs flow (torture/chaos.py
is the long version, and documents the checker)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "torture"))

import chaos

from fsjobstore import JobStore

pytestmark = pytest.mark.slow


def test_a_short_chaos_run_loses_nothing_and_commits_nothing_twice(tmp_path: Path) -> None:
    jobs = 700
    report = chaos.run(jobs=jobs, workers=3, kills=70, lease=1.0, seed=3, workdir=str(tmp_path))
    assert report["kills"] >= 70 and report["stops"] > 0
    assert report["created_ok"] == jobs
    assert (report["lost"], report["unexpected"], report["duplicate_commits"]) == (0, 0, 0), report
    assert report["left_pending_or_active"] == 0 and report["failed"] == 0
    assert report["fulfilled"] == jobs


@pytest.mark.parametrize("runtime", ["processes", "threads", "asyncio"])
def test_a_short_chaos_run_through_the_worker_runtime_loses_nothing(tmp_path: Path, runtime: str) -> None:
    # Threads and asyncio workers take longer to drain after a kill than forked children; fewer kills
    # keep the three under a minute together (the long runs are in PERFORMANCE.md and RELIABILITY.md).
    kills = 30 if runtime == "processes" else 15
    report = chaos.run(jobs=300, workers=3, kills=kills, lease=1.0, seed=5, workdir=str(tmp_path), runtime=runtime)
    assert report["kills"] >= kills and report["created_ok"] == 300
    assert (report["lost"], report["unexpected"], report["duplicate_commits"]) == (0, 0, 0), report
    assert report["left_pending_or_active"] == 0 and report["fulfilled"] == 300


def test_a_short_chaos_run_with_retention_removing_jobs_loses_nothing_and_leaves_no_half_removal(
        tmp_path: Path) -> None:
    # Half the jobs are retain=0: the workers' retention threads remove them while workers die.
    report = chaos.run(jobs=300, workers=3, kills=30, lease=1.0, seed=9, workdir=str(tmp_path),
                       runtime="processes", retention=True)
    assert report["kills"] >= 30 and report["created_ok"] == 300
    assert (report["lost"], report["unexpected"], report["duplicate_commits"]) == (0, 0, 0), report
    assert report["removal_leftovers"] == 0 and report["left_pending_or_active"] == 0, report
    assert report["removed_by_retention"] > 0
    assert report["fulfilled"] + report["removed_by_retention"] == 300


def test_the_chaos_checker_counts_a_removed_job_that_was_never_fulfilled_as_lost(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    with JobStore(root) as store:
        done = store.create({"n": 1}, retain=0)
        never = store.create({"n": 3}, retain=0)
        lease = store.pull_work()
        assert lease is not None and lease.id == done.id
        lease.fulfill(b"x")
        store.purge(states=["pending"])  # removes `never`, which no worker ever fulfilled
        store.recover()
    history = [["1", "1", "invoke", "create", "1"], ["2", "1", "ok", "create", "1", done.id],
               ["3", "1", "invoke", "create", "3"], ["4", "1", "ok", "create", "3", never.id],
               ["5", "1", "invoke", "fulfill", "1", done.id, "t"]]
    report = chaos.check(root, history, retention=True)
    assert (report["lost"], report["removed_by_retention"]) == (1, 1), report
    assert report["examples"]["lost"] == [never.id]


def test_the_chaos_checker_reports_lost_unexpected_and_duplicate_jobs(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    with JobStore(root) as store:
        a = store.create({"n": 0}).id
        b = store.create({"n": 1}).id
        store.create({"n": 99})  # fulfilled below, but its create was never invoked
        while (lease := store.pull_work()) is not None:
            lease.fulfill(b"x")
    history = [
        ["1", "1", "invoke", "create", "0"], ["2", "1", "ok", "create", "0", a],
        ["3", "1", "invoke", "create", "1"], ["4", "1", "ok", "create", "1", b],
        ["5", "1", "invoke", "create", "2"], ["6", "1", "ok", "create", "2", "never-made"],
        ["7", "2", "ok", "fulfill", "0", a, "token-one"], ["8", "3", "ok", "fulfill", "0", a, "token-two"],
    ]
    report = chaos.check(root, history)
    assert report["lost"] == 1  # "never-made" was acknowledged and is nowhere
    assert report["unexpected"] == 1  # n=99
    assert report["duplicate_commits"] == 2  # a: two ok fulfils, and its value is neither token
    assert report["fulfilled"] == 3


def test_a_short_chaos_run_with_unique_and_concurrency_keys_and_dependencies_loses_nothing_and_runs_no_child_early(
        tmp_path: Path) -> None:
    report = chaos.run(jobs=300, workers=3, kills=30, lease=1.0, seed=11, workdir=str(tmp_path), relations=True,
                       limits=True)
    assert report["kills"] >= 30 and report["created_ok"] >= 300
    assert (report["lost"], report["unexpected"], report["duplicate_commits"]) == (0, 0, 0), report
    assert report["early_children"] == 0 and report["left_pending_or_active"] == 0, report
    assert report["over_limit"] == 0, report
    assert report["fulfilled"] == report["created_ok"], report


def _overlapping_ck1_runs(second_ends: str) -> list[list[str]]:
    """Two jobs of ``ck-1`` (limit 1: jobs 5 and 13) claimed by two processes whose runs overlap;
    the second's fulfil ends as ``second_ends`` says ("ok", "lost", "storage")."""
    assert chaos.concurrency_key(5) == chaos.concurrency_key(13) == "ck-1" and chaos.LIMITS["ck-1"] == 1
    history = [["100", "1", "ok", "claim", "5", "j5", "t5"], ["110", "2", "ok", "claim", "13", "j13", "t13"],
               ["120", "1", "invoke", "fulfill", "5", "j5", "t5"], ["121", "1", "ok", "fulfill", "5", "j5", "t5"],
               ["130", "2", "invoke", "fulfill", "13", "j13", "t13"]]
    if second_ends == "ok":
        history.append(["131", "2", "ok", "fulfill", "13", "j13", "t13"])
    elif second_ends == "lost":
        history.append(["131", "2", "fail", "fulfill", "13", "j13", "t13", "taken-over"])
    else:
        history.append(["131", "2", "fail", "fulfill", "13", "j13", "t13", "storage-107"])
    return history


def test_the_chaos_checker_counts_two_runs_of_a_one_at_a_time_key_as_one_over_and_names_them() -> None:
    over, seen = chaos._over_limit(_overlapping_ck1_runs("ok"), committed={"t5", "t13"})
    assert over == 1 and [s.split(",")[0] for s in seen] == ["job 13", "job 5"], seen


def test_the_chaos_checker_passes_over_a_run_whose_commit_was_refused_or_failed_with_its_mount() -> None:
    # An expired holder's slot goes to another job on a store that does not trust locks: by design.
    assert chaos._over_limit(_overlapping_ck1_runs("lost"), committed={"t5"})[0] == 0
    assert chaos._over_limit(_overlapping_ck1_runs("storage"), committed={"t5"})[0] == 0


def test_the_chaos_checker_counts_a_run_whose_commit_stood_though_its_mount_failed_under_it() -> None:
    assert chaos._over_limit(_overlapping_ck1_runs("storage"), committed={"t5", "t13"})[0] == 1


def test_the_chaos_checker_frees_the_slot_of_a_run_whose_job_was_taken_over_though_it_never_said_how_it_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # t5 is stopped past its lease; the store takes job 5 over (t5b) while job 13 holds the key's
    # other slot; t5 wakes, calls fulfil and is killed before it can record the refusal.
    history = [["100", "1", "ok", "claim", "5", "j5", "t5"], ["110", "2", "ok", "claim", "13", "j13", "t13"],
               ["120", "3", "ok", "claim", "5", "j5", "t5b"], ["125", "1", "invoke", "fulfill", "5", "j5", "t5"],
               ["130", "3", "invoke", "fulfill", "5", "j5", "t5b"], ["131", "3", "ok", "fulfill", "5", "j5", "t5b"],
               ["140", "2", "invoke", "fulfill", "13", "j13", "t13"], ["141", "2", "ok", "fulfill", "13", "j13", "t13"]]
    monkeypatch.setitem(chaos.LIMITS, "ck-1", 2)
    assert chaos._over_limit(history, committed={"t5b", "t13"})[0] == 0
    # Had t5's commit stood, the store let three jobs of a two-slot key run at once.
    over, seen = chaos._over_limit(history, committed={"t5", "t5b", "t13"})
    assert over == 1 and len(seen) == 3, seen
