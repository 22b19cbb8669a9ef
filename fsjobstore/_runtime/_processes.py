"""Process mode: ``concurrency`` child processes, each pulling and committing with its own copy
of the store, watched by a supervisor that claims nothing itself.

The supervisor stays single-threaded (so forking a child never copies a lock some other thread
held) and reads the children's status board. A child whose job runs past its deadline, or whose
job was cancelled, is killed (SIGKILL: no handler can ignore it) and started anew; its claim is
then taken over by the supervisor's recovery pass, which counts the attempt as failed (timed
out) or ends the job cancelled. Stopping: children finish their job and exit; past ``grace``
they get SIGTERM, which gives their job back (released, no attempt counted); a child that
still does not exit is killed and its claim recovered.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from .. import JobStore, WorkLease
from ._board import Board
from ._restarts import Restarts
from ._slot import Handler, WorkerShutdown, serve

log = logging.getLogger("fsjobstore.worker")


class _ChildGate:
    def __init__(self, board: Board) -> None:
        self._board = board

    def stopping(self) -> bool:
        return self._board.stopping()

    def paused(self) -> bool:
        return self._board.paused()

    def take(self) -> bool:
        return self._board.take()

    def give_back(self) -> None:
        self._board.give_back()


class _ChildReport:
    """A child's slot on the board; its counters start where its predecessor's ended."""

    def __init__(self, board: Board, index: int) -> None:
        self._board = board
        self._index = index
        self._pid = os.getpid()
        last = board.read(index)
        self._done, self._failed = last.done, last.failed
        board.write(index, busy=False, pid=self._pid, done=self._done, failed=self._failed)

    def started(self, lease: WorkLease) -> None:
        self._write(lease)

    def touched(self, lease: WorkLease) -> None:
        self._write(lease)

    def finished(self, outcome: str) -> None:
        if outcome in ("failed", "retrying", "timed-out"):
            self._failed += 1
        elif outcome != "released":
            self._done += 1
        self._board.write(self._index, busy=False, pid=self._pid, done=self._done, failed=self._failed)

    def _write(self, lease: WorkLease) -> None:
        self._board.write(self._index, busy=True, pid=self._pid, done=self._done, failed=self._failed,
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


def _child(store: JobStore, handlers: Mapping[str, Handler], queues: Sequence[str], board: Board, index: int,
           burst: bool, parent: int) -> None:
    """The body of a child process; never returns."""

    def shutdown(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise WorkerShutdown()

    # Ctrl-C reaches the whole process group: the supervisor decides what it means.
    for sig in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, shutdown)
    _die_with(parent)
    code = 0
    try:
        serve(store, handlers, queues, _ChildGate(board), _ChildReport(board, index), burst=burst)
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


class ProcessPool:
    def __init__(self, store: JobStore, handlers: Mapping[str, Handler], queues: Sequence[str], board: Board,
                 concurrency: int, *, burst: bool) -> None:
        self._store = store
        self._handlers = handlers
        self._queues = queues
        self._board = board
        self._burst = burst
        self._pids: list[int | None] = [None] * concurrency
        self._killed: dict[int, tuple[str, str]] = {}  # slot -> (why, job id)
        self._extra_failed = 0  # attempts of killed children, which could not count them
        self._restarts = Restarts()

    def start(self) -> None:
        for i in range(len(self._pids)):
            self._spawn(i)

    def _spawn(self, index: int) -> None:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(self._store, self._handlers, self._queues, self._board, index, self._burst, parent)
        self._pids[index] = pid
        self._restarts.born(index)

    def alive(self) -> bool:
        return any(pid is not None for pid in self._pids) or self._restarts.waiting()

    def tick(self, *, stopping: bool) -> None:
        """Reap children, kill the ones that overran or whose job was cancelled, start new ones.
        Raises WorkerFailing when children keep dying at start (see _restarts)."""
        now = time.monotonic()
        recover = False
        for i in self._restarts.look(sum(self.counts()), stopping=stopping):
            self._spawn(i)
        for i, pid in enumerate(self._pids):
            if pid is None:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self._pids[i] = None
                recover |= self._exited(i, status, stopping)
                continue
            view = self._board.read(i)
            if not view.busy or i in self._killed:
                continue
            why = None
            if view.deadline and now > view.deadline:
                why = f"timed-out (killed {now - view.started:.1f}s after it started)"
            elif self._store.cancel_requested(view.job_id):
                why = "cancelled (its process was killed)"
            # RACE: the child may have moved to another job since we read its slot; we check its
            # sequence count again right before the kill, and a move in the instant after that
            # costs the new job one attempt, like any crash (it is recovered and runs again).
            if why is not None and self._board.read(i).seq == view.seq:
                self._killed[i] = (why, view.job_id)
                os.kill(pid, signal.SIGKILL)
        if recover:
            self._store.recover()  # the claims of killed or crashed children: retried, failed or cancelled

    def _exited(self, index: int, status: int, stopping: bool) -> bool:
        killed = self._killed.pop(index, None)
        view = self._board.read(index)
        clean = os.waitstatus_to_exitcode(status) == 0 and killed is None
        if killed is not None:
            why, job_id = killed
            log.info("job %s queue=%s attempt=%d %s", job_id, view.queue, view.attempt, why)
            self._extra_failed += 1
        elif not clean:
            log.warning("worker process %d exited with %s%s; its job is recovered", view.pid or -1,
                        os.waitstatus_to_exitcode(status), f" while running job {view.job_id}" if view.busy else "")
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

    def counts(self) -> tuple[int, int]:
        views = [self._board.read(i) for i in range(len(self._pids))]
        return sum(v.done for v in views), sum(v.failed for v in views) + self._extra_failed

    def signal_busy(self, sig: int) -> None:
        for pid in self._pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def kill_all(self) -> None:
        self.signal_busy(signal.SIGKILL)
        for i, pid in enumerate(self._pids):
            if pid is not None:
                os.waitpid(pid, 0)
                self._pids[i] = None
        self._store.recover()
