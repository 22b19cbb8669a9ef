"""The web app against a hostile page: the hosts it answers for (DNS rebinding), the Origin of a
change, guessing the token, and what `fsjobstore web` writes to its log (no token, no terminal
control characters); and HTTP details a client relies on (HEAD, media types in any case)."""

from __future__ import annotations

import http.client
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from webkit import web_app

pytest.importorskip("fastapi", reason="the web extra is not installed: pip install -e '.[test]'")

from fastapi.testclient import TestClient

from fsjobstore import JobStore
from fsjobstore.web import create_app

EVIL = "evil.example:8650"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(str(tmp_path / "s")) as s:
        yield s


def test_a_request_for_another_host_is_refused_pages_api_metrics_and_static_alike(store: JobStore) -> None:
    job = store.create({"secret": "s3cret-request"}, queue="q1")
    with TestClient(create_app(store), base_url="http://127.0.0.1:8650") as client:
        for method, url in (("GET", "/api/jobs"), ("GET", f"/api/jobs/{job.id}"), ("GET", "/"), ("GET", "/jobs"),
                            ("GET", "/metrics"), ("GET", "/static/app.css"), ("GET", "/openapi.json"),
                            ("HEAD", "/api/jobs"), ("POST", "/api/queues/q1/pause"), ("POST", "/api/jobs"),
                            ("POST", "/api/purge")):
            r = client.request(method, url, headers={"host": EVIL, "origin": f"http://{EVIL}"},
                               **({"json": {"request": 1}} if url == "/api/jobs" and method == "POST" else {}))
            assert r.status_code == 400, (method, url, r.status_code, r.text)
            if method != "HEAD":
                assert "DisallowedHost" in r.text and "'evil.example:8650'" in r.text, r.text
                assert "--allowed-host evil.example" in r.text and "s3cret" not in r.text and "q1" not in r.text
        assert client.get("/api/jobs", headers={"host": EVIL}).json()["error"] == "DisallowedHost"
        assert not store.paused() and store.statistics().pending == 1
        # Loopback names and the address the connection arrived at, on any port (a tunnel's).
        for host in ("localhost:9000", "LOCALHOST", "127.0.0.1", "[::1]:8650", "localhost.", "127.0.0.1:8650"):
            assert client.get("/api/jobs", headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "localhost.evil.example", "127.0.0.1.evil.example", "x@localhost",
                     "localhost:notaport", "[::1"):
            assert client.get("/api/jobs", headers={"host": host}).status_code == 400, host


def test_allowed_hosts_add_names_and_domains_and_a_bad_entry_is_refused(store: JobStore) -> None:
    app = create_app(store, allowed_hosts=["Jobs.Example.com", ".corp.example", "10.0.0.7"])
    with TestClient(app) as client:
        for host, status in (("jobs.example.com", 200), ("jobs.example.com:443", 200), ("a.corp.example", 200),
                             ("corp.example", 200), ("10.0.0.7:8650", 200), ("evilcorp.example", 400),
                             ("example.com", 400), ("localhost", 200)):
            assert client.get("/api/statistics", headers={"host": host}).status_code == status, host
    with TestClient(create_app(store, allowed_hosts="*")) as client:  # a proxy in front checks Host
        assert client.get("/api/statistics", headers={"host": EVIL}).status_code == 200
    for bad in ("http://jobs.example.com", "jobs.example.com:8650", "a b", "", "user@host"):
        with pytest.raises(ValueError, match="not a host name"):
            create_app(store, allowed_hosts=[bad])


def test_a_change_whose_origin_or_referer_names_another_host_or_port_is_refused(store: JobStore) -> None:
    with TestClient(create_app(store), base_url="http://localhost:8650") as client:
        for headers in ({"origin": "http://localhost:3000"}, {"origin": f"http://{EVIL}"},
                        {"referer": f"http://{EVIL}/page"}, {"referer": "http://127.0.0.1:8650/"},
                        {"origin": "null"}):
            r = client.post("/api/queues/q/pause", headers=headers)
            assert r.status_code == 403 and r.json()["error"] == "CrossSiteRequest", headers
        assert not store.paused()
        assert client.post("/api/queues/q/pause", headers={"origin": "http://localhost:8650"}).status_code == 200
        assert client.post("/api/queues/q/resume", headers={"referer": "http://LOCALHOST:8650/q"}).status_code == 200
        assert client.post("/api/queues/q/pause").status_code == 200  # curl: no Origin, no Referer
    assert store.paused() == {"q"}


