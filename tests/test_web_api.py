"""The JSON API (``fsjobstore.web``): every endpoint and error, each answer checked against the
app's own ``/openapi.json`` (webkit.CheckedClient)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from webkit import CheckedClient, web_app

from fsjobstore import JobStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(str(tmp_path / "s"), backoff=lambda attempt: 0.0) as s:
        yield s


@pytest.fixture
def api(store: JobStore) -> Iterator[CheckedClient]:
    with web_app(store) as client:
        yield client


def _create(api: CheckedClient, **body: Any) -> dict[str, Any]:
    body.setdefault("request", {"n": 1})
    r = api.post("/api/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def test_create_get_and_list_jobs_a_page_at_a_time(api: CheckedClient, store: JobStore) -> None:
    made = [_create(api, request={"i": i}, queue="q") for i in range(7)]
    assert made[0]["state"] == "pending" and made[0]["request"] == {"i": 0}
    assert api.get(f"/api/jobs/{made[3]['id']}").json()["request"] == {"i": 3}
    seen, after = [], None
    while True:
        page = api.get("/api/jobs", params={"limit": 3, **({"after": after} if after else {})}).json()
        seen += [j["id"] for j in page["jobs"]]
        after = page["next"]
        if after is None:
            break
    assert seen == [j["id"] for j in made]
    scheduled = _create(api, queue="q", delay=3600)
    assert api.get("/api/jobs", params={"state": "scheduled"}).json()["jobs"][0]["id"] == scheduled["id"]
    assert api.get("/api/jobs", params={"queue": "other"}).json() == {"jobs": [], "next": None, "scanned": None}


def test_create_takes_every_option_and_queues_its_targets(api: CheckedClient, store: JobStore) -> None:
    job = _create(api, request="x", queue="mail", priority=-5, max_attempts=7, job_id="chosen-1", timeout=30,
                  retain="forever", notify=[{"hook": "a"}, {"hook": "b"}])
    assert (job["id"], job["priority"], job["max_attempts"], job["timeout"]) == ("chosen-1", -5, 7, 30.0)
    assert job["waiting"] == [{"hook": "a"}, {"hook": "b"}]
    later = _create(api, run_at=time.time() + 600)
    assert later["state"] == "scheduled"


def test_bad_input_is_422_naming_the_problem_and_changes_nothing(api: CheckedClient, store: JobStore) -> None:
    for body, named in (({"request": 1, "queue": "no.dots"}, "InvalidQueueName"),
                        ({"request": 1, "priority": "5"}, "InvalidRequest"),  # strict: a string is no number
                        ({"request": 1, "priority": 10**7}, "InvalidRequest"),
                        ({"request": 1, "retain": "later"}, "InvalidRequest"),
                        ({"request": 1, "surprise": True}, "InvalidRequest"),
                        ({"queue": "q"}, "InvalidRequest"),
                        ({"request": 1, "job_id": "../../etc"}, "InvalidJobId"),
                        ({"request": 1, "delay": -1}, "InvalidRequest")):
        r = api.post("/api/jobs", json=body)
        assert r.status_code == 422 and r.json()["error"] == named, (body, r.text)
        assert r.json()["message"]
    r = api.post("/api/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "InvalidRequest"
    assert store.statistics().pending == 0


def test_unknown_and_malformed_ids_are_404_and_422(api: CheckedClient) -> None:
    r = api.get("/api/jobs/no-such-job")
    assert r.status_code == 404 and r.json()["error"] == "JobNotFound"
    for bad in ("a.b", "x" * 200, "-x"):
        r = api.get(f"/api/jobs/{bad}")
        assert r.status_code == 422 and r.json()["error"] == "InvalidJobId", (bad, r.text)
    for bad in ("..", "%2e%2e", "%2e%2e%2f%2e%2e%2ffsjobstore.json", "..%2f..%2ffsjobstore.json"):
        r = api.client.get(f"/api/jobs/{bad}")  # never the store's files, whatever the router makes of it
        assert r.status_code in (404, 422), (bad, r.status_code)
        assert '"format"' not in r.text and "durable" not in r.text


def test_an_id_used_twice_is_409_job_exists(api: CheckedClient) -> None:
    _create(api, job_id="once")
    r = api.post("/api/jobs", json={"request": 2, "job_id": "once"})
    assert r.status_code == 409 and r.json()["error"] == "JobExists"


def test_cancel_retry_and_fulfil_by_id_and_their_wrong_states(api: CheckedClient, store: JobStore) -> None:
    job = _create(api)
    r = api.post(f"/api/jobs/{job['id']}/cancel", json={"reason": "not needed"})
    assert r.json()["state"] == "cancelled" and "not needed" in r.json()["error"]
    again = api.post(f"/api/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"] == "InvalidState"
    assert api.post(f"/api/jobs/{job['id']}/retry").json()["state"] == "pending"
    r = api.post(f"/api/jobs/{job['id']}/fulfill", json={"value": {"ok": True}})
    assert r.json()["state"] == "fulfilled" and r.json()["value"] == {"encoding": "json", "data": {"ok": True}}
    r = api.post(f"/api/jobs/{job['id']}/retry")
    assert r.status_code == 409 and r.json()["error"] == "InvalidState"
    assert api.post("/api/jobs/nope/retry").status_code == 404


def test_targets_are_queued_and_unqueued(api: CheckedClient) -> None:
    job = _create(api)
    assert api.post(f"/api/jobs/{job['id']}/queue", json={"target": {"url": "a"}}).json()["waiting"] == [{"url": "a"}]
    assert api.post(f"/api/jobs/{job['id']}/unqueue", json={"target": {"url": "a"}}).json() == {"removed": True}
    assert api.post(f"/api/jobs/{job['id']}/unqueue", json={"target": {"url": "a"}}).json() == {"removed": False}


def test_a_long_poll_answers_when_the_job_ends_or_408_when_it_does_not(api: CheckedClient, store: JobStore) -> None:
    job = _create(api)
    r = api.get(f"/api/jobs/{job['id']}/wait", params={"timeout": 0.2})
    assert r.status_code == 408 and r.json()["error"] == "WaitTimeout"

    def finish() -> None:
        time.sleep(0.3)
        store.fulfill(job["id"], "late")

    threading.Thread(target=finish).start()
    started = time.monotonic()
    r = api.get(f"/api/jobs/{job['id']}/wait", params={"timeout": 30})
    assert r.json()["state"] == "fulfilled" and time.monotonic() - started < 10
    assert api.get(f"/api/jobs/{job['id']}/wait", params={"timeout": 301}).status_code == 422


def test_server_sent_events_follow_a_job_until_it_is_final(api: CheckedClient, store: JobStore) -> None:
    job = _create(api)
    lease = store.pull_work()
    assert lease is not None

    def work() -> None:
        time.sleep(0.3)
        lease.progress(1, 2, "half")
        lease.log("a line")
        time.sleep(0.7)
        lease.fulfill("done")

    threading.Thread(target=work).start()
    events = []
    with api.client.stream("GET", f"/api/jobs/{job['id']}/events") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[0]["state"] == "active" and events[-1]["state"] == "fulfilled"
    assert any(e["progress"] and e["progress"]["message"] == "half" for e in events)
    assert any(e["logs"] and e["logs"][0]["line"] == "a line" for e in events)
    assert api.get("/api/jobs/nope/events").status_code == 404


def test_an_http_worker_leases_reports_and_commits_a_job(api: CheckedClient, store: JobStore) -> None:
    assert api.post("/api/queues/q/lease", params={"timeout": 0}).status_code == 204
    job = _create(api, queue="q")
    got = api.post("/api/queues/q/lease", params={"timeout": 5, "lease": 30})
    assert got.status_code == 200, got.text
    handle, token = got.json()["lease"], got.json()["token"]
    assert got.json()["job"]["id"] == job["id"] and got.json()["job"]["state"] == "active" and token
    assert api.post(f"/api/leases/{handle}/progress", json={"done": 1, "total": 4, "message": "a quarter"}
                    ).status_code == 204
    assert api.post(f"/api/leases/{handle}/log", json={"line": "working"}).status_code == 204
    touched = api.post(f"/api/leases/{handle}/touch", json={"extend": 60})
    assert touched.json()["expires_at"] >= got.json()["expires_at"]
    snap = store.get(job["id"])
    assert snap.progress is not None and snap.progress.message == "a quarter" and snap.logs[0].line == "working"
    done = api.post(f"/api/leases/{handle}/fulfill", json={"value": [1, 2]})
    assert done.json()["state"] == "fulfilled"
    again = api.post(f"/api/leases/{handle}/fulfill", json={"value": 3})
    assert again.status_code == 409 and again.json()["error"] == "LeaseLost"
    assert store.counters().queues["q"].fulfilled == 1


def test_an_http_worker_fails_or_releases_and_a_silent_one_loses_its_lease(api: CheckedClient, store: JobStore
                                                                            ) -> None:
    job = _create(api, queue="q", max_attempts=2)
    handle = api.post("/api/queues/q/lease", params={"timeout": 5}).json()["lease"]
    assert api.post(f"/api/leases/{handle}/fail", json={"error": "boom"}).json()["state"] in ("pending", "scheduled")
    handle = api.post("/api/queues/q/lease", params={"timeout": 5}).json()["lease"]
    assert api.post(f"/api/leases/{handle}/release").json()["state"] == "pending"
    handle = api.post("/api/queues/q/lease", params={"timeout": 5, "lease": 1}).json()["lease"]
    deadline = time.monotonic() + 10
    while store.get(job["id"]).state == "active" and time.monotonic() < deadline:
        time.sleep(0.1)
    snap = store.get(job["id"])
    assert snap.state == "failed" and "stopped touching" in (snap.error or "")  # its second and last attempt
    assert api.post(f"/api/leases/{handle}/touch").status_code == 409
    c = store.counters().queues["q"]
    while c.failed == 0 and time.monotonic() < deadline:  # counted just after the fail it counts
        time.sleep(0.05)
        c = store.counters().queues["q"]
    assert (c.retried, c.failed, c.given_back) == (1, 1, 1)
    assert api.post("/api/queues/q/lease", params={"lease": 0.1}).status_code == 422


def test_queues_pause_resume_purge_statistics_workers_and_schedules(api: CheckedClient, store: JobStore) -> None:
    _create(api, queue="a")
    done = _create(api, queue="b")
    store.fulfill(done["id"], 1)
    queues = {q["name"]: q for q in api.get("/api/queues").json()}
    assert queues["a"]["counts"]["pending"] == 1 and queues["b"]["counts"]["fulfilled"] == 1
    assert queues["a"]["created"] == 1 and len(queues["a"]["throughput"]) == 60
    assert api.post("/api/queues/a/pause").json() == {"queue": "a", "paused": True, "changed": True}
    assert api.post("/api/queues/a/pause").json()["changed"] is False
    assert api.get("/api/statistics").json()["paused"] == ["a"]
    assert api.post("/api/queues/a/resume").json()["changed"] is True
    assert api.post("/api/queues/bad.name/pause").status_code == 422
    assert api.post("/api/purge", json={"dry_run": True}).json() == {"purged": 1, "dry_run": True}
    assert api.post("/api/purge", json={"states": ["fulfilled"], "queue": "b"}).json()["purged"] == 1
    assert api.post("/api/purge", json={"states": ["active"]}).status_code == 422
    stats = api.get("/api/statistics").json()
    assert stats["pending"] == 1 and stats["by_queue"]["a"]["pending"] == 1
    store.publish_worker({"name": "w1", "queues": ["a"], "concurrency": 2, "mode": "threads", "started_at": 1.0,
                          "jobs_done": 3, "jobs_failed": 0, "current": []})
    assert [w["name"] for w in api.get("/api/workers").json()] == ["w1"]
    store.declare_schedule("nightly", spec="every 86400s", queue="a")
    assert api.get("/api/schedules").json()[0]["name"] == "nightly"


def test_a_read_only_server_changes_nothing_and_says_so(store: JobStore) -> None:
    job = store.create(1)
    with web_app(store, read_only=True) as api:
        for url, body in (("/api/jobs", {"request": 1}), (f"/api/jobs/{job.id}/cancel", {}),
                          ("/api/queues/default/pause", {}), ("/api/purge", {}), ("/api/queues/default/lease", {})):
            r = api.post(url, json=body)
            assert r.status_code == 403 and r.json()["error"] == "ReadOnly", (url, r.text)
        assert api.get(f"/api/jobs/{job.id}").status_code == 200
        page = api.client.get("/").text
        assert "<form" not in page and "Pause" not in page
        assert "<form" not in api.client.get(f"/jobs/{job.id}").text
        assert api.client.post("/queues/default/pause", data={"csrf": "x"}).status_code == 403
    assert store.get(job.id).state == "pending" and not store.paused()


def test_every_documented_operation_is_exercised_and_the_docs_page_lists_it(api: CheckedClient) -> None:
    job = _create(api)
    api.get(f"/api/jobs/{job['id']}")
    ops = {(method.upper(), path) for path, methods in api.spec["paths"].items() for method in methods}
    assert len(ops) >= 20
    docs = api.client.get("/api/docs").text
    for _, path in ops:
        assert path in docs, path
    assert api.spec["info"]["title"] == "fsjobstore"


def test_a_unique_key_answers_the_job_that_holds_it_until_that_job_is_final(api: CheckedClient,
                                                                           store: JobStore) -> None:
    first = _create(api, request={"n": 1}, unique_key="daily-report")
    again = _create(api, request={"n": 2}, unique_key="daily-report")
    assert again["id"] == first["id"] and again["unique_key"] == "daily-report" and again["request"] == {"n": 1}
    lease = store.pull_work()
    assert lease is not None
    lease.fulfill("done")
    third = _create(api, request={"n": 3}, unique_key="daily-report")
    assert third["id"] != first["id"] and third["state"] == "pending"


def test_a_job_made_after_another_is_deferred_and_listed_until_its_parent_is_fulfilled(
        api: CheckedClient, store: JobStore) -> None:
    parent = _create(api, request="parent")
    child = _create(api, request="child", after=[parent["id"]])
    assert child["state"] == "deferred" and child["after"] == [parent["id"]]
    assert [j["id"] for j in api.get("/api/jobs", params={"state": "deferred"}).json()["jobs"]] == [child["id"]]
    assert api.get("/api/statistics").json()["deferred"] == 1
    lease = store.pull_work()
    assert lease is not None and lease.id == parent["id"]
    lease.fulfill("ok")
    assert api.get(f"/api/jobs/{child['id']}").json()["state"] == "pending"
    r = api.post("/api/jobs", json={"request": 1, "after": ["no-such-job"]})
    assert r.status_code == 404 and r.json()["error"] == "JobNotFound", r.text
    r = api.post("/api/jobs", json={"request": 1, "after": [parent["id"]], "on_parent_failure": "maybe"})
    assert r.status_code == 422, r.text


def test_a_group_is_made_all_or_none_and_read_back(api: CheckedClient, store: JobStore) -> None:
    r = api.post("/api/groups", json={"jobs": [{"request": "a"}, {"request": "b", "after": [0]}]})
    assert r.status_code == 201, r.text
    group = r.json()
    assert [j["request"] for j in group["jobs"]] == ["a", "b"] and not group["done"]
    assert [j["state"] for j in group["jobs"]] == ["pending", "deferred"]
    assert group["jobs"][1]["after"] == [group["jobs"][0]["id"]]
    before = store.statistics()
    r = api.post("/api/groups", json={"jobs": [{"request": "c"}, {"request": "d", "after": [5]}]})
    assert r.status_code == 422, r.text  # a member after a member that is not earlier: nothing made
    assert store.statistics().pending == before.pending
    again = api.get(f"/api/groups/{group['id']}").json()
    assert again["id"] == group["id"] and [j["id"] for j in again["jobs"]] == [j["id"] for j in group["jobs"]]
    assert api.get("/api/groups/nope").status_code == 404


def test_the_overview_shows_a_deferred_column_once_a_job_waits_for_another(api: CheckedClient,
                                                                          store: JobStore) -> None:
    parent = store.create(1, queue="a")
    assert "Deferred</th>" not in api.client.get("/partials/overview").text
    store.create(2, queue="a", after=[parent.id])
    page = api.client.get("/partials/overview").text
    assert "Deferred</th>" in page and 'state=deferred">1</a>' in page


def test_limits_and_subscriptions_show_over_the_api(api: CheckedClient, store: JobStore) -> None:
    store.set_limit(key="api", concurrency=2, rate="10/m")
    made = _create(api, request={"n": 1}, concurrency_key="api")
    assert made["concurrency_key"] == "api" and made["state"] == "pending"
    assert api.get("/api/limits").json() == [{"kind": "key", "name": "api", "concurrency": 2,
                                              "rate": {"starts": 10, "per_seconds": 60.0},
                                              "running": 0, "waiting": 0}]
    store.subscribe("emails", "order-*")
    copy = _create(api, request={"o": 1}, queue="order-eu")
    assert (copy["queue"], copy["topic"]) == ("emails", "order-eu")
    [sub] = api.get("/api/subscriptions").json()
    assert (sub["name"], sub["pattern"]) == ("emails", "order-*")
    store.subscribe("audit", "order-*")
    notified = _create(api, request={"o": 2}, queue="order-us", notify=[{"hook": 1}])
    assert notified["waiting"] == [{"hook": 1}]
    group = store.get_group(notified["group"])
    assert [(j.queue, j.waiting) for j in group.jobs] == [("audit", ({"hook": 1},)), ("emails", ({"hook": 1},))]


def _nested(depth: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``depth`` arrays and objects, alternating (``[{"k": [...]}]``)."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _rewrite_request(store: JobStore, job_id: str, request: Any, queue: str = "default") -> None:
    """Replace a pending job's request in its file, as an older version or a hand could have
    written it: past the checks the store makes on what it is given."""
    from internals import pending_file

    path = pending_file(store.path, job_id, queue)
    with open(path, "rb") as f:
        doc = json.loads(f.read())
    doc["request"] = request
    with open(path, "w") as f:
        f.write(json.dumps(doc, separators=(",", ":")) + "\n")  # one line: the store appends its outcome


def test_a_corrupt_job_file_answers_410_saying_it_was_quarantined_and_logs_no_error(
        api: CheckedClient, store: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    from internals import pending_file

    job = store.create({"n": 1})
    with open(pending_file(store.path, job.id), "wb") as f:
        f.write(b'{"format": 3, "id": "planted", "request": [')
    with caplog.at_level(logging.INFO):
        r = api.get(f"/api/jobs/{job.id}")
        assert r.status_code == 410 and r.json()["error"] == "CorruptJob", r.text
        assert job.id in r.json()["message"] and "quarantine" in r.json()["message"]
        again = api.get(f"/api/jobs/{job.id}")  # moved aside: no such job now
        assert again.status_code == 404 and again.json()["error"] == "JobNotFound"
    followed = store.create({"n": 2})
    with caplog.at_level(logging.INFO), api.client.stream("GET", f"/api/jobs/{followed.id}/events") as events:
        lines = events.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        with open(pending_file(store.path, followed.id), "wb") as f:  # spoilt while a page follows it
            f.write(b"{")
        assert not [line for line in lines if line.startswith("data:")]  # the stream ends, no more events
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text
    assert store.statistics().quarantined >= 2


def test_the_api_takes_and_serves_requests_values_and_targets_nested_to_the_limit(api: CheckedClient,
                                                                                 store: JobStore) -> None:
    from fsjobstore import MAX_NESTING

    deep = _nested(MAX_NESTING, "leaf")
    made = _create(api, request=deep, queue="q", notify=[deep])
    assert made["request"] == deep and made["waiting"] == [deep]
    assert api.get(f"/api/jobs/{made['id']}").json()["request"] == deep
    assert api.get("/api/jobs", params={"queue": "q"}).json()["jobs"][0]["request"] == deep
    group = api.post("/api/groups", json={"jobs": [{"request": deep, "queue": "g"}]})
    assert group.status_code == 201 and group.json()["jobs"][0]["request"] == deep
    leased = api.post("/api/queues/q/lease", params={"timeout": 0})
    assert leased.status_code == 200 and leased.json()["job"]["request"] == deep
    done = api.post(f"/api/leases/{leased.json()['lease']}/fulfill", json={"value": deep})
    assert done.status_code == 200 and done.json()["value"] == {"encoding": "json", "data": deep}
    assert store.get(made["id"]).value == deep
    body = '{"request": ' + "[" * 5000 + "]" * 5000 + "}"  # past what the body's parser can read
    r = api.post("/api/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "InvalidRequest" and str(MAX_NESTING) in r.json()["message"]


def test_a_job_stored_nested_past_any_limit_is_still_served_never_a_500(api: CheckedClient,
                                                                       store: JobStore) -> None:
    deep = _nested(400)  # past pydantic's serialiser (some 250 levels) and far past MAX_NESTING
    job = store.create("small", queue="q")
    _rewrite_request(store, job.id, deep, queue="q")
    assert api.get(f"/api/jobs/{job.id}").json()["request"] == deep
    assert api.get("/api/jobs").json()["jobs"][0]["request"] == deep
    assert api.get("/api/jobs", params={"search": "k"}).json()["jobs"][0]["request"] == deep
    leased = api.post("/api/queues/q/lease", params={"timeout": 0})
    assert leased.status_code == 200 and leased.json()["job"]["request"] == deep
    assert api.post(f"/api/leases/{leased.json()['lease']}/fail", json={"error": "x", "retry": False}
                    ).json()["request"] == deep
    with api.client.stream("GET", f"/api/jobs/{job.id}/events") as events:
        assert json.loads(next(line for line in events.iter_lines() if line.startswith("data:"))[5:])["request"] == deep


def test_json_past_the_recursion_limit_is_written_by_a_loop_exactly_as_json_writes_it() -> None:
    from fsjobstore.web._api import encode

    deep = [[{"k": "\x1b\u00e9\"\\", "n": [1, 2.5, None, True]}]]
    for _ in range(2500):
        deep = [{"a": deep, "b": {}}]
    inner = '[[{"k":"\\u001b\u00e9\\"\\\\","n":[1,2.5,null,true]}]]'
    assert encode(deep) == '[{"a":' * 2500 + inner + ',"b":{}}]' * 2500
    for doc in ([[], {}, [1, 2.5, None, True, "a"], {"a": {"b": []}}], "x", 3, {}):
        assert json.loads(encode(doc)) == doc
    shallow = {"a": [1, {"b": "é", "c": [None, False]}], "d": 1.5}
    assert encode(shallow) == json.dumps(shallow, ensure_ascii=False, separators=(",", ":"))
    from fsjobstore.web._api import _encode_deep

    assert _encode_deep(shallow) == encode(shallow)


def test_a_lease_whose_answer_cannot_be_made_gives_the_job_back_without_spending_an_attempt(
        api: CheckedClient, store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from fsjobstore import StorageError

    job = store.create("x", queue="q")
    real_get = store.get

    def failing_get(job_id: str) -> Any:
        raise StorageError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store, "get", failing_get)
    r = api.client.post("/api/queues/q/lease", params={"timeout": 0})
    assert r.status_code == 500 and r.json()["error"] == "StorageError"
    monkeypatch.setattr(store, "get", real_get)
    back = store.get(job.id)
    assert back.state == "pending" and back.attempts == 0
    again = api.post("/api/queues/q/lease", params={"timeout": 0})
    assert again.status_code == 200 and again.json()["job"]["id"] == job.id
