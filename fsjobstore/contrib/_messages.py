"""Messages as jobs: the job's request for a kombu message, and the message a request holds."""

from __future__ import annotations

import base64
import json
from typing import Any

from kombu.utils.json import dumps as kombu_dumps

import fsjobstore

_SUMMARY = ("task", "argsrepr", "kwargsrepr")  # Celery's headers, copied first so listings show them


def to_request(message: dict[str, Any]) -> dict[str, Any]:
    """The job's request for a kombu message: plain JSON, with the body decoded where it is JSON
    text, and a Celery task's name and arguments first (what a listing cut to one line shows).
    A message nested deeper than the store takes (a canvas within a canvas) keeps its body
    encoded; one deeper still in its headers is kept whole as base64 (``opaque``)."""
    doc: dict[str, Any] = json.loads(kombu_dumps(message))
    headers: dict[str, Any] = doc["headers"] if isinstance(doc.get("headers"), dict) else {}
    summary = {k: headers[k] for k in _SUMMARY if isinstance(headers.get(k), str)}
    props = doc.get("properties") or {}
    if (doc.get("content-type") == "application/json" and props.get("body_encoding") == "base64"
            and isinstance(doc.get("body"), str)):
        try:
            body = json.loads(base64.b64decode(doc["body"]).decode("utf-8"))
            json.dumps(body, allow_nan=False)
        except (ValueError, RecursionError):  # not JSON text, not strict JSON, or nested past Python's stack
            body = None
        if body is not None and _depth(body) + 2 <= fsjobstore.MAX_NESTING:
            doc["body"] = body
            props["body_encoding"] = "json"  # ours: the body is stored as JSON, and given back as text
    if _depth(doc) + 1 > fsjobstore.MAX_NESTING:
        return {**summary, "opaque": base64.b64encode(kombu_dumps(message).encode("utf-8")).decode("ascii")}
    return {**summary, **doc}


def _depth(value: Any) -> int:
    """How deep ``value`` nests arrays and objects (a scalar: 0)."""
    deepest, level, stack = 0, 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item)
    return deepest


def is_message(request: Any) -> bool:
    """Whether a job's request is a kombu message this transport stored."""
    return isinstance(request, dict) and (isinstance(request.get("properties"), dict)
                                          or isinstance(request.get("opaque"), str))


def from_request(request: dict[str, Any], token: str, redelivered: bool) -> dict[str, Any]:
    """The kombu message a job's request holds; ValueError (or another error) for one that does
    not hold one whole (a job planted in the queue, or torn)."""
    if isinstance(request.get("opaque"), str):
        message: dict[str, Any] = json.loads(base64.b64decode(request["opaque"], validate=True))
    else:
        message = {k: v for k, v in request.items() if k not in ("expires_at", *_SUMMARY)}
    if not (isinstance(message, dict) and isinstance(message.get("properties"), dict)
            and isinstance(message.get("headers", {}), dict)
            and isinstance(message["properties"].get("delivery_info", {}), dict)
            and (isinstance(message.get("body"), str) or message["properties"].get("body_encoding") == "json")
            and "body" in message):
        raise ValueError("its properties, headers, delivery_info or body are not a kombu message's")
    props = message["properties"] = dict(message.get("properties") or {})
    if props.get("body_encoding") == "json":
        text = json.dumps(message["body"], ensure_ascii=False).encode("utf-8")
        message["body"], props["body_encoding"] = base64.b64encode(text).decode("ascii"), "base64"
    # Unique per delivery: a fanout's copies share the publisher's tag, and a channel may get both.
    props["delivery_tag"] = token
    message["redelivered"] = redelivered = redelivered or bool(message.get("redelivered"))
    info = props["delivery_info"] = dict(props.get("delivery_info") or {})
    info["redelivered"] = redelivered
    return message
