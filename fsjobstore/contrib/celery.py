"""A Celery result backend on a job store: ``Celery(backend="fsjobstore:///var/lib/myapp/jobs")``.

Celery finds it by the URL's scheme (the ``celery.result_backends`` entry point of
``fsjobstore[celery]``). What it stores, and where (the guide "Celery on a directory" has it for
users; FORMAT.md, "Files of the contrib layer", the files):

- A task's final state is a job of its own, its id the task's id, in the queue ``celery-results``:
  a SUCCESS is fulfilled with Celery's result record (as JSON where the result serializer is
  JSON, so ``fsjobstore get DIR TASK_ID`` and the dashboard show it); a FAILURE ends ``failed``
  with the traceback as its error, and a REVOKED ``cancelled``, each with the record in its
  request, so the store's counts, the dashboard and ``/metrics`` show them as what they are. The store's
  retention removes it ``result_expires`` after it was stored (Celery's default: one day). The
  first final state stored stands: a task run again after its result was stored (a redelivery
  under ``acks_late``) does not overwrite it, as Celery's key-value backends do not overwrite a
  SUCCESS.
- A state before that (STARTED, RETRY, a custom state of ``update_state``) is a small file,
  ``contrib/celery/states/<task id>.json``, replaced at each change and removed when the final
  state is stored.
- A group's result (``GroupResult.save``) is a job as a task's result is.
- ``AsyncResult.get()`` waits on the store's inotify wake-ups for final jobs, not on an interval.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import weakref
from typing import Any

from celery import states
from celery.backends.base import BaseBackend
from celery.exceptions import ImproperlyConfigured, TaskRevokedError
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import result_from_tuple

from fsjobstore import InvalidRequest, InvalidState, JobExists, JobNotFound, JobState, JobStoreError

from ._contrib_files import ContribDir
from ._stores import queue_name, store_for, store_options, store_path, wait_readable, warn_relative

__all__ = ["FSJobStoreBackend", "RESULTS_QUEUE"]

RESULTS_QUEUE = "celery-results"
_FAR = 10 * 365 * 86400.0  # a result job waits this long (never) between its create and its fulfil
_STATE_CAP = 16 * 1024 * 1024


class _ThreadWakeups:
    """One thread's wake-ups, closed when the thread's locals drop it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.wakeups = store.wakeups("done")
        weakref.finalize(self, self.wakeups.close)


def _carried(value: Any) -> dict[str, Any]:
    """Celery's record, carried in a failed or revoked result's request (JSON, or base64)."""
    if isinstance(value, bytes):
        return {"meta_base64": base64.b64encode(value).decode("ascii")}
    return {"meta": value}


def _carried_back(request: Any) -> Any:
    if not isinstance(request, dict):
        return None
    if "meta" in request:
        return request["meta"]
    if isinstance(request.get("meta_base64"), str):
        return base64.b64decode(request["meta_base64"])
    return None


