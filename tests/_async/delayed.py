"""Any backend, with chosen primitives answering late, as a slow network sometimes does.

Wraps a real store's backend, so the edge-case tests run over every backend:
the delay is the only thing that is not real. With no delays it is a spy: it
records which primitives were called, and which owners the server queued.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from time import monotonic
from types import TracebackType
from typing import Any

from corral._async.backends.base import AsyncBackend, AsyncWaiter
from corral.aio import AsyncStore
from corral.core.primitives import Attempt, LockInfo, Outcome, SemaphoreInfo
from tests._async.concurrency import on_the_wire, sleep


class DelayedBackend(AsyncBackend):
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
        self, inner: AsyncBackend, delays: dict[str, float], only: set[str] | None = None
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

    async def _delay(self, primitive: str, name: str) -> None:
        self.calls.append(primitive)
        seconds = self.delays.get(primitive, 0.0)
        if seconds and (self.only is None or name in self.only):
            await sleep(seconds)

    def _answered(self, owner: str, attempt: Attempt, options: dict[str, Any]) -> Attempt:
        self.calls.append("answered")  # the server has acted on the attempt
        if not attempt.acquired:
            self.refused += 1
            if options.get("queue_ttl") is not None:
                self.queued.add(owner)
        return attempt

    async def try_acquire(self, name: str, owner: str, ttl: float, **options: Any) -> Attempt:
        await self._delay("try_acquire", name)

        async def sent() -> Attempt:
            await self._delay("wire", name)
            attempt = await self.inner.try_acquire(name, owner, ttl, **options)
            return self._answered(owner, attempt, options)

        return await on_the_wire(sent)  # type: ignore[no-any-return]

    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        await self._delay("release", name)
        return await self.inner.release(name, owner, hold_for)

    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        try:
            await self._delay("extend", name)
            outcome = await self.inner.extend(name, owner, ttl)
            await self._delay("extend_reply", name)  # applied on the server, answered late
        finally:
            self.extends_done += 1
        return outcome

    async def inspect(self, name: str) -> LockInfo | None:
        await self._delay("inspect", name)
        return await self.inner.inspect(name)

    async def force_release(self, name: str) -> bool:
        return await self.inner.force_release(name)

    async def leave_queue(self, name: str, owner: str) -> None:
        await self.inner.leave_queue(name, owner)

    def waiter(self, name: str) -> AsyncWaiter:
        return SlowLeavingWaiter(self, self.inner.waiter(name))

    async def sem_try_acquire(
        self, name: str, owner: str, ttl: float, limit: int, **options: Any
    ) -> Attempt:
        await self._delay("try_acquire", name)

        async def sent() -> Attempt:
            await self._delay("wire", name)
            attempt = await self.inner.sem_try_acquire(name, owner, ttl, limit, **options)
            return self._answered(owner, attempt, options)

        return await on_the_wire(sent)  # type: ignore[no-any-return]

    async def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        await self._delay("release", name)
        return await self.inner.sem_release(name, owner, hold_for)

    async def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        try:
            await self._delay("extend", name)
            outcome = await self.inner.sem_extend(name, owner, ttl)
            await self._delay("extend_reply", name)
        finally:
            self.extends_done += 1
        return outcome

    async def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        await self._delay("inspect", name)
        return await self.inner.sem_inspect(name)

    async def sem_force_release(self, name: str) -> int:
        return await self.inner.sem_force_release(name)

    async def sem_leave_queue(self, name: str, owner: str) -> None:
        await self.inner.sem_leave_queue(name, owner)

    def sem_waiter(self, name: str) -> AsyncWaiter:
        return SlowLeavingWaiter(self, self.inner.sem_waiter(name))

    async def aclose(self) -> None:
        """The inner backend belongs to its own store, which closes it."""


class SlowLeavingWaiter(AsyncWaiter):
    """The inner backend's waiter, slow to leave when `leave` is delayed."""

    def __init__(self, backend: DelayedBackend, inner: AsyncWaiter) -> None:
        self.backend = backend
        self.inner = inner

    @property  # type: ignore[override]
    def attempt_on_entering(self) -> bool:
        return self.inner.attempt_on_entering  # the inner waiter decides it as it enters

    def for_owner(self, owner: str) -> AsyncWaiter:
        self.inner.for_owner(owner)
        return self

    async def __aenter__(self) -> AsyncWaiter:
        await self.inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.backend._delay("leave", self.inner._name)
        await self.inner.__aexit__(exc_type, exc, tb)

    async def wait(self, timeout: float) -> bool:
        return await self.inner.wait(timeout)


def delayed(
    store: AsyncStore, only: set[str] | None = None, **delays: float
) -> tuple[AsyncStore, DelayedBackend]:
    """A second store over `store`'s backend whose primitives answer late."""
    backend = DelayedBackend(store.backend, delays, only)
    return AsyncStore(backend, clock=store.clock), backend


async def wait_until(condition: Callable[[], bool], deadline: float = 30.0) -> None:
    waited = 0.0
    while not condition():
        assert waited < deadline, "the condition never came true"
        await sleep(0.01)
        waited += 0.01


async def eventually(check: Callable[[], Awaitable[bool]], within: float) -> None:
    """Ask `check` (a round trip) until it answers True; fail only when asked after
    `within` seconds it still answers False, so a paused process never fails it early."""
    end = monotonic() + within
    while True:
        asked_at = monotonic()
        if await check():
            return
        assert asked_at < end, f"still not so after {within} s"
        await sleep(0.05)
