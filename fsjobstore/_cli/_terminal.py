"""Text a person's terminal shows, made harmless: job text (errors, log lines, progress messages,
cancel reasons), worker names and the names of planted files are written by handlers and group
members, and a terminal obeys the control characters in what it prints (``ESC ] 0;`` retitles
the window, ``ESC [ 2J`` clears it, a bidi override reorders what the operator reads). Every
human-readable line the command line prints goes through :func:`printable`; ``--json`` output
does not, since JSON escapes control characters itself and must stay exact."""

from __future__ import annotations

import logging
import re
from typing import Any, TextIO

# C0 controls but tab and newline, DEL, the C1 controls (U+0080-U+009F: a terminal may read
# U+009B as CSI), the line and paragraph separators (U+2028, U+2029: a line break to some
# terminals, pagers and editors, which would let job text forge a line of the output), the
# bidirectional overrides, embeddings and isolates (Trojan Source), and lone surrogates (a
# planted file name that is not UTF-8, as Python reads it: written out, its raw bytes).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with every character that could drive a terminal written as a visible escape
    (``\\x1b``, ``\\u202e``); tabs kept, and newlines kept unless ``newlines`` is False (a
    table cell or a one-line field, where a newline would break the layout)."""
    out = _UNSAFE.sub(_escape, text)
    return out if newlines else out.replace("\n", "\\n")


class TerminalFormatter(logging.Formatter):
    """What every log line the command line prints goes through: the record's message (a job's
    error, a worker's name, a planted file's name) on one line with its control characters
    escaped, and a traceback escaped but for its newlines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record), newlines=False)

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info))


def log_to_terminal(level: int | str, fmt: str) -> None:
    """The command's logging: one handler on stderr, every line through
    :class:`TerminalFormatter` (replacing any handler an earlier call installed)."""
    handler = logging.StreamHandler()
    handler.setFormatter(TerminalFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler], force=True)


class SafeText:
    """A text stream (the command's stdout or stderr) whose every write reaches the terminal
    through :func:`printable`: whatever a command prints, a job's text among it, cannot drive
    the terminal, with no call of the command's own to forget. Tabs and newlines pass; the
    command's own control sequences (``status --watch`` redrawing the screen, a progress line's
    ``\\r``) go through :meth:`control`. Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text))

    def control(self, sequence: str) -> None:
        """Write the command's own terminal control ``sequence`` as it is."""
        self._stream.write(sequence)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def control(stream: TextIO, sequence: str) -> None:
    """Write the terminal control ``sequence`` to ``stream`` unescaped, through
    :meth:`SafeText.control` when it is one."""
    if isinstance(stream, SafeText):
        stream.control(sequence)
    else:
        stream.write(sequence)


def json_text(text: str) -> str:
    """JSON ``text`` with the characters :func:`printable` escapes written as JSON's own
    ``\\uXXXX`` escapes: still exact JSON (a reader gets the same strings back), and nothing in
    it for a terminal to obey. JSON escapes C0 controls itself; C1 controls and bidi overrides
    it may write raw, and they can only stand inside strings, where ``\\uXXXX`` means them."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def configure_logging(level: str) -> None:
    log_to_terminal(level, "%(asctime)s %(levelname)s %(name)s: %(message)s")
