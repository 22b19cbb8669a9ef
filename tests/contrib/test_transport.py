"""The kombu transport: what kombu's shared integration tests (test_kombu_suite) do not ask, and
what a broker on a directory must do beyond them: survive its consumer's death, keep what it
rejects visible, show messages readably, shrug off a hostile directory, and wake on inotify."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import kombu
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsjobstore import JobState, JobStore
from fsjobstore.contrib import _stores
from fsjobstore.contrib import kombu as fk


def _url(tmp_path: Path) -> str:
    return f"fsjobstore://{tmp_path}/store"


def _publish(url: str, queue: str, body: object, **options: object) -> None:
    with kombu.Connection(url) as conn:
        q = kombu.Queue(queue, routing_key=queue)
        conn.Producer().publish(body, routing_key=queue, declare=[q], **options)


def _jobs(tmp_path: Path, state: str) -> list:
    store = JobStore(tmp_path / "store", create=False)
    try:
        return list(store.jobs(state=state, limit=None))
    finally:
        store.close()


def test_the_url_names_an_absolute_or_a_relative_directory() -> None:
    assert fk.store_path("fsjobstore:///var/lib/app/jobs") == "/var/lib/app/jobs"
    assert fk.store_path("fsjobstore://jobs") == "jobs"
    assert fk.store_path("fsjobstore://./a%20b") == "./a b"
    with pytest.raises(ValueError, match="names no directory"):
        fk.store_path("fsjobstore://")
    with pytest.raises(ValueError, match="not a fsjobstore URL"):
        fk.store_path("redis://localhost")


@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_two_kombu_queue_names_never_share_a_queue_of_the_store(a: str, b: str) -> None:
    from fsjobstore import check_queue_name

    name_a, name_b = fk.queue_name(a), fk.queue_name(b)
    check_queue_name(name_a)  # always a name the store takes
    if a != b:
        assert name_a != name_b


def test_a_plain_queue_name_stays_as_it_is_so_the_dashboard_shows_celerys_queues_by_name() -> None:
    assert fk.queue_name("celery") == "celery"
    assert fk.queue_name("my_queue") == "my__queue"
    assert fk.queue_name("celery@host.celery.pidbox") == "celery_40host_2ecelery_2epidbox"


def test_a_json_message_is_stored_readably_and_comes_back_byte_for_byte_in_meaning(tmp_path: Path) -> None:
    url = _url(tmp_path)
    _publish(url, "q", {"hello": "wörld", "n": [1, 2.5, None]}, headers={"k": "v"})
    (job,) = _jobs(tmp_path, "pending")
    assert job.queue == "q"
    assert job.request["body"] == {"hello": "wörld", "n": [1, 2.5, None]}  # not base64
    assert job.request["headers"] == {"k": "v"}
    with kombu.Connection(url) as conn:
        msg = conn.SimpleQueue("q").get(timeout=5)
        assert msg.payload == {"hello": "wörld", "n": [1, 2.5, None]}
        assert msg.content_type == "application/json"
        msg.ack()
    (done,) = _jobs(tmp_path, "fulfilled")
    assert done.id == job.id


def test_a_pickled_message_round_trips_as_bytes(tmp_path: Path) -> None:
    url = _url(tmp_path)
    _publish(url, "p", {"when": (1, 2)}, serializer="pickle")
    with kombu.Connection(url) as conn:
        consumer_got = []
        with conn.Consumer(kombu.Queue("p", routing_key="p"), accept=["pickle"],
                           callbacks=[lambda body, m: (consumer_got.append(body), m.ack())]):
            conn.drain_events(timeout=5)
    assert consumer_got == [{"when": (1, 2)}]
    assert pickle.loads(pickle.dumps(consumer_got[0])) == {"when": (1, 2)}


def test_a_message_rejected_without_requeue_ends_failed_and_stays_visible(tmp_path: Path) -> None:
    url = _url(tmp_path)
    _publish(url, "r", {"x": 1})
    with kombu.Connection(url) as conn:
        conn.SimpleQueue("r").get(timeout=5).reject(requeue=False)
    (job,) = _jobs(tmp_path, "failed")
    assert job.error == "rejected"
    assert job.request["body"] == {"x": 1}


def test_a_requeued_message_comes_back_marked_redelivered(tmp_path: Path) -> None:
    url = _url(tmp_path)
    _publish(url, "rq", {"x": 1})
    with kombu.Connection(url) as conn:
        queue = conn.SimpleQueue("rq")
        first = queue.get(timeout=5)
        assert first.delivery_info["redelivered"] is False
        first.requeue()
        second = queue.get(timeout=5)
        assert second.delivery_info["redelivered"] is True
        assert second.payload == {"x": 1}
        second.ack()


def test_an_unacknowledged_message_is_a_held_lease_and_a_closed_channel_gives_it_back(tmp_path: Path) -> None:
    url = _url(tmp_path)
    _publish(url, "held", {"x": 1})
    with kombu.Connection(url) as conn:
        conn.SimpleQueue("held").get(timeout=5)  # not acked
        assert len(_jobs(tmp_path, "active")) == 1
    assert len(_jobs(tmp_path, "pending")) == 1  # closing gave it back


_CONSUME_AND_DIE = textwrap.dedent("""
    import os, sys, kombu, fsjobstore.contrib.kombu
    with kombu.Connection(sys.argv[1]) as conn:
        msg = conn.SimpleQueue("work").get(timeout=10)
        print(msg.payload["n"], flush=True)
        os.kill(os.getpid(), 9)  # dies holding it, unacknowledged
