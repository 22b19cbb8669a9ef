"""What callers hand in, checked, and the JSON that goes out: the one gate of values into the store.

* **JSON**, strict in and out: Python's json module accepts NaN, Infinity and duplicate keys by
  default and will write lone surrogates; a job store shared between processes and languages must
  do none of that.
* **Names** that become filenames (ids, queues), and **patterns** over queue names: a glob (``*``,
  ``?``, ``[...]``, ``[!...]``), told apart from a name by holding one of ``*?[``, which no queue
  name may hold (FORMAT.md, "Interest and subscriptions"). A puller whose queues hold a pattern
  takes jobs of every queue it matches (scope **any**); a subscription (``_relations._subscriptions``)
  copies every job of the queues it matches (scope **all**).
* **Numbers, durations, errors, keys** and the other arguments: checked and normalised, so bad
  input raises before anything is written.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import math
import random
import re
import traceback
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from .._errors import InvalidJobId, InvalidName, InvalidQueueName, InvalidRequest, ValueTooLarge

# Ids and queue names become parts of filenames, joined by dots: so no dots, no slashes, no
# leading dash (would read as an option in shell tools), ASCII only, bounded length.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\Z")
MAX_ID_LENGTH = 128
MAX_QUEUE_LENGTH = 64
# The queue-name rule, written once: FORMAT.md's <queue>. _layout builds its filename patterns
# from QUEUE_PATTERN and uses QUEUE_NAME_RE itself, so the store, the runtime and the file
# grammar cannot drift apart.
# The deepest nesting of arrays and objects the store accepts in a request, a value or a target
# (a scalar is depth 0, ``[1]`` depth 1). Every layer must be able to serve what the store
# accepts: the JSON API's serialiser refuses values nested some 250 levels deep, so the store
# stops well short of that.
MAX_NESTING = 64
QUEUE_PATTERN = rf"[A-Za-z0-9_][A-Za-z0-9_-]{{0,{MAX_QUEUE_LENGTH - 1}}}"
QUEUE_NAME_RE = re.compile(rf"{QUEUE_PATTERN}\Z")


def check_name(value: object, *, what: str, max_length: int, error: type[InvalidName] = InvalidName) -> str:
    """Return ``value`` if it is a safe name part, else raise ``error`` naming why."""
    if not isinstance(value, str):
        raise error(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise error(f"{what} must not be empty")
    if len(value) > max_length:
        raise error(f"{what} is {len(value)} characters long; the limit is {max_length}")
    if not _NAME_RE.match(value):
        raise error(
            f"{what} {value!r} is not a safe name: use ASCII letters, digits, '_' and '-' "
            "(not first), with no dots, slashes, spaces or NUL"
        )
    return value


def check_job_id(value: object) -> str:
    return check_name(value, what="job id", max_length=MAX_ID_LENGTH, error=InvalidJobId)


def check_queue_name(name: object, what: str = "queue") -> str:
    """Return ``name`` if it is a queue name the store accepts (FORMAT.md, "Names"), else raise
    :class:`InvalidQueueName` naming ``what`` was given and what is wrong with it. Public: the
    worker runtime and users' tools check names with it before anything starts."""
    if not isinstance(name, str):
        raise InvalidQueueName(f"{what} must be a str (a queue name), not {type(name).__name__}")
    if QUEUE_NAME_RE.match(name):
        return name
    if not name:
        problem = "it is empty"
    elif len(name) > MAX_QUEUE_LENGTH:
        problem = f"it is {len(name)} characters long; the limit is {MAX_QUEUE_LENGTH}"
    else:
        problem = "use ASCII letters, digits, '_' and '-' (not first), with no dots, slashes, spaces or NUL"
    raise InvalidQueueName(f"{what} {name!r} is not a queue name: {problem}")


def dumps(obj: Any, *, what: str = "value", sort_keys: bool = False) -> bytes:
    """Serialise ``obj`` as strict UTF-8 JSON, or raise :class:`InvalidRequest` saying why."""
    try:
        return (_SORTED if sort_keys else _ENCODER).encode(obj).encode("utf-8")
    except (TypeError, ValueError) as exc:
        # TypeError: not serialisable; ValueError: NaN/Infinity or a circular reference.
        raise InvalidRequest(f"{what} is not strict JSON: {exc}") from None
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{what} contains a lone surrogate and cannot be UTF-8: {exc}") from None
    except RecursionError:
        raise InvalidRequest(f"{what} is nested too deeply to serialise; the limit is {MAX_NESTING} levels "
                             "(fsjobstore.MAX_NESTING)") from None