def test_repeated_wrong_tokens_from_one_address_are_refused_for_a_while(store: JobStore,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    from fsjobstore.web import _security

    now = [1000.0]
    monkeypatch.setattr(_security.time, "monotonic", lambda: now[0])
    right = {"authorization": "Bearer s3cret-token"}
    app = create_app(store, token="s3cret-token")
    with TestClient(app) as guesser, TestClient(app, client=("10.9.9.9", 4000)) as other:
        for _ in range(20):  # no token at all is not a guess: a browser before it signs in
            assert guesser.get("/api/statistics").status_code == 401
        for i in range(_security.Throttle.FAILURES):
            wrong = {"authorization": f"Bearer wrong-token-{i}"}
            assert guesser.get("/api/statistics", headers=wrong).status_code == 401
        assert "10 wrong tokens from testclient" in caplog.text  # one warning, for the operator
        r = guesser.get("/api/statistics", headers=right)  # even the right one: it must not tell
        assert r.status_code == 429 and r.json()["error"] == "TooManyAttempts" and int(r.headers["retry-after"]) > 0
        assert guesser.post("/login", data={"token": "s3cret-token"}, follow_redirects=False).status_code == 429
        assert guesser.get("/?token=s3cret-token", follow_redirects=False).status_code == 429
        assert other.get("/api/statistics", headers=right).status_code == 200  # another address
        now[0] += _security.Throttle.WINDOW
        assert guesser.get("/api/statistics", headers=right).status_code == 200
        # The sign-in form and the URL's ?token= count as guesses too.
        for i in range(_security.Throttle.FAILURES // 2):
            assert guesser.post("/login", data={"token": f"wrong-{i}-token"}).status_code == 403
            assert guesser.get(f"/?token=wrong-{i}-token", follow_redirects=False).status_code in (303, 401)
        assert guesser.post("/login", data={"token": "s3cret-token"}, follow_redirects=False).status_code == 429
        assert other.post("/login", data={"token": "s3cret-token"}, follow_redirects=False).status_code == 303


def test_head_answers_as_get_without_a_body(store: JobStore) -> None:
    job = store.create(1)
    store.cancel(job.id)
    with web_app(store) as api:
        c = api.client
        for url in ("/api/jobs", f"/api/jobs/{job.id}", "/api/statistics", "/metrics", "/", "/static/app.css",
                    f"/api/jobs/{job.id}/events"):
            got, head = c.get(url), c.head(url)
            assert head.status_code == got.status_code == 200, (url, head.status_code)
            assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"], url
        assert c.head("/api/jobs/nope").status_code == 404
        api_got = c.get(f"/api/jobs/{job.id}")
        assert c.head(f"/api/jobs/{job.id}").headers["content-length"] == api_got.headers["content-length"]


def test_a_json_media_type_is_taken_in_any_case(store: JobStore) -> None:
    with web_app(store) as api:
        for kind in ("Application/JSON", "APPLICATION/json; charset=UTF-8", "application/json ;charset=utf-8"):
            r = api.post("/api/jobs", content=b'{"request": 1}', headers={"content-type": kind})
            assert r.status_code == 201, (kind, r.text)
        assert api.post("/api/jobs", content=b'{"request": 1}',
                        headers={"content-type": "Text/Plain"}).status_code == 415
    assert store.statistics().pending == 3


def test_the_web_log_writes_control_characters_as_escapes() -> None:
    from fsjobstore._cli._web import _Formatter

    formatter = _Formatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord("fsjobstore", logging.WARNING, __file__, 1, "quarantined %s: %s",
                               ("/s/jobs/\x1b]0;PWN\x07", "line one\nforged line"), None)
    line = formatter.format(record)
    assert "\x1b" not in line and "\x07" not in line and "\n" not in line
    assert "\\x1b]0;PWN\\x07" in line and "line one\\nforged line" in line
    try:
        raise ValueError("\x1b[2J\u202eevil")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = formatter.format(record)
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[2J\\u202eevil" in text


def _get(port: int, path: str, host: str, **headers: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host, **headers})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_fsjobstore_web_answers_its_hosts_only_and_its_log_keeps_no_token(store: JobStore) -> None:
    token = "s3cret-in-the-url"
    env: dict[str, Any] = {**os.environ, "FSJOBSTORE_WEB_ALLOWED_HOSTS": "ignored.example",
                           "FSJOBSTORE_WEB_TOKEN": token}
    proc = subprocess.Popen([sys.executable, "-m", "fsjobstore", "web", store.path, "--port", "0",
                             "--allowed-host", "jobs.example", "--allowed-host", ".corp.example"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("fsjobstore web: serving") and f"?token={token}" in line, line
        port = int(line.split(" at ", 1)[1].split("/")[2].rsplit(":", 1)[1])
        assert _get(port, f"/jobs?token={token}", f"127.0.0.1:{port}")[0] == 303
        bearer = {"Authorization": f"Bearer {token}"}
        for host, status in ((f"localhost:{port}", 200), ("jobs.example", 200), ("a.corp.example:443", 200),
                             ("ignored.example", 400), (f"evil.example:{port}", 400)):
            got, body = _get(port, "/api/statistics", host, **bearer)
            assert got == status, (host, got, body)
        got, body = _get(port, "/metrics", "evil.example", **bearer)
        assert got == 400 and b"--allowed-host evil.example" in body
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert token not in err and "GET /jobs?token=[redacted]" in err, err
    assert "uvicorn" not in err, err  # its start and stop are the web server's, named so
    assert "INFO fsjobstore.web: Started server process" in err and "INFO fsjobstore.web: Finished server" in err
    assert "INFO fsjobstore.web.access:" in err and "jobs.example, .corp.example" in err


def test_fsjobstore_web_refuses_a_bad_allowed_host_in_one_line(store: JobStore) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSJOBSTORE_WEB_")}
    r = subprocess.run([sys.executable, "-m", "fsjobstore", "web", store.path, "--allowed-host",
                        "http://jobs.example/"], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2 and "--allowed-host" in r.stderr and "not a host name" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
