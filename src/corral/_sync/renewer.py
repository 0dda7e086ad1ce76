# Generated from src/corral/_async/renewer.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""One renewal worker per process (per event loop in the async flavour) for every auto-renewed lock.

The worker only schedules: it keeps no thread per lock (that would cost a
thread per lock and hide failures), and it never waits on a server itself.
Each renewal that falls due runs as a job of its own (a task, or a pooled
thread in the blocking flavour), so a slow server for one lock, or a slow
`on_lost` callback, never delays another lock's renewal. While a renewal is
in flight the worker watches the lease it protects: if the lease surely ends
before the server answered, the lock is reported lost right then (and, where
it can be, the renewal is cancelled), however long the server takes.

After `fork` the child starts with no worker and owns none of its parent's locks.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import TYPE_CHECKING

from corral._sync._compat import Event, Job, Worker, scope_key, spawn, start_job
from corral.core.forks import ProcessLock

if TYPE_CHECKING:
    from corral._sync.lock import Lock

__all__ = ["Renewer", "renewer"]

log = logging.getLogger("corral.renewal")


class Renewer:
    """Starts each registered lock's renewals when they fall due, until released or lost."""

    def __init__(self, key: object) -> None:
        # Weak: the registry must not keep a finished event loop alive through its renewer.
        self._key = weakref.ref(key)
        # Its critical sections never await, in either flavour.
        self._mutex = ProcessLock()
        # Weak too: a handle nobody can reach any more can never be released, so renewing
        # it would hold the lock forever; dropped, its lock expires at its TTL.
        self._locks: weakref.WeakKeyDictionary[Lock, Job | None] = weakref.WeakKeyDictionary()
        self._wake = Event()
        self._worker: Worker | None = None
        # Numbers the workers, so one that ends never clears its successor's place.
        self._generation = 0

    def register(self, lock: Lock) -> None:
        with self._mutex:
            self._locks.setdefault(lock, None)
            if self._worker is None or not self._worker.alive():
                self._generation += 1
                generation = self._generation
                self._worker = spawn(lambda: self._run(generation), name="corral-renewer")
        self._wake.set()

    def unregister(self, lock: Lock) -> None:
        with self._mutex:
            self._locks.pop(lock, None)
            empty = not self._locks
        if empty:
            self._wake.set()  # let the worker end now, not at its next timer

    def wake(self) -> None:
        """Look at every schedule again now (one changed: an extend with another TTL)."""
        self._wake.set()

    def __len__(self) -> int:
        return len(self._locks)

    def _renew(self, lock: Lock) -> None:
        try:
            lock.renew_once()
        finally:
            self._wake.set()

    def _run(self, generation: int) -> None:
        try:
            self._schedule(generation)
        finally:
            # Ended, or cancelled with its event loop (asyncio.run cancels what is left).
            # The renewer stays registered for its scope: removing it here could race
            # with a lock registering on it meanwhile, which a newer renewer would then
            # never wake. It holds its event loop only weakly; the wake-up event, which
            # binds to the loop it was awaited on, is made anew, so a finished loop is
            # not kept alive through it and the registry forgets it with the loop.
            with self._mutex:
                if self._generation == generation:
                    self._worker = None
                    self._wake = Event()

    def _schedule(self, generation: int) -> None:
        while True:
            with self._mutex:
                if self._generation != generation:
                    return  # a newer worker took over
                if not self._locks:
                    # Decided under the mutex `register` takes: a lock registered from
                    # now on sees no worker and starts one.
                    self._worker = None
                    return
                items = list(self._locks.items())
            soonest: float | None = None
            for lock, job in items:
                plan = lock.renewal_plan()
                if plan is None:
                    self.unregister(lock)
                    continue
                due, valid_until = plan
                now = lock.clock_now()
                if job is not None and not job.done():
                    if now < valid_until:
                        wake_at = valid_until - now
                    else:
                        job.cancel()  # the asyncio flavour stops waiting; a thread runs on
                        lock.lease_ran_out()
                        self.unregister(lock)
                        continue
                elif due <= now:
                    job = start_job(self._renew, lock)
                    with self._mutex:
                        if lock in self._locks:
                            self._locks[lock] = job
                    wake_at = valid_until - now
                else:
                    wake_at = due - now
                soonest = wake_at if soonest is None else min(soonest, wake_at)
            if soonest is None:
                continue  # nothing left to renew: the top of the loop ends the worker
            if soonest > 0:
                self._wake.wait(soonest)
            self._wake.clear()


_RENEWERS: weakref.WeakKeyDictionary[object, Renewer] = weakref.WeakKeyDictionary()
_REGISTRY_MUTEX = ProcessLock()


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


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
