"""The web layer's cost (issue 21): page render times on a store of 100,000 jobs, and the JSON
API's create rate with 10 concurrent clients against ``store.create`` in one process, in one run.

    python bench/web.py --store /var/tmp/fsjobstore-web-100k      # 100,000 jobs, kept for the next run
    python bench/web.py [--jobs 100000] [--store DIR] [--rounds 5] [--requests 50] [--creates 2000]
                        [--clients 10] [--payload 200] [--only pages|creates] [--dir /tmp]
    python bench/web.py --only creates --rounds 9                # one part only (--only pages: the other)
    python bench/web.py --quick                                  # small sizes: that it runs (tests)

**Pages.** A store of ``--jobs`` jobs (made with ``durable=False``, kept forever) over four
queues and every state: about 91% fulfilled, 3% failed for good, 1% cancelled, 1% scheduled a
month ahead, 4% pending, and 8 jobs active (leased by this process for the whole measurement,
its heartbeats running, as a worker's would be). Building it takes about a minute (65 s on 2
cores and ext4); with ``--store DIR`` it is kept in DIR and the next run with the same ``--jobs``
reuses it (without, it is made in the scratch directory and removed). Its jobs all finish within
a minute, so the finished index holds them in one hour's bucket: a store that finishes 100,000
jobs an hour, the dense case (spread over days, an hour holds a few hundred). Each round, for each
page in turn (the order rotates between rounds), a fresh ``fsjobstore web STORE --port 0``
(uvicorn, loopback) is started and, once it has logged its startup, asked for the page once
(**cold**: the first request the process serves; the OS page cache stays warm), then
``--requests`` more times on the same keep-alive connection (**warm**), with http.client, sending
back the CSRF cookie as a browser does. The pages: ``/`` (the overview), ``/jobs`` (the first page
of 50), ``/jobs?state=failed``, ``/jobs?state=fulfilled&after=ID`` (ID 90% of the way down the
fulfilled jobs, newest first) and ``/api/jobs?limit=50``. Target: under 200 ms each (a page is
"under" when its cold median and its warm p95 both are). The server's CPU time per warm request
is read from /proc.

**Creates.** A fresh durable store (the default) served by ``fsjobstore web``, and another opened
in this process. Each round, in turn (the order alternates), ``--creates`` jobs are created
through ``POST /api/jobs`` by ``--clients`` threads, each with its own keep-alive connection, and
``--creates`` by a plain loop of ``store.create`` here, with the same request (``--payload``
bytes of text in a small JSON object), the same queue and the same durability; both stores grow
alike. Target: the API at least 50% of ``store.create``'s rate. The server's CPU time per create
is read from /proc: the server is one process, so about 1 / (that time) bounds its rate. The loop's
rate is the disk's: on a disk other processes keep busy it falls by half or more, and the ratio
with it, so compare runs on a quiet machine (the first line prints the load average).

Prints each round's figures, then one summary line per page (cold, warm median and p95, the
spread of the rounds' warm medians, server CPU) and one for the creates (median rates, ratio of the
medians and the rounds' ratios). The figures
are never asserted: tests/test_bench.py only checks that ``--quick`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import commit

from fsjobstore import JobStore, WorkLease

QUEUES = ("default", "email", "images", "reports")
ACTIVE_QUEUE = "slow"  # its jobs are leased by this process while the pages are measured
ACTIVE_JOBS = 8
META = "bench-web.json"
LAYOUT = 1  # of the built store; a cached store of another layout is refused
TARGET_MS = 200.0
TARGET_RATIO = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- the store of --jobs jobs -------------------------------------------------------------------
def plan(jobs: int) -> dict[str, int]:
    """How many jobs end in each state."""
    n = {"failed": jobs * 3 // 100, "cancelled": jobs // 100, "scheduled": jobs // 100,
         "pending": jobs * 4 // 100, "active": min(ACTIVE_JOBS, jobs // 100)}
    n["fulfilled"] = jobs - sum(n.values())
    return n


def request_for(i: int, queue: str) -> dict[str, Any]:
    return {"i": i, "to": f"user{i}@example.com", "queue": queue, "args": {"size": i % 997, "retry": i % 3 == 0}}


def build(path: str, jobs: int) -> dict[str, Any]:
    """Make the store of ``jobs`` jobs at ``path``; returns what the pages need to know of it."""
    n = plan(jobs)
    t0 = time.perf_counter()
    with JobStore(path, durable=False, retain="forever") as store:
        # Jobs that end final: a fulfilled (or failed, every 31st) one for each, through a lease
        # and counted as the worker runtime counts them; cancelled ones are cancelled at once.
        finals = n["fulfilled"] + n["failed"]
        fail_every = finals // n["failed"] if n["failed"] else 0
        total = finals + n["cancelled"]
        cancel_every = total // n["cancelled"] if n["cancelled"] else 0
        cancelled = 0
        for i in range(total):
            queue = QUEUES[i % len(QUEUES)]
            job = store.create(request_for(i, queue), queue=queue)
            if cancel_every and i % cancel_every == cancel_every - 1 and cancelled < n["cancelled"]:
                store.cancel(job.id, "not needed any more")
                cancelled += 1
            if (i + 1) % 20_000 == 0:
                print(f"  built: {i + 1:,} jobs created ({time.perf_counter() - t0:.0f} s)", flush=True)
        fulfilled = failed = 0
        deep_at = n["fulfilled"] // 10  # fulfilled early: 90% of the way down the newest-first list
        deep_after = None
        for k in range(finals):
            lease = store.pull_work()
            assert lease is not None, "a job to finish"
            if fail_every and k % fail_every == fail_every - 1 and failed < n["failed"]:
                lease.fail(f"RuntimeError: job {lease.request['i']} could not be done", retry=False)
                store.count(lease.queue, "failed", 0.01)
                failed += 1
            else:
                lease.fulfill({"ok": True, "i": lease.request["i"], "bytes": 1000 + k % 5000})
                store.count(lease.queue, "fulfilled", 0.01)
                if fulfilled == deep_at:
                    deep_after = lease.id
                fulfilled += 1
            if (k + 1) % 20_000 == 0:
                print(f"  built: {k + 1:,} jobs finished ({time.perf_counter() - t0:.0f} s)", flush=True)
        base = total
        for i in range(n["scheduled"]):
            queue = QUEUES[i % len(QUEUES)]
            store.create(request_for(base + i, queue), queue=queue, delay=30 * 86400)
        base += n["scheduled"]
        for i in range(n["pending"]):
            queue = QUEUES[i % len(QUEUES)]
            store.create(request_for(base + i, queue), queue=queue, priority=i % 3)
        base += n["pending"]
        for i in range(n["active"]):
            store.create(request_for(base + i, ACTIVE_QUEUE), queue=ACTIVE_QUEUE)
        stats = store.statistics()
    assert deep_after is not None or n["fulfilled"] == 0
    counts = {s: getattr(stats, s) for s in ("pending", "scheduled", "active", "fulfilled", "failed", "cancelled")}
    counts["pending"] -= n["active"]  # the jobs of ACTIVE_QUEUE: pending until leased for the measurement
    counts["active"] = n["active"]
    return {"layout": LAYOUT, "jobs": jobs, "deep_after": deep_after, "counts": counts,
            "built_at": time.strftime("%Y-%m-%d %H:%M:%S"), "build_seconds": round(time.perf_counter() - t0, 1)}


def ensure_store(where: str, jobs: int) -> tuple[str, dict[str, Any], bool]:
    """The store in ``where`` (``where/store``), built now unless a build of ``jobs`` jobs is there."""
    path, meta_path = os.path.join(where, "store"), os.path.join(where, META)
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("layout") != LAYOUT or meta.get("jobs") != jobs:
            sys.exit(f"{where} holds a store of {meta.get('jobs')} jobs (layout {meta.get('layout')}), not {jobs} "
                     f"(layout {LAYOUT}): remove it, or give another --store")
        return path, meta, False
    if os.path.exists(path):
        sys.exit(f"{path} exists but {meta_path} does not (a build that did not finish?): remove {where}")
    os.makedirs(where, exist_ok=True)
    meta = build(path, jobs)
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)
    return path, meta, True


@contextlib.contextmanager
def active_jobs(path: str, n: int) -> Iterator[list[WorkLease]]:
    """``n`` jobs of the store leased (and kept alive by the store's heartbeat) until the end;
    then given back untouched, so a cached store stays as it was built."""
    with JobStore(path) as store:
        leases = []
        for _ in range(n):
            lease = store.pull_work(queues=ACTIVE_QUEUE)
            if lease is None:
                break
            leases.append(lease)
        try:
            yield leases
        finally:
            for lease in leases:
                with contextlib.suppress(Exception):
                    lease.release()


# -- the server ---------------------------------------------------------------------------------
class Server:
    """``fsjobstore web STORE --port 0`` in a child process; its URL is read from its first line."""

    argv: tuple[str, ...] = (sys.executable, "-m", "fsjobstore", "web")  # then the store and --port 0

    def __init__(self, store: str, scratch: str, env: dict[str, str] | None = None) -> None:
        fd, self.out = tempfile.mkstemp(dir=scratch, prefix="web-", suffix=".out")  # its stdout and stderr
        try:
            self.proc = subprocess.Popen([*self.argv, store, "--port", "0"], env=env, stdout=fd,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            os.close(fd)
        deadline = time.monotonic() + 60
        while True:
            with open(self.out) as f:
                first = f.readline()
            if first.endswith("\n") and " at http://" in first:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(self.out) as f:
                    raise RuntimeError(f"fsjobstore web did not start:\n{f.read()}")
            time.sleep(0.02)
        url = urlsplit(first.split(" at ", 1)[1].split()[0])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        # The socket listens before uvicorn starts the app: wait for its startup (logged at INFO),
        # so the first request is timed against a server that is up, not its start.
        while time.monotonic() < deadline and self.proc.poll() is None:
            with open(self.out) as f:
                if "startup complete" in f.read():
                    break
            time.sleep(0.01)

    def cpu(self) -> float:
        """Seconds of CPU the server has used (user + system), from /proc."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=120)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.out)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Browser:
    """One keep-alive connection that sends back the cookies it was given."""

    def __init__(self, server: Server) -> None:
        self.conn = server.connect()
        self.cookies: dict[str, str] = {}

    def get(self, path: str) -> tuple[float, int]:
        """Seconds from sending the request to having read the whole answer, and its size."""
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}
        t = time.perf_counter()
        self.conn.request("GET", path, headers=headers)
        response = self.conn.getresponse()
        body = response.read()
        seconds = time.perf_counter() - t
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {body[:300]!r}")
        for value in response.headers.get_all("set-cookie") or []:
            name, _, rest = value.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0]
        return seconds, len(body)

    def close(self) -> None:
        self.conn.close()