""")


def test_a_consumer_killed_holding_a_message_loses_nothing_and_another_gets_it_redelivered(tmp_path: Path) -> None:
    url = _url(tmp_path)
    _publish(url, "work", {"n": 7})
    out = subprocess.run([sys.executable, "-c", _CONSUME_AND_DIE, url], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL and out.stdout.strip() == "7", out
    with kombu.Connection(url) as conn:
        msg = conn.SimpleQueue("work").get(timeout=20)  # taken over from the dead holder
        assert msg.payload == {"n": 7}
        assert msg.delivery_info["redelivered"] is True
        msg.ack()
    assert [j.state for j in _jobs(tmp_path, "fulfilled")] == [JobState.FULFILLED]


def test_an_expired_message_is_dropped_unread_and_cancelled_saying_why(tmp_path: Path) -> None:
    url = _url(tmp_path)
    _publish(url, "ttl", {"x": 1}, expiration=0.05)
    time.sleep(0.2)
    with kombu.Connection(url) as conn, pytest.raises(conn.SimpleQueue("ttl").Empty):
        conn.SimpleQueue("ttl").get(timeout=0.5)
    (job,) = _jobs(tmp_path, "cancelled")
    assert "expired" in (job.error or "")


def test_a_consumer_waiting_wakes_on_inotify_not_on_its_poll_interval(tmp_path: Path) -> None:
    # A poll interval of 30 s and a wait of 10: only the inotify wake-up can deliver in time.
    url = _url(tmp_path)
    got: list[object] = []
    with kombu.Connection(url, transport_options={"poll_interval": 30}) as conn:
        queue = kombu.Queue("wake", routing_key="wake")
        queue(conn.default_channel).declare()
        with conn.Consumer(queue, callbacks=[lambda body, m: (got.append(body), m.ack())]):
            publisher = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
                import sys, time, kombu, fsjobstore.contrib.kombu
                time.sleep(0.5)
                with kombu.Connection(sys.argv[1]) as c:
                    c.Producer().publish({"w": 1}, routing_key="wake")
            """), url])
            try:
                conn.drain_events(timeout=10)
            finally:
                publisher.wait(timeout=30)
    assert got == [{"w": 1}]


def test_bindings_made_in_one_process_route_messages_published_in_another(tmp_path: Path) -> None:
    url = _url(tmp_path)
    ex = kombu.Exchange("orders", type="topic")
    with kombu.Connection(url) as conn:
        kombu.Queue("eu", exchange=ex, routing_key="order.eu.*")(conn.default_channel).declare()
    script = textwrap.dedent("""
        import sys, kombu, fsjobstore.contrib.kombu
        with kombu.Connection(sys.argv[1]) as c:
            p = c.Producer(exchange=kombu.Exchange("orders", type="topic"))
            p.publish({"o": 1}, routing_key="order.eu.fr")
            p.publish({"o": 2}, routing_key="order.us.ny")
    """)
    subprocess.run([sys.executable, "-c", script, url], check=True, timeout=60)
    assert [j.request["body"] for j in _jobs(tmp_path, "pending")] == [{"o": 1}]


