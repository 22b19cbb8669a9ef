"""A bucket's names are counted all at once (one match over the names joined by NUL): the same
answer as matching each name on its own, whatever else is planted among them."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from fsjobstore._format._layout import FINISHED_RE, PENDING_RE
from fsjobstore._transitions._stats import _finished_bucket, _pending_bucket

_DIGITS = st.text("0123456789", min_size=0, max_size=22)
_WORD = st.text("abcXYZ019_-.\n \t/é", min_size=0, max_size=12)


@st.composite
def _pending_name(draw: st.DrawFn) -> str:
    prio, seq, ident = draw(_DIGITS), draw(_DIGITS), draw(_WORD)
    if draw(st.booleans()):  # mostly well-formed
        prio, seq = prio.ljust(7, "0")[:7], seq.ljust(20, "1")[:20]
        ident = ident.strip(".\n \t/é-") or "job"
    before, after = draw(st.sampled_from(["", ".", "x"])), draw(st.sampled_from(["", ".tmp", "\n"]))
    return f"{before}{prio}.{seq}.{ident}.json{after}"


@st.composite
def _finished_name(draw: st.DrawFn) -> str:
    fin, exp = draw(_DIGITS), draw(_DIGITS)
    state = draw(st.sampled_from(["fulfilled", "failed", "cancelled", "pending", "fulfilledx"]))
    queue, ident = draw(_WORD), draw(_WORD)
    if draw(st.booleans()):
        fin, exp = fin.ljust(17, "2")[:17], exp.ljust(17, "3")[:17]
        queue, ident = queue.strip(".\n \t/é-") or "q", ident.strip(".\n \t/é-") or "j"
    return f"{fin}.{exp}.{state}.{queue}.{ident}" + draw(st.sampled_from(["", "\n", ".json"]))


def _one_by_one_pending(names: list[str]) -> tuple[int, int | None]:
    seqs = [int(m["seq"]) for m in map(PENDING_RE.match, names) if m]
    return len(seqs), min(seqs, default=None)


def _one_by_one_finished(names: list[str]) -> dict[str, int]:
    found = Counter(f"{m['state']}.{m['queue']}" for m in map(FINISHED_RE.match, names) if m)
    return dict(found)


@settings(max_examples=400)
@given(st.lists(st.one_of(_pending_name(), _WORD), max_size=30))
def test_a_pending_bucket_counted_at_once_counts_what_matching_each_name_counts(names: list[str]) -> None:
    assert _pending_bucket(names) == _one_by_one_pending(names)


@settings(max_examples=400)
@given(st.lists(st.one_of(_finished_name(), _WORD), max_size=30))
def test_a_finished_bucket_counted_at_once_counts_what_matching_each_name_counts(names: list[str]) -> None:
    assert _finished_bucket(names) == _one_by_one_finished(names)
