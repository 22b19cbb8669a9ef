"""How bench/peers.py prints: markdown tables and ratios (shared by its workload modules)."""

from __future__ import annotations


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
