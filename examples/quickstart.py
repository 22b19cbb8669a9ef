"""A producer, two worker processes and a notifier sharing one directory.

    python examples/quickstart.py [DIR]     (without DIR: in a temporary directory, removed after)

Creates 20 "add" jobs, asks for each result to be delivered to a target, lets two worker
processes fulfil them, then a notifier delivers the results. Prints what happened.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections import Counter

from fsjobstore import JobStore


def worker(root: str, name: str) -> None:
    with JobStore(root) as store:
        while (lease := store.pull_work(timeout=1.0)) is not None:
            with lease:  # an exception here would count as a failed attempt and be retried
                a, b = lease.request["a"], lease.request["b"]
                time.sleep(0.01)  # pretend to work
                lease.fulfill({"sum": a + b, "worker": name})  # any JSON value (or bytes)


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

        # 2. Two worker processes drain the store.
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=worker, args=(root, f"worker-{n}")) for n in (1, 2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        by_worker = Counter(store.get(j).value["worker"] for j in ids)
        print("workers: " + ", ".join(f"{w} fulfilled {n}" for w, n in sorted(by_worker.items())))

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
