"""Chaos torture run: workers SIGKILLed and SIGSTOPped while a producer keeps creating jobs.

    python tests/torture/chaos.py --kills 1000 --jobs 4000        # the long run (prints figures)
    python tests/torture/chaos.py --runtime processes --kills 300  # workers are fsjobstore.Worker

Every client operation is written to a history file as it is invoked and when it returns
(``invoke`` / ``ok`` / ``fail``). The checker, in the spirit of Jepsen's total-queue checker,
compares the history with the final store and reports:

* **lost**: jobs whose create returned ok, and that are not fulfilled at the end;
* **unexpected**: fulfilled jobs whose create was never even invoked;
* **duplicate commits**: jobs for which more than one fulfil returned ok, or whose stored result
  is not the one the acknowledged fulfil wrote;
* **repeated executions**: claims beyond the first (at-least-once execution makes these legal;
  they measure how much work the chaos cost).

With ``--retention`` every odd-numbered job is created with ``retain=0``, so the workers'
retention threads remove it as soon as it is fulfilled, while they are being killed. Such a job
missing at the end counts as **removed** if a fulfil of it was at least invoked, and as **lost**
otherwise (removal took a job that was never done); and nothing a removal cut short may be left
(``ids/``, ``runs/`` or an index entry naming no job, a final job without its entry).

With ``--relations`` every third job is made ``after`` the job made before it, and every fifth
with a unique key of its own, created twice in a row (the second create answers the first job
while it waits, or makes a new one once it is final: both are then jobs to be done). The checker
adds **early children**: a job first claimed before a fulfil of its parent was even invoked; and
every job must end fulfilled, none left deferred. With ``--limits`` every fourth job (from the second
on) also has a concurrency key, ``ck-0`` (declared with a limit of 2) or ``ck-1`` (undeclared: one at a time);
the checker adds **over limit**: the most jobs of a key that ran at once beyond its limit, counted
over the attempts whose worker lived from its claim to its fulfil (a killed holder's slot frees
when it dies, an instant the history does not record) and whose fulfil was not refused (a holder
past its lease may have lost its slot to another: FORMAT.md, "Limits").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fsjobstore import CorruptJob, JobExists, JobStore, LeaseLost, StorageError  # noqa: E402

sys.path.insert(0, os.path.dirname(HERE))
from faultkit import job_files, removal_leftovers  # noqa: E402


def _record(fh: Any, *fields: object) -> None:
    fh.write(" ".join(map(str, (time.monotonic_ns(), os.getpid(), *fields))) + "\n")
    fh.flush()


# == the processes =============================================================================
def producer(root: str, history: str, jobs: int, rate: float, retention: bool = False,
             relations: bool = False, limits: bool = False, part: int = 0, parts: int = 1,
             chosen: bool = False) -> None:
    """Makes the jobs numbered ``part`` modulo ``parts``; ``chosen``: every seventh with an id of
    its own (and no unique key, which a chosen id may not have)."""
    with JobStore(root) as store, open(history, "a") as fh:
        if limits and part == 0:
            store.set_limit(key="ck-0", concurrency=2)
            store.set_limit(key=RATED, rate=(10, 1.0))  # no cap on concurrency: only starts are limited
        previous = None
        for n in range(part, jobs, parts):
            retain = 0 if retention and n % 2 else None
            options: dict[str, Any] = {}
            if relations and previous is not None and n % 3 == 0:
                options["after"] = [previous]
            if limits and concurrency_key(n) is not None:
                options["concurrency_key"] = concurrency_key(n)
            job_id = f"chosen-{n}" if chosen and n % 7 == 0 else None
            if relations and n % 5 == 0 and job_id is None:
                options["unique_key"] = f"key-{n}"
            for _ in range(2 if "unique_key" in options else 1):
                previous = _create(store, fh, n, job_id, retain=retain, **options)
            if rate:
                time.sleep(random.expovariate(rate))


def _create(store: JobStore, fh: Any, n: int, job_id: str | None, **options: Any) -> str:
    """Create job ``n``, retrying while the filesystem fails (a host's mount killed under it).
    A failed create may have stood: with a chosen id the retry then gets JobExists and knows it;
    without one it may make a second job of ``n``, which is then one more job to be done."""
    for tries in range(1, 1000):
        _record(fh, "invoke", "create", n)
        try:
            made = store.create({"n": n}, max_attempts=1_000_000, job_id=job_id, **options).id
        except JobExists:
            if tries == 1:
                raise  # the run's ids are fresh: a first try must not find one
            # RACE: an earlier try that raised had made the job after all: it stands, made once.
            assert job_id is not None
            made = job_id
        except OSError as exc:  # StorageError too: the create may or may not stand
            _record(fh, "fail", "create", n, type(exc).__name__)
            time.sleep(0.2)
            continue
        _record(fh, "ok", "create", n, made)
        return made
    raise RuntimeError(f"job {n}: no create stood in 999 tries")


def concurrency_key(n: int) -> str | None:
    if n % 4 == 3:
        return RATED
    return f"ck-{n // 4 % 2}" if n % 4 == 1 else None


LIMITS = {"ck-0": 2, "ck-1": 1}
# A key with a rate alone: its line must keep moving through kills (nothing frees a slot to start
# the next job). Its starts are not checked against the rate here: a worker stopped between its
# claim and the claim's record moves that start later in the history (tests/test_limits.py does).
RATED = "ck-rate"


def _over_limit(history: list[list[str]], committed: set[str]) -> tuple[int, list[str]]:
    """How far the jobs of a concurrency key that ran at once went past its limit (0: never), and
    the attempts running at the worst moment ("job n, token, how its fulfil ended"). ``committed``:
    the tokens whose fulfil stands (each final job's value is its committer's token)."""
    began: dict[tuple[str, str], tuple[int, int]] = {}  # (pid, token) -> (n, claim time)
    ran: dict[tuple[str, str], tuple[str, int, int, int]] = {}  # (pid, token) -> (key, n, claim, fulfil invoked)
    ended: dict[tuple[str, str], str] = {}
    claimed: defaultdict[int, list[tuple[int, str]]] = defaultdict(list)  # n -> (claim time, token)
    for fields in history:
        if fields[3] not in ("claim", "fulfill"):
            continue
        attempt = (fields[1], fields[6])
        if fields[3] == "claim":
            began[attempt] = (int(fields[4]), int(fields[0]))
            claimed[int(fields[4])].append((int(fields[0]), fields[6]))
        elif fields[3] == "fulfill" and fields[2] == "invoke" and attempt in began:
            n, at = began.pop(attempt)
            key = concurrency_key(n)
            if key in LIMITS:
                ran[attempt] = (key, n, at, int(fields[0]))
        elif fields[3] == "fulfill" and fields[2] == "ok":
            ended[attempt] = "committed"
        elif fields[3] == "fulfill" and fields[2] == "fail" and fields[6] not in committed:
            # Refused (LeaseLost), or the mount failed under a commit that did not stand
            # (StorageError): the holder outlived its lease (stopped, or its mount hung or went
            # away), and on a store that does not trust locks an expired holder's slot goes to
            # another job (FORMAT.md, "Limits"): by design, not a run past the limit.
            ran.pop(attempt, None)
    spans: defaultdict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for attempt, (key, n, at, end) in ran.items():
        if attempt[1] not in committed:
            # Another attempt claimed the same job while this one ran: the store took it over
            # because this holder's heartbeat had stopped (a stopped worker, a hung mount), so from
            # then on its slot was free. Its fulfil did not stand, whether or not it lived to say so.
            end = min([end] + [t for t, token in claimed[n] if at < t and token != attempt[1]])
        spans[key].append((at, end, f"job {n}, token {attempt[1]}, {ended.get(attempt, 'no end recorded')}"))
    worst, seen = 0, []
    for key, got in spans.items():
        events = sorted([(a, 1, what) for a, _, what in got] + [(b, -1, what) for _, b, what in got])
        running: set[str] = set()
        for _, step, what in events:
            if step > 0:
                running.add(what)
            else:
                running.discard(what)
            if len(running) - LIMITS[key] > worst:
                worst, seen = len(running) - LIMITS[key], sorted(running)
    return worst, seen


def _host(root: str) -> str:
    """The name of the mount a store's path goes through (the chaos's roots differ only there)."""
    return os.path.basename(os.path.dirname(os.path.dirname(root)))


def worker(root: str, history: str, lease: float, work: float) -> None:
    with JobStore(root, lease_duration=lease, backoff=lambda attempt: 0.0) as store, open(history, "a") as fh:
        while not os.path.exists(os.path.join(os.path.dirname(history), "stop")):
            job = store.pull_work(timeout=0.5)
            if job is None:
                continue
            # The attempt's number and the host (mount) it ran on: what to read when a job runs twice.
            _record(fh, "ok", "claim", job.request["n"], job.id, job.token, job.attempt, _host(root))
            time.sleep(random.uniform(0, work))  # the "work": kills and stops land in it
            _record(fh, "invoke", "fulfill", job.request["n"], job.id, job.token)
            try:
                job.fulfill(job.token)
            except LeaseLost as exc:
                _record(fh, "fail", "fulfill", job.request["n"], job.id, job.token, exc.reason)
                continue
            except StorageError as exc:  # the mount failed under it: the commit may or may not stand
                _record(fh, "fail", "fulfill", job.request["n"], job.id, job.token, f"storage-{exc.errno}")
                raise
            _record(fh, "ok", "fulfill", job.request["n"], job.id, job.token)


def runtime_worker(root: str, history: str, lease: float, work: float, mode: str) -> None:
    """A worker process that is an ``fsjobstore.Worker`` (two slots, in ``mode``): its handler
    commits the lease itself, so that the history records each fulfil exactly as it returned.
    Run in its own process group: the chaos signals the group, supervisor and children alike."""
    import threading

    from fsjobstore import JobContext, Worker

    stop_file = os.path.join(os.path.dirname(history), "stop")
    files: dict[int, Any] = {}

    def claimed(job: JobContext) -> Any:
        fh = files.get(os.getpid())
        if fh is None:  # one history file per process: the children of a supervisor too
            fh = files[os.getpid()] = open(f"{history}.{os.getpid()}.history", "a")  # noqa: SIM115
        _record(fh, "ok", "claim", job.request["n"], job.id, job.token)
        return fh

    def fulfil(fh: Any, job: JobContext) -> None:
        n = job.request["n"]
        _record(fh, "invoke", "fulfill", n, job.id, job.token)
        try:
            job.lease.fulfill(job.token)
        except LeaseLost as exc:
            _record(fh, "fail", "fulfill", n, job.id, job.token, exc.reason)
            return
        _record(fh, "ok", "fulfill", n, job.id, job.token)

    def handler(job: JobContext) -> None:
        fh = claimed(job)
        time.sleep(random.uniform(0, work))
        fulfil(fh, job)

    async def async_handler(job: JobContext) -> None:  # the same, as a task on the asyncio pool's loop
        import asyncio

        fh = claimed(job)
        await asyncio.sleep(random.uniform(0, work))
        fulfil(fh, job)

    with JobStore(root, lease_duration=lease, backoff=lambda attempt: 0.0) as store:
        chosen = async_handler if mode == "asyncio" else handler
        worker = Worker(store, {"default": chosen}, concurrency=2, mode=mode, grace=lease)  # type: ignore[arg-type]

        def watch() -> None:
            while not os.path.exists(stop_file):
                time.sleep(0.1)
            worker.stop()

        threading.Thread(target=watch, daemon=True).start()
        worker.run()


# == the checker ===============================================================================
def read_history(directory: str) -> list[list[str]]:
    lines = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".history"):
            with open(os.path.join(directory, name)) as fh:
                for line in fh:
                    if line.endswith("\n"):  # a process killed mid-write leaves a torn last line
                        lines.append(line.split())
    lines.sort(key=lambda f: int(f[0]))
    return lines


def check(root: str, history: list[list[str]], *, retention: bool = False, limits: bool = False) -> dict[str, Any]:
    first_claim: dict[str, int] = {}
    first_fulfil: dict[str, int] = {}
    for fields in history:  # in time order: the first of each is kept
        if fields[3] == "claim":
            first_claim.setdefault(fields[5], int(fields[0]))
        elif fields[3] == "fulfill" and fields[2] == "invoke":
            first_fulfil.setdefault(fields[5], int(fields[0]))
    invoked: set[int] = set()
    fulfil_invoked: set[str] = set()
    created: dict[str, int] = {}
    claims: Counter[str] = Counter()
    fulfil_ok: defaultdict[str, list[str]] = defaultdict(list)
    fulfil_lost = fulfil_storage = 0
    for fields in history:
        kind, op = fields[2], fields[3]
        if op == "create" and kind == "invoke":
            invoked.add(int(fields[4]))
        elif op == "create" and kind == "ok":
            created[fields[5]] = int(fields[4])
        elif op == "claim":
            claims[fields[5]] += 1
        elif op == "fulfill" and kind == "invoke":
            fulfil_invoked.add(fields[5])
        elif op == "fulfill" and kind == "ok":
            fulfil_ok[fields[5]].append(fields[6])
        elif op == "fulfill" and kind == "fail" and fields[7].startswith("storage-"):
            fulfil_storage += 1
        elif op == "fulfill" and kind == "fail":
            fulfil_lost += 1
    lost, unexpected, duplicates, wrong_value = [], [], [], []
    with JobStore(root) as store:
        store.recover()
        final = {}
        for name in os.listdir(os.path.join(root, "jobs", "fulfilled")):
            try:
                job = store.get(name[: -len(".json")])
            except CorruptJob as exc:  # quarantined by the store: not there, so lost below
                print(f"chaos: {exc}", file=sys.stderr)
                continue
            final[job.id] = job
        removed = 0
        for job_id, n in created.items():
            if job_id in final:
                continue
            if retention and n % 2 and job_id in fulfil_invoked:
                removed += 1  # fulfilled (or being fulfilled) and then removed by retention
                continue
            lost.append(job_id)
        for job_id, oks in fulfil_ok.items():
            if job_id not in final and len(oks) > 1:
                duplicates.append(job_id)  # removed since, but committed twice before
        leftovers = removal_leftovers(root, job_files(root)) if retention else []
        for job_id, job in final.items():
            if job.request["n"] not in invoked:
                unexpected.append(job_id)
            oks = fulfil_ok.get(job_id, [])
            if len(oks) > 1:
                duplicates.append(job_id)
            if oks and job.value != oks[0]:
                wrong_value.append(job_id)
        committed = {job.value for job in final.values() if isinstance(job.value, str)}
        over, over_seen = _over_limit(history, committed) if limits else (0, [])  # without --limits no job has a key
        early = [job_id for job_id, job in final.items() for parent in job.after
                 if job_id in first_claim and first_claim[job_id] < first_fulfil.get(parent, 1 << 63)]
        try:
            stats = store.statistics()
        except StorageError as exc:  # counted as a failure: the store could not say what is left
            print(f"chaos: statistics failed: {exc}", file=sys.stderr)
            stats = None
    return {
        "created_ok": len(created),
        "fulfilled": len(final),
        "lost": len(lost),
        "unexpected": len(unexpected),
        "duplicate_commits": len(duplicates) + len(wrong_value),
        "claims": sum(claims.values()),
        "repeated_executions": sum(n - 1 for n in claims.values() if n > 1),
        "fulfils_refused_lease_lost": fulfil_lost,
        "fulfils_failed_storage": fulfil_storage,
        "left_pending_or_active": -1 if stats is None else
        stats.pending + stats.active + stats.scheduled + stats.deferred,
        "early_children": len(early),
        "over_limit": over,
        "removed_by_retention": removed,
        "removal_leftovers": len(leftovers),
        "failed": -1 if stats is None else stats.failed,
        "examples": {"early_children": early[:5], "over_limit": over_seen,
                     "lost": lost[:5], "unexpected": unexpected[:5], "duplicates": (duplicates + wrong_value)[:5],
                     "removal_leftovers": leftovers[:5]},
    }


# == the controller ============================================================================
def run(*, jobs: int, workers: int, kills: int, lease: float, seed: int, workdir: str | None = None,
        max_seconds: float = 3600, runtime: str | None = None, roots: list[str] | None = None,
        extra: Callable[[random.Random | None], object] | None = None, retention: bool = False,
        relations: bool = False, limits: bool = False, producers: int = 1, chosen: bool = False) -> dict[str, Any]:
    """``runtime``: None for plain pull/fulfil loops, or "processes"/"threads" for workers that
    are ``fsjobstore.Worker`` runs (signals then go to each worker's whole process group).
    ``roots``: the store as each "host" sees it (one path per mount of a shared filesystem):
    producer k of ``producers`` uses root k (modulo their number), workers take turns; histories
    stay in ``workdir``. ``chosen``: producers give every seventh job an id of their own.
    ``extra``: called at every step with the run's random generator, for chaos of its own
    (stopping or killing a mount's client, say), and with None when the chaos is over, to undo
    what it did; also called while a killed worker is reaped, since a process blocked in a
    hung mount cannot die until the mount comes back."""
    rng = random.Random(seed)
    base = workdir or tempfile.mkdtemp(prefix="fsjs-chaos-")
    if any(name.endswith(".history") for name in os.listdir(base)):
        # The histories are appended to: another run's would be checked as this one's.
        raise SystemExit(f"{base} holds another run's histories: give an empty --workdir")
    paths = roots or [os.path.join(base, "store")]
    root = paths[0]
    JobStore(root).close()
    turn = 0

    def next_root() -> str:
        nonlocal turn
        turn += 1
        return paths[turn % len(paths)]
    me = os.path.abspath(__file__)
    incarnation = 0

    def spawn(role: str, *args: object, where: str | None = None) -> subprocess.Popen[bytes]:
        nonlocal incarnation
        incarnation += 1
        history = os.path.join(base, f"{role}-{incarnation:05d}.history")
        where = where or next_root()
        if role == "worker" and runtime is not None:
            return subprocess.Popen([sys.executable, me, "rworker", where, history, *map(str, args), runtime],
                                    start_new_session=True)
        return subprocess.Popen([sys.executable, me, role, where, history, *map(str, args)])

    def signal_worker(proc: subprocess.Popen[bytes], sig: int) -> None:
        if runtime is None:
            proc.send_signal(sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

    # Expected run time is kills x 275 ms. Creates come twice as fast as that, so a backlog
    # builds; the work takes as long as keeps every worker busy for the whole run, so that
    # kills and stops land in claims and commits rather than in idle waits.
    expected = max(1.0, kills * 0.275)
    rate = jobs / (expected * 0.5)
    work = min(1.0, max(0.002, 2 * workers * expected / jobs))
    prods = [spawn("producer", jobs, rate / producers, int(retention), int(relations), int(limits), k, producers,
                   int(chosen), where=paths[k % len(paths)]) for k in range(producers)]
    procs = [spawn("worker", lease, work) for _ in range(workers)]
    def reap(proc: subprocess.Popen[bytes]) -> None:
        while True:
            try:
                proc.wait(0.25)
                return
            except subprocess.TimeoutExpired:
                if extra is not None:
                    extra(rng)

    restarts = 0

    def restart_the_dead() -> None:
        """Start again a worker that exited by itself (an error: on the two-host bed, its mount
        killed under it), as a supervisor would; counted, and its traceback is on stderr."""
        nonlocal restarts
        for i, p in enumerate(procs):
            if p.poll() is not None and i not in stopped:
                procs[i] = spawn("worker", lease, work)
                restarts += 1

    stopped: dict[int, float] = {}  # index -> when to SIGCONT
    done_kills = done_stops = 0
    started = time.monotonic()
    while (done_kills < kills or any(p.poll() is None for p in prods)) and time.monotonic() - started < max_seconds:
        time.sleep(rng.uniform(0.05, 0.5))
        if extra is not None:
            extra(rng)
        now = time.monotonic()
        for i, until in list(stopped.items()):
            if now >= until:
                signal_worker(procs[i], signal.SIGCONT)
                del stopped[i]
        restart_the_dead()
        i = rng.randrange(workers)
        if i in stopped:
            continue
        if rng.random() < 0.1 and len(stopped) < workers - 1:
            signal_worker(procs[i], signal.SIGSTOP)  # past its lease: others must take its job over
            stopped[i] = now + lease * rng.uniform(1.5, 2.5)
            done_stops += 1
        else:
            signal_worker(procs[i], signal.SIGKILL)
            reap(procs[i])
            procs[i] = spawn("worker", lease, work)
            done_kills += 1
    for i in stopped:
        signal_worker(procs[i], signal.SIGCONT)
    if extra is not None:
        extra(None)
    for prod in prods:
        prod.wait()
    # Let the survivors drain what is left, then stop them: for as long as what is left goes down
    # (a chain of children, each made after the one before, drains one job at a time: with three
    # producers one of them makes every job of the chain), until 120 s pass with no progress.
    deadline = time.monotonic() + 120
    fewest = None
    with JobStore(root) as store:
        while time.monotonic() < deadline:
            try:
                stats = store.statistics()
            except StorageError as exc:  # a network filesystem's EIO for a directory mid-heal: look again
                print(f"chaos: statistics failed while draining: {exc}", file=sys.stderr)
                time.sleep(1.0)
                continue
            left = stats.pending + stats.active + stats.scheduled + stats.deferred
            if left == 0:
                break
            if fewest is None or left < fewest:
                fewest, deadline = left, time.monotonic() + 120
            restart_the_dead()
            time.sleep(0.2)
    open(os.path.join(base, "stop"), "w").close()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            signal_worker(p, signal.SIGKILL)
            p.wait()
    report = check(root, read_history(base), retention=retention, limits=limits)
    report.update(kills=done_kills, stops=done_stops, restarts=restarts, workers=workers,
                  seconds=round(time.monotonic() - started, 1),
                  producer_exit=max(abs(p.returncode) for p in prods), runtime=runtime or "pull loops")
    return report


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("producer", "worker", "rworker"):
        role, root, history, *rest = sys.argv[1:]
        if role == "producer":
            producer(root, history, int(rest[0]), float(rest[1]), rest[2] == "1", rest[3] == "1", rest[4] == "1",
                     int(rest[5]), int(rest[6]), rest[7] == "1")
        elif role == "worker":
            worker(root, history, float(rest[0]), float(rest[1]))
        else:
            runtime_worker(root, history, float(rest[0]), float(rest[1]), rest[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runtime", choices=["processes", "threads", "asyncio"], default=None,
                        help="workers are fsjobstore.Worker runs in this mode (default: plain pull loops)")
    parser.add_argument("--retention", action="store_true",
                        help="odd-numbered jobs are made with retain=0: removed while the chaos runs")
    parser.add_argument("--relations", action="store_true",
                        help="every third job is made after the one before it, every fifth with a unique key")
    parser.add_argument("--limits", action="store_true",
                        help="a job in four with a concurrency key (a cap of 2 or 1), one in four with a key "
                             "limited by a rate alone")
    parser.add_argument("--producers", type=int, default=1, help="producers, each making its share of the jobs")
    parser.add_argument("--chosen", action="store_true",
                        help="every seventh job has an id of its own, its create retried until it stands")
    args = parser.parse_args()
    report = run(jobs=args.jobs, workers=args.workers, kills=args.kills, lease=args.lease, seed=args.seed,
                 runtime=args.runtime, retention=args.retention, relations=args.relations, limits=args.limits,
                 producers=args.producers, chosen=args.chosen)
    print(json.dumps(report, indent=2))
    bad = (report["lost"] or report["unexpected"] or report["duplicate_commits"] or report["left_pending_or_active"]
           or report["removal_leftovers"] or report["early_children"] or report["over_limit"])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
