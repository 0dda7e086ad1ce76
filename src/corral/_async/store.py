"""The store: one connection to a backend, and the factory of locks on it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from corral._async._compat import Flights
from corral._async.backends.base import AsyncBackend
from corral._async.cache import AsyncCache, AsyncRefresher, CacheShared, check_replicas
from corral._async.election import AsyncElection
from corral._async.lock import AsyncAcquisition, AsyncLock
from corral._async.semaphore import AsyncSemaphore
from corral.backends.registry import default_url, redact, resolve
from corral.core.cachepolicy import CacheOptions
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock, SystemClock, WallClock
from corral.core.election import lock_name
from corral.core.envelope import make_codec
from corral.core.forks import ProcessLock
from corral.core.nearcache import NearCache
from corral.core.primitives import LockInfo, SemaphoreInfo
from corral.core.stats import StoreStats
from corral.core.validate import check_limit, check_name, check_ttl, check_wait
from corral.errors import ConfigError

__all__ = [
    "AsyncAcquisition",
    "AsyncCache",
    "AsyncElection",
    "AsyncRefresher",
    "AsyncSemaphore",
    "AsyncStore",
    "connect",
]


class AsyncStore:
    """Locks (and later caches) over one backend. Safe to share between tasks.

    Close it with `aclose()` or `async with`.
    """

    def __init__(
        self,
        backend: AsyncBackend,
        *,
        clock: Clock | None = None,
        url: str | None = None,
        wall_clock: Clock | None = None,
    ) -> None:
        self.backend = backend
        self.clock: Clock = clock or SystemClock()
        self.wall_clock: Clock = wall_clock or WallClock()
        """Seconds since the epoch, for cache entries' freshness (a fake one in tests)."""
        # Per cache namespace, shared by every handle on it: the near cache (so one
        # handle's delete is seen by the others) and the in-process flights.
        self._cache_state: dict[str, CacheShared] = {}
        self._cache_state_mutex = ProcessLock()
        self.metrics = StoreStats()
        self.url = url or backend.server
        """How to reach this store again (for `corral status --url ...`), password hidden."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.backend.server}>"

    @property
    def capabilities(self) -> Capabilities:
        return self.backend.capabilities

    @property
    def server(self) -> str:
        return self.backend.server

    def lock(
        self,
        name: str,
        ttl: float = 30.0,
        *,
        wait: float | None = 0.0,
        auto_renew: bool = False,
        reentrant: bool = False,
        on_lost: Callable[[AsyncLock], Any] | None = None,
        fair: bool = False,
        replicas: int = 0,
    ) -> AsyncLock:
        """A handle on the lock `name`; nothing is sent to the server until it is acquired."""
        check_name(name)
        seconds = check_ttl(ttl)
        wait_seconds = check_wait(wait)
        if on_lost is not None and not callable(on_lost):
            raise ConfigError(f"on_lost must be callable, got {on_lost!r}")
        if fair and not self.capabilities.fair:
            raise ConfigError(f"{self.server} does not support fair=True locks")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ConfigError(f"replicas must be an integer >= 0, got {replicas!r}")
        if replicas and not self.capabilities.replicas:
            raise ConfigError(
                f"{self.server} does not support replicas=N (it is a Redis-only option)"
            )
        return AsyncLock(
            self,
            name,
            seconds,
            wait=wait_seconds,
            auto_renew=bool(auto_renew),
            reentrant=bool(reentrant),
            on_lost=on_lost,
            fair=bool(fair),
            replicas=replicas,
        )

    def semaphore(
        self,
        name: str,
        limit: int,
        ttl: float = 30.0,
        *,
        wait: float | None = 0.0,
        auto_renew: bool = False,
        on_lost: Callable[[AsyncLock], Any] | None = None,
        fair: bool = False,
    ) -> AsyncSemaphore:
        """A handle on one slot of the semaphore `name` of `limit` slots; see docs/semaphores.md.

        Nothing is sent to the server until it is acquired. Every process must
        give one name the same `limit`.
        """
        check_name(name, "semaphore name")
        slots = check_limit(limit)
        seconds = check_ttl(ttl)
        wait_seconds = check_wait(wait)
        if on_lost is not None and not callable(on_lost):
            raise ConfigError(f"on_lost must be callable, got {on_lost!r}")
        if not self.capabilities.semaphores:
            raise self.backend.no_semaphores_error()
        if fair and not self.capabilities.fair:
            raise ConfigError(f"{self.server} does not support fair=True semaphores")
        return AsyncSemaphore(
            self,
            name,
            slots,
            seconds,
            wait=wait_seconds,
            auto_renew=bool(auto_renew),
            on_lost=on_lost,
            fair=bool(fair),
        )

    async def semaphore_info(self, name: str) -> SemaphoreInfo | None:
        """The semaphore's limit and its holders (owner, token, seconds left), or None if free."""
        return await self.backend.sem_inspect(check_name(name, "semaphore name"))

    async def force_release_semaphore(self, name: str) -> int:
        """Free every slot of `name` whoever holds them; how many were taken.

        The holders find out at their next renewal or check.
        """
        return await self.backend.sem_force_release(check_name(name, "semaphore name"))

    def election(
        self,
        name: str,
        ttl: float = 10.0,
        identity: str | None = None,
        *,
        on_lost: Callable[[AsyncElection], Any] | None = None,
    ) -> AsyncElection:
        """A campaigner in the election `name`; see docs/elections.md.

        `identity` is what `leader()` answers in every process while this one
        leads (default: host:pid). After a leader dies, another leads within
        `ttl` (plus the backend's declared slack).
        """
        check_name(name, "election name")
        seconds = check_ttl(ttl)
        if identity is None:
            pass  # host:pid, taken at each campaign (a forked child is another process)
        elif not isinstance(identity, str):
            raise TypeError(f"identity must be str, not {type(identity).__name__}")
        elif not identity:
            raise ConfigError("identity must not be empty")
        if on_lost is not None and not callable(on_lost):
            raise ConfigError(f"on_lost must be callable, got {on_lost!r}")
        return AsyncElection(self, name, seconds, identity, on_lost=on_lost)

    async def force_release_election(self, name: str) -> bool:
        """End the current leadership of election `name`, if any (operators only).

        The leader finds out at its next renewal or check (`on_lost`); a waiting
        campaigner is elected meanwhile.
        """
        return await self.backend.force_release(lock_name(check_name(name, "election name")))

    def cache(
        self,
        namespace: str = "default",
        ttl: float = 300.0,
        *,
        stale_ttl: float = 0.0,
        jitter: float = 0.0,
        jitter_by: str = "random",
        lock_wait: float = 5.0,
        on_timeout: str = "compute",
        early_recompute: str | None = None,
        beta: float = 1.0,
        background: bool = False,
        error_ttl: float = 0.0,
        serializer: str = "json",
        hmac_key: bytes | str | None = None,
        local_ttl: float = 0.0,
        local_max: int = 1024,
        replicas: int | str = 1,
        hot_keys: bool = False,
    ) -> AsyncCache:
        """A stampede-proof read-through cache in `namespace`; see docs/cache.md.

        Every option is validated here (`ConfigError`). Nothing is sent to the
        server until the cache is used.
        """
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be str, not {type(namespace).__name__}")
        if not namespace or ":" in namespace:
            raise ConfigError(
                f"namespace must be a non-empty str without ':', got {namespace!r} "
                "(the colon separates the namespace from the key on the server)"
            )
        options = CacheOptions(
            ttl=ttl,
            stale_ttl=stale_ttl,
            jitter=jitter,
            jitter_by=jitter_by,
            lock_wait=lock_wait,
            on_timeout=on_timeout,
            early_recompute=early_recompute,
            beta=beta,
            background=bool(background),
            error_ttl=error_ttl,
            local_ttl=local_ttl,
        )
        if isinstance(local_max, bool) or not isinstance(local_max, int) or local_max < 1:
            raise ConfigError(f"local_max must be an integer >= 1, got {local_max!r}")
        servers = check_replicas(replicas, self.backend)
        if not self.capabilities.cache:
            raise self.backend.no_cache_error()
        codec = make_codec(serializer, hmac_key)
        # JSON entries are always readable (they run no code); others only with their codec.
        codecs = {"j": make_codec("json", None), codec.letter: codec}
        with self._cache_state_mutex:
            state = self._cache_state.get(namespace)
            if state is None:
                state = self._cache_state[namespace] = CacheShared(
                    NearCache(local_max, self.clock.now), Flights()
                )
            state.near.max_entries = max(state.near.max_entries, local_max)
        return AsyncCache(
            self,
            namespace,
            options,
            codec,
            codecs,
            shared=state,
            replicas=servers,
            hot_keys=bool(hot_keys),
        )

    def stats(self) -> dict[str, Any]:
        """What this store's locks did so far: counters and wait/hold-time histograms.

        A snapshot (a plain dict), cheap to take; see docs/metrics.md for every
        field, and `corral.prometheus` to expose the same numbers to Prometheus.
        """
        return self.metrics.snapshot()

    async def lock_info(self, name: str) -> LockInfo | None:
        """Who holds `name`, with which fencing token, for how many more seconds."""
        return await self.backend.inspect(check_name(name))

    async def force_release(self, name: str) -> bool:
        """Free `name` whoever holds it. The holder finds out at its next renewal or check."""
        return await self.backend.force_release(check_name(name))

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def connect(url: str | None = None, *, clock: Clock | None = None, **options: Any) -> AsyncStore:
    """Open a store. `url=None` reads CORRAL_URL, else uses an SQLite file in the user's cache."""
    if url is None:
        url = default_url()
    spec = resolve(url)
    package = __name__.rsplit(".", 1)[0]
    try:
        module = importlib.import_module(f"{package}.backends.{spec.module}")
    except ImportError as exc:
        if spec.extra is None or (exc.name or "").split(".")[0] not in spec.clients:
            raise
        raise ConfigError(
            f"{redact(url)} needs the {spec.extra!r} extra: pip install 'corral[{spec.extra}]' "
            f"({exc})"
        ) from exc
    flavour_cls = spec.cls if package.endswith("_async") else spec.cls.removeprefix("Async")
    backend_cls = getattr(module, flavour_cls)
    backend: AsyncBackend = backend_cls.from_url(url, clock=clock or SystemClock(), **options)
    return AsyncStore(backend, clock=clock, url=_shown_url(url, options))


def _shown_url(url: str, options: dict[str, Any]) -> str:
    """The URL with the keyword options that text can carry added to its query, redacted.

    A command suggested to the user (`corral status NAME --url ...`) must reach the
    same locks, so options such as `prefix=` go with it; objects (an SSL context)
    cannot, and are left out.
    """
    extra = {
        key: value
        for key, value in options.items()
        if isinstance(value, (str, int, float)) and not isinstance(value, bool)
    }
    if extra:
        url += ("&" if "?" in url else "?") + urlencode(extra)
    return redact(url)
