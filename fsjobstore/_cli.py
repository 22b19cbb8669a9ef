"""The ``fsjobstore`` command: inspect and operate a store from the shell or cron."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._errors import JobStoreError
from ._store import JobStore
from ._verify import verify


def _job_json(job: Any) -> dict[str, Any]:
    doc = dataclasses.asdict(job)
    doc["state"] = job.state.value
    value = doc.pop("value")
    if value is not None:
        try:
            doc["value"] = value.decode("utf-8")
        except UnicodeDecodeError:
            doc["value_hex"] = value.hex()
    doc["waiting"] = list(doc["waiting"])
    return doc


def _print(doc: Any) -> None:
    print(json.dumps(doc, indent=2, ensure_ascii=False, default=str))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fsjobstore", description="Operate an fsjobstore directory.")
    parser.add_argument("--no-fsync", action="store_true", help="open with durable=False")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("create", help="create a job from a JSON request; prints its id")
    p.add_argument("dir")
    p.add_argument("request", help="the request, as JSON")
    p.add_argument("--queue", default="default")
    p.add_argument("--priority", type=int, default=0, help="lower runs sooner")
    p.add_argument("--delay", type=float, default=None, help="seconds before it may run")
    p.add_argument("--id", dest="job_id", default=None, help="choose the job id (must be unused)")

    p = sub.add_parser("get", help="print one job as JSON")
    p.add_argument("dir")
    p.add_argument("job_id")

    p = sub.add_parser("stats", help="print counts per state and queue as JSON")
    p.add_argument("dir")

    p = sub.add_parser("recover", help="repair what dead or hung processes left behind")
    p.add_argument("dir")

    p = sub.add_parser("fulfill", help="fulfil a job by id with a value")
    p.add_argument("dir")
    p.add_argument("job_id")
    p.add_argument("value")

    p = sub.add_parser("queue", help="ask for a job's result to be delivered to a JSON target")
    p.add_argument("dir")
    p.add_argument("job_id")
    p.add_argument("target", help="the target, as JSON")

    p = sub.add_parser("verify", help="self-test the filesystem under DIR; exit 0 if the store is safe there")
    p.add_argument("dir")

    args = parser.parse_args(argv)
    if args.command == "verify":
        return 0 if verify(args.dir) else 1
    try:
        with JobStore(args.dir, durable=not args.no_fsync) as store:
            if args.command == "create":
                job = store.create(_json_arg(args.request, "request"), queue=args.queue,
                                   priority=args.priority, delay=args.delay, job_id=args.job_id)
                print(job.id)
            elif args.command == "get":
                _print(_job_json(store.get(args.job_id)))
            elif args.command == "stats":
                _print(dataclasses.asdict(store.statistics()))
            elif args.command == "recover":
                _print(dataclasses.asdict(store.recover()))
            elif args.command == "fulfill":
                store.fulfill(args.job_id, args.value)
            elif args.command == "queue":
                store.queue(args.job_id, _json_arg(args.target, "target"))
    except JobStoreError as exc:
        print(f"fsjobstore: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"fsjobstore: the {what} is not JSON: {exc}") from None
