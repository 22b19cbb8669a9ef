"""fsjobstore across "hosts": the loopback GlusterFS bed's mounts (tests/distfs/gluster.py), two of
one brick, or with --replicated three of a replica-3 volume. Needs root, FUSE and the bed's packages.

    bash tests/distfs/install.sh && python bench/multihost.py          # about 4 minutes
    python bench/multihost.py --jobs 400 --rounds 1 --wakeups 40       # a quicker run
    python bench/multihost.py --replicated                             # R1-R3, about 8 minutes
    python bench/multihost.py --replicated --floor --jobs 1000 --rounds 5   # R1's floor, about 9 minutes

M1 drain across two mounts: jobs created through mount A, drained by one worker process on A and
   one on B (durable=False, empty results), against the mount's raw rate for what a job costs at
   least (create+write+close+rename, one process), measured just before each drain; 3 rounds,
   the median ratio is the verdict. Target (issue 11): at least 40% of raw.
M2 cross-host wake-up: an idle worker on B, one job created through A every 150 ms; the time from
   the create to the worker holding it, p50/p99, with the doorbell on (the default on network
   filesystems) and off (only the poll_interval rescan). Target: p50 <= 100 ms.
M3 the idle worker's CPU: user+system seconds of a worker waiting on B for 20 s with nothing to
   do, doorbell on and off, as % of one core. Target: under 2%.

With --replicated, on a replica-3 volume (three bricks, one glusterd: tests/distfs/replica.py)
mounted three times, the producer on A and a worker on each of A, B and C:
R1 drain / raw as M1 (goal: at least 0.7x); R2 cross-host wake-up A to B as M2, doorbell on
   (goal: p50 at most 10 ms);
R3 the drain with every brick up, with one brick killed, and from the moment it is started again
   while it heals; then how long the heal took.
R4 (with --bell-polls 0.025,0.01,0.005,0.0025) what a shorter doorbell poll buys: for each, the R2
   wake-up and the CPU of an idle worker on B over --idle seconds, as M3 (target under 2%).
   The poll is the store's constant (25 ms), set in the bench's own processes only.
R1 floor (with --floor) what R1's ratio can reach at all: bare workers, no fsjobstore, one on each
   mount, making only the calls a job needs in the store's design, level by level (role_floor:
   bare, fenced, format, looks), against the raw rate and the store's drain (as it runs, and
   with its doorbell off: store-nobell), in each of --rounds rounds, the drains' order turned by
   one each round; then each one's median ratio.

Figures are this machine's, from one run; each line names what it measured.
"""

from __future__ import annotations

import argparse
import os
import resource
import stat
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

from distfs import gluster, replica  # noqa: E402

from fsjobstore import JobStore  # noqa: E402


# == roles (run as child processes so a hung mount can only hang them) ==========================
def role_drain(root: str, out: str, bells: str = "default") -> None:
    """Drain the store at ``root``; ``bells`` "off": with its doorbell off (which a network
    filesystem's default rings after every commit, at most once per GAP a process)."""
    n = 0
    with JobStore(root, durable=False, doorbell=False if bells == "off" else None) as store:
        started = time.monotonic()
        while (lease := store.pull_work(timeout=0)) is not None:
            lease.fulfill(b"")
            n += 1
        Path(out).write_text(f"{n} {time.monotonic() - started:.6f}\n")


FLOOR_LEVELS = ("bare", "fenced", "format", "looks")


