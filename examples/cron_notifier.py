"""Deliver every notification that is due, then exit: run it from cron.

    */5 * * * * python /path/to/examples/cron_notifier.py /var/lib/myapp/jobs

Each target here is a JSON object {"file": PATH}; delivering appends the result to that file.
A target that fails stays queued and is offered again after a backoff. Recovery runs first,
so notifications whose notifier died (or crashed between steps) are picked up.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fsjobstore import JobStore


def deliver(target: Any, job_id: str, state: str, value: Any, error: str | None) -> None:
    if isinstance(value, bytes):  # results given as bytes stay bytes; JSON results are JSON
        value = value.decode("utf-8", "replace")
    line = {"job": job_id, "state": state, "value": value, "error": error}
    with open(target["file"], "a") as fh:
        fh.write(json.dumps(line) + "\n")


def main(root: str) -> int:
    delivered = failed = 0
    with JobStore(root) as store:
        store.recover()
        while (note := store.pull_notification()) is not None:
            done, last_error = [], None
            for target in note.waiting:
                try:
                    deliver(target, note.id, note.state.value, note.value, note.error)
                    done.append(target)
                except Exception as exc:  # one bad target must not block the others
                    last_error = f"{type(exc).__name__}: {exc}"
            note.done(done, error=last_error)
            delivered += len(done)
            failed += len(note.waiting) - len(done)
    print(f"delivered {delivered}, will retry {failed}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: cron_notifier.py STORE_DIR")
    sys.exit(main(sys.argv[1]))
