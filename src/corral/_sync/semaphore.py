# Generated from src/corral/_async/semaphore.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""The distributed semaphore: up to `limit` holders at once, each with its own slot.

A semaphore handle is a lock handle whose acquisition is one slot: the same
waiting, renewal, cancellation and ownership rules (see `corral._sync.lock`),
over the backend's slot primitives instead of its lock ones. `acquire()` and
`release()` hold the handle's one slot (a second thread or task calling
`acquire()` on it waits, as for a lock handle). A `with` block takes a slot of
its own instead, as `threading.Semaphore` and `asyncio.Semaphore` do, so one
handle shared by many threads or tasks lets up to `limit` of them in.

The limit is part of the semaphore's identity: the first holder's limit holds
until every slot is free again, and a handle that disagrees gets a
`ConfigError` from `acquire`, never an extra slot.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from corral._sync._compat import current_task
from corral._sync.backends.base import Waiter
from corral._sync.lock import Acquisition, Lock, describe_holder
from corral.core.primitives import Attempt, LockInfo, Outcome, SemaphoreInfo
from corral.errors import ConfigError

if TYPE_CHECKING:
    from corral._sync.store import Store
    from corral.core.stats import Metrics

__all__ = ["Semaphore"]


class Semaphore(Lock):
    """A named semaphore of `limit` slots, each with a TTL, a fencing token and an owner.

    Created by `Store.semaphore()`; docs/semaphores.md describes it.
    `with semaphore as slot:` gives the `Acquisition` of the slot
    this block holds (its `token` and `owner`).
    """

    kind = "semaphore"

    def __init__(
        self,
        store: Store,
        name: str,
        limit: int,
        ttl: float,
        *,
        wait: float | None,
        auto_renew: bool,
        on_lost: Callable[[Lock], Any] | None,
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
        # The slots `with` blocks took, per thread or task (see __enter__).
        self._blocks: dict[object, list[Semaphore]] = {}

    def __repr__(self) -> str:
        state = "holding a slot" if self.held else "holding no slot"
        return (
            f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} "
            f"{state} on {self._backend.server}>"
        )

    def _metrics(self, store: Store) -> Metrics:
        return store.metrics.semaphores

    def _server_attempt(self, owner: str, queue_ttl: float | None) -> Attempt:
        attempt = self._backend.sem_try_acquire(
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

    def _server_release(self, owner: str, hold_for: float = 0.0) -> Outcome:
        return self._backend.sem_release(self.name, owner, hold_for)

    def _server_extend(self, owner: str, ttl: float) -> Outcome:
        return self._backend.sem_extend(self.name, owner, ttl)

    def _server_standing(self, owner: str) -> Outcome:
        info = self._backend.sem_inspect(self.name)
        if info is None:
            return Outcome.EXPIRED
        if any(holder.owner == owner for holder in info.holders):
            return Outcome.OK
        return Outcome.LOST if info.free == 0 else Outcome.EXPIRED

    def _server_busy(self) -> bool:
        info = self._backend.sem_inspect(self.name)
        return info is not None and info.free == 0

    def _server_leave_queue(self, owner: str) -> None:
        self._backend.sem_leave_queue(self.name, owner)

    def _server_waiter(self) -> Waiter:
        return self._backend.sem_waiter(self.name)

    def locked(self) -> bool:
        """Whether every slot is taken (or kept closed with hold_for) right now."""
        return self._server_busy()

    def holders(self) -> SemaphoreInfo | None:
        """The limit and the current holders, as `store.semaphore_info` gives them."""
        return self._backend.sem_inspect(self.name)

    def _busy_state(self) -> tuple[str, LockInfo | None]:
        info = self._backend.sem_inspect(self.name)
        if info is None or info.free:
            return "a slot is free now (it was freed as the wait ran out); retry", None
        soonest = min(info.holders, key=lambda holder: holder.ttl)
        return (
            f"all {info.limit} slots are taken; the first to free is {describe_holder(soonest)}",
            soonest,
        )

    # -- context manager: a slot per block -------------------------------------

    def __enter__(self) -> Acquisition:
        """Take a slot of this block's own (waiting up to the semaphore's `wait`).

        Raises `LockTimeout` when no slot freed in time. The acquisition given
        is the block's slot: its `token` and `owner`.
        """
        slot = Semaphore(
            self._store,
            self.name,
            self.limit,
            self.ttl,
            wait=self.wait,
            auto_renew=self.auto_renew,
            on_lost=self.on_lost,
            fair=self.fair,
        )
        acquisition = Lock.__enter__(slot)
        with self._state:
            self._blocks.setdefault(current_task(), []).append(slot)
        return acquisition

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Free the block's slot; raise `LockLost`/`LockExpired` if it was lost inside."""
        with self._state:
            slot = self._block_slot()
        if slot is not None:
            Lock.__exit__(slot, exc_type, exc, tb)

    def _block_slot(self) -> Semaphore | None:
        """The slot of the block now leaving (called under `_state`): this task's last.

        A block may leave on another thread than it entered (a framework that
        runs enter and exit in two calls of its thread pool): then the slot of
        the task that entered longest ago.
        """
        me = current_task()
        task = me if self._blocks.get(me) else next(iter(self._blocks), None)
        if task is None:
            return None
        stack = self._blocks[task]
        slot = stack.pop() if task is me else stack.pop(0)
        if not stack:
            del self._blocks[task]
        return slot
