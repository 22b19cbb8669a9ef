"""What the store accepts from a caller is bounded: JSON nested at most ``MAX_NESTING`` deep
(requests, values, targets, worker info), at most ``MAX_TARGETS`` targets a job, and a purge's
``match`` run by RE2 (linear time), through the store and through the JSON API alike."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from webkit import CheckedClient, web_app

from fsjobstore import MAX_NESTING, MAX_TARGETS, InvalidRequest, JobStore
from fsjobstore._format import _values as _codec


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.fixture
def api(store: JobStore) -> Iterator[CheckedClient]:
    with web_app(store) as client:
        yield client


# -- nesting -----------------------------------------------------------------------------------------
def test_nesting_counts_arrays_and_objects_and_a_scalar_is_zero() -> None:
    assert _codec.nesting(5) == 0 and _codec.nesting([1]) == 1 and _codec.nesting({}) == 1
    assert _codec.nesting(nested(200)) == 200 and _codec.nesting([[], [[[]]], {"a": [1]}]) == 4


def test_a_request_at_the_nesting_limit_is_stored_and_one_level_deeper_is_refused_naming_why(store: JobStore) -> None:
    assert store.create(nested(MAX_NESTING)).request == nested(MAX_NESTING)
    with pytest.raises(InvalidRequest, match=rf"request is nested {MAX_NESTING + 1} levels deep .*the limit is "
                                             rf"{MAX_NESTING}"):
        store.create(nested(MAX_NESTING + 1))
    with pytest.raises(InvalidRequest, match="request is nested 256 levels deep"):
        store.create(nested(256))
    assert [j.request for j in store.jobs()] == [nested(MAX_NESTING)]  # nothing else was stored


def test_a_string_full_of_brackets_is_not_nesting(store: JobStore) -> None:
    assert store.create({"s": "[{" * 500}).request == {"s": "[{" * 500}


def test_groups_fan_out_copies_and_ticks_refuse_a_request_nested_too_deeply(store: JobStore) -> None:
    with pytest.raises(InvalidRequest, match="request is nested"):
        store.create_group([{"request": 1}, {"request": nested(MAX_NESTING + 1)}])
    store.subscribe("copies", "topic-*")
    with pytest.raises(InvalidRequest, match="request is nested"):
        store.create(nested(MAX_NESTING + 1), queue="topic-a")
    with pytest.raises(InvalidRequest, match="request is nested"):
        store.make_tick("nightly", 1_800_000_000, nested(MAX_NESTING + 1))
    assert list(store.jobs()) == []


def test_a_result_nested_too_deeply_is_refused_and_the_job_stays_where_it_was(store: JobStore) -> None:
    job = store.create(1)
    lease = store.pull_work()
    assert lease is not None
    with pytest.raises(InvalidRequest, match="value is nested"):
        lease.fulfill(nested(MAX_NESTING + 1))
    lease.fulfill(nested(MAX_NESTING))
    other = store.create(2)
    with pytest.raises(InvalidRequest, match="value is nested"):
        store.fulfill(other.id, nested(MAX_NESTING + 1))
    assert store.get(job.id).value == nested(MAX_NESTING) and store.get(other.id).state == "pending"


def test_a_target_and_worker_info_nested_too_deeply_are_refused(store: JobStore) -> None:
    job = store.create(1)
    with pytest.raises(InvalidRequest, match="target is nested"):
        store.queue(job.id, nested(MAX_NESTING + 1))
    assert store.get(job.id).waiting == ()
    with pytest.raises(InvalidRequest, match="worker info is nested"):
        store.publish_worker({"x": nested(MAX_NESTING)})
    assert store.workers() == []


def test_a_job_stored_deeper_than_the_limit_is_still_read(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "MAX_NESTING", 200)  # a file from a writer with another limit
    job = store.create(nested(150))
    monkeypatch.undo()
    assert store.get(job.id).request == nested(150)
    assert [j.id for j in store.jobs()] == [job.id]


def test_the_api_refuses_a_request_nested_too_deeply_as_an_invalid_request(api: CheckedClient, store: JobStore) -> None:
    r = api.post("/api/jobs", json={"request": nested(256)})
    assert r.status_code == 422 and r.json()["error"] == "InvalidRequest"
    assert "nested 256 levels deep" in r.json()["message"]
    assert list(store.jobs()) == []


# -- targets -----------------------------------------------------------------------------------------
def test_a_job_takes_at_most_max_targets_and_queueing_one_of_them_again_still_works(store: JobStore) -> None:
    job = store.create(1)
    for i in range(MAX_TARGETS):
        store.queue(job.id, {"t": i})
    with pytest.raises(InvalidRequest, match=rf"has {MAX_TARGETS} targets waiting; the limit is {MAX_TARGETS}"):
        store.queue(job.id, {"t": "one more"})
    store.queue(job.id, {"t": 0})  # already queued: no effect, no error
    assert len(store.get(job.id).waiting) == MAX_TARGETS
    store.unqueue(job.id, {"t": 0})
    store.queue(job.id, {"t": "one more"})  # room again


def test_the_api_refuses_a_create_with_too_many_targets_before_making_the_job(api: CheckedClient,
                                                                               store: JobStore) -> None:
    r = api.post("/api/jobs", json={"request": 1, "notify": [{"t": i} for i in range(MAX_TARGETS + 1)]})
    assert 400 <= r.status_code < 500, r.text
    assert list(store.jobs()) == []
    made = api.post("/api/jobs", json={"request": 1, "notify": [{"t": i} for i in range(3)]})
    assert made.status_code == 201 and len(made.json()["waiting"]) == 3


# -- purge's match -----------------------------------------------------------------------------------
CATASTROPHIC = "(a|a)*!"  # exponential in Python's re over a run of a's


def _answer_of(script: str, path: str) -> str:
    """What ``script`` prints, run in a process of its own on the store at ``path``: Python's re
    never lets go of the interpreter while it backtracks, so only another process can be given
    up on. 30 s is generous: the point is that it ends at all (a backtracking engine would not)."""
    try:
        done = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the purge did not end")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _failed_job_of_forty_as(store: JobStore) -> None:
    store.create({"s": "a" * 40})
    lease = store.pull_work()
    assert lease is not None
    lease.fail("boom", retry=False)


def test_a_catastrophic_pattern_over_a_request_of_forty_as_ends(store: JobStore) -> None:
    _failed_job_of_forty_as(store)
    script = ("import sys; from fsjobstore import JobStore\n"
              "with JobStore(sys.argv[1], create=False) as s:\n"
              f"    print(s.purge(states=['failed'], match={CATASTROPHIC!r}, dry_run=True))\n")
    assert _answer_of(script, store.path) == "0"
    assert store.purge(states="failed", match="a{40}") == 1 and list(store.jobs()) == []


def test_the_api_answers_a_catastrophic_purge_pattern(store: JobStore) -> None:
    _failed_job_of_forty_as(store)
    script = ("import sys, json; from fastapi.testclient import TestClient; from fsjobstore.web import create_app\n"
              "with TestClient(create_app(sys.argv[1])) as client:\n"
              "    r = client.post('/api/purge', json={'states': ['failed'], 'match': "
              f"{CATASTROPHIC!r}, 'dry_run': True}})\n"
              "    print(r.status_code, json.dumps(r.json(), sort_keys=True))\n")
    assert _answer_of(script, store.path) == '200 {"dry_run": true, "purged": 0}'


@pytest.mark.parametrize("pattern,why", [
    (r"(a)\1", "invalid escape sequence"),
    (r"(?=a)", "invalid perl operator"),
    ("(unclosed", "missing"),
])
def test_a_pattern_re2_refuses_is_an_invalid_request_saying_why(store: JobStore, pattern: str, why: str) -> None:
    with pytest.raises(InvalidRequest, match=rf"is not a pattern RE2 accepts: {why}.*no backreferences"):
        store.purge(states="pending", match=pattern)


def test_an_re_pattern_is_run_by_re2_with_its_flags(store: JobStore) -> None:
    store.create({"user": "Ann"}, job_id="x-1")
    store.create({"user": "bob"}, job_id="x-2")
    assert store.purge(states="pending", match=re.compile(r'"USER":"ANN"', re.IGNORECASE), dry_run=True) == 1
    assert store.purge(states="pending", match=re.compile(r"^x-\d$"), dry_run=True) == 2
    with pytest.raises(InvalidRequest, match="flags RE2 lacks"):
        store.purge(states="pending", match=re.compile(r"a  b", re.VERBOSE))
    with pytest.raises(InvalidRequest, match="is not a pattern RE2 accepts"):
        store.purge(states="pending", match=re.compile(r"(?<=a)b"))


def test_without_re2_a_purge_by_match_says_how_to_install_it(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "re2", None)  # import re2 now raises ImportError
    store.create(1)
    with pytest.raises(InvalidRequest, match=r'pip install "fsjobstore\[re2\]"'):
        store.purge(states="pending", match="x")
    assert store.purge(states="pending", dry_run=True) == 1  # without match, RE2 is not needed


def test_the_api_refuses_a_purge_pattern_re2_cannot_run_saying_why(api: CheckedClient) -> None:
    r = api.post("/api/purge", json={"states": ["failed"], "match": r"(a)\1", "dry_run": True})
    assert r.status_code == 422 and r.json()["error"] == "InvalidRequest"
    assert "not a pattern RE2 accepts" in r.json()["message"]
