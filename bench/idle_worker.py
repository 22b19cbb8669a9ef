"""CPU an idle ``fsjobstore worker`` uses: the supervisor and its children, waiting on an empty store.

    python bench/idle_worker.py [--concurrency 2] [--seconds 30] [--threads]

Starts ``python -m fsjobstore worker`` (from the fsjobstore this Python imports) on a new empty
store, lets it settle for 3 s, then reads the CPU time of the worker and every child of it from
/proc over ``--seconds`` and prints it as a percentage of one core.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its children still alive, in seconds."""
    total = 0.0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            pids += [int(p) for p in fh.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--threads", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        subprocess.run([sys.executable, "-m", "fsjobstore", "init", store], check=True, capture_output=True)
        cmd = [sys.executable, "-m", "fsjobstore", "worker", store, "--handler", "json:dumps",
               "--concurrency", str(args.concurrency), "--log-level", "WARNING"]
        if args.threads:
            cmd.append("--threads")
        worker = subprocess.Popen(cmd)
        try:
            time.sleep(3.0)
            before, started = cpu_seconds(worker.pid), time.monotonic()
            time.sleep(args.seconds)
            used, took = cpu_seconds(worker.pid) - before, time.monotonic() - started
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
    mode = "threads" if args.threads else "processes"
    print(f"idle worker, {mode}, concurrency {args.concurrency}: {100 * used / took:.2f}% of a core "
          f"({used:.3f} s of CPU in {took:.1f} s)")


if __name__ == "__main__":
    main()
