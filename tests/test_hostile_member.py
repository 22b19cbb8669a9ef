"""A hostile member of a shared store's group, tried for real (issue 23, "Done means").

A forked child drops to another uid (no system user is made: the kernel needs none) with the
store's group as a supplementary group, and plants symbolic links to a canary directory of root's,
FIFOs and plain files at the store's directories and at job-file names, over and over, WHILE this
process (root) runs a real :class:`fsjobstore.Worker` in processes mode, a producer creating jobs and
queueing a target on each, and a notifier delivering them. Afterwards: the canary tree is unchanged,
every acknowledged job is fulfilled, failed with its error, or sits in what the member moved away
(which a member may do, FORMAT.md "Trust"), and nothing hung. The child also checks that what a
member can do is what FORMAT.md says it can.

Needs root to switch uids (skipped otherwise). ``python tests/test_hostile_member.py SECONDS`` runs
it longer and prints the figures.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from internals import pending_file

from fsjobstore import Deliverer, JobContext, JobState, JobStore, JobStoreError, Worker
from fsjobstore._format._layout import PENDING_BUCKET_RE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")

GROUP = 54_320  # a gid and uid nobody uses; no /etc/passwd or /etc/group entry is needed
MEMBER = 54_321
QUEUE = "default"
BUCKET = f"jobs/pending/{QUEUE}/BUCKET"  # one of the queue's buckets at the time (_a_bucket)
# Every directory FORMAT.md lists but quarantine (a planted quarantine is refused by design:
# UntrustedStore naming it; test_planted_links covers that refusal).
DIRECTORIES = [
    "jobs", "jobs/pending", f"jobs/pending/{QUEUE}", "jobs/scheduled", "jobs/active", "jobs/fulfilled",
    "jobs/failed", "jobs/cancelled", "jobs/notify", "targets", "control", "control/paused",
    "control/cancel", "control/deadlines", "control/doorbell", "runs", "workers", "leases", "ids", "tmp",
    BUCKET,
]
QUIET_DIRECTORIES = [d for d in DIRECTORIES if d not in ("jobs", "jobs/pending", f"jobs/pending/{QUEUE}",
                                                        "jobs/active", "jobs/notify", "jobs/fulfilled", BUCKET)]
# Where job files live: a name planted there looks like a job file. (A pending job's file is in
# a bucket, pending/<queue>/<P>.<S>/; one planted flat in the queue's directory is what an older
# store wrote, moved into its bucket by the next claimer.)
JOB_DIRS = [f"jobs/pending/{QUEUE}", BUCKET, "jobs/active", "jobs/fulfilled", "jobs/notify", "jobs/scheduled"]


def _snapshot(root: Path) -> dict[str, tuple[int, float, bytes | None]]:
    out: dict[str, tuple[int, float, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            data = Path(path).read_bytes() if name in filenames else None
            out[os.path.relpath(path, root)] = (st.st_mode, st.st_mtime, data)
    return out


# -- the member ---------------------------------------------------------------------------------
def _can(store_root: str, canary: str) -> dict[str, Any]:
    """What FORMAT.md ("Trust") says a member can and cannot do, tried as the member."""
    found: dict[str, Any] = {}
    with JobStore(store_root) as store:  # a member opens the store (the group comes from it)
        job = store.create({"by": "member"}, queue="member")
        found["create"] = True
        found["read"] = store.get(job.id).request == {"by": "member"}
        os.unlink(pending_file(store_root, job.id, "member"))  # allowed: a member may delete any job file
        try:
            store.get(job.id)
            found["delete_job_file"] = False
        except JobStoreError:
            found["delete_job_file"] = True
    try:
        with open(os.path.join(canary, "member-was-here"), "w"):
            pass
        found["write_canary"] = True
    except PermissionError:
        found["write_canary"] = False
    return found


def _plant_one(store_root: str, canary: str, aside: str, rng: random.Random, n: int) -> str:
    kind = rng.choice(["link", "link", "fifo", "file"])  # links are the dangerous ones
    if rng.random() < 0.5:
        # The directories that hold jobs less often: moving one aside takes its jobs along (a
        # member may), which would leave little for the trial to watch.
        where = _a_bucket(store_root, rng, rng.choice(DIRECTORIES if rng.random() < 0.03 else QUIET_DIRECTORIES))
        if where in ("runs", "targets") and rng.random() < 0.7:
            # A per-job directory: of a job that is running or queued now.
            with _quiet():
                ids = [n.rsplit(".", 2)[-2] for n in os.listdir(os.path.join(store_root, "jobs", "active"))]
                if ids:
                    where = f"{where}/{rng.choice(ids)}"
        path = os.path.join(store_root, where)
        with _quiet():
            os.rename(path, os.path.join(aside, f"{n:06d}.{where.replace('/', '~')}"))
    else:
        where = _a_bucket(store_root, rng, rng.choice(JOB_DIRS))
        path = os.path.join(store_root, where, f"0001000.{n:020d}.planted{n}.json")
    with _quiet():
        if kind == "link":
            os.symlink(rng.choice([canary, os.path.join(canary, "secret.json"), os.path.join(canary, "private")]),
                       path)
        elif kind == "fifo":
            os.mkfifo(path, 0o660)
        else:
            with open(path, "x") as f:
                f.write("not what belongs here\n")
    return f"{kind}@{where.split('/')[0]}"


def _a_bucket(store_root: str, rng: random.Random, where: str) -> str:
    """``where``, with BUCKET made one of the queue's buckets now (the queue's directory if it
    has none)."""
    if where != BUCKET:
        return where
    qdir = os.path.dirname(where)
    with _quiet():
        buckets = sorted(b for b in os.listdir(os.path.join(store_root, qdir)) if PENDING_BUCKET_RE.match(b))
        if buckets:
            return f"{qdir}/{rng.choice(buckets)}"
    return qdir


class _quiet:
    """Suppress OSError: the store repairs and moves things under the member's feet."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, OSError)


