"""``fsjobstore status``: a store at a glance (counts per queue, recent rates, oldest pending job,
paused queues, live workers), once or redrawn every ``--interval`` seconds with ``--watch``.

Rates come from the store's counters (``store.counters()``, what ``/metrics`` exports): events
counted as attempts ended, per minute and queue, not jobs found in a state. So retrying failed
jobs, purging or retention removing finished ones cannot change a rate in the past, jobs kept 0 s
are counted, and the first snapshot already has them. The counters hold whole minutes: a window
counts the current minute whole and the minutes before it in proportion to their part in it.
Active and scheduled jobs per queue are read from the jobs, at most :data:`WALK_CAP` per state
and snapshot: beyond it a queue's figure is a lower bound (``+``) or unknown (``?``, JSON null)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import select
import signal
import sys
import time
from collections import Counter, defaultdict
from datetime import datetime
from itertools import islice
from typing import Any

from .. import JobStore
from . import _screen as screen
from ._args import ENV_DIR, INTERRUPTED, OK, kept, number, open_store, retain_doc, subcommand
from ._terminal import control, json_text

WINDOWS = (("1m", 60), ("5m", 300), ("15m", 900))
WALK_CAP = 5_000  # jobs read per state and snapshot, so a busy store's snapshot stays quick
QUEUE_WINDOW = "5m"  # the per-queue rate columns
DEFAULT_INTERVAL = 2.0  # --watch's seconds between snapshots

STATUS_HELP = """\
Per queue: PEND(ing), SCHED(uled), DEFER(red: shown once a job waits for others), ACT(ive) jobs, and
the jobs fulfilled (OK) and failed (FAIL) per minute over the last 5 minutes; above them, the
store's totals per state, the oldest pending job's age, paused queues, the live workers, and
fulfilled/failed per minute over the last 1, 5 and 15 minutes (from the store's counters, as
/metrics: attempts that ended so, counted by the worker runtime and by `fulfill`/`cancel` by id).
Active and scheduled jobs are read, at most {cap:,} per state: a count shown with + is at least
that, ? unknown. The text fits the terminal's width.

--watch redraws in place on a terminal (like `rq info --interval`); piped, it prints one snapshot
per interval, separated by a blank line (with --json: one JSON line per snapshot). Ctrl-C stops
it: exit 0 (a second Ctrl-C, while a snapshot is being taken: at once, exit {interrupted}); SIGTERM
and SIGHUP stop it the same way, exit 128 + the signal. A frame taller than the terminal is cut
to fit, its last line saying how many queues were left out.

