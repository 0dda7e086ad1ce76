"""The distributed semaphore: up to `limit` holders at once, each with its own slot.

A semaphore handle is a lock handle whose acquisition is one slot: the same
waiting, renewal, cancellation and ownership rules (see `corral._async.lock`),
over the backend's slot primitives instead of its lock ones. One handle holds
at most one slot at a time; processes, threads or tasks that each want a slot
each make their own handle (a handle shared between them excludes them as a
lock handle does).

The limit is part of the semaphore's identity: the first holder's limit holds
until every slot is free again, and a handle that disagrees gets a
`ConfigError` from `acquire`, never an extra slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from corral._async.backends.base import AsyncWaiter
from corral._async.lock import AsyncLock, describe_holder
from corral.core.primitives import Attempt, LockInfo, Outcome, SemaphoreInfo
from corral.errors import ConfigError

if TYPE_CHECKING:
    from corral._async.store import AsyncStore
    from corral.core.stats import Metrics

__all__ = ["AsyncSemaphore"]


class AsyncSemaphore(AsyncLock):
    """A named semaphore of `limit` slots, each with a TTL, a fencing token and an owner.

    Created by `AsyncStore.semaphore()`; docs/semaphores.md describes it.
    `async with semaphore as slot:` gives the `AsyncAcquisition` of the slot
    this block holds (its `token` and `owner`).
    """

    kind = "semaphore"

    def __init__(
        self,
        store: AsyncStore,
        name: str,
        limit: int,
        ttl: float,
        *,
        wait: float | None,
        auto_renew: bool,
        on_lost: Callable[[AsyncLock], Any] | None,
        fair: bool,
    ) -> None:
        super().__init__(
            store,
            name,
            ttl,
            wait=wait,
            auto_renew=auto_renew,
            reentrant=False,
            on_lost=on_lost,
            fair=fair,
            replicas=0,
        )
        self.limit = limit

    def __repr__(self) -> str:
        state = "holding a slot" if self.held else "holding no slot"
        return (
            f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} "
            f"{state} on {self._backend.server}>"
        )

    def _metrics(self, store: AsyncStore) -> Metrics:
        return store.metrics.semaphores

    async def _server_attempt(self, owner: str, queue_ttl: float | None) -> Attempt:
        attempt = await self._backend.sem_try_acquire(
            self.name, owner, self.ttl, self.limit, queue_ttl=queue_ttl
        )
        if attempt.limit is not None and not attempt.acquired:
            raise ConfigError(
                f"semaphore {self.name!r} on {self._backend.server} is held with "
                f"limit={attempt.limit}, and this handle asks for limit={self.limit}: every "
                "process must use the same limit for one name (a new limit applies once "
                "every slot is free)"
            )
        return attempt

    async def _server_release(self, owner: str, hold_for: float = 0.0) -> Outcome:
        return await self._backend.sem_release(self.name, owner, hold_for)

    async def _server_extend(self, owner: str, ttl: float) -> Outcome:
        return await self._backend.sem_extend(self.name, owner, ttl)

    async def _server_standing(self, owner: str) -> Outcome:
        info = await self._backend.sem_inspect(self.name)
        if info is None:
            return Outcome.EXPIRED
        if any(holder.owner == owner for holder in info.holders):
            return Outcome.OK
        return Outcome.LOST if info.free == 0 else Outcome.EXPIRED

    async def _server_busy(self) -> bool:
        info = await self._backend.sem_inspect(self.name)
        return info is not None and info.free == 0

    async def _server_leave_queue(self, owner: str) -> None:
        await self._backend.sem_leave_queue(self.name, owner)

    def _server_waiter(self) -> AsyncWaiter:
        return self._backend.sem_waiter(self.name)

    async def locked(self) -> bool:
        """Whether every slot is taken (or kept closed with hold_for) right now."""
        return await self._server_busy()

    async def holders(self) -> SemaphoreInfo | None:
        """The limit and the current holders, as `store.semaphore_info` gives them."""
        return await self._backend.sem_inspect(self.name)

    async def _busy_state(self) -> tuple[str, LockInfo | None]:
        info = await self._backend.sem_inspect(self.name)
        if info is None or info.free:
            return "a slot is free now (it was freed as the wait ran out); retry", None
        soonest = min(info.holders, key=lambda holder: holder.ttl)
        return (
            f"all {info.limit} slots are taken; the first to free is {describe_holder(soonest)}",
            soonest,
        )
