"""Charts of a peers run, drawn from its JSON (``python bench/peers.py ... --json FILE``) as SVG.

    python bench/charts.py bench/last_peers_run.json OUTDIR

Writes one SVG per workload the run measured (W2 and W4 drains at 1, 2 and 4 workers, W1 and W4
creates, W3 wake-up), and ``charts.md``: the charts with the run's command, date and commit, which
the documentation's performance page includes. Self-contained files (no fonts, scripts or styles
fetched), drawn here rather than by a plotting library so the docs need none.
"""

from __future__ import annotations

import html
import json
import os
import sys
from typing import Any

_COLORS = {"fsjobstore": "#2f6fdf"}
_OTHERS = ["#9aa5b1", "#c4a35a", "#7fb77e", "#c97b84", "#8e7cc3", "#6cb4c9", "#d39b5f"]


def _color(queue: str, everyone: list[str]) -> str:
    """One colour per queue in every chart of a run: fsjobstore's own, the others by their place
    in the run's list of peers."""
    if queue in _COLORS:
        return _COLORS[queue]
    if queue.startswith("fsjobstore ("):  # W3's two producers
        return _COLORS["fsjobstore"] if "durable=False" in queue else "#8fb3f0"
    others = [q for q in everyone if q not in _COLORS]
    return _OTHERS[others.index(queue) % len(_OTHERS)] if queue in others else _OTHERS[-1]


def bars(title: str, unit: str, groups: list[str], series: dict[str, list[float | None]],
         *, everyone: list[str] | None = None, width: int = 760, height: int = 340) -> str:
    """A grouped bar chart: one group per label of ``groups``, one bar per series in each, in the
    order of ``everyone`` (the run's queues, which also fix their colours)."""
    left, top, bottom = 70, 40, 40
    right = max(170, 40 + 7 * max((len(name) for name in series), default=0))  # the legend's width
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for vs in series.values() for v in vs if v is not None]
    peak = max(values) if values else 1.0
    step = _nice_step(peak / 5)
    ymax = step * (int(peak / step) + 1)
    everyone = everyone or list(series)
    order = [q for q in everyone if q in series] + [q for q in series if q not in everyone]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="{left}" y="22" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    k = 0.0
    while k <= ymax + 1e-9:
        y = top + plot_h - k / ymax * plot_h
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e6ea"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{_tick(k, step)}</text>')
        k += step
    out.append(f'<text x="16" y="{top + plot_h / 2:.1f}" transform="rotate(-90 16 {top + plot_h / 2:.1f})" '
               f'text-anchor="middle" fill="#555">{html.escape(unit)}</text>')
    group_w = plot_w / max(1, len(groups))
    bar_w = group_w * 0.8 / max(1, len(order))
    for g, label in enumerate(groups):
        x0 = left + g * group_w + group_w * 0.1
        for s, name in enumerate(order):
            v = series[name][g]
            if v is None:
                continue
            h = v / ymax * plot_h
            x = x0 + s * bar_w
            out.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                       f'fill="{_color(name, everyone)}"><title>{html.escape(name)}, {html.escape(label)}: '
                       f'{_fmt(v)} {html.escape(unit)}</title></rect>')
        out.append(f'<text x="{left + g * group_w + group_w / 2:.1f}" y="{top + plot_h + 18}" '
                   f'text-anchor="middle">{html.escape(label)}</text>')
    for s, name in enumerate(order):
        y = top + 10 + s * 20
        weight = ' font-weight="bold"' if name.startswith("fsjobstore") else ""
        mark = _color(name, everyone)
        out.append(f'<rect x="{left + plot_w + 16}" y="{y - 10}" width="12" height="12" fill="{mark}"/>')
        out.append(f'<text x="{left + plot_w + 34}" y="{y}"{weight}>{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 0.1
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= raw:
            return m * magnitude
    return 10 * magnitude


def _tick(v: float, step: float) -> str:
    return f"{v:,.0f}" if step >= 1 else f"{v:.1f}"


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else (f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def charts(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(file name, caption, SVG) of each chart the run's figures allow."""
    f = doc["figures"]
    everyone = doc["run"]["peers"]
    out = []
    for key, what in (("W2", "fsync off"), ("W4", "fsync on")):
        drain = f.get(f"{key}-drain")
        if not drain:
            continue
        queues = list(dict.fromkeys(k.rsplit("/", 1)[0] for k in drain))
        series = {q: [drain.get(f"{q}/{w}") for w in (1, 2, 4)] for q in queues}
        out.append((f"{key.lower()}-drain.svg", f"{key} drain, {what}: jobs/s by worker processes (higher is better)",
                    bars(f"{key} drain ({what})", "jobs/s", ["1 worker", "2 workers", "4 workers"], series,
                         everyone=everyone)))
    creates = {k: f[f"{k}-create"] for k in ("W1", "W4") if f.get(f"{k}-create")}
    if creates:
        queues = list(dict.fromkeys(q for rates in creates.values() for q in rates))
        labels = [{"W1": "fsync off (W1)", "W4": "fsync on (W4)"}[k] for k in creates]
        series = {q: [creates[k].get(q) for k in creates] for q in queues}
        out.append(("create.svg", "Creating jobs from one process: jobs/s (higher is better)",
                    bars("Create", "jobs/s", labels, series, everyone=everyone)))
    wake = {k[3:]: v for k, v in f.items() if k.startswith("W3-")}
    if wake:
        series = {q: [v[0], v[4]] for q, v in wake.items()}
        everyone = [q for p in everyone for q in series if q == p or q.startswith(f"{p} ")]
        out.append(("w3-wakeup.svg", "Wake-up of an idle worker in another process: ms, p50 (lower is better)",
                    bars("W3 wake-up, p50", "ms", ["from just before put", "from put's return"], series,
                         everyone=everyone)))
    return out


def write(json_path: str, out_dir: str) -> list[str]:
    """Write the charts and ``charts.md`` into ``out_dir``; returns the files written."""
    with open(json_path) as fh:
        doc = json.load(fh)
    os.makedirs(out_dir, exist_ok=True)
    run = doc["run"]
    lines = [f"From `{run['command']}`, {run['started']} to {run['finished']}, fsjobstore at "
             f"{run.get('commit') or 'an unknown commit'}, {run['cores']} cores, {run['jobs']:,} jobs a run, "
             f"medians of {run['repeat']} (`bench/{os.path.basename(json_path)}`; drawn by `bench/charts.py`).", ""]
    written = []
    for name, caption, svg in charts(doc):
        path = os.path.join(out_dir, name)
        with open(path, "w") as fh:
            fh.write(svg)
        written.append(path)
        lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
    with open(os.path.join(out_dir, "charts.md"), "w") as fh:
        fh.write("\n".join(lines))
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    for path in write(sys.argv[1], sys.argv[2]):
        print(path)
