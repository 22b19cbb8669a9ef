"""The gate a claim passes through when a limit applies: FORMAT.md, "Limits".

**Slots.** A limit with ``concurrency = N`` has ``N`` slots, ``limits/<H>/c<i>``, each a lock file
(``_liveness.NotifyLock``: open-or-create, exclusive ``flock``, the holder's owner id inside; its
holder empties it before it lets go, and the file stays). A claim holds one per limit
that applies to it until the claim ends, however it ends (``Work._finish``). A holder that dies
lets go of its ``flock`` in that instant, so on its host its slot is free at once; where locks are
not trusted (heartbeat-only, across hosts) a slot whose holder's heartbeat expired is broken as a
notification lock is (``break_if_expired``), after ``lease_duration``.

**Queue limits** are met before a job is taken: a claim takes a slot of the queue first, and
passes the queue over while none is free, so its jobs wait in the queue, in their order.

**Key limits** can only be met once the job is read (its name does not carry the key). A claimed
job whose key has no free slot, or no start left in the rate's period, is **parked**: renamed,
unchanged, into ``jobs/waiting/<H>.<P>.<SEQ>.<queue>.<id>.json``, no attempt counted, so nobody
claims it again until a slot frees. **Promotion** renames the first jobs of a line (by priority,
then age) back into their queue, as many as there is room: done by the holder whose claim ends,
by a watcher thread that wakes when a holder lets go (dead or not), by whoever parked a job for
a rate once its period turns, and by every recovery pass. A job promoted but beaten to the slot
by another job of its key is parked again, at the head of the line, as its name sorts.

RACE: a holder may let go between a parker's failed try and its rename into the line; so the
holder lets go *before* it looks at the line, and the parker looks at the slots *after* its
rename: one of them sees the other, and the job is promoted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace

from .._core._core import Core
from .._core._liveness import NotifyLock, break_if_expired
from .._format._layout import ACTIVE_RE, WAITING_RE, pending_rel, prio_value, token_owner
from .._format._records import Record
from .._os import _files as fs
from .._os import _syscalls as sc
from ._limits import Declarations, Limit, Ticket, holder_died, take_ticket

log = logging.getLogger("fsjobstore")

MAX_WATCHERS = 64  # threads per process waiting on busy slots; past it, waits end by poll_interval


class Gate:
    """The limits this process claims under. Thread-safe."""

    def __init__(self, core: Core, declarations: Declarations, wake: Callable[[], None]) -> None:
        self._core = core
        self.declarations = declarations
        self._wake = wake  # wakes this process's waiting pullers (a slot freed)
        self._mutex = threading.Lock()
        self._dirs: set[str] = set()
        self._closed: dict[str, float] = {}  # queue -> wall time its rate lets a start again
        self._due: dict[str, tuple[float, Limit]] = {}  # line -> (wall time, limit): promote then
        self._watched: set[str] = set()
        self._lines_watched_at = float("-inf")

    def after_fork(self) -> None:
        self._mutex = threading.Lock()
        self._closed, self._due, self._watched = {}, {}, set()

    # == before a claim ===========================================================================
    def queue_turn(self, queue: str) -> list[NotifyLock] | None:
        """What a claim from ``queue`` must hold: ``[]`` if the queue has no concurrency limit,
        its slot, or None when the queue is at its limit (or its rate is spent) now."""
        if queue not in self.declarations.queues():
            return []
        until = self._closed.get(queue)
        if until is not None:
            if self._core.wall() < until:
                return None
            self._closed.pop(queue, None)
        limit = self.declarations.get("queue", queue)
        if limit is None or limit.concurrency is None:
            return []
        slot = self._take_slot(limit)
        return None if slot is None else [slot]

    # == after the claim read its job =============================================================
    def admit(self, record: Record, active: str, token: str, source: str, held: list[NotifyLock]) -> bool:
        """Whether the claim at ``active`` may run. True: ``held`` has every slot it needs. False:
        the job went back where it waits (``source``, its queue, for a queue's rate; the key's line
        otherwise) and ``held`` was let go."""
        limited = record.queue in self.declarations.queues()
        queue_limit = self.declarations.get("queue", record.queue) if limited else None
        key_limit = self.key_limit(record.concurrency_key)
        if key_limit is None and (queue_limit is None or queue_limit.rate is None):
            return True
        if key_limit is not None and key_limit.concurrency is not None:
            slot = self._take_slot(key_limit)
            if slot is None:
                self._let_go(held)
                self._park(record, active, token, source, key_limit, None)
                return False
            held.append(slot)
        tickets: list[Ticket] = []
        for limit in (queue_limit, key_limit):
            if limit is None or limit.rate is None:
                continue
            got = take_ticket(self._core.layout, limit.id, limit.rate, self._core.wall(), self._core.tree.perms,
                              self._ensure_dir)
            if isinstance(got, Ticket):
                tickets.append(got)
                continue
            for ticket in tickets:
                ticket.give_back()
            self._let_go(held)
            if limit is key_limit:
                self._park(record, active, token, source, limit, got)
            else:
                self._give_back(record, active, source, got)
            return False
        for ticket in tickets:
            ticket.spend()
        if key_limit is not None and key_limit.rate is not None:
            self._after_start(key_limit)
        return True

    def _after_start(self, limit: Limit) -> None:
        """A start of a key with a rate gives the next job of its line its turn: moved now if the
        rate has a start left, else due when it has (``_due``). Without it, a key with a rate and
        no concurrency cap, whose starts free no slot, ran one job a recovery pass (15 s) once
        its line formed (7 of 10 jobs started in 40 s at 4/s)."""
        try:
            self.promote(limit)
        except OSError as exc:  # every recovery pass, and every idle puller, promotes what waits
            log.warning("could not start the next job of concurrency key %r: %s", limit.name, exc)

    def key_limit(self, key: str | None) -> Limit | None:
        if key is None:
            return None
        # A key nobody declared runs one at a time: asking for a key asks to be limited.
        return self.declarations.get("key", key) or Limit("key", key, 1, None)

    def _give_back(self, record: Record, active: str, source: str, until: float) -> None:
        """A queue's rate is spent: the job goes back to its place, and the queue is passed over
        here until ``until`` (pullers wake then)."""
        core = self._core
        try:
            core.tree.into_pending(active, source, durable=False)  # like a claim, never fsynced
        except FileNotFoundError:
            return
        core.pending.note_name(record.queue, pending_rel(record.priority, record.seq, record.id))
        with self._mutex:
            self._closed[record.queue] = until
        core.pending.note_due(until)

    def _park(self, record: Record, active: str, token: str, source: str, limit: Limit,
              due: float | None) -> None:
        core = self._core
        # The claim's token makes each park's name new. A name the same job had before (parked,
        # promoted by another host, claimed and parked again) would not do: on GlusterFS a client
        # that still holds that name in its entry cache (1 s, or from listing waiting/) answers
        # the rename "done" without asking the server, as the kernel does for a rename onto the
        # file itself, and the job stayed in active/ with nobody holding it (seen on the bed:
        # 1 job in 6 runs of 30; MULTIHOST.md).
        dst = core.layout.waiting_path(limit.id, record.priority, record.seq, record.queue, record.id, token)
        for _ in range(3):
            self._ensure_dir(core.layout.waiting)
            try:
                sc.rename(active, dst)  # a claim's rename, undone: nothing fsyncs a claim either
                break
            except FileNotFoundError:
                if not sc.lexists(active):
                    return  # RACE: taken over since our claim (we are alive, so only by a deadline): theirs
                # It was waiting/ that was missing: on GlusterFS a client may hold a stale "no such
                # directory" for it after another host made it (seen on the bed: the job was left
                # claimed by a live process that had given up on it). Made again, or looked up anew.
                self._dirs.discard(core.layout.waiting)
        else:
            log.warning("job %s could not wait in %s; it goes back to its queue", record.id, core.layout.waiting)
            with contextlib.suppress(FileNotFoundError):
                core.tree.into_pending(active, source, durable=False)
            return
        log.debug("job %s waits for a %s of concurrency key %r", record.id, "start" if due else "slot", limit.name)
        if due is not None:
            with self._mutex:
                self._due[limit.id] = (due, limit)
            core.pending.note_due(due)
        else:
            self.promote(limit)  # a slot may have freed since our try (see RACE above)

    # == when a claim ends ========================================================================
    def release(self, record: Record | None, held: list[NotifyLock]) -> None:
        """Let go of a finished claim's slots, then promote the next job of its key, if one waits
        (``record`` None: a claim that never ran, which held only its queue's slot)."""
        if not held:
            return
        self._let_go(held)
        limit = None if record is None else self.key_limit(record.concurrency_key)
        if limit is not None:
            try:
                self.promote(limit)
            except OSError as exc:  # every recovery pass promotes what waits
                log.warning("could not start the next job of concurrency key %r: %s", limit.name, exc)
        self._core.tree.bell("work")  # other hosts' pullers of a limited queue look again

    @staticmethod
    def _let_go(held: list[NotifyLock]) -> None:
        while held:
            held.pop().empty_and_release()

    # == promotion ================================================================================
    def promote(self, limit: Limit) -> int:
        """Move the first jobs of ``limit``'s line into their queues, as many as it has room for
        now; returns how many moved."""
        core = self._core
        lay = core.layout
        prefix = f"{limit.id}."
        names = sorted(n for n in fs.scan_names(lay.waiting) if n.startswith(prefix))
        if not names:
            return 0
        room = len(names)
        if limit.concurrency is not None:
            room = min(room, self._free_slots(limit))
        if room and limit.rate is not None:
            got = take_ticket(lay, limit.id, limit.rate, core.wall(), core.tree.perms, self._ensure_dir)
            if isinstance(got, Ticket):
                got.give_back()  # only looked: the job takes its own when it is claimed
                room = 1
            else:
                room = 0
                with self._mutex:
                    self._due[limit.id] = (got, limit)
                core.pending.note_due(got)
        moved = 0
        for name in names[:room]:
            m = WAITING_RE.match(name)
            if m is None:
                core.tree.quarantine(f"{lay.waiting}/{name}", "unrecognised name in jobs/waiting")
                continue
            rel = pending_rel(prio_value(m["prio"]), m["seq"], m["id"])
            src = f"{lay.waiting}/{name}"
            try:
                core.tree.into_pending(src, f"{lay.pending_dir(m['queue'])}/{rel}")
            except FileNotFoundError:
                continue  # promoted, cancelled or purged by another process meanwhile
            if sc.lexists(src):
                # RACE: the job had this pending name before its claim, and this client may
                # still hold the name in its entry cache (we listed the bucket within a second
                # before another host claimed it): GlusterFS's client then answers the rename
                # without doing it (see _park). The job still waits here, so nothing is lost; the
                # next promotion (an idle puller's look, a second later) moves it.
                continue
            core.pending.note_name(m["queue"], rel)
            moved += 1
        if moved:
            core.tree.bell("work")
        return moved

    def promote_due(self) -> None:
        """Promote the lines parked here for a rate whose period has turned."""
        if not self._due:
            return
        now = self._core.wall()
        with self._mutex:
            ready = [(h, limit) for h, (due, limit) in self._due.items() if due <= now]
            for h, _ in ready:
                self._due.pop(h, None)
        for _, limit in ready:
            self.promote(limit)

    def sweep(self, each: Callable[[str], AbstractContextManager[None]]) -> int:
        """Promote what every line has room for (a recovery pass): lines whose parker and holders
        are gone, or whose holders' slots were judged expired. Returns how many moved. ``each``
        guards one line's promotion (``Sweep.each``)."""
        moved = 0
        for limit in self._line_limits().values():
            with each(limit.name):
                moved += self.promote(limit)
        return moved

    def watch_lines(self) -> None:
        """An idle puller's look at the lines (at most once a second a process): promote what
        has room, and watch the busy slots of the rest, so that a holder that dies starts the
        next job at once even when the process that parked it died with it."""
        now = self._core.clock()
        with self._mutex:
            if now - self._lines_watched_at < 1.0:
                return
            self._lines_watched_at = now
        for limit in self._line_limits().values():
            if not self.promote(limit):  # a line with only a rate: due again when it turns
                self._watch(limit)

    def _line_limits(self) -> dict[str, Limit]:
        """The limit of each line in ``jobs/waiting/``, named by its head's record."""
        core = self._core
        heads: dict[str, str] = {}
        for name in sorted(fs.scan_names(core.layout.waiting)):
            m = WAITING_RE.match(name)
            if m is not None:
                heads.setdefault(m["limit"], name)
        found = {}
        for h, name in heads.items():
            try:
                record = core.tree.read_record(f"{core.layout.waiting}/{name}")
            except (FileNotFoundError, fs.Unreadable, ValueError):
                continue  # moved meanwhile; a bad file is quarantined by whoever claims it
            limit = self.key_limit(record.concurrency_key)
            if limit is not None and limit.id == h:
                found[h] = limit
        return found

    def limit_changed(self, limit: Limit) -> None:
        """A limit was declared or cleared here: what waits may fit now."""
        with self._mutex:
            self._closed.pop(limit.name, None)
        if limit.kind == "key":
            self.promote(limit)
        self._core.tree.bell("work")
        self._wake()

    def overview(self) -> list[Limit]:
        """Every declared limit, and every key with jobs in its line, with what holds them now."""
        core = self._core
        waiting: dict[str, list[str]] = {}
        for name in sorted(fs.scan_names(core.layout.waiting)):
            m = WAITING_RE.match(name)
            if m is not None:
                waiting.setdefault(m["limit"], []).append(name)
        found = {limit.id: limit for limit in self.declarations.all()}
        for h, limit in self._line_limits().items():
            found.setdefault(h, limit)
        return sorted((replace(limit, running=self.running(limit), waiting=len(waiting.get(limit.id, ())))
                       for limit in found.values()), key=lambda limit: (limit.kind, limit.name))

    # == slots ====================================================================================
    def _slot_path(self, limit: Limit, i: int) -> str:
        return f"{self._core.layout.limit_dir(limit.id)}/c{i}"

    def _take_slot(self, limit: Limit) -> NotifyLock | None:
        core = self._core
        assert limit.concurrency is not None
        self._ensure_dir(core.layout.limit_dir(limit.id))
        me, mode = core.owner_id(), core.tree.perms.file_mode
        for i in range(limit.concurrency):
            got = NotifyLock.try_acquire(self._slot_path(limit, i), me, mode)
            if got is not None:
                if not self._past(limit) or self.running(limit) <= limit.concurrency:
                    return got
                got.empty_and_release()  # the limit was lowered: slots past it still run, and count
                break
        if not core.probe.trust_locks:
            # A hung host keeps its locks: a slot whose holder's heartbeat expired is broken.
            for i in range(limit.concurrency):
                path = self._slot_path(limit, i)
                if self._break(path):
                    got = NotifyLock.try_acquire(path, me, mode)
                    if got is not None:
                        return got
        self._watch(limit)
        return None

    def _free_slots(self, limit: Limit) -> int:
        assert limit.concurrency is not None
        core = self._core
        free = 0
        for i in range(limit.concurrency):
            path = self._slot_path(limit, i)
            try:
                fd = sc.open(path, os.O_RDONLY | fs.O_NOFOLLOW | os.O_NONBLOCK | fs.O_CLOEXEC)
            except FileNotFoundError:
                free += 1
                continue
            except OSError:
                continue  # planted: that slot is out of use
            try:
                if _unheld(fd):
                    free += 1  # nobody holds it: let go of, or its holder died
                elif not core.probe.trust_locks and self._break(path):
                    free += 1
            finally:
                sc.close_read(fd)
        return max(0, free - len(self._past(limit)))

    def running(self, limit: Limit) -> int:
        """Slots of ``limit`` held now (``JobStore.limits``), past a lowered limit's too."""
        if limit.concurrency is None:
            return 0
        return (sum(1 for i in range(limit.concurrency) if self._busy(self._slot_path(limit, i)))
                + len(self._past(limit)))

    def _past(self, limit: Limit) -> list[str]:
        """Slots held past ``concurrency`` (taken before the limit was lowered); the free ones
        among them are unlinked, so that once they have ended a claim looks at no more than N."""
        assert limit.concurrency is not None
        held = []
        directory = self._core.layout.limit_dir(limit.id)
        for name in fs.scan_names(directory):
            if name[:1] == "c" and name[1:].isdigit() and int(name[1:]) >= limit.concurrency:
                path = f"{directory}/{name}"
                if self._busy(path):
                    held.append(path)
                else:
                    lock = NotifyLock.try_acquire(path, self._core.owner_id(), self._core.tree.perms.file_mode)
                    if lock is not None:
                        lock.release()  # unlinks it (it still names the file we locked), then lets go
        return held

    def _break(self, path: str) -> bool:
        """Break a slot whose holder's heartbeat expired (a hung host keeps its locks), but only
        once no claim of that holder is left in ``active/``: until recovery has taken its jobs
        over, a holder that resumes commits what it ran, and a slot given away before that let
        one job more than the limit run (the two-host chaos, ``over_limit`` 1 in a 2,000-job run)."""
        return break_if_expired(path, self._core.owner_id(), self._core.probe, unless=self._has_claims)

    def _has_claims(self, owner: str) -> bool:
        return any((m := ACTIVE_RE.match(name)) is not None and token_owner(m["token"]) == owner
                   for name in fs.scan_names(self._core.layout.active))

    def _busy(self, path: str) -> bool:
        try:
            fd = sc.open(path, os.O_RDONLY | fs.O_NOFOLLOW | os.O_NONBLOCK | fs.O_CLOEXEC)
        except OSError:
            return False
        try:
            return not _unheld(fd)
        finally:
            sc.close_read(fd)

    def _ensure_dir(self, path: str) -> None:
        if path not in self._dirs:
            if os.path.dirname(path) == self._core.layout.limits:
                self._ensure_dir(self._core.layout.limits)  # limits/<H>: limits/ is made when first used too
            self._core.tree.ensure_dir(path)
            self._dirs.add(path)

    # == watchers =================================================================================
    def _watch(self, limit: Limit) -> None:
        """Wait, in a thread per busy slot, for its holder to let go: a holder that dies lets go
        at that instant, and nothing else would tell this process (no file changes)."""
        if not self._core.probe.trust_locks or limit.concurrency is None:
            return  # across hosts: a release rings the doorbell, and recovery judges expiry
        for i in range(limit.concurrency):
            path = self._slot_path(limit, i)
            with self._mutex:
                if path in self._watched or len(self._watched) >= MAX_WATCHERS:
                    continue
                self._watched.add(path)
            thread = threading.Thread(target=self._wait_for, args=(path, limit), daemon=True,
                                      name="fsjobstore-slot-watch")
            try:
                thread.start()
            except RuntimeError:  # no threads left: the next poll looks instead
                with self._mutex:
                    self._watched.discard(path)

    def _wait_for(self, path: str, limit: Limit) -> None:
        died = True  # a holder that ends empties its slot before it lets go (and promotes itself)
        try:
            try:
                fd = sc.open(path, os.O_RDONLY | fs.O_NOFOLLOW | os.O_NONBLOCK | fs.O_CLOEXEC)
            except OSError:
                fd = None  # gone: it is free already
            if fd is not None:
                try:
                    sc.wait_lock_shared(fd)
                    sc.unlock(fd)
                    died = holder_died(fd, path)
                finally:
                    sc.close_read(fd)
        except Exception:  # a watcher is a hint: the next poll looks anyway
            log.debug("watching slot %s failed", path, exc_info=True)
        finally:
            with self._mutex:
                self._watched.discard(path)
        if self._core.closed or self._core.forked():
            return
        try:
            if died and limit.kind == "key":
                self.promote(limit)
        except Exception:
            log.debug("promoting after slot %s freed failed", path, exc_info=True)
        self._wake()


def _unheld(fd: int) -> bool:
    """Whether nobody holds the lock of the slot file open on ``fd`` (a shared try, let go of at
    once). ESTALE: another host broke the file (unlinked it) since our open, as on the GlusterFS
    bed, where it ended a promotion with an error: nobody holds the file we opened."""
    try:
        if not sc.try_lock_shared(fd):
            return False
    except OSError as exc:
        if exc.errno not in sc.GONE:  # ENOENT: GlusterFS says it too
            raise
        return True
    with contextlib.suppress(OSError):
        sc.unlock(fd)
    return True
