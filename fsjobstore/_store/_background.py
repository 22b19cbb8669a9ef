"""The background threads of a store that pulls: heartbeats, lease checks, periodic recovery.

Started by a store's first pull (or, in a heartbeat-only store, as soon as the store has an owner
identity: a producer there must beat too). The heartbeat thread only beats: each beat rewrites
the owner file (so observers see this process alive), then tells every held lease whose claim or
lock is gone, or every held lease if this process could not beat in time (``stalled``). A
recovery pass, every ``max(heartbeat_interval, lease_duration / 2)``, has a thread of its own, so
a long pass (a network filesystem lists a directory in milliseconds, not microseconds) never
delays a beat: a pass longer than a lease on the heartbeat's thread had this process give up its
own claims as stalled. A third thread removes final jobs whose retention is over
(``_retention``): a bounded batch per pass, passes repeated quickly while a backlog is left.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from .._core._control import Control
from .._core._core import Core
from .._core._hooks import Hooks
from .._core._liveness import OwnerGone
from .._errors import LeaseLost
from .._transitions._notify import Notifier
from .._transitions._recovery import boot_pass, recover
from .._transitions._retention import Retention
from .._transitions._work import Work

log = logging.getLogger("fsjobstore")

RETENTION_INTERVAL = 1.0  # seconds between retention passes with nothing left to remove
FIRST_PASS_WAIT = 60.0  # seconds a pull waits for another thread's first recovery pass


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT, whose KeyboardInterrupt only the main thread ever gets) until the
    block is done, then hand it to the handler that was there: the threads start and the first
    pass is marked made together, or not at all. One that landed between two threads' starts left
    the next pull waiting for ever for a recovery thread that was never started."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append((signum, frame))

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held and callable(previous):
            previous(*held[0])  # Python's own: KeyboardInterrupt, now that all is started
        elif held and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


class Background:
    def __init__(self, core: Core, hooks: Hooks, work: Work, notifier: Notifier, control: Control) -> None:
        self._core = core
        self._hooks = hooks
        self._work = work
        self._notifier = notifier
        self._control = control
        self.retention = Retention(core, hooks)
        self._reset()

    def _reset(self) -> None:
        self.thread: threading.Thread | None = None
        self.watchdog: threading.Thread | None = None
        self.recoverer: threading.Thread | None = None
        self.remover: threading.Thread | None = None
        self._starting = threading.Lock()  # held by the one caller making the first pass (start)
        self.stop_event = threading.Event()
        self._first_pass = threading.Event()
        self._last_beat = self._core.clock()
        self._last_success = self._core.clock()  # of the last beat that reached the owner file

    def after_fork(self) -> None:
        self._reset()

    def start(self) -> None:
        """Start the threads, after one recovery pass in the calling thread: a process's first
        pull must already see the jobs of workers that died before it started (a cron worker
        pulls once, and a background pass would come too late for it).

        One caller makes that pass and starts the threads; the others wait for it on a lock and
        then find it done. A caller cut short during the pass (a Ctrl-C in a REPL: a
        KeyboardInterrupt) leaves it undone, for the next caller to do; a Ctrl-C while the
        threads start comes once they all run (_ctrl_c_held). Never half done: a store whose
        pulls go on with no heartbeat thread would lose every claim after a lease, and one with
        no recovery thread had the next pull wait for ever. A closed store returns at once (its
        pull then says it is closed)."""
        if self._first_pass.is_set():
            return  # the common case, every pull after the first: no lock taken
        core = self._core
        core.ensure_owner()  # in a heartbeat-only store this starts the threads itself (keep_beating)
        if not self._starting.acquire(timeout=FIRST_PASS_WAIT):
            return  # another thread's first pass hangs (a hung mount): go on, as it will
        try:
            if self._first_pass.is_set() or core.closed:
                return
            if self.thread is None:
                # Not deep: the once-per-boot look for files a power cut emptied reads every job
                # file's size (25 s at a million pending), so the retention thread makes it
                # (_remove), and a first pull waits only for what can need repair. A worker that
                # claims an emptied file before that pass meets it quarantines it just the same.
                self._recover(deep=False)
                with _ctrl_c_held():
                    self._start_threads(first_pass_made=True)
                    self._first_pass.set()  # pulls waiting for it go on
                return
        finally:
            self._starting.release()
        # Started by keep_beating: the recovery thread makes the first pass.
        while not self._first_pass.wait(0.1):
            if self.stop_event.is_set():
                return

    def keep_beating(self) -> None:
        """Start the threads without waiting for the first recovery pass, which the recovery thread
        makes (a create must not wait for one); a later first pull waits for that pass."""
        with self._starting, _ctrl_c_held():
            if self.thread is None and not self._core.closed:
                self._start_threads(first_pass_made=False)

    def _start_threads(self, *, first_pass_made: bool) -> None:
        core = self._core
        self._last_beat = self._last_success = core.clock()
        self.thread = threading.Thread(target=self._run, name=f"fsjobstore-heartbeat-{core.pid}", daemon=True)
        self.thread.start()
        self.watchdog = threading.Thread(target=self._watch, name=f"fsjobstore-watchdog-{core.pid}", daemon=True)
        self.watchdog.start()
        self.recoverer = threading.Thread(target=self._recover_loop, args=(first_pass_made,),
                                          name=f"fsjobstore-recovery-{core.pid}", daemon=True)
        self.recoverer.start()
        self.remover = threading.Thread(target=self._remove, name=f"fsjobstore-retention-{core.pid}", daemon=True)
        self.remover.start()

    def _recover(self, *, deep: bool | None) -> None:
        try:
            recover(self._core, self._hooks, self._notifier, self._control, deep=deep)
        except Exception:
            log.exception("recovery failed; will try again")

    def _run(self) -> None:
        while not self.stop_event.wait(self._core.settings.heartbeat_interval):
            self.beat_once()

    def _recover_loop(self, first_pass_made: bool) -> None:
        settings = self._core.settings
        if not first_pass_made:  # started by keep_beating: the first pass is ours (not deep: see start)
            try:
                self._recover(deep=False)
            finally:
                self._first_pass.set()  # pulls waiting for it go on, whatever happened
        while not self.stop_event.wait(max(settings.heartbeat_interval, settings.lease_duration / 2)):
            self._recover(deep=False)

    def _remove(self) -> None:
        """Retention passes: every RETENTION_INTERVAL, and while a backlog is left, again after
        a pause twice as long as the pass took, so removing a backlog takes at most a third of
        the time this process's workers could use (they keep most of their rate meanwhile)."""
        core = self._core
        self._first_pass.wait(FIRST_PASS_WAIT)  # after the first recovery pass, which finishes cut-short removals
        if not self.stop_event.is_set():
            boot_pass(core, self.stop_event.is_set)  # once per boot of the host, by one process: see start
        pause = 0.0
        while not self.stop_event.wait(pause):
            began = core.clock()
            try:
                more = self.retention.run_pass().more
            except Exception:
                log.exception("retention pass failed; will try again")
                more = False
            pause = max(0.005, 2 * (core.clock() - began)) if more else RETENTION_INTERVAL

    def _watch(self) -> None:
        """Judge, on this process's monotonic clock alone, whether its heartbeat still lands.

        The heartbeat thread can block inside a hung mount (a stopped FUSE client, an NFS server
        gone) and with it every lease check it makes; others take our claims after a lease
        without beats. This thread never touches the filesystem, so it can tell every holder
        at 0.75 x lease_duration after the last beat that landed, hung mount or not."""
        core, settings = self._core, self._core.settings
        told = False
        while not self.stop_event.wait(min(settings.heartbeat_interval / 2, 1.0)):
            silent = core.clock() - self._last_success
            if silent <= 0.75 * settings.lease_duration:
                told = False
                continue
            if told:
                continue
            told = True
            problem = LeaseLost(f"this process's heartbeat has not landed for {silent:.1f}s (lease "
                                f"{settings.lease_duration}s): its disk or mount may hang, and its claims may "
                                "be taken over", reason="stalled")
            self._work.check_held(problem)
            self._notifier.check_held(problem)

    def beat_once(self) -> None:
        core = self._core
        owner = core.owner
        if owner is None:
            return
        now = core.clock()
        gap, self._last_beat = now - self._last_beat, now
        problem: LeaseLost | None = None
        try:
            owner.beat()
        except OwnerGone as exc:
            # Another process judged us gone (our heartbeat stopped for a lease: a hung disk,
            # a stopped process) and cleaned up after us. Our claims are its now; new ones are
            # made under a new identity.
            problem = LeaseLost(str(exc), reason="taken-over")
            core.replace_owner(owner)
        except OSError as exc:
            problem = LeaseLost(f"heartbeat could not be written: {exc}", reason="heartbeat-failed")
        else:
            self._last_success = core.clock()
        lease = core.settings.lease_duration
        if problem is None and gap > 0.75 * lease:
            problem = LeaseLost(f"this process did not beat for {gap:.1f}s (lease {lease}s); "
                                "its claims may have been taken over", reason="stalled")
        self._work.check_held(problem)
        self._notifier.check_held(problem)

    def stop(self) -> None:
        self.stop_event.set()
        for thread in (self.thread, self.watchdog, self.recoverer, self.remover):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5.0)