def role_floor(root: str, out: str, level: str, part: int, parts: int, jobs: int) -> None:
    """R1's floor: what a drained job costs at least in the store's design, in bare calls with no
    fsjobstore, made as cheaply as they can be. ``level`` (each adds to the one before): "bare",
    the claim's rename, one descriptor opened on the claimed file (open, fstat, read, then the
    result written through it at the file's end, close) and a publish that refuses to replace
    (link and unlink: GlusterFS has no renameat2); "fenced", the fence's rename before the result;
    "format", the finished index's entry (an empty file: what FORMAT.md asks of a commit on a
    network filesystem); "looks", the store's three looks at a commit that find nothing (a cancel
    request, notification targets, waiting children; not the paused-queue look). Worker ``part``
    of ``parts`` takes only its own share (jobs ``i`` with ``i % parts == part``), so no claim is
    ever lost to another; it lists again while its mount's listing lags behind the creates."""
    depth, pending = FLOOR_LEVELS.index(level), f"{root}/pending"
    me, n = os.getpid(), 0
    mine_left = {f"{i}.json" for i in range(part, jobs, parts)}
    started = time.monotonic()
    while mine_left and time.monotonic() - started < 300:
        names = sorted(mine_left.intersection(os.listdir(pending)))
        if not names:
            time.sleep(0.01)
            continue
        mine_left.difference_update(names)
        n += _floor_jobs(root, names, me, depth)
    Path(out).write_text(f"{n} {time.monotonic() - started:.6f}\n")


def _floor_jobs(root: str, names: list[str], me: int, depth: int) -> int:
    """``role_floor``'s calls for each of ``names``, to ``depth``; how many were done."""
    pending, active, done = f"{root}/pending", f"{root}/active", f"{root}/done"
    n = 0
    for name in names:
        mine = f"{active}/{name}.{me}"
        os.rename(f"{pending}/{name}", mine)
        fd = os.open(mine, os.O_RDWR | os.O_NOFOLLOW)
        size = os.fstat(fd).st_size
        os.read(fd, size + 1)
        if depth >= 3:
            for look in ("cancel", "targets", "deps"):
                os.path.lexists(f"{root}/{look}-{name}")
        if depth >= 1:
            os.rename(mine, f"{mine}.commit")
            mine = f"{mine}.commit"
        os.pwrite(fd, b'{"result":"fulfilled"}\n', size)
        os.close(fd)
        if depth >= 2:
            os.mknod(f"{done}/{name}.entry", 0o600 | stat.S_IFREG)
        os.link(mine, f"{done}/{name}")
        os.unlink(mine)
        n += 1
    return n


def bell_poll() -> None:
    """R4: this process's doorbell poll (and ring gap) from FSJS_BENCH_BELL_POLL, if set."""
    poll = os.environ.get("FSJS_BENCH_BELL_POLL")
    if poll:
        from fsjobstore._core import _doorbell
        from fsjobstore._store import _waiting
        _waiting.DOORBELL_POLL = _doorbell.GAP = float(poll)


def role_waiter(root: str, out: str, count: int, doorbell: str) -> None:
    bell_poll()
    with JobStore(root, durable=False, doorbell=doorbell == "on") as store:
        store.pull_work()
        with open(out, "a") as fh:
            fh.write(f"ready {time.monotonic():.6f}\n")
            fh.flush()
            for _ in range(count):
                lease = store.pull_work(timeout=30)
                if lease is None:
                    fh.write("timeout\n")
                    return
                fh.write(f"got {time.monotonic():.6f} {lease.request['made']}\n")
                fh.flush()
                lease.fulfill(b"")


def role_idle(root: str, out: str, seconds: float, doorbell: str) -> None:
    bell_poll()
    with JobStore(root, durable=False, doorbell=doorbell == "on") as store:
        store.pull_work()
        before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        store.pull_work(timeout=seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        Path(out).write_text(f"{cpu:.6f} {time.monotonic() - started:.6f}\n")


def child(*args: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "role", *map(str, args)])


