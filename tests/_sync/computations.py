# Generated from tests/_async/computations.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""A compute function for cache tests: counts its calls, sleeps, fails, as asked."""

from __future__ import annotations

from typing import Any

from tests._sync.concurrency import sleep


class Counter:
    """A compute function that counts its calls and returns the count (or `value`)."""

    def __init__(self, value: Any = None, delay: float = 0.0, fail: bool = False) -> None:
        self.calls = 0
        self.value = value
        self.delay = delay
        self.fail = fail

    def __call__(self) -> Any:
        self.calls += 1
        if self.delay:
            sleep(self.delay)
        if self.fail:
            raise RuntimeError("the source is down")
        return self.calls if self.value is None else self.value
