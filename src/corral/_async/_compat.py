"""The few concurrency primitives whose async and sync forms differ in more than `await`.

This file and its twin `corral/_sync/_compat.py` are the only hand-written
pair: everything else in `corral._sync` is generated from `corral._async` by
`scripts/unasync.py`. Each name here has the same meaning in both files.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("corral")

__all__ = [
    "Event",
    "Gate",
    "Job",
    "Lock",
    "Worker",
    "call_maybe_async",
    "current_task",
    "current_task_label",
    "finish_anyway",
    "run_sync",
    "scope_key",
    "shield",
    "sleep",
    "spawn",
    "start_job",
    "undo_if_interrupted",
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


def current_task() -> object:
    """Who is calling: the running task (a thread's identity in the other flavour)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("corral's asyncio API must be called from a task")
    return task


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


class Gate:
    """Lets one task at a time through, in arrival order, waiting up to a timeout.

    The tasks that share one lock handle queue here, so the second one waits
    for the first to release instead of entering beside it. A release hands
    the gate straight to the first waiter, so a task that merely asks with
    `timeout <= 0` is refused while anyone waits, never queued behind them.
    (`asyncio.Lock` would queue such a task behind a waiter it has just woken.)
    """

    def __init__(self) -> None:
        self._taken = False
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self, timeout: float | None) -> bool:
        if not self._taken and not self._waiters:
            self._taken = True
            return True
        if timeout is not None and timeout <= 0:
            return False
        handed = asyncio.get_running_loop().create_future()
        self._waiters.append(handed)
        try:
            if timeout is None:
                await asyncio.shield(handed)
            else:
                await asyncio.wait_for(asyncio.shield(handed), timeout)
        except BaseException as exc:
            if handed.done():
                # Handed over just as this waiter gave up: pass the gate on.
                self.release()
            else:
                handed.cancel()
                self._waiters.remove(handed)
            if isinstance(exc, asyncio.TimeoutError):
                return False
            raise
        return True

    def release(self) -> None:
        while self._waiters:
            first = self._waiters.popleft()
            if not first.done():
                first.set_result(None)  # the gate stays taken: it now belongs to `first`
                return
        self._taken = False


# Jobs run detached from whoever started them; the event loop keeps only weak
# references to tasks, so these keep them alive until they finish.
_JOBS: set[asyncio.Task[Any]] = set()


class Job:
    """A piece of background work: a task here, a pooled thread in the other flavour."""

    def __init__(self, target: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        self._task = asyncio.get_running_loop().create_task(_logged(target, *args))
        _JOBS.add(self._task)
        self._task.add_done_callback(_JOBS.discard)

    def done(self) -> bool:
        return self._task.done()

    def cancel(self) -> None:
        """Stop it at its next await (the other flavour's thread cannot be stopped)."""
        self._task.cancel()


async def _logged(target: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
    try:
        await target(*args)
    except Exception:
        log.exception("a background job of corral failed")


def start_job(target: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Job:
    return Job(target, *args)


async def finish_anyway(call: Callable[[], Awaitable[T]]) -> T:
    """Run `call()` to its end even if the caller is cancelled meanwhile.

    The caller's cancellation still propagates at once; the call finishes in
    the background. For clean-up that must not stop half-way (a release).
    """
    task = asyncio.ensure_future(call())
    _JOBS.add(task)
    task.add_done_callback(_JOBS.discard)
    return await asyncio.shield(task)


async def undo_if_interrupted(
    call: Callable[[], Awaitable[T]], undo: Callable[[T | None], Coroutine[Any, Any, None]]
) -> T:
    """Run `call()`; if the caller is cancelled before it answers, `undo` its outcome.

    The call is not abandoned mid-flight: it runs to its end in the background,
    and only then does `undo(result)` run, so the undo can never reach the
    server before the call it undoes (on another pooled connection, say). The
    cancellation itself propagates at once. An error raised by the call itself
    propagates with nothing undone.
    """
    task = asyncio.ensure_future(call())
    try:
        return await asyncio.shield(task)
    except BaseException:
        if task.done() and (task.cancelled() or task.exception() is not None):
            raise

        def after(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                start_job(undo, done.result())

        task.add_done_callback(after)
        raise


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
