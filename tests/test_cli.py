"""The command line, run as a real subprocess."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from fsjobstore import JobStore


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True, timeout=60,
                          env=env, input=stdin)


def test_create_get_fulfill_and_stats_from_the_shell(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    made = cli("create", root, '{"n": 1}', "--queue", "q", "--priority", "-2", "--init")
    assert made.returncode == 0, made.stderr
    job_id = made.stdout.strip()
    assert cli("queue", root, job_id, '"http://x"').returncode == 0
    timed = json.loads(cli("create", root, "2", "--timeout", "7.5", "--notify", '{"to": 1}', "--json").stdout)
    assert timed["timeout"] == 7.5 and timed["waiting"] == [{"to": 1}]
    assert cli("fulfill", root, job_id, "done").returncode == 0
    got = json.loads(cli("get", root, job_id, "--json").stdout)
    assert (got["state"], got["value"], got["priority"], got["waiting"]) == (
        "fulfilled", {"encoding": "json", "data": "done"}, -2, ["http://x"])
    stats = json.loads(cli("stats", root, "--json").stdout)
    assert stats["fulfilled"] == 1 and stats["notifications"] == 1
    assert "watching" not in stats  # it described the command's own process, which never waits
    assert json.loads(cli("recover", root, "--json").stdout)["requeued"] == 0


def test_errors_are_one_line_and_exit_with_their_documented_code(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    assert cli("init", root).returncode == 0
    missing = cli("get", root, "nope")
    assert missing.returncode == 3 and missing.stderr.startswith("fsjobstore get: JobNotFound: ")
    bad = cli("create", root, "{not json")
    assert bad.returncode == 2 and "the request is not JSON" in bad.stderr
    job_id = cli("create", root, "1", "--id", "inv-1").stdout.strip()
    taken = cli("create", root, "1", "--id", "inv-1")
    bad_target = cli("create", root, "1", "--notify", "{oops")
    assert bad_target.returncode == 2 and "--notify target is not JSON" in bad_target.stderr
    assert job_id == "inv-1" and taken.returncode == 4 and "JobExists" in taken.stderr
    assert cli("fulfill", root, "inv-1", "x").returncode == 0
    again = cli("fulfill", root, "inv-1", "y")
    assert again.returncode == 4 and "already fulfilled" in again.stderr
    usage = cli("get", root)
    assert usage.returncode == 2 and "expected DIR ID" in usage.stderr
    for done in (missing, bad, taken, again, usage):
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert "exit codes:" in cli("--help").stdout
    assert "example:" in cli("create", "--help").stdout


def test_read_commands_never_make_a_store(tmp_path: Path) -> None:
    typo = str(tmp_path / "typo" / "path")
    for args in (("stats", typo), ("get", typo, "x"), ("recover", typo), ("queue", typo, "x", "1")):
        done = cli(*args)
        assert done.returncode == 3 and "StoreNotFound: there is no store at" in done.stderr, (args, done.stderr)
    assert not (tmp_path / "typo").exists()
    busy = tmp_path / "project"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    refused = cli("create", str(busy), "1", "--init")  # it would make a store: refused, as init is
    assert refused.returncode == 4 and "is not empty and holds no fsjobstore.json" in refused.stderr
    assert sorted(os.listdir(busy)) == ["notes.txt"]
    read = cli("stats", str(busy))
    assert read.returncode == 3 and "it is not a store (check the path)" in read.stderr


def test_version_options_after_the_command_stdin_values_and_the_env_dir(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("fsjobstore 0.")
    assert cli("init", root, "--no-fsync").returncode == 0
    made = cli("create", root, '{"n": 1}', "--no-fsync", "--queue", "q")  # options after the command
    assert made.returncode == 0, made.stderr
    job_id = made.stdout.strip()
    env = {**os.environ, "FSJOBSTORE_DIR": root}
    piped = cli("fulfill", job_id, "-", "--json-value", env=env, stdin='{"rows": [1, 2]}\n')
    assert piped.returncode == 0, piped.stderr
    with JobStore(root) as store:
        assert store.get(job_id).value == {"rows": [1, 2]}
        other = store.create(2).id
    raw = subprocess.run([sys.executable, "-m", "fsjobstore", "fulfill", root, other, "-", "--bytes"],
                         input=b"\xff\x00binary", capture_output=True, timeout=60)
    assert raw.returncode == 0, raw.stderr
    got = json.loads(cli("get", root, other, "--json").stdout)
    assert got["value"] == {"encoding": "base64", "data": base64.b64encode(b"\xff\x00binary").decode()}
    text = cli("get", root, other)
    assert text.returncode == 0 and "state     fulfilled" in text.stdout


def test_a_durable_store_refuses_a_command_that_asks_for_less(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    assert cli("init", root).returncode == 0
    done = cli("create", root, "1", "--no-fsync")
    assert done.returncode == 2 and "durable=False asks for less" in done.stderr


def test_a_reader_that_stops_early_gets_no_error(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        job_id = store.create({"big": "x" * 300_000}).id
    proc = subprocess.Popen([sys.executable, "-m", "fsjobstore", "get", root, job_id, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)  # `... | head -c 10`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_worker_and_notify_take_the_lease_duration_a_shared_mount_needs(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    assert cli("init", root).returncode == 0
    for command in ("worker", "notify"):
        assert "--lease-duration" in cli(command, "--help").stdout
    ran = cli("worker", root, "--handler", "json:dumps", "--burst", "--lease-duration", "5")
    assert ran.returncode == 0, ran.stderr
    assert "1 process on queues default" in ran.stderr  # one, not "1 processes"
    bad = cli("worker", root, "--handler", "json:dumps", "--burst", "--lease-duration", "0")
    assert bad.returncode == 2 and "argument --lease-duration: must be a number of seconds from 0.5" in bad.stderr
    assert cli("notify", root, "--handler", "json:dumps", "--burst", "--lease-duration", "5").returncode == 0


def test_a_bad_queue_name_is_called_a_queue_name(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    assert cli("init", root).returncode == 0
    done = cli("pause", root, "a/b")
    assert done.returncode == 2 and done.stderr.startswith("usage: fsjobstore pause ")
    assert "fsjobstore pause: error: queue 'a/b' is not a queue name" in done.stderr


def test_verify_peer_says_what_it_waits_for_and_leaves_nothing_when_no_leader_came(tmp_path: Path) -> None:
    done = cli("verify", str(tmp_path), "--peer", "--timeout", "1")
    assert done.returncode == 1
    assert "--wait-for-peer` on the other host" in done.stdout + done.stderr
    assert os.listdir(tmp_path) == []


def test_a_mistyped_option_shows_the_usage_of_the_command_it_was_given_to(tmp_path: Path) -> None:
    done = cli("get", str(tmp_path), "some-id", "--jsn")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: fsjobstore get ") and "unrecognized arguments: --jsn" in done.stderr


def test_init_says_whether_it_made_a_store_or_found_one(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    first = cli("init", root)
    assert first.returncode == 0 and first.stdout.startswith("a new store is ready at ")
    again = cli("init", root)
    assert again.returncode == 0 and "is already a store (durable=True); finished jobs are kept 7 days" in again.stdout
    weaker = cli("init", root, "--no-fsync")
    assert weaker.returncode == 2 and "--no-fsync asks for less" in weaker.stderr
    assert "durable=False" not in weaker.stderr  # the command line's words, not the API's


def test_init_of_a_store_made_without_fsync_says_what_it_is_not_that_it_made_a_durable_one(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    assert cli("init", root, "--no-fsync").returncode == 0
    for again in (cli("init", root), cli("init", root, "--no-fsync")):
        assert again.returncode == 0 and "is already a store (durable=False)" in again.stdout, again.stdout
    assert json.loads((tmp_path / "s" / "fsjobstore.json").read_text())["durable"] is False


def test_init_refuses_a_directory_that_holds_other_files_with_exit_4_and_leaves_them_alone(tmp_path: Path) -> None:
    root = tmp_path / "photos"
    root.mkdir()
    (root / "cat.jpg").write_bytes(b"meow")
    done = cli("init", str(root))
    assert done.returncode == 4 and done.stderr.startswith("fsjobstore init: refused: ") and "not empty" in done.stderr
    assert "Traceback" not in done.stderr and sorted(p.name for p in root.iterdir()) == ["cat.jpg"]
    assert cli("stats", str(root)).returncode == 3  # reading it: there is no store there
    a_file = root / "cat.jpg"
    assert cli("init", str(a_file)).returncode == 4 and a_file.read_bytes() == b"meow"
    below = cli("init", str(a_file / "jobs"))  # a path below a file: the file is named, as above
    assert below.returncode == 4 and f"{a_file} is a file" in below.stderr and "Traceback" not in below.stderr
    assert cli("stats", str(a_file / "jobs")).returncode == 3


def test_get_shows_a_failing_delivery_and_its_error(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        job = store.create({"n": 1})
        store.queue(job.id, "mailto:ops@example.com")
        lease = store.pull_work()
        assert lease is not None
        lease.fulfill("done")
        note = store.pull_notification()
        assert note is not None
        note.done([], error="SMTPServerDisconnected: smtp down")
    text = cli("get", root, job.id)
    assert text.returncode == 0 and "1 failed attempt(s)" in text.stdout and "smtp down" in text.stdout
    doc = json.loads(cli("get", root, job.id, "--json").stdout)
    assert doc["delivery_attempts"] == 1 and doc["delivery_error"] == "SMTPServerDisconnected: smtp down"


def test_create_refuses_a_missing_store_naming_it_so_a_typo_in_dir_starts_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "typo" / "s")
    typo = cli("create", root, '{"n": 1}')
    assert typo.returncode == 3 and f"no store at {root}" in typo.stderr and "fsjobstore init" in typo.stderr
    assert "--init" in typo.stderr and not (tmp_path / "typo").exists()
    first = cli("create", root, '{"n": 1}', "--init")
    assert first.returncode == 0 and first.stderr == f"fsjobstore create: made a new store at {root}\n"
    second = cli("create", root, '{"n": 2}', "--init")
    assert second.returncode == 0 and second.stderr == "" and len(second.stdout.strip()) == 32


def test_a_create_refused_with_init_leaves_no_store_behind(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for root, extra, code in ((tmp_path / "a" / "b", ["--queue", "bad queue"], 2),
                              (tmp_path / "c", ["--after", "0" * 32], 3),
                              (tmp_path / "d" / "e", ["--id", "bad id"], 2),  # refused by the store it made
                              (empty, ["--unique-key", ""], 2),
                              (tmp_path / "f", ["--notify", "1"] * 101, 2)):
        done = cli("create", str(root), '{"a": 1}', "--init", *extra)
        assert done.returncode == code and "Traceback" not in done.stderr, (extra, done.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"], (extra, done.stderr)
        assert list(empty.iterdir()) == []
        # Every line names its command, as every other line of the command line does.
        assert all(line.startswith(("fsjobstore create: ", "usage: ", " ")) for line in done.stderr.splitlines()), \
            done.stderr


def test_init_refuses_a_store_among_another_stores_directories_and_warns_in_its_root(tmp_path: Path) -> None:
    outer = tmp_path / "s"
    assert cli("init", str(outer)).returncode == 0
    before, jobs_before = sorted(os.listdir(outer)), sorted(os.listdir(outer / "jobs"))
    for inside in (outer / "jobs" / "x", outer / "jobs", outer / "tmp" / "a" / "b"):
        done = cli("init", str(inside))
        assert done.returncode == 4 and f"inside the store at {outer}" in done.stderr, done.stderr
    made = cli("create", str(outer / "jobs" / "y"), "1", "--init")
    assert made.returncode == 4 and f"inside the store at {outer}" in made.stderr
    assert sorted(os.listdir(outer)) == before and sorted(os.listdir(outer / "jobs")) == jobs_before
    nested = cli("init", str(outer / "sub"))
    assert nested.returncode == 0 and "WARNING" in nested.stderr and f"root of the store at {outer}" in nested.stderr


# == `fsjobstore get`: how a job is shown (the store helper's block, issue 19) ======================
def test_get_shows_a_running_job_on_the_attempt_its_worker_is_on(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        job = store.create({"n": 1})
        lease = store.pull_work()
        assert lease is not None and lease.attempt == 1
        assert store.get(job.id).attempts == 1  # attempts begun, the running one included
        text = cli("get", root, job.id)
        assert text.returncode == 0 and "attempts  attempt 1 of 3, running" in text.stdout
        assert json.loads(cli("get", root, job.id, "--json").stdout)["attempts"] == 1
        lease.fulfill("ok")
        assert store.get(job.id).attempts == 1


def test_get_shows_a_job_fulfilled_by_hand_as_having_run_no_attempt(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        job = store.create({"n": 1})
        store.fulfill(job.id, "done elsewhere")
        assert store.get(job.id).attempts == 0
    text = cli("get", root, job.id)
    assert text.returncode == 0 and "attempts  0 of 3" in text.stdout


def test_get_says_how_many_earlier_log_lines_it_left_out(tmp_path: Path, capsys: object) -> None:
    from fsjobstore._cli._render import print_job
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        job = store.create({"n": 1})
        lease = store.pull_work()
        assert lease is not None
        for i in range(25):
            lease.log(f"line {i}")
        print_job(store.get(job.id))
        out = capsys.readouterr().out  # type: ignore[attr-defined]
        assert "... 15 earlier lines (see --json)" in out
        assert "[1] line 15" in out and "[1] line 24" in out and "line 14\n" not in out
        lease.fulfill("ok")
        short = store.create({"n": 2})
        lease = store.pull_work()
        assert lease is not None
        lease.log("only")
        print_job(store.get(short.id))
        assert "earlier" not in capsys.readouterr().out  # type: ignore[attr-defined]


def test_get_shows_every_failed_attempts_error_in_text_and_json(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root, backoff=lambda a: 0.0) as store:
        job = store.create({"n": 1})
        for n in (1, 2):
            lease = store.pull_work()
            assert lease is not None
            lease.fail(f"Traceback ...\nValueError: bad input {n}")
    text = cli("get", root, job.id)
    assert text.returncode == 0
    assert "ValueError: bad input 1" in text.stdout and "attempt 2 (" in text.stdout
    doc = json.loads(cli("get", root, job.id, "--json").stdout)
    assert [e["attempt"] for e in doc["attempt_errors"]] == [1, 2]
    assert doc["attempt_errors"][0]["error"] == "Traceback ...\nValueError: bad input 1"


def test_get_tells_a_fulfilled_jobs_error_as_its_earlier_attempts(tmp_path: Path) -> None:
    # From a new user's trial: "error" on a fulfilled job read as a failure.
    root = str(tmp_path / "s")
    with JobStore(root, backoff=lambda a: 0.0) as store:
        job = store.create({"n": 1})
        for commit in ("fail", "fulfill"):
            lease = store.pull_work()
            assert lease is not None
            lease.fail("ValueError: once") if commit == "fail" else lease.fulfill("fine")
    text = cli("get", root, job.id).stdout
    assert re.search(r"^earlier error +ValueError: once$", text, re.M) and not re.search(r"^error ", text, re.M), text


def test_pausing_a_queue_with_no_jobs_says_so(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    assert cli("create", root, "{}", "--queue", "alpha", "--init").returncode == 0
    typo = cli("pause", root, "alpah")
    assert typo.returncode == 0 and typo.stdout == (
        "queue alpah paused (no such queue in this store yet: jobs created in it will wait)\n")
    assert cli("pause", root, "alpha").stdout == "queue alpha paused\n"


def test_init_and_create_take_a_retention_and_stats_and_status_show_the_stores(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    made = cli("init", root, "--retain", "2d")
    assert made.returncode == 0 and made.stdout.endswith("(durable=True); finished jobs are kept 2 days\n"), made
    assert cli("init", root, "--retain", "48h").returncode == 0  # the same retention: nothing to change
    other = cli("init", root, "--retain", "forever")
    assert other.returncode == 4 and "finished jobs are kept 2 days" in other.stderr, other.stderr
    assert re.search(r"^retention +finished jobs are kept 2 days$", cli("stats", root).stdout, re.M)
    assert json.loads(cli("stats", root, "--json").stdout)["retain"] == 172_800
    status = cli("status", root)
    assert status.stdout.count("finished jobs kept 2 days") == 1, status.stdout
    assert json.loads(cli("status", root, "--json").stdout)["retain"] == 172_800
    forever = str(tmp_path / "f")
    assert cli("init", forever, "--retain", "forever").stdout.endswith("finished jobs are kept forever\n")
    assert json.loads(cli("stats", forever, "--json").stdout)["retain"] == "forever"
    bad = cli("init", str(tmp_path / "b"), "--retain", "7x")
    assert bad.returncode == 2 and "argument --retain: must be forever, 0" in bad.stderr
    assert not (tmp_path / "b").exists()
    gone = cli("create", root, '{"n": 1}', "--retain", "0").stdout.strip()  # removed once final
    kept = cli("create", root, '{"n": 2}', "--retain", "forever").stdout.strip()
    for job_id in (gone, kept):
        assert cli("fulfill", root, job_id, "done").returncode == 0
    assert cli("recover", root).returncode == 0  # one retention pass
    assert cli("get", root, gone).returncode == 3
    assert cli("get", root, kept).returncode == 0


def test_quarantine_lists_each_file_moved_aside_with_where_it_was_why_and_when(tmp_path: Path) -> None:
    root = tmp_path / "s"
    assert cli("init", str(root)).returncode == 0
    done = cli("quarantine", str(root))
    assert done.returncode == 0 and "no file was moved aside" in done.stdout, done.stderr
    for name in ("junk", "bad\x1b[2Jname"):
        (root / "jobs" / "active" / name).write_text("x")
    with JobStore(str(root)) as store:
        assert store.recover().quarantined == 2
        found = store.quarantined()
        assert sorted(q.origin for q in found) == ["jobs/active/bad\x1b[2Jname", "jobs/active/junk"]
        assert [q.at for q in found] == sorted(q.at for q in found)  # oldest first
        assert all("unrecognised name in jobs/active" in q.reason and q.at > 0 for q in found), found
        assert len(store.quarantined(limit=1)) == 1
    shown = cli("quarantine", str(root))
    assert shown.returncode == 0 and "jobs/active/junk  unrecognised name in jobs/active" in shown.stdout, shown
    assert "\x1b" not in shown.stdout and "bad\\x1b[2Jname" in shown.stdout  # a planted name, escaped
    assert "2 files in" in shown.stdout
    listed = json.loads(cli("quarantine", str(root), "--json").stdout)
    assert sorted(q["origin"] for q in listed) == ["jobs/active/bad\x1b[2Jname", "jobs/active/junk"]
    # A note that is gone (its write failed) or planted in its place: the file's name answers.
    junk = next(q["name"] for q in listed if q["origin"] == "jobs/active/junk")
    (root / "quarantine" / f"{junk}.reason").unlink()
    os.mkfifo(root / "quarantine" / f"{junk}.reason")
    again = json.loads(cli("quarantine", str(root), "--json", "--limit", "5").stdout)
    entry = next(q for q in again if q["name"] == junk)
    assert entry["origin"] == "jobs/active/junk" and "unreadable" in entry["reason"], entry
    refused = cli("quarantine", str(root), "--limit", "0")
    assert refused.returncode == 2 and "--limit" in refused.stderr and "Traceback" not in refused.stderr


def test_the_store_refuses_a_quarantine_listing_limit_out_of_range(tmp_path: Path) -> None:
    from fsjobstore import InvalidRequest

    with JobStore(str(tmp_path / "s")) as store:
        for bad in (0, -1, 10_001, 1.5, True, "5"):
            try:
                store.quarantined(limit=bad)  # type: ignore[arg-type]
            except InvalidRequest as exc:
                assert "limit" in str(exc)
            else:
                raise AssertionError(f"limit={bad!r} was taken")


def test_a_planted_name_that_is_not_utf8_or_holds_a_newline_is_quarantined_noted_and_listed_on_one_line(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    assert cli("init", str(root)).returncode == 0
    active = os.fsencode(root / "jobs" / "active")
    for name in (b"raw\x9b31mbyte", b"nl\nline"):
        with open(active + b"/" + name, "w") as fh:
            fh.write("a")
    done = cli("recover", str(root))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "quarantined  2" in done.stdout, done.stdout
    with JobStore(str(root)) as store:
        found = store.quarantined()
    assert all(not q.reason.startswith("(") for q in found), found  # each note was written
    assert sorted(q.origin for q in found) == ["jobs/active/nl\nline", "jobs/active/raw\\x9b31mbyte"]
    raw = subprocess.run([sys.executable, "-m", "fsjobstore", "quarantine", str(root)], capture_output=True)
    assert raw.returncode == 0 and b"\x9b" not in raw.stdout and b"\x1b" not in raw.stdout, raw.stdout
    lines = raw.stdout.decode().splitlines()
    assert len(lines) == 3 and "nl\\nline" in raw.stdout.decode(), lines  # two entries, then the footer
    listed = subprocess.run([sys.executable, "-m", "fsjobstore", "quarantine", str(root), "--json"],
                            capture_output=True)
    names = {q["name"] for q in json.loads(listed.stdout.decode("utf-8"))}
    assert names == {q.name for q in found}  # exact, the undecodable byte as JSON's \udc9b
