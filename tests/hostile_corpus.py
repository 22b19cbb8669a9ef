"""The hostile-directory corpus, planted in every directory of a store while good jobs flow.

Run as ``python tests/hostile_corpus.py``: it plants every bad file in every directory, under
names the store's grammar accepts there (so they are really read, not just skipped), runs
producers, a worker, a notifier and recovery, and prints a JSON report. An audit hook
(``sys.addaudithook``) records every path the process touches, so the report also lists any
file outside the store root that was read or written. Its own process, because audit hooks
cannot be removed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fsjobstore import CorruptJob, JobExists, JobNotFound, JobStore

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from internals import open_fds

GOOD_RECORD = json.dumps({"format": 1, "id": "other", "queue": "default", "priority": 0, "request": 1,
                          "created_at": 1.0, "seq": "00000000000000000001", "max_attempts": 3}).encode()

CONTENT: dict[str, bytes] = {
    "empty": b"",
    "truncated": b'{"format":1,"id":"x"',
    "trailing_garbage": GOOD_RECORD + b"garbage",
    "bom": b"\xef\xbb\xbf" + GOOD_RECORD,
    "invalid_utf8": b'{"format":1,"id":"\xff\xfe"}',
    "lone_surrogate": b'{"format":1,"id":"\\ud800","queue":"\\udfff"}',
    "nan": b'{"format":1,"priority":NaN}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "huge_int": b'{"format":1,"attempts":' + b"9" * 100_000 + b"}",
    "duplicate_keys": b'{"format":1,"format":1}',
    "wrong_types": b'{"format":1,"id":5,"queue":[],"priority":"high","request":1}',
    "unknown_version": b'{"format":99,"id":"x"}',
    "someone_elses_record": GOOD_RECORD,
}


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def _socket(path: str) -> None:
    here = os.getcwd()
    os.chdir(os.path.dirname(path))  # AF_UNIX paths are limited to 108 bytes
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.path.basename(path))
        SOCKETS.append(sock)
    finally:
        os.chdir(here)


def _mode000(path: str) -> None:
    _write(path, b"secret")
    os.chmod(path, 0)


SOCKETS: list[socket.socket] = []
SPECIAL: dict[str, Callable[[str], None]] = {
    "sparse_1gb": lambda p: os.truncate(_write(p, b"") or p, 1 << 30),
    "symlink_passwd": lambda p: os.symlink("/etc/passwd", p),
    "symlink_zero": lambda p: os.symlink("/dev/zero", p),
    "symlink_dangling": lambda p: os.symlink("/nonexistent/nowhere", p),
    "fifo": os.mkfifo,
    "socket": _socket,
    "directory": os.mkdir,
    "mode_000": _mode000,
    "hard_link": lambda p: os.link(HARD_LINK_SOURCE, p),
}
HARD_LINK_SOURCE = ""
KINDS = sorted(CONTENT) + sorted(SPECIAL)
TOKEN = "00000000deadbeef-1"  # an owner that does not exist: dead to every prober


def name_for(directory: str, n: int) -> str:
    """A name the store's grammar accepts in ``directory``, unique per ``n``."""
    ident = f"bad{n:03d}"
    return {
        "jobs/pending/default": f"1000000.{n:020d}.{ident}.json",  # flat, as an older store wrote
        "jobs/pending/default/1000000.00000000000": f"1000000.{n:020d}.{ident}.json",  # in its bucket
        "jobs/scheduled": f"{1:017d}.default.1000000.{n:020d}.{ident}.json",
        "jobs/active": f"{ident}.{TOKEN}.json",
        "jobs/fulfilled": f"{ident}.json",
        "jobs/failed": f"{ident}.json",
        "jobs/notify": f"{ident}.json",
        "targets/victim": f"{n:032x}.json",
        "tmp": f"{TOKEN}.newid.{ident}.json",
        "leases": f"{ident}.notify",
        "leases/owner": f"{n:016x}.owner",
        "ids": ident,
    }[directory]


DIRECTORIES = ["jobs/pending/default", "jobs/pending/default/1000000.00000000000", "jobs/scheduled", "jobs/active",
               "jobs/fulfilled", "jobs/failed", "jobs/notify", "targets/victim", "tmp", "leases", "leases/owner", "ids"]


