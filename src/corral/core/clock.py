"""Clocks, injected so deadline and renewal logic can be tested without sleeping."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "SystemClock", "WallClock"]


class Clock(Protocol):
    """A monotonic source of seconds. Only differences between readings matter."""

    def now(self) -> float: ...


class SystemClock:
    """The process's monotonic clock: immune to wall-clock jumps (NTP, DST)."""

    def now(self) -> float:
        return time.monotonic()


class WallClock:
    """Seconds since the epoch: what cache entries' freshness is written in, so that
    every process (and machine) reading an entry can judge it."""

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to, for exact and instant tests."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
