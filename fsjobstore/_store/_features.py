"""What a store attaches to its transitions' named points when it opens (``_core._hooks``).

Every feature that relates jobs is registered here and nowhere else: reading this module tells
which feature listens where. The transitions call the points without knowing what is behind
them; a plain job meets only ``after_final``, ``removing``/``removed``, ``ended`` and the sweeps.
"""

from __future__ import annotations

from collections.abc import Callable

from .._core._core import Core
from .._core._counters import Counters
from .._core._hooks import Hooks, Sweep
from .._format._records import Record
from .._relations import _groups, _ticks
from .._relations._dependencies import Deps
from .._relations._limit_gate import Gate
from .._relations._limits import Declarations
from .._relations._unique_keys import UniqueKeys


def attach(core: Core, counters: Counters, cancel: Callable[[str, str], object]) -> tuple[Hooks, Gate]:
    """The hooks of one store, and its limits' gate (which the store also asks about limits).

    ``cancel(job_id, reason)`` is the store's cancel by id: a parent that did not end fulfilled
    cancels the jobs waiting for it, which is a transition of its own (``ById.cancel``)."""
    gate = Gate(core, Declarations(core.layout, core.clock), core.kick_waker)
    deps = Deps(core, cancel)

    def children_hear(job_id: str, record: Record | None) -> None:
        deps.resolve_children(job_id)  # a waiting job removed: its children hear it is gone

    def group_member_gone(job_id: str, record: Record | None) -> None:
        if record is not None and record.group is not None:
            _groups.forget_if_empty(core, record.group)  # its last member gone: the manifest goes too

    def tick_removed(job_id: str) -> None:
        _ticks.note_removed(core, job_id)  # recorded before the id is freed: the tick is never made twice

    def finish_groups(sweep: Sweep) -> int:
        return _groups.sweep(core, sweep.publish, sweep.gone, sweep.each)

    def resolve_children(sweep: Sweep) -> int:
        return deps.sweep(deep=sweep.deep, each=sweep.each)

    def promote_waiting(sweep: Sweep) -> int:
        return gate.sweep(sweep.each)

    hooks = Hooks(
        keys=UniqueKeys(core),
        parents=deps,
        gate=gate,
        after_final=(deps.resolve_children,),
        # Its children are resolved while it can still be read (a final job's children then run
        # or are cancelled as its state says); those of a job that never ended once it is gone.
        removing=(tick_removed, deps.resolve_children),
        removed=(group_member_gone, children_hear),
        ended=(counters.ended,),
        sweeps=(("creates_finished", finish_groups), ("children_resolved", resolve_children),
                ("waiting_promoted", promote_waiting)),
    )
    return hooks, gate
