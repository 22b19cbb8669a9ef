"""Commands that read or change jobs and stores: init, create, get, fulfill, queue, cancel,
retry, wait, pause, resume, workers, quarantine, stats, recover, verify (the bulk forms of cancel and retry,
and list, purge and status, are in :mod:`._ops` and :mod:`._status`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any

from .. import (
    MAX_PRIORITY,
    MAX_TARGETS,
    MIN_PRIORITY,
    Job,
    JobNotFound,
    JobState,
    JobStore,
    StoreNotFound,
    WaitTimeout,
    check_queue_name,
    verify,
    verify_across_hosts,
)
from . import _ops
from . import _render as render
from ._args import (
    FAILED,
    OK,
    SECONDS_MAX,
    TIMED_OUT,
    Refused,
    UsageError,
    delay,
    kept,
    make_store,
    moment,
    no_lock_takeover,
    number,
    open_store,
    retain_doc,
    retention,
    store_options,
    subcommand,
    time_limit,
)
from ._terminal import printable

SECONDS = number(low=0, high=SECONDS_MAX, above=True, unit="seconds")  # a time limit, or a wait
DELAY = number(low=0, high=SECONDS_MAX, unit="seconds")


def add(subparsers: Any) -> None:
    p = subcommand(subparsers, "init", init, help="make a new, empty store in DIR (missing or empty)",
                   example="fsjobstore init /var/lib/myapp/jobs --group myapp", store_options=False)
    p.add_argument("--no-fsync", action="store_true", default=argparse.SUPPRESS,
                   help="make a store that does not fsync (fast; a power cut may lose recent work)")
    p.add_argument("--group", help="share the store with this Unix group (name or gid)")
    p.add_argument("--retain", type=retention, default=None, metavar="AGE",
                   help="how long finished jobs are kept before they are removed: 90s, 15m, 12h, 7d, 2w, plain "
                        "seconds, 0 (as soon as they are final) or forever (default 7d); recorded in the store "
                        "when it is made, and fixed from then on")

    p = subcommand(subparsers, "create", create, positionals=("REQUEST",), reads=True,
                   help="create a job from a JSON request and print its id (--init: make the store if DIR has none)",
                   example="""fsjobstore create ./jobs '{"resize": "cat.png"}' --queue images --priority -1""")
    p.add_argument("--queue", default="default", help="the job's queue (default: default)")
    p.add_argument("--priority", type=number(low=MIN_PRIORITY, high=MAX_PRIORITY, integer=True), default=0,
                   help=f"lower runs sooner, {MIN_PRIORITY} to {MAX_PRIORITY} (default 0)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=delay, default=None, metavar="AGE",
                      help="how long before it may run: 90s, 15m, 1h30m, 7d or plain seconds")
    when.add_argument("--run-at", type=moment, default=None, metavar="TIME",
                      help="when it may run: an ISO-8601 time with its timezone (2026-12-01T09:30:00+01:00, "
                           "or ...Z for UTC; a time without one is refused) or epoch seconds")
    p.add_argument("--max-attempts", type=number(low=1, high=1_000_000, integer=True), default=None, metavar="N",
                   help="attempts before it fails for good, 1 to 1000000 (default 3)")
    p.add_argument("--id", dest="job_id", default=None, help="choose the job id (an unused one)")
    p.add_argument("--timeout", type=time_limit, default=None, metavar="AGE",
                   help="how long one attempt may run: 90s, 15m, 1h or plain seconds (default: no limit)")
    p.add_argument("--retain", type=retention, default=None, metavar="AGE",
                   help="how long this job is kept once finished: 90s, 15m, 12h, 7d, 2w, plain seconds, 0 (as "
                        "soon as it is final) or forever (default: the store's, recorded when it was made)")
    p.add_argument("--notify", action="append", default=[], metavar="TARGET",
                   help="a JSON target to deliver the result to (repeat it); `fsjobstore notify` delivers")
    p.add_argument("--unique-key", default=None, metavar="KEY",
                   help="while a job with KEY is not final, print that job instead of making another")
    p.add_argument("--concurrency-key", default=None, metavar="KEY",
                   help="run at most KEY's limit of such jobs at once (one, unless `fsjobstore limit` says more)")
    p.add_argument("--after", action="append", default=[], metavar="ID", type=_one_id,
                   help="wait for this job to be fulfilled first (repeat it); the job is deferred until then")
    p.add_argument("--on-parent-failure", choices=("cancel", "run"), default="cancel",
                   help="when a job of --after fails or is cancelled: cancel this one (default) or run it anyway")
    p.add_argument("--init", action="store_true",
                   help="make the store if DIR has none, as `fsjobstore init DIR` would (without it, a missing store "
                        "is an error: a typo in DIR would start a store no worker looks at)")

    subcommand(subparsers, "get", get, positionals=("ID",), reads=True,
               help="show one job", example="fsjobstore get ./jobs 18eb1a2579860598667e72977f6424cd --json")

    p = subcommand(subparsers, "fulfill", fulfill, positionals=("ID", "VALUE"),
                   help="fulfil a job by id with a value (- reads it from stdin)",
                   example="echo '{\"width\": 640}' | fsjobstore fulfill ./jobs invoice-7 - --json-value")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--json-value", action="store_true", help="VALUE is JSON (default: it is text)")
    how.add_argument("--bytes", action="store_true", help="store VALUE as raw bytes (for binary stdin)")

    subcommand(subparsers, "queue", queue, positionals=("ID", "TARGET"),
               help="ask for a job's result to be delivered to a JSON target",
               example="""fsjobstore queue ./jobs invoice-7 '{"webhook": "https://example.com/done"}'""")

    p = subcommand(subparsers, "cancel", cancel, positionals=("ID",), reads=True,
                   help="cancel a job (or, with --state, every job in that state): a waiting one at once, a "
                        "running one by asking its worker to stop",
                   example="fsjobstore cancel ./jobs invoice-7 --reason 'customer withdrew'\n"
                           "  fsjobstore cancel ./jobs --state pending --queue images   (every pending job of a queue)")
    p.add_argument("--reason", default=None, help="why (kept as the job's error)")
    _in_bulk(p, ["pending", "scheduled", "deferred", "active"], "pending")

    p = subcommand(subparsers, "retry", retry, positionals=("ID",), reads=True,
                   help="give a failed or cancelled job (or, with --state, every job in that state) a new life "
                        "(back to pending, all attempts again)",
                   example="fsjobstore retry ./jobs invoice-7\n"
                           "  fsjobstore retry ./jobs --state failed --queue images   (every failed job of a queue)")
    _in_bulk(p, ["failed", "cancelled"], "failed")

    p = subcommand(subparsers, "wait", wait, positionals=("ID",), reads=True,
                   help="wait until a job ends and show it; exit 0 if it was fulfilled, 1 if not, 5 on timeout",
                   example="fsjobstore wait ./jobs invoice-7 --timeout 60 --json")
    p.add_argument("--timeout", type=DELAY, default=None, metavar="S",
                   help="seconds to wait at most (default: forever)")

    subcommand(subparsers, "pause", pause, positionals=("QUEUE",),
               help="stop every worker from taking jobs of a queue (it still accepts new jobs)",
               example="fsjobstore pause ./jobs images")
    subcommand(subparsers, "resume", resume, positionals=("QUEUE",), help="undo pause",
               example="fsjobstore resume ./jobs images")

    subcommand(subparsers, "workers", workers, reads=True, help="list the workers running on the store",
               example="fsjobstore workers ./jobs --json")

    p = subcommand(subparsers, "quarantine", quarantine, reads=True,
                   help="list the files the store moved aside as unusable (quarantine/): where each was, why, when",
                   example="fsjobstore quarantine ./jobs --limit 20")
    p.add_argument("--limit", type=number(low=1, high=_ops.LIST_MAX, integer=True), default=None, metavar="N",
                   help=f"the oldest N only, 1 to {_ops.LIST_MAX:,} (default: all)")

    subcommand(subparsers, "stats", stats, reads=True, help="count jobs per state and queue",
               example="fsjobstore stats ./jobs --json")

    p = subcommand(subparsers, "recover", recover, reads=True,
                   help="repair what dead or hung processes left behind, and say what was done",
                   example="fsjobstore recover ./jobs")
    no_lock_takeover(p)

    p = subcommand(subparsers, "verify", verify_command, reads=True, store_options=False,
                   help="self-test the filesystem under DIR (an existing directory); exit 0 if a store is safe there",
                   example="fsjobstore verify /mnt/shared/jobs --wait-for-peer   (then, on another host: "
                           "fsjobstore verify /mnt/shared/jobs --peer)",
                   description="Check, with real processes, what a store relies on in DIR. With --wait-for-peer "
                               "here and --peer on a second host that mounts the same directory, also check what "
                               "the two hosts see of each other (rename fence, no-replace publish, heartbeat "
                               "visibility, locks, inotify, clock skew) and say the safe lease_duration.")
    side = p.add_mutually_exclusive_group()
    side.add_argument("--wait-for-peer", action="store_true", help="lead a two-host check; wait for a --peer")
    side.add_argument("--peer", action="store_true", help="join the two-host check another host leads")
    p.add_argument("--timeout", type=SECONDS, default=300.0, metavar="S",
                   help="seconds to wait for the other host (default 300)")


def _in_bulk(p: argparse.ArgumentParser, states: list[str], usual: str) -> None:
    """``--state`` (and ``--queue``) instead of an ID: every such job, counted (:func:`_ops.bulk`)."""
    p.add_argument("--state", choices=states, default=None,
                   help=f"instead of an ID: every job in this state ({', '.join(states)}), saying how many; "
                        "one that moves on meanwhile is skipped. On a terminal, progress is shown on stderr")
    p.add_argument("--queue", default=None, help="with --state: only the jobs of this queue")
    p.set_defaults(shape=_ops.one_or_many, bulk_states=usual)
    p.usage = (p.usage or "").replace(" ID", " (ID | --state S [--queue Q])")


def json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        # The arguments typed the other way round: DIR where the JSON goes.
        swapped = f"; {text!r} is a directory: DIR comes first, then the {what}" if os.path.isdir(text) else ""
        raise UsageError(f"the {what} is not JSON: {exc}{swapped}") from None


def init(args: argparse.Namespace) -> int:
    group: str | int | None = args.group
    if isinstance(group, str) and group.isdigit():
        group = int(group)
    durable = not getattr(args, "no_fsync", False)
    wanted = None if args.retain is None else math.inf if args.retain == "forever" else float(args.retain)
    try:  # say so when there was one already: init is idempotent, but a typo in DIR is not
        with JobStore(args.dir, create=False) as store:  # no retain=: store.retain is the recorded default
            if wanted is not None and store.retain != wanted:
                # The default is in the store's marker, written once when it is made (FORMAT.md):
                # init cannot change it, and saying "ready" would hide that the option was ignored.
                raise Refused(f"{store.path} is already a store whose finished jobs are {kept(store.retain)}; "
                              "a store's retention is fixed when it is made (create --retain sets one job's)")
            # A store's durability is its maker's (init --no-fsync): asking for the default on a
            # store made without fsync reports what it is; asking for less than a durable store
            # promises is refused, in the command line's words (the API's say durable=False).
            if not durable and store.durable:
                raise UsageError(f"{store.path} is a durable store: --no-fsync asks for less than it promises "
                                 "to every process that shares it (a store's durability is fixed when it is made)")
            if group is None or store.group is not None:
                print(f"{store.path} is already a store {_settings(store)}")
                return OK
        existed = True
    except StoreNotFound:
        existed = False
    # A new store, or one that differs from what was asked: opening it as asked makes it or says why not.
    with make_store(args.dir, durable=durable, group=group, retain=args.retain) as store:
        if existed:
            print(f"{store.path} is already a store, opened as asked {_settings(store)}")
        else:
            print(f"a new store is ready at {store.path} {_settings(store)}")
    return OK


def _settings(store: JobStore) -> str:
    shared = f", shared with gid {store.group}" if store.group is not None else ""
    return f"(durable={store.durable}{shared}); finished jobs are {kept(store.retain)}"


def _one_id(text: str) -> str:
    if "," in text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not one job id: give --after once for each job it waits for")
    return text


@contextlib.contextmanager
def _store_to_create_in(args: argparse.Namespace) -> Iterator[JobStore]:
    """The store ``create`` puts its job in. A missing one is made only with ``--init`` (a typo
    in DIR must not start a store no worker looks at), and a create refused there leaves nothing
    behind: the store it made for the job is removed again, with every directory made for it."""
    try:
        with open_store(args) as store:
            yield store
        return
    except StoreNotFound:
        if not args.init:
            raise StoreNotFound(f"no store at {args.dir}: make one with `fsjobstore init {args.dir}`, "
                                "or give create --init") from None
    check_queue_name(args.queue, "--queue")  # what a new store can refuse without being made
    if args.after:
        raise JobNotFound(f"--after {args.after[0]}: no such job (there is no store at {args.dir} yet)")
    made = _first_missing(args.dir)
    store = make_store(args.dir, **store_options(args))
    print(f"fsjobstore create: made a new store at {store.path}", file=sys.stderr)
    try:
        with store:
            yield store
    except BaseException:
        # RACE: nothing else can hold a job in this store yet: it was made an instant ago by this
        # command, and its path was given to no one. Only what this command made goes.
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        else:
            for name in os.listdir(args.dir):
                entry = os.path.join(args.dir, name)
                shutil.rmtree(entry, ignore_errors=True) if os.path.isdir(entry) and not os.path.islink(entry) \
                    else os.unlink(entry)
        print(f"fsjobstore create: removed the new store at {store.path} again: nothing was created",
              file=sys.stderr)
        raise


def _first_missing(path: str) -> str | None:
    """The outermost directory of ``path`` that does not exist yet (None: ``path`` exists)."""
    missing = None
    here = os.path.abspath(path)
    while not os.path.lexists(here):
        missing = here
        here = os.path.dirname(here)
    return missing


def create(args: argparse.Namespace) -> int:
    request = json_arg(args.request, "request")
    targets = [json_arg(text, "--notify target") for text in args.notify]
    if len(targets) > MAX_TARGETS:  # before the job is made: a job takes at most that many
        raise UsageError(f"--notify names {len(targets)} targets; a job takes at most {MAX_TARGETS}")
    with _store_to_create_in(args) as store:
        asked_at = time.time()
        job = store.create(request, queue=args.queue, priority=args.priority, delay=args.delay, run_at=args.run_at,
                           max_attempts=args.max_attempts, job_id=args.job_id, timeout=args.timeout,
                           retain=args.retain, unique_key=args.unique_key, after=args.after or None,
                           on_parent_failure=args.on_parent_failure, concurrency_key=args.concurrency_key)
        made = [job]
        if job.topic is not None and job.group is not None:  # fanned out: each copy gets the targets
            made = list(store.get_group(job.group).jobs)
        # RACE: a worker may finish the job before its targets are queued; queue() then indexes
        # the final job for notification at once, so no target misses its result.
        for copy in made:
            for target in targets:
                store.queue(copy.id, target)
        if targets:
            job = store.get(job.id)  # the snapshot that shows its targets
        copies = [c.queue for c in made] if job.topic is not None else []  # a copy: the create fanned out
    if args.unique_key is not None and job.created_at < asked_at:  # the holder was answered: say so
        print(f"unique key {args.unique_key!r} is held by job {job.id} ({job.state.value}): no job was made",
              file=sys.stderr)
    if copies:  # fanned out: the id printed is one copy's of several
        many = len(copies) > 1
        print(f"queue {job.topic} fans out: {len(copies)} {'copies' if many else 'copy'}, in queue{'s' * many} "
              f"{', '.join(copies)} (group {job.group}); the id printed is the first's", file=sys.stderr)
    if args.json:
        render.print_json(job.to_dict())
    else:
        print(job.id)
    return OK


def get(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        show(store.get(args.id), args)
    return OK


def fulfill(args: argparse.Namespace) -> int:
    raw: bytes = sys.stdin.buffer.read() if args.value == "-" else args.value.encode("utf-8", "surrogateescape")
    value: Any
    if args.bytes:
        value = raw
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError("the value is not UTF-8 text; give --bytes to store it as bytes") from None
        value = json_arg(text, "value") if args.json_value else text
    with open_store(args) as store:
        store.fulfill(args.id, value)
    return OK


def queue(args: argparse.Namespace) -> int:
    target = json_arg(args.target, "target")
    with open_store(args) as store:
        store.queue(args.id, target)
    return OK


def show(job: Job, args: argparse.Namespace) -> None:
    if args.json:
        render.print_json(job.to_dict())
    else:
        render.print_job(job)


def cancel(args: argparse.Namespace) -> int:
    if args.state:
        return _ops.bulk(args, "cancel", lambda store, job_id: store.cancel(job_id, reason=args.reason))
    with open_store(args) as store:
        show(store.cancel(args.id, reason=args.reason), args)
    return OK


def retry(args: argparse.Namespace) -> int:
    if args.state:
        return _ops.bulk(args, "retry", lambda store, job_id: store.retry(job_id))
    with open_store(args) as store:
        show(store.retry(args.id), args)
    return OK


def wait(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        try:
            job = store.wait(args.id, timeout=args.timeout)
        except WaitTimeout as exc:
            print(f"fsjobstore wait: WaitTimeout: {exc}", file=sys.stderr)
            return TIMED_OUT
    show(job, args)
    if job.state is not JobState.FULFILLED:  # exit 1 says so; a line on stderr says why, as other errors do
        print(f"fsjobstore wait: JobFailed: job {job.id} ended {job.state.value}", file=sys.stderr)
        return FAILED
    return OK


def pause(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        changed = store.pause(args.queue)
        known = args.queue in store.statistics().pending_by_queue
    # A queue may be paused before it has jobs; a typo'd name would pause nothing, so say so.
    print(f"queue {args.queue} " + ("paused" if changed else "was already paused")
          + ("" if known else " (no such queue in this store yet: jobs created in it will wait)"))
    return OK


def resume(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        changed = store.resume(args.queue)
    print(f"queue {args.queue} " + ("resumed" if changed else "was not paused"))
    return OK


def workers(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        found = store.workers()
    if args.json:
        render.print_json([dataclasses.asdict(w) for w in found])
    else:
        render.print_workers(found)
    return OK


def quarantine(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        found = store.quarantined(limit=args.limit)
        where = os.path.join(store.path, "quarantine")
        total = store.statistics().quarantined if args.limit is not None and len(found) == args.limit else len(found)
    if args.json:
        render.print_json([dataclasses.asdict(q) for q in found])
        return OK
    for q in found:  # one line each, whatever a planted name holds (a newline among it)
        print(f"{render.when(q.at)}  {printable(q.origin, newlines=False)}  {printable(q.reason, newlines=False)}"
              f"  [{printable(q.name, newlines=False)}]")
    if not found:
        print(f"nothing in {where}: no file was moved aside")
        return OK
    shown = f"the oldest {len(found):,} of {total:,}" if total > len(found) else f"{len(found):,}"
    print(f"{shown} file{'s' if total != 1 else ''} in {where} [as named there]. The store never removes "
          "them: look (each NAME.reason beside its file says the same), keep what matters, then delete them.")
    return OK


def stats(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        snapshot = store.statistics()
        retain = store.retain  # opened without retain=: the store's recorded default
    if args.json:
        render.print_json(render.stats_doc(snapshot) | {"retain": retain_doc(retain)})
    else:
        render.print_stats(snapshot, retention="finished jobs are " + kept(retain))
    return OK


def recover(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        report = store.recover()
    counts = dataclasses.asdict(report)
    if args.json:
        render.print_json(counts)
    else:
        render.print_counts(counts)
    return OK


def verify_command(args: argparse.Namespace) -> int:
    if args.wait_for_peer or args.peer:
        report = verify_across_hosts(args.dir, lead=args.wait_for_peer, timeout=args.timeout,
                                     say=lambda line: print(line, file=sys.stderr))
    else:
        report = verify(args.dir)
    if args.json:
        doc = dataclasses.asdict(report)
        doc["checks"] = [dataclasses.asdict(c) for c in report.checks]
        render.print_json(doc)
    else:
        for line in report.lines():
            print(line)
    return OK if report.safe else FAILED
