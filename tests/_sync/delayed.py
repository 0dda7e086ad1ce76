# Generated from tests/_async/delayed.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Any backend, with chosen primitives answering late, as a slow network sometimes does.

Wraps a real store's backend, so the edge-case tests run over every backend:
the delay is the only thing that is not real. With no delays it is a spy: it
records which primitives were called, and which owners the server queued.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic
from types import TracebackType
from typing import Any

from corral import Store
from corral._sync.backends.base import Backend, Waiter
from corral.core.primitives import Attempt, LockInfo, Outcome, SemaphoreInfo
from tests._sync.concurrency import on_the_wire, sleep


class DelayedBackend(Backend):
    """Delegates every primitive to `inner`, sleeping first where `delays` says so.

    `delays` maps a primitive's name to seconds (a semaphore's slot primitives go
    by the lock's names); `only` (if given) limits the delays to calls whose name
    is in it. Three more: `wire` delays an attempt after it was sent (cancelling
    the caller does not stop it: the server will still act on it; "answered" joins
    `calls` once it has), `extend_reply`
    delays the answer to an extend the server applied, and `leave` delays leaving
    a wake-up subscription.
    """

    def __init__(
        self, inner: Backend, delays: dict[str, float], only: set[str] | None = None
    ) -> None:
        super().__init__()
        self.inner = inner
        self.delays = delays
        self.only = only
        self.local_bus = inner.local_bus
        self.semaphore_bus = inner.semaphore_bus
        self.capabilities = inner.capabilities  # type: ignore[misc]
        self.calls: list[str] = []
        # Refused attempts, and the owners of those with a queue place: the server has
        # them queued.
        self.refused = 0
        self.queued: set[str] = set()
        # Extends over: answered, failed, or abandoned by their caller.
        self.extends_done = 0

    @property
    def server(self) -> str:
        return self.inner.server

    def _delay(self, primitive: str, name: str) -> None:
        self.calls.append(primitive)
        seconds = self.delays.get(primitive, 0.0)
        if seconds and (self.only is None or name in self.only):
            sleep(seconds)

    def _answered(self, owner: str, attempt: Attempt, options: dict[str, Any]) -> Attempt:
        self.calls.append("answered")  # the server has acted on the attempt
        if not attempt.acquired:
            self.refused += 1
            if options.get("queue_ttl") is not None:
                self.queued.add(owner)
        return attempt

    def try_acquire(self, name: str, owner: str, ttl: float, **options: Any) -> Attempt:
        self._delay("try_acquire", name)

        def sent() -> Attempt:
            self._delay("wire", name)
            attempt = self.inner.try_acquire(name, owner, ttl, **options)
            return self._answered(owner, attempt, options)

        return on_the_wire(sent)  # type: ignore[no-any-return]

    def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        self._delay("release", name)
        return self.inner.release(name, owner, hold_for)

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        try:
            self._delay("extend", name)
            outcome = self.inner.extend(name, owner, ttl)
            self._delay("extend_reply", name)  # applied on the server, answered late
        finally:
            self.extends_done += 1
        return outcome

    def inspect(self, name: str) -> LockInfo | None:
        self._delay("inspect", name)
        return self.inner.inspect(name)

    def force_release(self, name: str) -> bool:
        return self.inner.force_release(name)

    def leave_queue(self, name: str, owner: str) -> None:
        self.inner.leave_queue(name, owner)

    def waiter(self, name: str) -> Waiter:
        return SlowLeavingWaiter(self, self.inner.waiter(name))

    def sem_try_acquire(
        self, name: str, owner: str, ttl: float, limit: int, **options: Any
    ) -> Attempt:
        self._delay("try_acquire", name)

        def sent() -> Attempt:
            self._delay("wire", name)
            attempt = self.inner.sem_try_acquire(name, owner, ttl, limit, **options)
            return self._answered(owner, attempt, options)

        return on_the_wire(sent)  # type: ignore[no-any-return]

    def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        self._delay("release", name)
        return self.inner.sem_release(name, owner, hold_for)

    def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        try:
            self._delay("extend", name)
            outcome = self.inner.sem_extend(name, owner, ttl)
            self._delay("extend_reply", name)
        finally:
            self.extends_done += 1
        return outcome

    def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        self._delay("inspect", name)
        return self.inner.sem_inspect(name)

    def sem_force_release(self, name: str) -> int:
        return self.inner.sem_force_release(name)

    def sem_leave_queue(self, name: str, owner: str) -> None:
        self.inner.sem_leave_queue(name, owner)

    def sem_waiter(self, name: str) -> Waiter:
        return SlowLeavingWaiter(self, self.inner.sem_waiter(name))

    def close(self) -> None:
        """The inner backend belongs to its own store, which closes it."""


class SlowLeavingWaiter(Waiter):
    """The inner backend's waiter, slow to leave when `leave` is delayed."""

    def __init__(self, backend: DelayedBackend, inner: Waiter) -> None:
        self.backend = backend
        self.inner = inner

    @property  # type: ignore[override]
    def attempt_on_entering(self) -> bool:
        return self.inner.attempt_on_entering  # the inner waiter decides it as it enters

    def for_owner(self, owner: str) -> Waiter:
        self.inner.for_owner(owner)
        return self

    def __enter__(self) -> Waiter:
        self.inner.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.backend._delay("leave", self.inner._name)
        self.inner.__exit__(exc_type, exc, tb)

    def wait(self, timeout: float) -> bool:
        return self.inner.wait(timeout)


def delayed(
    store: Store, only: set[str] | None = None, **delays: float
) -> tuple[Store, DelayedBackend]:
    """A second store over `store`'s backend whose primitives answer late."""
    backend = DelayedBackend(store.backend, delays, only)
    return Store(backend, clock=store.clock), backend


def wait_until(condition: Callable[[], bool], deadline: float = 30.0) -> None:
    waited = 0.0
    while not condition():
        assert waited < deadline, "the condition never came true"
        sleep(0.01)
        waited += 0.01


def eventually(check: Callable[[], bool], within: float) -> None:
    """Ask `check` (a round trip) until it answers True; fail only when asked after
    `within` seconds it still answers False, so a paused process never fails it early."""
    end = monotonic() + within
    while True:
        asked_at = monotonic()
        if check():
            return
        assert asked_at < end, f"still not so after {within} s"
        sleep(0.05)
