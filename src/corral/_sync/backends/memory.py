# Generated from src/corral/_async/backends/memory.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`memory://`: locks inside one process, for tests and single-process programs.

The "server" is a dict guarded by a thread lock and the "server clock" is the
store's clock, so a test can inject a fake one. Every primitive is a few dict
operations under that lock: atomic by construction.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, ClassVar

from corral._sync.backends.base import Backend
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock, SystemClock
from corral.core.forks import ProcessLock
from corral.core.options import merge_options
from corral.core.primitives import Attempt, LockInfo, Outcome

__all__ = ["MemoryBackend"]


@dataclass(slots=True)
class _Entry:
    owner: str | None
    token: int
    expires_at: float


class MemoryBackend(Backend):
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
        fencing_tokens="one counter for the whole store, in the process: 1, 2, 3...",
        state_per_name="nothing: expired locks and queue places are dropped as time passes",
    )

    def __init__(self, *, clock: Clock | None = None, name: str = "") -> None:
        super().__init__()
        self._clock = clock or SystemClock()
        self._name = name
        self._mutex = ProcessLock()
        self._locks: dict[str, _Entry] = {}
        # One counter for every name: tokens strictly increase per name, and a name
        # used once leaves nothing behind.
        self._last_token = 0
        self._queues: dict[str, dict[str, float]] = {}
        # (when, name): every expiry ever set, soonest first, so expired entries of
        # names nobody looks up again are still dropped (see `_sweep`).
        self._expiries: list[tuple[float, str]] = []
        self._live_after_rebuild = 0

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> MemoryBackend:
        rest = url.split("://", 1)[1]
        name, _, query = rest.partition("?")
        merge_options(url, query, options, cls.url_options, backend="memory")
        return cls(clock=clock, name=name)

    @property
    def server(self) -> str:
        return f"memory://{self._name}"

    def _expires(self, name: str, when: float) -> float:
        heapq.heappush(self._expiries, (when, name))
        if len(self._expiries) > 2 * self._live_after_rebuild + 64:
            # Superseded expiries (a lock extended, released, or acquired again) would
            # otherwise pile up until their time comes: rebuild from what is live. The
            # heap has at least doubled since the last rebuild, so the cost per push
            # stays constant, however many locks and queue places there are.
            live = [(entry.expires_at, n) for n, entry in self._locks.items()]
            live += [(t, n) for n, queue in self._queues.items() for t in queue.values()]
            live.append((when, name))
            heapq.heapify(live)
            self._expiries = live
            self._live_after_rebuild = len(live)
        return when

    def _sweep(self, now: float) -> None:
        """Drop whatever has expired, for every name, at a logarithmic cost per expiry set.

        A name used once and left to expire is never looked up again, so without
        this its entry would stay forever. An entry extended since its expiry was
        pushed is found live and kept; its newer expiry is in the heap too.
        """
        while self._expiries and self._expiries[0][0] <= now:
            _, name = heapq.heappop(self._expiries)
            self._live(name, now)
            self._queue_head(name, now)

    def _live(self, name: str, now: float) -> _Entry | None:
        entry = self._locks.get(name)
        if entry is not None and entry.expires_at <= now:
            del self._locks[name]
            return None
        return entry

    def _queue_head(self, name: str, now: float) -> str | None:
        """The first live waiter in the queue of `name`, after dropping expired places."""
        queue = self._queues.get(name)
        if queue is None:
            return None
        for waiter, expires_at in list(queue.items()):
            if expires_at <= now:
                del queue[waiter]
        if not queue:
            del self._queues[name]
            return None
        return next(iter(queue))

    def _leave(self, name: str, owner: str) -> None:
        queue = self._queues.get(name)
        if queue is not None:
            queue.pop(owner, None)
            if not queue:
                del self._queues[name]

    def try_acquire(
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
            self._sweep(now)
            entry = self._live(name, now)
            if queue_ttl is not None:
                # Dicts keep arrival order; refreshing keeps the place.
                self._queues.setdefault(name, {})[owner] = self._expires(name, now + queue_ttl)
            if entry is not None:
                return Attempt(False, holder_ttl=entry.expires_at - now)
            head = self._queue_head(name, now)
            if head is not None and head != owner:
                return Attempt(False, holder_ttl=None)  # every attempt respects the queue
            self._last_token += 1
            self._locks[name] = _Entry(owner, self._last_token, self._expires(name, now + ttl))
            self._leave(name, owner)
            return Attempt(True, token=self._last_token)

    def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        with self._mutex:
            now = self._clock.now()
            entry = self._live(name, now)
            if entry is None:
                return Outcome.EXPIRED
            if entry.owner != owner:
                return Outcome.LOST
            if hold_for > 0:
                entry.owner = None
                entry.expires_at = self._expires(name, now + hold_for)
            else:
                del self._locks[name]
        if hold_for <= 0:
            self.local_bus.notify(name)
        return Outcome.OK

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        with self._mutex:
            now = self._clock.now()
            entry = self._live(name, now)
            if entry is None:
                return Outcome.EXPIRED
            if entry.owner != owner:
                return Outcome.LOST
            entry.expires_at = self._expires(name, now + ttl)
            return Outcome.OK

    def inspect(self, name: str) -> LockInfo | None:
        with self._mutex:
            now = self._clock.now()
            entry = self._live(name, now)
            if entry is None:
                return None
            return LockInfo(name, entry.owner, entry.token, entry.expires_at - now)

    def force_release(self, name: str) -> bool:
        with self._mutex:
            entry = self._live(name, self._clock.now())
            if entry is not None:
                del self._locks[name]
        if entry is not None:
            self.local_bus.notify(name)
        return entry is not None

    def leave_queue(self, name: str, owner: str) -> None:
        with self._mutex:
            was_head = self._queue_head(name, self._clock.now()) == owner
            self._leave(name, owner)
        if was_head:
            self.local_bus.notify(name)

    def close(self) -> None:
        return None
