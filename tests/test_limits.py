"""Concurrency and rate limits (issue 22, part 1): ``create(concurrency_key=)``, ``set_limit``.

What they must guarantee: at most N jobs of a key or queue run at once across processes; the rest
wait in order, without being claimed over and over; a holder killed with SIGKILL frees its slot at
once on its host; a rate caps starts per period; waiting jobs read as pending everywhere.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import in_background

from fsjobstore import InvalidRequest, JobNotFound, JobState, JobStore


def _run_keyed(root: str, n_jobs: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """A worker process: run jobs until none is left, each 0.1 s, noting when it ran."""
    with JobStore(root) as s:
        while True:
            lease = s.pull_work(timeout=2.0)
            if lease is None:
                break
            start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the host
            time.sleep(0.1)
            lease.fulfill({"start": start, "end": time.monotonic(), "pid": os.getpid()})
    out.put("done")


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_a_key_runs_at_most_its_limit_at_once_across_processes(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as s:
        s.set_limit(key="api", concurrency=2)
        keyed = [s.create({"i": i}, concurrency_key="api").id for i in range(12)]
        free = [s.create({"free": i}).id for i in range(4)]
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_run_keyed, args=(root, 16, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for _ in procs:
        assert out.get(timeout=120) == "done"
    for p in procs:
        p.join(30)
    with JobStore(root) as s:
        jobs = {j: s.get(j) for j in keyed + free}
        assert {j.state for j in jobs.values()} == {JobState.FULFILLED}
        assert all(jobs[j].attempts == 1 for j in keyed), "a job that waited for its slot counted an attempt"
        spans = [(jobs[j].value["start"], jobs[j].value["end"]) for j in keyed]
        assert _most_at_once(spans) <= 2
        # The jobs without a key were not held back behind the keyed ones.
        assert _most_at_once(spans + [(jobs[j].value["start"], jobs[j].value["end"]) for j in free]) > 2
        assert s.limits()[0].running == 0 and s.limits()[0].waiting == 0


def test_a_key_nobody_declared_runs_one_at_a_time_and_the_rest_wait_in_order(store: JobStore) -> None:
    a = store.create("a", concurrency_key="k").id
    first = store.pull_work()
    assert first is not None and first.id == a
    b = store.create("b", concurrency_key="k").id
    c = store.create("c", concurrency_key="k").id
    d = store.create("d", concurrency_key="k", priority=-1).id  # more urgent: it goes first
    other = store.create("other").id
    got = store.pull_work()
    assert got is not None and got.id == other  # the keyed ones were passed over, not in the way
    got.fulfill(None)
    assert store.pull_work() is None
    assert [store.get(j).state for j in (b, c, d)] == [JobState.PENDING] * 3
    assert {j.id for j in store.jobs(state="pending")} == {b, c, d}
    assert store.statistics().pending == 3
    [lim] = store.limits()
    assert (lim.kind, lim.name, lim.concurrency, lim.running, lim.waiting) == ("key", "k", 1, 1, 3)
    order = []
    first.fulfill(None)
    for _ in range(3):
        lease = store.pull_work(timeout=5)
        assert lease is not None
        assert store.pull_work() is None  # still one at a time
        order.append(lease.id)
        lease.fulfill(None)
    assert order == [d, b, c]
    assert all(store.get(j).attempts == 1 for j in (a, b, c, d))


def test_a_queue_limit_passes_the_queue_over_while_it_is_full(store: JobStore) -> None:
    store.set_limit(queue="mail", concurrency=1)
    m1, m2 = store.create(1, queue="mail").id, store.create(2, queue="mail").id
    o = store.create(3, queue="other").id
    held = store.pull_work()
    assert held is not None and held.id == m1
    nxt = store.pull_work()
    assert nxt is not None and nxt.id == o
    assert store.pull_work() is None
    assert store.get(m2).state is JobState.PENDING
    waiter = in_background(lambda: store.pull_work(timeout=10))
    held.fulfill(None)
    got = waiter()
    assert got is not None and got.id == m2


HOLDER = """
import sys, time
from fsjobstore import JobStore
s = JobStore(sys.argv[1], lease_duration=60)
lease = s.pull_work(timeout=10)
print(lease.id, flush=True)
time.sleep(600)
"""


def test_a_holder_killed_with_sigkill_frees_its_slot_at_once(root: str) -> None:
    # lease_duration 60: nothing but the freed lock can start the next job within the bound below
    # (a take-over waits for a recovery pass, every 30 s here).
    with JobStore(root, lease_duration=60) as s:
        first = s.create("first", concurrency_key="one").id
        second = s.create("second", concurrency_key="one").id
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, root], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == first
            assert s.pull_work() is None  # the second waits for the slot
            waiter = in_background(lambda: s.pull_work(timeout=20))
            killed = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            lease = waiter()
            waited = time.monotonic() - killed
        finally:
            proc.kill()
            proc.wait()
        assert lease is not None and lease.id == second
        assert waited < 10, f"the next job started {waited:.1f} s after its holder died"
        lease.fulfill(None)


def test_recovery_starts_what_waits_when_its_parker_and_its_holder_are_gone(root: str) -> None:
    with JobStore(root, lease_duration=60) as s:
        first = s.create("first", concurrency_key="one").id
        second = s.create("second", concurrency_key="one").id
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, root], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline()
            assert s.pull_work() is None  # parked by this store, which closes now
        finally:
            s.close()
            proc.kill()
            proc.wait()
    with JobStore(root) as s:
        assert s.get(second).state is JobState.PENDING
        report = s.recover()
        assert report.waiting_promoted == 1
        # The dead holder's job was taken over too: back in its queue, the older of the two, it
        # runs first; then the second.
        for expected in (first, second):
            lease = s.pull_work(timeout=5)
            assert lease is not None and lease.id == expected
            lease.fulfill(None)


def test_a_rate_caps_the_starts_in_any_period(store: JobStore) -> None:
    store.set_limit(key="slow", rate=(2, 1.0))
    ids = [store.create(i, concurrency_key="slow").id for i in range(3)]
    t0 = time.time()
    got = [store.pull_work(), store.pull_work()]
    assert [lease.id for lease in got if lease] == ids[:2]  # no cap on concurrency: both run
    assert store.pull_work() is None
    third = store.pull_work(timeout=10)
    assert third is not None and third.id == ids[2]
    assert time.time() - t0 >= 0.95, "a third start came within the period of two"


def test_a_key_with_only_a_rate_keeps_starting_its_line_at_that_rate(store: JobStore) -> None:
    # A start frees no slot, so nothing else gives the next job of such a line its turn: it ran
    # one job a recovery pass (lease_duration / 2 = 15 s here) once the line had formed.
    store.set_limit(key="api", rate="4/s")
    ids = [store.create(i, concurrency_key="api").id for i in range(10)]
    started: list[tuple[float, float, str]] = []  # each start lies between its pull's call and return
    deadline = time.monotonic() + 12  # at 4/s, 10 jobs need 2.x s; one more pass would take 15
    while len(started) < len(ids) and time.monotonic() < deadline:
        called = time.time()
        lease = store.pull_work(timeout=1)
        if lease is not None:
            started.append((called, time.time(), lease.id))
            lease.fulfill(None)
    assert sorted(job_id for _, _, job_id in started) == sorted(ids), f"{len(started)} of 10 started"
    # No five starts within a second: the fifth returned at least 1 s after the first was asked for.
    # (A return's own stamp can lag its start on a loaded machine, so returns are not compared.)
    assert all(later[1] - first[0] >= 0.95 for first, later in zip(started, started[4:], strict=False)), started


def test_a_queue_rate_gives_the_job_back_to_its_queue(store: JobStore) -> None:
    store.set_limit(queue="q", rate="1/s")
    a, b = store.create(1, queue="q").id, store.create(2, queue="q").id
    first = store.pull_work()
    assert first is not None and first.id == a
    assert store.pull_work() is None
    assert store.get(b).state is JobState.PENDING and store.get(b).attempts == 0
    t0 = time.time()
    lease = store.pull_work(timeout=10)
    assert lease is not None and lease.id == b and time.time() - t0 > 0.3


def test_waiting_jobs_can_be_cancelled_purged_and_a_raised_limit_starts_them(store: JobStore) -> None:
    held = store.create(0, concurrency_key="k").id
    lease = store.pull_work()
    assert lease is not None and lease.id == held
    ids = [store.create(i, concurrency_key="k").id for i in range(1, 5)]
    assert store.pull_work() is None
    assert store.cancel(ids[0]).state is JobState.CANCELLED
    assert store.purge(states="pending") == 3  # the three others, which wait in jobs/waiting/
    for j in ids[1:]:
        with pytest.raises(JobNotFound):
            store.get(j)
    again = [store.create(i, concurrency_key="k").id for i in range(3)]
    assert store.pull_work() is None
    store.set_limit(key="k", concurrency=4)
    got = {x.id for x in (store.pull_work(timeout=5), store.pull_work(timeout=5), store.pull_work(timeout=5)) if x}
    assert got == set(again)
    assert store.clear_limit(key="k") is True and store.clear_limit(key="k") is False


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"key": "a", "queue": "b", "concurrency": 1}, "exactly one of key="),
    ({"concurrency": 1}, "exactly one of key="),
    ({"key": "a"}, "give concurrency= or rate="),
    ({"key": "a", "concurrency": 0}, "concurrency must be a whole number"),
    ({"key": "a", "concurrency": True}, "concurrency must be a whole number"),
    ({"key": "a", "rate": "ten a minute"}, 'rate must look like "10/m"'),
    ({"key": "a", "rate": (0, 60)}, "rate must have starts from 1 to 100,000"),
    ({"key": "a", "rate": (1, float("nan"))}, "rate must have a period above 0 seconds"),
    ({"queue": "bad name", "concurrency": 1}, "queue"),
    ({"key": "", "concurrency": 1}, "key must be a printable string"),
])
def test_a_bad_limit_is_refused_naming_the_problem(store: JobStore, kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidRequest, match=says.replace("(", r"\(")):
        store.set_limit(**kwargs)  # type: ignore[arg-type]
    assert store.limits() == []


def test_a_bad_concurrency_key_is_refused_and_nothing_is_made(store: JobStore) -> None:
    with pytest.raises(InvalidRequest, match="concurrency_key must be a printable string"):
        store.create(1, concurrency_key="x" * 600)
    assert store.statistics().pending == 0


def test_a_planted_declaration_or_slot_is_ignored_and_steers_nothing(store: JobStore, root: str,
                                                                    tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("keep")
    store.set_limit(key="k", concurrency=1)
    os.makedirs(f"{root}/control/limits", exist_ok=True)
    with open(f"{root}/control/limits/0123456789abcdef.json", "w") as fh:
        json.dump({"kind": "key", "name": "other", "concurrency": 5}, fh)  # its name is not its hash
    lim_dir = f"{root}/limits/{store.limits()[0].id}"
    os.makedirs(lim_dir, exist_ok=True)
    os.symlink(str(outside), f"{lim_dir}/c0")  # a member's link where the slot goes
    a = store.create(1, concurrency_key="k").id
    b = store.create(2, concurrency_key="k").id
    assert store.pull_work() is None  # the one slot is unusable: both wait; nothing outside is touched
    assert outside.read_text() == "keep"
    assert [lim.name for lim in store.limits()] == ["k"]
    os.unlink(f"{lim_dir}/c0")
    store.set_limit(key="k", concurrency=1)  # anything that looks again starts the first
    lease = store.pull_work(timeout=5)
    assert lease is not None and lease.id == a
    assert store.get(b).state is JobState.PENDING


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True, timeout=60)


def test_the_cli_declares_lists_and_clears_limits(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    made = _cli("create", root, '{"a": 1}', "--concurrency-key", "api", "--init")
    assert made.returncode == 0, made.stderr
    assert _cli("limit", root, "--key", "api", "--concurrency", "3", "--rate", "10/m").returncode == 0
    shown = json.loads(_cli("limits", root, "--json").stdout)
    assert shown == [{"kind": "key", "name": "api", "concurrency": 3, "rate": {"starts": 10, "per_seconds": 60.0},
                      "running": 0, "waiting": 0}]
    assert "concurrency key  api" in _cli("get", root, made.stdout.strip()).stdout
    bad = _cli("limit", root, "--key", "api", "--rate", "often")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and '"10/m"' in bad.stderr
    assert _cli("limit", root, "--key", "api").returncode == 2
    assert "cleared" in _cli("limit", root, "--key", "api", "--clear").stdout
    assert json.loads(_cli("limits", root, "--json").stdout) == []



def test_the_cli_table_quotes_a_key_with_a_space_as_the_shell_takes_it_back(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    assert _cli("init", root).returncode == 0
    declared = _cli("limit", root, "--key", "user 42", "--concurrency", "2")
    assert declared.returncode == 0, declared.stderr
    assert declared.stdout.startswith("key 'user 42': at most 2 at once")
    assert _cli("limits", root).stdout.startswith("key 'user 42'  concurrency 2  rate -")
    assert _cli("limits", root, "--json").stdout.count('"user 42"') == 1  # JSON has it as it is

HOLDER_AND_PARKER = """
import sys, time
from fsjobstore import JobStore
s = JobStore(sys.argv[1], lease_duration=60)
lease = s.pull_work(timeout=10)
assert s.pull_work() is None  # this process parks the second job too, and dies with it
print(lease.id, flush=True)
time.sleep(600)
"""


def test_an_idle_puller_starts_the_next_job_at_once_when_holder_and_parker_die_together(root: str) -> None:
    with JobStore(root, lease_duration=60) as s:
        first = s.create("first", concurrency_key="one").id
        second = s.create("second", concurrency_key="one").id
        proc = subprocess.Popen([sys.executable, "-c", HOLDER_AND_PARKER, root], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == first
            waiter = in_background(lambda: s.pull_work(timeout=20), settle=1.5)  # idle: it looked at the line
            killed = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            lease = waiter()
            waited = time.monotonic() - killed
        finally:
            proc.kill()
            proc.wait()
        assert lease is not None and lease.id == second
        assert waited < 10, f"the next job started {waited:.1f} s after its holder and parker died"


def test_a_lowered_limit_holds_back_new_starts_until_the_running_ones_fit(store: JobStore) -> None:
    store.set_limit(key="k", concurrency=3)
    ids = [store.create(i, concurrency_key="k").id for i in range(5)]
    running = [store.pull_work() for _ in range(3)]
    assert all(running) and store.pull_work() is None
    lowered = store.set_limit(key="k", concurrency=1)
    assert (lowered.running, lowered.waiting) == (3, 2)  # what set_limit returns says it too
    assert store.limits()[0].running == 3  # the slots taken before the change count too
    running[0].fulfill(None)  # type: ignore[union-attr]
    store.create("late", concurrency_key="k")  # in its queue, not waiting: a claim meets the limit itself
    assert store.pull_work() is None  # two still run, against a limit of one
    running[1].fulfill(None)  # type: ignore[union-attr]
    assert store.pull_work() is None
    running[2].fulfill(None)  # type: ignore[union-attr]
    nxt = store.pull_work(timeout=5)
    assert nxt is not None and nxt.id == ids[3]
    assert store.limits()[0].running == 1 and store.pull_work() is None


def test_a_parked_name_carries_its_claims_token_and_one_without_is_still_read(store: JobStore) -> None:
    # Each park makes a new name (FORMAT.md, "Limits": a name a job had before can make a rename
    # do nothing on a network filesystem); names from before the token are still found and run.
    first = store.create("a", concurrency_key="k")
    holding = store.pull_work()
    assert holding is not None and holding.id == first.id
    old = store.create("old", concurrency_key="k").id
    new = store.create("new", concurrency_key="k").id
    assert store.pull_work() is None
    waiting = os.path.join(store.path, "jobs", "waiting")
    names = {n.split(".")[4]: n for n in os.listdir(waiting)}
    assert set(names) == {old, new}
    assert all(len(n.split(".")) == 7 for n in names.values())  # <H>.<P>.<SEQ>.<queue>.<id>.<t>.json
    untokened = names[old].rsplit(".", 2)[0] + ".json"
    os.rename(os.path.join(waiting, names[old]), os.path.join(waiting, untokened))
    assert store.get(old).state is JobState.PENDING
    assert {j.id for j in store.jobs(state="pending")} == {old, new}
    assert store.limits()[0].waiting == 2
    holding.fulfill(None)
    order = []
    for _ in range(2):
        lease = store.pull_work(timeout=5)
        assert lease is not None
        order.append(lease.id)
        lease.fulfill(None)
    assert order == [old, new]