def _member(store_root: str, canary: str, aside: str, seconds: float, conn: Any) -> None:
    try:
        os.setgroups([GROUP])
        os.setgid(GROUP)
        os.setuid(MEMBER)
        os.umask(0o022)
        found = _can(store_root, canary)
        rng = random.Random(23)
        planted: Counter[str] = Counter()
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            n += 1
            planted[_plant_one(store_root, canary, aside, rng, n)] += 1
            time.sleep(rng.uniform(0.0, 0.02))
        conn.send(("ok", {"can": found, "planted": dict(planted)}))
    except BaseException as exc:  # report, never hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        os._exit(0)


# -- the trial ----------------------------------------------------------------------------------
def _handle(job: JobContext) -> Any:
    job.progress(1, 2, "half")  # runs/<id>/: the files a member would like to steer
    job.log(f"working on {job.id}")
    return {"n": job.request["n"]}


def _why(exc: BaseException) -> str:
    return type(exc).__name__ + (f" ({exc.strerror})" if isinstance(exc, OSError) and exc.strerror else "")


def trial(base: Path, seconds: float) -> dict[str, Any]:
    """Run the trial in ``base`` (root's, mode 0755); returns its figures and its problems."""
    canary = base / "canary"
    (canary / "default").mkdir(parents=True)
    (canary / "private").mkdir(mode=0o700)
    (canary / "secret.json").write_text('{"format": 2, "id": "secret"}\n')
    (canary / "private" / "0001000.00000000000000000001.secret.json").write_text("{}\n")
    os.chmod(canary, 0o755)
    before = _snapshot(canary)
    aside = base / "member"  # where the member moves the directories it replaces
    aside.mkdir()
    os.chown(aside, MEMBER, GROUP)
    root = base / "store"
    store = JobStore(str(root), group=GROUP, durable=False, poll_interval=0.2)
    problems: list[str] = []
    acked: list[str] = []
    delivered: list[str] = []
    stop = threading.Event()

    refusals: Counter[str] = Counter()

    def produce() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            time.sleep(0.005)
            try:
                job = store.create({"n": n}, queue=QUEUE)
            except JobStoreError as exc:  # refused: not acknowledged, so not owed
                refusals[f"create: {_why(exc)}"] += 1
                continue
            except Exception as exc:  # the point is to report it
                problems.append(f"create: {type(exc).__name__}: {exc}")
                continue
            acked.append(job.id)
            try:
                store.queue(job.id, {"to": "web"})
            except JobStoreError as exc:
                refusals[f"queue: {_why(exc)}"] += 1
            except Exception as exc:
                problems.append(f"queue: {type(exc).__name__}: {exc}")

    def deliver(target: Any, note: Any) -> None:
        delivered.append(note.id)

    def notify(notifier: Deliverer) -> None:
        while not stop.is_set():
            try:
                notifier.run(poll=0.2)
            except JobStoreError as exc:  # a refusal: the loop goes on, as a supervisor would
                refusals[f"notify: {_why(exc)}"] += 1
                time.sleep(0.05)
            except Exception as exc:
                problems.append(f"notify: {type(exc).__name__}: {exc}")
                time.sleep(0.05)

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    member = ctx.Process(target=_member, args=(str(root), str(canary), str(aside), seconds, send))
    notifier = Deliverer(store, deliver)
    threads = [threading.Thread(target=produce, daemon=True),
               threading.Thread(target=notify, args=(notifier,), daemon=True)]
    started = time.monotonic()
    member.start()
    for t in threads:
        t.start()
    worker = Worker(store, {QUEUE: _handle}, mode="processes", concurrency=2, grace=5.0)
    summary = worker.run(duration=seconds)
    stop.set()
    threads[0].join(30)
    assert receive.poll(60), "the member said nothing"
    kind, said = receive.recv()
    member.join(10)
    if kind == "error":
        raise AssertionError(f"the member failed: {said}")
    # Drain what is left, with no one planting any more: a recovery first (the member may have
    # moved leases and claims away), then a worker and a notifier until nothing is due.
    store.recover(deep=True)
    drained = Worker(store, {QUEUE: _handle}, mode="processes", concurrency=2).run(burst=True)
    notifier.stop()
    threads[1].join(30)
    Deliverer(store, deliver).run(burst=True)
    store.close()
    elapsed = time.monotonic() - started

    after = _snapshot(canary)
    if after != before:
        problems.append(f"the canary changed: {sorted(set(after) ^ set(before)) or 'contents or modes'}")
    moved = " ".join(p.name for where in (aside, root / "quarantine") for p in where.rglob("*"))
    states: Counter[str] = Counter()
    with JobStore(str(root), durable=False) as fresh:
        for job_id in acked:
            try:
                got = fresh.get(job_id)
            except JobStoreError:
                got = None
            if got is not None and got.state is JobState.FULFILLED:
                states["fulfilled"] += 1
            elif got is not None and got.state is JobState.FAILED and got.error:
                states["failed, with its error"] += 1
            elif job_id in moved:  # pending, claimed (<id>.<token>.json) or final, moved aside
                states["moved away by the member"] += 1
            else:
                states[f"unaccounted ({got.state.value if got else 'missing'})"] += 1
                problems.append(f"acknowledged job {job_id} is {got.state.value if got else 'missing'}")
    return {
        "seconds": round(elapsed, 1), "acknowledged": len(acked), "ends": dict(states),
        "worker": str(summary), "drain": str(drained), "delivered": len(delivered),
        "refusals": dict(refusals), "planted": said["planted"], "member can": said["can"], "problems": problems,
        "quarantined": len(list((root / "quarantine").glob("*.reason"))),
    }


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fsjs-hostile-"))
    os.chmod(path, 0o755)  # root's; every user may pass through to the store
    try:
        yield path
    finally:
        shutil.rmtree(path)


