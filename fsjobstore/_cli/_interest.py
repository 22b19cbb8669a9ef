"""Fan-out from the shell: ``subscribe`` (a subscription gets its own copy of every job created into
the queues its pattern matches), ``unsubscribe`` and ``subscriptions``."""

from __future__ import annotations

import argparse
from typing import Any

from . import _render as render
from ._args import OK, open_store, subcommand


def add(subparsers: Any) -> None:
    subcommand(subparsers, "subscribe", subscribe, positionals=("NAME", "PATTERN"),
               help="give a subscription its own copy of every job created into the queues a pattern matches",
               example="fsjobstore subscribe ./jobs emails 'order-*'",
               description="From now on, every job created into a queue PATTERN matches (a name, or a glob: "
                           "order-*, order-??, order-[ab]*) becomes one copy per subscription, each in the queue "
                           "named as its subscription: run a worker on NAME to work it. Copies wait for it while "
                           "no worker runs. Subscribing NAME again replaces its pattern.")
    subcommand(subparsers, "unsubscribe", unsubscribe, positionals=("NAME",),
               help="stop making copies for a subscription (copies already made stay in its queue)",
               example="fsjobstore unsubscribe ./jobs emails")
    subcommand(subparsers, "subscriptions", subscriptions, reads=True,
               help="list the subscriptions of a store", example="fsjobstore subscriptions ./jobs --json")


def subscribe(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        before = {s.name: s.pattern for s in store.subscriptions()}.get(args.name)
        sub = store.subscribe(args.name, args.pattern)
    print(f"subscription {sub.name}: a copy of every job created into a queue matching {sub.pattern}, "
          f"in queue {sub.name}" + (f" (it replaces {before})" if before not in (None, sub.pattern) else ""))
    return OK


def unsubscribe(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        found = store.unsubscribe(args.name)
    print(f"unsubscribed {args.name}" if found else f"{args.name} was not subscribed")
    return OK


def subscriptions(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        found = store.subscriptions()
    if args.json:
        render.print_json([{"name": s.name, "pattern": s.pattern, "since": s.since} for s in found])
    elif not found:
        print("no subscriptions (fsjobstore subscribe DIR NAME PATTERN)")
    else:
        for s in found:
            print(f"{s.name}  {s.pattern}  since {render.when(s.since)}")
    return OK