example:
  fsjobstore status ./jobs --watch --interval 2"""


def add(subparsers: Any) -> None:
    p = subcommand(subparsers, "status", status, reads=True, example="",
                   help="counts per queue, recent rates, oldest pending job, paused queues, live workers")
    p.epilog = STATUS_HELP.format(cap=WALK_CAP, interrupted=INTERRUPTED) + \
        f"\n\nDIR may be left out when {ENV_DIR} is set."
    p.add_argument("--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    p.add_argument("--interval", type=number(low=0.1, high=86_400, unit="seconds"), default=None, metavar="S",
                   help=f"with --watch: seconds between snapshots, 0.1 to 86400 (default {DEFAULT_INTERVAL:g})")


def snapshot(store: JobStore) -> dict[str, Any]:
    """One status document (what ``--json`` prints)."""
    stats = store.statistics()
    live = store.workers()
    now = time.time()
    queues: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for q, n in stats.pending_by_queue.items():
        queues[q]["pending"] = n
    capped: list[str] = []
    seconds = dict(WINDOWS)
    for state in ("active", "scheduled"):
        for seen, job in enumerate(islice(store.jobs(state=state, limit=None), WALK_CAP + 1), 1):
            if seen > WALK_CAP:
                capped.append(state)
                break
            queues[job.queue][state] += 1
    counters = store.counters()
    recent = {state: {name: _in_window(counters.throughput(minutes=width // 60 + 1, now=now), col, width, now)
                      for name, width in WINDOWS}
              for col, state in ((1, "fulfilled"), (2, "failed"))}
    unknown: set[str] = set(capped)  # states whose per-queue figures missed some jobs: 0 means "?"
    width = seconds[QUEUE_WINDOW]
    rates: dict[str, tuple[float, float]] = {}  # per queue: fulfilled and failed per minute
    for q in counters.queues:
        rows = counters.throughput(q, minutes=width // 60 + 1, now=now)
        done, failed = (round(_in_window(rows, col, width, now) * 60 / width, 2) for col in (1, 2))
        if done or failed:
            rates[q] = (done, failed)
            queues.setdefault(q, Counter())  # a queue that worked in the window is shown
    for q in stats.paused:
        queues.setdefault(q, Counter())  # a paused queue is shown even when it holds nothing

    def per_queue(c: Counter[str], state: str) -> int | None:
        if c[state] == 0 and state in unknown:
            return None  # no job of this queue was among those read: unknown (JSON null, text "?")
        return c[state]

    return {
        "at": now,
        "path": str(store.path),
        "pending": stats.pending, "scheduled": stats.scheduled, "deferred": stats.deferred, "active": stats.active,
        "fulfilled": stats.fulfilled, "failed": stats.failed, "cancelled": stats.cancelled,
        "oldest_pending_age": stats.oldest_pending_age,
        "paused": sorted(stats.paused),
        "retain": retain_doc(store.retain),  # the store's recorded default (opened without retain=)
        "per_minute": {state: {w: round(n * 60 / seconds[w], 2) for w, n in counts.items()}
                       for state, counts in recent.items()},
        "capped": sorted(set(capped)),
        "walk_cap": WALK_CAP,
        "queues": {q: {"pending": c["pending"], "scheduled": per_queue(c, "scheduled"),
                       "deferred": stats.by_queue.get(q, {}).get("deferred", 0),
                       "active": per_queue(c, "active"),
                       f"fulfilled_per_minute_{QUEUE_WINDOW}": rates.get(q, (0.0, 0.0))[0],
                       f"failed_per_minute_{QUEUE_WINDOW}": rates.get(q, (0.0, 0.0))[1],
                       "paused": q in stats.paused}
                   for q, c in sorted(queues.items())},
        "workers": [{"name": w.name, "host": w.host, "pid": w.pid, "queues": w.queues, "running": len(w.current),
                     "concurrency": w.concurrency, "paused": w.paused, "last_heartbeat": w.last_heartbeat}
                    for w in live],
    }


def render(doc: dict[str, Any], room: int, height: int | None = None) -> list[str]:
    """The text of one snapshot, every line at most ``room`` characters and, with ``height``, at
    most that many lines: queues that do not fit are left out, and a last line says how many
    (a frame taller than the terminal would scroll, and could not be redrawn in place)."""
    at = datetime.fromtimestamp(doc["at"]).strftime("%H:%M:%S")
    age = doc["oldest_pending_age"]
    lines = [f"{at}  {doc['path']}"]
    lines += _wrap([f"pending {doc['pending']:,}", f"scheduled {doc['scheduled']:,}",
                    *([f"deferred {doc['deferred']:,}"] if doc.get("deferred") else []), f"active {doc['active']:,}",
                    f"fulfilled {doc['fulfilled']:,}", f"failed {doc['failed']:,}",
                    f"cancelled {doc['cancelled']:,}",
                    "oldest pending " + ("-" if age is None else screen.ago(age)),
                    "paused " + (", ".join(doc["paused"]) or "none"),
                    "finished jobs " + kept(math.inf if doc["retain"] == "forever" else doc["retain"])], room)
    running = sum(w["running"] for w in doc["workers"])
    lines.append(f"workers {len(doc['workers'])} live, {running} job{'' if running == 1 else 's'} running")
    for w in doc["workers"]:
        lines.append(f"  {w['name']}  {w['running']}/{w['concurrency']}" + ("  paused" if w["paused"] else ""))
    lines.append("")
    capped = set(doc["capped"])
    rows = [[state] + [_rate(doc["per_minute"][state][w]) for w, _ in WINDOWS] for state in ("fulfilled", "failed")]
    lines += screen.table([screen.Column("per minute"), *[screen.Column(w, right=True) for w, _ in WINDOWS]],
                          rows, room)
    if capped:
        lines.append(f"(read at most {doc['walk_cap']:,} active or scheduled jobs: counts with + are lower "
                     "bounds, ? unknown)")
    if doc["queues"]:
        lines.append("")
        deferring = any(c["deferred"] for c in doc["queues"].values())  # a column only when in use
        rows = [[q, f"{c['pending']:,}", _count(c["scheduled"], "scheduled" in capped),
                 *([f"{c['deferred']:,}"] if deferring else []), _count(c["active"], "active" in capped),
                 _rate(c[f"fulfilled_per_minute_{QUEUE_WINDOW}"]), _rate(c[f"failed_per_minute_{QUEUE_WINDOW}"]),
                 "paused" if c["paused"] else ""]
                for q, c in doc["queues"].items()]
        columns = [screen.Column("QUEUE", shrink_to=6), screen.Column("PEND", right=True),
                   screen.Column("SCHED", right=True, drop=3),
                   *([screen.Column("DEFER", right=True, drop=4)] if deferring else []),
                   screen.Column("ACT", right=True),
                   screen.Column(f"OK/{QUEUE_WINDOW}", right=True, drop=2),
                   screen.Column(f"FAIL/{QUEUE_WINDOW}", right=True, drop=1), screen.Column("")]
        queue_lines = screen.table(columns, rows, room)  # the header, then one line per queue
        if height is not None and len(lines) + len(queue_lines) > height:
            fit = max(0, height - len(lines) - 2)  # the header and the line saying what was left out
            left = len(rows) - fit
            said = f"… {left:,} more queue{'' if left == 1 else 's'} (the terminal is too short to show them)"
            queue_lines = [*queue_lines[: 1 + fit], said]
        lines += queue_lines
    if height is not None and len(lines) > height:  # even the queues' header does not fit
        left = len(lines) - max(0, height - 1)
        lines = [*lines[: max(0, height - 1)], f"… {left:,} more line{'' if left == 1 else 's'}"]
    return [screen.fit_line(line, room) for line in lines]


def _rate(per_minute: float) -> str:
    return f"{per_minute:.1f}"


def _in_window(rows: list[tuple[int, int, int]], column: int, width: int, now: float) -> float:
    """How many of ``column`` (1: fulfilled, 2: failed) the per-minute ``rows`` (oldest first,
    the current minute last) hold within the last ``width`` seconds: the current minute whole
    (all of it is past), each earlier one by the part of it the window covers."""
    start = now - width
    total = 0.0
    for i, row in enumerate(rows):
        minute, n = row[0], row[column]
        share = 1.0 if i == len(rows) - 1 else max(0.0, min(minute + 60, now) - max(minute, start)) / 60
        total += n * share
    return total


def _count(n: int | None, capped: bool) -> str:
    return "?" if n is None else f"{n:,}" + ("+" if capped else "")


def _wrap(items: list[str], room: int) -> list[str]:
    """``items`` joined by two spaces, a new line wherever the next would not fit."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= room:
            lines[-1] += "  " + item
        else:
            lines.append(item)
    return lines


