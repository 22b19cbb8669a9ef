"""Power loss: record every filesystem call of a run, then rebuild each state a power cut could
leave behind and check that the store recovers from it with nothing acknowledged lost.

The crash model (pessimistic within what journaling filesystems such as ext4, xfs and btrfs
promise; FORMAT.md, "Durability", states it as our assumption):

* **Names.** Creates, renames, links, unlinks, mkdirs and rmdirs reach the disk in program
  order, as a prefix of the sequence. A rename is atomic (it is one journal entry). Only a
  *directory* fsync guarantees that the prefix up to it survives; a file fsync does not.
  At a cut after call k, any prefix between the last directory fsync and k may have survived.
* **Data.** Bytes written since a file's last fsync may all be lost, be torn (half of them
  survive), or all survive; each state is checked with each of the three.

Usage: ``python tests/powerloss.py`` runs the workload and checks every state (JSON report);
``python tests/powerloss.py --not-durable`` does the same for a store made with durable=False,
where recent work may be lost but the store must always open and say what it lost.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from faultkit import Ctx, _dead_owner, check_store, drain_survivors, full_cycle, hooked
from internals import die

from fsjobstore import JobStore
from fsjobstore._core import _counters

META = ("create", "rename", "link", "unlink", "mkdir", "rmdir")


@dataclass
class Recorder:
    """A _syscalls hook that logs the run in the terms of the crash model above."""

    root: str
    log: list[tuple[Any, ...]] = field(default_factory=list)
    fds: dict[int, tuple[str, bool, int]] = field(default_factory=dict)  # fd -> (path, is_dir, offset)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _creating: dict[int, bool] = field(default_factory=dict)

    def mine(self, path: object) -> bool:
        return isinstance(path, str) and (path == self.root or path.startswith(self.root + os.sep))

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "open":
            # Set or cleared on every open: an open that fails never reaches after(), and its
            # flag must not make this thread's next open (a directory's, to fsync it) a create.
            self._creating[threading.get_ident()] = bool(
                self.mine(args[0]) and args[1] & os.O_CREAT and not os.path.lexists(args[0]))

    def after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        with self.lock:
            self._after(op, args, result)

    def _after(self, op: str, args: tuple[Any, ...], result: Any) -> None:
        if op == "open":
            path, flags = args[0], args[1]
            if not self.mine(path):
                return
            is_dir = bool(flags & getattr(os, "O_DIRECTORY", 0))
            self.fds[result] = (path, is_dir, 0)
            if self._creating.pop(threading.get_ident(), False):
                self.log.append(("create", path))
        elif op == "close":
            self.fds.pop(args[0], None)
        elif op == "write" and args[0] in self.fds:
            fd, data = args[0], bytes(args[1])
            path, is_dir, pos = self.fds[fd]
            offset = args[2] if len(args) > 2 else pos
            written = data[:result]
            self.log.append(("write", path, offset, written))
            if len(args) <= 2:
                self.fds[fd] = (path, is_dir, pos + result)
        elif op == "truncate" and args[0] in self.fds:
            self.log.append(("truncate", self.fds[args[0]][0], args[1]))
        elif op == "fsync" and args[0] in self.fds:
            path, is_dir, _ = self.fds[args[0]]
            self.log.append(("fsync_dir" if is_dir else "fsync_file", path))
        elif op in ("rename", "link") and self.mine(args[0]):
            self.log.append((op, args[0], args[1]))
        elif op in ("unlink", "mkdir", "rmdir") and self.mine(args[0]):
            self.log.append((op, args[0]))
        elif op == "mknod" and self.mine(args[0]):
            self.log.append(("create", args[0]))  # an empty file, made in one call

    def ack(self, kind: str, job_id: str) -> None:
        with self.lock:
            self.log.append(("ack", kind, job_id))


# == the model's file system =======================================================================
@dataclass
class Inode:
    durable: bytes = b""  # as of the last fsync
    current: bytes = b""

    def write(self, offset: int, data: bytes) -> None:
        buf = bytearray(self.current)
        if len(buf) < offset:
            buf.extend(b"\0" * (offset - len(buf)))
        buf[offset:offset + len(data)] = data
        self.current = bytes(buf)


@dataclass
class Snapshot:
    dirs: set[str]
    names: dict[str, int]  # path -> inode number
    inodes: dict[int, bytes]


def snapshot(root: str) -> Snapshot:
    dirs, names, inodes = {root}, {}, {}
    by_ino: dict[tuple[int, int], int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirs.update(os.path.join(dirpath, d) for d in dirnames)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                continue
            key = (st.st_dev, st.st_ino)
            if key not in by_ino:
                by_ino[key] = len(by_ino) + 1
                with open(path, "rb") as fh:
                    inodes[by_ino[key]] = fh.read()
            names[path] = by_ino[key]
    return Snapshot(dirs, names, inodes)


def crash_states(snap: Snapshot, log: list[tuple[Any, ...]]) -> Any:
    """Yield (k, meta_prefix, data_mode) for every state the model allows at every cut k."""
    meta_seen = 0
    floor = 0
    for k in range(len(log) + 1):
        if k > 0:
            entry = log[k - 1]
            if entry[0] in META:
                meta_seen += 1
            elif entry[0] == "fsync_dir":
                floor = meta_seen
        for prefix in range(floor, meta_seen + 1):
            for mode in ("lost", "torn", "full"):
                yield k, prefix, mode


def materialize(snap: Snapshot, log: list[tuple[Any, ...]], k: int, prefix: int, mode: str, dest: str,
                old_root: str) -> None:
    # Two views of the names: ``live``, every name operation the program made (which inode a
    # write, truncate or fsync reached), and ``names``, the surviving prefix (what the disk
    # links). A rename that did not survive still moved nothing: the data written through its
    # new name is in the inode the old name links, as on a real disk.
    dirs, live_dirs = set(snap.dirs), set(snap.dirs)
    names, live = dict(snap.names), dict(snap.names)
    inodes = {n: Inode(d, d) for n, d in snap.inodes.items()}
    next_ino = max(inodes, default=0) + 1
    applied = 0
    for entry in log[:k]:
        op = entry[0]
        if op in META:
            ino = None
            if op == "create":
                ino = next_ino  # a create that did not survive made an inode no name links
                inodes[ino] = Inode()
                next_ino += 1
            _apply(entry, live, live_dirs, ino)
            if applied < prefix:
                _apply(entry, names, dirs, ino)
            applied += 1
        elif op == "write":
            ino = live.get(entry[1])
            if ino is not None:
                inodes[ino].write(entry[2], entry[3])
        elif op == "truncate":
            ino = live.get(entry[1])
            if ino is not None:
                inodes[ino].current = inodes[ino].current[:entry[2]]
        elif op == "fsync_file":
            ino = live.get(entry[1])
            if ino is not None:
                inodes[ino].durable = inodes[ino].current
    os.makedirs(dest)
    for d in sorted(dirs, key=len):
        os.makedirs(_rebase(d, old_root, dest), exist_ok=True)
    first_path: dict[int, str] = {}
    for path, ino in sorted(names.items()):
        target = _rebase(path, old_root, dest)
        if not os.path.isdir(os.path.dirname(target)):
            continue  # its directory did not survive
        if ino in first_path:
            os.link(first_path[ino], target)
            continue
        node = inodes[ino]
        if mode == "full" or node.current == node.durable:
            data = node.current
        elif mode == "lost":
            data = node.durable
        else:
            data = node.current[: max(len(node.durable), len(node.current) // 2)]
        with open(target, "wb") as fh:
            fh.write(data)
        os.chmod(target, 0o600)
        first_path[ino] = target
    for d in dirs:
        os.chmod(_rebase(d, old_root, dest), 0o700)


def _apply(entry: tuple[Any, ...], names: dict[str, int], dirs: set[str], created: int | None) -> None:
    """One name operation on one view of the names (``created``: the inode a create made)."""
    op = entry[0]
    if op == "create":
        assert created is not None
        names[entry[1]] = created
    elif op == "rename":
        if entry[1] in names:
            names[entry[2]] = names.pop(entry[1])
        elif entry[1] in dirs:  # a directory moved (quarantine): move its subtree
            _move_dir(dirs, names, entry[1], entry[2])
    elif op == "link":
        if entry[1] in names:
            names[entry[2]] = names[entry[1]]
    elif op == "unlink":
        names.pop(entry[1], None)
    elif op == "mkdir":
        dirs.add(entry[1])
    elif op == "rmdir":
        dirs.discard(entry[1])


def _move_dir(dirs: set[str], names: dict[str, int], src: str, dst: str) -> None:
    for d in [d for d in dirs if d == src or d.startswith(src + os.sep)]:
        dirs.discard(d)
        dirs.add(dst + d[len(src):])
    for p in [p for p in names if p.startswith(src + os.sep)]:
        names[dst + p[len(src):]] = names.pop(p)


def _rebase(path: str, old_root: str, new_root: str) -> str:
    return new_root + path[len(old_root):]


# == the workload and the check ===================================================================
def workload(root: str) -> tuple[Snapshot, Recorder]:
    # The counters' thread writes a delta about a second after a count: on a loaded machine that
    # fell inside the recording, at no fixed call. The run writes its one delta at a fixed point.
    flush_every, _counters.FLUSH_EVERY = _counters.FLUSH_EVERY, 3600.0
    try:
        return _workload(root)
    finally:
        _counters.FLUSH_EVERY = flush_every


def _workload(root: str) -> tuple[Snapshot, Recorder]:
    store = JobStore(root, durable=True, lease_duration=3600, backoff=lambda attempt: 0.0)
    setup = Ctx()
    _dead_owner(store, setup)  # a dead worker's claim, for the recovery inside the run
    snap = snapshot(root)
    rec = Recorder(root)
    with hooked(rec):
        for job_id in setup.jobs:
            rec.ack("job", job_id)
        a = store.create({"job": "a"}, queue="w").id
        rec.ack("job", a)
        b = store.create({"job": "b"}, queue="w", priority=5).id
        rec.ack("job", b)
        c = store.create({"job": "c"}, queue="w", job_id="chosen").id
        rec.ack("job", c)
        # A unique key's entry is not fsynced on its own: the publish's directory fsync after it
        # must carry it (names in program order), or a cut could leave the job without its entry.
        u = store.create({"job": "u"}, queue="uq", unique_key="once").id
        rec.ack("job", u)
        store.queue(a, "target-a")
        lease = store.pull_work(queues="w")
        assert lease is not None and lease.id == a
        lease.fulfill(b"result-a")
        rec.ack("fulfilled", a)
        store._counters.flush()  # not fsynced (counts are a report): a cut may lose or tear it
        lease = store.pull_work(queues="w")
        assert lease is not None and lease.id == c
        lease.fail("no", retry=False)
        rec.ack("failed", c)
        lease = store.pull_work(queues="w")
        assert lease is not None and lease.id == b
        lease.release()
        note = store.pull_notification()
        assert note is not None and note.id == a
        note.done(note.waiting)
        later = store.create({"job": "later"}, delay=3600).id
        rec.ack("job", later)
        store.recover()
        retried = store.pull_work()
        assert retried is not None
        retried.fail("again")
    die(store)  # the power goes out: no clean close, every descriptor gone
    return snap, rec


def check_all(log: list[tuple[Any, ...]], snap: Snapshot, old_root: str, *, limit: int | None = None) -> dict[str, Any]:
    problems: list[str] = []
    states = 0
    work = tempfile.mkdtemp(prefix="fsjs-power-")
    try:
        for k, prefix, mode in crash_states(snap, log):
            if limit is not None and states >= limit:
                break
            states += 1
            ctx = Ctx()
            for entry in log[:k]:
                if entry[0] == "ack":
                    if entry[1] == "job":
                        ctx.jobs.append(entry[2])
                    else:
                        ctx.results[entry[2]] = entry[1]
            dest = os.path.join(work, f"s{states}")
            materialize(snap, log, k, prefix, mode, dest, old_root)
            where = f"cut after call {k} ({log[k - 1][0] if k else 'start'}), names prefix {prefix}, data {mode}"
            try:
                with JobStore(dest, durable=True, lease_duration=3600, backoff=lambda attempt: 0.0) as store:
                    store.recover()
                    problems += [f"{where}: {p}" for p in check_store(dest, ctx, settled=True)]
                    problems += [f"{where}: {p}" for p in full_cycle(store)]
                    problems += [f"{where}: {p}" for p in _unique_held(store, ctx)]
                    problems += [f"{where}: {p}" for p in drain_survivors(store, dest, ctx)]
            except Exception as exc:  # any failure to open or recover is a finding
                problems.append(f"{where}: {type(exc).__name__}: {exc}")
            shutil.rmtree(dest, ignore_errors=True)
            if len(problems) > 50:
                break
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"calls_recorded": len(log), "states_checked": states, "problems": problems}


def _unique_held(store: JobStore, ctx: Ctx) -> list[str]:
    """Every acknowledged job with a unique key that is not final still holds its key: a create
    with the key answers it rather than making a second job."""
    problems = []
    for job_id in ctx.jobs:
        try:
            job = store.get(job_id)
        except Exception:
            continue  # check_store reports a lost job
        if job.unique_key is not None and not job.state.is_final:
            again = store.create({"job": "again"}, queue="uq", unique_key=job.unique_key)
            if again.id != job_id:
                problems.append(f"unique key {job.unique_key!r} of job {job_id} made a second job {again.id}")
                store.purge(states="pending", match=again.id)
    return problems


def run(*, limit: int | None = None) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="fsjs-power-run-")
    root = os.path.join(base, "store")
    try:
        snap, rec = workload(root)
        return check_all(rec.log, snap, root, limit=limit)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# == durable=False: recent work may be lost, the store may not ====================================
def workload_not_durable(base: str) -> tuple[Snapshot, Recorder]:
    """From an empty directory: make a store with durable=False, then create, claim, fulfil,
    fail and release jobs. The recording starts before the store exists, so the cuts include
    every moment of its creation."""
    root = os.path.join(base, "store")
    snap = snapshot(base)
    rec = Recorder(base)
    with hooked(rec):
        store = JobStore(root, durable=False, lease_duration=3600, backoff=lambda attempt: 0.0)
        rec.ack("store", root)
        ids = [store.create({"job": n}, queue="w").id for n in range(3)]
        store.create({"job": "chosen"}, queue="w", job_id="chosen")
        store.queue(ids[0], "target")
        lease = store.pull_work(queues="w")
        assert lease is not None
        lease.fulfill({"done": lease.id})
        lease = store.pull_work(queues="w")
        assert lease is not None
        lease.fail("boom")
        lease = store.pull_work(queues="w")
        assert lease is not None
        lease.release()
    die(store)
    return snap, rec


def check_not_durable(log: list[tuple[Any, ...]], snap: Snapshot, base: str) -> dict[str, Any]:
    """Every state of a durable=False run: once the store was acknowledged, it opens, recovers
    and works; whatever was lost is quarantined with the power-loss reason, nothing else is,
    and no job is left in two places. Data modes "lost" (LazyFS drops every unsynced write)
    and "full"; a small file is written back a page at a time, so it is not torn mid-page."""
    problems: list[str] = []
    states = lost = 0
    work = tempfile.mkdtemp(prefix="fsjs-power-fast-")
    try:
        for k, prefix, mode in crash_states(snap, log):
            if mode == "torn":
                continue
            states += 1
            made = any(entry[0] == "ack" for entry in log[:k])
            dest = os.path.join(work, f"s{states}")
            materialize(snap, log, k, prefix, mode, dest, base)
            where = f"cut after call {k} ({log[k - 1][0] if k else 'start'}), names prefix {prefix}, data {mode}"
            try:
                with JobStore(os.path.join(dest, "store"), create=False, lease_duration=3600,
                              backoff=lambda attempt: 0.0) as store:
                    report = store.recover()
                    lost += report.lost_to_power_loss
                    problems += [f"{where}: {p}" for p in _emptied_left(store, report)]
                    drained = _drain(store)
                    problems += [f"{where}: {p}" for p in _quarantine_reasons(dest) + drained]
                    problems += [f"{where}: {p}" for p in check_store(os.path.join(dest, "store"), Ctx(), settled=True,
                                                                     power_loss_ok=True)]
                    problems += [f"{where}: {p}" for p in full_cycle(store)]
            except Exception as exc:
                if made or type(exc).__name__ != "StoreNotFound":
                    problems.append(f"{where}: {type(exc).__name__}: {exc}")
            shutil.rmtree(dest, ignore_errors=True)
            if len(problems) > 50:
                break
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"calls_recorded": len(log), "states_checked": states, "lost_reported": lost, "problems": problems}


def _drain(store: JobStore) -> list[str]:
    """Claim (and fulfil) every job, and read every final one: a lost one must be reported as
    corrupt with the power-loss reason (and quarantined), nothing else may go wrong."""
    from fsjobstore import CorruptJob

    problems = []
    while (lease := store.pull_work()) is not None:
        lease.fulfill(b"drained")
    for state in ("fulfilled", "failed"):
        for name in _ls_names(os.path.join(store.path, "jobs", state)):
            try:
                store.get(name[: -len(".json")])
            except CorruptJob as exc:
                if "never reached the disk" not in str(exc):
                    problems.append(f"get() of {state}/{name}: {exc}")
            except Exception as exc:
                problems.append(f"get() of {state}/{name} raised {type(exc).__name__}: {exc}")
    return problems


def _emptied_left(store: JobStore, report: Any) -> list[str]:
    """recover() reports every job file the cut emptied, in any state (final ones included):
    none may be left for a get() or a claim to trip on, and each is named in lost_ids."""
    jobs = os.path.join(store.path, "jobs")
    queues = [os.path.join(jobs, "pending", q) for q in _ls_names(os.path.join(jobs, "pending"))]
    dirs = [*queues, *(os.path.join(q, b) for q in queues for b in _ls_names(q) if os.path.isdir(os.path.join(q, b)))]
    dirs += [os.path.join(jobs, d) for d in ("scheduled", "active", "fulfilled", "failed", "cancelled")]
    problems = [f"recover() left an emptied job file: {os.path.relpath(os.path.join(d, n), store.path)}"
                for d in dirs for n in _ls_names(d) if not n.startswith(".")  # a queue's marker is empty
                and os.path.isfile(os.path.join(d, n)) and os.path.getsize(os.path.join(d, n)) == 0]
    if len(report.lost_ids) != report.lost_to_power_loss:
        problems.append(f"lost_ids {report.lost_ids} does not name the {report.lost_to_power_loss} lost job(s)")
    return problems


def _ls_names(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _quarantine_reasons(dest: str) -> list[str]:
    qdir = os.path.join(dest, "store", "quarantine")
    out = []
    for name in _ls_names(qdir):
        if name.endswith(".reason"):
            with open(os.path.join(qdir, name)) as fh:
                reason = json.load(fh)["reason"]
            if "never reached the disk" not in reason:
                out.append(f"quarantined for another reason than a power cut: {reason}")
    return out


def run_not_durable() -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="fsjs-power-run-")
    try:
        snap, rec = workload_not_durable(base)
        return check_not_durable(rec.log, snap, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    report = run_not_durable() if "--not-durable" in sys.argv[1:] else run()
    print(json.dumps({k: v for k, v in report.items() if k != "problems"} | {
        "problem_count": len(report["problems"]), "first_problems": report["problems"][:10]}))
    sys.exit(1 if report["problems"] else 0)
