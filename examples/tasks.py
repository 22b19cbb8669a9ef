"""A worker module for `fsjobstore worker`: checksums of files, with progress, logs and cancel.

Run it from this directory (the CLI imports your module from the current directory, as
`python -m` would):

    cd examples
    fsjobstore init ./jobs
    fsjobstore create ./jobs '{"path": "/usr/bin/python3"}' --queue digest
    fsjobstore worker ./jobs --handlers tasks:handlers --burst         # every queue below
    fsjobstore worker ./jobs --handler tasks:digest --queue digest --concurrency 4

`fsjobstore get ./jobs ID` shows the result, the progress and the log lines while it runs and
after. A job for a missing file fails (and is retried with backoff, then fails for good with
the error kept); `fsjobstore cancel ./jobs ID` stops a running one between chunks.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from fsjobstore import JobContext

CHUNK = 1 << 20


def digest(job: JobContext) -> dict[str, Any]:
    """request {"path": FILE, "algorithm": "sha256"} -> {"path", "algorithm", "hexdigest", "bytes"}."""
    path = job.request["path"]
    algorithm = job.request.get("algorithm", "sha256")
    h = hashlib.new(algorithm)  # an unknown name raises ValueError: a failed attempt, error kept
    size = os.path.getsize(path)
    done = 0
    job.log(f"attempt {job.attempt}: reading {size} bytes of {path}")
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            job.raise_if_cancelled()  # a cancel asked for while we read ends the job "cancelled"
            h.update(chunk)
            done += len(chunk)
            job.progress(done, size, "reading")
    return {"path": path, "algorithm": algorithm, "hexdigest": h.hexdigest(), "bytes": done}


def report(job: JobContext) -> str:
    """request {"paths": [...]} -> a text report of their sizes (a str value is stored as text)."""
    lines = [f"{os.path.getsize(p):>12}  {p}" for p in job.request["paths"]]
    return "\n".join(lines) + "\n"


# `--handlers tasks:handlers` serves every queue named here (`--queue` narrows the list).
handlers = {"digest": digest, "report": report}
