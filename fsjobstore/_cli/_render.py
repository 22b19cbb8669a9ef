"""Printing: JSON for ``--json`` (and scripts), short aligned text for people."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .. import Job, StoreStatistics, WorkerInfo
from ._terminal import json_text


def print_json(doc: Any) -> None:
    print(json_text(json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=False)))


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch).astimezone().isoformat(sep=" ", timespec="seconds")


def print_pairs(pairs: Iterable[tuple[str, Any]]) -> None:
    rows = [(k, v) for k, v in pairs if v is not None and v != ""]
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        text = str(value)
        if "\n" in text:  # a traceback: indent its lines under the key
            text = text.replace("\n", "\n" + " " * (width + 2))
        print(f"{key:<{width}}  {text}")


def value_text(job: Job) -> str | None:
    if job.value is None:
        return None
    if isinstance(job.value, bytes):
        try:
            return f"{job.value.decode('utf-8')!r} (bytes)"
        except UnicodeDecodeError:
            return f"{len(job.value)} bytes, not text (use --json: base64)"
    return json.dumps(job.value, ensure_ascii=False)


def print_job(job: Job) -> None:
    print_pairs([
        ("id", job.id),
        ("state", job.state.value),
        ("queue", job.queue),
        ("priority", job.priority),
        ("attempts", _attempts(job)),
        ("timeout", None if job.timeout is None else f"{job.timeout:g} s per attempt"),
        ("created", when(job.created_at)),
        ("run at", None if job.run_at is None else when(job.run_at)),
        ("finished", None if job.finished_at is None else when(job.finished_at)),
        ("unique key", job.unique_key),
        ("concurrency key", job.concurrency_key),
        ("topic", None if job.topic is None else f"{job.topic} (a subscription's copy)"),
        ("after", (", ".join(job.after) + ("" if job.on_parent_failure == "cancel" else
                                           " (runs even if one fails)")) if job.after else None),
        ("group", job.group),
        ("request", json.dumps(job.request, ensure_ascii=False)),
        ("value", value_text(job)),
        # A fulfilled job keeps the error of the attempt before the one that succeeded: told
        # as the earlier error it is ("error" on a fulfilled job reads as a failure).
        ("earlier error" if job.state.value == "fulfilled" else "error", job.error),
        ("attempt errors", _attempt_errors(job)),
        ("waiting", ", ".join(json.dumps(t, ensure_ascii=False) for t in job.waiting) or None),
        ("delivery", f"{job.delivery_attempts} failed attempt(s), retried with backoff; last error: "
                     f"{job.delivery_error}" if job.delivery_attempts else None),
        ("next delivery", _due(job.delivery_due_at) if job.waiting and job.delivery_due_at is not None else None),
        ("history", f"{len(job.history)} earlier life(s): see --json" if job.history else None),
        ("cancel", "requested" if job.cancel_requested else None),
        ("progress", None if job.progress is None else _progress(job)),
        ("log", _log(job)),
        ("log dropped", job.logs_dropped or None),
    ])


LOG_LINES = 10  # the last lines shown; --json has them all


def _due(at: float) -> str:
    wait = at - time.time()
    return "due now" if wait <= 0 else f"in {wait:.0f} s ({when(at)})"


def _attempts(job: Job) -> str:
    """Attempts begun (``Job.attempts``): a running job is on its latest, as its worker says."""
    if job.state.value == "active":
        return f"attempt {job.attempts} of {job.max_attempts}, running"
    return f"{job.attempts} of {job.max_attempts}"


def _attempt_errors(job: Job) -> str | None:
    """One line per failed attempt (its error's last line: what happened); the job's last error
    is printed whole above, and --json has each in full."""
    if len(job.attempt_errors) < 2:
        return None  # none, or only the last one: "error" shows it already
    return "\n".join(f"attempt {e.attempt} ({when(e.at)}): {_last_line(e.error)}" for e in job.attempt_errors)


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no error text)"


def _log(job: Job) -> str | None:
    lines = [f"[{line.attempt}] {line.line}" for line in job.logs[-LOG_LINES:]]
    if len(job.logs) > LOG_LINES:
        earlier = len(job.logs) - LOG_LINES
        lines.insert(0, f"... {earlier} earlier line{'s' if earlier != 1 else ''} (see --json)")
    return "\n".join(lines) or None


def _progress(job: Job) -> str:
    p = job.progress
    assert p is not None
    amount = _number(p.done) if p.total is None else f"{_number(p.done)} of {_number(p.total)}"
    if p.total:
        amount += f" ({100 * p.done / p.total:.0f}%)"
    return amount + (f": {p.message}" if p.message else "") + f" (attempt {p.attempt}, {when(p.at)})"


def _number(x: float) -> str:
    """6831736 rather than 6.83174e+06; fractions as given."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,g}"


def print_workers(workers: list[WorkerInfo]) -> None:
    if not workers:
        print("no workers are running")
    for w in workers:
        queues = ", ".join(w.queues) if w.queues else "all"
        state = "paused" if w.paused else f"{len(w.current)} running"
        print(f"{w.name}  pid {w.pid} on {w.host}  {w.mode} x{w.concurrency}  queues: {queues}  {state}  "
              f"done {w.jobs_done}, failed {w.jobs_failed}  since {when(w.started_at)}  seen {when(w.last_heartbeat)}")
        for job in w.current:
            print(f"    {job.get('id')} ({job.get('queue')}, attempt {job.get('attempt')})")


def stats_doc(stats: StoreStatistics) -> dict[str, Any]:
    doc = {name: getattr(stats, name) for name in stats.__dataclass_fields__}
    doc["pending_by_queue"] = dict(stats.pending_by_queue)
    doc["paused"] = sorted(stats.paused)
    doc.pop("watching", None)  # about the process asking, which for a command is never waiting
    return doc


def print_stats(stats: StoreStatistics, retention: str | None = None) -> None:
    by_queue = ", ".join(f"{q} {n}" for q, n in sorted(stats.pending_by_queue.items()))
    age = stats.oldest_pending_age
    print_pairs([
        ("pending", f"{stats.pending}" + (f"  ({by_queue})" if by_queue else "")),
        ("scheduled", stats.scheduled),
        ("deferred", stats.deferred or None),  # shown once a job waits for others
        ("active", stats.active),
        ("fulfilled", stats.fulfilled),
        ("failed", stats.failed),
        ("cancelled", stats.cancelled),
        ("paused queues", ", ".join(sorted(stats.paused)) or None),
        ("notifications", f"{stats.notifications} final job(s) with targets waiting"),
        ("quarantined", stats.quarantined),
        ("oldest pending", None if age is None else f"{age:.1f} s"),
        ("retention", retention),
    ])


def print_counts(counts: Mapping[str, int]) -> None:
    done = [(k.replace("_", " "), v) for k, v in counts.items() if v]
    if not done:
        print("nothing to repair")
    print_pairs(done)
