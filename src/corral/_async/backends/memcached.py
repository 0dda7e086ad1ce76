"""`memcached://host:port`: locks on one memcached server (>= 1.6.10, for the meta protocol).

The keys, values and the meta protocol's framing live in
`corral.backends.memcached_proto` (no I/O, shared by both flavours); the
connections and round trips in `memcached_conn`, the atomic steps of each
primitive and the waiting queue in `memcached_locks` beside this file (their
docstrings say why each is as it is, and why corral speaks the meta protocol
itself instead of going through pymemcache). This class delegates to them and
wakes this process's waiters.

**asyncio all the way down.** In this flavour every round trip is awaited on
an asyncio transport: no thread per call, and a cancelled call stops where it
is (its connection is closed, never reused; see "Cancellation" in
`memcached_conn`). The blocking flavour is generated from these same files, so
the protocol and the connection handling still exist once; only the stream
underneath (`Stream` in `_compat`) is written twice. An acquisition cancelled
after its compare-and-swap was sent may have taken the lock: the lock logic
runs every attempt to its end in a task of its own and releases what it took
only then, so that release never overtakes the acquisition it undoes.

memcached cannot push a release to other processes, so their waiters poll
with the lock logic's capped, jittered backoff; releases made in this process
wake its waiters at once through the local bus. Fair locks and waiters that
pass `queue_ttl` keep places in a queue built from memcached's atomic steps
(see `memcached_locks`): in arrival order, each alive only
while its waiter refreshes it, respected by every attempt; an eviction or a
restart can reorder or forget the queue, never break exclusion.

Semaphores (`memcached_slots`) keep a key per slot, each
taken as a free lock is, and poll the same way: a slot released in this
process wakes this process's waiters of that semaphore through
`semaphore_bus`; others find the free slot at their next attempt.

Cache entries (`memcached_cache`) are items kept by memcached's
own expiry, read with their namespace's generation in one round trip. A read
that asks for a claim uses the base class's form: the read, then, only when the
entry is due, a lock attempt (the lock's own, with its token and its wake-ups).
memcached runs no scripts, so the two cannot be one atomic step; sending the
lock's probe along with every read would save a round trip on a due entry only
by making every read of a fresh entry write (a placeholder, and a draw from the
fencing counter every client shares), so it is not done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from corral._async.backends.base import AsyncBackend
from corral._async.backends.memcached_cache import MemcachedCache
from corral._async.backends.memcached_locks import MemcachedLocks
from corral._async.backends.memcached_slots import MemcachedSemaphores
from corral.backends.memcached_proto import OPTIONS, MemcachedOptions, parse_url
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.options import Option
from corral.core.primitives import Attempt, LockInfo, Outcome, SemaphoreInfo
from corral.errors import ConfigError

__all__ = ["AsyncMemcachedBackend"]


class AsyncMemcachedBackend(AsyncBackend):
    capabilities: ClassVar[Capabilities] = Capabilities(
        scheme="memcached",
        notifies=False,
        cross_process=True,
        cross_host=True,
        # One server does serialise every command on a key, but a lock can vanish
        # under a holder (eviction, restart), and nothing replicates it.
        linearizable=False,
        fair=True,
        replicas=False,
        ttl_slack=3.0,
        ttl_clock=(
            "the memcached server's clock, in whole seconds: a lock is stored for "
            "ceil(ttl) + 2 s, so it never ends before its ttl and may outlast it by up to 3 s"
        ),
        on_client_crash=(
            "the lock stays held until its TTL runs out on the server (up to 3 s late, "
            "memcached counting whole seconds), then anyone may take it"
        ),
        on_server_restart=(
            "a restart (unless graceful, in memcached's restartable mode -e) or flush_all "
            "forgets every lock and queue, so a holder can overlap with a new one and waiters "
            "rejoin in a new order; fencing tokens still increase (see fencing tokens)"
        ),
        on_partition=(
            "one server, no replication: a client cut off from it cannot acquire, extend or "
            "release (BackendUnavailable within the timeout); its lock stays on the server "
            "until the TTL runs out"
        ),
        on_memory_pressure=(
            "a full memcached evicts least recently used items, held locks included: the lock "
            "silently frees and another process can acquire it while the first still works, "
            "so only the fencing token protects downstream storage; an evicted place or queue "
            "only loses the order of waiting; give locks a memcached of their own, or start "
            "it with -M, where a full server refuses new locks instead"
        ),
        fencing_tokens=(
            "one counter per server and key prefix (`<prefix>:fence`), drawn (`ma`, atomic) by "
            "every attempt in the round trip that finds the lock free; the lock is then taken by "
            "compare-and-swap on the free state that round trip saw, so no acquisition can come "
            "between the token and the lock. A "
            "lost counter (restart, flush_all, eviction) restarts at the current time in "
            "microseconds on the client that finds it missing: order across that loss needs "
            "clocks in sync (NTP) and fewer than a million attempts a second on average"
        ),
        state_per_name=(
            "nothing: a released lock is deleted, an expired one or one closed by hold_for "
            "vanishes by ceil(ttl) + 2 s, the placeholder a free lock's probe leaves within "
            "3 s, a waiter's place and the queue by ceil(queue_ttl) + 2 s after the last "
            "refresh; one counter per server and prefix stays; a semaphore's slots go as a "
            "lock's do, and its header (the limit) by 2 ceil(ttl) + 2 s after the last "
            "acquisition or extension"
        ),
        semaphores=(
            "a key per slot (`<name>#<i>`, i < limit <= 100), each taken by compare-and-swap on "
            "the placeholder its probe left, with the limit in a header key"
        ),
        cache=(
            "an item per entry, kept by memcached's whole-second expiry (ceil(keep) + 2 s) "
            "unless evicted first, read with the namespace's generation counter in one round "
            "trip; a due read then tries the lock (a second step, not atomic with the read)"
        ),
    )

    url_options: ClassVar[tuple[Option, ...]] = OPTIONS

    def __init__(self, options: MemcachedOptions) -> None:
        super().__init__()
        self._locks = MemcachedLocks(options)
        self._semaphores = MemcachedSemaphores(self._locks.client, options)
        self._cache = MemcachedCache(self._locks.client)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> AsyncMemcachedBackend:
        """Open a backend on `url`; the clock is unused, as the server's clock decides expiry."""
        return cls(parse_url(url, options))

    @property
    def server(self) -> str:
        return self._locks.server

    @property
    def prefix(self) -> str:
        return self._locks.prefix

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
        if replicas:
            raise ConfigError(f"{self.server} does not support replicas=N")
        return await self._locks.try_acquire(name, owner, ttl, queue_ttl)

    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        outcome = await self._locks.release(name, owner, hold_for)
        if outcome is Outcome.OK and hold_for <= 0:
            self.local_bus.notify(name)
        return outcome

    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        return await self._locks.extend(name, owner, ttl)

    async def inspect(self, name: str) -> LockInfo | None:
        return await self._locks.inspect(name)

    async def force_release(self, name: str) -> bool:
        released = await self._locks.force_release(name)
        if released:
            self.local_bus.notify(name)
        return released

    async def leave_queue(self, name: str, owner: str) -> None:
        if await self._locks.leave_queue(name, owner):
            self.local_bus.notify(name)  # the next in line may be waiting in this process

    # -- semaphores: a slot key per slot, each taken as a free lock is -------------

    async def sem_try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        limit: int,
        *,
        queue_ttl: float | None = None,
    ) -> Attempt:
        return await self._semaphores.try_acquire(name, owner, ttl, limit, queue_ttl)

    async def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        outcome = await self._semaphores.release(name, owner, hold_for)
        if outcome is Outcome.OK and hold_for <= 0:
            self.semaphore_bus.notify(name)
        return outcome

    async def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        return await self._semaphores.extend(name, owner, ttl)

    async def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        return await self._semaphores.inspect(name)

    async def sem_force_release(self, name: str) -> int:
        freed = await self._semaphores.force_release(name)
        if freed:
            self.semaphore_bus.notify(name)
        return freed

    async def sem_leave_queue(self, name: str, owner: str) -> None:
        await self._semaphores.leave_queue(name, owner)
        # A waiter behind this one may now be among those a free slot lets in.
        self.semaphore_bus.notify(name)

    # -- cache entries: an item per entry, a counter per namespace ------------------

    async def cache_fetch(
        self, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int]:
        return await self._cache.fetch(list(keys), gen_key)

    async def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        await self._cache.store(list(items))

    async def cache_delete(self, key: str) -> bool:
        return await self._cache.delete(key)

    async def cache_invalidate(self, key: str, keep: float) -> bool:
        return await self._cache.invalidate(key, keep)

    async def cache_clear(self, gen_key: str) -> int:
        return await self._cache.clear(gen_key)

    async def aclose(self) -> None:
        self._locks.close()

    async def cache_raise_generation(self, gen_key: str, at_least: int) -> int:
        """Raise the namespace's generation to at least `at_least` (never lower it); the
        generation it has then. One compare-and-swap, again if a clear came in between."""
        return await self._cache.raise_generation(gen_key, at_least)
