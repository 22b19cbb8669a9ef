"""What the pages' templates call: ages and times in words, JSON shown whole, the throughput
chart as inline SVG (drawn here from numbers only, so no job text ever reaches it unescaped)."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup


def age(seconds: float | None) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``; an em dash for None."""
    if seconds is None:
        return "\u2014"
    s = max(0.0, float(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.0f}{unit}" if s / size >= 10 else f"{s / size:.1f}{unit}".replace(".0", "")
    return f"{s:.0f}s" if s >= 1 else f"{s * 1000:.0f}ms"


def ago(at: float | None) -> str:
    """How long ago epoch ``at`` was (``in 5m`` for a time to come)."""
    if at is None:
        return "\u2014"
    delta = time.time() - at
    return f"{age(delta)} ago" if delta >= 0 else f"in {age(-delta)}"


def when(at: float | None) -> str:
    """Epoch seconds as an ISO time in UTC, to the second."""
    if at is None:
        return "\u2014"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def pretty(value: Any) -> str:
    """A JSON document, indented (escaped by the template like any text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def compact(value: Any) -> str:
    """A JSON document on one line, as the store keeps it (escaped by the template)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def value_text(doc: dict[str, Any] | None) -> str:
    """A fulfilled job's stored value (``Job.to_dict()['value']``) as text to show."""
    if doc is None:
        return ""
    if doc.get("encoding") == "json":
        return pretty(doc.get("data"))
    return f"({doc.get('encoding')}) {doc.get('data')}"


def rst(text: str | None) -> Markup:
    """A docstring's ``code`` shown as code (everything else escaped): the API's docs page."""
    escaped = str(Markup.escape(text or ""))
    return Markup(re.sub(r"``(.+?)``", r"<code>\1</code>", escaped))


def sparkline(rows: list[list[int]], width: int = 144, height: int = 30, per_bar: int = 5) -> Markup:
    """The last hour of a queue at a glance: a bar per ``per_bar`` minutes of jobs fulfilled
    (and, stacked on them, failed), scaled to the busiest bar, on a baseline, with the hour's
    totals beside it. ``rows`` as ``[minute, fulfilled, failed]``, oldest first. A bar per
    minute would be 2 px wide, and an hour whose work fell in one minute would show as a hairline."""
    if not rows:
        return Markup("")
    bars = [rows[i:i + per_bar] for i in range(0, len(rows), per_bar)]
    sums = [(sum(r[1] for r in b), sum(r[2] for r in b)) for b in bars]
    peak = max((ok + bad for ok, bad in sums), default=0) or 1
    step = width / len(bars)
    parts = [f'<line class="base" x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}"/>']
    for i, (ok, bad) in enumerate(sums):
        x = i * step + 1
        # A bar of any work is at least 3 px tall: one job in a busy hour is still seen.
        h_ok = max(3.0, (height - 2) * ok / peak) if ok else 0.0
        h_bad = max(3.0, (height - 2) * bad / peak) if bad else 0.0
        if ok:
            parts.append(f'<rect class="ok" x="{x:.1f}" y="{height - 1 - h_ok:.1f}" width="{step - 2:.1f}" '
                         f'height="{h_ok:.1f}"/>')
        if bad:
            parts.append(f'<rect class="bad" x="{x:.1f}" y="{height - 1 - h_ok - h_bad:.1f}" width="{step - 2:.1f}" '
                         f'height="{h_bad:.1f}"/>')
    total_ok = sum(ok for ok, _ in sums)
    total_bad = sum(bad for _, bad in sums)
    label = (f"last hour: {total_ok:,} fulfilled, {total_bad:,} failed "
             f"(bars of {per_bar} minutes, the busiest {peak:,} jobs)")
    shown = f'{total_ok:,} ok' + (f' · <span class="bad">{total_bad:,} failed</span>' if total_bad else "")
    return Markup(f'<span class="spark-box"><svg class="spark" viewBox="0 0 {width} {height}" width="{width}" '
                  f'height="{height}" role="img" aria-label="{label}"><title>{label}</title>{"".join(parts)}</svg>'
                  f'<span class="spark-label">{shown}</span></span>')


FILTERS = {"compact": compact, "age": age, "ago": ago, "when": when, "pretty": pretty, "value_text": value_text,
           "sparkline": sparkline, "rst": rst}