def run() -> dict[str, object]:
    global HARD_LINK_SOURCE
    base = tempfile.mkdtemp(prefix="fsjs-hostile-")
    root = os.path.join(base, "store")
    outside: list[str] = []
    allowed_prefixes = tuple({sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(__file__)),
                              os.path.dirname(os.__file__)})

    def audit(event: str, args: tuple[object, ...]) -> None:
        if event not in ("open", "os.rename", "os.link", "os.remove", "os.rmdir", "os.mkdir", "os.listdir",
                         "os.scandir", "os.chmod", "os.truncate", "os.symlink"):
            return
        paths = args[:2] if event in ("os.rename", "os.link", "os.symlink") else args[:1]
        for arg in paths:
            if isinstance(arg, str):
                if not arg.startswith("/"):
                    # A name relative to a directory descriptor (the audit event does not carry
                    # it): fsjobstore only uses those for paths it resolved beneath the root
                    # (_beneath), and only absolute paths otherwise.
                    continue
                path = os.path.abspath(arg)
                if path.startswith(root + os.sep) or path == root or path.startswith(base):
                    continue
                if path.startswith(allowed_prefixes) and path.endswith((".py", ".pyc", ".so")):
                    continue  # a lazily imported module
                if path.startswith(("/proc/self/fd", "/dev/null")) or path.endswith("__pycache__"):
                    continue
                outside.append(f"{event} {path}")

    report: dict[str, object] = {}
    try:
        store = JobStore(root, backoff=lambda attempt: 0.0, lease_duration=2.0)
        victim = store.create({"victim": True}, job_id="victim")
        store.queue(victim.id, "victim-target")
        HARD_LINK_SOURCE = os.path.join(base, "link-source")
        _write(HARD_LINK_SOURCE, b"not a job")
        planted: list[str] = []
        n = 0
        for directory in DIRECTORIES:
            where = "leases" if directory == "leases/owner" else directory
            os.makedirs(os.path.join(root, where), exist_ok=True)
            for kind in KINDS:
                n += 1
                path = os.path.join(root, where, name_for(directory, n))
                if kind in CONTENT:
                    _write(path, CONTENT[kind])
                else:
                    SPECIAL[kind](path)
                planted.append(path)
        sys.addaudithook(audit)
        if os.environ.get("HOSTILE_SELFTEST"):
            with open("/etc/hostname", "rb") as fh:  # the audit must notice this
                fh.read()
        fds_before = open_fds()
        good, done, notified, errors = ["victim"], [], [], []
        for round_ in range(5):
            for i in range(10):
                job = store.create({"round": round_, "i": i})
                store.queue(job.id, f"t{i}")
                good.append(job.id)
            try:
                store.recover()
            except Exception as exc:  # any exception here is a finding
                errors.append(f"recover: {type(exc).__name__}: {exc}")
            while (lease := store.pull_work()) is not None:
                lease.fulfill(b"ok")
                done.append(lease.id)
            while (note := store.pull_notification()) is not None:
                note.done(note.waiting)
                notified.append(note.id)
        for n in range(1, len(planted) + 1):
            try:
                store.get(f"bad{n:03d}")
            except (CorruptJob, JobNotFound):
                pass
            except Exception as exc:
                errors.append(f"get bad{n:03d}: {type(exc).__name__}: {exc}")
            try:  # ids/ holds planted files for some of these: the id is spent, nothing else
                store.create(1, job_id=f"bad{n:03d}")
            except JobExists:
                pass
            except Exception as exc:
                errors.append(f"create bad{n:03d}: {type(exc).__name__}: {exc}")
        fds_after = open_fds()
        quarantine = os.listdir(os.path.join(root, "quarantine"))
        reasons = [q for q in quarantine if q.endswith(".reason")]
        survivors = [os.path.relpath(p, root) for p in planted if os.path.lexists(p)]
        store.close()
        report = {
            "planted": len(planted), "kinds": len(KINDS), "directories": len(DIRECTORIES),
            "good_created": len(good), "good_fulfilled": len(set(done) & set(good)),
            "good_notified": len(set(notified) & set(good)), "other_fulfilled": sorted(set(done) - set(good)),
            "quarantined": len(reasons), "left_in_place": survivors, "fd_growth": fds_after - fds_before,
            "outside_root": sorted(set(outside)), "errors": errors,
        }
    finally:
        for sock in SOCKETS:
            sock.close()
        for dirpath, dirs, _files in os.walk(base):
            for d in dirs:
                os.chmod(os.path.join(dirpath, d), 0o700)
        shutil.rmtree(base, ignore_errors=True)
    return report


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    print(json.dumps(run()))
