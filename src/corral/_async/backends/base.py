"""The contract between the lock logic and a backend.

A backend implements a handful of atomic primitives (one round trip each where
the server allows) and declares its capabilities; it never decides anything
about waiting, renewing or errors seen by users: `corral._async.lock` does,
once, for every backend.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from types import TracebackType
from typing import ClassVar, Protocol

from corral._async._compat import Event
from corral.core.capabilities import Capabilities
from corral.core.envelope import claim_due
from corral.core.forks import ProcessLock
from corral.core.options import Option
from corral.core.primitives import Attempt, CacheRead, Claim, LockInfo, Outcome, SemaphoreInfo
from corral.errors import BackendError, ConfigError

__all__ = ["AsyncBackend", "AsyncSubscribingWaiter", "AsyncWaiter", "Feed", "LocalBus"]


class AsyncWaiter:
    """A subscription to the releases of one lock name.

    It is entered *before* the attempt it guards, so a release that lands
    between a failed attempt and the wait still wakes the waiter: no lost
    wake-up. This base form wakes only on releases made in this process (see
    `LocalBus`) and otherwise lets the timeout run out, which is how polling
    backends wait.
    """

    def __init__(self, bus: LocalBus, name: str) -> None:
        self._bus = bus
        self._name = name
        self._event = Event()
        self.owner: str | None = None
        # Whether the lock logic must attempt once more right after entering: yes when
        # a release between the first attempt and the subscription could go unheard.
        self.attempt_on_entering = True

    def for_owner(self, owner: str) -> AsyncWaiter:
        """Wait as this owner, queued for the lock: a backend may then wake only the queue's head.

        May be called before or after entering (a waiter that has waited too long
        joins the queue while subscribed).
        """
        self.owner = owner
        self._owner_changed()
        return self

    def _owner_changed(self) -> None:
        """A subscribed waiter now waits as `self.owner`; backends that route by owner update."""

    async def __aenter__(self) -> AsyncWaiter:
        self._bus.add(self._name, self._event)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bus.discard(self._name, self._event)

    async def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a release; True when one was seen."""
        woken = await self._event.wait(timeout)
        self._event.clear()
        return woken


class Feed(Protocol):
    """A backend's shared source of release notifications (a pub/sub, watch or LISTEN)."""

    @property
    def usable(self) -> bool: ...


class AsyncSubscribingWaiter(AsyncWaiter):
    """A waiter that also hears other processes' releases through a backend's feed.

    Subclasses say how to join and leave a feed; this class keeps the one rule
    that makes wake-ups lossless: entering returns only once the feed confirmed
    the subscription, and when a feed has failed, the next `wait` joins a new one
    and reports a wake-up, so the caller re-attempts only after the new
    subscription is in force and no release falls in between unheard.
    """

    def __init__(self, bus: LocalBus, name: str) -> None:
        super().__init__(bus, name)
        self._feed: Feed | None = None

    async def _join(self) -> Feed:
        """Subscribe this waiter's event to the lock's releases; return once confirmed."""
        raise NotImplementedError

    async def _leave(self, feed: Feed) -> None:
        """Undo one `_join` on `feed`."""
        raise NotImplementedError

    async def __aenter__(self) -> AsyncSubscribingWaiter:
        await super().__aenter__()
        try:
            self._feed = await self._join()
        except BaseException:
            await super().__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        feed, self._feed = self._feed, None
        try:
            if feed is not None:
                await self._leave(feed)
        finally:
            await super().__aexit__(exc_type, exc, tb)

    async def wait(self, timeout: float) -> bool:
        feed = self._feed
        if feed is not None and feed.usable:
            return await super().wait(timeout)
        self._feed = None
        if feed is not None:
            await self._leave(feed)
        try:
            self._feed = await self._join()
        except BackendError:
            # The next attempt will report the server's state; until then, wait it out.
            return await super().wait(timeout)
        self._event.clear()
        return True


class LocalBus:
    """Wakes the waiters of this process when this process releases a lock.

    Cheap and exact for releases made here; backends that can also hear other
    processes' releases (pub/sub, watch, LISTEN) add that on top.
    """

    def __init__(self) -> None:
        # A thread lock in both flavours: the critical sections never await.
        self._mutex = ProcessLock()
        self._waiters: dict[str, set[Event]] = {}

    def add(self, name: str, event: Event) -> None:
        with self._mutex:
            self._waiters.setdefault(name, set()).add(event)

    def discard(self, name: str, event: Event) -> None:
        with self._mutex:
            events = self._waiters.get(name)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[name]

    def notify(self, name: str) -> None:
        if not self._waiters:
            return  # nobody in this process waits for anything: no need to lock
        with self._mutex:
            events = list(self._waiters.get(name, ()))
        for event in events:
            event.set()