def canonical(obj: Any, *, what: str) -> tuple[bytes, Any]:
    """``obj`` as strict JSON bytes, and the value a reader of those bytes gets back.

    Python's json writes what it cannot keep: tuples become lists, non-string keys become
    strings (``{1: "a", "1": "b"}`` even becomes an object with a duplicate key, which strict
    readers refuse). Returning what was stored, and refusing what cannot be read back, keeps
    what a caller is told identical to what any later reader sees.
    """
    data = dumps(obj, what=what)
    try:
        value = loads(data)
    except ValueError as exc:
        raise InvalidRequest(f"{what} cannot be stored as JSON and read back: {exc}") from None
    check_nesting(value, what=what, encoded=data)
    return data, value


def check_nesting(value: Any, *, what: str, encoded: bytes | None = None) -> None:
    """Raise :class:`InvalidRequest` if ``value`` (JSON: lists, dicts and scalars) nests arrays
    and objects deeper than ``MAX_NESTING``, naming ``what``, its depth and the limit.

    ``encoded``, the value's JSON, makes the common case free: a value whose text holds no more
    than ``MAX_NESTING`` brackets and braces (counted in C, strings included) cannot nest deeper,
    so only a value with many of them is walked."""
    if encoded is not None and encoded.count(b"[") + encoded.count(b"{") <= MAX_NESTING:
        return
    depth = nesting(value)
    if depth > MAX_NESTING:
        raise InvalidRequest(f"{what} is nested {depth} levels deep (arrays and objects); the limit is "
                             f"{MAX_NESTING} (fsjobstore.MAX_NESTING)")


def nesting(value: Any) -> int:
    """How deeply ``value`` nests lists/tuples and dicts (a scalar is 0, ``[1]`` is 1). Walked
    with a stack of its own, not by recursion, so any depth Python can hold is measured."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # in C; a key met twice makes it shorter than the pairs
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {key!r}")
    return out


def loads(data: bytes) -> Any:
    """Parse strict JSON; raises ``ValueError`` (with the cause) on anything else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
    if text.startswith("\ufeff"):
        raise ValueError("starts with a byte order mark")
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None


# Built once: json.dumps and json.loads build a new encoder or decoder on every call that passes
# options, which cost more than encoding or decoding a small record.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
_SORTED = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)


def target_key(target: Any) -> str:
    """A filename-safe digest naming a notification target; equal JSON values share it."""
    canonical = dumps(target, what="target", sort_keys=True)
    return hashlib.sha256(canonical).hexdigest()[:32]


# Control characters other than tab/newline/CR become 6-byte \uXXXX escapes in JSON; without
# them, escaping at most doubles the text ('"' and '\\'), so records stay under the read cap.
_ESCAPES_BADLY = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def encode_value(value: Any) -> dict[str, Any]:
    """A JSON value is stored as itself; bytes are readable with ``cat`` when they are plain
    UTF-8 text, and base64 otherwise. (Callers check JSON values with ``_values.canonical``.)"""
    if not isinstance(value, bytes):
        return {"encoding": "json", "data": value}
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not _ESCAPES_BADLY.search(text):
        return {"encoding": "utf-8", "data": text}
    return {"encoding": "base64", "data": base64.b64encode(value).decode("ascii")}


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


MAX_ERROR_CHARS = 64 * 1024
MAX_KEY = 512  # characters of a unique or concurrency key
MAX_PARENTS = 1000  # jobs one job may wait for
FAILURES = ("cancel", "run")  # what a child does when a parent does not end fulfilled
# Each attempt's error is kept in the job's record (Job.attempt_errors): the last
# MAX_ATTEMPT_ERRORS attempts, each cut to ATTEMPT_ERROR_CHARS, so a job file stays small
# however often it is retried. The last error is also kept whole (up to MAX_ERROR_CHARS) in ``error``.
MAX_ATTEMPT_ERRORS = 10
ATTEMPT_ERROR_CHARS = 4096
# The shortest lease a store accepts. A holder beats every lease/4 and calls itself stalled
# (every claim it holds may be taken over) 0.75 lease after the last beat that landed; below
# half a second that leaves under 375 ms for a beat, which one slow fsync or a loaded 2-core
# host can exceed, and then healthy workers lose their jobs. The tests' shortest is 0.8 s.
MIN_LEASE_DURATION = 0.5
# The shortest heartbeat interval: shorter only spins (a beat is a write to the owner file).
MIN_HEARTBEAT_INTERVAL = 0.01


