"""Queue-name patterns: FORMAT.md, "Interest and subscriptions".

Interest is a queue name or a **pattern** over queue names: a glob (``*``, ``?``, ``[...]``,
``[!...]``), told apart from a name by holding one of ``*?[``, which no queue name may hold. A
puller (``pull_work(queues=...)``, a ``Worker``'s handlers) whose queues hold a pattern takes jobs
of every queue it matches, one puller each job, as for a list of names (scope **any**); a
subscription (``_relations._subscriptions``) copies every job of the queues it matches (scope
**all**).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from .._errors import InvalidRequest
from ._codec import check_queue_name

_GLOB = frozenset("*?[")
_PATTERN_RE = re.compile(r"[A-Za-z0-9_\-*?\[\]!]{1,128}\Z")


def is_pattern(text: str) -> bool:
    return not _GLOB.isdisjoint(text)


def check_interest(text: object, what: str = "queues") -> str:
    """A queue name, or a pattern over queue names (checked: it must be able to match one)."""
    if isinstance(text, str) and is_pattern(text):
        if not _PATTERN_RE.match(text) or text.count("[") != text.count("]"):
            raise InvalidRequest(f"{what}: {text!r} is not a pattern over queue names (a glob of letters, digits, "
                                 "_ and -, with *, ?, [...] and [!...]; at most 128 characters)")
        return text
    try:
        return check_queue_name(text, what)
    except InvalidRequest as exc:
        if isinstance(text, str) and any(c in text for c in "{},./"):
            raise type(exc)(f"{exc} (a pattern over queue names is a glob: *, ?, [...] and [!...]; "
                            "no {a,b}, dots or slashes)") from None
        raise


def check_queues(queues: object, what: str = "queues") -> list[str] | None:
    """A puller's ``queues=`` checked: None (every queue), or its names and patterns (one given
    as a string counts as a list of one)."""
    if queues is None:
        return None
    wanted = [queues] if isinstance(queues, str) else queues
    if not isinstance(wanted, (list, tuple, set, frozenset)):
        raise InvalidRequest(f"{what} must be a queue name, a pattern or a list of them, got {queues!r}")
    return [check_interest(q, what) for q in wanted]


def matches(pattern: str, queue: str) -> bool:
    return fnmatch.fnmatchcase(queue, pattern)


def expand(interest: Iterable[str], queues: Iterable[str]) -> list[str]:
    """The queues among ``queues`` that ``interest`` names or matches, names first as given."""
    known = list(queues)
    out: list[str] = []
    for item in interest:
        found = [q for q in known if matches(item, q)] if is_pattern(item) else [item]
        out += [q for q in found if q not in out]
    return out