class FSJobStoreBackend(BaseBackend):  # type: ignore[misc]
    """Celery's result backend for ``fsjobstore://`` URLs (``result_backend``).
    ``result_backend_transport_options`` are passed to :class:`~fsjobstore.JobStore` as the
    broker's are (``lease_duration``, ``poll_interval``, ``durable``, ``group``, ...)."""

    supports_native_join = False
    supports_autoexpire = True
    persistent = True

    def __init__(self, app: Any, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.url = url or app.conf.result_backend
        self.path = store_path(self.url or "")
        warn_relative(self.url or "", self.path)
        self._options = store_options(app.conf.get("result_backend_transport_options"),
                                      "result_backend_transport_options")
        self._local = threading.local()
        try:
            self.store  # noqa: B018  (opened now: a URL that names no store is a configuration error)
        except JobStoreError as exc:
            raise ImproperlyConfigured(f"result_backend {self.url!r}: cannot open the store at {self.path}: {exc}") \
                from exc
        expires = kwargs.get("expires")
        self.expires = self.prepare_expires(expires, type=float)

    @property
    def store(self) -> Any:
        return store_for(self.path, **self._options)

    def __reduce__(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        return super().__reduce__(args, {**(kwargs or {}), "url": self.url})

    # -- where a task's states live -------------------------------------------------------------
    @staticmethod
    def _id(task_id: Any) -> str:
        return queue_name(str(task_id), limit=128)

    def _states(self) -> ContribDir:
        return ContribDir(self.store, "celery", "states")

    def _state_name(self, task_id: Any) -> str:
        return f"{self._id(task_id)}.json"

    def _value(self, meta: dict[str, Any]) -> Any:
        encoded = self.encode(meta)
        if self.content_type == "application/json":
            return json.loads(encoded)
        return encoded if isinstance(encoded, bytes) else encoded.encode("utf-8")

    @staticmethod
    def _payload(value: Any) -> Any:
        """What ``_value`` stored, as Celery's serializer wrote it (JSON kept as JSON goes back to text)."""
        return value if isinstance(value, bytes) else json.dumps(value)

    def _meta(self, value: Any) -> dict[str, Any]:
        return self.decode_result(self._payload(value))  # type: ignore[no-any-return]

    # -- writing -------------------------------------------------------------------------------------
    def _store_result(self, task_id: Any, result: Any, state: str, traceback: Any = None, request: Any = None,
                      **kwargs: Any) -> Any:
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = str(task_id)
        if state in states.READY_STATES:
            about = {"celery": "result", "task_id": str(task_id), "task": getattr(request, "task", None)}
            if state == states.FAILURE:
                error = str(traceback) if traceback else f"{type(result).__name__}: {result}"
                self._final(self._id(task_id), about, meta, error=error)
            elif state == states.REVOKED:
                self._final(self._id(task_id), about, meta, revoked=True)
            else:
                self._final(self._id(task_id), about, meta)
            self._states().unlink(self._state_name(task_id))
        else:
            self._write_state(task_id, meta)
        return result

    def _final(self, job_id: str, about: dict[str, Any], meta: dict[str, Any], *, error: str | None = None,
               revoked: bool = False) -> None:
        """The task's final state as a job: fulfilled with Celery's record for a success;
        ``failed`` with the traceback as its error for a failure, and ``cancelled`` for a revoke,
        as the store's own jobs end (so ``status``, the dashboard and ``/metrics`` count them),
        each with Celery's record in its request."""
        store = self.store
        retain = self.expires if self.expires else None
        value = self._value(meta)
        ends_ok = error is None and not revoked
        request = about if ends_ok else {**about, **_carried(value)}
        # Scheduled far off, so no worker of any queue takes it before it is ended just after.
        try:
            store.create(request, queue=RESULTS_QUEUE, job_id=job_id, delay=_FAR, retain=retain)
        except JobExists:
            pass  # a final state was stored already (it stands), or is being stored
        except InvalidRequest:  # the record is too big for a request: kept as a value instead
            with contextlib.suppress(JobExists):
                store.create(about, queue=RESULTS_QUEUE, job_id=job_id, delay=_FAR, retain=retain)
            ends_ok = True
        # RACE: two final states of one task (a redelivered task run twice): the first to end
        # the job stands, and the second raises InvalidState, as a SUCCESS is never overwritten.
        with contextlib.suppress(InvalidState):
            if ends_ok:
                store.fulfill(job_id, value)
            elif revoked:
                store.cancel(job_id, "revoked")
            else:
                store.fail(job_id, error or "failed")

    def _write_state(self, task_id: Any, meta: dict[str, Any]) -> None:
        data = self.encode(meta)
        # Not fsynced: a state before the end is a hint, and the final result is what is kept.
        self._states().write(self._state_name(task_id), data if isinstance(data, bytes) else data.encode(),
                             fsync=False)

    # -- reading -------------------------------------------------------------------------------------
    def _get_task_meta_for(self, task_id: Any) -> dict[str, Any]:
        try:
            job = self.store.get(self._id(task_id))
        except JobNotFound:
            job = None
        if job is not None and job.state is JobState.FULFILLED:
            return self._meta(job.value)
        if job is not None and job.state.is_final:
            carried = _carried_back(job.request)
            if carried is not None:
                return self._meta(carried)
            # RACE: a success and a failure of one task stored at once (a task run twice): the
            # success made the job, without a failure's record, and the failure ended it first.
            # Its state and error stand for the record: never PENDING for a task that has ended.
            if job.state is JobState.CANCELLED:
                return {"status": states.REVOKED, "result": TaskRevokedError(job.error or "revoked"),
                        "traceback": None, "task_id": str(task_id)}
            return {"status": states.FAILURE, "result": Exception(job.error or "failed"), "traceback": job.error,
                    "task_id": str(task_id)}
        data = self._read_state(task_id)
        if data is not None:
            try:
                meta = self.decode_result(data)
            except Exception:
                meta = None  # a planted or torn file: say nothing rather than something wrong
            # Only a state before the end is ever kept in a file: a final one there is planted.
            if isinstance(meta, dict) and isinstance(meta.get("status"), str) \
                    and meta["status"] not in states.READY_STATES:
                return meta
        return {"status": states.PENDING, "result": None}

    def _read_state(self, task_id: Any) -> bytes | None:
        return self._states().read(self._state_name(task_id), _STATE_CAP)

    def _save_group(self, group_id: Any, result: Any) -> Any:
        self._final(self._id(group_id), {"celery": "group", "group_id": str(group_id)}, {"result": result.as_tuple()})
        return result

    def _restore_group(self, group_id: Any) -> dict[str, Any] | None:
        try:
            job = self.store.get(self._id(group_id))
        except JobNotFound:
            return None
        if job.state is not JobState.FULFILLED:
            return None
        value = job.value
        meta: dict[str, Any] = self.decode(self._payload(value))
        meta["result"] = result_from_tuple(meta["result"], self.app)
        return meta

    def _delete_group(self, group_id: Any) -> None:
        """A group's record stays until retention removes it (the store removes jobs by age)."""

    def _forget(self, task_id: Any) -> None:
        """Forgets a state before the end; a final result stays until retention removes it."""
        self._states().unlink(self._state_name(task_id))

    def cleanup(self) -> None:
        """Celery beat's daily ``celery.backend_cleanup``: retention removes final results by
        itself; this removes states files of tasks that never ended, older than ``result_expires``."""
        states_dir = self._states()
        limit = time.time() - (self.expires or 86400.0)
        for name in states_dir.listing(None)[1] or []:
            touched = states_dir.mtime(name)
            if touched is not None and touched < limit:
                states_dir.unlink(name)

    # -- waiting -------------------------------------------------------------------------------------
    def _done_wakeups(self) -> Any:
        """This thread's wake-ups for final jobs, kept from one wait to the next: closing an inotify
        descriptor waits out an RCU grace period in the kernel (8 ms on a 250 Hz kernel), which
        one made and closed per ``get()`` added to every round trip. Closed when the thread ends
        (its holder goes with the thread's locals), so threads that come and go leak none."""
        store = self.store
        holder = getattr(self._local, "holder", None)
        if holder is None or holder.store is not store:  # the first wait, or a new process's store
            holder = self._local.holder = _ThreadWakeups(store)
        return holder.wakeups

    def wait_for(self, task_id: Any, timeout: float | None = None, interval: float = 0.5, no_ack: bool = True,
                 on_interval: Any = None) -> dict[str, Any]:
        """Wait for the task's final state, woken by the store when a job becomes final."""
        self._ensure_not_eager()
        deadline = None if timeout is None else time.monotonic() + timeout
        wakeups = self._done_wakeups()
        wakeups.take()  # what arrived since the last wait: the check below looks anyway
        while True:
            meta: dict[str, Any] = self.get_task_meta(task_id)
            if meta["status"] in states.READY_STATES:
                return meta
            if on_interval:
                on_interval()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise CeleryTimeoutError("The operation timed out.")
            pause = min(interval, wakeups.interval) if left is None else min(interval, wakeups.interval, left)
            wait_readable(wakeups.fileno(), pause)
            wakeups.take()
