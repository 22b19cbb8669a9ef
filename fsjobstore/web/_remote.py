"""Leases held for workers that speak HTTP (the JSON API's leases).

``POST /api/queues/{queue}/lease`` claims a job with this process's store and keeps its
:class:`WorkLease` here under a random handle; the client then fulfils, fails, releases, touches
or reports progress through ``/api/leases/{handle}/...``. The store's heartbeat keeps the claim
while this process lives (if it dies, the claim is recovered like any dead worker's). A client
that goes silent for longer than the lease it asked for loses it: the attempt fails ("its HTTP
worker stopped touching it") and the job runs again after its backoff, as a dead worker's would.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from dataclasses import dataclass, field

from .. import JobStore, JobStoreError, LeaseLost, WorkLease

MIN_LEASE, MAX_LEASE = 1.0, 3600.0


@dataclass
class Held:
    lease: WorkLease
    seconds: float  # how long the client may stay silent
    expires_at: float  # wall clock
    started: float = field(default_factory=time.monotonic)  # when the attempt was handed out



class RemoteLeases:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}

    def add(self, lease: WorkLease, seconds: float) -> tuple[str, Held]:
        handle = secrets.token_urlsafe(24)
        held = Held(lease, seconds, time.time() + seconds)
        with self._lock:
            self._held[handle] = held
        return handle, held

    def get(self, handle: str) -> Held:
        with self._lock:
            held = self._held.get(handle)
        if held is None or held.lease.finished:
            self.drop(handle)
            raise LeaseLost(f"no lease {handle[:8]}...: it ended, expired or was never given")
        return held

    def touched(self, handle: str) -> Held:
        held = self.get(handle)
        held.expires_at = time.time() + held.seconds
        return held

    def drop(self, handle: str) -> None:
        with self._lock:
            self._held.pop(handle, None)

    def expire(self, store: JobStore) -> int:
        """Fail the attempts of clients that went silent; how many."""
        now = time.time()
        with self._lock:
            late = [(h, held) for h, held in self._held.items() if held.expires_at <= now or held.lease.finished]
            for h, _ in late:
                del self._held[h]
        n = 0
        for _, held in late:
            if not held.lease.finished:
                try:
                    held.lease.fail(f"its HTTP worker stopped touching it for {held.seconds:g} s")
                except JobStoreError:
                    continue  # taken over or timed out meanwhile: its fate is decided elsewhere
                n += 1
        return n

    def release_all(self, store: JobStore) -> None:
        """Give every held job back, no attempt counted (the web process is stopping)."""
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for h in held:
            if not h.lease.finished:
                with contextlib.suppress(JobStoreError):
                    h.lease.release()
