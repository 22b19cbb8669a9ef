"""``fsjobstore verify DIR --wait-for-peer`` on one host, ``--peer`` on another: check, through
the directory itself, what a store shared by the two hosts relies on.

The two sides talk only by making new files in ``DIR/.fsjobstore-verify-peer/<session>/``, each
written once and never changed: on network filesystems a new name is seen at once, where the
attributes and contents of a file that changes may be cached (the very thing one check measures).
The leader makes the session and runs the steps; the peer answers; both print the leader's
report. Checks, in order:

* **clock**: round trips through the directory, the peer's wall-clock skew and the delay of a new
  name (what the doorbell's wake-ups cost);
* **rename fence** (required): both hosts rename the same files at once; each must have exactly
  one winner, as every claim and commit depends on;
* **no-replace publish** (required): both hosts link the same new names at once; exactly one may
  succeed, as final results and reservations depend on;
* **heartbeat visibility** (required): the leader rewrites a file in place as an owner's heartbeat
  does, and the peer reads it as a prober does; a peer that never sees it change would take jobs
  from live workers. The slowest change it saw sets the safe minimum ``lease_duration``;
* **lock exclusion** and **inotify** across hosts: reported; a heartbeat-only store relies on
  neither.

The checks one host can make alone (fsync, atomic rename, ...) are plain ``verify``'s: run it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from typing import Any

from .._errors import InvalidRequest
from . import _syscalls as sc
from ._files import DIR_MODE, FILE_MODE, O_CLOEXEC
from ._inotify import Waker
from ._verify import VerifyCheck, VerifyReport, filesystem_type, locks_prove_death

RENDEZVOUS = ".fsjobstore-verify-peer"
ROUNDS = 200  # renames and links raced per check
BEAT_SECONDS = 4.0  # how long the heartbeat check writes
BEAT_EVERY = 0.05


class _Session:
    """The session directory, and messages: files written once under fresh names."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout

    def send(self, name: str, doc: Any = None) -> None:
        tmp = os.path.join(self.path, f".{name}.{secrets.token_hex(4)}")
        with open(tmp, "w") as fh:
            json.dump(doc, fh)
        os.rename(tmp, os.path.join(self.path, name))  # appears whole, under its final name

    def receive(self, name: str, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if name in os.listdir(self.path):  # a listing, not a stat: names are seen at once
                for _ in range(50):
                    with contextlib.suppress(ValueError, OSError), open(os.path.join(self.path, name)) as fh:
                        return json.load(fh)
                    time.sleep(0.01)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the other host did not answer ({name}) within {self.timeout:g} s")
            time.sleep(0.002)


def verify_across_hosts(directory: str, *, lead: bool, timeout: float = 300.0,
                        say: Callable[[str], None] = lambda line: None) -> VerifyReport:
    """Run the two-sided check; ``lead`` on the host that waits, not on the one that joins.
    Both sides return the same report (the leader's)."""
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise InvalidRequest(f"{directory} is not a directory; verify checks the filesystem of an existing one")
    base = os.path.join(directory, RENDEZVOUS)
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, DIR_MODE)
    if lead:
        session = _Session(os.path.join(base, f"{int(time.time())}-{secrets.token_hex(4)}"), timeout)
        os.mkdir(session.path, DIR_MODE)
        session.send("leader", {"host": socket.gethostname(), "pid": os.getpid()})
        say(f"waiting for a peer: run `fsjobstore verify {directory} --peer` on the other host")
        try:
            peer = session.receive("peer")
            say(f"peer {peer['host']} joined; checking")
            report = _lead(session, directory, str(peer["host"]))
            session.send("report", _to_doc(report))
            with contextlib.suppress(TimeoutError):
                session.receive("bye", timeout=30)
        finally:
            shutil.rmtree(session.path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(base)  # unless another session is under way
        return report
    say(f"looking for a leader: `fsjobstore verify {directory} --wait-for-peer` on the other host "
        f"(for up to {timeout:g} s)")
    try:
        session = _join(base, timeout)
    except TimeoutError:
        with contextlib.suppress(OSError):
            os.rmdir(base)  # ours if we made it, and empty: leave nothing behind
        raise
    say(f"joined the leader's session {os.path.basename(session.path)}")
    _follow(session)
    report = _from_doc(session.receive("report"))
    session.send("bye")
    return report


def _join(base: str, timeout: float) -> _Session:
    deadline = time.monotonic() + timeout
    while True:
        for name in sorted(os.listdir(base), reverse=True):  # the newest session first
            path = os.path.join(base, name)
            if os.path.isdir(path) and "leader" in os.listdir(path):
                try:
                    fd = os.open(os.path.join(path, "peer"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
                except FileExistsError:
                    continue  # another peer took it
                os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode())
                os.close(fd)
                return _Session(path, timeout)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no host waited in {base} (run `fsjobstore verify DIR --wait-for-peer` there first)")
        time.sleep(0.1)


# == the leader =======================================================================================
def _lead(s: _Session, directory: str, peer: str) -> VerifyReport:
    """The checks between the hosts (those of one host alone are plain ``verify``'s)."""
    checks: list[VerifyCheck] = []
    warnings: list[str] = []
    skew, delay = _clock_lead(s)
    checks.append(VerifyCheck("new names across hosts", True,
                              f"a file made on one host is listed on the other {delay * 1000:.0f} ms later "
                              "(the doorbell's delay)", False))
    if abs(skew) > 1.0:
        warnings.append(f"the hosts' wall clocks differ by {skew:+.1f} s: run_at, delays and time limits are "
                        "judged on wall clocks; keep them in sync (NTP)")
    checks.append(_race_lead(s, "rename", "rename fence"))
    checks.append(_race_lead(s, "link", "no-replace publish"))
    beat, min_lease = _beat_lead(s, skew)
    checks.append(beat)
    checks.append(_lock_lead(s))
    checks.append(_inotify_lead(s))
    fstype = filesystem_type(directory)
    trust = locks_prove_death(directory)
    if trust:
        warnings.append(f"{fstype} looks local here, so a store trusts locks to prove a holder dead; across hosts "
                        "open it with lock_takeover=False")
    safe = all(c.passed for c in checks if c.required)
    across = checks[-1].passed  # the inotify check: whether this host's events reach the other
    return VerifyReport(directory, fstype, tuple(checks), trust, "inotify" if across else "inotify (this host only)",
                        tuple(warnings), safe, peer=peer, min_lease=min_lease, clock_skew=skew)


def _clock_lead(s: _Session) -> tuple[float, float]:
    """NTP-style: the peer's offset from the round trip with the smallest delay."""
    best: tuple[float, float] | None = None
    for i in range(8):
        t1 = time.time()
        s.send(f"ping-{i}", t1)
        their = float(s.receive(f"pong-{i}"))
        t4 = time.time()
        rtt = t4 - t1
        if best is None or rtt < best[0]:
            best = (rtt, their - (t1 + t4) / 2)
    assert best is not None
    return best[1], best[0] / 2


def _race_lead(s: _Session, how: str, name: str) -> VerifyCheck:
    area = os.path.join(s.path, how)
    os.mkdir(area)
    for i in range(ROUNDS):
        with open(os.path.join(area, f"src-L-{i}"), "w") as fh:
            fh.write("L")
    s.send(f"{how}-ready")
    s.receive(f"{how}-set")
    start = time.time() + 0.3
    s.send(f"{how}-go", start)
    mine = _race(area, how, "L", start)
    theirs = set(s.receive(f"{how}-done"))
    both = mine & theirs
    neither = set(range(ROUNDS)) - mine - theirs
    if both or neither:
        return VerifyCheck(name, False, f"of {ROUNDS} races, {len(both)} had two winners and {len(neither)} none",
                           True)
    return VerifyCheck(name, True, f"{ROUNDS} races between the hosts, each with one winner "
                                   f"({len(mine)} by the leader, {len(theirs)} by the peer)", True)


def _race(area: str, how: str, side: str, start: float) -> set[int]:
    """Race for every i: rename the leader's ``src-L-<i>`` away (one shared file), or move our
    own file to ``won-<i>`` without replacing. Returns the i this side won."""
    time.sleep(max(0.0, start - time.time()))
    won = set()
    # The two sides go through the files in opposite orders: they meet in the middle, where
    # both try the same files at the same moment whatever the start times say.
    for i in range(ROUNDS) if side == "L" else reversed(range(ROUNDS)):
        try:
            if how == "rename":
                sc.rename(os.path.join(area, f"src-L-{i}"), os.path.join(area, f"won-{i}-{side}"))
            else:  # what final commits use (renameat2, or link and unlink where it is missing)
                sc.rename_noreplace(os.path.join(area, f"src-{side}-{i}"), os.path.join(area, f"won-{i}"))
        except (FileNotFoundError, FileExistsError):
            continue
        won.add(i)
    return won


def _beat_lead(s: _Session, skew: float) -> tuple[VerifyCheck, float | None]:
    path = os.path.join(s.path, "beat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | O_CLOEXEC, FILE_MODE)
    written: dict[int, float] = {}
    try:
        os.pwrite(fd, f"{0:012d}".encode(), 0)
        s.send("beat-ready")
        s.receive("beat-reading")
        end = time.monotonic() + BEAT_SECONDS
        n = 0
        while time.monotonic() < end:
            n += 1
            os.pwrite(fd, f"{n:012d}".encode(), 0)  # in place, as OwnerLease.beat does
            written[n] = time.time()
            time.sleep(BEAT_EVERY)
        s.send("beat-stop", n)
    finally:
        os.close(fd)
    seen = {int(k): float(v) for k, v in s.receive("beat-seen").items()}
    if not seen:
        return (VerifyCheck("heartbeat visibility", False,
                            f"the other host read the same heartbeat for {BEAT_SECONDS:g} s while it changed every "
                            f"{BEAT_EVERY * 1000:.0f} ms: it would take jobs from live workers (mount options?)",
                            True), None)
    delays = sorted(max(0.0, seen[k] - skew - written[k]) for k in seen if k in written)
    slowest = max(delays)
    gaps = sorted(b - a for a, b in zip(sorted(seen.values()), sorted(seen.values())[1:], strict=False))
    longest = max(gaps, default=slowest)
    # A holder beats every lease/4; an observer expires it after a lease with no change it can
    # see. Changes it sees can come as much as `longest` apart even while the holder beats fast:
    # a lease of 4 times that (and never under 2 s) leaves the holder three clear beats.
    min_lease = max(2.0, round(4 * max(longest, slowest), 1))
    return (VerifyCheck("heartbeat visibility", True,
                        f"a heartbeat written in place was seen {delays[len(delays) // 2] * 1000:.0f} ms later "
                        f"(p50), {slowest * 1000:.0f} ms at worst; at most {longest * 1000:.0f} ms between changes "
                        f"seen ({len(seen)} of {len(written)} values)", True), min_lease)


def _lock_lead(s: _Session) -> VerifyCheck:
    path = os.path.join(s.path, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | O_CLOEXEC, FILE_MODE)
    try:
        if not sc.try_lock(fd):
            return VerifyCheck("lock exclusion across hosts", False, "could not take a fresh lock", False)
        s.send("locked")
        got_while_held = bool(s.receive("tried-held"))
        sc.unlock(fd)
        s.send("unlocked")
        after = s.receive("tried-free")
    finally:
        os.close(fd)
    if got_while_held:
        return VerifyCheck("lock exclusion across hosts", False, "the other host took a lock this host held "
                           "(harmless for a heartbeat-only store, which never trusts a free lock)", False)
    if after is None:
        return VerifyCheck("lock exclusion across hosts", False, "the other host could not take the lock after "
                           "it was released", False)
    return VerifyCheck("lock exclusion across hosts", True, f"a held lock excluded the other host, which got it "
                       f"{float(after) * 1000:.0f} ms after it was released (a heartbeat-only store does not "
                       "rely on it)", False)


def _inotify_lead(s: _Session) -> VerifyCheck:
    s.receive("watching")
    with open(os.path.join(s.path, "watched", "poke"), "w"):
        pass
    got = s.receive("watch-result")
    if got:
        return VerifyCheck("inotify across hosts", True, "the peer's inotify saw a file the leader made", False)
    return VerifyCheck("inotify across hosts", False, "the peer's inotify saw nothing the leader made: waiters on "
                       "one host hear of the other's jobs by the doorbell and the poll_interval rescan", False)


# == the peer =========================================================================================
def _follow(s: _Session) -> None:
    for i in range(8):
        s.receive(f"ping-{i}")
        s.send(f"pong-{i}", time.time())
    for how in ("rename", "link"):
        s.receive(f"{how}-ready")
        area = os.path.join(s.path, how)
        if how == "link":
            for i in range(ROUNDS):
                with open(os.path.join(area, f"src-P-{i}"), "w") as fh:
                    fh.write("P")
        s.send(f"{how}-set")
        start = float(s.receive(f"{how}-go"))
        s.send(f"{how}-done", sorted(_race(area, how, "P", start)))
    _beat_follow(s)
    _lock_follow(s)
    _inotify_follow(s)


def _beat_follow(s: _Session) -> None:
    s.receive("beat-ready")
    path = os.path.join(s.path, "beat")
    seen: dict[int, float] = {}
    last = -1
    s.send("beat-reading")
    stop_names: list[str] = []
    while "beat-stop" not in stop_names:
        with contextlib.suppress(OSError, ValueError):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | O_CLOEXEC)  # as OwnerProbe reads
            try:
                value = int(os.pread(fd, 12, 0) or b"0")
            finally:
                os.close(fd)
            if value != last:
                last = value
                if value > 0:
                    seen[value] = time.time()
        time.sleep(0.01)
        stop_names = os.listdir(s.path)
    s.send("beat-seen", {str(k): v for k, v in seen.items()})


def _lock_follow(s: _Session) -> None:
    s.receive("locked")
    fd = os.open(os.path.join(s.path, "lock"), os.O_RDWR | O_CLOEXEC)
    try:
        got = sc.try_lock(fd)
        if got:
            sc.unlock(fd)
        s.send("tried-held", got)
        s.receive("unlocked")
        began = time.monotonic()
        while time.monotonic() - began < 5:
            if sc.try_lock(fd):
                sc.unlock(fd)
                s.send("tried-free", time.monotonic() - began)
                return
            time.sleep(0.005)
        s.send("tried-free", None)
    finally:
        os.close(fd)


def _inotify_follow(s: _Session) -> None:
    watched = os.path.join(s.path, "watched")
    os.mkdir(watched)
    seen: list[str] = []
    waker = Waker(watched, seen.append)
    waker.start()
    try:
        s.send("watching")
        deadline = time.monotonic() + 2.0
        while not seen and time.monotonic() < deadline:
            generation = waker.generation
            waker.wait(generation, 0.1)
    finally:
        waker.stop()
    s.send("watch-result", bool(seen))


# == the report, as a message =========================================================================
def _to_doc(report: VerifyReport) -> dict[str, Any]:
    doc = {name: getattr(report, name) for name in report.__dataclass_fields__}
    doc["checks"] = [{n: getattr(c, n) for n in c.__dataclass_fields__} for c in report.checks]
    return doc


def _from_doc(doc: dict[str, Any]) -> VerifyReport:
    checks = tuple(VerifyCheck(**c) for c in doc.pop("checks"))
    doc["warnings"] = tuple(doc["warnings"])
    return VerifyReport(checks=checks, **doc)
