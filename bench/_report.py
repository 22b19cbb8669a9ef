"""How the benches print: markdown tables and ratios (bench/peers.py and its workload modules),
and the commit a run measured (every bench that names it)."""

from __future__ import annotations

import subprocess


def commit(where: str) -> str | None:
    """The short commit of the git checkout holding the directory ``where``; None outside git."""
    try:
        done = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(header)]
    lines = [f"\n### {title}", "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join(lines)


def ratio(ours: float | None, theirs: float | None, *, lower_is_better: bool = False) -> str:
    if not ours or not theirs:
        return ""
    r = theirs / ours if lower_is_better else ours / theirs
    return f"{r:.2f}x"


def checks(dups: int, lost: int, extra: int = 0, suffix: str = "e") -> str:
    """The exactly-once figures as the drain tables show them: (duplicates/losses[/extra])."""
    return f"({dups}/{lost}{f'/{extra}{suffix}' if extra else ''})"
