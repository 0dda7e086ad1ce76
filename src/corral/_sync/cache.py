# Generated from src/corral/_async/cache.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""The read-through cache: performs what `corral.core.cachepolicy` decides.

Every decision (fresh, stale, missing, XFetch, remembered errors) is made by
the policy; this driver only reads, claims, computes, stores and waits, and
keeps the promises that need I/O: a claim won in the read's own round trip is
adopted by a real lock handle (renewed while the computation runs, released
after, waking the waiters), a cancelled read gives its claim back, one
computation per key per process (`Flights`), and a server that fails turns
into computing through rather than an outage.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import random
import string
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from corral._sync import _compat
from corral._sync._compat import (
    Flights,
    call_and_await,
    refuse_coroutine_function,
    start_job,
    undo_if_interrupted,
)
from corral._sync.backends.base import Backend
from corral._sync.lock import Lock
from corral.core import cachepolicy as policy
from corral.core.cachepolicy import Action, CacheOptions
from corral.core.envelope import Codec, Entry, decode, encode, remember_error, with_generation
from corral.core.hotkeys import HotKeys
from corral.core.lockflow import WaitPlan
from corral.core.nearcache import NearCache
from corral.core.placement import recompute_lock_name
from corral.core.primitives import Attempt, CacheRead, Claim, PartialFetch
from corral.core.stats import CACHE_COUNTERS, CACHE_HISTOGRAMS
from corral.errors import BackendError, ConfigError, LockError, LockTimeout, SourceUnavailable

if TYPE_CHECKING:
    from corral._sync.store import Store

__all__ = ["Cache", "Refresher", "check_replicas"]

log = logging.getLogger("corral.cache")

F = TypeVar("F", bound=Callable[..., Any])

# The recompute lock: held while one caller computes, renewed if that takes long,
# freed by its TTL if the computing process dies.
RECOMPUTE_LOCK_TTL = 10.0
# A server error is logged at most once per this many seconds per cache.
LOG_EVERY = 10.0
NEAR_CACHE_ENTRIES = 1024
# How many keys' freshness a handle remembers (see `_plain_read`).
HINTS_KEPT = 4096
# A refresher round keeps its lock closed this share of the period after refreshing,
# so processes whose refreshers are out of phase do not each refresh every period.
ROUND_HOLD = 0.9
# A write uses the namespace generation this process saw this recently instead of
# asking for it: a write that lands just after another process's clear() is then
# written under the old generation, which readers treat as missing (a lost write,
# never a value that survives the clear).
GENERATION_REUSE = 1.0
# How many servers of a pool a hot key is copied to while it is hot.
HOT_REPLICAS = 3
_MISSING: Any = object()
_LOCAL_HIT = ("hits", "local_hits")
_FAILED: Any = object()
# The keys whose computation runs in this context (a computation asking for its own
# key would otherwise wait for itself), and how the value a lookup returned was
# counted (so the callers that shared its flight count the same).
_LEADING: contextvars.ContextVar[frozenset[tuple[int, str]]] = contextvars.ContextVar(
    "corral_cache_leading", default=frozenset()
)
_SERVED_AS: contextvars.ContextVar[str] = contextvars.ContextVar(
    "corral_cache_served_as", default="hits"
)


def _check_key(key: object, what: str = "key") -> str:
    if not isinstance(key, str):
        raise TypeError(f"cache {what} must be str, not {type(key).__name__}")
    return key


def check_replicas(replicas: object, backend: Backend) -> int:
    """How many servers `replicas` (an int, or "all") means on `backend`; ConfigError if none."""
    servers = len(backend.servers)
    if replicas == "all":
        return servers
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"replicas must be an integer >= 1 or 'all', got {replicas!r}")
    if replicas > servers:
        raise ConfigError(
            f"replicas={replicas}: {backend.server} has {servers} server"
            f"{'s' if servers > 1 else ''}; an entry can be kept on at most that many "
            "(replicas > 1 needs a pool of servers, docs/sharding.md; 'all' means every one)"
        )
    return replicas


class _ThrottledLog:
    """Logs a failing server once per interval, not once per call (a down server is hot)."""

    def __init__(self, every: float) -> None:
        self._every = every
        self._last = float("-inf")
        self._skipped = 0

    def warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last < self._every:
            self._skipped += 1
            return
        skipped, self._skipped, self._last = self._skipped, 0, now
        suffix = f" ({skipped} more since the last report)" if skipped else ""
        log.warning(message + suffix, *args)


class CacheShared:
    """What the handles on one namespace of one store share.

    The near cache (a delete through one handle is seen through the others),
    the in-process flights, the namespace generation last seen, and the values
    on offer while a computation runs: `interim[key] = (value, fresh_until,
    offered_at, epoch)`, the entry a caller here is recomputing, which other
    callers here may be served as any reader elsewhere would be (fresh, or
    stale within their own `stale_ttl`) instead of waiting for it.
    """

    def __init__(self, near: NearCache, flights: Flights) -> None:
        self.near = near
        self.flights = flights
        self.generation: tuple[int, float] | None = None
        self.interim: dict[str, tuple[Any, float, float, int]] = {}


@dataclass(frozen=True, slots=True)
class _Route:
    """Where one call's entry lives: the backend placed for it (by its shard key, on its
    replicas), the shard key its recompute lock follows, and what `jitter_by="key"`
    hashes (the shard key, else the key)."""

    backend: Backend
    jitter_key: str
    shard: str | None


