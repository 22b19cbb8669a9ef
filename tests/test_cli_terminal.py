"""What the command line shows a person cannot drive their terminal: job text written by a
handler, a worker's name and a job's request carry escape sequences, and every human-readable
line escapes them, while ``--json`` stays exact JSON."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fsjobstore import JobStore
from fsjobstore._cli._terminal import SafeText, TerminalFormatter, json_text, printable

# Retitles and clears the terminal, then reverses the text after it; a C1 CSI.
HOSTILE = "boom\x1b]0;PWN\x07\x1b[2J\u202eX\x9b\u2028Y"
RAW = ("\x1b", "\x07", "\u202e", "\x9b", "\u2028")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsjobstore", *args], capture_output=True, text=True, timeout=60)


def _raw_in(text: str) -> list[str]:
    return [repr(c) for c in RAW if c in text]


@pytest.fixture
def hostile_store(tmp_path: Path) -> tuple[str, str, str]:
    """A store with a failed job whose error, log line, progress message and request carry
    escapes, and a cancelled one whose reason does."""
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        failed = store.create({"t": HOSTILE}, queue="q")
        lease = store.pull_work()
        assert lease is not None
        lease.log(HOSTILE)
        lease.progress(1, 2, HOSTILE)
        lease.fail(HOSTILE, retry=False)
        cancelled = store.create({"t": 1}, queue="q")
        store.cancel(cancelled.id, HOSTILE)
    return root, failed.id, cancelled.id


def test_get_list_stats_and_status_escape_job_text_and_json_stays_exact(hostile_store: tuple[str, str, str]) -> None:
    root, failed, cancelled = hostile_store
    for args in (("get", root, failed), ("get", root, cancelled), ("list", root, "--state", "failed"),
                 ("list", root, "--state", "cancelled"), ("stats", root), ("status", root)):
        shown = cli(*args)
        assert shown.returncode == 0, shown.stderr
        assert _raw_in(shown.stdout + shown.stderr) == [], args
    got = cli("get", root, failed)
    assert "\\x1b]0;PWN\\x07" in got.stdout and "\\u202e" in got.stdout  # shown, as visible escapes
    doc = json.loads(cli("get", root, failed, "--json").stdout)
    assert doc["error"].startswith(HOSTILE) and doc["request"] == {"t": HOSTILE}
    assert doc["logs"][-1]["line"] == HOSTILE
    line = cli("list", root, "--state", "cancelled", "--json").stdout.splitlines()[0]
    assert _raw_in(line) == [] and HOSTILE in json.loads(line)["error"]


def test_a_workers_name_is_escaped_in_workers(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    with JobStore(root) as store:
        store.publish_worker({"name": HOSTILE, "queues": ["q"], "concurrency": 1})
        shown = cli("workers", root)
        as_json = cli("workers", root, "--json")
    assert shown.returncode == 0, shown.stderr
    assert _raw_in(shown.stdout + shown.stderr) == [] and "PWN" in shown.stdout
    assert _raw_in(as_json.stdout) == []
    assert json.loads(as_json.stdout)[0]["name"] == HOSTILE


def test_a_quarantine_warning_for_a_planted_name_is_escaped(tmp_path: Path) -> None:
    """A group member plants a file whose name drives the terminal; the warning that names it
    while a command runs (recover's pass moves it aside) shows it as visible escapes."""
    root = tmp_path / "s"
    JobStore(root).close()
    (root / "tmp" / ("planted" + HOSTILE)).write_bytes(b"x")
    shown = cli("recover", str(root))
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.startswith("fsjobstore recover: WARNING: quarantined ")  # an error line's shape
    assert _raw_in(shown.stdout + shown.stderr) == []
    assert "plantedboom\\x1b]0;PWN\\x07\\x1b[2J\\u202e" in shown.stderr  # shown, as visible escapes


def test_an_error_line_escapes_what_the_store_says() -> None:
    # The id is refused with its text in the message: the error line shows it escaped.
    shown = cli("get", "/nonexistent-store-for-a-test", "a\x1b[2J")
    assert shown.returncode != 0 and "Traceback" not in shown.stderr
    assert _raw_in(shown.stderr) == []


def test_the_log_formatter_escapes_messages_arguments_and_tracebacks() -> None:
    formatter = TerminalFormatter("%(levelname)s: %(message)s")
    try:
        raise RuntimeError(HOSTILE)
    except RuntimeError:
        record = logging.LogRecord("fsjobstore", logging.WARNING, __file__, 1, "quarantined %s", (HOSTILE,),
                                   sys.exc_info())
    text = formatter.format(record)
    assert _raw_in(text) == [] and "quarantined boom\\x1b" in text and "RuntimeError: boom\\x1b" in text


def test_printable_keeps_tabs_and_newlines_and_is_idempotent() -> None:
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("a\nb", newlines=False) == "a\\nb"
    once = printable(HOSTILE)
    assert printable(once) == once and _raw_in(once) == []


def test_safe_text_escapes_writes_but_passes_the_commands_own_control_sequences() -> None:
    import io

    out = io.StringIO()
    safe = SafeText(out)
    safe.write(HOSTILE)
    safe.control("\x1b[K")
    assert out.getvalue() == printable(HOSTILE) + "\x1b[K"


def test_json_text_is_exact_json_with_nothing_a_terminal_obeys() -> None:
    text = json_text(json.dumps({"e": HOSTILE}, ensure_ascii=False))
    assert _raw_in(text) == [] and json.loads(text) == {"e": HOSTILE}