def number(value: object, what: str, *, at_least: float | None = None, above: float | None = None,
           below: float | None = None, at_most: float | None = None,
           error: type[Exception] = InvalidRequest) -> float:
    """``value`` as a float, if it is a finite real number (not a bool, not NaN, not an
    infinity) within the bounds given; otherwise raise ``error`` naming ``what``, the bounds and
    the value. The one numeric check of the store layer: every number a caller or a file hands
    in goes through it or :func:`integer`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise error(f"{what} must be a finite number{_bounds(at_least, above, below, at_most)}, got {value!r}")
    if ((at_least is not None and value < at_least) or (above is not None and value <= above)
            or (below is not None and value >= below) or (at_most is not None and value > at_most)):
        raise error(f"{what} must be a number{_bounds(at_least, above, below, at_most)}, got {value!r}")
    return float(value)


def integer(value: object, what: str, *, at_least: int | None = None, at_most: int | None = None,
            error: type[Exception] = InvalidRequest) -> int:
    """``value`` if it is an int (not a bool) in [``at_least``, ``at_most``]; else ``error``."""
    if (isinstance(value, bool) or not isinstance(value, int) or (at_least is not None and value < at_least)
            or (at_most is not None and value > at_most)):
        raise error(f"{what} must be an integer{_bounds(at_least, None, None, at_most)}, got {value!r}")
    return value


def _bounds(at_least: float | None, above: float | None, below: float | None, at_most: float | None) -> str:
    low = _shown(at_least if at_least is not None else above)
    high = _shown(below if below is not None else at_most)
    if low is None and high is None:
        return ""
    if high is None:
        return f" >= {low}" if at_least is not None else f" > {low}"
    if low is None:
        return f" < {high}" if below is not None else f" <= {high}"
    return f" in {'[' if at_least is not None else '('}{low}, {high}{')' if below is not None else ']'}"


def _shown(bound: float | None) -> str | None:
    if bound is None:
        return None
    return str(bound) if isinstance(bound, int) else f"{bound:g}"  # no 1,000 separators: "[1, 10,000]" misreads


# A length of time, as every argument of the store that is one takes it (a job's delay, time limit
# and retention, a store's lease and retention, a purge's age, a retry's delay, a time limit's
# extension): seconds, a timedelta, or text as the command line takes it. (A call's own wait,
# ``timeout=`` of pull_work and wait, is seconds, as in the standard library's queues.)
Duration = float | timedelta | str
DURATION_UNITS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
_AMOUNT = r"(?:\d+(?:\.\d*)?|\.\d+)"
# Plain seconds ("3600", "1.5"), or amounts with units, largest first, each unit once ("1h30m").
_DURATION_TEXT = re.compile(rf"(?P<plain>{_AMOUNT})|" + "".join(rf"(?:(?P<{u}>{_AMOUNT}){u})?" for u in DURATION_UNITS))
DURATION_FORMS = "a duration such as 90s, 15m, 1h30m, 12h, 7d, 2w or plain seconds"
MAX_DURATION = 1e10  # seconds (~317 years): anything longer is a slip ("9999999999w"), not a plan


def parse_duration(value: Duration, what: str | None = None, *, forever: bool = False) -> float:
    """A length of time in seconds, from what any duration argument takes: a number of seconds,
    a ``timedelta``, or text: ``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"``, ``"1h30m"``, or
    plain seconds (``"3600"``, ``"1.5"``). With ``forever``, ``"forever"`` is ``math.inf``.
    Anything else (a negative, NaN or infinite amount, a bool, a capital unit) is
    :class:`InvalidRequest` naming ``what`` (the argument; None: said without a subject, for a
    caller that prefixes its own, as the command line does) and the accepted forms."""
    subject = f"{what} " if what else ""
    forms = f"forever, 0 (removed as soon as final) or {DURATION_FORMS}" if forever else DURATION_FORMS
    if isinstance(value, str):
        text = value.strip()
        if forever and text.lower() == "forever":
            return math.inf
        found = _DURATION_TEXT.fullmatch(text) if text else None
        if found is None:
            if text and _DURATION_TEXT.fullmatch(text.lower()):
                # Units are lower-case only: "1M" read as a minute purged what a user meaning a
                # month wanted kept; a capital is refused, with the units named.
                hint = (f", and m is minutes: there is no month unit, got {value!r}" if "M" in text
                        else f": did you mean {text.lower()!r}?")
                raise InvalidRequest(f"{what + ': ' if what else ''}units are lower-case s, m, h, d, w{hint}")
            raise InvalidRequest(f"{subject}must be {forms}, got {value!r}")
        total = sum(float(amount) * DURATION_UNITS.get(unit, 1) for unit, amount in found.groupdict().items()
                    if amount is not None)
    elif isinstance(value, timedelta):
        total = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        total = value
    else:
        raise InvalidRequest(f"{subject}must be {forms} (a number, a timedelta or text), got {value!r}")
    if not math.isfinite(total) or total < 0 or total > MAX_DURATION:
        raise InvalidRequest(f"{subject}must be {forms} (at most {MAX_DURATION:.0f} s), got {value!r}")
    return float(total)


def seconds(value: object, what: str, *, at_least: float | None = None, above: float | None = None,
            below: float | None = None) -> float:
    """A duration argument (:data:`Duration`) in seconds, checked as :func:`number`: text as
    :func:`parse_duration` reads it, a ``timedelta``, or a number."""
    if isinstance(value, str):
        value = parse_duration(value, what)
    return number(value.total_seconds() if isinstance(value, timedelta) else value, what,
                  at_least=at_least, above=above, below=below)


MAX_RETAIN = MAX_DURATION  # "forever" is said as such


def retain_seconds(value: object, what: str = "retain") -> float | None:
    """How long a job is kept once final: None (the default applies), ``math.inf`` for
    ``"forever"``, or a duration (0 = as soon as it is final and its targets have heard)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_duration(value, what, forever=True)
        if math.isinf(value):
            return math.inf
    return seconds(value, f'{what} (seconds, a timedelta, a duration such as 7d, or "forever")', at_least=0,
                   below=MAX_RETAIN)


