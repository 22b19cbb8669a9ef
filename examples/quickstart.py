"""A producer, a worker with two processes and a notifier sharing one directory.

    python examples/quickstart.py [DIR]     (without DIR: in a temporary directory, removed after)

Creates 20 "add" jobs, asks for each result to be delivered to a target, lets a Worker with two
child processes fulfil them, then a notifier delivers the results. Prints what happened.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter

from fsjobstore import JobContext, JobStore, Worker


def add(job: JobContext) -> dict[str, int]:
    """The handler: runs in a worker's child process; an exception would fail the attempt (retried)."""
    time.sleep(0.01)  # pretend to work
    return {"sum": job.request["a"] + job.request["b"], "worker": os.getpid()}  # any JSON value (or bytes)


def main() -> None:
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:  # a store in a temporary directory, removed afterwards
        with tempfile.TemporaryDirectory(prefix="fsjobstore-demo-") as tmp:
            run(os.path.join(tmp, "store"))


def run(root: str) -> None:
    print(f"store: {os.path.abspath(root)}")
    with JobStore(root) as store:
        # 1. Producer: jobs, each with a target waiting for its result.
        ids = []
        for i in range(20):
            job = store.create({"a": i, "b": i * i}, priority=0 if i % 5 else -1)
            store.queue(job.id, {"deliver_to": f"client-{i}"})
            ids.append(job.id)
        print(f"producer: created {len(ids)} jobs, {store.statistics().pending} pending")

        # 2. A worker runs the handler in two child processes until nothing is due (burst).
        #    `fsjobstore worker DIR --handler module:add --concurrency 2` does the same from a shell.
        summary = Worker(store, {"default": add}, concurrency=2).run(burst=True)
        by_worker = Counter(store.get(j).value["worker"] for j in ids)
        print(f"worker: {summary.fulfilled} jobs fulfilled in {summary.seconds:.2f}s; "
              + ", ".join(f"process {w} fulfilled {n}" for w, n in sorted(by_worker.items())))

        # 3. A notifier delivers every result to the target that asked for it.
        delivered = 0
        while (note := store.pull_notification()) is not None:
            result = note.value
            for target in note.waiting:
                delivered += 1
                if delivered <= 3:
                    print(f"notifier: {target['deliver_to']} <- sum={result['sum']}")
            note.done(note.waiting)
        print(f"notifier: delivered {delivered} results")

        stats = store.statistics()
        print(f"final: fulfilled={stats.fulfilled} pending={stats.pending} active={stats.active} "
              f"failed={stats.failed} notifications waiting={stats.notifications}")
        ok = stats.fulfilled == len(ids) and delivered == len(ids) and stats.notifications == 0
        print("OK" if ok else "SOMETHING WENT WRONG")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
