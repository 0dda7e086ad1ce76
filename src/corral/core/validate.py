"""Argument checks shared by every entry point, so bad input fails the same way everywhere.

They run before any I/O, which is what guarantees that bad input never leaves
a lock held or an entry half-written.
"""

from __future__ import annotations

import math

from corral.errors import ConfigError

__all__ = [
    "check_limit",
    "check_name",
    "check_non_negative",
    "check_timeout",
    "check_ttl",
    "check_wait",
]


def check_name(name: object, what: str = "lock name") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be str, not {type(name).__name__}")
    if not name:
        raise ConfigError(f"{what} must not be empty")
    return name


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number of seconds, not {value!r}")
    number = float(value)
    if math.isnan(number):
        raise ConfigError(f"{what} must be a number of seconds, not NaN")
    return number


def check_ttl(ttl: object, what: str = "ttl") -> float:
    """A TTL must be positive and finite: an infinite lease is a lock held forever."""
    seconds = _number(ttl, what)
    if seconds <= 0 or math.isinf(seconds):
        raise ConfigError(f"{what} must be > 0 and finite, got {ttl!r}")
    if seconds < 0.001:
        raise ConfigError(f"{what} must be at least 0.001 s (1 ms), got {ttl!r}")
    return seconds


def check_wait(wait: object, what: str = "wait") -> float | None:
    """None waits forever; a number must be >= 0."""
    if wait is None:
        return None
    seconds = _number(wait, what)
    if seconds < 0:
        raise ConfigError(f"{what} must be >= 0 or None (forever), got {wait!r}")
    return None if math.isinf(seconds) else seconds


# The most slots a semaphore may have: beyond it a "semaphore" no longer limits anything.
MAX_LIMIT = 2**31 - 1


def check_limit(limit: object) -> int:
    """A semaphore's limit: an int >= 1 (a float such as 2.5 is a mistake, not a limit)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ConfigError(f"limit must be an int >= 1, not {limit!r}")
    if limit < 1 or limit > MAX_LIMIT:
        raise ConfigError(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def check_non_negative(value: object, what: str) -> float:
    seconds = _number(value, what)
    if seconds < 0 or math.isinf(seconds):
        raise ConfigError(f"{what} must be >= 0 and finite, got {value!r}")
    return seconds


def check_timeout(value: object, where: str = "") -> float:
    """A backend's `timeout` option: seconds > 0 and finite, given as a number or, from a
    URL's query string, as text. `where` (the redacted URL) prefixes the message."""
    prefix = f"{where}: " if where else ""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(
                f"{prefix}timeout must be a number of seconds, not {value!r}"
            ) from None
    try:
        seconds = _number(value, "timeout")
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}") from None
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigError(f"{prefix}timeout must be > 0 and finite, got {value!r}")
    return seconds
