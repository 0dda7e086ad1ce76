"""The blocking twin of `corral/_async/_compat.py`; hand-written, like that file.

Each name here has the meaning it has there, with threads in place of tasks.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
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
        return self._event.wait(timeout)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def run_sync(func: Callable[..., T], *args: Any) -> T:
    return func(*args)


def shield(value: T) -> T:
    return value


def current_task_label() -> str:
    return threading.current_thread().name


_PROCESS_SCOPE = "process"


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


def wait_readable(sock: socket.socket, timeout: float) -> bool:
    """Wait up to `timeout` s for a non-blocking socket to have data; True when it has."""
    if hasattr(select, "poll"):  # no FD_SETSIZE limit, unlike select()
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    readable, _, _ = select.select([sock], [], [], timeout)
    return bool(readable)
