"""Counters every process adds to (``JobStore.count``, ``counters()``; FORMAT.md, "Counters"), and
the per-queue counts of ``statistics()``: what ``/metrics`` and the dashboard are built on."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fsjobstore import InvalidQueueName, InvalidRequest, JobStore, Worker
from fsjobstore._core._counters import BOUNDS, FOLD_AT, TOTAL_RE, fold

METRICS = ("control", "metrics")


def _metrics_dir(root: str) -> str:
    return os.path.join(root, *METRICS)


def test_counts_made_by_several_processes_add_up_and_outlive_them(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    JobStore(root).close()
    script = textwrap.dedent("""
        import sys
        from fsjobstore import JobStore
        with JobStore(sys.argv[1]) as store:
            for i in range(int(sys.argv[2])):
                store.create({"i": i}, queue=sys.argv[3])
            store.count(sys.argv[3], "fulfilled", 0.02)
            store.count(sys.argv[3], "failed", 7.0)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, root, str(n), q])
             for n, q in ((5, "a"), (3, "b"), (4, "a"))]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    with JobStore(root) as store:  # every writer has exited: what they counted is on disk
        c = store.counters()
    assert (c.queues["a"].created, c.queues["b"].created) == (9, 3)
    assert (c.queues["a"].fulfilled, c.queues["a"].failed, c.queues["b"].fulfilled) == (2, 2, 1)
    a = c.queues["a"]
    assert sum(a.durations) == 4 and a.duration_sum == pytest.approx(14.04)
    assert a.durations[BOUNDS.index(0.025)] == 2 and a.durations[BOUNDS.index(10.0)] == 2
    assert sum(f for _, f, _ in c.throughput("a", minutes=5)) == 2
    assert sum(f for _, _, f in c.throughput(minutes=5)) == 3


def test_a_process_sees_its_own_counts_at_once_and_a_store_that_was_never_closed_keeps_them(
        tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        store.create(1, queue="q")
        assert store.counters().queues["q"].created == 1  # not waiting for its writer's second
    script = "import sys\nfrom fsjobstore import JobStore\nJobStore(sys.argv[1]).create(2, queue='q')\n"
    subprocess.run([sys.executable, "-c", script, root], check=True, timeout=60)  # never closed
    with JobStore(root) as store:
        assert store.counters().queues["q"].created == 2


def test_cancel_and_fulfill_by_id_count_the_jobs_they_end_but_a_running_jobs_cancel_is_its_workers(
        tmp_path: Path) -> None:
    with JobStore(str(tmp_path / "s")) as store:
        waiting, done, running = (store.create(i, queue="q").id for i in range(3))
        store.cancel(waiting)
        store.fulfill(done, "x")
        lease = store.pull_work()
        assert lease is not None and lease.id == running
        store.cancel(running)  # asked to stop: counted when its holder ends it
        c = store.counters().queues["q"]
        assert (c.created, c.cancelled, c.fulfilled) == (3, 1, 1)


def test_count_refuses_an_unknown_counter_a_bad_queue_and_a_bad_duration(tmp_path: Path) -> None:
    with JobStore(str(tmp_path / "s")) as store:
        with pytest.raises(InvalidRequest, match="no counter 'done'"):
            store.count("q", "done")
        with pytest.raises(InvalidQueueName):
            store.count("no.dots", "fulfilled")
        for bad in (-1.0, float("nan"), float("inf"), True):
            with pytest.raises(InvalidRequest, match="duration"):
                store.count("q", "fulfilled", bad)  # type: ignore[arg-type]
        assert store.counters().queues == {}


def test_many_deltas_are_folded_into_a_total_and_nothing_is_counted_twice_or_lost(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    n = FOLD_AT + 10
    for i in range(n):  # one delta each
        with JobStore(root) as store:
            store.create(i, queue="q")
    names = os.listdir(_metrics_dir(root))
    # The 64th writer folded the first 64 deltas into a total, as it wrote its own.
    assert [name for name in names if TOTAL_RE.match(name)]
    assert 0 < sum(name.startswith("d.") for name in names) < FOLD_AT
    with JobStore(root) as store:
        assert store.counters().queues["q"].created == n
        fold(_metrics_dir(root), 0o644, time.time())
    names = os.listdir(_metrics_dir(root))
    assert not [m for m in names if m.startswith("d.")]
    assert len([name for name in names if TOTAL_RE.match(name)]) <= 2  # the newest, and the one it was made from
    with JobStore(root) as store:
        store.create("more", queue="q")
        assert store.counters().queues["q"].created == n + 1


def _hammer(root: str, seconds: float, writes: int) -> None:
    """Create jobs (a delta each) while folding; used by several processes at once."""
    with JobStore(root, durable=False) as store:
        for i in range(writes):
            store.create(i, queue="race")
            store._counters.flush()  # a delta per job, to make many
            if i % 7 == 0:
                fold(_metrics_dir(root), 0o644, time.time())


def test_processes_folding_and_writing_at_once_count_every_job_exactly_once(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    JobStore(root, durable=False).close()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(root, 5.0, 120)) for _ in range(4)]
    for p in procs:
        p.start()
    seen = []
    with JobStore(root, durable=False) as reader:
        while any(p.is_alive() for p in procs):
            c = reader.counters().queues.get("race")
            seen.append(0 if c is None else c.created)
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
        assert reader.counters().queues["race"].created == 480
    assert seen == sorted(seen), "a reader saw a count go down while folds ran"
    assert max(seen, default=0) <= 480


def test_planted_links_fifos_and_junk_in_the_counters_are_never_believed_or_followed(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        store.create(1, queue="q")
    d = _metrics_dir(root)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"v": 1, "queues": {"q": {"c": [1000] + [0] * 7, "h": [0] * 19, "s": 0}},
                                   "minutes": {}}))
    os.symlink(outside, os.path.join(d, "d.1.0123456789abcdef.1.json"))
    os.mkfifo(os.path.join(d, "d.2.0123456789abcdef.1.json"))
    junks = (b"{", b"[]", b'{"v": 1, "queues": {"q": {"c": [-5, 0, 0, 0, 0, 0, 0, 0], "h": [], "s": 0}},'
             b' "minutes": {}}', b'{"v": 1, "queues": {}, "minutes": {"x": {}}}',
             b'{"v":1,"queues":{"q":{"c":[1,0,0,0,0,0,0,0],"h":[0],"s":NaN}},"minutes":{}}')
    for i, junk in enumerate(junks):
        (Path(d) / f"d.3.0123456789abcdef.{i}.json").write_bytes(junk)
    (Path(d) / "t.000000000009.json").write_bytes(b"not a total")
    with JobStore(root) as store:
        c = store.counters()
        assert c.queues["q"].created == 1
        fold(d, 0o644, time.time())  # folds what it believes, leaves the rest
        assert store.counters().queues["q"].created == 1
    assert outside.exists()


