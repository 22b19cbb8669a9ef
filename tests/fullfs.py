"""A real full filesystem: run inside a small tmpfs (see test_faults.py, which mounts one in a
private mount namespace). Fills the disk, checks every operation fails with StorageFull and
leaves the store whole, frees the space, checks the store works again. Prints a JSON report."""

from __future__ import annotations

import errno
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from faultkit import Ctx, check_store, full_cycle

from fsjobstore import JobStore, StorageFull


def main(mount: str) -> dict[str, object]:
    root = os.path.join(mount, "store")
    store = JobStore(root, backoff=lambda attempt: 0.0)
    ctx = Ctx()
    for i in range(5):
        ctx.jobs.append(store.create({"i": i}).id)
    lease = store.pull_work()
    assert lease is not None
    filler = os.path.join(mount, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)  # take every free byte
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    errors = []
    for name, call in [("create", lambda: store.create({"big": "x" * 8192})),
                       ("fulfill", lambda: lease.fulfill(b"v" * 8192))]:
        try:
            call()
            errors.append(f"{name} succeeded on a full disk")
        except StorageFull as exc:
            errors.append(f"ok {name}: {exc}")
    problems = check_store(root, ctx, settled=False, litter_ok=True)
    os.unlink(filler)
    lease.fulfill(b"v" * 8192)  # the same lease, once there is room again
    ctx.results[lease.id] = "fulfilled"
    problems += full_cycle(store)
    store.recover()
    problems += check_store(root, ctx, settled=False)
    store.close()
    return {"outcomes": errors, "problems": problems}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
