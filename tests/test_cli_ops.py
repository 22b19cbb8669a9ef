"""The operator's commands (list, purge, status, bulk retry and cancel), run as real subprocesses,
some of them under a pseudo-terminal: what a person sees on a terminal, what a pipe gets."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from fsjobstore import JobNotFound, JobStore

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True, timeout=60,
                          env=env)


def with_env(**more: str) -> dict[str, str]:
    return {**os.environ, **more}


def fill(root: Path, *, pending: int = 0, failed: int = 0, fulfilled: int = 0, queue: str = "default") -> list[str]:
    """Jobs in those states (each failed job fails for good on its first attempt; the store counts
    each commit); their ids."""
    ids = []
    with JobStore(root) as store:
        for n in range(failed + fulfilled):
            ids.append(store.create({"n": n, "what": "finished"}, queue=queue).id)
        for n in range(failed + fulfilled):
            lease = store.pull_work(queues=queue)
            assert lease is not None
            if n < failed:
                lease.fail("boom", retry=False)
            else:
                lease.fulfill(n)
        for n in range(pending):
            ids.append(store.create({"n": n, "what": "waiting"}, queue=queue).id)
    return ids


def on_terminal(args: list[str], *, columns: int = 80, rows: int = 24, stdout_too: bool = False,
                stop_after: str | None = None, signum: int = signal.SIGINT,
                env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the command with stderr (and stdout, with ``stdout_too``) on a pseudo-terminal of
    ``columns`` columns and ``rows`` lines; with ``stop_after``, send ``signum`` (Ctrl-C's SIGINT)
    once the terminal has shown that text twice. Returns (exit status, what the terminal got, what
    the pipe got)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    environ = {k: v for k, v in (env or os.environ).items() if k != "LINES"}  # the terminal's own height
    proc = subprocess.Popen([sys.executable, "-m", "fsjobstore", *args], stdin=slave,
                            stdout=slave if stdout_too else subprocess.PIPE, stderr=slave,
                            env={**environ, "COLUMNS": str(columns)})
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    sent = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not chunk:
                break
            seen += chunk
        if stop_after and not sent and seen.decode(errors="replace").count(stop_after) >= 2:
            proc.send_signal(signum)
            sent = True
        if proc.poll() is not None and not ready:
            break
    piped = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait(timeout=30)
    os.close(master)
    return code, seen.decode().replace("\r\n", "\n"), piped


def test_list_shows_a_table_with_whole_ids_and_json_lines_that_each_parse(tmp_path: Path) -> None:
    root = tmp_path / "s"
    ids = fill(root, pending=3, failed=2)
    text = cli("list", str(root))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATE", "QUEUE", "ATT", "AGE", "REQUEST"]
    assert len(lines) == 6 and {line.split()[0] for line in lines[1:]} == set(ids)
    assert all(len(line) <= 80 for line in lines)
    assert [line.split()[1] for line in lines[1:]] == ["pending"] * 3 + ["failed"] * 2  # pending first
    assert "1/3" in lines[-1] and '{"n":' in lines[1]
    got = cli("list", str(root), "--json", "--state", "failed")
    docs = [json.loads(line) for line in got.stdout.splitlines()]
    assert [d["state"] for d in docs] == ["failed", "failed"] and {d["id"] for d in docs} == set(ids[:2])
    assert got.stderr == ""


def test_list_pages_with_after_without_losing_or_repeating_a_job(tmp_path: Path) -> None:
    root = tmp_path / "s"
    ids = fill(root, pending=5)
    first = [json.loads(line)["id"] for line in cli("list", str(root), "--limit", "2", "--json").stdout.splitlines()]
    rest = [json.loads(line)["id"] for line in
            cli("list", str(root), "--after", first[-1], "--json").stdout.splitlines()]
    assert first + rest == ids  # run order: equal priority, so creation order


def test_list_tells_a_terminal_how_to_get_the_next_page_but_not_a_pipe(tmp_path: Path) -> None:
    root = tmp_path / "s"
    ids = fill(root, pending=3)
    code, terminal, table = on_terminal(["list", str(root), "--limit", "2", "--state", "pending"])
    assert code == 0
    assert f"more: fsjobstore list {root} --state pending --limit 2 --after {ids[1]}" in terminal
    assert ids[2] not in table and ids[1] in table
    piped = cli("list", str(root), "--limit", "2")
    assert piped.returncode == 0 and piped.stderr == ""
    last_page = on_terminal(["list", str(root), "--limit", "3"])
    assert "more:" not in last_page[1]  # nothing after it: no hint


def test_list_fits_a_narrow_terminal_but_never_cuts_an_id(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with JobStore(root) as store:
        job = store.create({"text": "x" * 200}, queue="a-rather-long-queue-name")
    done = cli("list", str(root), env=with_env(COLUMNS="60"))
    lines = done.stdout.splitlines()
    assert all(len(line) <= 60 for line in lines), lines
    assert lines[1].startswith(job.id + "  pending  a-rath") and "…" in lines[1]  # the queue cut, not the id
    narrow = cli("list", str(root), env=with_env(COLUMNS="30")).stdout.splitlines()
    assert narrow == ["ID" + " " * 32 + "STATE", job.id + "  pending"]  # the rest dropped; the id whole, to paste


def test_list_keeps_the_state_in_40_columns_and_cuts_nothing_when_piped(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with JobStore(root) as store:
        job = store.create({"text": "x" * 200}, queue="images")
    narrow = cli("list", str(root), env=with_env(COLUMNS="40")).stdout.splitlines()
    assert [line.split() for line in narrow] == [["ID", "STATE"], [job.id, "pending"]]  # AGE, ATT, QUEUE go first
    unset = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = cli("list", str(root), env=unset).stdout.splitlines()
    row = piped[1].split()
    # The age is however long the command took to start (1s or more on a loaded machine).
    assert row[:4] + row[5:] == [job.id, "pending", "images", "0/3", '{"text":"' + "x" * 200 + '"}'], piped
    assert re.fullmatch(r"\d+s", row[4]), piped
    code, terminal, _ = on_terminal(["list", str(root)], columns=100, stdout_too=True, env=unset)
    assert code == 0 and all(len(line) <= 100 for line in terminal.splitlines()) and "…" in terminal


def test_purge_says_what_it_would_remove_then_removes_it(tmp_path: Path) -> None:
    root = tmp_path / "s"
    ids = fill(root, pending=2, failed=2, fulfilled=1)
    dry = cli("purge", str(root), "--state", "failed", "--dry-run")
    assert dry.returncode == 0 and dry.stdout == "would purge 2 jobs (dry run: nothing was removed)\n", dry.stderr
    assert json.loads(cli("purge", str(root), "--state", "failed", "--dry-run", "--json").stdout) == {
        "purged": 2, "dry_run": True}
    done = cli("purge", str(root), "--state", "failed,pending", "--match", '"what":"(finished|waiting)"', "--json")
    assert json.loads(done.stdout) == {"purged": 4, "dry_run": False}, done.stderr
    with JobStore(root) as store:
        for job_id in ids[:2] + ids[3:]:
            with pytest.raises(JobNotFound):
                store.get(job_id)
        assert store.get(ids[2]).state.value == "fulfilled"
    assert cli("purge", str(root), "--older-than", "1w").stdout == "purged 0 jobs\n"
    assert cli("purge", str(root)).stdout == "purged 1 job\n"


def test_durations_take_units_from_seconds_to_weeks_and_plain_seconds() -> None:
    from fsjobstore._cli._args import duration

    assert [duration(t) for t in ("90s", "15m", "12h", "7d", "2w", "3600", "1.5h")] == [
        90, 900, 43_200, 604_800, 1_209_600, 3600, 5400]
    for bad in ("7x", "", "-1d", "d", "1e3", "nan", "inf", "9999999999w"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a duration"):
            duration(bad)


def test_purge_refuses_a_bad_duration_a_bad_regex_and_a_running_state_naming_each(tmp_path: Path) -> None:
    root = tmp_path / "s"
    fill(root, failed=1)
    for args, said in ((["--older-than", "7x"], "argument --older-than: must be a duration"),
                       (["--older-than", "1M"], "--older-than: units are lower-case s, m, h, d, w, and m is minutes"),
                       (["--older-than", "7D"], "did you mean '7d'?"),
                       (["--match", "("], "--match '(' is not a pattern RE2 accepts: missing )"),
                       (["--state", "active"], "argument --state: a running job is never purged"),
                       (["--state", "done"], "'done' is not a state")):
        done = cli("purge", str(root), *args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 2
    assert cli("list", str(root), "--state", "failed", "--json").stdout.count("\n") == 1  # nothing removed


def test_bulk_retry_and_cancel_say_how_many(tmp_path: Path) -> None:
    root = tmp_path / "s"
    fill(root, failed=3, queue="images")
    fill(root, failed=1, pending=2, queue="mail")
    done = cli("retry", str(root), "--state", "failed", "--queue", "images")
    assert done.returncode == 0 and done.stdout == "retried 3 failed jobs of queue images\n", done.stderr
    again = cli("retry", str(root), "--state", "failed", "--json")
    assert json.loads(again.stdout) == {"retried": 1, "skipped": 0, "refused": 0}
    cancelled = cli("cancel", str(root), "--state", "pending", "--queue", "mail", "--reason", "bulk", "--json")
    assert json.loads(cancelled.stdout) == {"cancelled": 3, "skipped": 0, "refused": 0, "stopping": 0}
    states = [json.loads(line)["state"] for line in cli("list", str(root), "--json").stdout.splitlines()]
    assert sorted(states) == ["cancelled"] * 3 + ["pending"] * 3


def test_bulk_retry_and_cancel_on_a_queue_the_store_has_no_job_of_say_so(tmp_path: Path) -> None:
    root = tmp_path / "s"
    fill(root, failed=1, queue="images")
    typo = cli("retry", str(root), "--state", "failed", "--queue", "imagse")
    assert typo.returncode == 0
    assert typo.stdout == "retried 0 failed jobs of queue imagse (no such queue in this store)\n"
    none_now = cli("cancel", str(root), "--state", "pending", "--queue", "images")  # a real queue, nothing pending
    assert none_now.returncode == 0 and none_now.stdout == "cancelled 0 pending jobs of queue images\n"


def test_a_job_that_moves_during_a_bulk_retry_is_counted_as_skipped(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from fsjobstore._cli import _ops

    root = tmp_path / "s"
    ids = fill(root, failed=3)
    args = argparse.Namespace(dir=str(root), state="failed", queue=None, json=True, no_fsync=False)
    seen: list[str] = []

    def another_operator_first(store: JobStore, job_id: str) -> Any:
        if not seen:  # someone else retries the other two after they were listed
            for other in ids:
                if other != job_id:
                    store.retry(other)
        seen.append(job_id)
        return store.retry(job_id)

    code = _ops.bulk(args, "retry", another_operator_first)
    assert code == 0 and len(seen) == 3
    assert json.loads(capsys.readouterr().out) == {"retried": 1, "skipped": 2, "refused": 0}
    with JobStore(root) as store:
        assert {store.get(i).state.value for i in ids} == {"pending"}


def test_retry_and_cancel_take_an_id_or_a_state_but_not_both_nor_neither(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    fill(Path(root), failed=1)
    for args, said in ((["retry", root], "give the ID of one job, or --state failed"),
                       (["cancel", root], "give the ID of one job, or --state pending"),
                       (["retry", root, "some-id", "--state", "failed"], "give either a job ID or --state, not both"),
                       (["cancel", root, "some-id", "--queue", "q"], "--queue chooses jobs together with --state"),
                       (["retry", root, "--state", "pending"], "invalid choice: 'pending'")):
        done = cli(*args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert done.stderr.startswith("usage: fsjobstore ") and "Traceback" not in done.stderr
    for args, said in ((["retry", root, "--queue", "q"], "--queue needs --state: add --state failed"),
                       (["cancel", root, "--queue", "q"], "--queue needs --state: add --state pending")):
        done = cli(*args)  # no ID was given: the message must not talk of one
        assert done.returncode == 2 and said in done.stderr and "ID" not in done.stderr.splitlines()[-1], done.stderr
    env = with_env(FSJOBSTORE_DIR=root)
    by_env = cli("retry", "--state", "failed", env=env)
    assert by_env.returncode == 0 and by_env.stdout == "retried 1 failed job\n", by_env.stderr
    assert cli("retry", env=env).returncode == 2


def test_a_typo_in_dir_or_a_missing_id_is_not_found_without_a_traceback(tmp_path: Path) -> None:
    typo = str(tmp_path / "tpyo")
    for args in (["list", typo], ["purge", typo], ["status", typo], ["retry", typo, "--state", "failed"],
                 ["cancel", typo, "--state", "pending"]):
        done = cli(*args)
        assert done.returncode == 3 and "StoreNotFound: there is no store at" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert not Path(typo).exists()
    root = tmp_path / "s"
    fill(root, pending=1)
    for args in (["list", str(root), "--after", "no-such-job"], ["retry", str(root), "no-such-job"]):
        done = cli(*args)
        assert done.returncode == 3 and "JobNotFound" in done.stderr and "no-such-job" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_json_output_pipes_into_jq(tmp_path: Path) -> None:
    root = tmp_path / "s"
    ids = fill(root, pending=2, failed=1)
    jq = "jq"
    if subprocess.run(["sh", "-c", "command -v jq"], capture_output=True).returncode != 0:
        pytest.skip("jq is not installed")
    me = f"{sys.executable} -m fsjobstore"

    def sh(line: str) -> str:
        done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert sh(f"{me} list {root} --json | {jq} -r .id").split() == ids[1:] + ids[:1]
    assert sh(f"{me} status {root} --json | {jq} -c '[.pending, .failed, .queues.default.pending]'") == "[2,1,2]\n"
    assert sh(f"{me} purge {root} --dry-run --json | {jq} .purged") == "1\n"
    assert sh(f"{me} retry {root} --state failed --json | {jq} .retried") == "1\n"


def test_status_shows_counts_per_queue_rates_paused_queues_and_workers(tmp_path: Path) -> None:
    root = tmp_path / "s"
    fill(root, pending=2, failed=1, fulfilled=2, queue="images")
    with JobStore(root) as store:
        store.pause("mail")
    done = cli("status", str(root))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "pending 2" in text and "failed 1" in text and "paused mail" in text and "workers 0 live" in text
    assert re.search(r"^images +2 +0 +0 +0\.4 +0\.2$", text, re.M), text  # 2 and 1 jobs over 5 minutes
    assert re.search(r"^mail +0 +0 +0 +0\.0 +0\.0 +paused$", text, re.M), text
    assert re.search(r"^fulfilled +2\.0 +0\.4 +0\.1$", text, re.M), text
    doc = json.loads(cli("status", str(root), "--json").stdout)
    assert doc["per_minute"]["fulfilled"]["1m"] == 2 and doc["per_minute"]["failed"]["5m"] == 0.2
    assert doc["queues"]["mail"]["paused"] and doc["queues"]["images"]["pending"] == 2
    assert doc["workers"] == [] and doc["oldest_pending_age"] >= 0


def test_status_watch_in_a_narrow_terminal_redraws_in_place_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    root = tmp_path / "s"
    fill(root, pending=1, failed=1, queue="a-queue-name-much-wider-than-the-terminal-itself")
    code, terminal, _ = on_terminal(["status", str(root), "--watch", "--interval", "0.2"], columns=40,
                                    stdout_too=True, stop_after="per minute")
    assert code == 0, terminal
    assert "Traceback" not in terminal and "interrupted" not in terminal
    assert terminal.count("\x1b[H") >= 2  # redrawn in place, from the top
    shown = ANSI.sub("", terminal).replace("^C", "")
    lines = [line for line in shown.split("\n") if line]
    assert lines and all(len(line) <= 40 for line in lines), [line for line in lines if len(line) > 40]
    assert any(line.startswith("a-queu") and line.split()[0].endswith("…") for line in lines), lines
    assert terminal.rstrip().endswith("\x1b[?25h")  # the cursor is given back


def test_status_rates_are_events_so_retrying_or_purging_failed_jobs_does_not_rewrite_the_past(tmp_path: Path) -> None:
    from fsjobstore._cli import _status

    root = tmp_path / "s"
    fill(root, failed=2, fulfilled=1, queue="mail")
    with JobStore(root) as store:
        before = _status.snapshot(store)
        assert before["per_minute"]["failed"]["5m"] == 0.4 and before["queues"]["mail"]["failed_per_minute_5m"] == 0.4
        for job in list(store.jobs(state="failed", limit=None)):
            store.retry(job.id)
        store.purge(states="fulfilled")
        after = _status.snapshot(store)
    assert after["failed"] == 0 and after["fulfilled"] == 0  # the jobs moved on, or are gone
    assert after["per_minute"] == before["per_minute"]  # what happened in the last minutes did not change
    assert after["queues"]["mail"]["failed_per_minute_5m"] == 0.4


def test_status_past_its_read_cap_shows_an_unsampled_queues_active_count_as_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsjobstore._cli import _status

    root = tmp_path / "s"
    with JobStore(root) as store:
        for q in ("quiet", "busy", "busy", "busy"):
            store.create({"q": q}, queue=q, delay=3600)
        monkeypatch.setattr(_status, "WALK_CAP", 2)
        doc = _status.snapshot(store)
        assert doc["capped"] == ["scheduled"]
        text = "\n".join(_status.render(doc, 80))
        assert "(read at most 2 active or scheduled jobs" in text
        monkeypatch.setattr(_status, "WALK_CAP", 10)
        whole = _status.snapshot(store)
    assert whole["capped"] == [] and whole["queues"]["busy"]["scheduled"] == 3
    assert whole["queues"]["quiet"]["scheduled"] == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_status_watch_ended_by_sigterm_or_sighup_gives_the_terminal_its_cursor_back(tmp_path: Path,
                                                                                      signum: int) -> None:
    root = tmp_path / "s"
    fill(root, pending=1)
    code, terminal, _ = on_terminal(["status", str(root), "--watch", "--interval", "0.2"], stdout_too=True,
                                    stop_after="per minute", signum=signum)
    assert code == 128 + signum, terminal
    assert "\x1b[?25l" in terminal and terminal.rstrip().endswith("\x1b[?25h")  # hidden, then shown again
    assert "Traceback" not in terminal


def test_status_watch_cuts_a_frame_taller_than_the_terminal_and_says_how_many_queues_it_left_out(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    with JobStore(root) as store:
        for n in range(30):
            store.create({"n": n}, queue=f"q{n:02}")
    code, terminal, _ = on_terminal(["status", str(root), "--watch", "--interval", "0.2"], rows=20,
                                    stdout_too=True, stop_after="per minute")
    assert code == 0, terminal
    frames = [f for f in terminal.split("\x1b[H")[1:] if "\x1b[J" in f]
    assert len(frames) >= 2
    for frame in frames:
        shown = ANSI.sub("", frame[: frame.index("\x1b[J")])
        assert shown.count("\n") <= 19, shown  # never the last line: a newline there would scroll
        lines = shown.splitlines()
        assert lines[-1].startswith("… ") and "more queues" in lines[-1], lines
        left = int(lines[-1].split()[1])
        assert left + sum(1 for line in lines if re.match(r"q\d\d ", line)) == 30, lines


def test_status_interval_without_watch_is_a_usage_error(tmp_path: Path) -> None:
    root = tmp_path / "s"
    fill(root, pending=1)
    done = cli("status", str(root), "--interval", "3")
    assert done.returncode == 2 and done.stderr.endswith("fsjobstore status: error: --interval needs --watch\n")
    assert done.stdout == ""


def test_status_watch_piped_prints_one_snapshot_per_interval_with_a_blank_line_between(tmp_path: Path) -> None:
    root = tmp_path / "s"
    fill(root, pending=1)
    for extra, marker in (([], "per minute"), (["--json"], '"pending": 1')):
        proc = subprocess.Popen([sys.executable, "-m", "fsjobstore", "status", str(root), "--watch", "--interval",
                                 "0.1", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out = ""
        assert proc.stdout is not None
        while out.count(marker) < 3:
            line = proc.stdout.readline()
            assert line, proc.communicate(timeout=30)  # it ended before three snapshots
            out += line
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
        out += rest
        assert proc.returncode == 0 and err == "", err
        assert "\x1b" not in out
        if extra:
            assert all(json.loads(line)["pending"] == 1 for line in out.splitlines())
        else:
            snapshots = re.split(r"\n\n(?=\d\d:\d\d:\d\d  )", out.strip("\n"))  # each starts with its time
            assert len(snapshots) >= 3 and all(s.count("per minute") == 1 for s in snapshots), out


def test_progress_is_shown_on_a_terminal_and_not_when_piped(tmp_path: Path) -> None:
    root = tmp_path / "s"
    fill(root, failed=3)
    code, terminal, out = on_terminal(["retry", str(root), "--state", "failed"])
    assert code == 0 and out == "retried 3 failed jobs\n"
    assert "\rretried " in terminal and terminal.endswith("\r\x1b[K")  # drawn, then cleared
    fill(root, failed=2)
    code, terminal, out = on_terminal(["purge", str(root), "--state", "pending,failed"])
    assert code == 0 and out == "purged 5 jobs\n" and "\rpurged " in terminal
    fill(root, failed=2)
    piped = cli("purge", str(root), "--state", "failed")
    assert piped.stdout == "purged 2 jobs\n" and piped.stderr == ""
    fill(root, failed=2)
    piped = cli("retry", str(root), "--state", "failed")
    assert piped.stdout == "retried 2 failed jobs\n" and piped.stderr == ""


def test_every_new_command_has_help_with_an_example() -> None:
    for command in ("list", "purge", "status", "retry", "cancel"):
        done = cli(command, "--help")
        assert done.returncode == 0 and "example:" in done.stdout and f"fsjobstore {command} ./jobs" in done.stdout
    assert "--state" in cli("retry", "--help").stdout and "--older-than" in cli("purge", "--help").stdout
