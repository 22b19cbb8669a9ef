"""A process that already holds more than 1,024 descriptors still waits, wakes and works.

select() refuses a descriptor numbered 1,024 or more (FD_SETSIZE); a web server, a test runner or
any long-lived host application gets there. Each case runs in its own interpreter so that the
descriptors it opens cannot disturb other tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fsjobstore import JobStore

PRELUDE = """
import os, resource, sys, threading, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < 4096:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
assert max(held) >= 1024, max(held)
from fsjobstore import JobStore
store = JobStore(sys.argv[1])
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script, str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=60)


def test_pull_work_waits_and_wakes_with_more_than_1024_descriptors_open(tmp_path: Path) -> None:
    done = _run(tmp_path, """
        assert store.pull_work(timeout=0.2) is None
        threading.Timer(0.2, lambda: store.create(queue="q", request=1)).start()
        work = store.pull_work(timeout=10)
        assert work is not None and work.request == 1
        work.fulfill(2)
        assert store.wait(work.id, timeout=5).value == 2
        print("ok")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_worker_runs_jobs_with_more_than_1024_descriptors_open(tmp_path: Path) -> None:
    done = _run(tmp_path, """
        from fsjobstore.worker import Worker
        for i in range(3):
            store.create(queue="q", request=i)
        for mode in ("threads", "processes"):
            summary = Worker(store, {"q": lambda job: job.request * 10}, mode=mode).run(count=1)
            assert summary.fulfilled == 1, summary
        summary = Worker(store, {"q": lambda job: job.request * 10}).run(burst=True)
        assert summary.fulfilled == 1, summary
        print("ok")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_lookups_in_buckets_no_process_caches_leave_no_descriptor_behind(tmp_path: Path) -> None:
    # Each lstat of a job in a bucket the process does not cache (past the 8 it keeps) leaked the
    # descriptor of the bucket: a group made across 40 queues held 5,800 of them, and a process
    # making such groups ran out (EMFILE) within a few. Queues' directories and 8 buckets are
    # cached by design: what is counted is what grows past that.
    with JobStore(str(tmp_path / "s")) as store:
        store.create_group([{"request": i, "queue": f"q{i}"} for i in range(40)])
        held = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            store.create_group([{"request": i, "queue": f"q{i}"} for i in range(40)])
            for job in store.jobs(state="pending", limit=None):
                store.get(job.id)
        assert len(os.listdir("/proc/self/fd")) <= held + 10
