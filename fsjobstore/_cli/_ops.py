"""The operator's commands over many jobs: ``list``, ``purge``, and the bulk forms of ``retry``
and ``cancel`` (``--state`` instead of an ID; the one-job forms stay in :mod:`._jobs`)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from .. import InvalidState, Job, JobNotFound, JobState, JobStore
from . import _screen as screen
from ._args import ENV_DIR, OK, duration, number, open_store, subcommand
from ._terminal import json_text

STATES = [s.value for s in JobState]
PURGEABLE = ["pending", "scheduled", "deferred", "fulfilled", "failed", "cancelled"]
LIST_MAX = 10_000  # the store's bound on one page (JobStore.jobs(limit=...), JobStore.quarantined(limit=...))

LIST_HELP = """\
columns: ID (whole, to paste), STATE, QUEUE, ATT (attempts begun / allowed), AGE (since it was
created; a final job: since it finished; a scheduled one: "in 5m", until it is due), REQUEST
(its JSON, cut to the terminal's width or COLUMNS; piped, nothing is cut). ID and STATE
are never dropped. Order: active, pending (in the order workers take
them), scheduled (by due time), then final jobs newest first. When there is more, a terminal
is told on stderr how to get the next page (--after the last ID shown).

example:
  fsjobstore list ./jobs --state failed --queue images --limit 20
  fsjobstore list ./jobs --state failed --json | jq -r .id"""

PURGE_HELP = """\
Waiting (pending, scheduled) jobs are removed with the targets queued for their result: nobody
will ever hear of them. A final job whose result still waits to be delivered is skipped. A
running job is never purged (cancel it first). A removed job's id may be used again.
On a terminal, progress is shown on stderr.

example:
  fsjobstore purge ./jobs --state failed --older-than 7d --dry-run
  fsjobstore purge ./jobs --state pending --queue images --match '"cat\\.png"'"""


def add(subparsers: Any) -> None:
    p = subcommand(subparsers, "list", list_jobs, reads=True, help="list jobs, a page at a time",
                   example="", description="List jobs, a page at a time, as a table (JSON lines with --json).")
    p.epilog = LIST_HELP + f"\n\nDIR may be left out when {ENV_DIR} is set."
    p.add_argument("--state", choices=STATES, default=None, help="only jobs in this state")
    p.add_argument("--queue", default=None, help="only jobs of this queue")
    p.add_argument("--limit", type=number(low=1, high=LIST_MAX, integer=True), default=50, metavar="N",
                   help=f"at most N jobs, 1 to {LIST_MAX:,} (default 50)")
    p.add_argument("--after", default=None, metavar="ID",
                   help="start after this job (the last ID of the previous page)")

    p = subcommand(subparsers, "purge", purge, reads=True, example="",
                   help="remove jobs for good, chosen by state, queue, age and a pattern, and say how many")
    p.epilog = PURGE_HELP + f"\n\nDIR may be left out when {ENV_DIR} is set."
    p.add_argument("--state", dest="states", action="extend", type=_states, default=None, metavar="S",
                   help="a state to purge (repeat it, or S1,S2): pending, scheduled, deferred, fulfilled, "
                        "failed, cancelled (default: the three final ones)")
    p.add_argument("--queue", default=None, help="only jobs of this queue")
    p.add_argument("--older-than", type=duration, default=None, metavar="AGE",
                   help="only jobs finished (waiting ones: created) longer ago than AGE: 90s, 15m, 12h, 7d, 2w "
                        "or plain seconds")
    p.add_argument("--match", default=None, metavar="REGEX",
                   help="only jobs whose request (its compact JSON text) or id this regular expression finds: RE2 "
                        "syntax (no backreferences or lookaround), linear in time; needs the re2 extra: "
                        "pip install 'fsjobstore[re2]'")
    p.add_argument("--limit", type=number(low=1, high=10**12, integer=True), default=None, metavar="N",
                   help="remove at most N jobs")
    p.add_argument("--dry-run", action="store_true", help="only count what would be removed")


def _states(text: str) -> list[str]:
    """``--state failed`` or ``--state failed,cancelled``; ``active`` is refused here, saying why,
    so that the error names the option (the store's own would name its argument, ``states``)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    for name in names or [text]:
        if name == "active":
            raise argparse.ArgumentTypeError("a running job is never purged; cancel it first (it is then final, "
                                             "and a purge of 'cancelled' removes it)")
        if name not in STATES:
            raise argparse.ArgumentTypeError(f"{name!r} is not a state (choose from {', '.join(PURGEABLE)})")
    return names


def _walk(store: JobStore, args: argparse.Namespace, state: str | None, after: str | None = None) -> Iterator[Job]:
    return store.jobs(state=state, queue=args.queue, limit=None, after=after)


def list_jobs(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        walk = _walk(store, args, args.state, args.after)
        try:
            page = list(islice(walk, args.limit + 1))  # one more: is there a next page?
        finally:
            close = getattr(walk, "close", None)
            if close:
                close()
    more = len(page) > args.limit
    page = page[: args.limit]
    if args.json:
        for job in page:
            print(json_text(json.dumps(job.to_dict(), ensure_ascii=False)))
    elif page:
        for line in job_table(page, time.time(), screen.room(sys.stdout)):
            print(line)
    else:
        print("no jobs" + (" after " + args.after if args.after else ""))
    sys.stdout.flush()
    if more and sys.stderr.isatty():
        print(f"more: {next_page(args, page[-1].id)}", file=sys.stderr)
    return OK


def job_table(jobs: list[Job], now: float, room: int | None) -> list[str]:
    """The table of ``list``, fitted to ``room`` columns (None: not cut). The ID and the STATE are
    never dropped (a job without its state says little): at under ~43 columns their line is wider."""
    columns = [screen.Column("ID"), screen.Column("STATE"), screen.Column("QUEUE", shrink_to=8, drop=3),
               screen.Column("ATT", right=True, drop=4), screen.Column("AGE", right=True, drop=5),
               screen.Column("REQUEST", shrink_to=12, drop=6)]
    rows = [[job.id, job.state.value, job.queue, f"{job.attempts}/{job.max_attempts}", age(job, now),
             json.dumps(job.request, ensure_ascii=False, separators=(",", ":"))] for job in jobs]
    return screen.table(columns, rows, sys.maxsize if room is None else room)


def age(job: Job, now: float) -> str:
    if job.state is JobState.SCHEDULED and job.run_at is not None and job.run_at > now:
        return "in " + screen.ago(job.run_at - now)
    return screen.ago(now - (job.finished_at if job.finished_at is not None else job.created_at))


def next_page(args: argparse.Namespace, last: str) -> str:
    words = ["fsjobstore", "list"] + ([] if args.dir == os.environ.get(ENV_DIR) else [args.dir])
    for option in ("state", "queue", "limit"):
        if getattr(args, option) is not None:
            words += [f"--{option}", str(getattr(args, option))]
    return " ".join(shlex.quote(w) for w in [*words, "--after", last])


def purge(args: argparse.Namespace) -> int:
    chosen: dict[str, Any] = {"queue": args.queue, "older_than": args.older_than, "match": args.match,
                              "limit": args.limit, "dry_run": args.dry_run}
    if args.states:
        chosen["states"] = tuple(dict.fromkeys(args.states))
    progress = screen.Progress("counted" if args.dry_run else "purged")
    with open_store(args) as store:
        try:
            removed = store.purge(progress=progress, **chosen)
        finally:
            progress.end()
    if args.json:
        print(json.dumps({"purged": removed, "dry_run": args.dry_run}))
    elif args.dry_run:
        print(f"would purge {removed:,} job{_s(removed)} (dry run: nothing was removed)")
    else:
        print(f"purged {removed:,} job{_s(removed)}")
    return OK


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def bulk(args: argparse.Namespace, verb: str, act: Callable[[JobStore, str], Job]) -> int:
    """``retry``/``cancel`` with ``--state``: every job in that state (and ``--queue``) when the
    command starts. Their ids are listed first, then each is acted on by id, so the walk is never
    disturbed by the moves it makes; a job that moved meanwhile (claimed, finished, retried or
    removed by someone else) is counted as skipped, not an error."""
    listing = screen.Progress("found")
    with open_store(args) as store:
        try:
            ids = []
            for job in _walk(store, args, args.state):
                ids.append(job.id)
                listing(len(ids))
        finally:
            listing.end()
        # Nothing found in a queue the store holds no job of at all: most likely a typo in --queue.
        # Say so (it stays exit 0: "nothing to do" is a true answer); only then is it worth a look.
        no_such_queue = bool(args.queue) and not ids and next(iter(store.jobs(queue=args.queue, limit=1)), None) is None
        done = skipped = stopping = 0
        refused: list[str] = []  # still in its state, and the store said why not (a held unique key...)
        progress = screen.Progress({"retry": "retried", "cancel": "cancelled"}[verb])
        try:
            for job_id in ids:
                try:
                    # RACE: the job may have moved since it was listed; the store checks its state
                    # under its own fence, and says so (InvalidState, JobNotFound): skipped.
                    after = act(store, job_id)
                except JobNotFound:
                    skipped += 1
                except InvalidState as exc:
                    try:
                        still = store.get(job_id).state.value == args.state
                    except JobNotFound:
                        still = False
                    if still:
                        refused.append(str(exc))
                    else:
                        skipped += 1
                else:
                    done += 1
                    stopping += after.state is JobState.ACTIVE  # claimed meanwhile: asked to stop
                progress(done + skipped)
        finally:
            progress.end()
    what = {"retry": "retried", "cancel": "cancelled"}[verb]
    if args.json:
        doc = {what: done, "skipped": skipped, "refused": len(refused)} | (
            {"stopping": stopping} if verb == "cancel" else {})
        print(json.dumps(doc))
    else:
        line = f"{what} {done:,} {args.state} job{_s(done)}" + (f" of queue {args.queue}" if args.queue else "")
        if no_such_queue:
            line += " (no such queue in this store)"
        if stopping:
            line += f" ({stopping:,} had started: their workers are asked to stop)"
        if skipped:
            line += f"; skipped {skipped:,} that moved on meanwhile"
        if refused:
            line += f"; refused {len(refused):,} (the first: {refused[0]})"
        print(line)
    return OK


def one_or_many(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """The positionals of ``retry`` and ``cancel``: ``DIR ID`` for one job, ``DIR`` with
    ``--state``; both, or neither, is a usage error that says what to give."""
    given, env = len(ns.args), bool(os.environ.get(ENV_DIR))
    if ns.state is None:
        if ns.queue is not None and (given >= 2 or (given == 1 and env)):
            parser.error("--queue chooses jobs together with --state; with a job ID, leave it out")
        if ns.queue is not None:
            parser.error(f"--queue needs --state: add --state {ns.bulk_states} for every such job of queue {ns.queue}")
        if given == 0 or (given == 1 and not env):
            parser.error(f"give the ID of one job, or --state {ns.bulk_states} for every job in that state")
        return ("DIR", "ID")
    if given >= 2:
        parser.error(f"give either a job ID or --state, not both (got {ns.args[-1]!r} and --state {ns.state})")
    return ("DIR",)