def test_a_live_binding_whose_consumer_is_gone_stops_receiving_and_its_queue_is_emptied(tmp_path: Path) -> None:
    url = _url(tmp_path)
    ex = kombu.Exchange("bcast", type="fanout")
    with kombu.Connection(url) as conn:
        kombu.Queue("alive", exchange=ex, auto_delete=True)(conn.default_channel).declare()
        kombu.Queue("kept", exchange=ex)(conn.default_channel).declare()
        producer = conn.Producer(exchange=ex)
        producer.publish({"n": 1})
        assert sorted(j.queue for j in _jobs(tmp_path, "pending")) == ["alive", "kept"]
        # Its consumer went away long ago: no touch for longer than LIVE_FOR.
        folder = tmp_path / "store" / "contrib" / "kombu" / "bindings"
        old = time.time() - fk.LIVE_FOR - 5
        for f in folder.iterdir():
            if '"live": true' in f.read_text():
                os.utime(f, (old, old))
        producer.publish({"n": 2})
    assert sorted((j.queue, j.request["body"]["n"]) for j in _jobs(tmp_path, "pending")) == [("kept", 1), ("kept", 2)]


@pytest.mark.parametrize("plant", ["symlink", "fifo", "junk", "directory"])
def test_anything_planted_among_the_bindings_is_ignored(tmp_path: Path, plant: str) -> None:
    url = _url(tmp_path)
    _publish(url, "safe", {"x": 1})  # makes the store and the binding of queue "safe"
    folder = tmp_path / "store" / "contrib" / "kombu" / "bindings"
    folder.mkdir(parents=True, exist_ok=True)
    bad = folder / "planted.json"
    if plant == "symlink":
        bad.symlink_to("/etc/passwd")
    elif plant == "fifo":
        os.mkfifo(bad)
    elif plant == "junk":
        bad.write_bytes(b"\x00{not json")
    else:
        bad.mkdir()
    with kombu.Connection(url) as conn:
        ex = kombu.Exchange("x", type="direct")
        queue = kombu.Queue("safe2", exchange=ex, routing_key="k")
        queue(conn.default_channel).declare()
        conn.Producer(exchange=ex).publish({"y": 2}, routing_key="k")
        got: list[object] = []
        with conn.Consumer(queue, callbacks=[lambda body, m: (got.append(body), m.ack())]):
            conn.drain_events(timeout=5)
    assert got == [{"y": 2}]


def test_a_store_that_cannot_be_opened_is_a_connection_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a store")
    conn = kombu.Connection(f"fsjobstore://{tmp_path}/mine")
    with pytest.raises(fk.StoreUnavailable, match=r"cannot open the store at .*mine"):
        conn.connect()


def test_a_message_consumed_without_acknowledgement_holds_no_lease(tmp_path: Path) -> None:
    # kombu's no_ack (Celery's remote-control and reply consumers): delivered means done.
    url = _url(tmp_path)
    _publish(url, "noack", {"x": 1})
    _publish(url, "noack", {"x": 2})
    with kombu.Connection(url) as conn:
        got: list[object] = []
        with conn.Consumer(kombu.Queue("noack", routing_key="noack"), no_ack=True,
                           callbacks=[lambda body, m: got.append(body)]):
            conn.drain_events(timeout=5)
        assert sorted(b["x"] for b in got) == [1, 2]  # type: ignore[index]
        assert _jobs(tmp_path, "active") == []  # the connection is still open: nothing held
    assert len(_jobs(tmp_path, "fulfilled")) == 2


