# Generated from tests/_async/delayed.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Any backend, with chosen primitives answering late, as a slow network sometimes does.

Wraps a real store's backend, so the edge-case tests run over every backend:
the delay is the only thing that is not real.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from corral import Store
from corral._sync.backends.base import Backend, Waiter
from corral.core.primitives import Attempt, LockInfo, Outcome
from tests._sync.concurrency import on_the_wire, sleep


class DelayedBackend(Backend):
    """Delegates every primitive to `inner`, sleeping first where `delays` says so.

    `delays` maps a primitive's name to seconds; `only` (if given) limits the
    delays to calls whose lock name is in it. Two more: `wire` delays an attempt
    after it was sent (cancelling the caller does not stop it: the server will
    still act on it), and `leave` delays leaving a wake-up subscription.
    """

    def __init__(
        self, inner: Backend, delays: dict[str, float], only: set[str] | None = None
    ) -> None:
        super().__init__()
        self.inner = inner
        self.delays = delays
        self.only = only
        self.local_bus = inner.local_bus
        self.capabilities = inner.capabilities  # type: ignore[misc]
        self.calls: list[str] = []

    @property
    def server(self) -> str:
        return self.inner.server

    def _delay(self, primitive: str, name: str) -> None:
        self.calls.append(primitive)
        seconds = self.delays.get(primitive, 0.0)
        if seconds and (self.only is None or name in self.only):
            sleep(seconds)

    def try_acquire(self, name: str, owner: str, ttl: float, **options: Any) -> Attempt:
        self._delay("try_acquire", name)

        def sent() -> Attempt:
            self._delay("wire", name)
            return self.inner.try_acquire(name, owner, ttl, **options)

        return on_the_wire(sent)  # type: ignore[no-any-return]

    def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        self._delay("release", name)
        return self.inner.release(name, owner, hold_for)

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        self._delay("extend", name)
        outcome = self.inner.extend(name, owner, ttl)
        self._delay("extend_reply", name)  # applied on the server, answered late
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

    def close(self) -> None:
        """The inner backend belongs to its own store, which closes it."""


class SlowLeavingWaiter(Waiter):
    """The inner backend's waiter, slow to leave when `leave` is delayed."""

    def __init__(self, backend: DelayedBackend, inner: Waiter) -> None:
        self.backend = backend
        self.inner = inner

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