class Cache:
    """A stampede-proof read-through cache in one namespace of a store; see docs/cache.md.

    Created by `Store.cache()`. Safe to share between tasks (threads in
    the blocking flavour). Handles on one namespace of one store share their
    near cache and their in-process flights.
    """

    def __init__(
        self,
        store: Store,
        namespace: str,
        options: CacheOptions,
        codec: Codec,
        codecs: Mapping[str, Codec],
        *,
        shared: CacheShared,
        replicas: int = 1,
        hot_keys: bool = False,
    ) -> None:
        self._store = store
        self._backend = store.backend
        self.replicas = replicas
        """How many servers of a pool keep each entry (1 on one server)."""
        # Hot keys found from a sample of reads, copied to HOT_REPLICAS servers of a pool
        # while they stay hot.
        self._hot = HotKeys(store.clock.now) if hot_keys else None
        self.namespace = namespace
        self.options = options
        self._codec = codec
        self._codecs = dict(codecs)
        self._shared = shared
        self._flights = shared.flights
        self._shared_near = shared.near
        self._stats = store.metrics.cache(namespace, CACHE_COUNTERS, CACHE_HISTOGRAMS)
        self._errors = _ThrottledLog(LOG_EVERY)
        # Until when each key read or written here was fresh: while a key is expected
        # fresh, a plain read (no claim) is enough, and cheaper on the server.
        self._fresh_hints: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.namespace!r} on {self._backend.server}>"

    @property
    def _near(self) -> NearCache | None:
        """The near cache, when this handle uses one (`local_ttl`)."""
        return self._shared_near if self.options.local_ttl else None

    # -- names on the server -----------------------------------------------------

    def stored_key(self, key: str) -> str:
        """The key as stored: the namespace, a colon, the key (namespaces have no colon)."""
        return f"{self.namespace}:{key}"

    def _user_key(self, stored: str) -> str:
        return stored[len(self.namespace) + 1 :]

    @property
    def _gen_key(self) -> str:
        return self.namespace

    def _route(self, key: str, shard_key: str | None, replicas: object = None) -> _Route:
        """Where `key`'s entry lives for this call."""
        count = self.replicas if replicas is None else check_replicas(replicas, self._backend)
        replica_keep = None
        hot = self._hot
        if hot is not None:
            placement = self.stored_key(key) if shard_key is None else shard_key
            hot.observe(placement, self._backend.locate, random.random())
            if count < HOT_REPLICAS and hot.is_hot(placement):
                count = max(count, min(HOT_REPLICAS, len(self._backend.servers)))
                # Writes after the spell go to the first server only: a copy made for
                # it must not be served for long after.
                replica_keep = hot.window
        backend = (
            self._backend
            if shard_key is None and count == 1
            else self._backend.placed(shard_key, count, replica_keep)
        )
        return _Route(backend, key if shard_key is None else shard_key, shard_key)

    def _everywhere(self, shard_key: str | None) -> Backend:
        """Every server that may keep an entry (replicas, hot keys, a server that was
        down): where a delete or an invalidation must go."""
        servers = len(self._backend.servers)
        if servers == 1:
            return self._backend
        return self._backend.placed(shard_key, servers)

    def hot_keys(self) -> list[str]:
        """The keys (as stored, or their shard keys) found hot in the last window."""
        return [] if self._hot is None else [hot.key for hot in self._hot.hot()]

    def _lock(self, stored: str, shard: str | None = None) -> Lock:
        lock = self._store.lock(
            recompute_lock_name(stored, shard), RECOMPUTE_LOCK_TTL, auto_renew=True
        )
        lock.shown_name = f"recompute of cache key {stored!r}"
        return lock

    def _wall(self) -> float:
        return self._store.wall_clock.now()

    # -- the namespace generation ------------------------------------------------

    def _seen(self, generation: int) -> None:
        """Remember the generation a reply carried.

        Generations only grow, so a lower one arriving soon after a higher one is
        a late reply to a read sent before a clear(): ignored, or a write would go
        under the retired generation. Past `GENERATION_REUSE` the server's word is
        taken as it is (a server that restarted empty counts from 0 again).
        """
        now = self._store.clock.now()
        known = self._shared.generation
        if known is None or generation >= known[0] or now - known[1] >= GENERATION_REUSE:
            self._shared.generation = (generation, now)

    def _current_generation(self) -> int:
        known = self._shared.generation
        if known is not None and self._store.clock.now() - known[1] < GENERATION_REUSE:
            return known[0]
        _, generation = self._backend.cache_fetch([], self._gen_key)
        self._seen(generation)
        known = self._shared.generation
        return generation if known is None else known[0]

    # -- reading -----------------------------------------------------------------

    def _decode(self, stored: str, data: bytes | None, generation: int) -> Entry | None:
        self._seen(generation)
        if data is None:
            return None
        try:
            entry = decode(data, self._codecs, stored)
        except ValueError as exc:
            log.warning(
                "cache key %r on %s: ignoring an entry that does not decode (%s); "
                "it counts as a miss and is replaced by the next computation",
                stored,
                self._backend.server,
                exc,
            )
            return None
        if entry.header.generation != generation:
            return None  # written before the namespace was last cleared
        return entry

    def _backend_failed(self, action: str, stored: str, exc: BaseException) -> None:
        self._stats.add("backend_errors")
        self._errors.warn(
            "cache %r on %s: %s of %r failed (%s); going on without the cache",
            self.namespace,
            self._backend.server,
            action,
            stored,
            exc,
        )

    def _claiming_read(
        self, stored: str, lock: Lock, now: float, route: _Route
    ) -> tuple[CacheRead, str, float]:
        """Read the entry, claiming the recompute lock if it is due; cancellation-safe."""
        owner = lock.new_owner()
        sent_at = lock.clock_now()
        claim = Claim(lock.name, owner, lock.ttl, due_before=now)

        def read() -> CacheRead:
            return route.backend.cache_read(stored, self._gen_key, claim)

        def undo(result: CacheRead | None) -> None:
            # Interrupted before the answer: the claim may have been granted.
            if result is None or (result.attempt is not None and result.attempt.acquired):
                lock.take_back(owner)

        return undo_if_interrupted(read, undo), owner, sent_at

    def _judge(
        self, stored: str, lock: Lock, read: CacheRead, owner: str, now: float, draw: float
    ) -> tuple[Entry | None, policy.Decision]:
        """Decode a claiming read and ask the policy; a claim nobody will use is given back.

        An interruption here (Ctrl-C in the blocking flavour, while a large value
        decodes) gives the claim back too, rather than leaving it held for its TTL.
        """
        won = read.attempt is not None and read.attempt.acquired
        try:
            entry = self._decode(stored, read.entry, read.generation)
            decision = policy.decide(
                entry,
                now=now,
                won=None if read.attempt is None else won,
                options=self.options,
                draw=draw,
            )
        except BaseException:
            if won:
                lock.take_back(owner)
            raise
        if won and decision.action not in (Action.RECOMPUTE, Action.RECOMPUTE_IN_BACKGROUND):
            lock.take_back(owner)  # claimed, but nothing needs computing now
        return entry, decision

    def get_or_compute(
        self,
        key: str,
        compute: Callable[[], Any],
        *,
        ttl: float | None = None,
        shard_key: str | None = None,
        replicas: int | str | None = None,
    ) -> Any:
        """The cached value of `key`, computing it with `compute()` at most once per expiry.

        See docs/cache.md for what happens when the entry is stale, missing, or
        the computation or the server fails.
        """
        _check_key(key)
        if shard_key is not None:
            _check_key(shard_key, "shard_key")
        if not callable(compute):
            raise TypeError(f"compute must be callable, got {compute!r}")
        seconds = (
            self.options.ttl if ttl is None else policy.check_seconds("ttl", ttl, positive=True)
        )
        near = self._near
        if near is not None:
            hit, value = near.get(key, self.options.local_ttl)
            if hit:
                self._stats.add_each(_LOCAL_HIT)
                return value
        route = self._route(key, shard_key, replicas)
        # One draw for XFetch per call, whichever read judges the entry.
        draw = 1.0 - random.random()
        hint = self._fresh_hints.get(key)
        if hint is not None and self._wall() < hint:
            value = self._plain_read(key, draw, route)
            if value is _FAILED:
                # The server is failing: compute (once in this process), no second wait.
                return self._through_once(key, compute, seconds, route)
            if value is not _MISSING:
                return value
        leading = (id(self._flights), key)
        if leading in _LEADING.get():
            raise LockError(
                f"cache key {self.stored_key(key)!r} on {self._backend.server}: its "
                "computation asks for its own key, which would wait for itself forever; "
                "compute the value directly there"
            )

        def lookup() -> tuple[Any, str]:
            marks = _LEADING.set(_LEADING.get() | {leading})
            served_as = _SERVED_AS.set("hits")
            try:
                value = self._lookup(key, compute, seconds, route, draw)
                return value, _SERVED_AS.get()
            finally:
                _SERVED_AS.reset(served_as)
                _LEADING.reset(marks)

        offered = self._take_offer(key)
        if offered is not _MISSING:
            return offered
        try:
            (value, served_as), led = self._flights.run(key, lookup, self.options.lock_wait)
        except TimeoutError:
            # This process's computation of the key outlasted lock_wait.
            offered = self._take_offer(key)
            if offered is not _MISSING:
                return offered
            self._stats.add("lock_timeouts")
            if self.options.on_timeout == "raise":
                raise self._timeout_error(self.stored_key(key), None) from None
            return self._through_once(key, compute, seconds, route, write=True)
        if not led:
            self._stats.add(served_as)  # counted as the caller whose read it shared
        return value

    def _plain_read(self, key: str, draw: float, route: _Route) -> Any:
        """A read without a claim, for a key expected fresh: its value if the policy says
        to return it as it is, else `_MISSING` (the caller then reads and claims).

        A fresh hit costs the server a plain read instead of a script or a
        transaction; a key that turned out due costs one round trip more, once.
        """
        stored = self.stored_key(key)
        now = self._wall()
        epoch = self._shared_near.epoch
        try:
            (data,), generation = route.backend.cache_fetch([stored], self._gen_key)
        except BackendError as exc:
            self._backend_failed("the read", stored, exc)
            self._fresh_hints.pop(key, None)
            return _FAILED
        entry = self._decode(stored, data, generation)
        decision = policy.decide(entry, now=now, won=None, options=self.options, draw=draw)
        if entry is not None and decision.action is Action.RETURN and not decision.stale:
            return self._served(key, entry, now, epoch, stale=False)
        if entry is None or not entry.has_value or now >= entry.header.fresh_until:
            self._fresh_hints.pop(key, None)  # still fresh when XFetch fired: keep the hint
        return _MISSING

    def _through_once(
        self,
        key: str,
        compute: Callable[[], Any],
        ttl: float,
        route: _Route,
        *,
        write: bool = False,
    ) -> Any:
        """Compute without the lock, once for every caller here that needs it now."""

        def through() -> Any:
            return self._compute_through(
                self.stored_key(key), compute, ttl, route, None, None, write=write
            )

        value, _ = self._flights.run(("through", key), through)
        return value

    def _take_offer(self, key: str) -> Any:
        """The value another caller here is recomputing, if this caller may be served it."""
        offer = self._shared.interim.get(key)
        if offer is None:
            return _MISSING
        value, fresh_until, offered_at, epoch = offer
        if epoch != self._shared_near.epoch:
            return _MISSING  # deleted, invalidated or cleared here since it was read
        now = self._wall()
        if now < fresh_until:
            self._stats.add("hits")
            return value
        stale_ttl = self.options.stale_ttl
        since = offered_at if fresh_until == 0.0 else fresh_until
        if stale_ttl > 0 and now < since + stale_ttl:
            self._stats.add("stale_served")
            return value
        return _MISSING

    def _offering(
        self, key: str, entry: Entry | None, epoch: int, compute: Callable[[], Any]
    ) -> Any:
        """Run this caller's recompute of `entry` with `entry` on offer meanwhile."""
        if entry is None or not entry.has_value or epoch != self._shared_near.epoch:
            return compute()
        self._shared.interim[key] = (entry.value, entry.header.fresh_until, self._wall(), epoch)
        try:
            return compute()
        finally:
            self._shared.interim.pop(key, None)

    def _hint(self, key: str, fresh_until: float) -> None:
        hints = self._fresh_hints
        if len(hints) >= HINTS_KEPT and key not in hints:
            hints.clear()  # bounded; a key read again is hinted again
        hints[key] = fresh_until

    def _lookup(
        self, key: str, compute: Callable[[], Any], ttl: float, route: _Route, draw: float
    ) -> Any:
        stored = self.stored_key(key)
        lock = self._lock(stored, route.shard)
        now = self._wall()
        epoch = self._shared_near.epoch
        try:
            read, owner, sent_at = self._claiming_read(stored, lock, now, route)
        except BackendError as exc:
            self._backend_failed("the read", stored, exc)
            # The server is failing: compute, and do not wait on it again to store.
            return self._compute_through(stored, compute, ttl, route, None, None, write=False)
        entry, decision = self._judge(stored, lock, read, owner, now, draw)
        action = decision.action
        if action is Action.RETURN or action is Action.RELEASE_AND_RETURN:
            assert entry is not None
            return self._served(key, entry, now, epoch, stale=decision.stale)
        if action is Action.FAIL:
            raise self._unavailable(stored, entry)
        if action is Action.RECOMPUTE_IN_BACKGROUND:
            assert entry is not None and read.attempt is not None
            start_job(
                self._recompute_adopting,
                stored,
                compute,
                ttl,
                route,
                read,
                owner,
                sent_at,
                entry,
            )
            if decision.early:
                self._stats.add("early_recomputes")
            return self._served(key, entry, now, epoch, stale=decision.stale)
        if action is Action.RECOMPUTE:
            assert read.attempt is not None
            if not lock.adopt(owner, read.attempt, sent_at=sent_at):
                return self._compute_through(stored, compute, ttl, route, entry, read.generation)
            if decision.early:
                self._stats.add("early_recomputes")
            if entry is None:
                self._stats.add("misses")
            return self._offering(
                key,
                entry,
                epoch,
                functools.partial(
                    self._compute_holding,
                    lock,
                    stored,
                    compute,
                    ttl,
                    route,
                    entry,
                    read,
                    recheck=False,
                ),
            )
        if action is Action.TRY_EARLY or action is Action.TRY_LOCK:
            try:
                won = lock.acquire(0)
            except BackendError as exc:
                self._backend_failed("the lock attempt", stored, exc)
                if entry is not None:
                    return self._served(key, entry, now, epoch, stale=decision.stale)
                return self._compute_through(stored, compute, ttl, route, None, None, write=False)
            if won:
                if decision.early:
                    self._stats.add("early_recomputes")
                if entry is None:
                    self._stats.add("misses")
                if self.options.background and entry is not None:
                    start_job(
                        self._recompute_holding_in_background,
                        lock,
                        stored,
                        compute,
                        ttl,
                        route,
                        entry,
                        read,
                    )
                    return self._served(key, entry, now, epoch, stale=decision.stale)
                return self._offering(
                    key,
                    entry,
                    epoch,
                    functools.partial(
                        self._compute_holding,
                        lock,
                        stored,
                        compute,
                        ttl,
                        route,
                        entry,
                        read,
                        recheck=True,
                    ),
                )
            if entry is not None:
                return self._served(key, entry, now, epoch, stale=decision.stale)
        return self._wait_then_read(key, stored, lock, compute, ttl, route, entry)

    def _served(self, key: str, entry: Entry, now: float, epoch: int, *, stale: bool) -> Any:
        """Return an entry's value: counted, and kept in the near cache when fresh."""
        kind = "stale_served" if stale else "hits"
        self._stats.add(kind)
        _SERVED_AS.set(kind)
        if not stale:
            self._hint(key, entry.header.fresh_until)
        near = self._near
        if near is not None and not stale:
            near.put(
                key, entry.value, entry.header.fresh_until - now, self.options.local_ttl, epoch
            )
        return entry.value

    def _unavailable(self, stored: str, entry: Entry | None) -> SourceUnavailable:
        retry_in = 0.0 if entry is None else max(0.0, entry.header.retry_until - self._wall())
        return SourceUnavailable(
            f"cache key {stored!r} on {self._backend.server}: its computation failed recently "
            f"and error_ttl holds back retries for {retry_in:.1f} s more (fix the source, or "
            "delete the key to retry at once)"
        )

    def _timeout_error(self, stored: str, info: Any) -> LockTimeout:
        return LockTimeout(
            f"cache key {stored!r} on {self._backend.server}: another caller has been "
            f"computing it for over lock_wait={self.options.lock_wait} s (raise lock_wait, "
            "or on_timeout='compute' to compute without waiting)",
            owner=None if info is None else info.owner,
            token=None if info is None else info.token,
            ttl=None if info is None else info.ttl,
            server=self._backend.server,
        )

    def _wait_then_read(
        self,
        key: str,
        stored: str,
        lock: Lock,
        compute: Callable[[], Any],
        ttl: float,
        route: _Route,
        stale: Entry | None,
    ) -> Any:
        """Another caller computes: wait for its release, then read (and maybe claim) again."""
        self._stats.add("lock_waits")
        plan = WaitPlan(
            now=lock.clock_now(),
            wait=self.options.lock_wait,
            fail_fast=False,
            notifies=self._backend.capabilities.notifies,
        )
        attempt = Attempt(False)
        # What the wait ended with, acted on once the subscription is left: a value
        # to serve, a claim won (or the lock taken) to compute under, or the server failing.
        served: list[Any] = []
        claimed: tuple[Entry | None, CacheRead, str, float] | None = None
        taken: tuple[Entry | None, CacheRead] | None = None
        failed: BackendError | None = None
        try:
            with self._backend.watcher(lock.name) as waiter:
                skip = not waiter.attempt_on_entering
                while True:
                    if skip:
                        skip = False
                    else:
                        now = self._wall()
                        epoch = self._shared_near.epoch
                        try:
                            read, owner, sent_at = self._claiming_read(stored, lock, now, route)
                        except BackendError as exc:
                            failed = exc
                            break
                        entry, decision = self._judge(stored, lock, read, owner, now, 1.0)
                        action = decision.action
                        if action in (Action.RECOMPUTE, Action.RECOMPUTE_IN_BACKGROUND):
                            claimed = (entry, read, owner, sent_at)
                            break
                        if action is Action.FAIL:
                            raise self._unavailable(stored, entry)
                        if action is Action.TRY_LOCK:
                            try:
                                if lock.acquire(0):
                                    taken = (entry, read)
                                    break
                            except BackendError as exc:
                                failed = exc
                                break
                        elif action is not Action.WAIT and entry is not None:
                            served.append(
                                self._served(key, entry, now, epoch, stale=decision.stale)
                            )
                            break
                        if entry is not None:
                            stale = entry
                        attempt = read.attempt or Attempt(False)
                    delay = plan.next_wait(lock.clock_now(), attempt)
                    if delay is None:
                        break
                    waiter.wait(delay)
        except BackendError as exc:
            # Subscribing to, or leaving, the release feed failed: the server is in
            # trouble. A claim won meanwhile is still ours to compute under.
            if claimed is None and taken is None and not served:
                failed = exc
        if served:
            return served[0]
        if claimed is not None:
            entry, read, owner, sent_at = claimed
            assert read.attempt is not None
            if lock.adopt(owner, read.attempt, sent_at=sent_at):
                self._stats.add("misses")
                return self._compute_holding(
                    lock, stored, compute, ttl, route, entry, read, recheck=False
                )
            return self._compute_through(stored, compute, ttl, route, entry, read.generation)
        if taken is not None:
            self._stats.add("misses")
            entry, read = taken
            return self._compute_holding(
                lock, stored, compute, ttl, route, entry, read, recheck=True
            )
        if failed is not None:
            self._backend_failed("the read", stored, failed)
            return self._compute_through(stored, compute, ttl, route, stale, None, write=False)
        self._stats.add("lock_timeouts")
        now = self._wall()
        outcome = policy.after_wait_timeout(stale, now, self.options)
        if outcome is Action.RETURN and stale is not None:
            return self._served(key, stale, now, self._shared_near.epoch, stale=True)
        if outcome is Action.FAIL:
            try:
                info = self._store.lock_info(lock.name)
            except BackendError:
                info = None  # the error promised is the timeout, whoever holds the lock
            raise self._timeout_error(stored, info)
        return self._compute_through(stored, compute, ttl, route, stale, None)

    # -- computing ---------------------------------------------------------------

    def _compute(self, compute: Callable[[], Any]) -> tuple[Any, float]:
        ticks = time.perf_counter()
        try:
            value = call_and_await(compute)
        except Exception:
            self._stats.add("compute_errors")
            raise
        seconds = time.perf_counter() - ticks
        self._stats.add("computes")
        self._stats.observe("compute_seconds", seconds)
        return value, seconds

    def _encode(
        self, stored: str, value: Any, ttl: float, jitter_key: str, delta: float, generation: int
    ) -> tuple[bytes, float, float]:
        """The entry's bytes, its fresh_until and how long the server keeps it."""
        now = self._wall()
        factor = policy.jitter_factor(
            self.options.jitter, self.options.jitter_by, jitter_key, random.random()
        )
        fresh_until = now + ttl * factor
        data = encode(
            value, self._codec, stored, fresh_until=fresh_until, delta=delta, generation=generation
        )
        return data, fresh_until, policy.server_keep(fresh_until, now, self.options.stale_ttl)

    def _compute_holding(
        self,
        lock: Lock,
        stored: str,
        compute: Callable[[], Any],
        ttl: float,
        route: _Route,
        entry: Entry | None,
        read: CacheRead,
        *,
        recheck: bool,
    ) -> Any:
        """Compute while holding the recompute lock, store, release (whatever happens).

        With `recheck` (the lock was taken after the read, not with it) one more
        read first: if another caller stored a newer fresh value in between, it
        is returned instead of computing the same expiry again.
        """
        try:
            generation = read.generation
            if recheck or not route.backend.claims_with_read:
                epoch = self._shared_near.epoch
                found = self._refetch(stored, route)
                if found is not None:
                    again, generation = found
                    now = self._wall()
                    if (
                        again is not None
                        and again.has_value
                        and (entry is None or again.header.fresh_until > entry.header.fresh_until)
                        and now < again.header.fresh_until
                    ):
                        return self._served(self._user_key(stored), again, now, epoch, stale=False)
            return self._compute_and_store(
                stored, compute, ttl, route, entry, generation, holding=True
            )
        finally:
            self._release(lock)

    def _refetch(self, stored: str, route: _Route) -> tuple[Entry | None, int] | None:
        try:
            (data,), generation = route.backend.cache_fetch([stored], self._gen_key)
        except BackendError as exc:
            self._backend_failed("the read", stored, exc)
            return None
        return self._decode(stored, data, generation), generation

    def _compute_and_store(
        self,
        stored: str,
        compute: Callable[[], Any],
        ttl: float,
        route: _Route,
        stale: Entry | None,
        generation: int,
        *,
        holding: bool,
        write: bool = True,
    ) -> Any:
        """Compute and store; on failure, serve `stale` if allowed, else raise.

        Only a caller `holding` the recompute lock remembers a failure
        (`error_ttl`): one that computes without it may be racing the holder,
        whose fresh value a blind error marker would wipe.
        """
        key = self._user_key(stored)
        epoch = self._shared_near.epoch
        try:
            value, delta = self._compute(compute)
        except Exception as exc:
            now = self._wall()
            if self.options.error_ttl > 0 and holding and write:
                self._remember_error(stored, generation, now, route)
            if policy.after_compute_error(stale, now, self.options) is Action.RETURN:
                assert stale is not None
                log.warning(
                    "cache key %r: the computation failed (%r); serving the stale value",
                    stored,
                    exc,
                )
                self._stats.add("stale_served")
                _SERVED_AS.set("stale_served")
                return stale.value
            raise
        data, fresh_until, keep = self._encode(
            stored, value, ttl, route.jitter_key, delta, generation
        )
        if write:
            try:
                route.backend.cache_store([(stored, data, keep)])
                self._hint(key, fresh_until)
            except BackendError as exc:
                self._backend_failed("the write", stored, exc)
        near = self._near
        if near is not None:
            near.put(key, value, fresh_until - self._wall(), self.options.local_ttl, epoch)
        return value

    def _remember_error(self, stored: str, generation: int, now: float, route: _Route) -> None:
        """Write the failure beside whatever value is stored now, never over a fresh one."""
        try:
            (previous,), generation = route.backend.cache_fetch([stored], self._gen_key)
        except BackendError as exc:
            self._backend_failed("the read", stored, exc)
            return
        current = self._decode(stored, previous, generation)
        if current is not None and current.has_value and now < current.header.fresh_until:
            return  # another writer stored a fresh value meanwhile: nothing to hold back
        retry_until = now + self.options.error_ttl
        data = remember_error(previous, retry_until=retry_until, generation=generation, delta=0.0)
        fresh = 0.0 if current is None else current.header.fresh_until
        keep = policy.server_keep(fresh, now, self.options.stale_ttl, retry_until)
        try:
            route.backend.cache_store([(stored, data, keep)])
        except BackendError as exc:
            self._backend_failed("the write of an error marker", stored, exc)

    def _compute_through(
        self,
        stored: str,
        compute: Callable[[], Any],
        ttl: float,
        route: _Route,
        stale: Entry | None,
        generation: int | None,
        *,
        write: bool = True,
    ) -> Any:
        """Compute without the lock (the server failed, or the wait ran out), store if we can."""
        if generation is None and write:
            found = self._refetch(stored, route)
            if found is None:
                write = False  # the server is failing: do not wait on it again
            else:
                generation = found[1]
        return self._compute_and_store(
            stored, compute, ttl, route, stale, generation or 0, holding=False, write=write
        )

    def _release(self, lock: Lock) -> None:
        try:
            lock.release()
        except Exception as exc:
            # The lock ran out or the server failed: the value is computed all the same.
            log.debug("releasing %s failed: %s", lock.shown_name, exc)

    def _recompute_adopting(
        self,
        stored: str,
        compute: Callable[[], Any],
        ttl: float,
        route: _Route,
        read: CacheRead,
        owner: str,
        sent_at: float,
        stale: Entry,
    ) -> None:
        """A background recompute of a stale entry, with the lock claimed by the read."""
        lock = self._lock(stored, route.shard)
        assert read.attempt is not None
        if not lock.adopt(owner, read.attempt, sent_at=sent_at):
            return
        self._recompute_holding_in_background(
            lock, stored, compute, ttl, route, stale, read, recheck=False
        )

    def _recompute_holding_in_background(
        self,
        lock: Lock,
        stored: str,
        compute: Callable[[], Any],
        ttl: float,
        route: _Route,
        stale: Entry,
        read: CacheRead,
        recheck: bool = True,
    ) -> None:
        try:
            self._compute_holding(lock, stored, compute, ttl, route, stale, read, recheck=recheck)
        except Exception:
            log.warning("cache key %r: a background recompute failed", stored, exc_info=True)

    # -- plain reads and writes ----------------------------------------------------

    def get(
        self, key: str, default: Any = None, *, stale: bool = False, shard_key: str | None = None
    ) -> Any:
        """The fresh value of `key` (with `stale=True`, a stale one too), else `default`."""
        _check_key(key)
        if shard_key is not None:
            _check_key(shard_key, "shard_key")
        near = self._near
        if near is not None:
            hit, value = near.get(key, self.options.local_ttl)
            if hit:
                self._stats.add_each(_LOCAL_HIT)
                return value
        epoch = self._shared_near.epoch
        found = self._fetch([key], self._route(key, shard_key).backend)
        return self._pick(key, found.get(key), default, stale, epoch)

    def _pick(self, key: str, entry: Entry | None, default: Any, stale: bool, epoch: int) -> Any:
        now = self._wall()
        if entry is None or not entry.has_value:
            self._stats.add("misses")
            return default
        if now < entry.header.fresh_until:
            return self._served(key, entry, now, epoch, stale=False)
        if stale:
            self._stats.add("stale_served")
            return entry.value
        self._stats.add("misses")
        return default

    def _fetch(self, keys: list[str], backend: Backend) -> dict[str, Entry]:
        stored = [self.stored_key(key) for key in keys]
        try:
            found, generation = backend.cache_fetch(stored, self._gen_key)
        except PartialFetch as exc:
            # Some servers of a pool answered: serve their entries, count the failure.
            self._backend_failed("the read", stored[0] if stored else self.namespace, exc)
            found, generation = exc.entries, exc.generation
        except BackendError as exc:
            self._backend_failed("the read", stored[0] if stored else self.namespace, exc)
            return {}
        entries: dict[str, Entry] = {}
        for key, name, data in zip(keys, stored, found, strict=True):
            entry = self._decode(name, data, generation)
            if entry is not None:
                entries[key] = entry
        return entries

    def get_many(
        self, keys: Iterable[str], *, stale: bool = False, shard_key: str | None = None
    ) -> dict[str, Any]:
        """A dict of the keys found (fresh, or stale too with `stale=True`); one round trip
        (on a pool, one per server, side by side; with `shard_key`, one in all)."""
        wanted = list(dict.fromkeys(_check_key(key) for key in keys))
        if shard_key is not None:
            _check_key(shard_key, "shard_key")
        result: dict[str, Any] = {}
        remote = []
        near = self._near
        for key in wanted:
            if near is not None:
                hit, value = near.get(key, self.options.local_ttl)
                if hit:
                    self._stats.add_each(_LOCAL_HIT)
                    result[key] = value
                    continue
            remote.append(key)
        if remote:
            epoch = self._shared_near.epoch
            # On a pool, one request per server, sent side by side (hot keys are found
            # from single reads; a batch reads each key where its replicas are).
            backend = (
                self._backend
                if shard_key is None and self.replicas == 1
                else self._backend.placed(shard_key, self.replicas)
            )
            found = self._fetch(remote, backend)
            for key in remote:
                value = self._pick(key, found.get(key), _MISSING, stale, epoch)
                if value is not _MISSING:
                    result[key] = value
        return result

    def set(
        self,
        key: str,
        value: Any,
        *,
        ttl: float | None = None,
        shard_key: str | None = None,
        replicas: int | str | None = None,
    ) -> None:
        """Store `value` under `key` (dropped, counted and logged if the server fails)."""
        self.set_many({key: value}, ttl=ttl, shard_key=shard_key, replicas=replicas)

    def set_many(
        self,
        items: Mapping[str, Any],
        *,
        ttl: float | None = None,
        shard_key: str | None = None,
        replicas: int | str | None = None,
    ) -> None:
        """Store every (key, value) pair in one round trip (plus one to learn the namespace
        generation when this process has not read it in the last second)."""
        seconds = (
            self.options.ttl if ttl is None else policy.check_seconds("ttl", ttl, positive=True)
        )
        pairs = [(_check_key(key), value) for key, value in items.items()]
        if shard_key is not None:
            _check_key(shard_key, "shard_key")
        if not pairs:
            return
        backend = self._route(pairs[0][0], shard_key, replicas).backend
        # Encode everything first: a value that cannot be encoded writes nothing.
        encoded = [
            (key, value, self._encode(self.stored_key(key), value, seconds, shard_key or key, 0, 0))
            for key, value in pairs
        ]
        for key, _value in pairs:
            self._shared_near.discard(key)  # whatever this process kept is older
        epoch = self._shared_near.epoch
        try:
            generation = self._current_generation()
            writes = [
                (self.stored_key(key), with_generation(data, generation), keep)
                for key, _, (data, _, keep) in encoded
            ]
            backend.cache_store(writes)
        except BackendError as exc:
            self._backend_failed("the write", self.stored_key(pairs[0][0]), exc)
            return
        near = self._near
        if near is not None:
            now = self._wall()
            for key, value, (_data, fresh_until, _keep) in encoded:
                near.put(key, value, fresh_until - now, self.options.local_ttl, epoch)

    def delete(self, key: str, *, shard_key: str | None = None) -> bool:
        """Remove `key`; True when it was there. Raises BackendUnavailable if the server fails."""
        _check_key(key)
        self._shared_near.discard(key)
        self._fresh_hints.pop(key, None)
        try:
            return self._everywhere(shard_key).cache_delete(self.stored_key(key))
        finally:
            self._shared_near.discard(key)  # a read answered meanwhile must not put it back

    def invalidate(self, key: str, *, shard_key: str | None = None) -> bool:
        """Mark `key` stale, keeping its value `stale_ttl` more seconds for stale readers.

        With `stale_ttl=0` it is gone for readers. True when it was there.
        """
        _check_key(key)
        self._shared_near.discard(key)
        self._fresh_hints.pop(key, None)
        try:
            return self._everywhere(shard_key).cache_invalidate(
                self.stored_key(key), self.options.stale_ttl
            )
        finally:
            self._shared_near.discard(key)

    def clear(self) -> None:
        """Empty the namespace for every client at once (a new generation; old entries expire)."""
        self._shared_near.clear()
        self._fresh_hints.clear()
        try:
            self._seen(self._backend.cache_clear(self._gen_key))
        finally:
            self._shared_near.clear()

    def stats(self) -> dict[str, Any]:
        """This namespace's counters (hits, misses, stale_served, ...), as in docs/metrics.md;
        with `hot_keys=True`, also `hot_keys`: the keys found hot now, hottest first."""
        snapshot = self._stats.snapshot()
        if self._hot is not None:
            snapshot["hot_keys"] = self.hot_keys()
        return snapshot

    # -- decorator and refresher ------------------------------------------------

    def cached(self, *, ttl: float | None = None, key: str | None = None) -> Callable[[F], F]:
        """Cache a function's results under `key` (a template such as "user:{user_id}").

        The template is checked against the function's signature when decorating;
        the entry's key is exactly the formatted template, so `invalidate("user:1")`
        reaches it. Without a template the key is the function's qualified name and
        its arguments' reprs.
        """
        if ttl is not None:
            policy.check_seconds("ttl", ttl, positive=True)

        def decorate(func: F) -> F:
            refuse_coroutine_function(func, "cached function")
            signature = inspect.signature(func)
            if key is not None:
                _check_template(key, signature, func)
            name = f"{func.__module__}.{func.__qualname__}"
            var_keyword = next(
                (
                    p.name
                    for p in signature.parameters.values()
                    if p.kind is inspect.Parameter.VAR_KEYWORD
                ),
                None,
            )

            def key_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                if key is None:
                    shown = ", ".join(f"{k}={v!r}" for k, v in bound.arguments.items())
                    return f"{name}({shown})"
                fields = dict(bound.arguments)
                if var_keyword is not None:
                    fields.update(fields.pop(var_keyword, {}))
                return key.format_map(fields)

            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return self.get_or_compute(
                    key_of(args, kwargs), functools.partial(func, *args, **kwargs), ttl=ttl
                )

            wrapper.cache_key = lambda *a, **kw: key_of(a, kw)  # type: ignore[attr-defined]
            return wrapper  # type: ignore[return-value]

        return decorate

    def refresher(
        self,
        key: str,
        compute: Callable[[], Any],
        *,
        every: float | None = None,
        ttl: float | None = None,
    ) -> Refresher:
        """Keep `key` computed in the background so no caller ever computes it online.

        Each round one process (whichever takes the round's lock) computes and
        stores; the others skip that round. `every` defaults to half the TTL.
        """
        _check_key(key)
        seconds = (
            self.options.ttl if ttl is None else policy.check_seconds("ttl", ttl, positive=True)
        )
        interval = (
            seconds / 2 if every is None else policy.check_seconds("every", every, positive=True)
        )
        refuse_coroutine_function(compute, "refresher compute")
        return Refresher(self, key, compute, interval, seconds)

    def refresh(self, key: str, compute: Callable[[], Any], *, ttl: float | None = None) -> bool:
        """Recompute and store `key` now if no other caller is computing it; True if this did."""
        _check_key(key)
        seconds = (
            self.options.ttl if ttl is None else policy.check_seconds("ttl", ttl, positive=True)
        )
        stored = self.stored_key(key)
        route = self._route(key, None)
        lock = self._lock(stored)
        if not lock.acquire(0):
            return False
        try:
            found = self._refetch(stored, route)
            generation = 0 if found is None else found[1]
            stale = None if found is None else found[0]
            self._compute_and_store(
                stored, compute, seconds, route, stale, generation, holding=True, write=True
            )
        finally:
            self._release(lock)
        return True