def test_a_celery_task_message_shows_its_task_and_arguments_first(tmp_path: Path) -> None:
    url = _url(tmp_path)
    _publish(url, "celery", [[2, 3], {}, {}], headers={"task": "proj.add", "argsrepr": "(2, 3)", "id": "t-1"})
    (job,) = _jobs(tmp_path, "pending")
    assert list(job.request)[:2] == ["task", "argsrepr"]
    assert job.request["task"] == "proj.add"
    with kombu.Connection(url) as conn:
        msg = conn.SimpleQueue("celery").get(timeout=5)
        assert msg.headers["task"] == "proj.add" and "task" not in msg.properties
        assert msg.payload == [[2, 3], {}, {}]
        msg.ack()


@pytest.mark.parametrize("depth", [70, 200])
def test_a_message_nested_deeper_than_the_store_takes_still_goes_through(tmp_path: Path, depth: int) -> None:
    # A canvas within a canvas: Celery's messages can nest past the store's 64 levels.
    body: object = "core"
    for _ in range(depth):
        body = [body]
    url = _url(tmp_path)
    headers = {"deep": body} if depth > 100 else {}  # deep in the headers too: kept whole, as base64
    _publish(url, "deep", body, headers=headers)
    with kombu.Connection(url) as conn:
        msg = conn.SimpleQueue("deep").get(timeout=5)
        assert msg.payload == body
        msg.ack()


