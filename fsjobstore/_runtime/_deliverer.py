"""The notifier's loop (``fsjobstore notify``), on fsjobstore's public API only."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from .. import InvalidRequest, JobStore, JobStoreError, NotificationLease, check_queues

log = logging.getLogger("fsjobstore.worker")


class _StopNow(BaseException):
    """Raised in the notifier's main thread by a second Ctrl-C: stop in the middle of a delivery."""


class Deliverer:
    """The notifier's loop: deliver each final job's result to the targets that asked for it.

    ``deliver(target, note)`` is called once per waiting target (``note`` is the
    :class:`NotificationLease`: ``id``, ``state``, ``value``, ``error``, ``request``); it
    returns normally when the target was delivered, or raises (anything, ``SystemExit``
    included), and the target is offered again after a backoff with the error recorded.

    ``queues``: only results of jobs in these queues (names or patterns, as ``pull_work`` takes
    them); every queue when None.

    :meth:`run` called in the main thread stops gracefully on SIGTERM or SIGINT: the
    notification being delivered is finished (each of its targets tried), then it returns; a
    second SIGINT stops at once, keeping what was delivered and handing the rest back.
    """

    def __init__(self, store: JobStore, deliver: Callable[[Any, NotificationLease], object], *,
                 queues: str | Sequence[str] | None = None) -> None:
        if not callable(deliver):
            raise InvalidRequest(f"deliver must be callable, got {deliver!r}")
        self.store = store
        # Checked now, so a mistyped pattern fails at start rather than at the first pull.
        self.queues = check_queues(queues)
        self._deliver = deliver
        self._stop = threading.Event()
        self.stopped_by_signal = False
        self._delivering = False

    def stop(self) -> None:
        """Stop after the notification being delivered (thread-safe)."""
        self._stop.set()

    def run(self, *, burst: bool = False, poll: float = 1.0) -> tuple[int, int]:
        """Deliver until stopped (``burst``: until nothing is due, each notification tried at
        most once); returns (targets delivered, targets left to retry)."""
        self._stop.clear()
        with self._signals():
            delivered, failed = self._loop(burst, poll)
        if burst:
            self._say_what_was_left(tried_now=delivered + failed)
        return delivered, failed

    def _say_what_was_left(self, tried_now: int) -> None:
        """A burst ends once nothing is due; notifications may still wait: in a backoff after a
        failed delivery (tried again when it runs out), or of queues this notifier does not
        take. Say which and for how long, or "delivered 0" reads as nothing to deliver: a
        notification in its backoff, or a mistyped ``--queue 'mial-*'``, would go unseen."""
        try:
            ours = self.store.notifications(queues=self.queues)
            others = self.store.statistics().notifications - len(ours) if self.queues is not None else 0
        except JobStoreError:
            return
        if ours:
            now = time.time()
            first = ours[0]
            due = first.delivery_due_at or now
            why = (f"after {first.delivery_attempts} failed delivery(ies): {first.delivery_error}"
                   if first.delivery_attempts else "queued since this run looked")
            log.warning("%d notification(s) wait for a later delivery; the next, job %s (queue %s), is due in %.0f s, "
                        "%s", len(ours), first.id, first.queue, max(0.0, due - now), why)
        if others > 0 and not tried_now:
            log.warning("no notification of queue(s) %s was due; %d notification(s) wait, of other queues",
                        ", ".join(self.queues or ()), others)

    def _loop(self, burst: bool, poll: float) -> tuple[int, int]:
        delivered = failed = 0
        tried: set[str] = set()
        while not self._stop.is_set():
            note = self.store.pull_notification(queues=self.queues, timeout=0 if burst else poll)
            if note is None:
                if burst:
                    break
                continue
            if burst and note.id in tried:  # its retry is due already (no backoff): next run's
                note.release()
                break
            tried.add(note.id)
            done, last_error = [], None
            self._delivering = True
            try:
                for target in note.waiting:
                    try:
                        self._deliver(target, note)
                        done.append(target)
                    except _StopNow:
                        raise
                    except BaseException as exc:  # deliver code is untrusted; one bad target must not block others
                        last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                        log.warning("delivering job %s to %r failed: %s", note.id, target, last_error)
            except _StopNow:
                if done:
                    note.done(done, error="the notifier was stopped before the other targets")
                else:
                    note.release()
                log.info("notification of job %s: stopped at once; %d delivered, the rest handed back",
                         note.id, len(done))
                return delivered + len(done), failed + len(note.waiting) - len(done)
            finally:
                self._delivering = False
            note.done(done, error=last_error)
            delivered += len(done)
            failed += len(note.waiting) - len(done)
            log.info("notification of job %s (%s): %d delivered, %d to retry", note.id, note.state.value,
                     len(done), len(note.waiting) - len(done))
        return delivered, failed

    @contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT stop after the current notification (a second SIGINT: at once).
        Installed only when run() is called in the main thread (Python's rule for handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_stop(signum: int, frame: FrameType | None) -> None:
            now = signum == signal.SIGINT and self._stop.is_set()
            self.stopped_by_signal = True
            log.info("notifier got %s%s", signal.Signals(signum).name,
                     ": stopping now" if now else ": stopping after this notification")
            self._stop.set()
            if now and self._delivering:  # elsewhere (a pull) the loop ends within a poll anyway
                raise _StopNow()

        previous = {sig: signal.signal(sig, on_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