def _check_template(template: str, signature: inspect.Signature, func: Callable[..., Any]) -> None:
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    try:
        fields = [
            field for _, field, _, _ in string.Formatter().parse(template) if field is not None
        ]
    except ValueError as exc:
        raise ConfigError(f"cache key template {template!r} is not a format string: {exc}") from exc
    for field in fields:
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ConfigError(
                f"cache key template {template!r}: name the parameter ({{user_id}}), "
                "positional fields such as {} or {0} are ambiguous"
            )
        if root not in signature.parameters and not takes_any:
            raise ConfigError(
                f"cache key template {template!r} names {root!r}, which "
                f"{func.__qualname__}{signature} does not take"
            )


class Refresher:
    """Recomputes one key every `every` seconds in the background; see `Cache.refresher`.

    Start it with `start()` (or `with`), stop it with `stop()`.
    """

    def __init__(
        self, cache: Cache, key: str, compute: Callable[[], Any], every: float, ttl: float
    ) -> None:
        self.cache = cache
        self.key = key
        self.every = every
        self.ttl = ttl
        self._compute = compute
        self._stop = _compat.Event()
        self._worker: _compat.Worker | None = None
        self.rounds = 0
        """Rounds in which this process computed the key."""

    def start(self) -> Refresher:
        if self._worker is None or not self._worker.alive():
            self._stop.clear()
            self._worker = _compat.spawn(self._run, f"corral-refresh-{self.key}")
        return self

    def _run(self) -> None:
        stored = self.cache.stored_key(self.key)
        # One round per `every` across every process: whoever takes the round's lock
        # refreshes, then keeps it closed for most of the period (release(hold_for=)).
        round_lock = self.cache._store.lock(
            "\x00refresh:" + stored, max(2 * self.every, RECOMPUTE_LOCK_TTL), auto_renew=True
        )
        while not self._stop.is_set():
            try:
                if round_lock.acquire(0):
                    try:
                        if self.cache.refresh(self.key, self._compute, ttl=self.ttl):
                            self.rounds += 1
                    finally:
                        round_lock.release(hold_for=self.every * ROUND_HOLD)
            except Exception:
                log.warning("refreshing cache key %r failed", self.key, exc_info=True)
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.join()

    def __enter__(self) -> Refresher:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
