"""Text a person's terminal shows, made harmless: job text (errors, log lines, progress messages,
cancel reasons), worker names and the names of planted files are written by handlers and group
members, and a terminal obeys the control characters in what it prints (``ESC ] 0;`` retitles
the window, ``ESC [ 2J`` clears it, a bidi override reorders what the operator reads). Every
human-readable line the command line prints goes through :func:`printable`; ``--json`` output
does not, since JSON escapes control characters itself and must stay exact."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, the C1 controls (U+0080-U+009F: a terminal may read
# U+009B as CSI), and the bidirectional overrides, embeddings and isolates (Trojan Source).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with every character that could drive a terminal written as a visible escape
    (``\\x1b``, ``\\u202e``); tabs kept, and newlines kept unless ``newlines`` is False (a
    table cell or a one-line field, where a newline would break the layout)."""
    out = _UNSAFE.sub(_escape, text)
    return out if newlines else out.replace("\n", "\\n")