def default_backoff(attempt: int) -> float:
    """Seconds before retry number ``attempt``: 1, 2, 4, ... capped at 300, times a random
    factor in [0.5, 1) so that jobs failed together do not retry together."""
    return min(300.0, 2.0 ** max(0, attempt - 1)) * random.uniform(0.5, 1.0)


def due_time(now: float, delay: Duration | None, run_at: float | datetime | None) -> float | None:
    """The epoch time a new job becomes due, or None for now."""
    if delay is not None and run_at is not None:
        raise InvalidRequest("give delay or run_at, not both")
    if delay is not None:
        wait = seconds(delay, "delay (seconds)", at_least=0, below=1e9)
        return now + wait if wait > 0 else None
    if run_at is not None:
        if isinstance(run_at, datetime):
            if run_at.tzinfo is None:
                raise InvalidRequest("run_at must be a timezone-aware datetime (naive times are ambiguous)")
            return run_at.timestamp()
        return number(run_at, "run_at (epoch seconds, or an aware datetime)", at_least=0, below=1e11)
    return None


def check_timeout(value: Any, what: str) -> float | None:
    """A per-attempt time limit: None, or a positive duration (:func:`seconds`)."""
    if value is None:
        return None
    return seconds(value, f"{what} (seconds, or None)", above=0, below=1e9)


def retry_delay(delay: Any) -> float | None:
    return None if delay is None else seconds(delay, "delay (seconds)", at_least=0, below=1e9)


def time_limit_error(attempt: int, timeout: float | None) -> str:
    """The error of an attempt that ran past its time limit: one wording, whoever ended it (the
    thread runtime's ``WorkLease.time_out``, or recovery after the process runtime killed the
    attempt's child, or after a live holder overran by a further lease)."""
    limit = "its time limit" if timeout is None else f"its limit of {timeout:g} s"
    return f"TimeLimitExceeded: attempt {attempt} ran past {limit}"