def test_an_option_the_store_does_not_know_is_named_in_a_warning(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    _stores._warned.clear()
    with kombu.Connection(_url(tmp_path), transport_options={"lease_duraton": 5, "visibility_timeout": 60,
                                                             "max_retries": 3}) as conn:
        conn.connect()
    text = caplog.text
    assert "['lease_duraton'] is ignored: did you mean 'lease_duration'?" in text
    assert "['visibility_timeout'] is ignored: a held message is heartbeated" in text
    assert "max_retries" not in text  # kombu's own


def test_a_reply_to_a_live_queue_is_removed_once_read(tmp_path: Path) -> None:
    url = _url(tmp_path)
    ex = kombu.Exchange("reply.x", type="direct")
    queue = kombu.Queue("client-1.reply.x", exchange=ex, routing_key="client-1", auto_delete=True)
    with kombu.Connection(url) as conn:
        queue(conn.default_channel).declare()
        conn.Producer(exchange=ex).publish({"r": 1}, routing_key="client-1")
        got: list[object] = []
        with conn.Consumer(queue, no_ack=True, callbacks=[lambda body, m: got.append(body)]):
            conn.drain_events(timeout=5)
    assert got == [{"r": 1}]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _jobs(tmp_path, "fulfilled"):
        time.sleep(0.1)
    assert _jobs(tmp_path, "fulfilled") == []  # kept 0 s: its queue does not linger in status


@pytest.mark.parametrize("planted", ["a link to a folder outside", "a file"])
def test_a_contrib_folder_replaced_by_a_member_is_moved_aside_and_nothing_is_written_outside(
        tmp_path: Path, planted: str) -> None:
    url = _url(tmp_path)
    JobStore(tmp_path / "store").close()
    outside = tmp_path / "outside"
    outside.mkdir()
    if planted == "a file":
        (tmp_path / "store" / "contrib").write_text("junk")
    else:
        (tmp_path / "store" / "contrib").symlink_to(outside)
    ex = kombu.Exchange("ex", type="direct")
    queue = kombu.Queue("q", exchange=ex, routing_key="q")
    with kombu.Connection(url) as conn:
        queue(conn.default_channel).declare()  # a binding: a file under contrib/kombu/bindings/
        conn.Producer(exchange=ex).publish({"x": 1}, routing_key="q")
        assert list(outside.iterdir()) == []
        assert (tmp_path / "store" / "contrib").is_dir() and not (tmp_path / "store" / "contrib").is_symlink()
        assert [p.name.split(".")[1] for p in (tmp_path / "store").glob("contrib.planted.*")] == ["planted"]
        got: list[object] = []
        with conn.Consumer(queue, callbacks=[lambda body, m: (got.append(body), m.ack())]):
            conn.drain_events(timeout=5)
    assert got == [{"x": 1}]


@pytest.mark.parametrize("request_", [{"opaque": "!!!not base64"}, {"properties": {"body_encoding": "json"}},
                                      {"properties": {"delivery_info": [1]}, "body": ""},
                                      {"properties": {}, "body": "", "headers": [1, 2]}, {"opaque": ["x"]}])
def test_a_planted_job_that_is_not_a_whole_message_is_failed_and_the_next_message_delivered(
        tmp_path: Path, request_: dict) -> None:
    url = _url(tmp_path)
    store = JobStore(tmp_path / "store")
    planted = store.create(request_, queue="celery", priority=-9)  # ahead of the real one
    store.close()
    _publish(url, "celery", {"real": 1})
    with kombu.Connection(url) as conn:
        got: list[object] = []
        with conn.Consumer(kombu.Queue("celery", routing_key="celery"),
                           callbacks=[lambda body, m: (got.append(body), m.ack())]):
            conn.drain_events(timeout=5)
    assert got == [{"real": 1}]
    store = JobStore(tmp_path / "store")
    job = store.get(planted.id)
    store.close()
    assert job.state is JobState.FAILED and "not a kombu message" in (job.error or "")


def test_a_stale_live_binding_does_not_empty_a_queue_that_is_also_bound_for_good(tmp_path: Path) -> None:
    url = _url(tmp_path)
    with kombu.Connection(url) as conn:
        kombu.Queue("work", exchange=kombu.Exchange("main", type="direct"), routing_key="work")(
            conn.default_channel).declare()
        kombu.Queue("work", exchange=kombu.Exchange("side", type="fanout"), auto_delete=True)(
            conn.default_channel).declare()
        conn.Producer(exchange=kombu.Exchange("main", type="direct")).publish({"keep": 1}, routing_key="work")
        folder = tmp_path / "store" / "contrib" / "kombu" / "bindings"
        for f in folder.iterdir():
            if '"live": true' in f.read_text():
                os.utime(f, (0, 0))  # long dead (or planted so)
        conn.Producer(exchange=kombu.Exchange("side", type="fanout")).publish({"x": 2})
    assert [j.request["body"] for j in _jobs(tmp_path, "pending")] == [{"keep": 1}]


def test_a_name_crafted_to_look_cut_never_shares_a_queue_with_the_long_name_it_imitates() -> None:
    long = "q" * 200
    cut = fk.queue_name(long)
    assert len(cut) == 64
    assert fk.queue_name(cut) != cut  # the crafted one is escaped or cut differently
    assert fk.queue_name(cut) != fk.queue_name(long)


def test_a_relative_url_is_named_as_the_directory_it_resolves_to_with_the_likely_slip(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with kombu.Connection("fsjobstore://tmp/jobs-rel") as conn:
        conn.connect()
    assert f"names {tmp_path}/tmp/jobs-rel, relative to this process's working directory" in caplog.text
    assert "fsjobstore:///tmp/jobs-rel" in caplog.text


def test_a_dead_consumers_live_queue_is_emptied_by_any_consumer_without_waiting_for_a_publish(tmp_path: Path) -> None:
    url = _url(tmp_path)
    ex = kombu.Exchange("bcast2", type="fanout")
    with kombu.Connection(url) as conn:
        kombu.Queue("dead-worker", exchange=ex, auto_delete=True)(conn.default_channel).declare()
        conn.Producer(exchange=ex).publish({"n": 1})
    for f in (tmp_path / "store" / "contrib" / "kombu" / "bindings").iterdir():
        os.utime(f, (0, 0))  # its consumer died long ago
    assert len(_jobs(tmp_path, "pending")) == 1
    with kombu.Connection(url) as conn:  # some other consumer, waiting on its own queue
        consumer = conn.Consumer(kombu.Queue("other", routing_key="other"), callbacks=[lambda body, m: m.ack()])
        with consumer, pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.5)
    assert _jobs(tmp_path, "pending") == []


def test_a_consumer_in_a_process_with_a_thousand_files_open_still_waits_on_inotify(tmp_path: Path) -> None:
    # select() refuses descriptors numbered 1024 or more; a busy worker process has them.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        with kombu.Connection(_url(tmp_path)) as conn:
            queue = kombu.Queue("high-fd", routing_key="high-fd")
            with conn.Consumer(queue, callbacks=[lambda body, m: m.ack()]), pytest.raises(TimeoutError):
                conn.drain_events(timeout=0.3)  # waits on a descriptor numbered above 1024
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
