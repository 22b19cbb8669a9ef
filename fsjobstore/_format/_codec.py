"""Strict JSON in and out, and the validation of names that become filenames.

Python's json module accepts NaN, Infinity and duplicate keys by default and will write lone
surrogates; a job store shared between processes and languages must do none of that.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

from .._errors import InvalidJobId, InvalidName, InvalidQueueName, InvalidRequest

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
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
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
    UTF-8 text, and base64 otherwise. (Callers check JSON values with ``_codec.canonical``.)"""
    if not isinstance(value, bytes):
        return {"encoding": "json", "data": value}
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not _ESCAPES_BADLY.search(text):
        return {"encoding": "utf-8", "data": text}
    return {"encoding": "base64", "data": base64.b64encode(value).decode("ascii")}