# -- pages ----------------------------------------------------------------------------------------
@dataclass
class PageRound:
    cold: float
    warm: list[float]
    size: int
    server_cpu: float  # seconds per warm request


@dataclass
class Page:
    name: str
    path: str
    rounds: list[PageRound] = field(default_factory=list)


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def measure_page(store: str, scratch: str, page: Page, requests: int) -> PageRound:
    with Server(store, scratch) as server:
        browser = Browser(server)
        try:
            cold, size = browser.get(page.path)
            cpu0 = server.cpu()
            warm = [browser.get(page.path)[0] for _ in range(requests)]
            cpu = (server.cpu() - cpu0) / max(1, requests)
        finally:
            browser.close()
    return PageRound(cold, warm, size, cpu)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f}"


# -- creates --------------------------------------------------------------------------------------
def create_request(i: int, payload: int) -> dict[str, Any]:
    return {"i": i, "payload": "x" * payload}


def api_creates(server: Server, n: int, clients: int, payload: int, start: int,
                path: str = "/api/jobs") -> tuple[float, float, float]:
    """``n`` jobs through POST /api/jobs from ``clients`` threads at once: jobs/s, and the server's
    and this process's CPU seconds per job."""
    share = [n // clients + (1 if k < n % clients else 0) for k in range(clients)]
    conns = [server.connect() for _ in range(clients)]
    for conn in conns:
        conn.connect()
    go = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def client(k: int) -> None:
        conn = conns[k]
        base = start + sum(share[:k])
        try:
            go.wait()
            for i in range(base, base + share[k]):
                body = json.dumps({"request": create_request(i, payload), "queue": "default"})
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                answer = response.read()
                if response.status != 201:
                    raise RuntimeError(f"POST {path}: {response.status} {answer[:300]!r}")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    cpu0, own0 = server.cpu(), _own_cpu()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    cpu, own = server.cpu() - cpu0, _own_cpu() - own0
    for conn in conns:
        conn.close()
    if errors:
        raise errors[0]
    return n / seconds, cpu / n, own / n


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def local_creates(store: JobStore, n: int, payload: int, start: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + n):
        store.create(create_request(i, payload), queue="default")
    return n / (time.perf_counter() - t0)


# -- the run --------------------------------------------------------------------------------------
def pages_part(args: argparse.Namespace, scratch: str) -> list[Page]:
    where = args.store or os.path.join(scratch, "built")
    t = time.perf_counter()
    path, meta, built = ensure_store(where, args.jobs)
    c = meta["counts"]
    how = (f"built in {time.perf_counter() - t:.0f} s" + (f", kept for the next run (--store {where})"
                                                           if args.store else " (pass --store DIR to keep it)")
           if built else f"reused (built {meta['built_at']} in {meta['build_seconds']:.0f} s; "
                         f"remove {where} to build again)")
    print(f"store of {args.jobs:,} jobs {how}: " + ", ".join(f"{v:,} {k}" for k, v in c.items()), flush=True)
    pages = [Page("overview", "/"), Page("jobs", "/jobs"), Page("jobs failed", "/jobs?state=failed"),
             Page("jobs fulfilled after", f"/jobs?state=fulfilled&after={meta['deep_after']}"),
             Page("api jobs", "/api/jobs?limit=50")]
    with active_jobs(path, c["active"]) as leases:
        print(f"pages: {len(leases)} jobs active (leased here); each round a fresh server per page, 1 cold "
              f"then {args.requests} warm requests (ms)", flush=True)
        for r in range(args.rounds):
            shift = r % len(pages)
            for page in pages[shift:] + pages[:shift]:
                got = measure_page(path, scratch, page, args.requests)
                page.rounds.append(got)
                print(f"  round {r + 1} {page.name:<21} cold {ms(got.cold)}  warm median "
                      f"{ms(statistics.median(got.warm))}  p95 {ms(pct(got.warm, 95))}  server CPU "
                      f"{ms(got.server_cpu)}/request  {got.size:,} bytes", flush=True)
    if not args.store:
        shutil.rmtree(where)
    return pages


@dataclass
class Creates:
    api: list[float] = field(default_factory=list)  # jobs/s
    loop: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)  # seconds per job


