"""Checking and normalising what callers hand in: values, errors, times, retry delays."""

from __future__ import annotations

import random
import traceback
from datetime import datetime, timedelta
from typing import Any

from ._codec import canonical
from ._errors import InvalidRequest, ValueTooLarge

MAX_ERROR_CHARS = 64 * 1024


def default_backoff(attempt: int) -> float:
    """Seconds before retry number ``attempt``: 1, 2, 4, ... capped at 300, times a random
    factor in [0.5, 1) so that jobs failed together do not retry together."""
    return min(300.0, 2.0 ** max(0, attempt - 1)) * random.uniform(0.5, 1.0)


def due_time(now: float, delay: float | timedelta | None, run_at: float | datetime | None) -> float | None:
    """The epoch time a new job becomes due, or None for now."""
    if delay is not None and run_at is not None:
        raise InvalidRequest("give delay or run_at, not both")
    if delay is not None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < 1e9:
            raise InvalidRequest(f"delay must be a non-negative number of seconds, got {delay!r}")
        return now + seconds if seconds > 0 else None
    if run_at is not None:
        if isinstance(run_at, datetime):
            if run_at.tzinfo is None:
                raise InvalidRequest("run_at must be a timezone-aware datetime (naive times are ambiguous)")
            return run_at.timestamp()
        if isinstance(run_at, bool) or not isinstance(run_at, int | float) or not 0 <= run_at < 1e11:
            raise InvalidRequest(f"run_at must be epoch seconds or an aware datetime, got {run_at!r}")
        return float(run_at)
    return None


def check_timeout(value: Any, what: str) -> float | None:
    """A per-attempt time limit: None, or a positive number of seconds (a timedelta too)."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < 1e9:
        raise InvalidRequest(f"{what} must be a positive number of seconds or None, got {value!r}")
    return float(seconds)


def retry_delay(delay: Any) -> float | None:
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0):
        raise InvalidRequest(f"delay must be a non-negative number of seconds, got {delay!r}")
    return None if delay is None else float(delay)


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
