"""Run a piece of test code concurrently: a task here, a thread in the sync twin.

Hand-written in both flavours, like corral's own `_compat` modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class Job:
    def __init__(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        self._task = asyncio.get_running_loop().create_task(func(*args))

    async def result(self, timeout: float = 60.0) -> Any:
        return await asyncio.wait_for(self._task, timeout)

    def done(self) -> bool:
        return self._task.done()


def start(func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Job:
    return Job(func, *args)


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def on_the_wire(call: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run `call()` as a request already sent: cancelling the caller does not stop it."""
    return await asyncio.shield(asyncio.ensure_future(call()))
