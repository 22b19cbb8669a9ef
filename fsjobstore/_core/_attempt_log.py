"""Each attempt's progress and log lines: its holder appends them, ``get()`` reads every attempt's back.

The files outlive the attempt and the job (``runs/`` is
never cleaned), so a finished job still shows them.

Each claim writes its own file, ``runs/<id>/<token>.jsonl``, so lines of two attempts can never
mix: a holder that lost its claim is refused (its claimed file is gone) and, in the moment
between that check and its write, can only add a line to its own attempt's file. Lines:

    {"attempt": 2, "at": 1795000000.0}                             the first line: which attempt
    {"at": ..., "log": "resized 3 of 10"}                          lease.log()
    {"at": ..., "progress": {"done": 3, "total": 10, "message": null}}   lease.progress()
    {"at": ..., "dropped": 120}                                    lines removed to keep it small
    {"at": ..., "given_back": true}                                the claim was released (no attempt)

Appends are not fsynced: progress is a hint, kept across process crashes, not power cuts.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from .._errors import InvalidRequest, LeaseLost
from .._format._job import LogLine, Progress
from .._format._layout import RUN_RE
from .._format._values import dumps, loads, number
from .._os import _files as fs
from .._os import _syscalls as sc
from ._core import Core

LATEST = "latest"  # read_runs: the last progress any attempt reported (no token has this shape)
LOG_CAP = 256 * 1024  # bytes per attempt; past it the oldest log lines go (and are counted)
LINE_CAP = 8 * 1024  # characters of one log line; longer ones are cut


class RunLog:
    """The progress and log file of one claim, written by its holder only. Thread-safe."""

    def __init__(self, core: Core, job_id: str, token: str, attempt: int) -> None:
        self._core = core
        self._job_id = job_id
        self._token = token
        self._attempt = attempt
        self._path = core.layout.run_path(job_id, token)
        self._size = -1  # -1: not made yet
        self._dropped = 0
        self._mutex = threading.Lock()

    def progress(self, done: Any, total: Any, message: Any) -> None:
        number(done, "done")
        if total is not None:
            number(total, "total")
        if message is not None and not isinstance(message, str):
            raise InvalidRequest(f"message must be a str or None, not {type(message).__name__}")
        doc = {"at": self._core.wall(), "progress": {"done": done, "total": total, "message": _cut(message)}}
        self._append(dumps(doc, what="progress") + b"\n")

    def log(self, line: Any) -> None:
        if not isinstance(line, str):
            raise InvalidRequest(f"a log line must be a str, not {type(line).__name__}")
        self._append(dumps({"at": self._core.wall(), "log": _cut(line)}, what="log line") + b"\n")

    def _append(self, data: bytes) -> None:
        with self._mutex:
            # The fence: a holder whose claim was taken over (or committed) may not write.
            if not sc.lexists(self._core.layout.active_path(self._job_id, self._token)):
                raise LeaseLost(f"the lease on job {self._job_id} is no longer held; progress and logs are refused",
                                reason="taken-over")
            if self._size < 0:
                self._start()
            # RACE: a take-over between the check above and this write adds the line to this
            # attempt's own file, which the next attempt never writes: lines cannot mix.
            fd = sc.open(self._path, os.O_WRONLY | os.O_APPEND | fs.O_NOFOLLOW | fs.O_CLOEXEC)
            try:
                if sc.fstat(fd).st_nlink > 1:
                    # A hard link planted in place of our log (FORMAT.md, "Trust"): never append to a file
                    # that has another name; begin a file of our own under ours.
                    sc.close_read(fd)
                    fd = -1
                    self._start()
                    fd = sc.open(self._path, os.O_WRONLY | os.O_APPEND | fs.O_NOFOLLOW | fs.O_CLOEXEC)
                sc.write(fd, data)
            finally:
                if fd >= 0:
                    sc.close_read(fd)
            self._size += len(data)
            if self._size > LOG_CAP:
                self._compact()

    def _start(self) -> None:
        tree = self._core.tree
        # Group mode too (chmod after mkdir): another member's worker writes the next attempt here.
        fs.ensure_dir(self._core.layout.run_dir(self._job_id), durable=False, mode=tree.perms.dir_mode)
        head = dumps({"attempt": self._attempt, "at": self._core.wall()}) + b"\n"
        with contextlib.suppress(FileNotFoundError):
            fs.unlink(self._path)  # a stale file of ours (a failed start): begin again
        fs.write_new(self._path, head, durable=False, mode=tree.perms.file_mode)
        self._size = len(head)

    def _compact(self) -> None:
        """Keep the head, the last progress and the newest log lines within half the cap."""
        lines = read_lines(self._path)
        head = lines[0] if lines and "attempt" in lines[0] else {"attempt": self._attempt, "at": self._core.wall()}
        last_progress = next((d for d in reversed(lines) if "progress" in d), None)
        logs = [d for d in lines if "log" in d]
        kept: list[bytes] = []
        budget = LOG_CAP // 2
        for doc in reversed(logs):
            data = dumps(doc) + b"\n"
            if budget - len(data) < 0:
                break
            budget -= len(data)
            kept.append(data)
        self._dropped += len(logs) - len(kept)  # the file's own "dropped" line is this same count
        body = [dumps(head) + b"\n", dumps({"at": self._core.wall(), "dropped": self._dropped}) + b"\n",
                *reversed(kept)]
        if last_progress is not None:
            body.append(dumps(last_progress) + b"\n")
        tmp = f"{self._path}.{os.getpid()}.compact"
        fs.write_new(tmp, b"".join(body), durable=False, mode=self._core.tree.perms.file_mode)
        sc.rename(tmp, self._path)
        self._size = sum(map(len, body))


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= LINE_CAP:
        return text
    return text[: LINE_CAP - 30] + f"... [{len(text) - LINE_CAP + 30} chars cut]"


def read_lines(path: str) -> list[dict[str, Any]]:
    """The whole lines of one run file that parse as objects (a torn last line is skipped)."""
    try:
        data = fs.read_regular(path, 4 * LOG_CAP)
    except (FileNotFoundError, fs.Unreadable):
        return []
    out = []
    for raw in data.split(b"\n")[:-1]:
        try:
            doc = loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def give_back(core: Core, job_id: str, token: str) -> None:
    """Say in claim ``token``'s run file, if it has one, that the claim was given back (released:
    no attempt counted), so that its progress is never shown as the job's (:func:`read_runs`);
    its log lines stay. Written by the releaser once the job is back in its queue (whatever
    process of its owner wrote the file). A hint, as every line here: never raises."""
    line = dumps({"at": core.wall(), "given_back": True}) + b"\n"
    with contextlib.suppress(OSError):
        fd = sc.open(core.layout.run_path(job_id, token), os.O_WRONLY | os.O_APPEND | fs.O_NOFOLLOW | fs.O_CLOEXEC)
        try:
            if sc.fstat(fd).st_nlink == 1:  # never append to a file with another name (a planted link)
                sc.write(fd, line)
        finally:
            sc.close_read(fd)


def read_runs(core: Core, job_id: str, progress_of: str | None) -> tuple[Progress | None, tuple[LogLine, ...], int]:
    """(progress, every log line oldest first, lines dropped) of all of a job's attempts.

    ``progress_of`` says whose progress is the job's: a claim's token (a running job: that
    attempt's alone, not an earlier one's while it has said nothing yet), ``LATEST`` (a final
    job: the last one reported), or None (a waiting job: no attempt runs, so none). A claim
    given back (a graceful stop, ``release()``) ran no attempt: its progress is never the job's."""
    run_dir = core.layout.run_dir(job_id)
    attempts = []
    for name in fs.scan_names(run_dir):
        if RUN_RE.match(name):
            lines = read_lines(os.path.join(run_dir, name))
            head = lines[0] if lines else {}
            attempt = head.get("attempt")
            shown = progress_of in (LATEST, name[: -len(".jsonl")])
            shown = shown and not any(doc.get("given_back") is True for doc in lines)
            attempts.append((attempt if isinstance(attempt, int) else 0, _number(head.get("at")), lines, shown))
    attempts.sort(key=lambda a: (a[0], a[1]))
    progress: Progress | None = None
    logs: list[LogLine] = []
    dropped = 0
    for attempt, _, lines, shown in attempts:
        for doc in lines[1:]:
            at = _number(doc.get("at"))
            if isinstance(doc.get("log"), str):
                logs.append(LogLine(at, attempt, doc["log"]))
            elif shown and isinstance(doc.get("progress"), dict):
                p = doc["progress"]
                done = p.get("done")
                if isinstance(done, int | float) and not isinstance(done, bool):
                    total = p.get("total")
                    message = p.get("message")
                    progress = Progress(done, total if isinstance(total, int | float) else None,
                                        message if isinstance(message, str) else None, at, attempt)
            elif isinstance(doc.get("dropped"), int):
                dropped += doc["dropped"]
    return progress, tuple(logs), dropped


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
