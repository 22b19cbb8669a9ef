"""Property test: random operation sequences against a plain in-memory model of the store.

Besides the API calls, the machine can make the worker hang past its lease (a rescuer with an
injected monotonic clock sees its heartbeat frozen and takes its jobs), or crash (its flock is
released as by process death, and a fresh worker takes its place), and run recovery.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from conftest import FakeWall, die
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from internals import no_background, owner, owner_or_none, rescan

from fsjobstore import JobState, JobStore, LeaseLost, StoreClosed, WorkLease

BACKOFF = 10.0
LEASE = 3600.0  # heartbeats every 900 s of real time: none happen during an example
TARGETS = st.sampled_from(["a", "b", {"url": "c"}])


@dataclass
class Model:
    state: str
    priority: int
    order: int  # creation order; FIFO within a priority
    max_attempts: int
    due: float = 0.0
    attempts: int = 0
    value: str | bytes | None = None
    targets: list[Any] = field(default_factory=list)
    notify_due: float = 0.0


def key(target: Any) -> str:
    return repr(target)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.wall = FakeWall()
        self.clock = FakeWall(1000.0)  # the rescuer's monotonic clock
        self.store = self._worker()
        self.rescuer = JobStore(self.dir + "/s", durable=False, wall_clock=self.wall, backoff=lambda n: BACKOFF,
                                watch=False, poll_interval=3600.0, lease_duration=LEASE, clock=self.clock)
        self.jobs: dict[str, Model] = {}
        self.leases: dict[str, WorkLease] = {}
        self.stale: list[WorkLease] = []  # leases that were taken over: committing must fail
        self.created = 0

    def _worker(self) -> JobStore:
        store = JobStore(self.dir + "/s", durable=False, wall_clock=self.wall, backoff=lambda n: BACKOFF,
                         watch=False, poll_interval=3600.0, lease_duration=LEASE)
        # No heartbeat thread: its background recovery would take a crashed worker's jobs at a
        # moment of the thread's choosing; here recovery runs when the machine says so.
        no_background(store)
        return store

    def teardown(self) -> None:
        self.store.close()
        self.rescuer.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _taken_over(self, job_id: str) -> None:
        """Recovery returns a lost claim: one attempt spent, then pending or (no attempts left) failed."""
        m = self.jobs[job_id]
        m.attempts += 1
        if m.attempts >= m.max_attempts:
            self._final(job_id, "failed")
        else:
            m.state = "pending"

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
            m.value = f"v{m.order}"
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
        self.store.fulfill(job_id, b"by id")  # work done elsewhere: not an attempt
        self.jobs[job_id].value = b"by id"
        self._final(job_id, "fulfilled")

    @precondition(lambda self: self.leases)
    @rule()
    def hang_past_the_lease(self) -> None:
        self.recover()  # first sight of the worker's heartbeat (and a crashed worker's jobs go)
        self.clock.advance(LEASE + 1)
        report = self.rescuer.recover()  # the beat has not changed for a whole lease: expired
        assert report.requeued + report.failed == len(self.leases)
        for job_id, lease in sorted(self.leases.items()):
            self._taken_over(job_id)
            self.stale.append(lease)
        self.leases.clear()
        owner(self.store).beat()  # the worker wakes up: its heartbeat moves again
        self._rescued()

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def late_commit_is_refused(self, data: st.DataObject) -> None:
        lease = self.stale.pop(data.draw(st.integers(0, len(self.stale) - 1)))
        try:
            lease.fulfill(b"late")
        except (LeaseLost, StoreClosed):
            pass
        else:
            raise AssertionError(f"a lease taken over committed: {lease}")

    @rule()
    def crash_worker(self) -> None:
        if owner_or_none(self.store) is None:  # never became an owner: nothing of it to die
            self.store.close()
        else:
            die(self.store)
        for job_id in self.leases:
            self.jobs[job_id].state = "orphaned"
        self.leases.clear()
        self.store = self._worker()

    @rule()
    def recover(self) -> None:
        report = self.rescuer.recover()
        orphans = sorted(i for i, m in self.jobs.items() if m.state == "orphaned")
        assert report.requeued + report.failed == len(orphans)
        for job_id in orphans:
            self._taken_over(job_id)
        self._rescued()

    def _rescued(self) -> None:
        """The rescuer requeued jobs the worker's own index has not seen: a watching worker
        hears of them through inotify, a polling one at its next rescan. This machine runs
        without a watcher, so it tells the worker to rescan, as either would."""
        rescan(self.store)

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
        active = count["active"] + sum(1 for m in self.jobs.values() if m.state == "orphaned")
        assert (stats.active, stats.fulfilled, stats.failed) == (active, count["fulfilled"], count["failed"])

    @invariant()
    def every_job_reads_back_as_modelled(self) -> None:
        for job_id, m in self.jobs.items():
            got = self.store.get(job_id)
            state = got.state.value
            if state == JobState.SCHEDULED.value and m.state == "pending":
                state = "pending"
            modelled = "active" if m.state == "orphaned" else m.state
            assert state == modelled or (m.state == "scheduled" and state == "pending")
            begun = m.attempts + (modelled == "active")  # Job.attempts includes the running one
            assert got.attempts == begun and got.value == m.value
            assert sorted(map(key, got.waiting)) == sorted(map(key, m.targets))


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
