# Generated from src/corral/_async/renewer.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""One renewal worker per process (per event loop in the async flavour) for every auto-renewed lock.

A thread or task per lock would cost a thread per lock and hide failures; one
worker keeps a due-time per lock, extends what is due, and tells a lock it is
lost when the server says so or when its lease has surely run out. After
`fork` the child starts with no worker and owns none of its parent's locks.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from corral._sync._compat import Event, Worker, scope_key, spawn

if TYPE_CHECKING:
    from corral._sync.lock import Lock

__all__ = ["Renewer", "renewer"]

log = logging.getLogger("corral.renewal")


class Renewer:
    """Extends registered locks when their schedule says so, until they are released or lost."""

    def __init__(self, key: object) -> None:
        self._key = key
        # A thread lock in both flavours: its critical sections never await.
        self._mutex = threading.Lock()
        self._locks: dict[Lock, float] = {}
        self._wake = Event()
        self._worker: Worker | None = None

    def register(self, lock: Lock, due: float) -> None:
        with self._mutex:
            self._locks[lock] = due
            if self._worker is None or not self._worker.alive():
                self._worker = spawn(self._run, name="corral-renewer")
        self._wake.set()

    def unregister(self, lock: Lock) -> None:
        with self._mutex:
            self._locks.pop(lock, None)

    def __len__(self) -> int:
        return len(self._locks)

    def _run(self) -> None:
        while True:
            with self._mutex:
                if not self._locks:
                    self._worker = None
                    if _RENEWERS.get(self._key) is self:
                        del _RENEWERS[self._key]
                    return
                items = list(self._locks.items())
            delays = [(due - lock.clock_now(), lock) for lock, due in items]
            ready = [lock for delay, lock in delays if delay <= 0]
            if not ready:
                self._wake.wait(min(delay for delay, _ in delays))
                self._wake.clear()
                continue
            for lock in ready:
                try:
                    next_due = lock.renew_due()
                except Exception:  # one lock's failure must not stop the others' renewals
                    log.exception("renewal of lock %r failed unexpectedly", lock.name)
                    next_due = None
                with self._mutex:
                    if lock in self._locks:
                        if next_due is None:
                            del self._locks[lock]
                        else:
                            self._locks[lock] = next_due


_RENEWERS: dict[object, Renewer] = {}
_REGISTRY_MUTEX = threading.Lock()


def renewer() -> Renewer:
    """The renewal worker of this process (or of the running event loop)."""
    key = scope_key()
    with _REGISTRY_MUTEX:
        found = _RENEWERS.get(key)
        if found is None:
            found = _RENEWERS[key] = Renewer(key)
        return found


def _forget_after_fork() -> None:
    # The child has no worker thread and must not renew its parent's locks.
    _RENEWERS.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