def test_statistics_count_every_state_per_queue_and_the_oldest_pending_job_of_each(tmp_path: Path) -> None:
    with JobStore(str(tmp_path / "s")) as store:
        store.create(1, queue="a")
        old = store.create(2, queue="b")
        time.sleep(0.05)
        store.create(3, queue="b")
        store.create(4, queue="b", delay=3600)
        store.fulfill(store.create(5, queue="c").id, "v")
        store.cancel(store.create(6, queue="c").id)
        lease = store.pull_work(queues="a")
        assert lease is not None
        stats = store.statistics()
        assert stats.by_queue["a"] == {"pending": 0, "scheduled": 0, "deferred": 0, "active": 1, "fulfilled": 0,
                                       "failed": 0, "cancelled": 0}
        assert stats.by_queue["b"]["pending"] == 2 and stats.by_queue["b"]["scheduled"] == 1
        assert (stats.by_queue["c"]["fulfilled"], stats.by_queue["c"]["cancelled"]) == (1, 1)
        assert stats.pending_by_queue == {"a": 0, "b": 2, "c": 0}
        assert stats.oldest_pending_by_queue["b"] >= 0.05 and "a" not in stats.oldest_pending_by_queue
        assert stats.oldest_pending_age == stats.oldest_pending_by_queue["b"]
        assert time.time() - old.created_at >= stats.oldest_pending_age - 0.01
        lease.fail("boom", retry=False)
        assert store.statistics().by_queue["a"]["failed"] == 1


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_a_workers_attempts_are_counted_by_how_they_ended_with_their_run_times(tmp_path: Path, mode: str) -> None:
    root = str(tmp_path / "s")
    with JobStore(root, backoff=lambda attempt: 0.0) as store:
        ok = [store.create({"sleep": 0.03}, queue="w").id for _ in range(3)]
        bad = store.create({"fail": True}, queue="w", max_attempts=2).id
        slow = store.create({"sleep": 5}, queue="w", timeout=0.3, max_attempts=1).id

        def handler(job):  # type: ignore[no-untyped-def]
            if job.request.get("fail"):
                raise ValueError("no")
            time.sleep(job.request["sleep"])
            return "done"

        worker = Worker(store, {"w": handler}, mode=mode, concurrency=2)
        worker.run(burst=True)
        assert store.get(bad).state == "failed" and store.get(slow).state == "failed"
        assert all(store.get(i).state == "fulfilled" for i in ok)
        # Children of processes mode wrote theirs as they closed; threads mode's are this process's.
        c = store.counters().queues["w"]
    assert (c.created, c.fulfilled, c.retried, c.timed_out) == (5, 3, 1, 1)
    assert c.failed == 2  # the job that raised twice, and the one whose only attempt timed out
    assert sum(c.durations) == 6 and c.duration_sum >= 3 * 0.03 + 0.3


