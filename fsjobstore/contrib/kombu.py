"""A kombu transport on a job store: ``kombu.Connection("fsjobstore:///var/lib/myapp/jobs")``.

Celery and kombu name it by its URL once ``fsjobstore[celery]`` is installed (the wheel's
``fsjobstore-kombu.pth`` adds the ``fsjobstore`` alias to kombu's table when kombu is imported;
``import fsjobstore.contrib.kombu`` does the same). The URL's path is the store's directory:
``fsjobstore:///var/lib/myapp/jobs`` (absolute), ``fsjobstore://jobs`` (relative to the working
directory).

How kombu's model maps onto the store (the guide "Celery on a directory" says it for users):

- A message is a job in the queue's job queue; its request is the message (headers, properties,
  and a JSON body as JSON, so the dashboard and ``fsjobstore get`` show it readably).
- A delivered, unacknowledged message is a lease the store heartbeats: a consumer that dies, or
  hangs past ``lease_duration``, loses nothing; its messages are taken over and delivered again.
  ``ack`` fulfils the job; ``reject(requeue=True)`` ends an attempt "requeued" (so the next
  delivery is ``redelivered``); ``reject(requeue=False)`` fails it for good (``failed``, error
  "rejected"); a closing channel releases what it holds.
- Priorities: kombu's 0-9, higher first, as AMQP's (the job's priority is its negative).
- Bindings are shared by every process on the directory: ``<store>/contrib/kombu/bindings/``
  holds one small file per binding (FORMAT.md, "Files of the contrib layer"). Direct, topic and
  fanout exchanges route by them when a message is published; a fanout or topic exchange makes a
  job per bound queue.
- A consumer waits on the store's inotify descriptor (:meth:`JobStore.wakeups`), registered with
  kombu's event loop (Celery's hub), or in ``drain_events``: it wakes when a job arrives, not on a
  polling interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, virtual

import fsjobstore
from fsjobstore import JobStore, JobStoreError, LeaseLost, WorkLease

from ._bindings import LIVE_FOR, TOUCH_EVERY, Bindings
from ._messages import from_request, is_message, to_request
from ._stores import close_stores, queue_name, store_for, store_options, store_path, wait_readable, warn_relative

__all__ = ["LIVE_FOR", "Channel", "QoS", "StoreUnavailable", "Transport", "close_stores", "is_message", "queue_name",
           "store_for", "store_path"]

log = logging.getLogger(__name__)

TRANSPORT_ALIASES.setdefault("fsjobstore", "fsjobstore.contrib.kombu:Transport")

_ENDLESS = 1_000_000  # the store's most attempts: a requeue is an attempt (so it is seen, and redelivered)


class StoreUnavailable(ConnectionError):
    """The store named by the URL cannot be opened: a connection error to kombu (retried as one)."""


class QoS(virtual.QoS):
    """Prefetch as kombu counts it; each delivered message holds its job's lease until settled."""

    def ack(self, delivery_tag: str) -> None:
        self.channel.settle(delivery_tag, "ack")
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.channel.settle(delivery_tag, "requeue" if requeue else "reject")
        self._quick_ack(delivery_tag)  # not the base's: it would publish the message again

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Give every held message back to its queue (a channel closing, ``basic_recover``)."""
        self._flush()
        errors: list[tuple[BaseException, Any]] = []
        while self._delivered:
            tag, message = self._delivered.popitem()
            try:
                self.channel.settle(tag, "restore")
            except Exception as exc:
                errors.append((exc, message))
        return errors


class Channel(virtual.Channel):
    QoS = QoS
    supports_fanout = True
    do_restore = True
    # kombu's: 0-9, higher first.
    min_priority = 0
    max_priority = 9

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.store: JobStore = connection.store
        self.bindings: Bindings = connection.bindings
        self.held: dict[str, tuple[WorkLease, float]] = {}  # tag -> its lease, and when it was delivered
        self.live_queues: set[str] = set()  # declared auto-delete or exclusive by this channel
        self._no_ack: set[str] = set()  # consumed with no_ack: a delivery is its acknowledgement
        self._getting_no_ack = False

    # -- queues ------------------------------------------------------------------------------------
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        priority = self._get_message_priority(message)
        request = to_request(message)
        expiration = (message.get("properties") or {}).get("expiration")
        if expiration is not None:  # milliseconds, as AMQP says: the message is dropped unread after it
            with contextlib.suppress(TypeError, ValueError):
                request["expires_at"] = time.time() + float(expiration) / 1000.0
        # As many attempts as there can be: only reject(requeue=False) ends a message, as in AMQP.
        # A message to a live queue (a reply, a remote-control broadcast) is gone once it is read:
        # kept, each would list its queue in `fsjobstore status` for the store's retention.
        retain = 0 if self.bindings.is_live(queue) else None
        self.store.create(request, queue=queue_name(queue), priority=-priority, max_attempts=_ENDLESS, retain=retain)

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        for queue in sorted({q for _, _, q in self.bindings.table(exchange)}):
            self._put(queue, message)

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        while True:
            lease = self.store.pull_work(queues=queue_name(queue), timeout=0)
            if lease is None:
                raise Empty()
            request = lease.request
            if not is_message(request):
                # Not a kombu message (a job made by other means in this queue): failed, visibly.
                with contextlib.suppress(JobStoreError):
                    lease.fail(f"not a kombu message: the request is {type(request).__name__}", retry=False)
                continue
            expires_at = request.get("expires_at")
            if isinstance(expires_at, (int, float)) and time.time() >= expires_at:
                # Dropped unread, as AMQP drops an expired message: cancelled, saying why, so it is
                # neither a failure to alert on nor lost without a trace.
                with contextlib.suppress(JobStoreError):
                    self.store.cancel(lease.id, "expired: its expiration passed before it was delivered")
                with contextlib.suppress(JobStoreError):
                    lease.release()
                continue
            try:
                message = from_request(request, lease.token, lease.attempt > 1)
            except Exception as exc:  # a planted or torn message: failed, visibly, not handed to kombu
                with contextlib.suppress(JobStoreError):
                    lease.fail(f"not a kombu message: {type(exc).__name__}: {exc}", retry=False)
                continue
            if queue in self._no_ack or self._getting_no_ack:
                # Nobody will acknowledge it (kombu's no_ack: at most once): it ends as it is handed over.
                with contextlib.suppress(LeaseLost):
                    lease.fulfill(None)
            else:
                self.held[lease.token] = (lease, time.time())
            return message

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack.add(queue)
        else:
            self._no_ack.discard(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        self._getting_no_ack = no_ack
        try:
            return super().basic_get(queue, no_ack, **kwargs)
        finally:
            self._getting_no_ack = False

    def settle(self, tag: str, how: str) -> None:
        held = self.held.pop(tag, None)
        if held is None:
            return  # not ours, or settled already
        lease = held[0]
        try:
            if how == "ack":
                lease.fulfill(None)
                self.connection.acked += 1
            elif how == "requeue":
                # An attempt that ends "requeued", not a release: the next delivery is marked
                # redelivered (attempt 2), as AMQP marks it, and the job's history shows why.
                lease.fail("requeued", retry=True, delay=0)
            elif how == "restore":
                lease.release()
            else:
                lease.fail("rejected", retry=False)
                self.connection.rejected += 1
        except LeaseLost as exc:
            # Taken over (this consumer was thought dead): another delivery owns the message now.
            log.warning("message %s (job %s) could not be settled (%s): %s", tag, lease.id, how, exc)
        self.connection.settled()

    def _size(self, queue: str) -> int:
        stats = self.store.statistics()
        return int(stats.pending_by_queue.get(queue_name(queue), 0))

    def _purge(self, queue: str) -> int:
        return self.store.purge(states=("pending", "scheduled"), queue=queue_name(queue))

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self.bindings.remove_queue(queue)
        self._purge(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        # A queue is there once bound or holding a message; the store keeps no list of empty ones.
        return any(b["queue"] == queue for b in self.bindings.all()) or self._size(queue) > 0

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        # Any name maps to a queue of the store; what is kept is whether its bindings are live.
        arguments = kwargs.get("arguments") or {}
        if kwargs.get("auto_delete") or kwargs.get("exclusive") or "x-expires" in arguments:
            self.live_queues.add(queue)

    # -- exchanges and bindings ------------------------------------------------------------------
    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        kind = self.state.exchanges.get(exchange, {}).get("type", "direct")
        self.bindings.add(exchange, kind, routing_key or "", pattern or "", queue, live=queue in self.live_queues)

    def queue_unbind(self, queue: str, exchange: str | None = None, routing_key: str = "",
                     arguments: Any = None, **kwargs: Any) -> None:
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        self.bindings.remove(exchange or "amq.direct", routing_key or "", queue)

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        return self.bindings.table(exchange)

    def typeof(self, exchange: str, default: str = "direct") -> Any:
        kind = self.state.exchanges.get(exchange, {}).get("type") or self.bindings.kind(exchange) or default
        return self.exchange_types[kind]

    def close(self) -> None:
        super().close()  # gives back what QoS holds (restore_unacked)
        # Held by no QoS of this channel: a message kombu handed to another channel to reject,
        # when no consumer of its queue was left.
        for lease, _ in list(self.held.values()):
            with contextlib.suppress(JobStoreError):
                lease.release()
        self.held.clear()


class Transport(virtual.Transport):
    """kombu's transport for ``fsjobstore://`` URLs. Transport options (``transport_options`` in
    kombu, ``broker_transport_options`` in Celery) are :class:`~fsjobstore.JobStore`'s own:
    ``lease_duration``, ``heartbeat_interval``, ``poll_interval``, ``max_request_bytes``,
    ``durable``, ``group``, ``lock_takeover``, ``doorbell``, ``retain`` (how long an acknowledged
    message's job is kept)."""

    Channel = Channel
    driver_type = "fsjobstore"
    driver_name = "fsjobstore"
    can_parse_url = True
    default_port = None
    implements = virtual.Transport.implements.extend(
        asynchronous=True, exchange_type=frozenset(["direct", "topic", "fanout"]))

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._options = store_options(client.transport_options, "broker_transport_options")
        url = client.hostname if client.hostname and "://" in client.hostname else (client.virtual_host or "")
        self.path = store_path(url)
        warn_relative(url, self.path)
        self._store: JobStore | None = None
        self._bindings: Bindings | None = None
        self._wakeups: fsjobstore.Wakeups | None = None
        self._loop: Any = None
        self._loop_thread: int | None = None
        self._touched = float("-inf")
        self._published = float("-inf")
        self._worker_published = False
        self._started_at = time.time()
        self.acked = self.rejected = 0  # messages this connection acknowledged, and rejected for good

    @property
    def store(self) -> JobStore:
        """The store, opened when the connection is made (:meth:`establish_connection`)."""
        if self._store is None:
            try:
                self._store = store_for(self.path, **self._options)
            except JobStoreError as exc:
                raise StoreUnavailable(f"fsjobstore: cannot open the store at {self.path}: {exc}") from exc
        return self._store

    @property
    def bindings(self) -> Bindings:
        if self._bindings is None:
            self._bindings = Bindings(self.store)
        return self._bindings

    def establish_connection(self) -> Any:
        self.store  # noqa: B018  (opened here, so a store that cannot be opened is a connection error)
        return super().establish_connection()

    connection_errors = (StoreUnavailable, ConnectionError, OSError)  # type: ignore[assignment]
    channel_errors = (JobStoreError,)

    def driver_version(self) -> str:
        return fsjobstore.__version__

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        return uri

    @property
    def wakeups(self) -> fsjobstore.Wakeups:
        if self._wakeups is None:
            self._wakeups = self.store.wakeups("work")
        return self._wakeups

    # -- waiting without a thread ------------------------------------------------------------------
    def drain_events(self, connection: Any, timeout: Any = None, **kwargs: Any) -> None:
        """Deliver what is there, as AMQP's drain does (up to the prefetch limit), waiting up to
        ``timeout`` on the store's wake-ups for the first message (not a poll)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self._fair_cycle().get(self._deliver, timeout=timeout)
            except Empty:
                pass
            else:
                self._deliver_ready()
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError()  # socket.timeout, which kombu's callers catch
            self._sleep(left)

    def _fair_cycle(self) -> Any:
        assert self.cycle is not None  # made by the base class's constructor
        return self.cycle

    def _sleep(self, left: float | None) -> None:
        self._keep_alive()
        self._publish_worker()
        w = self.wakeups
        pause = min(w.interval, w.due_in())
        if left is not None:
            pause = min(pause, left)
        wait_readable(w.fileno(), pause)
        w.take()

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Celery's hub: wake on the store's inotify descriptor, and look again at the store's
        interval for what it cannot see (another host's jobs, a delay running out)."""
        self._loop = loop
        fd = self.wakeups.fileno()
        if fd is not None:
            loop.add_reader(fd, self._on_readable)
        loop.call_repeatedly(min(self.wakeups.interval, 1.0), self._on_readable)
        loop.call_soon(self._on_readable)

    def unregister_from_event_loop(self, connection: Any, loop: Any) -> None:
        fd = self._wakeups.fileno() if self._wakeups is not None else None
        if fd is not None:
            loop.remove_reader(fd)
        self._loop = None

    def _keep_alive(self) -> None:
        """Renew the live bindings of the queues this connection consumes (``Bindings``)."""
        now = time.monotonic()
        if now - self._touched < TOUCH_EVERY:
            return
        self._touched = now
        consumed = {q for ch in self.channels for q in ch._active_queues if q in ch.live_queues}
        with contextlib.suppress(OSError, JobStoreError):
            if consumed:
                self.bindings.touch(consumed)
            if any(ch._active_queues for ch in self.channels):  # a consumer, every 15 s: the dead's go
                self.bindings.sweep()

    def _publish_worker(self) -> None:
        """A consumer shows in ``fsjobstore workers``, the dashboard and ``/metrics`` as the
        store's own workers do: its queues, prefetch, and the messages it holds (about once a
        second, from the loop; a consumer that stops retracts it, one that dies is dropped)."""
        now = time.monotonic()
        consuming = [ch for ch in self.channels if ch._active_queues]
        if not consuming or now - self._published < 1.0:
            return
        self._published = now
        held = [{"id": lease.id, "queue": lease.queue, "attempt": lease.attempt, "started_at": at}
                for ch in consuming for lease, at in list(ch.held.values())]
        info = {"name": f"kombu@{socket.gethostname()}:{os.getpid()}", "mode": "kombu", "paused": False,
                "queues": sorted({queue_name(q) for ch in consuming for q in ch._active_queues}),
                "concurrency": max(ch.qos.prefetch_count for ch in consuming), "started_at": self._started_at,
                "jobs_done": self.acked, "jobs_failed": self.rejected, "current": held}
        with contextlib.suppress(JobStoreError, OSError):
            self.store.publish_worker(info)
            self._worker_published = True

    def _on_readable(self, *args: Any) -> None:
        self._loop_thread = threading.get_ident()
        self._keep_alive()
        self._publish_worker()
        if self._wakeups is not None:
            self._wakeups.take()
        self._deliver_ready()

    def _deliver_ready(self) -> None:
        for _ in range(1000):  # what is there now, as far as prefetch allows; the loop comes back for more
            try:
                self._fair_cycle().get(self._deliver, timeout=0)
            except Empty:
                return

    def settled(self) -> None:
        """A held message was settled: a prefetch slot is free, so look for the next one. From the
        loop's own thread, by a timer due now: the hub runs timers after the callbacks it took, and
        one added by a callback would otherwise wait for the next poll's timeout."""
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            loop.call_later(0, self._on_readable)
        else:
            loop.call_soon(self._on_readable)

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        if self._worker_published:
            self._worker_published = False
            with contextlib.suppress(JobStoreError, OSError):
                self.store.retract_worker()
        if self._wakeups is not None:
            self._wakeups.close()
            self._wakeups = None

    @property
    def default_connection_params(self) -> dict[str, Any]:
        return {"hostname": ""}