# == the measurements ===========================================================================
def raw_rate(directory: Path, n: int) -> float:
    """create+write+close+rename through one mount, one process: the least a job costs."""
    src, dst = directory / "raw-src", directory / "raw-dst"
    src.mkdir()
    dst.mkdir()
    started = time.perf_counter()
    for i in range(n):
        fd = os.open(src / f"{i}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b'{"n": 1}\n')
        os.close(fd)
        os.rename(src / f"{i}.json", dst / f"{i}.json")
    return n / (time.perf_counter() - started)


def drain(a: Path, b: Path | list[Path], scratch: Path, jobs: int, name: str = "m1",
          bells: str = "default") -> tuple[float, int]:
    """M1: (jobs/s, jobs drained) by one worker on each mount (``a``, then ``b``: one mount or
    several), in a fresh store ``name``, its jobs created through ``a``; ``bells`` as
    ``role_drain``'s."""
    with JobStore(a / name, durable=False) as store:
        for i in range(jobs):
            store.create({"i": i})
    seconds, done = timed_children("drain", [a, *(b if isinstance(b, list) else [b])], name, scratch,
                                   lambda k: (bells,))
    return done / seconds, done


def timed_children(role: str, hosts: list[Path], name: str, scratch: Path,
                   extra: Callable[[int], tuple[object, ...]] = lambda k: ()) -> tuple[float, int]:
    """One ``role`` child on each of ``hosts``, all at once, on ``name`` there (then its out file in
    ``scratch`` and ``extra(k)`` for the k-th): seconds until the last ended, and the jobs they say
    they did."""
    outs = [scratch / f"{name}-{k}.out" for k in range(len(hosts))]
    started = time.monotonic()
    procs = [child(role, host / name, out, *extra(k)) for k, (host, out) in enumerate(zip(hosts, outs, strict=True))]
    for p in procs:
        p.wait(600)
    seconds = time.monotonic() - started
    return seconds, sum(int(o.read_text().split()[0]) for o in outs)


def floor_drain(a: Path, others: list[Path], scratch: Path, jobs: int, name: str, level: str) -> float:
    """R1's floor (``role_floor``): jobs/s, one bare worker on each mount, the job files made
    through ``a`` as the raw rate makes them."""
    (a / name).mkdir()
    for sub in ("pending", "active", "done"):
        (a / name / sub).mkdir()
    for i in range(jobs):
        tmp = a / name / f"{i}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b'{"format":3,"id":"%d","request":{"i":%d}}\n' % (i, i))
        os.close(fd)
        os.rename(tmp, a / name / "pending" / f"{i}.json")
    hosts = [a, *others]
    seconds, done = timed_children("floor", hosts, name, scratch, lambda k: (level, k, len(hosts), jobs))
    if done != jobs:
        raise SystemExit(f"the floor's workers drained {done} of {jobs} jobs")
    return done / seconds


def floor_rounds(a: Path, others: list[Path], scratch: Path, jobs: int, rounds: int) -> None:
    """R1's floor at each level against the raw rate and the store's drain, in each round. The
    drains' order turns by one each round (round 1: bare first, the store last; round 2: fenced
    first, bare last; ...), so none always runs on the busiest volume; the raw rate comes first."""
    order = [*FLOOR_LEVELS, "store", "store-nobell"]
    got: dict[str, list[float]] = {name: [] for name in order}
    for k in range(rounds):
        (a / f"floor-raw{k}").mkdir()
        raw = raw_rate(a / f"floor-raw{k}", jobs)
        turn = order[k % len(order):] + order[:k % len(order)]
        rates = {}
        for name in turn:
            if name.startswith("store"):
                rates[name] = drain(a, others, scratch, jobs, f"floor-{name}{k}",
                                    "off" if name == "store-nobell" else "default")[0]
            else:
                rates[name] = floor_drain(a, others, scratch, jobs, f"floor-{name}{k}", name)
            got[name].append(rates[name] / raw)
        shown = "; ".join(f"{name} {rates[name]:,.0f}/s = {rates[name] / raw:.2f}x" for name in turn)
        print(f"R1 floor round {k + 1}: raw {raw:,.0f}/s; in this order: {shown}", flush=True)
    print("R1 floor, median ratio to raw over the rounds: "
          + "; ".join(f"{name} {statistics.median(ratios):.2f}x" for name, ratios in got.items())
          + " (goal >= 0.70)", flush=True)


def drain_rounds(name: str, a: Path, others: Path | list[Path], scratch: Path, jobs: int, rounds: int,
                 workers: str) -> float:
    """M1 or R1: ``rounds`` times the mount's raw rate, then a drain; the median round's ratio.
    The raw rate moves between runs (297-543/s seen on this machine on one brick), so each round
    measures it right before its drain."""
    ratios = []
    for k in range(rounds):
        (a / f"raw{k}").mkdir()
        raw = raw_rate(a / f"raw{k}", jobs)
        rate, done = drain(a, others, scratch, jobs, f"{name.lower()}-{k}")
        ratios.append(rate / raw)
        print(f"{name} round {k + 1}: drain, {workers}, durable=False: {rate:,.0f} jobs/s ({done} jobs); "
              f"raw create+write+close+rename through one mount just before: {raw:,.0f}/s; ratio {rate / raw:.2f}",
              flush=True)
    return statistics.median(ratios)


def wakeups(a: Path, b: Path, scratch: Path, count: int, doorbell: str) -> list[float]:
    """M2: milliseconds from a create through A to the worker on B holding the job."""
    store_a, store_b = a / f"m2-{doorbell}", b / f"m2-{doorbell}"
    JobStore(store_a, durable=False).close()
    out = scratch / f"m2-{doorbell}.out"
    waiter = child("waiter", store_b, out, count, doorbell)
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().startswith("ready")):
        if time.monotonic() > deadline:
            raise SystemExit("the waiter on B did not start")
        time.sleep(0.05)
    time.sleep(1.0)
    with JobStore(store_a, durable=False) as producer:
        for _ in range(count):
            producer.create({"made": time.monotonic()})
            time.sleep(0.15)
    waiter.wait(120)
    got = [line.split() for line in out.read_text().splitlines() if line.startswith("got")]
    if len(got) != count:
        raise SystemExit(f"the waiter got {len(got)} of {count} jobs")
    return sorted((float(at) - float(made)) * 1000 for _, at, made in got)


