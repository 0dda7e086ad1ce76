"""`memory://`: locks inside one process, for tests and single-process programs.

The "server" is a dict guarded by a thread lock and the "server clock" is the
store's clock, so a test can inject a fake one. Every primitive is a few dict
operations under that lock: atomic by construction.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from corral._async.backends.base import AsyncBackend
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock, SystemClock
from corral.core.primitives import Attempt, LockInfo, Outcome
from corral.errors import ConfigError

__all__ = ["AsyncMemoryBackend"]


@dataclass(slots=True)
class _Entry:
    owner: str | None
    token: int
    expires_at: float


class AsyncMemoryBackend(AsyncBackend):
    capabilities: ClassVar[Capabilities] = Capabilities(
        scheme="memory",
        notifies=True,
        cross_process=False,
        cross_host=False,
        linearizable=True,
        fair=True,
        replicas=False,
        ttl_clock="the process's monotonic clock",
        on_client_crash="the lock dies with the process that holds it",
        on_server_restart="not applicable: the store lives in the process",
        on_partition="not applicable: one process",
        on_memory_pressure="never evicted",
    )

    def __init__(self, *, clock: Clock | None = None, name: str = "") -> None:
        super().__init__()
        self._clock = clock or SystemClock()
        self._name = name
        self._mutex = threading.Lock()
        self._locks: dict[str, _Entry] = {}
        self._fences: dict[str, int] = {}
        self._queues: dict[str, dict[str, float]] = {}

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> AsyncMemoryBackend:
        if options:
            raise ConfigError(f"{url}: unknown option(s) {', '.join(sorted(options))}")
        return cls(clock=clock, name=url.split("://", 1)[1])

    @property
    def server(self) -> str:
        return f"memory://{self._name}"

    def _live(self, name: str, now: float) -> _Entry | None:
        entry = self._locks.get(name)
        if entry is not None and entry.expires_at <= now:
            del self._locks[name]
            return None
        return entry

    def _queue_head(self, name: str, owner: str, now: float, queue_ttl: float) -> str:
        queue = self._queues.setdefault(name, {})
        for waiter, expires_at in list(queue.items()):
            if expires_at <= now:
                del queue[waiter]
        queue[owner] = now + queue_ttl  # dicts keep arrival order; refreshing keeps the place
        return next(iter(queue))

    async def try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        *,
        queue_ttl: float | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> Attempt:
        with self._mutex:
            now = self._clock.now()
            entry = self._live(name, now)
            if queue_ttl is not None:
                head = self._queue_head(name, owner, now, queue_ttl)
                if entry is None and head != owner:
                    return Attempt(False, holder_ttl=None)
            if entry is not None:
                return Attempt(False, holder_ttl=entry.expires_at - now)
            token = self._fences.get(name, 0) + 1
            self._fences[name] = token
            self._locks[name] = _Entry(owner, token, now + ttl)
            if queue_ttl is not None:
                self._queues[name].pop(owner, None)
            return Attempt(True, token=token)

    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        with self._mutex:
            now = self._clock.now()
            entry = self._live(name, now)
            if entry is None:
                return Outcome.EXPIRED
            if entry.owner != owner:
                return Outcome.LOST
            if hold_for > 0:
                entry.owner = None
                entry.expires_at = now + hold_for
            else:
                del self._locks[name]
        if hold_for <= 0:
            self.local_bus.notify(name)
        return Outcome.OK

    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        with self._mutex:
            now = self._clock.now()
            entry = self._live(name, now)
            if entry is None:
                return Outcome.EXPIRED
            if entry.owner != owner:
                return Outcome.LOST
            entry.expires_at = now + ttl
            return Outcome.OK

    async def inspect(self, name: str) -> LockInfo | None:
        with self._mutex:
            now = self._clock.now()
            entry = self._live(name, now)
            if entry is None:
                return None
            return LockInfo(name, entry.owner, entry.token, entry.expires_at - now)

    async def force_release(self, name: str) -> bool:
        with self._mutex:
            entry = self._live(name, self._clock.now())
            if entry is not None:
                del self._locks[name]
        if entry is not None:
            self.local_bus.notify(name)
        return entry is not None

    async def leave_queue(self, name: str, owner: str) -> None:
        with self._mutex:
            queue = self._queues.get(name)
            if queue is not None:
                was_head = bool(queue) and next(iter(queue)) == owner
                queue.pop(owner, None)
                if not queue:
                    del self._queues[name]
            else:
                was_head = False
        if was_head:
            self.local_bus.notify(name)

    async def aclose(self) -> None:
        return None
