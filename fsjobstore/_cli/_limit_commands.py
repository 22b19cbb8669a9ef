"""Limits from the shell: ``limits`` (what is declared, and what runs and waits under each) and
``limit`` (declare or clear one)."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from .. import Limit
from . import _render as render
from ._args import OK, UsageError, open_store, subcommand


def add(subparsers: Any) -> None:
    subcommand(subparsers, "limits", limits, reads=True,
               help="list the concurrency and rate limits of a store, with the jobs running and waiting under each",
               example="fsjobstore limits ./jobs --json")
    p = subcommand(subparsers, "limit", limit,
                   help="declare (or clear) a limit: at most N jobs of a key or queue at once, at most N starts "
                        "a period",
                   example="fsjobstore limit ./jobs --key payments-api --concurrency 3 --rate 10/m",
                   description="Declare the limit of a concurrency key (the jobs made with --concurrency-key KEY) "
                               "or of a queue, for every process on the directory. A key nobody declared runs "
                               "one job at a time. Jobs over a limit wait, in order, and show as pending.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", default=None, help="a concurrency key")
    which.add_argument("--queue", default=None, help="a queue name")
    p.add_argument("--concurrency", type=int, default=None, metavar="N", help="at most N of its jobs run at once")
    p.add_argument("--rate", default=None, metavar="N/PER",
                   help="at most N of its jobs start in any period: 10/m, 3/s, 100/h, 5/30s")
    p.add_argument("--clear", action="store_true", help="remove the limit instead")


def _row(lim: Limit) -> dict[str, Any]:
    return {"kind": lim.kind, "name": lim.name, "concurrency": lim.concurrency,
            "rate": None if lim.rate is None else {"starts": lim.rate[0], "per_seconds": lim.rate[1]},
            "running": lim.running, "waiting": lim.waiting}


def limits(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        found = store.limits()
    if args.json:
        render.print_json([_row(lim) for lim in found])
    elif not found:
        print("no limits: none declared (fsjobstore limit), and no concurrency key has jobs waiting")
    else:
        for lim in found:
            cap = "-" if lim.concurrency is None else str(lim.concurrency)
            print(f"{lim.kind} {_name(lim)}  concurrency {cap}  rate {_rate(lim)}  running {lim.running}  "
                  f"waiting {lim.waiting}")
    return OK


def _name(lim: Limit) -> str:
    """The name as the shell would take it back (``key 'user 42'``): the table's columns are
    split by spaces, and a key may hold any."""
    return shlex.quote(lim.name)


def _rate(lim: Limit) -> str:
    if lim.rate is None:
        return "-"
    n, per = lim.rate
    units = {86400.0: "d", 3600.0: "h", 60.0: "m", 1.0: "s"}
    return f"{n}/{units[per]}" if per in units else f"{n}/{per:g}s"


def limit(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if args.clear:
            if args.concurrency is not None or args.rate is not None:
                raise UsageError("--clear takes no --concurrency or --rate")
            found = store.clear_limit(key=args.key, queue=args.queue)
            what = f"key {args.key}" if args.key is not None else f"queue {args.queue}"
            print(f"limit of {what} cleared" if found else f"{what} had no limit declared")
            return OK
        if args.concurrency is None and args.rate is None:
            raise UsageError("give --concurrency N, --rate N/PER or both (or --clear)")
        lim = store.set_limit(key=args.key, queue=args.queue, concurrency=args.concurrency, rate=args.rate)
    cap = "no cap" if lim.concurrency is None else f"at most {lim.concurrency} at once"
    print(f"{lim.kind} {_name(lim)}: {cap}, rate {_rate(lim)}")
    return OK