def result_value(value: Any, cap: int) -> Any:
    """A job's result as it will be stored: bytes stay bytes; anything else must be strict JSON,
    and comes back as a reader of the stored JSON will see it. Raises ValueTooLarge over ``cap``
    bytes (the bytes, or the serialised JSON)."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        size = len(data)
        stored: Any = data
    else:
        encoded, stored = canonical(value, what="value")
        size = len(encoded)
    if size > cap:
        raise ValueTooLarge(f"value is {size} bytes; max_value_bytes is {cap}")
    return stored


def attempt_error_text(text: str) -> str:
    """An attempt's error as ``Job.attempt_errors`` keeps it: at most ``ATTEMPT_ERROR_CHARS``,
    cut in the middle, since a traceback's first lines say where and its last line says what."""
    if len(text) <= ATTEMPT_ERROR_CHARS:
        return text
    head, tail = 1024, ATTEMPT_ERROR_CHARS - 1024 - 40
    return f"{text[:head]}\n[... {len(text) - head - tail} chars cut ...]\n{text[-tail:]}"


def error_text(error: Any) -> str:
    """An exception (with its traceback) or a string, as storable text of bounded length."""
    if isinstance(error, BaseException):
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
    elif isinstance(error, str):
        text = error
    else:
        raise InvalidRequest(f"error must be an exception or a str, not {type(error).__name__}")
    text = text.encode("utf-8", "replace").decode("utf-8")  # drop lone surrogates
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 40] + f"... [{len(text) - MAX_ERROR_CHARS + 40} chars cut]"
    return text


def lease_timing(lease_duration: object, heartbeat_interval: object) -> tuple[float, float]:
    """``JobStore``'s ``lease_duration`` and ``heartbeat_interval`` (None: a quarter of the
    lease), checked together."""
    lease = seconds(lease_duration, "lease_duration (seconds)", below=1e9)
    if lease < MIN_LEASE_DURATION:
        raise InvalidRequest(f"lease_duration must be positive and at least {MIN_LEASE_DURATION:g} s (the "
                             f"shortest lease its heartbeats can keep), got {lease_duration!r}")
    heartbeat = lease / 4 if heartbeat_interval is None else seconds(
        heartbeat_interval, "heartbeat_interval (seconds, or None)")
    if not MIN_HEARTBEAT_INTERVAL <= heartbeat <= lease / 2:
        # A holder judges itself stalled after 0.75 x lease_duration without a beat, so beats
        # must come well within that, or every beat would look like a stall.
        raise InvalidRequest(
            f"heartbeat_interval must be in [{MIN_HEARTBEAT_INTERVAL:g}, lease_duration / 2 ({lease / 2:g})] "
            f"seconds, got {heartbeat_interval!r}"
        )
    return lease, float(heartbeat)


def job_file_cap(max_value_bytes: int, max_request_bytes: int) -> int:
    """The most bytes a job file may hold. Worst cases once serialised: a text value doubles
    ('"' escapes), an error's characters can take 6 bytes each (\\uXXXX), and so can those of
    each kept attempt error; the request was measured serialised."""
    errors = MAX_ERROR_CHARS + MAX_ATTEMPT_ERRORS * ATTEMPT_ERROR_CHARS
    return 2 * max_value_bytes + max_request_bytes + errors * 6 + 65536


def check_key(key: object, what: str = "unique_key") -> str:
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY or not key.isprintable():
        long = isinstance(key, str) and len(key) > 60
        shown = f"{key[:40]!r}... ({len(key):,} characters)" if long else repr(key)  # type: ignore[index,arg-type]
        raise InvalidRequest(f"{what} must be a printable string of 1 to {MAX_KEY} characters, got {shown}")
    return key


def check_after(after: object, on_parent_failure: object) -> tuple[tuple[str, ...], str]:
    """``create``'s ``after`` (ids, checked, duplicates dropped) and ``on_parent_failure``."""
    if on_parent_failure not in FAILURES:
        raise InvalidRequest(f'on_parent_failure must be "cancel" or "run", got {on_parent_failure!r}')
    if after is None:
        return (), str(on_parent_failure)
    if isinstance(after, str) or not isinstance(after, Sequence | set | frozenset | tuple):
        raise InvalidRequest(f"after must be a list of job ids, got {after!r}")
    ids = tuple(dict.fromkeys(check_job_id(p) for p in after))
    if len(ids) > MAX_PARENTS:
        raise InvalidRequest(f"after names {len(ids)} jobs; at most {MAX_PARENTS}")
    return ids, str(on_parent_failure)