def creates_part(args: argparse.Namespace, scratch: str) -> Creates:
    api_store, loop_store = os.path.join(scratch, "api"), os.path.join(scratch, "loop")
    JobStore(api_store).close()  # durable, the default, as the loop's
    out = Creates()
    with Server(api_store, scratch) as server, JobStore(loop_store) as store:
        warm = max(20, args.clients * 2)
        api_creates(server, warm, args.clients, args.payload, 0)
        local_creates(store, warm, args.payload, 0)
        done = warm
        print(f"creates: {args.creates:,} per round each, {args.clients} API clients, {args.payload}-byte "
              f"payload, durable; {warm} each first, not timed", flush=True)
        for r in range(args.rounds):
            for which in ("api", "loop") if r % 2 == 0 else ("loop", "api"):
                if which == "api":
                    rate, cpu, client_cpu = api_creates(server, args.creates, args.clients, args.payload, done)
                    out.api.append(rate)
                    out.server_cpu.append(cpu)
                else:
                    out.loop.append(local_creates(store, args.creates, args.payload, done))
            done += args.creates
            print(f"  round {r + 1} API {out.api[-1]:7,.0f} jobs/s (server CPU {cpu * 1000:.2f} ms, "
                  f"client CPU {client_cpu * 1000:.2f} ms per job)  store.create {out.loop[-1]:7,.0f} jobs/s  "
                  f"ratio {out.api[-1] / out.loop[-1]:.2f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000, help="jobs in the store the pages are drawn from")
    ap.add_argument("--store", default=None, help="keep the built store here, and reuse one built there before")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=50, help="warm requests per page per round")
    ap.add_argument("--creates", type=int, default=2000, help="jobs created per round by each of API and loop")
    ap.add_argument("--clients", type=int, default=10, help="concurrent API clients")
    ap.add_argument("--payload", type=int, default=200, help="bytes of text in each created job's request")
    ap.add_argument("--only", choices=["pages", "creates"], default=None, help="measure one part only")
    ap.add_argument("--dir", default=None, help="scratch directory (default: the system's temp dir)")
    ap.add_argument("--quick", action="store_true", help="small sizes, to check that it runs")
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.rounds, args.requests, args.creates = 400, 1, 3, 40
    measured = commit(os.path.dirname(os.path.abspath(__file__))) or "?"
    with tempfile.TemporaryDirectory(prefix="fsjobstore-web-", dir=args.dir) as scratch:
        print(f"fsjobstore web bench at {measured}, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.2f}; scratch {scratch}", flush=True)
        pages = pages_part(args, scratch) if args.only != "creates" else []
        creates = creates_part(args, scratch) if args.only != "pages" else None
    print(f"summary ({args.rounds} rounds; warm: {args.requests} requests a round, pooled; spread: the rounds' "
          f"warm medians; load average now {os.getloadavg()[0]:.2f}):")
    for page in pages:
        colds = [p.cold for p in page.rounds]
        warms = [w for p in page.rounds for w in p.warm]
        medians = [statistics.median(p.warm) for p in page.rounds]
        worst = max(statistics.median(colds), pct(warms, 95))
        print(f"  {page.name:<21} cold median {ms(statistics.median(colds))} (max {ms(max(colds)).strip()})  "
              f"warm median {ms(statistics.median(warms))}  p95 {ms(pct(warms, 95))}  spread "
              f"{ms(min(medians)).strip()}-{ms(max(medians)).strip()} ms  server CPU "
              f"{ms(statistics.median(p.server_cpu for p in page.rounds)).strip()} ms  "
              f"{'under' if worst < TARGET_MS / 1000 else 'OVER'} {TARGET_MS:.0f} ms")
    if creates is not None:
        api, loop = statistics.median(creates.api), statistics.median(creates.loop)
        ratios = [a / b for a, b in zip(creates.api, creates.loop, strict=True)]
        cpu = statistics.median(creates.server_cpu)
        print(f"  creates: API {api:,.0f} jobs/s ({args.clients} clients; server CPU {cpu * 1000:.2f} ms per job) vs "
              f"store.create {loop:,.0f} jobs/s: ratio {api / loop:.2f} (the rounds' ratios: median "
              f"{statistics.median(ratios):.2f}, {min(ratios):.2f}-{max(ratios):.2f}), "
              f"{'met' if api / loop >= TARGET_RATIO else 'NOT met'} (target {TARGET_RATIO:.0%})")


if __name__ == "__main__":
    main()
