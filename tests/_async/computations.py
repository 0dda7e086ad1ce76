"""Compute functions for cache tests: count their calls, sleep, fail, or hold, as asked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from corral._async._compat import Event
from tests._async.concurrency import sleep


class Counter:
    """A compute function that counts its calls and returns the count (or `value`)."""

    def __init__(self, value: Any = None, delay: float = 0.0, fail: bool = False) -> None:
        self.calls = 0
        self.value = value
        self.delay = delay
        self.fail = fail

    async def __call__(self) -> Any:
        self.calls += 1
        if self.delay:
            await sleep(self.delay)
        if self.fail:
            raise RuntimeError("the source is down")
        return self.calls if self.value is None else self.value


class Gated(Counter):
    """A computation still running until the test says: `entered` is set once it runs
    (its caller holds the recompute lock then), and it returns once `release` is set.

    A test waits on `entered` rather than sleeping, since a paused process may not
    have started the computation yet, and a sleeping one may have finished already.
    The wait for `release` is bounded, so a failing test still ends.
    """

    def __init__(self, value: Any = None) -> None:
        super().__init__(value)
        self.entered = Event()
        self.release = Event()

    async def __call__(self) -> Any:
        self.entered.set()
        await self.release.wait(30)
        return await super().__call__()


async def until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Poll until `condition()` holds (callers of other tasks or threads got somewhere)."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await sleep(0.01)
    pytest.fail(f"not within {seconds} s: {what}")
