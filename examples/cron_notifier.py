"""Deliver results to files: a `deliver` function for `fsjobstore notify`, run from cron.

    # cron's PATH is /usr/bin:/bin, which has no virtualenv's fsjobstore: name it by its absolute path
    # (no activate needed). cron mails whatever a job prints: at --log-level WARNING an idle run, or one
    # that delivered everything, prints nothing, and a delivery that failed still prints its error.
    */5 * * * * cd /path/to/examples && /path/to/venv/bin/fsjobstore notify /var/lib/myapp/jobs --handler cron_notifier:deliver --burst --log-level WARNING

`cd` there because the handler's module is imported from the current directory.
`--burst` delivers every notification that is due, each at most once, then exits (recovery
runs first, so notifications whose notifier died are picked up). Each target here is a JSON
object {"file": PATH}: a producer asks for it with `store.queue(job_id, {"file": "/tmp/out.jsonl"})`
or `fsjobstore create DIR REQUEST --notify '{"file": "/tmp/out.jsonl"}'`.
Delivering appends one JSON line to that file. A target whose delivery raises stays queued and
is offered again after a backoff, with the error recorded.
"""

from __future__ import annotations

import json
from typing import Any

from fsjobstore import NotificationLease


def deliver(target: Any, note: NotificationLease) -> None:
    value = note.value
    if isinstance(value, bytes):  # results given as bytes stay bytes; JSON results are JSON
        value = value.decode("utf-8", "replace")
    line = {"job": note.id, "state": note.state.value, "value": value, "error": note.error}
    with open(target["file"], "a") as fh:
        fh.write(json.dumps(line) + "\n")
