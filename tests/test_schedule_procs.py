"""Periodic ticks across real processes: two schedulers on one directory, killed at random
instants, with a worker removing each tick's job as soon as it ran (retain=0 frees its id at
once, so a tick made twice would run twice). Every tick runs once; none is lost."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fsjobstore import JobStore

pytestmark = pytest.mark.slow

SCHEDULER = textwrap.dedent("""
    import sys, threading, signal
    from fsjobstore import JobStore
    from fsjobstore.schedule import Schedule
    schedule = Schedule()
    # catch_up=10: a tick that fell while both schedulers were down is made when one is back,
    # so a tick missing from the log can only be a lost one.
    schedule.every(1, queue="ticks", name="each-second", retain=0, catch_up=10)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with JobStore(sys.argv[1], lease_duration=2.0) as store:
        schedule.run(store, stop=stop)
""")

RUNNER = textwrap.dedent("""
    import os, sys
    from fsjobstore import JobStore
    with JobStore(sys.argv[1], lease_duration=2.0) as store, open(sys.argv[2], "a") as log:
        while not os.path.exists(sys.argv[3]):
            job = store.pull_work(queues="ticks", timeout=0.2)
            if job is not None:
                job.fulfill(job.token)   # retain=0: removed at once, its id free again
                log.write(job.id + "\\n")
                log.flush()
""")


def _ticks_in(log: Path) -> list[int]:
    return [int(line.rsplit("-", 1)[1]) for line in log.read_text().split()]


def run_killing_schedulers(roots: tuple[str, str], runner_root: str, workdir: Path, *, seconds: float = 10,
                           tail: float = 3) -> tuple[list[int], int]:
    """Two schedulers (on ``roots[0]`` and ``roots[1]``: one store, seen from one or two hosts)
    SIGKILLed at random for ``seconds``, a runner on ``runner_root``; then ``tail`` seconds for
    the survivors and recovery. The ticks the runner ran (in order), and how many kills."""
    log, done = workdir / "ran.log", str(workdir / "done")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))

    def start(script: str, root: str, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", script, root, *args], env=env)

    runner = start(RUNNER, runner_root, str(log), done)
    schedulers = [start(SCHEDULER, roots[0]), start(SCHEDULER, roots[1])]
    rng = random.Random(7)
    kills = 0
    began = time.time()
    try:
        while time.time() - began < seconds:
            time.sleep(rng.uniform(0.05, 0.6))  # lands anywhere in a tick, the make_tick call included
            i = rng.randrange(2)
            schedulers[i].send_signal(signal.SIGKILL)
            schedulers[i].wait()
            schedulers[i] = start(SCHEDULER, roots[i])
            kills += 1
        time.sleep(tail)  # the survivors make the ticks due, the runner runs them
    finally:
        for p in schedulers:
            p.send_signal(signal.SIGTERM)
        for p in schedulers:
            p.wait(30)
        Path(done).touch()
        runner.wait(30)
    return _ticks_in(log), kills


def check_each_tick_ran_once(ran: list[int]) -> None:
    twice = sorted({t for t in ran if ran.count(t) > 1})
    assert twice == [], f"ticks run twice: {twice}"
    first, last = min(ran), max(ran)
    missing = sorted(set(range(first, last + 1)) - set(ran))
    assert missing == [], f"ticks lost: {missing}"


def test_two_schedulers_killed_at_random_instants_make_every_tick_once(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    JobStore(root).close()
    ran, kills = run_killing_schedulers((root, root), root, tmp_path)
    check_each_tick_ran_once(ran)
    assert kills >= 15 and max(ran) - min(ran) >= 10