def idle_cpu(b: Path, scratch: Path, seconds: float, doorbell: str) -> float:
    """M3: % of one core an idle worker on B uses."""
    root = b / f"m3-{doorbell}"
    JobStore(root, durable=False).close()
    out = scratch / f"m3-{doorbell}.out"
    child("idle", root, out, seconds, doorbell).wait(seconds + 60)
    cpu, wall = map(float, out.read_text().split())
    return 100 * cpu / wall


def percentile(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "role":
        name, *args = sys.argv[2:]
        if name == "drain":
            role_drain(*args)
        elif name == "waiter":
            role_waiter(args[0], args[1], int(args[2]), args[3])
        elif name == "idle":
            role_idle(args[0], args[1], float(args[2]), args[3])
        elif name == "floor":
            role_floor(args[0], args[1], args[2], int(args[3]), int(args[4]), int(args[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per drain for M1, R1, R3 and R1's floor "
                                                               "(default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of M1, R1 or R1's floor (default 3)")
    parser.add_argument("--wakeups", type=int, default=100, help="jobs for M2, per doorbell setting (default 100)")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds for M3 (default 20)")
    parser.add_argument("--replicated", action="store_true",
                        help="R1-R3 on a replica-3 volume (three bricks, three mounts) instead of M1-M3")
    parser.add_argument("--bell-polls", metavar="S,S,...",
                        help="with --replicated: R4 only, the wake-up and idle CPU at each doorbell poll")
    parser.add_argument("--floor", action="store_true",
                        help="with --replicated: R1's floor only: bare workers making only the calls a job needs "
                             "in the store's design (levels bare, fenced, format, looks), against the raw rate and "
                             "the store's drain, with its doorbell on and off")
    args = parser.parse_args()
    reason = gluster.available()
    if reason is not None:
        print(f"the GlusterFS bed is unavailable: {reason}", file=sys.stderr)
        return 2
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"fsjs-multihost-{os.getpid()}"
    scratch.mkdir()
    if args.replicated:
        return replicated(args, scratch)
    with gluster.GlusterBed() as bed:
        a, b = bed.mount("a").path / "bench", bed.mount("b").path / "bench"
        a.mkdir()
        time.sleep(1.5)
        ratio = drain_rounds("M1", a, b, scratch, args.jobs, args.rounds, "one worker on each mount")
        print(f"M1 drain / raw, median of {args.rounds} rounds: {ratio:.2f} "
              f"(target >= 0.40: {'met' if ratio >= 0.40 else 'NOT met'})")
        for doorbell in ("on", "off"):
            ms = wakeups(a, b, scratch, args.wakeups, doorbell)
            p50 = statistics.median(ms)
            verdict = f" (target p50 <= 100 ms: {'met' if p50 <= 100 else 'NOT met'})" if doorbell == "on" else ""
            print(f"M2 cross-host wake-up, doorbell {doorbell}: p50 {p50:.0f} ms, p99 {percentile(ms, 0.99):.0f} ms, "
                  f"max {ms[-1]:.0f} ms over {len(ms)} jobs{verdict}")
        for doorbell in ("on", "off"):
            cpu = idle_cpu(b, scratch, args.idle, doorbell)
            verdict = f" (target < 2%: {'met' if cpu < 2 else 'NOT met'})" if doorbell == "on" else ""
            print(f"M3 idle worker on B for {args.idle:.0f} s, doorbell {doorbell}: {cpu:.2f}% of a core{verdict}")
    return 0


def replicated(args: argparse.Namespace, scratch: Path) -> int:
    """R1-R3: the replica-3 volume of tests/distfs/replica.py, mounted three times."""
    with gluster.GlusterBed() as bed:
        volume = replica.Replicated(bed)
        a, b, c = (bed.mount(n, volume=volume.name).path / "bench" for n in "abc")
        a.mkdir()
        time.sleep(1.5)
        if args.bell_polls:
            return bell_polls(a, b, scratch, args)
        if args.floor:
            floor_rounds(a, [b, c], scratch, args.jobs, args.rounds)
            return 0
        ratio = drain_rounds("R1", a, [b, c], scratch, args.jobs, args.rounds, "one worker on each of 3 mounts")
        print(f"R1 drain / raw, median of {args.rounds} rounds: {ratio:.2f} "
              f"(goal >= 0.70: {'met' if ratio >= 0.70 else 'NOT met'})", flush=True)
        ms = wakeups(a, b, scratch, args.wakeups, "on")
        p50 = statistics.median(ms)
        print(f"R2 cross-host wake-up (A to B), doorbell on: p50 {p50:.0f} ms, p99 {percentile(ms, 0.99):.0f} ms, "
              f"max {ms[-1]:.0f} ms over {len(ms)} jobs (goal p50 <= 10 ms: {'met' if p50 <= 10 else 'NOT met'})",
              flush=True)
        rate, done = drain(a, [b, c], scratch, args.jobs, "r3-all-up")
        print(f"R3 drain with every brick up: {rate:,.0f} jobs/s ({done} jobs)", flush=True)
        volume.kill_brick(2)
        rate, done = drain(a, [b, c], scratch, args.jobs, "r3-down")
        print(f"R3 drain with brick 2 down: {rate:,.0f} jobs/s ({done} jobs)", flush=True)
        volume.start_bricks()
        healing = time.monotonic()
        rate, done = drain(a, [b, c], scratch, args.jobs, "r3-healing")
        state = volume.heal_state()
        print(f"R3 drain from the moment brick 2 is started again, while it heals: {rate:,.0f} jobs/s ({done} jobs); "
              f"entries left to heal when it ended: {list(state.pending)}", flush=True)
        state = volume.wait_healed(600)
        print(f"R3 healed {time.monotonic() - healing:.0f} s after the brick started again: {state}")
    return 0


def bell_polls(a: Path, b: Path, scratch: Path, args: argparse.Namespace) -> int:
    for poll in args.bell_polls.split(","):
        os.environ["FSJS_BENCH_BELL_POLL"] = poll
        bell_poll()  # the producer's ring gap, in this process
        sub_a, sub_b, sub_scratch = a / f"r4-{poll}", b / f"r4-{poll}", scratch / f"r4-{poll}"
        sub_a.mkdir()
        sub_scratch.mkdir()
        ms = wakeups(sub_a, sub_b, sub_scratch, args.wakeups, "on")
        cpu = idle_cpu(sub_b, sub_scratch, args.idle, "on")
        print(f"R4 doorbell poll {float(poll) * 1000:g} ms: wake-up p50 {statistics.median(ms):.0f} ms, "
              f"p99 {percentile(ms, 0.99):.0f} ms over {len(ms)} jobs; idle worker on B for {args.idle:.0f} s: "
              f"{cpu:.2f}% of a core", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
