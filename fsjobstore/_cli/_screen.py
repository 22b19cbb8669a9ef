"""What the operator's commands (list, status, purge, bulk retry/cancel) print for a person: tables
fitted to the terminal, short ages, and a progress line on stderr that only a terminal gets."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from ._terminal import control

ELLIPSIS = "…"


def width() -> int:
    """The terminal's width (``COLUMNS`` first, as ``shutil`` reads it), 80 when there is none
    (``status`` piped; ``list`` piped is not cut at all: :func:`room`)."""
    return max(20, shutil.get_terminal_size((80, 24)).columns)


def room(stream: TextIO) -> int | None:
    """The width to fit ``stream``'s text to: ``COLUMNS`` when set (the user asked), else the
    terminal's width, else None: piped text goes to a file or a program, and cutting it there
    would lose what a person reading a terminal would only have had cut for the screen."""
    if os.environ.get("COLUMNS", "").strip().isdigit() or stream.isatty():
        return width()
    return None


def height() -> int:
    """The terminal's height (``LINES`` first), 24 when there is none."""
    return max(5, shutil.get_terminal_size((80, 24)).lines)


def ago(seconds: float) -> str:
    """A short age: ``42s``, ``7m``, ``3h``, ``5d``, ``12w`` (the unit it is most of)."""
    s = max(0, int(seconds))
    for unit, size in (("w", 604_800), ("d", 86_400), ("h", 3_600), ("m", 60)):
        if s >= size * (2 if unit == "w" else 1):
            return f"{s // size}{unit}"
    return f"{s}s"


def cut(text: str, room: int) -> str:
    """``text`` in at most ``room`` characters, its end replaced by an ellipsis when cut."""
    if len(text) <= room:
        return text
    return text[: max(0, room - 1)] + ELLIPSIS if room > 0 else ""


def fit_line(line: str, room: int) -> str:
    return cut(line, room).rstrip()


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # numbers: aligned right
    shrink_to: int | None = None  # the one column that may be cut (to at least this), e.g. a request
    drop: int = 0  # when even that is not enough: columns with the highest ``drop`` go first; 0 never


def table(columns: Sequence[Column], rows: Sequence[Sequence[str]], room: int) -> list[str]:
    """Aligned lines of ``rows`` under the headers, in ``room`` columns: the shrinkable column is
    cut first, then droppable columns go (highest ``drop`` first). A column that is never dropped
    nor shrunk (a job id, which must stay whole to be pasted) is never cut: a line holding only
    such columns may be wider than ``room``."""
    keep = list(range(len(columns)))
    natural = [max([len(columns[i].header)] + [len(r[i]) for r in rows]) for i in range(len(columns))]
    while True:
        widths = {i: natural[i] for i in keep}
        total = sum(widths.values()) + 2 * (len(keep) - 1)
        for i in keep:
            low = columns[i].shrink_to
            if total > room and low is not None and widths[i] > low:
                cut_by = min(widths[i] - max(low, len(columns[i].header)), total - room)
                widths[i] -= cut_by
                total -= cut_by
        droppable = [i for i in keep if columns[i].drop]
        if total <= room or not droppable:
            break
        keep.remove(max(droppable, key=lambda i: columns[i].drop))
    lines = []
    for cells in [[c.header for c in columns], *rows]:
        parts = []
        for i in keep:
            text = cut(cells[i], widths[i])
            parts.append(text.rjust(widths[i]) if columns[i].right else text.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return lines


class Progress:
    """``progress(done)`` for a long command: ``purged 12,000...`` on stderr, redrawn in place
    with ``\\r`` at most every ``every`` seconds, and only when stderr is a terminal (piped into
    a log, a line per redraw would be noise). :meth:`end` clears the line before the result is
    printed."""

    def __init__(self, verb: str, stream: TextIO | None = None, every: float = 0.1) -> None:
        self.verb = verb
        self.stream = stream or sys.stderr
        self.on = self.stream.isatty()
        self.every = every
        self.drawn = False
        self.last = 0.0

    def __call__(self, done: int) -> None:
        if not self.on:
            return
        now = time.monotonic()
        if self.drawn and now - self.last < self.every:
            return
        self.last, self.drawn = now, True
        control(self.stream, "\r")
        self.stream.write(f"{self.verb} {done:,}...")
        control(self.stream, "\x1b[K")
        self.stream.flush()

    def end(self) -> None:
        if self.drawn:
            control(self.stream, "\r\x1b[K")
            self.stream.flush()
            self.drawn = False
