"""Property test: random operation sequences against a plain in-memory model of the store."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from conftest import FakeWall
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fsjobstore import JobState, JobStore, WorkLease

BACKOFF = 10.0
TARGETS = st.sampled_from(["a", "b", {"url": "c"}])


@dataclass
class Model:
    state: str
    priority: int
    order: int  # creation order; FIFO within a priority
    max_attempts: int
    due: float = 0.0
    attempts: int = 0
    value: bytes | None = None
    targets: list[Any] = field(default_factory=list)
    notify_due: float = 0.0


def key(target: Any) -> str:
    return repr(target)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.wall = FakeWall()
        self.store = JobStore(self.dir + "/s", durable=False, wall_clock=self.wall, backoff=lambda n: BACKOFF,
                              watch=False, poll_interval=3600.0)
        self.jobs: dict[str, Model] = {}
        self.leases: dict[str, WorkLease] = {}
        self.created = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _promote(self) -> None:
        for m in self.jobs.values():
            if m.state == "scheduled" and m.due <= self.wall.now:
                m.state = "pending"

    def _final(self, job_id: str, state: str) -> None:
        m = self.jobs[job_id]
        m.state = state
        m.notify_due = self.wall.now

    @rule(priority=st.integers(-2, 2), max_attempts=st.integers(1, 3), delay=st.sampled_from([None, 5.0]))
    def create(self, priority: int, max_attempts: int, delay: float | None) -> None:
        job = self.store.create(self.created, priority=priority, max_attempts=max_attempts, delay=delay,
                                job_id=f"job{self.created:04d}")  # deterministic ids keep draws replayable
        state = "scheduled" if delay else "pending"
        self.jobs[job.id] = Model(state, priority, self.created, max_attempts, due=self.wall.now + (delay or 0))
        self.created += 1
        assert job.state.value == state

    @rule()
    def pull(self) -> None:
        self._promote()
        due = [(m.priority, m.order, i) for i, m in self.jobs.items() if m.state == "pending"]
        lease = self.store.pull_work()
        if not due:
            assert lease is None
            return
        expected = min(due)[2]
        assert lease is not None and lease.id == expected
        assert lease.attempt == self.jobs[expected].attempts + 1
        self.jobs[expected].state = "active"
        self.leases[expected] = lease

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), outcome=st.sampled_from(["fulfill", "fail", "fail-final", "release"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.leases)))
        lease, m = self.leases.pop(job_id), self.jobs[job_id]
        if outcome == "fulfill":
            lease.fulfill(f"v{m.order}")
            m.attempts += 1
            m.value = f"v{m.order}".encode()
            self._final(job_id, "fulfilled")
        elif outcome == "release":
            lease.release()
            m.state = "pending"
        else:
            lease.fail("no", retry=outcome == "fail")
            m.attempts += 1
            if outcome == "fail" and m.attempts < m.max_attempts:
                m.state, m.due = "scheduled", self.wall.now + BACKOFF
            else:
                self._final(job_id, "failed")

    @precondition(lambda self: any(m.state in ("pending", "scheduled") for m in self.jobs.values()))
    @rule(data=st.data())
    def fulfill_by_id(self, data: st.DataObject) -> None:
        waiting = sorted(i for i, m in self.jobs.items() if m.state in ("pending", "scheduled"))
        job_id = data.draw(st.sampled_from(waiting))
        self.store.fulfill(job_id, b"by id")
        self.jobs[job_id].attempts += 1
        self.jobs[job_id].value = b"by id"
        self._final(job_id, "fulfilled")

    @rule(seconds=st.sampled_from([1.0, 6.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.wall.advance(seconds)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), tgt=TARGETS)
    def queue(self, data: st.DataObject, tgt: Any) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        self.store.queue(job_id, tgt)
        m = self.jobs[job_id]
        if key(tgt) not in map(key, m.targets):
            m.targets.append(tgt)
        if m.state in ("fulfilled", "failed"):
            m.notify_due = self.wall.now

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), tgt=TARGETS)
    def unqueue(self, data: st.DataObject, tgt: Any) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        m = self.jobs[job_id]
        was = key(tgt) in map(key, m.targets)
        assert self.store.unqueue(job_id, tgt) is was
        m.targets = [t for t in m.targets if key(t) != key(tgt)]

    @rule(data=st.data())
    def notify(self, data: st.DataObject) -> None:
        eligible = {i for i, m in self.jobs.items()
                    if m.state in ("fulfilled", "failed") and m.targets and m.notify_due <= self.wall.now}
        note = self.store.pull_notification()
        if not eligible:
            assert note is None
            return
        assert note is not None and note.id in eligible
        m = self.jobs[note.id]
        assert sorted(map(key, note.waiting)) == sorted(map(key, m.targets))
        assert note.state.value == m.state and note.value == m.value
        delivered = data.draw(st.lists(st.sampled_from(list(note.waiting)), unique_by=key))
        note.done(delivered)
        m.targets = [t for t in m.targets if key(t) not in map(key, delivered)]
        if m.targets:
            m.notify_due = self.wall.now + BACKOFF

    @invariant()
    def states_and_counts_agree(self) -> None:
        stats = self.store.statistics()
        count = {s: sum(1 for m in self.jobs.values() if m.state == s) for s in
                 ("pending", "scheduled", "active", "fulfilled", "failed")}
        # Promotion happens when someone pulls, so a due job may still sit in scheduled.
        assert stats.pending + stats.scheduled == count["pending"] + count["scheduled"]
        assert (stats.active, stats.fulfilled, stats.failed) == (count["active"], count["fulfilled"], count["failed"])

    @invariant()
    def every_job_reads_back_as_modelled(self) -> None:
        for job_id, m in self.jobs.items():
            got = self.store.get(job_id)
            state = got.state.value
            if state == JobState.SCHEDULED.value and m.state == "pending":
                state = "pending"
            assert state == m.state or (m.state == "scheduled" and state == "pending")
            assert got.attempts == m.attempts and got.value == m.value
            assert sorted(map(key, got.waiting)) == sorted(map(key, m.targets))


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