def _hang_alarm(seconds: int) -> None:
    def ring(signum: int, frame: object) -> None:
        raise TimeoutError(f"the trial hung for {seconds} s")

    signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)


def test_a_hostile_group_member_planting_links_fifos_and_files_steers_nothing_out_of_the_store(
        base: Path) -> None:
    _hang_alarm(180)
    try:
        figures = trial(base, seconds=8.0)
    finally:
        signal.alarm(0)
    assert figures["problems"] == []
    assert figures["acknowledged"] > 0 and figures["ends"].get("fulfilled", 0) > 0
    assert sum(figures["planted"].values()) > 50
    # What FORMAT.md ("Trust") says a member can and cannot do.
    assert figures["member can"] == {"create": True, "read": True, "delete_job_file": True,
                                     "write_canary": False}
    assert stat.S_IMODE(os.stat(base / "canary").st_mode) == 0o755


if __name__ == "__main__":  # a longer trial, printing its figures
    if os.geteuid() != 0:
        sys.exit("run as root")
    where = Path(tempfile.mkdtemp(prefix="fsjs-hostile-"))
    os.chmod(where, 0o755)
    result = trial(where, seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
    if result["problems"]:
        result["kept"] = str(where)  # to look at
    else:
        shutil.rmtree(where)
    print(json.dumps(result, indent=1))
    sys.exit(1 if result["problems"] else 0)