class _Stop:
    """Ctrl-C under ``--watch``: the way to end it, so exit 0 once the snapshot under way is
    drawn (a store read is never cut in the middle, so no half-drawn screen and no traceback);
    a second Ctrl-C ends at once. SIGTERM (``kill``, a service manager) and SIGHUP (the terminal
    closed) end it the same way but exit 128 + the signal, as a shell expects of a killed
    program; without handlers they would kill it with the cursor still hidden. A self-pipe wakes
    the wait between snapshots."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, tty: bool) -> None:
        self.asked = False
        self.code = OK
        self.tty = tty
        self.r, self.w = os.pipe()
        os.set_blocking(self.w, False)
        self.old = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.asked:
            # A second signal: at once. Still give the terminal its cursor back (the one thing
            # the redraw changed); with SIGHUP the terminal may be gone, so a failed write is moot.
            with contextlib.suppress(OSError):
                os.write(1, SHOW_CURSOR.encode() if self.tty else b"")
                os.write(2, b"\nfsjobstore: interrupted\n")
            os._exit(INTERRUPTED if signum == signal.SIGINT else 128 + signum)
        self.asked = True
        self.code = OK if signum == signal.SIGINT else 128 + signum
        with contextlib.suppress(BlockingIOError):  # a wake-up is pending already
            os.write(self.w, b"x")

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until a stopping signal; True when it is time to stop."""
        if not self.asked:
            # RACE: a signal between the test and select() is not lost: its byte is in the
            # pipe already, so select() returns at once.
            poller = select.poll()  # not select(): it refuses descriptors past 1023
            poller.register(self.r, select.POLLIN)
            poller.poll(max(0, math.ceil(seconds * 1000)))
        return self.asked

    def close(self) -> None:
        for signum, old in self.old.items():
            signal.signal(signum, old)
        os.close(self.r)
        os.close(self.w)


SHOW_CURSOR = "\x1b[?25h"


def status(args: argparse.Namespace) -> int:

    if args.interval is not None and not args.watch:
        args.parser.error("--interval needs --watch")  # else it would be ignored without a word
    with open_store(args) as store:
        if not args.watch:
            _show(snapshot(store), args, tty=False, first=True)
            return OK
        tty = sys.stdout.isatty() and not args.json
        stop = _Stop(tty)
        try:
            first = True
            period = DEFAULT_INTERVAL if args.interval is None else args.interval
            while not stop.asked:
                began = time.monotonic()
                _show(snapshot(store), args, tty=tty, first=first)
                first = False
                # Every `period` seconds, not `period` after each snapshot (which takes its time).
                if stop.wait(max(0.0, period - (time.monotonic() - began))):
                    break
        finally:
            stop.close()
            if tty:
                with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                    control(sys.stdout, SHOW_CURSOR)
                    sys.stdout.flush()
    return stop.code


def _show(doc: dict[str, Any], args: argparse.Namespace, *, tty: bool, first: bool) -> None:
    if args.json:
        print(json_text(json.dumps(doc, ensure_ascii=False)))
    elif tty:
        # Home, each line over the old one (erasing its rest), then erase below: a redraw in
        # place without the flash of a full clear.
        # At most one line fewer than the terminal has: the last line's newline would scroll it,
        # and a frame that scrolls is no longer redrawn in place.
        control(sys.stdout, "\x1b[?25l\x1b[H\x1b[2J" if first else "\x1b[H")
        for line in render(doc, screen.width(), screen.height() - 1):
            sys.stdout.write(line)
            control(sys.stdout, "\x1b[K\n")
        control(sys.stdout, "\x1b[J")
    else:
        if not first:
            print()
        print("\n".join(render(doc, screen.width())))
    sys.stdout.flush()
