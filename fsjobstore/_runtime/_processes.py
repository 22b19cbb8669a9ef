"""Process mode: ``concurrency`` child processes, each pulling and committing with its own copy
of the store, watched by a supervisor that claims nothing itself.

The supervisor reads the children's status board. A child whose job runs past its deadline, or
whose job was cancelled, is killed (SIGKILL: no handler can ignore it) and started anew; its
claim is then taken over by the supervisor's recovery pass, which counts the attempt as failed
(timed out) or ends the job cancelled. Stopping: children finish their job and exit; past
``grace`` they get SIGTERM, which gives their job back (released, no attempt counted); a child
that still does not exit is killed and its claim recovered.

The supervisor is not always single-threaded: the store may run a heartbeat thread in it (a
store opened with ``lock_takeover=False``), and the caller of ``Worker.run`` may have threads of
its own. A child inherits only the forking thread, so a lock another thread held at that instant
stays held in the child for good. :func:`fork_child` therefore forks with every logging
handler's lock held (no thread is then half-way through writing a log line, which would leave
the stream's own lock taken) and with every signal blocked until the child has installed its
handlers; the store resets its own locks and threads in a forked child (``os.register_at_fork``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import NamedTuple

from .. import JobStore, WorkLease
from ._board import Board
from ._restarts import Restarts
from ._run_flags import Gate
from ._slot import CANCEL_POLL, ENDED_BECAUSE, Handler, Tally, WorkerShutdown, fate, serve, tell
from ._worker_hooks import OF_OUTCOME, Hooks, JobEvent

log = logging.getLogger("fsjobstore.worker")


class _ChildReport:
    """A child's slot on the board; its counters start where its predecessor's ended. Each job's
    start (and each touch, which moves its deadline) rings the supervisor, which sleeps until
    then: it must know the new deadline."""

    def __init__(self, board: Board, index: int, ring: Callable[[], None]) -> None:
        self._board = board
        self._index = index
        self._ring = ring
        self._pid = os.getpid()
        self._tally = Tally(board.read(index).counts)
        board.write(index, busy=False, pid=self._pid, counts=self._tally.as_tuple())

    def started(self, lease: WorkLease) -> None:
        self._write(lease)
        self._ring()

    def touched(self, lease: WorkLease) -> None:
        self._write(lease)
        self._ring()

    def finished(self, event: JobEvent) -> None:
        self._tally.count(event)
        self._board.write(self._index, busy=False, pid=self._pid, counts=self._tally.as_tuple())

    def dropped(self) -> bool:
        return False  # a child past its time limit is killed, never left behind

    def _write(self, lease: WorkLease) -> None:
        self._board.write(self._index, busy=True, pid=self._pid, counts=self._tally.as_tuple(),
                          job_id=lease.id, queue=lease.queue, token=lease.token, attempt=lease.attempt,
                          started=time.monotonic(), deadline=lease.deadline)


def _die_with(parent: int) -> None:
    """Be killed when the supervisor dies, however it dies (Linux's PR_SET_PDEATHSIG): a
    worker killed with SIGKILL must not leave children working unsupervised. Their claims are
    then recovered like any dead process's."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the call above: nothing would tell us
        os._exit(0)


_PR_SET_PDEATHSIG = 1
UNENDED_LOOK = 0.05  # seconds between looks at a killed child's claim that another recoverer is ending


@contextlib.contextmanager
def _logging_quiet() -> Iterator[None]:
    """Hold every logging handler's lock (in one order), so no other thread is writing a line."""
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    handlers = sorted({id(h): h for lg in loggers for h in lg.handlers}.items())
    parent = os.getpid()
    held: list[logging.Handler] = []
    try:
        for _, handler in handlers:
            handler.acquire()
            held.append(handler)
        yield
    finally:
        if os.getpid() == parent:  # in the child, logging re-made these locks already
            for handler in reversed(held):
                handler.release()



def fork_child(body: Callable[[], None]) -> int:
    """Fork; the child runs ``body`` (which must not return) with every signal blocked until
    it unblocks them. Returns the child's pid in the parent. See the module docstring."""
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        with _logging_quiet():
            pid = os.fork()
        if pid == 0:
            try:
                body()
            finally:
                os._exit(1)  # body never returns; this is for a bug in it
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return pid


def _child(store: JobStore, handlers: Mapping[str, Handler], queues: Sequence[str], gate: Gate, hooks: Hooks,
           board: Board, index: int, burst: bool, parent: int, ring: Callable[[], None],
           unblocked: set[int | signal.Signals]) -> None:
    """The body of a child process; never returns. Starts with every signal blocked."""

    def shutdown(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise WorkerShutdown()

    # Ctrl-C reaches the whole process group: the supervisor decides what it means.
    for sig in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, shutdown)
    signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    _die_with(parent)
    code = 0
    try:
        serve(store, handlers, queues, gate, _ChildReport(board, index, ring), hooks, burst=burst)
    except WorkerShutdown:
        pass
    except BaseException:
        log.exception("worker process %d failed", os.getpid())
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            store.close()  # gives back a job claimed but not yet run (a stop during a pull)
        finally:
            logging.shutdown()
            os._exit(code)


class Unended(NamedTuple):
    """The attempt of a child killed or dead mid-job, told once recovery has ended its claim."""

    job_id: str
    queue: str
    attempt: int
    killed: str | None  # our kill's outcome ("timed-out", "cancelled"), or None: it died
    since: float  # monotonic: when it was reaped
    started: float  # monotonic: when the attempt began


class ProcessPool:
    def __init__(self, store: JobStore, handlers: Mapping[str, Handler], queues: Sequence[str], gate: Gate,
                 hooks: Hooks, concurrency: int, *, burst: bool, ring: Callable[[], None]) -> None:
        self._store = store
        self._handlers = handlers
        self._queues = queues
        self._gate = gate
        self._hooks = hooks
        self._board = Board(concurrency)
        self._burst = burst
        self._ring = ring
        self._pids: list[int | None] = [None] * concurrency
        self._pidfds: dict[int, int] = {}  # slot -> a descriptor readable once its child exits
        self._killed: dict[int, str] = {}  # slot -> our kill's outcome
        self._extra = Tally()  # attempts of killed or dead children, which could not count them
        self._crashed: list[Unended] = []
        self._restarts = Restarts()
        self._next_cancel_look = 0.0
        # The supervisor claims nothing, so its store runs no heartbeat thread: it recovers the
        # claims of dead processes itself, as that thread would.
        self._next_recover = time.monotonic() + store.lease_duration / 2

    def start(self) -> None:
        for i in range(len(self._pids)):
            self._spawn(i)

    def _spawn(self, index: int) -> None:
        # The slot still shows its last child's job (busy, its deadline passed) until the new
        # child writes it, which a loaded machine can delay past the next tick: that tick would
        # take the overrun for the new child's and kill it, again and again (seen in CI: one
        # time-out counted 4 times). Its last child is dead and reaped, so nobody else writes
        # the slot: mark it idle, keeping its counts, before the new child exists.
        self._board.write(index, busy=False, pid=0, counts=self._board.read(index).counts)
        parent = os.getpid()
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the mask to restore in the child
        pid = fork_child(lambda: _child(self._store, self._handlers, self._queues, self._gate, self._hooks,
                                        self._board, index, self._burst, parent, self._ring, unblocked))
        self._pids[index] = pid
        with contextlib.suppress(OSError):  # no pidfd (an old kernel): the supervisor polls instead
            self._pidfds[index] = os.pidfd_open(pid)
        self._restarts.born(index)

    def alive(self) -> bool:
        # A burst is not over while a killed child's claim waits for its recoverer: its line
        # and its count are still to come.
        return any(pid is not None for pid in self._pids) or self._restarts.waiting() or bool(self._crashed)

    def wait_fds(self) -> list[int]:
        """Descriptors that become readable when the supervisor has something to do (a child
        exited)."""
        return list(self._pidfds.values())

    def next_tick(self, now: float) -> float:
        """Seconds until the supervisor must look again if nothing rings: the nearest deadline of a
        running job, a restart due, or the next look at cancel requests while jobs run."""
        due: list[float] = [self._restarts.next_due() - now] if self._restarts.waiting() else []
        due.append(self._next_recover - now)
        if self._crashed:
            due.append(UNENDED_LOOK)
        if len(self._pidfds) < sum(pid is not None for pid in self._pids):
            due.append(0.1)  # a child without a pidfd: look for its exit
        for i, pid in enumerate(self._pids):
            view = self._board.read(i)
            if pid is None or not view.busy or i in self._killed:
                continue
            due.append(max(0.0, self._next_cancel_look - now))
            if view.deadline:
                due.append(view.deadline - now)
        return max(0.0, min(due, default=3600.0))

    def tick(self) -> None:
        """Reap children, kill the ones that overran or whose job was cancelled, start new ones,
        recover dead processes' claims every half lease. Raises WorkerFailing when children keep
        dying at start (see _restarts)."""
        now = time.monotonic()
        stopping = self._gate.stopping()
        recover = now >= self._next_recover
        look_at_cancels = now >= self._next_cancel_look
        if look_at_cancels:
            self._next_cancel_look = now + CANCEL_POLL
        for i in self._restarts.look(self.tally().ended(), stopping=stopping):
            self._spawn(i)
        for i, pid in enumerate(self._pids):
            if pid is None:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self._pids[i] = None
                fd = self._pidfds.pop(i, None)
                if fd is not None:
                    os.close(fd)
                recover |= self._exited(i, status, stopping)
                continue
            view = self._board.read(i)
            if not view.busy or i in self._killed:
                continue
            outcome = why = None
            if view.deadline and now > view.deadline:
                outcome, why = "timed-out", f"ran past its time limit (ran {now - view.started:.1f}s)"
            elif look_at_cancels and self._store.cancel_requested(view.job_id):
                outcome, why = "cancelled", "was cancelled while it ran"
            # RACE: the child may have moved to another job since we read its slot; we check its
            # sequence count again right before the kill, and a move in the instant after that
            # costs the new job one attempt, like any crash (it is recovered and runs again).
            if outcome is not None and self._board.read(i).seq == view.seq:
                self._killed[i] = outcome
                os.kill(pid, signal.SIGKILL)
                log.info("job %s queue=%s attempt=%d %s: %s; its process is killed", view.job_id, view.queue,
                         view.attempt, outcome, why)
        if recover or self._crashed:
            # The claims of killed or crashed children: retried, failed or cancelled. Not deep: a
            # child's death is no power cut, and a deep pass reads every job file of the store.
            self._store.recover(deep=False)
            self._next_recover = now + self._store.lease_duration / 2
            self._count_crashed(now)

    def _count_crashed(self, now: float) -> None:
        """Jobs whose child was killed (a time-out, a cancel) or died mid-job, once recovery has
        ended their attempt: the job's state says how it went on, and one log line says so, as
        :func:`run_one` says ``retrying`` or ``failed``. A crashed child could not count its
        attempt: it is counted here (a crash after its commit was written leaves it fulfilled).

        Our own pass may not be the one that ends it: another process's recovery (a child just
        started runs one) may have fenced the claim first and be writing its outcome. Until it
        has, the job reads ``active``: told "retrying" then, a job that had no attempt left was
        logged as retrying and then failed (seen in CI). So such a job is looked at again at the
        next tick, for up to a lease; past that (the recoverer died too), it is told as
        retrying, which recovery will make true or end as failed."""
        left = []
        for dead in self._crashed:
            # None: unreadable (recovery has said why in the log), or purged meanwhile
            then = fate(self._store, dead.job_id, dead.attempt) or "lost"
            if then == "running":
                if now - dead.since < self._store.lease_duration:
                    left.append(dead)
                    continue
                log.warning("job %s: its claim was not ended within %.0fs of its process's end; "
                            "recovery ends it later", dead.job_id, now - dead.since)
                then = "retrying"
            # Ours killed it: counted as why (a time-out, a cancel). It died: as its job went on.
            outcome = dead.killed or (then if then in ("fulfilled", "failed", "cancelled", "retrying") else "lost")
            name = OF_OUTCOME[outcome]
            why = ENDED_BECAUSE.get(name if dead.killed else "", "its process died")
            tell(JobEvent(name, dead.job_id, dead.queue, dead.attempt, name, now - dead.started, why, then),
                 self._extra, self._hooks)
        self._crashed = left

    def _exited(self, index: int, status: int, stopping: bool) -> bool:
        killed = self._killed.pop(index, None)
        view = self._board.read(index)
        # A child that exits while it holds a job crashed, whatever its status (a handler's
        # os._exit(0), a C library's exit(0)): it was not told to stop mid-job.
        clean = os.waitstatus_to_exitcode(status) == 0 and killed is None and not view.busy
        if not clean and killed is None:
            log.warning("worker process %d exited with %s%s; its job is recovered", view.pid or -1,
                        os.waitstatus_to_exitcode(status), f" while running job {view.job_id}" if view.busy else "")
        if killed is not None or (not clean and view.busy):
            self._crashed.append(Unended(view.job_id, view.queue, view.attempt, killed, time.monotonic(),
                                         view.started))
        # A child exits cleanly only when told to (stop), when the run's budget is spent, or in a
        # burst when nothing is due: none of those wants a new one. A kill (ours) wants one at
        # once; a crash wants one after a delay that grows while children keep crashing at start.
        if not stopping and killed is not None:
            self._spawn(index)
        elif not stopping and not clean:
            self._restarts.died(index, "worker processes")
        return not clean

    def running(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for i, pid in enumerate(self._pids):
            view = self._board.read(i)
            if pid is not None and view.busy:
                out.append({"id": view.job_id, "queue": view.queue, "attempt": view.attempt,
                            "started_at": time.time() - (time.monotonic() - view.started), "pid": view.pid})
        return out

    def tally(self) -> Tally:
        total = self._extra
        for i in range(len(self._pids)):
            total = total + Tally(self._board.read(i).counts)
        return total

    def give_back(self) -> None:
        """SIGTERM: each child gives its job back and exits; the stubborn are killed, and their
        claims recovered."""
        self._gate.set_stop()
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while self.alive() and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.02)
        if self.alive():
            log.warning("worker processes did not stop within 5 s of SIGTERM: killing them")
            self._kill_all()

    def close(self) -> None:
        if self.alive():
            self.give_back()

    def _signal_all(self, sig: int) -> None:
        for pid in self._pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def _kill_all(self) -> None:
        self._signal_all(signal.SIGKILL)
        for i, pid in enumerate(self._pids):
            if pid is not None:
                os.waitpid(pid, 0)
                self._pids[i] = None
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()
        self._crashed.clear()  # told no more: the run is ending, and recovery ends their claims
        self._store.recover(deep=False)
