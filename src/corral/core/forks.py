"""Thread locks that a forked child can always use.

`fork` copies a thread lock in whatever state it was: one that another thread
of the parent held at that instant stays locked forever in the child, where
that thread does not exist, and the child hangs on first use. A lock made
before a fork (a module-level store's wake-up bus, the renewal worker's
registry, a handle's mutex) must therefore be made anew in the child. A
`ProcessLock` notices that it runs in another process than the one that made
it and replaces itself before use.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

__all__ = ["ProcessLock", "pid"]

# Serialises replacements; itself replaced right after each fork that runs Python's
# fork hooks, while the child still has a single thread.
_REPLACING = threading.Lock()


def pid() -> int:
    """This process's id, asked of the kernel every time.

    Never cached: a process forked from C without Python's fork hooks (uWSGI's
    prefork, a snapshot restored as a clone) would keep its parent's id, and then
    its parent's owner ids, locks and sockets.
    """
    return os.getpid()


def _after_fork_in_child() -> None:
    global _REPLACING
    _REPLACING = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ProcessLock:
    """A `threading.Lock` of this process: in a forked child it starts unlocked."""

    __slots__ = ("_lock", "_pid")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _here(self) -> threading.Lock:
        if self._pid != os.getpid():
            with _REPLACING:
                if self._pid != os.getpid():
                    self._lock = threading.Lock()
                    self._pid = os.getpid()
        return self._lock

    def acquire(self, timeout: float | None = None) -> bool:
        """Take the lock, waiting up to `timeout` seconds (None: as long as it takes)."""
        lock = self._here()
        if timeout is None:
            return lock.acquire()
        if timeout <= 0:
            return lock.acquire(blocking=False)
        return lock.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))

    def release(self) -> None:
        self._here().release()

    def locked(self) -> bool:
        return self._here().locked()

    def __enter__(self) -> ProcessLock:
        self._here().acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()
