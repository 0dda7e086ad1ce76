"""The blocking twin of `corral/_async/_compat.py`; hand-written, like that file.

Each name here has the meaning it has there, with threads in place of tasks.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from corral.core.forks import ProcessLock

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

Lock = threading.Lock


class Event:
    """An event whose `wait` takes a timeout and says whether it was set."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None and timeout <= 0:
            return self._event.is_set()
        return self._event.wait(None if timeout is None else min(timeout, threading.TIMEOUT_MAX))


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def run_sync(func: Callable[..., T], *args: Any) -> T:
    return func(*args)


def shield(value: T) -> T:
    return value


def current_task() -> object:
    """Who is calling: the running thread (a task in the other flavour)."""
    return threading.current_thread()


def current_task_label() -> str:
    return threading.current_thread().name


class _ProcessScope:
    """The one scope of the blocking flavour (an object, so it can be a weak key)."""


_PROCESS_SCOPE = _ProcessScope()


def scope_key() -> object:
    """What one background worker serves: the whole process in this flavour."""
    return _PROCESS_SCOPE


class Worker:
    """A background job: a daemon thread, so it never keeps the interpreter alive."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join()


def spawn(target: Callable[[], None], name: str) -> Worker:
    return Worker(target, name)


def call_maybe_async(func: Callable[..., Any], *args: Any) -> None:
    func(*args)


class Gate:
    """Lets one thread at a time through, waiting up to a timeout, as `threading.Lock` does.

    The threads that share one lock handle queue here, so the second one waits
    for the first to release instead of entering beside it. In a forked child
    it starts open: the parent's threads are not there to release it.
    """

    def __init__(self) -> None:
        self._lock = ProcessLock()

    def acquire(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout)

    def release(self) -> None:
        self._lock.release()


# How long an idle pooled thread waits for more work before it ends.
_IDLE_SECONDS = 10.0


class _ThreadPool:
    """Daemon threads reused for short background jobs, started when none is idle.

    Unbounded on purpose: a job that blocks (a slow server) must never hold up
    another (a renewal that is due). Threads end after a while without work.
    Each release of `_ready` hands exactly one queued job to one idle thread.
    """

    def __init__(self) -> None:
        self._mutex = ProcessLock()
        self._pid = os.getpid()
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._ready = threading.Semaphore(0)
        self._idle = 0

    def submit(self, work: Callable[[], None]) -> None:
        with self._mutex:
            if self._pid != os.getpid():  # a forked child has none of the parent's threads
                self._pid = os.getpid()
                self._jobs.clear()
                self._ready = threading.Semaphore(0)
                self._idle = 0
            if self._idle > 0:
                self._idle -= 1
                self._jobs.append(work)
                self._ready.release()
                return
        threading.Thread(target=self._serve, args=(work,), name="corral-job", daemon=True).start()

    def _serve(self, work: Callable[[], None]) -> None:
        while True:
            work()
            with self._mutex:
                self._idle += 1
                ready = self._ready
            if not ready.acquire(timeout=_IDLE_SECONDS):
                with self._mutex:
                    # A submit may have counted this thread idle just as the wait ran out.
                    if not ready.acquire(blocking=False):
                        self._idle -= 1
                        return
            with self._mutex:
                work = self._jobs.popleft()


_POOL = _ThreadPool()


class Job:
    """A piece of background work: a pooled thread here, a task in the other flavour."""

    def __init__(self, target: Callable[..., Any], *args: Any) -> None:
        self._done = threading.Event()

        def work() -> None:
            try:
                target(*args)
            except Exception:
                log.exception("a background job of corral failed")
            finally:
                self._done.set()

        _POOL.submit(work)

    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """A blocking call cannot be interrupted: the job runs on and its result is ignored."""


def start_job(target: Callable[..., Any], *args: Any) -> Job:
    return Job(target, *args)


def finish_anyway(call: Callable[[], T]) -> T:
    return call()


def undo_if_interrupted(call: Callable[[], T], undo: Callable[[T | None], None]) -> T:
    """Run `call()`; if an interruption (KeyboardInterrupt...) ends it, undo what it may have done.

    The outcome is unknown then, so `undo(None)` runs. An error raised by the
    call itself (an `Exception`) propagates with nothing undone.
    """
    try:
        return call()
    except Exception:
        raise
    except BaseException:
        undo(None)
        raise


def wait_readable(sock: socket.socket, timeout: float) -> bool:
    """Wait up to `timeout` s for a non-blocking socket to have data; True when it has."""
    if hasattr(select, "poll"):  # no FD_SETSIZE limit, unlike select()
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    readable, _, _ = select.select([sock], [], [], timeout)
    return bool(readable)
