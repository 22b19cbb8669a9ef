"""Fan-out by interest (issue 22, part 3): patterns over queue names (scope any) and persisted
subscriptions that each get their own copy of a job (scope all)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsjobstore import InvalidRequest, JobState, JobStore, Worker


def test_a_pattern_takes_jobs_of_every_queue_it_matches_one_puller_each(store: JobStore) -> None:
    eu = store.create(1, queue="order-eu").id
    us = store.create(2, queue="order-us", priority=-1).id
    store.create(3, queue="invoice")
    got = [store.pull_work(queues="order-*"), store.pull_work(queues=["order-*"])]
    assert [lease.id for lease in got if lease] == [us, eu]  # in run order across the matches
    assert store.pull_work(queues="order-*") is None
    # Names first as given, then what a pattern adds: a list can mix them.
    late = store.create(4, queue="order-asia").id
    first = store.create(5, queue="invoice").id
    lease = store.pull_work(queues=["invoice", "order-?sia"])
    assert lease is not None and lease.queue == "invoice"
    lease = store.pull_work(queues=["invoice", "order-?sia"])
    assert lease is not None and lease.id in (late, first)


def test_a_worker_handler_may_be_a_pattern(store: JobStore) -> None:
    seen: list[tuple[str, int]] = []
    worker = Worker(store, mode="threads")

    @worker.handler("img-*")
    def resize(job: object) -> str:
        seen.append((job.queue, job.request))  # type: ignore[attr-defined]
        return "ok"

    @worker.handler("img-raw")
    def raw(job: object) -> str:  # an exact name wins over a pattern
        seen.append(("raw", job.request))  # type: ignore[attr-defined]
        return "raw"

    for q, n in (("img-png", 1), ("img-raw", 2), ("img-jpg", 3), ("other", 4)):
        store.create(n, queue=q)
    summary = worker.run(burst=True)
    assert summary.fulfilled == 3
    assert sorted(seen) == [("img-jpg", 3), ("img-png", 1), ("raw", 2)]
    assert store.statistics().pending_by_queue.get("other") == 1


def test_every_subscription_gets_its_own_copy_even_while_nothing_works_on_it(store: JobStore) -> None:
    store.subscribe("emails", "order-*")
    store.subscribe("analytics", "order-*")
    store.subscribe("audit", "*-eu")
    job = store.create({"order": 7}, queue="order-eu")
    group = store.get_group(job.group or "")
    assert sorted((j.queue, j.topic) for j in group.jobs) == [
        ("analytics", "order-eu"), ("audit", "order-eu"), ("emails", "order-eu")]
    assert job.id == group.jobs[0].id and job.queue == "analytics"  # the first copy, by subscription name
    assert store.statistics().pending_by_queue.get("order-eu", 0) == 0  # no job in the queue it named
    plain = store.create({"n": 1}, queue="invoice")  # no subscription matches: a job as ever
    assert plain.group is None and plain.topic is None
    # Each copy has its own lease, attempts and result.
    lease = store.pull_work(queues="emails")
    assert lease is not None and lease.request == {"order": 7}
    lease.fail("smtp down", retry=False)
    lease = store.pull_work(queues="analytics")
    assert lease is not None
    lease.fulfill("counted")
    states = {j.queue: j.state for j in store.get_group(job.group or "").jobs}
    assert states == {"emails": JobState.FAILED, "analytics": JobState.FULFILLED, "audit": JobState.PENDING}
    assert {s.name for s in store.subscriptions()} == {"emails", "analytics", "audit"}
    assert store.unsubscribe("audit") is True and store.unsubscribe("audit") is False
    again = store.create({"order": 8}, queue="order-eu")
    assert sorted(j.queue for j in store.get_group(again.group or "").jobs) == ["analytics", "emails"]


SUBSCRIBER = """
import json, sys
from fsjobstore import JobStore, Worker
store = JobStore(sys.argv[1])
worker = Worker(store, {"emails": lambda job: {"mailed": job.request, "topic": job.topic}}, mode="threads")
print(json.dumps(worker.run(burst=True).fulfilled), flush=True)
"""


def test_a_subscriber_down_when_a_job_is_made_gets_its_copy_when_it_starts(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as producer:
        producer.subscribe("emails", "order-*")
        made = [producer.create({"order": i}, queue="order-eu").id for i in range(3)]
    out = subprocess.run([sys.executable, "-c", SUBSCRIBER, root], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == 3
    with JobStore(root) as s:
        assert [s.get(j).value for j in made] == [{"mailed": {"order": i}, "topic": "order-eu"} for i in range(3)]


MAKER = """
import sys
from fsjobstore import JobStore
store = JobStore(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
store.create({"big": "x" * 200}, queue="topic")
print("made", flush=True)
"""


def test_sigkill_while_fanning_out_leaves_every_copy_or_none(root: str) -> None:
    with JobStore(root) as s:
        for i in range(40):
            s.subscribe(f"sub-{i:02d}", "topic")
    outcomes = set()
    for delay in (0.0, 0.005, 0.02, 0.05):
        proc = subprocess.Popen([sys.executable, "-c", MAKER, root], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with JobStore(root) as s:
            s.recover()
            counts = s.statistics().pending_by_queue
            made = {counts.get(f"sub-{i:02d}", 0) for i in range(40)}
            assert len(made) == 1, counts  # every subscription has as many copies as the others
            outcomes.add(made.pop())
            s.purge(states="pending")
    assert outcomes, outcomes


@pytest.mark.parametrize(("name", "pattern", "says"), [
    ("emails", "order-[", "not a pattern"),
    ("emails", "order.*", "not a pattern"),
    ("bad name", "order-*", "queue"),
    ("emails", "", "queue"),
])
def test_a_bad_subscription_is_refused(store: JobStore, name: str, pattern: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        store.subscribe(name, pattern)
    assert store.subscriptions() == []


def test_a_subscription_that_can_get_nothing_or_takes_a_queue_from_another_is_warned_of(
        store: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    store.subscribe("audit", "order-*")
    assert not caplog.records
    store.subscribe("s3", "aud*")  # audit's queue: its copies are never copied again
    store.subscribe("order-z", "order-*")  # audit got order-z's jobs; now order-z keeps them
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == ["subscription s3: its pattern aud* matches the queue of subscription audit, whose jobs are "
                    "never copied; it gets nothing from there",
                    "subscription order-z: jobs created into queue order-z were copied to audit; as a "
                    "subscription's own queue, they now stay in it"]
    made = store.create({"o": 1}, queue="order-z")
    assert made.queue == "order-z" and made.topic is None  # as the second warning says
    assert store.pull_work(queues="audit") is None
    caplog.clear()
    store.subscribe("audit", "invoice-*")  # a pattern replaced: audit's queue was a subscription's already
    assert not caplog.records

def test_a_fanned_out_queue_refuses_a_chosen_id_or_unique_key(store: JobStore) -> None:
    store.subscribe("emails", "order-*")
    with pytest.raises(InvalidRequest, match="fanned out"):
        store.create(1, queue="order-eu", job_id="mine")
    with pytest.raises(InvalidRequest, match="fanned out"):
        store.create(1, queue="order-eu", unique_key="k")
    with pytest.raises(InvalidRequest, match="not a pattern"):
        store.pull_work(queues="order-[")
    assert store.statistics().pending == 0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True, timeout=60)


def test_the_cli_subscribes_lists_and_fans_out(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    missing = _cli("subscribe", root, "emails", "order-*")  # a mistyped DIR makes no store
    assert missing.returncode == 3 and not os.path.exists(root), missing.stderr
    assert _cli("init", root).returncode == 0
    assert _cli("subscribe", root, "emails", "order-*").returncode == 0
    made = _cli("create", root, '{"o": 1}', "--queue", "order-eu", "--json")
    assert made.returncode == 0, made.stderr
    job = json.loads(made.stdout)
    assert (job["queue"], job["topic"]) == ("emails", "order-eu")
    assert made.stderr == f"queue order-eu fans out: 1 copy, in queue emails (group {job['group']}); the id " \
                          "printed is the first's\n"
    assert _cli("create", root, '{"o": 2}', "--queue", "plain").stderr == ""  # no fan-out, nothing said
    listed = json.loads(_cli("subscriptions", root, "--json").stdout)
    assert [(s["name"], s["pattern"]) for s in listed] == [("emails", "order-*")]
    replaced = _cli("subscribe", root, "emails", "invoice-*")
    assert "(it replaces order-*)" in replaced.stdout
    assert "order-*" in _cli("subscribe", root, "emails", "order-*").stdout
    bad = _cli("subscribe", root, "emails", "order-[")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert _cli("subscribe", root, "audit", "order-*").returncode == 0
    both = _cli("create", root, '{"o": 3}', "--queue", "order-us", "--notify", '{"hook": 1}')
    with JobStore(root) as store:  # every copy waits to deliver its own result, not only the first
        first = store.get(both.stdout.strip())
        assert first.group is not None
        assert [(c.queue, c.waiting) for c in store.get_group(first.group).jobs] == [
            ("audit", ({"hook": 1},)), ("emails", ({"hook": 1},))]
    assert "unsubscribed" in _cli("unsubscribe", root, "emails").stdout


def _notified(store: JobStore, queue: str, target: str) -> str:
    """A job of ``queue`` fulfilled with ``target`` waiting for its result; its id."""
    job = store.create(queue, queue=queue)
    store.queue(job.id, target)
    lease = store.pull_work(queues=queue)
    assert lease is not None
    lease.fulfill(queue)
    return job.id


def test_a_notifier_can_take_only_the_results_of_queues_a_pattern_matches(store: JobStore) -> None:
    mail_eu = _notified(store, "mail-eu", "a")
    sms = _notified(store, "sms", "b")
    mail_us = _notified(store, "mail-us", "c")
    assert store.pull_notification(queues="push-*") is None
    got = []
    for _ in range(2):
        note = store.pull_notification(queues=["mail-*"])
        assert note is not None
        got.append(note.id)
        note.done(note.waiting)
    assert sorted(got) == sorted([mail_eu, mail_us])
    assert store.pull_notification(queues="mail-*") is None
    note = store.pull_notification(queues="sms")  # a plain name, as pull_work takes it
    assert note is not None and (note.id, note.queue, note.topic) == (sms, "sms", None)
    note.release()
    note = store.pull_notification()  # no queues: every queue
    assert note is not None and note.id == sms
    with pytest.raises(InvalidRequest, match="pattern over queue names"):
        store.pull_notification(queues="mail-[")


def test_a_notify_entry_names_its_queue_and_keeps_it_through_a_backoff(store: JobStore) -> None:
    job_id = _notified(store, "mail-eu", "a")
    entry = os.path.join(store.path, "jobs", "notify", f"{job_id}.json")
    with open(entry) as f:
        assert json.load(f)["queue"] == "mail-eu"
    note = store.pull_notification(queues="mail-*")
    assert note is not None
    note.done([], error="smtp down")  # rewritten with a backoff
    with open(entry) as f:
        doc = json.load(f)
    assert (doc["queue"], doc["attempts"], doc["error"]) == ("mail-eu", 1, "smtp down")


def test_a_notify_entry_written_without_a_queue_is_filtered_by_the_jobs_own(store: JobStore) -> None:
    # As a library from before entries named their queue wrote it: the notifier reads the job.
    job_id = _notified(store, "mail-eu", "a")
    entry = os.path.join(store.path, "jobs", "notify", f"{job_id}.json")
    with open(entry, "w") as f:
        json.dump({"id": job_id, "not_before": 0.0, "attempts": 0, "error": None}, f)
    assert store.pull_notification(queues="sms") is None
    note = store.pull_notification(queues="mail-?u")
    assert note is not None and note.id == job_id


def test_a_deliverer_and_the_cli_notifier_serve_only_the_queues_they_name(tmp_path: Path) -> None:
    from fsjobstore.worker import Deliverer

    root = str(tmp_path / "s")
    with JobStore(root) as store:
        mail = _notified(store, "mail-eu", "a")
        sms = _notified(store, "sms", "b")
        seen: list[str] = []
        with pytest.raises(InvalidRequest, match="pattern over queue names"):
            Deliverer(store, lambda target, note: None, queues=["mail-["])  # refused at once, not at a pull
        assert Deliverer(store, lambda target, note: seen.append(note.id), queues="mail-*").run(burst=True) == (1, 0)
        assert seen == [mail]
    out = tmp_path / "delivered.txt"
    (tmp_path / "deliver_to_file.py").write_text(
        "def deliver(target, note):\n"
        f"    open({str(out)!r}, 'a').write(note.id + '\\n')\n")
    done = subprocess.run([sys.executable, "-m", "fsjobstore", "notify", root, "--handler", "deliver_to_file:deliver",
                           "--queue", "s?s", "--burst"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.read_text().split() == [sms]
    bad = _cli("notify", root, "--handler", "json:dumps", "--queue", "sms/x", "--burst")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--queue 'sms/x'" in bad.stderr
    with JobStore(root) as store:
        _notified(store, "mail-us", "c")
    typo = subprocess.run([sys.executable, "-m", "fsjobstore", "notify", root, "--handler", "deliver_to_file:deliver",
                           "--queue", "mial-*", "--burst"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert typo.returncode == 0 and "delivered 0" in typo.stderr, typo
    assert "no notification of queue(s) mial-* was due; 1 notification(s) wait" in typo.stderr, typo.stderr


def test_a_copys_notification_belongs_to_its_subscriptions_queue_not_its_topic(store: JobStore) -> None:
    store.subscribe("emails", "order-*")
    copy = store.create({"o": 1}, queue="order-eu")
    store.queue(copy.id, "ops@example.com")
    lease = store.pull_work(queues="emails")
    assert lease is not None
    lease.fulfill(1)
    assert store.pull_notification(queues="order-*") is None
    note = store.pull_notification(queues="email?")
    assert note is not None and (note.id, note.queue, note.topic) == (copy.id, "emails", "order-eu")
