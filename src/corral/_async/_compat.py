"""The few concurrency primitives whose async and sync forms differ in more than `await`.

This file and its twin `corral/_sync/_compat.py` are the only hand-written
pair: everything else in `corral._sync` is generated from `corral._async` by
`scripts/unasync.py`. Each name here has the same meaning in both files.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "Event",
    "Lock",
    "Worker",
    "call_maybe_async",
    "current_task_label",
    "run_sync",
    "scope_key",
    "shield",
    "sleep",
    "spawn",
    "wait_readable",
]

Lock = asyncio.Lock


class Event:
    """An event whose `wait` takes a timeout and says whether it was set."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        if self._event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def run_sync(func: Callable[..., T], *args: Any) -> T:
    """Run blocking library code without blocking the event loop."""
    return await asyncio.to_thread(func, *args)


async def shield(awaitable: Awaitable[T]) -> T:
    """Finish clean-up even when the caller is being cancelled."""
    return await asyncio.shield(awaitable)


def current_task_label() -> str:
    task = asyncio.current_task()
    thread = threading.current_thread().name
    return f"{thread}/{task.get_name()}" if task is not None else thread


def scope_key() -> object:
    """What one background worker serves: each event loop gets its own."""
    return asyncio.get_running_loop()


class Worker:
    """A background job: an asyncio task in this flavour, a daemon thread in the other."""

    def __init__(self, target: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(target(), name=name)

    def alive(self) -> bool:
        return not self._task.done()

    async def join(self) -> None:
        if not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)


def spawn(target: Callable[[], Coroutine[Any, Any, None]], name: str) -> Worker:
    return Worker(target, name)


async def call_maybe_async(func: Callable[..., Any], *args: Any) -> None:
    """Call a user's callback, awaiting it when it is a coroutine function."""
    result = func(*args)
    if inspect.isawaitable(result):
        await result


async def wait_readable(sock: socket.socket, timeout: float) -> bool:
    """Wait up to `timeout` s for a non-blocking socket to have data; True when it has."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    fd = sock.fileno()
    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(ready, timeout)
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True
