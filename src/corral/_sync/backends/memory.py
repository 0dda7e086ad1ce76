# Generated from src/corral/_async/backends/memory.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`memory://`: locks inside one process, for tests and single-process programs.

The "server" is a dict guarded by a thread lock and the "server clock" is the
store's clock, so a test can inject a fake one. Every primitive is a few dict
operations under that lock: atomic by construction.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from corral._sync.backends.base import Backend
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock, SystemClock
from corral.core.envelope import claim_due, mark_stale
from corral.core.forks import ProcessLock
from corral.core.options import merge_options
from corral.core.primitives import Attempt, CacheRead, Claim, LockInfo, Outcome, SemaphoreInfo

__all__ = ["MemoryBackend"]


@dataclass(slots=True)
class _Entry:
    owner: str | None
    token: int
    expires_at: float


@dataclass(slots=True)
class _Semaphore:
    limit: int
    # Slots by owner; a slot kept closed by hold_for is keyed by its token instead.
    slots: dict[str, _Entry]


# Which table an expiry in the heap belongs to.
_LOCK, _SEMAPHORE, _CACHE = 0, 1, 2


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
        semaphores="a dict of slots per name, in the process",
        cache="a dict of entries, in the process; one call reads and claims",
    )

    claims_with_read: ClassVar[bool] = True

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
        self._semaphores: dict[str, _Semaphore] = {}
        self._sem_queues: dict[str, dict[str, float]] = {}
        # Cache entries: key -> (bytes, expires_at); namespace generations.
        self._entries: dict[str, tuple[bytes, float]] = {}
        self._generations: dict[str, int] = {}
        # (when, table, name): every expiry ever set, soonest first, so expired entries
        # of names nobody looks up again are still dropped (see `_sweep`).
        self._expiries: list[tuple[float, int, str]] = []
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

    def _expires(self, name: str, when: float, table: int = _LOCK) -> float:
        heapq.heappush(self._expiries, (when, table, name))
        if len(self._expiries) > 2 * self._live_after_rebuild + 64:
            # Superseded expiries (a lock extended, released, or acquired again) would
            # otherwise pile up until their time comes: rebuild from what is live. The
            # heap has at least doubled since the last rebuild, so the cost per push
            # stays constant, however many locks and queue places there are.
            live = [(entry.expires_at, _LOCK, n) for n, entry in self._locks.items()]
            live += [(t, _LOCK, n) for n, queue in self._queues.items() for t in queue.values()]
            live += [
                (entry.expires_at, _SEMAPHORE, n)
                for n, sem in self._semaphores.items()
                for entry in sem.slots.values()
            ]
            live += [
                (t, _SEMAPHORE, n) for n, queue in self._sem_queues.items() for t in queue.values()
            ]
            live += [(t, _CACHE, key) for key, (_, t) in self._entries.items()]
            live.append((when, table, name))
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
            _, table, name = heapq.heappop(self._expiries)
            if table == _LOCK:
                self._live(name, now)
                self._queue_head(name, now)
            elif table == _CACHE:
                self._live_entry(name, now)
            else:
                self._live_slots(name, now)
                self._queue_places(self._sem_queues, name, now)

    def _live(self, name: str, now: float) -> _Entry | None:
        entry = self._locks.get(name)
        if entry is not None and entry.expires_at <= now:
            del self._locks[name]
            return None
        return entry

    def _queue_head(self, name: str, now: float) -> str | None:
        """The first live waiter in the queue of `name`, after dropping expired places."""
        queue = self._queue_places(self._queues, name, now)
        return None if queue is None else next(iter(queue))

    @staticmethod
    def _queue_places(
        queues: dict[str, dict[str, float]], name: str, now: float
    ) -> dict[str, float] | None:
        """The live places of the queue of `name`, in arrival order, or None when empty."""
        queue = queues.get(name)
        if queue is None:
            return None
        for waiter, expires_at in list(queue.items()):
            if expires_at <= now:
                del queue[waiter]
        if not queue:
            del queues[name]
            return None
        return queue

    def _leave(
        self, name: str, owner: str, queues: dict[str, dict[str, float]] | None = None
    ) -> None:
        queues = self._queues if queues is None else queues
        queue = queues.get(name)
        if queue is not None:
            queue.pop(owner, None)
            if not queue:
                del queues[name]

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
            return self._attempt(name, owner, ttl, queue_ttl, now)

    def _attempt(
        self, name: str, owner: str, ttl: float, queue_ttl: float | None, now: float
    ) -> Attempt:
        """One attempt; the caller holds `self._mutex`."""
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

    # -- semaphores ---------------------------------------------------------------

    def _live_slots(self, name: str, now: float) -> _Semaphore | None:
        sem = self._semaphores.get(name)
        if sem is None:
            return None
        for key, entry in list(sem.slots.items()):
            if entry.expires_at <= now:
                del sem.slots[key]
        if not sem.slots:
            del self._semaphores[name]
            return None
        return sem

    def _slot_gone(self, sem: _Semaphore | None) -> Outcome:
        return Outcome.LOST if sem is not None and len(sem.slots) >= sem.limit else Outcome.EXPIRED

    def sem_try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        limit: int,
        *,
        queue_ttl: float | None = None,
    ) -> Attempt:
        with self._mutex:
            now = self._clock.now()
            self._sweep(now)
            sem = self._live_slots(name, now)
            if sem is not None and sem.limit != limit:
                return Attempt(False, limit=sem.limit)
            if queue_ttl is not None:
                places = self._sem_queues.setdefault(name, {})
                places[owner] = self._expires(name, now + queue_ttl, _SEMAPHORE)
            taken = 0 if sem is None else len(sem.slots)
            if taken >= limit:
                assert sem is not None
                soonest = min(entry.expires_at for entry in sem.slots.values())
                return Attempt(False, holder_ttl=soonest - now)
            queue = self._queue_places(self._sem_queues, name, now)
            if queue is not None:
                # Every live place ahead of this owner (all of them, when it has none)
                # takes a free slot first.
                arrivals = list(queue)
                ahead = arrivals.index(owner) if owner in queue else len(arrivals)
                if ahead >= limit - taken:
                    return Attempt(False, holder_ttl=None)
            if sem is None:
                sem = self._semaphores[name] = _Semaphore(limit, {})
            self._last_token += 1
            expires_at = self._expires(name, now + ttl, _SEMAPHORE)
            sem.slots[owner] = _Entry(owner, self._last_token, expires_at)
            self._leave(name, owner, self._sem_queues)
            return Attempt(True, token=self._last_token)

    def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        with self._mutex:
            now = self._clock.now()
            sem = self._live_slots(name, now)
            entry = None if sem is None else sem.slots.get(owner)
            if sem is None or entry is None:
                return self._slot_gone(sem)
            del sem.slots[owner]
            if hold_for > 0:
                entry.owner = None
                entry.expires_at = self._expires(name, now + hold_for, _SEMAPHORE)
                sem.slots[f"\0held:{entry.token}"] = entry
            elif not sem.slots:
                del self._semaphores[name]
        if hold_for <= 0:
            self.semaphore_bus.notify(name)
        return Outcome.OK

    def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        with self._mutex:
            now = self._clock.now()
            sem = self._live_slots(name, now)
            entry = None if sem is None else sem.slots.get(owner)
            if entry is None:
                return self._slot_gone(sem)
            entry.expires_at = self._expires(name, now + ttl, _SEMAPHORE)
            return Outcome.OK

    def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        with self._mutex:
            now = self._clock.now()
            sem = self._live_slots(name, now)
            if sem is None:
                return None
            holders = sorted(sem.slots.values(), key=lambda entry: entry.token)
            return SemaphoreInfo(
                name,
                sem.limit,
                tuple(LockInfo(name, e.owner, e.token, e.expires_at - now) for e in holders),
            )

    def sem_force_release(self, name: str) -> int:
        with self._mutex:
            sem = self._live_slots(name, self._clock.now())
            if sem is not None:
                del self._semaphores[name]
        if sem is not None:
            self.semaphore_bus.notify(name)
        return 0 if sem is None else len(sem.slots)

    def sem_leave_queue(self, name: str, owner: str) -> None:
        with self._mutex:
            self._leave(name, owner, self._sem_queues)
        # A waiter behind this one may now be among those a free slot lets in.
        self.semaphore_bus.notify(name)

    # -- cache entries ---------------------------------------------------------

    def _live_entry(self, key: str, now: float) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            return None
        if found[1] <= now:
            del self._entries[key]
            return None
        return found[0]

    def cache_fetch(self, keys: Sequence[str], gen_key: str) -> tuple[list[bytes | None], int]:
        with self._mutex:
            now = self._clock.now()
            self._sweep(now)
            return [self._live_entry(key, now) for key in keys], self._generations.get(gen_key, 0)

    def cache_read(self, key: str, gen_key: str, claim: Claim | None = None) -> CacheRead:
        with self._mutex:
            now = self._clock.now()
            self._sweep(now)
            entry = self._live_entry(key, now)
            generation = self._generations.get(gen_key, 0)
            attempt = None
            if claim is not None and claim_due(entry, generation, claim.due_before):
                attempt = self._attempt(claim.lock, claim.owner, claim.ttl, None, now)
            return CacheRead(entry, generation, attempt)

    def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        with self._mutex:
            now = self._clock.now()
            for key, data, keep in items:
                if keep <= 0:
                    self._entries.pop(key, None)
                    continue
                self._entries[key] = (bytes(data), self._expires(key, now + keep, _CACHE))

    def cache_delete(self, key: str) -> bool:
        with self._mutex:
            now = self._clock.now()
            found = self._live_entry(key, now) is not None
            self._entries.pop(key, None)
            return found

    def cache_invalidate(self, key: str, keep: float) -> bool:
        with self._mutex:
            now = self._clock.now()
            data = self._live_entry(key, now)
            if data is None:
                return False
            stale = mark_stale(data) if keep > 0 else None
            if stale is None:
                del self._entries[key]
            else:
                self._entries[key] = (stale, self._expires(key, now + keep, _CACHE))
            return True

    def cache_clear(self, gen_key: str) -> int:
        with self._mutex:
            generation = self._generations.get(gen_key, 0) + 1
            self._generations[gen_key] = generation
            return generation

    def cache_count(self, key_prefix: str) -> int | None:
        with self._mutex:
            now = self._clock.now()
            self._sweep(now)
            return sum(1 for key in self._entries if key.startswith(key_prefix))

    def close(self) -> None:
        return None
