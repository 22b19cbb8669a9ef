"""How many of the package's modules a plain job's steps pass through.

    python bench/steps.py            # the table
    python bench/steps.py --json     # the same as JSON
    python bench/steps.py --calls    # each step's calls from one module into another, in order

A plain job has no key, limit, parent, subscription or schedule. The store is warmed up first
(one plain job's whole life), so what is measured is the steady path, not first-use setup. Each
step is traced on the calling thread only (``sys.setprofile``): every Python call whose code lives
in the package is attributed to its module. Printed per step:

- ``modules``: distinct modules of the package entered;
- ``crossings``: calls from one module of the package into another;
- ``returns``: calls into a module the step had already entered before and left (a path that goes
  back and forth, rather than down).

The house's goal is at most ``LIMIT`` modules a step (docs/explanation/architecture.md); ``--json`` output
feeds the run records (PERFORMANCE.md). ``tests/test_bench.py`` checks the tracer itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fsjobstore
from fsjobstore import JobStore

PACKAGE = os.path.dirname(os.path.abspath(fsjobstore.__file__))
LIMIT = 10


@dataclass
class Trace:
    """The package's calls made on one thread during one step."""

    modules: list[str] = field(default_factory=list)  # in order of first entry
    crossings: list[tuple[str, str, str]] = field(default_factory=list)  # (from, into, the function called)
    returns: int = 0

    def summary(self) -> dict[str, Any]:
        return {"modules": len(self.modules), "crossings": len(self.crossings), "returns": self.returns,
                "names": self.modules}


def _module_of(filename: str) -> str | None:
    if not filename.startswith(PACKAGE + os.sep):
        return None
    rel = os.path.relpath(filename, PACKAGE)[: -len(".py")]
    return rel.replace(os.sep, ".")


def trace(step: Callable[[], Any]) -> Trace:
    """Run ``step`` and record which modules of the package its calls entered."""
    out = Trace()
    stack: list[str | None] = []
    left: set[str] = set()  # modules entered and then left for another

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            here = _module_of(frame.f_code.co_filename)
            caller = next((m for m in reversed(stack) if m is not None), None)
            stack.append(here)
            if here is None or here == caller:
                return
            if here not in out.modules:
                out.modules.append(here)
            elif here in left:
                out.returns += 1
            if caller is not None:
                out.crossings.append((caller, here, frame.f_code.co_qualname))
                left.add(caller)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return out


def measure(root: str) -> dict[str, Trace]:
    """The five steps of a plain job's life, each traced on a warmed-up store."""
    with JobStore(root, durable=False) as store:
        def life() -> None:
            job = store.create({"n": 1})
            store.queue(job.id, "t")
            lease = store.pull_work(timeout=0)
            assert lease is not None
            lease.fulfill("v")
            note = store.pull_notification(timeout=0)
            assert note is not None
            note.done(note.waiting)

        life()
        life()
        steps: dict[str, Trace] = {}
        jobs: list[Any] = []
        steps["create"] = trace(lambda: jobs.append(store.create({"n": 2})))
        leases: list[Any] = []
        steps["pull_work"] = trace(lambda: leases.append(store.pull_work(timeout=0)))
        assert leases[0] is not None and leases[0].id == jobs[0].id
        steps["lease.fulfill"] = trace(lambda: leases[0].fulfill("v"))
        job = store.create({"n": 3})
        notes: list[Any] = []
        # queue + pull_notification: a target queued on a final job, then its notification leased.
        lease = store.pull_work(timeout=0)
        assert lease is not None and lease.id == job.id
        lease.fulfill("v")

        def queue_then_pull_notification() -> None:
            store.queue(job.id, "t")
            notes.append(store.pull_notification(timeout=0))

        steps["queue+pull_notification"] = trace(queue_then_pull_notification)
        assert notes[-1] is not None
        steps["done"] = trace(lambda: notes[-1].done(notes[-1].waiting))
        return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--calls", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base:
        steps = measure(os.path.join(base, "store"))
    if args.json:
        print(json.dumps({name: t.summary() for name, t in steps.items()}, indent=2))
        return
    print(f"{'step':<26}{'modules':>8}{'crossings':>10}{'returns':>8}")
    for name, t in steps.items():
        print(f"{name:<26}{len(t.modules):>8}{len(t.crossings):>10}{t.returns:>8}   {' '.join(t.modules)}")
        if args.calls:
            for a, b, function in t.crossings:
                print(f"      {a} -> {b}.{function}")


if __name__ == "__main__":
    main()