class AsyncBackend(abc.ABC):
    """Atomic lock primitives on one kind of server.

    Every method is one atomic operation on the server (a Lua script, a
    transaction, a compare-and-swap), never a client-side read-then-write.
    Times are seconds as floats; the server's clock enforces every TTL.
    """

    capabilities: ClassVar[Capabilities]
    url_options: ClassVar[tuple[Option, ...]] = ()
    """The connection options `from_url` accepts, in the URL's query or as keywords."""

    def __init__(self) -> None:
        self.local_bus = LocalBus()
        # Semaphores have names of their own: a lock and a semaphore may share one.
        self.semaphore_bus = LocalBus()

    @property
    @abc.abstractmethod
    def server(self) -> str:
        """Where this backend points, for error messages; never includes a password."""

    @abc.abstractmethod
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
        """Take the lock if nobody holds it, with a new fencing token, in one atomic step.

        With `queue_ttl` (fair locks) the owner joins the lock's arrival queue
        (or refreshes its place, which expires after `queue_ttl` seconds
        without a refresh) and may take the lock only from the head of it.
        With `replicas` (only where `capabilities.replicas`), a successful
        acquisition waits up to `replica_timeout` seconds for that many
        replicas to have it, on the same connection, and reports the count.
        """

    @abc.abstractmethod
    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        """Compare-and-delete by owner; with `hold_for`, keep it closed and ownerless that long."""

    @abc.abstractmethod
    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        """Compare-and-reset the TTL by owner."""

    @abc.abstractmethod
    async def inspect(self, name: str) -> LockInfo | None:
        """The current holder, token and seconds left, or None when free."""

    @abc.abstractmethod
    async def force_release(self, name: str) -> bool:
        """Delete the lock whoever holds it (operators only); True when something was held."""

    async def leave_queue(self, name: str, owner: str) -> None:
        """Leave a fair lock's queue after giving up; expiry would do it later anyway."""
        raise ConfigError(f"{type(self).__name__} does not support fair=True")

    def waiter(self, name: str) -> AsyncWaiter:
        """Subscribe to releases of `name`; see `AsyncWaiter`."""
        return AsyncWaiter(self.local_bus, name)

    def watcher(self, name: str) -> AsyncWaiter:
        """Like `waiter`, for callers that wait for a release without taking the lock after it
        (a cache waiting for another caller's computation): every one of them must hear
        each release. A backend whose waiters share one wake-up per release (it goes to
        the next in line, who will take the lock) overrides this."""
        return self.waiter(name)

    # -- semaphores: `limit` slots per name, each with its own owner, TTL and token --
    #
    # The same contract as the lock primitives above, per slot: one atomic step
    # each, the server's clock for every TTL, tokens strictly increasing per
    # semaphore name. A release or extend that finds the owner's slot gone
    # answers LOST when every slot is taken now (another may have its slot),
    # else EXPIRED. Backends that keep no semaphores leave these as they are.

    def no_semaphores_error(self) -> ConfigError:
        return ConfigError(
            f"semaphores are not available on {self.capabilities.scheme}:// yet; "
            "use one of the backends whose guarantees table lists them (docs/semaphores.md)"
        )

    async def sem_try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        limit: int,
        *,
        queue_ttl: float | None = None,
    ) -> Attempt:
        """Take a free slot of `limit` with a new fencing token, in one atomic step.

        Refused with `Attempt.limit` set when the current holders took their
        slots with another limit (the limit is part of the semaphore's identity:
        the first holder's wins until every slot is free again). A full
        semaphore answers with `holder_ttl`, the seconds until its soonest slot
        frees. Every attempt respects the queue: it may take a slot only when
        fewer live waiters are ahead of it than slots are free, and an attempt
        without a place has every live waiter ahead of it. With `queue_ttl`, as
        for a fair lock, the owner joins the arrival queue (or keeps its place).
        """
        raise self.no_semaphores_error()

    async def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        """Free the owner's slot; with `hold_for`, keep that slot taken, ownerless, that long."""
        raise self.no_semaphores_error()

    async def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        """Reset the TTL of the owner's slot."""
        raise self.no_semaphores_error()

    async def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        """The limit and live holders (oldest token first), or None when no slot is taken."""
        raise self.no_semaphores_error()

    async def sem_force_release(self, name: str) -> int:
        """Free every slot whoever holds it (operators only); how many were taken."""
        raise self.no_semaphores_error()

    async def sem_leave_queue(self, name: str, owner: str) -> None:
        """Leave a fair semaphore's queue after giving up; expiry would do it later anyway."""
        raise self.no_semaphores_error()

    def sem_waiter(self, name: str) -> AsyncWaiter:
        """Subscribe to the slot releases of semaphore `name`; see `AsyncWaiter`."""
        return AsyncWaiter(self.semaphore_bus, name)

    # -- cache entries: bytes under a key, kept by the server for `keep` seconds --
    #
    # Keys arrive as the cache builds them ("<namespace>:<key>", any str: a backend
    # that refuses some keys maps them deterministically, without collisions in
    # practice); a namespace's generation lives under its own `gen_key`. Entries
    # are opaque bytes except for the fixed header of `corral.core.envelope`,
    # which a backend may read (and `cache_invalidate` rewrites) on the server.
    # `keep` is how long the server keeps an entry, by its own clock; servers
    # that count whole seconds round it up. Freshness is the cache policy's
    # business (the header's fresh_until), never the server's expiry.

    claims_with_read: ClassVar[bool] = False
    """`cache_read` reads and tries the claim in one atomic step, so a claim won on a
    miss needs no second read (the default form reads, then tries the lock)."""

    def no_cache_error(self) -> ConfigError:
        return ConfigError(
            f"caches are not available on {self.capabilities.scheme}:// yet; "
            "use one of the backends whose guarantees table lists them (docs/cache.md)"
        )

    async def cache_fetch(
        self, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int]:
        """The stored bytes of each key (None where missing) and the namespace's generation.

        One round trip where the server allows (a multi-get, a script, a
        statement, a transaction); the generation is 0 when never bumped.
        """
        raise self.no_cache_error()

    async def cache_read(self, key: str, gen_key: str, claim: Claim | None = None) -> CacheRead:
        """One entry and its generation; with `claim`, the recompute lock tried if it is due.

        This form costs a second round trip when the claim is due; backends
        that can read and try the lock in one step (a script, a transaction)
        override it. Either way the backend only compares: `claim.due_before`
        was chosen by the cache policy.
        """
        found, generation = await self.cache_fetch([key], gen_key)
        entry = found[0]
        attempt = None
        if claim is not None and claim_due(entry, generation, claim.due_before):
            attempt = await self.try_acquire(claim.lock, claim.owner, claim.ttl)
        return CacheRead(entry, generation, attempt)

    async def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        """Write each (key, bytes, keep) pair, replacing what was there; one round trip
        where the server allows. Not atomic across keys."""
        raise self.no_cache_error()

    async def cache_delete(self, key: str) -> bool:
        """Remove the entry; True when one was there."""
        raise self.no_cache_error()

    async def cache_invalidate(self, key: str, keep: float) -> bool:
        """Atomically set the entry's fresh_until to 0, keeping its value, for `keep` more
        seconds (`keep <= 0` deletes it); True when one was there."""
        raise self.no_cache_error()

    async def cache_clear(self, gen_key: str) -> int:
        """Atomically bump the namespace's generation (every entry written under an
        older one is a miss from now on, for every client); the new generation."""
        raise self.no_cache_error()

    async def cache_raise_generation(self, gen_key: str, at_least: int) -> int:
        """Atomically set the namespace's generation to max(current, `at_least`); the result.

        How a pool keeps one generation on every server: a clear brings them all
        to one new value, and a server that missed it is brought up to the
        highest one seen before it serves a read.
        """
        raise self.no_cache_error()

    async def cache_count(self, key_prefix: str) -> int | None:
        """How many entries are stored under keys starting with `key_prefix`, where the
        server can list them (None where it cannot, as on memcached)."""
        return None

    # -- many servers: where a key lives ---------------------------------------------
    #
    # A pool of servers (`corral._async.backends.pool`) overrides these; one server
    # answers for itself. The cache asks for a placed view per call, so entries
    # routed by a shard key or kept on several servers reach the right ones while
    # the cache logic stays the same for one server and many.

    @property
    def servers(self) -> tuple[str, ...]:
        """The servers this backend spreads names and entries over (one here)."""
        return (self.server,)

    def placed(
        self, shard: str | None = None, replicas: int = 1, replica_keep: float | None = None
    ) -> AsyncBackend:
        """This backend as it serves cache entries placed by `shard` (instead of by
        each entry's key) and kept on `replicas` distinct servers, reads going to
        one of them; copies on replicas but the first kept at most `replica_keep`
        seconds when given. One server: itself."""
        return self

    def locate(self, key: str) -> str:
        """The server that holds `key` (a stored cache key, or a lock's name)."""
        return self.server

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close connections; the backend is not used afterwards."""