def test_a_sigkilled_process_keeps_what_it_had_written(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    JobStore(root).close()
    script = textwrap.dedent("""
        import sys, time
        from fsjobstore import JobStore
        store = JobStore(sys.argv[1])
        for i in range(3):
            store.create(i, queue="k")
        time.sleep(3)  # its writer writes within a second
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, root], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    with JobStore(root) as store:
        assert store.counters().queues["k"].created == 3


def test_a_counts_writer_thread_ends_when_idle_and_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    import fsjobstore._core._counters as counters

    monkeypatch.setattr(counters, "FLUSH_EVERY", 0.02)
    monkeypatch.setattr(counters, "_IDLE_EXIT", 0.1)
    with JobStore(str(tmp_path / "s")) as store:
        store.create(1, queue="t")
        deadline = time.monotonic() + 10
        while any(t.name == "fsjobstore-counters" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(t.name == "fsjobstore-counters" for t in threading.enumerate())
        store.create(2, queue="t")
        assert any(t.name == "fsjobstore-counters" for t in threading.enumerate())
        assert store.counters().queues["t"].created == 2


def test_a_bare_pull_work_user_is_counted_as_a_worker_is_with_run_times(tmp_path: Path) -> None:
    with JobStore(str(tmp_path / "s"), backoff=lambda attempt: 0.0) as store:
        for i in range(4):
            store.create(i, queue="q", max_attempts=2)
        leases = [store.pull_work() for _ in range(4)]
        assert all(lease is not None for lease in leases)
        time.sleep(0.05)
        done, retried, failed, given = leases  # type: ignore[misc]
        done.fulfill("ok")
        retried.fail("again")  # its first attempt of two: it runs again
        failed.fail("no", retry=False)
        given.release()  # a give-back ran no attempt
        c = store.counters().queues["q"]
    assert (c.created, c.fulfilled, c.retried, c.failed, c.given_back) == (4, 1, 1, 1, 1)
    assert sum(c.durations) == 3 and c.duration_sum >= 3 * 0.05


def test_a_forked_child_killed_right_after_its_commits_lost_none_of_its_counts(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        for i in range(3):
            store.create(i, queue="k")
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: commit, say so, and wait to be killed, as a worker at its time limit is
            try:
                for _ in range(3):
                    lease = store.pull_work()
                    assert lease is not None
                    lease.fulfill("done")
                os.write(ready_w, b"x")
                time.sleep(60)
            finally:
                os._exit(1)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"x"
        os.kill(pid, signal.SIGKILL)  # before its own writer could have written anything
        os.waitpid(pid, 0)
        assert store.counters().queues["k"].fulfilled == 3


def test_a_take_over_counts_the_attempt_it_ends_as_lost_and_how_the_job_goes_on(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    JobStore(root).close()
    script = textwrap.dedent("""
        import sys, time
        from fsjobstore import JobStore
        store = JobStore(sys.argv[1])
        store.create(1, queue="t", max_attempts=2)
        store.create(2, queue="t", max_attempts=1)
        assert store.pull_work() is not None and store.pull_work() is not None
        print("holding", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, root], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    with JobStore(root) as rescuer:
        report = rescuer.recover()
        assert (report.requeued, report.failed) == (1, 1)
        c = rescuer.counters().queues["t"]
    assert (c.lost, c.retried, c.failed, c.fulfilled) == (2, 1, 1, 0)


def test_a_forked_child_counting_after_its_parent_closed_the_store_keeps_its_counts_and_lives(
        tmp_path: Path) -> None:
    # A program may set SIGPIPE to kill (as many command-line tools do): a count sent to a parent
    # that closed its store must fail quietly, and be kept by the child itself.
    root = str(tmp_path / "s")
    store = JobStore(root)
    store.create(1, queue="late")
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.read(go_r, 1)  # the parent has closed its store
            lease = store.pull_work()
            assert lease is not None
            lease.fulfill("done")
            store.close()
            code = 0
        finally:
            os._exit(code)
    store.close()
    os.write(go_w, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    with JobStore(root) as again:
        assert again.counters().queues["late"].fulfilled == 1
