"""The web app's safety: job text never runs (XSS), no action from another site (CSRF), the token,
the headers, ids from URLs, and `fsjobstore web` refusing to listen beyond loopback without a token."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from webkit import csrf_of, web_app

from fsjobstore import JobStore

EVIL = "<script>window.__xss=1</script><img src=x onerror=alert(1)>"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(str(tmp_path / "s")) as s:
        yield s


def test_job_text_is_shown_escaped_on_every_page_never_as_markup(store: JobStore) -> None:
    job = store.create({"name": EVIL, EVIL: 1}, queue="q")
    lease = store.pull_work()
    assert lease is not None
    lease.log(EVIL)
    lease.progress(1, 2, EVIL)
    lease.fail(EVIL, retry=False)
    store.queue(job.id, {"hook": EVIL})
    other = store.create(EVIL, queue="q")
    store.cancel(other.id, EVIL)
    with web_app(store) as api:
        pages = [api.client.get(url).text for url in ("/", "/jobs", f"/jobs/{job.id}", f"/jobs/{other.id}",
                                                      "/jobs?q=script", "/jobs?state=failed")]
    for html in pages:
        assert "<script>window" not in html and "<img src=x" not in html
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in pages[2]  # shown, as text
    assert pages[2].count("&lt;img src=x onerror=alert(1)&gt;") >= 4  # request, error, log line, target


def test_pages_carry_a_content_security_policy_that_allows_no_inline_script(store: JobStore) -> None:
    with web_app(store) as api:
        for url in ("/", "/jobs", "/api/statistics", "/nowhere"):
            headers = api.client.get(url).headers
            assert "script-src 'self'" in headers["content-security-policy"]
            assert "unsafe-inline" not in headers["content-security-policy"]
            assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"


def test_a_form_without_this_browsers_csrf_token_or_from_another_site_changes_nothing(store: JobStore) -> None:
    job = store.create(1, queue="q")
    with web_app(store) as api:
        client = api.client
        token = csrf_of(client.get("/").text)  # the browser's first visit sets its CSRF cookie
        for data, headers in (({}, {}), ({"csrf": "forged"}, {}),
                              ({"csrf": token}, {"origin": "http://evil.example"}),
                              ({"csrf": token}, {"referer": "http://evil.example/page"})):
            r = client.post("/queues/q/pause", data=data, headers=headers, follow_redirects=False)
            assert r.status_code == 403, (data, headers, r.status_code)
            r = client.post(f"/jobs/{job.id}/cancel", data=data, headers=headers, follow_redirects=False)
            assert r.status_code == 403
        assert not store.paused() and store.get(job.id).state == "pending"
        other = client.__class__(client.app)  # another browser: its own cookie, so my token is no use to it
        other.get("/")
        assert other.post("/queues/q/pause", data={"csrf": token}, follow_redirects=False).status_code == 403
        r = client.post("/queues/q/pause", data={"csrf": token}, headers={"origin": "http://testserver"},
                        follow_redirects=False)
        assert r.status_code == 303 and store.paused() == {"q"}


def test_the_api_takes_json_bodies_only_and_refuses_other_sites(store: JobStore) -> None:
    with web_app(store) as api:
        r = api.client.post("/api/jobs", data={"request": "1"})  # what a cross-site HTML form can send
        assert r.status_code == 415 and r.json()["error"] == "InvalidRequest"
        r = api.client.post("/api/jobs", content=b'{"request": 1}', headers={"content-type": "text/plain"})
        assert r.status_code == 415
        r = api.client.post("/api/jobs", json={"request": 1}, headers={"origin": "http://evil.example"})
        assert r.status_code == 403 and r.json()["error"] == "CrossSiteRequest"
        assert store.statistics().pending == 0
        assert api.post("/api/jobs", json={"request": 1}, headers={"origin": "http://testserver"}).status_code == 201


def test_with_a_token_every_request_needs_it_and_a_browser_signs_in_once(store: JobStore) -> None:
    job = store.create(1)
    with web_app(store, token="s3cret-token") as api:
        c = api.client
        assert c.get("/", follow_redirects=False).headers["location"] == "/login"
        for url in ("/api/jobs", f"/api/jobs/{job.id}", "/metrics", "/openapi.json"):
            r = c.get(url)
            assert r.status_code == 401 and r.json()["error"] == "Unauthorized", url
        bearer = {"authorization": "Bearer s3cret-token"}
        assert c.get(f"/api/jobs/{job.id}", headers=bearer).status_code == 200
        assert c.get("/metrics", headers=bearer).status_code == 200
        assert c.get("/api/jobs", headers={"authorization": "Bearer wrong-token"}).status_code == 401
        assert c.post("/login", data={"token": "wrong-token"}).status_code == 403
        assert c.get("/static/app.css").status_code == 200  # what the sign-in page needs
        r = c.post("/login", data={"token": "s3cret-token"}, follow_redirects=False)
        assert r.status_code == 303 and "s3cret-token" not in r.headers["set-cookie"]
        assert c.get("/").status_code == 200
    with web_app(store, token="s3cret-token") as api:  # the URL `fsjobstore web` prints
        r = api.client.get("/?token=s3cret-token", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        assert api.client.get("/").status_code == 200
    with pytest.raises(ValueError, match="at least 8"):
        web_app(store, token="short").__enter__()


def test_ids_and_paths_from_urls_never_reach_outside_the_store(store: JobStore, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("SECRET")
    with web_app(store) as api:
        for url in ("/jobs/..%2f..%2fsecret.txt", "/jobs/%2e%2e", "/static/..%2f..%2f..%2fsecret.txt",
                    "/static/../../secret.txt", "/jobs/a.b", "/api/jobs/..%2fsecret.txt/events"):
            r = api.client.get(url)
            assert r.status_code in (404, 422) and "SECRET" not in r.text, (url, r.status_code)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FSJOBSTORE_WEB_TOKEN"}
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_fsjobstore_web_refuses_other_addresses_without_a_token_and_a_port_in_use(store: JobStore) -> None:
    r = _cli("web", store.path, "--host", "0.0.0.0")
    assert r.returncode == 2 and "--token" in r.stderr and "Traceback" not in r.stderr
    r = _cli("web", store.path, "--token", "short")
    assert r.returncode == 2 and "at least 8" in r.stderr
    r = _cli("web", store.path, "--host", "0.0.0.0", "--token", " " * 10)
    assert r.returncode == 2 and "without spaces" in r.stderr
    r = _cli("web", store.path, "--host", "0.0.0.0", "--read-only")
    assert r.returncode == 2 and "anyone who reaches it read the store" in r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        r = _cli("web", store.path, "--port", str(busy.getsockname()[1]))
    assert r.returncode == 2 and "in use" in r.stderr and "Traceback" not in r.stderr
    r = _cli("web", str(Path(store.path).parent / "nothing"))
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_fsjobstore_web_serves_until_sigterm_and_exits_0(store: JobStore) -> None:
    import urllib.error
    import urllib.request

    job = store.create("never run")
    proc = subprocess.Popen([sys.executable, "-m", "fsjobstore", "web", store.path, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    polled: dict[str, object] = {}

    def long_poll() -> None:
        try:
            urllib.request.urlopen(f"{url}api/jobs/{job.id}/wait?timeout=60", timeout=30)
        except urllib.error.HTTPError as exc:
            polled["status"], polled["body"] = exc.code, json.loads(exc.read())

    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("fsjobstore web: serving"), line
        url = line.split(" at ", 1)[1].split()[0]
        with urllib.request.urlopen(url + "api/statistics", timeout=10) as answer:
            assert b'"pending"' in answer.read()
        waiter = threading.Thread(target=long_poll)
        waiter.start()
        time.sleep(0.5)  # the long poll is waiting
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    waiter.join(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err, err
    # The long poll is answered as the server stops (not cancelled: a 500 and a traceback).
    assert polled == {"status": 503, "body": {"error": "StoreClosed", "message": polled["body"]["message"]}}  # type: ignore[index]
    assert "GET /api/statistics" in err  # one line per request at the default log level


def test_a_body_over_the_limit_is_refused_before_it_is_read(store: JobStore) -> None:
    with web_app(store) as api:
        limit = 2 * max(store.max_value_bytes, store.max_request_bytes) + (1 << 20)
        r = api.client.post("/api/jobs", content=b"{}", headers={"Content-Type": "application/json",
                                                                 "Content-Length": str(limit + 1)})
        assert r.status_code == 413 and r.json()["error"] == "ValueTooLarge", r.text

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
            yield b'{"request": "'
            for _ in range(limit // (1 << 20) + 2):
                yield b"x" * (1 << 20)
            yield b'"}'

        r = api.client.post("/api/jobs", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "ValueTooLarge", r.text
    assert store.statistics().pending == 0


def test_a_read_only_server_refuses_a_change_before_reading_its_body(store: JobStore) -> None:
    with web_app(store, read_only=True) as api:
        r = api.client.post("/api/jobs", content=b"{}", headers={"Content-Type": "application/json",
                                                                 "Content-Length": str(1 << 40)})
        assert r.status_code == 403 and r.json()["error"] == "ReadOnly", r.text


def test_a_wrong_token_is_told_apart_from_none_and_401_names_the_scheme(store: JobStore) -> None:
    with web_app(store, token="s3cret-token") as api:
        none = api.client.get("/api/statistics")
        wrong = api.client.get("/api/statistics", headers={"Authorization": "Bearer nope-nope-nope"})
    assert none.status_code == wrong.status_code == 401
    assert none.headers["WWW-Authenticate"].startswith("Bearer")
    assert "needs its token" in none.json()["message"] and "not the server's" in wrong.json()["message"]


def test_mounted_under_a_prefix_every_link_form_asset_and_redirect_keeps_it(store: JobStore) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from fsjobstore.web import create_app

    host = FastAPI()
    host.mount("/queue", create_app(store))
    job = store.create({"n": 1})
    with TestClient(host) as client:
        page = client.get("/queue/").text
        links = re.findall(r'(?:href|action|src|data-refresh|data-events)="(/[^"]*)"', page)
        assert links and all(link.startswith("/queue/") for link in links), links
        assert client.get("/queue/static/app.css").status_code == 200
        job_page = client.get(f"/queue/jobs/{job.id}").text
        events = re.search(r'data-events="([^"]+)"', job_page)
        assert events and events.group(1) == f"/queue/api/jobs/{job.id}/events"
        r = client.post(f"/queue/jobs/{job.id}/cancel", data={"csrf": csrf_of(job_page)}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith(f"/queue/jobs/{job.id}?"), r.headers
        missing = client.get("/queue/api/jobs/nope")
        assert missing.status_code == 404 and missing.json()["error"] == "JobNotFound"


def test_a_pages_banner_says_only_fixed_messages_never_text_from_the_link(store: JobStore) -> None:
    with web_app(store) as api:
        for link, shown in (("/?done=paused&q=mail", "Queue mail paused."), ("/?done=purged&n=3", "Purged 3 job(s)."),
                            ("/jobs?done=created", "Job created.")):
            page = api.client.get(link).text
            assert f'<p class="flash" role="status">{shown}</p>' in page, link
        for link in ("/?done=Your+account+is+locked:+call+555-0100", "/?done=paused&q=not+a+queue!",
                     "/?done=purged&n=lots", "/?done=paused"):
            page = api.client.get(link).text
            assert 'class="flash"' not in page and "555-0100" not in page and "lots" not in page, link


def test_a_corrupt_job_files_page_answers_410_saying_it_was_quarantined_without_an_error_log(
        store: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from internals import pending_file

    job = store.create({"n": 1})
    with open(pending_file(store.path, job.id), "wb") as f:
        f.write(b'{"format": 3, "id": "planted", "request": [')
    with web_app(store) as api, caplog.at_level(logging.INFO):
        page = api.client.get(f"/jobs/{job.id}")
        assert page.status_code == 410 and "quarantine" in page.text and job.id in page.text, page.text
        assert api.client.get(f"/jobs/{job.id}").status_code == 404  # moved aside: no such job now
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text


def test_the_last_hour_sparkline_draws_readable_bars_even_when_all_work_fell_in_one_minute() -> None:
    from fsjobstore.web._views import sparkline

    rows = [[60 * m, 0, 0] for m in range(60)]
    rows[-1] = [60 * 59, 22, 8]
    svg = str(sparkline(rows))
    rects = re.findall(r'<rect class="(ok|bad)" x="[\d.]+" y="[\d.]+" width="([\d.]+)" height="([\d.]+)"', svg)
    assert {kind for kind, _, _ in rects} == {"ok", "bad"}
    assert all(float(w) >= 8 and float(h) >= 3 for _, w, h in rects), rects
    assert "22 ok" in svg and "8 failed" in svg and "last hour: 22 fulfilled, 8 failed" in svg
    one = [[60 * m, 0, 0] for m in range(59)] + [[60 * 59, 1, 0]]
    quiet = [[60 * m, 500 if m < 55 else 0, 0] for m in range(59)] + [[60 * 59, 1, 0]]
    assert re.search(r'height="([3-9]|\d\d)(\.\d)?"/>', str(sparkline(one)))
    last = re.findall(r'<rect class="ok" [^>]*height="([\d.]+)"', str(sparkline(quiet)))[-1]
    assert float(last) >= 3  # one job beside busy minutes is still a bar
