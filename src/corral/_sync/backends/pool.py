# Generated from src/corral/_async/backends/pool.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`memcached://a:11211,b:11211,c:11211`, `redis://a:6379,b:6379/0`: a pool of servers.

A pool is one more backend: it holds one child backend per server (each built
from the one-host URL with the same options), places every primitive's name or
key with a `corral.Ring`, keeps each server's health (`corral.core.health`),
and speaks the same primitives upward. The lock, semaphore, election and cache
logic above it never learn that there are several servers.

**Locks, semaphores and elections never move.** Each lives on
`ring.locate(placement_key(name))` for as long as the pool has that server
list. While that server is marked down, acquisitions raise
`BackendUnavailable` at once: moving a lock to the next server would let a
second holder take it there while the first still holds it on a server that
only flapped. (A holder's extend and release still try it: see `_lock_route`.) Their
waiters come from the child that holds the name, and a release through the
pool is the child's release, so the child's local buses wake this process's
waiters as they do for one server.

**Cache entries move.** An entry lives on the server its stored key (or its
shard, in a `placed` view) is placed on; its recompute lock goes with it, so
a read tries the lock on the entry's server in the same round trip. While that
server is down, the entry goes to the next server on the ring that is not
down, or, with `gutter=URL`, to a small failover store with its `keep` capped
at `gutter_ttl` (Facebook's memcache "gutter": what is written there while a
server is away expires soon after it returns, so the gutter never serves an
entry written long before). Reads and writes of many keys send one request
per server, all at once.

**Failures.** A child call that raises `BackendUnavailable` (unreachable, or
no answer within the child's `timeout`) counts a failure; `failure_limit`
consecutive ones mark the server down for `retry_after` seconds; then one call
probes it and a success brings it back. A call uses one server per key and is
never retried on another after a failure, so it waits at most the socket
timeout in all; on a server marked down it does not wait at all.

**One generation on every server.** The cache compares the generation an
entry was written under with the one the read returns, and writes with the
generation it last saw, whichever server answered; so the servers must agree.
`cache_clear` reads every server's generation and raises them all to one
value above the highest; a server it cannot reach makes it raise
`BackendUnavailable` (the others are raised all the same). And the pool
remembers, per namespace, the highest generation it has seen: a server that
answers with a lower one (it missed a clear while away) is raised to it before
its answer is used, so it never serves an entry written before the clear.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import logging
import random
import re
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from corral._sync._compat import gather
from corral._sync.backends.base import Backend, Waiter
from corral.backends.registry import BACKENDS, POOLED, check_userinfo, redact, resolve
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.envelope import claim_due, decode_header
from corral.core.forks import ProcessLock
from corral.core.health import Admission, Change, Health
from corral.core.options import Option, merge_options
from corral.core.placement import is_recompute_lock, placement_key
from corral.core.primitives import (
    Attempt,
    CacheRead,
    Claim,
    ClientBusy,
    LockInfo,
    Outcome,
    PartialFetch,
    SemaphoreInfo,
)
from corral.core.ring import HASHINGS, Ring
from corral.errors import BackendError, BackendUnavailable, ConfigError

__all__ = ["POOL_OPTIONS", "PoolBackend", "pool_capabilities"]

log = logging.getLogger("corral")

DEFAULT_PORTS = {"memcached": 11211, "redis": 6379, "rediss": 6379}
DEFAULT_FAILURE_LIMIT = 3
DEFAULT_RETRY_AFTER = 10.0
DEFAULT_GUTTER_TTL = 10.0
MAX_CLAIMS = 10_000
"""Recompute locks whose granting server a pool remembers at once (see `_Shared.claims`)."""

POOL_OPTIONS: tuple[Option, ...] = (
    Option(
        "hashing",
        "`ketama`",
        "how keys are placed: `ketama` (as libmemcached), `rendezvous`, `maglev` or `modulo`",
        "maglev",
    ),
    Option(
        "weights",
        "1 each",
        "a share per server: `3,1,1` in the URL's order, or a dict server -> weight",
    ),
    Option(
        "failure_limit",
        f"{DEFAULT_FAILURE_LIMIT}",
        "consecutive failures (unreachable, no answer in `timeout`) that mark a server down",
        "2",
    ),
    Option(
        "retry_after",
        f"{DEFAULT_RETRY_AFTER:g}",
        "seconds a server stays marked down before one call probes it",
        "5",
    ),
    Option(
        "gutter",
        "none",
        "URL of a small store (may be a pool) that takes a down server's cache entries; "
        "the pool's `timeout` applies to it unless its URL sets one",
    ),
    Option(
        "gutter_ttl",
        f"{DEFAULT_GUTTER_TTL:g}",
        "seconds an entry written to the gutter is kept, at most",
        "5",
    ),
)
"""The options a pool takes on top of its servers' own, in the URL's query or as keywords."""

_POOL_NAMES = frozenset(option.name for option in POOL_OPTIONS)


def pool_capabilities(child: Capabilities) -> Capabilities:
    """A pool's capabilities: its servers', with what losing one server means."""
    return dataclasses.replace(
        child,
        on_partition=(
            "each lock, semaphore and election lives on the one server of the pool its name "
            "is placed on, and never moves: while that server is unreachable or marked down, "
            "its names raise BackendUnavailable (at once once it is marked down) and the "
            "other servers' names are unaffected; cache entries of a down server go to the "
            "next server on the ring, or to the gutter, until it is back. On each server: "
            + child.on_partition
        ),
        on_server_restart="on each server of the pool: " + child.on_server_restart,
        fencing_tokens=(
            (child.fencing_tokens + "; " if child.fencing_tokens else "")
            + "in a pool, a name's tokens come from the one server it is placed on, so they "
            "increase as long as the server list (and so the placement) stays the same"
        ),
        cache=(
            (child.cache + "; " if child.cache else "")
            + "in a pool, placed by a ring over the servers, the namespace generation kept "
            "on every server"
        )
        if child.cache
        else "",
    )


@dataclass(frozen=True, slots=True)
class _Route:
    """Where one call goes: a server of the pool (with its admission), or the gutter."""

    server: str
    """The server as the ring knows it, or the gutter's redacted URL."""
    backend: Backend
    admission: Admission | None
    """None for the gutter, whose health the pool does not keep."""
    keep_cap: float | None = None
    """The gutter's `gutter_ttl`: no entry is kept there longer."""

    def keep(self, keep: float) -> float:
        return keep if self.keep_cap is None else min(keep, self.keep_cap)


@dataclass(frozen=True, slots=True)
class _Failed:
    """One server's failure in a fan-out that goes on without it."""

    error: BackendError


class _Shared:
    """What a pool and every placed view of it share: children, ring, health, generations."""

    def __init__(
        self,
        shown: str,
        ring: Ring,
        children: dict[str, Backend],
        health: Health,
        clock: Clock,
        gutter: Backend | None,
        gutter_ttl: float,
    ) -> None:
        self.shown = shown
        self.ring = ring
        self.children = children
        self.health = health
        self.clock = clock
        self.gutter = gutter
        self.gutter_ttl = gutter_ttl
        self.generations: dict[str, int] = {}
        self.claims: dict[tuple[str, str], str] = {}
        """Recompute locks granted through this pool, (name, owner) -> the server that
        granted it: the entry may move meanwhile, the granted lock does not."""
        self.mutex = ProcessLock()

    def claimed(self, name: str, owner: str, server: str) -> None:
        """Remember where recompute lock `name` was granted to `owner` (bounded: the
        oldest is forgotten first; a forgotten one is released where its entry is now)."""
        with self.mutex:
            if len(self.claims) >= MAX_CLAIMS:
                del self.claims[next(iter(self.claims))]
            self.claims[(name, owner)] = server

    def claim_of(self, name: str, owner: str, *, forget: bool = False) -> str | None:
        """The server that granted recompute lock `name` to `owner`, if this pool knows."""
        with self.mutex:
            if forget:
                return self.claims.pop((name, owner), None)
            return self.claims.get((name, owner))

    def seen(self, gen_key: str, generation: int) -> int:
        """Remember `generation` for the namespace; the highest seen so far."""
        with self.mutex:
            known = self.generations.get(gen_key, 0)
            if generation > known:
                self.generations[gen_key] = known = generation
            return known


class PoolBackend(Backend):
    """A pool of one-server backends of one kind, placed by a ring."""

    url_options: ClassVar[tuple[Option, ...]] = POOL_OPTIONS

    def __init__(self, shared: _Shared, shard: str | None = None, replicas: int = 1) -> None:
        super().__init__()
        self._pool = shared
        self._shard = shard
        self._replicas = max(1, min(replicas, len(shared.ring)))
        # How long a copy on a replica other than the first is kept, at most (None: as
        # long as the entry): copies made for a key while it is hot must not outlive
        # the spell by much, since writes after it go to the first server only.
        self._replica_keep: float | None = None

    # -- opening ----------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> PoolBackend:
        """Open one child per listed server, each with the same options but the pool's own."""
        shown = redact(url)
        check_userinfo(url, shown)
        scheme, _, rest = url.partition("://")
        scheme = scheme.lower()
        if scheme not in POOLED:
            raise ConfigError(f"{shown}: only {', '.join(POOLED)} URLs may list several servers")
        match = re.match(r"([^/?#]*)(.*)", rest, re.DOTALL)
        assert match is not None  # the pattern matches any text
        netloc, tail = match.groups()
        userinfo, at, host_list = netloc.rpartition("@")
        path, _, query = tail.partition("?")
        if "#" in tail:
            raise ConfigError(f"{shown}: a URL of servers takes no '#' fragment")
        hosts = [host.strip() for host in host_list.split(",")]
        if not all(hosts):
            raise ConfigError(
                f"{shown}: an empty server in the list; write {scheme}://host:port,host:port"
            )
        child_cls = _child_class(scheme, shown)
        accepted = (*child_cls.url_options, *POOL_OPTIONS)
        given, _ = merge_options(shown, query, options, accepted, backend=f"{scheme} pool")
        mine = {name: given.pop(name) for name in list(given) if name in _POOL_NAMES}
        names = [_ring_name(host, DEFAULT_PORTS[scheme]) for host in hosts]
        try:
            ring = Ring(names, hashing=_hashing(mine, shown), weights=_weights(mine, names, shown))
        except ConfigError as exc:
            raise ConfigError(f"{shown}: {exc}") from None
        failure_limit = _integer(mine, "failure_limit", DEFAULT_FAILURE_LIMIT, shown)
        retry_after = _seconds(mine, "retry_after", DEFAULT_RETRY_AFTER, shown, zero=True)
        gutter_ttl = _seconds(mine, "gutter_ttl", DEFAULT_GUTTER_TTL, shown)
        gutter_url = mine.get("gutter")
        if gutter_url is not None and (not isinstance(gutter_url, str) or "://" not in gutter_url):
            raise ConfigError(f"{shown}: gutter must be a store's URL, such as memcached://g:11211")
        children: dict[str, Backend] = {}
        opener: Any = child_cls  # every backend class has `from_url`; the base declares none
        for host, name in zip(hosts, names, strict=True):
            children[name] = opener.from_url(
                f"{scheme}://{userinfo}{at}{host}{path}", clock=clock, **given
            )
        gutter = None
        if isinstance(gutter_url, str):
            gutter = _open(gutter_url, clock, given.get("timeout"))
        if gutter is not None and not gutter.capabilities.cache:
            raise ConfigError(f"{shown}: the gutter {redact(gutter_url or '')} keeps no cache")
        health = Health(
            names, failure_limit=failure_limit, retry_after=retry_after, clock=clock.now
        )
        user = userinfo.split(":", 1)[0]
        pool_url = f"{scheme}://{user + '@' if user else ''}{','.join(hosts)}{path}"
        shared = _Shared(redact(pool_url), ring, children, health, clock, gutter, gutter_ttl)
        return _kind(child_cls)(shared)

    @classmethod
    def over(
        cls,
        children: dict[str, Backend],
        *,
        shown: str,
        clock: Clock,
        hashing: str = "ketama",
        failure_limit: int = DEFAULT_FAILURE_LIMIT,
        retry_after: float = DEFAULT_RETRY_AFTER,
    ) -> PoolBackend:
        """A pool over backends already open (`children`: ring name -> backend), for a
        store that keeps its cache entries on servers it also uses otherwise (Redlock's
        masters). Closing the pool closes them."""
        ring = Ring(list(children), hashing=hashing)
        health = Health(
            list(children), failure_limit=failure_limit, retry_after=retry_after, clock=clock.now
        )
        kind = type(next(iter(children.values())))
        shared = _Shared(shown, ring, dict(children), health, clock, None, DEFAULT_GUTTER_TTL)
        return _kind(kind)(shared)

    # -- where names live -------------------------------------------------------------

    @property
    def server(self) -> str:
        return self._pool.shown

    @property
    def servers(self) -> tuple[str, ...]:
        return self._pool.ring.servers

    @property
    def ring(self) -> Ring:
        """The placement: which server each name and key lives on."""
        return self._pool.ring

    @property
    def health(self) -> Health:
        """Which servers are marked down (read it; the pool keeps it)."""
        return self._pool.health

    def child(self, server: str) -> Backend:
        """The backend of one server of the pool, by its name as the ring knows it."""
        return self._pool.children[server]

    def placed(
        self, shard: str | None = None, replicas: int = 1, replica_keep: float | None = None
    ) -> Backend:
        if shard is None and replicas <= 1 and self._shard is None and self._replicas == 1:
            return self
        # A shallow copy: the same children, health, generations and buses, and whatever
        # was set on this instance; only the placement differs.
        view = copy.copy(self)
        view._shard = shard
        view._replicas = max(1, min(replicas, len(self._pool.ring)))
        view._replica_keep = replica_keep
        return view

    def locate(self, key: str) -> str:
        return self._pool.ring.locate(placement_key(key))

    # -- health -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _watch(self, route: _Route) -> Iterator[None]:
        """Report how a call on `route` went to the health of its server."""
        if route.admission is None:
            yield
            return
        health = self._pool.health
        try:
            yield
        except ClientBusy:
            # This process's own connections were busy: no verdict on the server.
            if route.admission is Admission.PROBE:
                health.abandoned(route.server)
            raise
        except BackendUnavailable as exc:
            self._report(route.server, health.failed(route.server, str(exc)))
            raise
        except Exception:
            self._report(route.server, health.succeeded(route.server))  # it answered
            raise
        except BaseException:
            if route.admission is Admission.PROBE:
                health.abandoned(route.server)
            raise
        self._report(route.server, health.succeeded(route.server))

    def _report(self, server: str, change: Change | None) -> None:
        if change is None:
            return
        health = self._pool.health
        if change is Change.CAME_BACK:
            log.warning("%s: server %s is back in the pool", self.server, server)
            return
        where = "the gutter" if self._pool.gutter is not None else "the next server on the ring"
        log.warning(
            "%s: server %s %s, marked down for %g s (%s); locks, semaphores and elections "
            "on it raise BackendUnavailable meanwhile, its cache entries go to %s",
            self.server,
            server,
            "is still down" if change is Change.STILL_DOWN else "went down",
            health.retry_after,
            health.last_error(server),
            where,
        )

    def _down_error(self, kind: str, name: str, server: str) -> BackendUnavailable:
        health = self._pool.health
        until = health.down_until(server)
        left = 0.0 if until is None else max(0.0, until - self._pool.clock.now())
        at = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + left))
        last = health.last_error(server)
        return BackendUnavailable(
            f"{kind} {name!r} on {server} (of {self.server}): that server is marked down until "
            f"{at} (another {left:.1f} s) after {health.failure_limit} consecutive failures"
            + (f" (last: {last})" if last else "")
            + f"; a {kind} never moves to another server of the pool, because two holders on "
            "two servers while this one flaps would break exclusion: retry once it is back"
        )

    # -- routes -----------------------------------------------------------------------

    def _lock_route(
        self, name: str, kind: str, *, holder: bool = False, owner: str | None = None
    ) -> _Route:
        """The server that holds lock (or semaphore) `name`: fixed, down or not.

        A `holder` call (extend, release) goes to it even while it is marked down:
        it cannot make a second holder, and a holder that does not even try loses its
        lock for sure, where trying costs at most one timeout (and an answer brings
        the server back). Everything else on a down server raises at once.
        A recompute lock follows its entry, except a granted one: its holder's calls
        go where it was granted, even if the entry has moved since.
        """
        placement = placement_key(name)
        if is_recompute_lock(name):
            granted = None if owner is None else self._pool.claim_of(name, owner)
            if granted is not None:
                return self._granted_route(granted)
            return self._entry_route(placement)  # it follows its entry
        server = self._pool.ring.locate(placement)
        health = self._pool.health
        admission = health.admit(server) if health.any_down else Admission.UP
        if admission is Admission.DOWN and holder:
            admission = Admission.UP
        if admission is Admission.DOWN:
            raise self._down_error(kind, name, server)
        return _Route(server, self._pool.children[server], admission)

    def _granted_route(self, server: str) -> _Route:
        """A route to the server (or the gutter) that granted a recompute lock."""
        pool = self._pool
        if server in pool.children:
            return _Route(server, pool.children[server], Admission.UP)
        assert pool.gutter is not None  # only the gutter is named otherwise
        return _Route(server, pool.gutter, None, pool.gutter_ttl)

    def _granted(self, name: str, owner: str, route: _Route, attempt: Attempt | None) -> None:
        if attempt is not None and attempt.acquired and is_recompute_lock(name):
            self._pool.claimed(name, owner, route.server)

    def _admit(self, server: str, memo: dict[str, Admission] | None) -> Admission:
        """`health.admit`, once per server and call: the keys of one call that a probed
        server holds all go to it, in the probe's one request."""
        if memo is None:
            return self._pool.health.admit(server)
        admission = memo.get(server)
        if admission is None:
            admission = memo[server] = self._pool.health.admit(server)
        return admission

    def _entry_route(self, placement: str, memo: dict[str, Admission] | None = None) -> _Route:
        """The server that holds entries placed by `placement` now: its own, or while that
        is down the gutter or the next server on the ring that is not down."""
        pool = self._pool
        primary = pool.ring.locate(placement)
        if not pool.health.any_down:
            return _Route(primary, pool.children[primary], Admission.UP)
        admission = self._admit(primary, memo)
        if admission is not Admission.DOWN:
            return _Route(primary, pool.children[primary], admission)
        if pool.gutter is not None:
            return _Route(_gutter_name(pool), pool.gutter, None, pool.gutter_ttl)
        for server in pool.ring.locate_n(placement, len(pool.ring))[1:]:
            admission = self._admit(server, memo)
            if admission is not Admission.DOWN:
                return _Route(server, pool.children[server], admission)
        raise BackendUnavailable(
            f"cache entries placed by {placement!r} on {self.server}: every server of the "
            "pool is marked down; check that they are running and reachable from here"
        )

    def _placement(self, key: str) -> str:
        return self._shard if self._shard is not None else placement_key(key)

    def _write_routes(self, key: str, memo: dict[str, Admission] | None = None) -> list[_Route]:
        """Where a write of `key` goes: every replica that is not down, and, while one is
        down, where the entry went instead (the gutter, say): a delete that skipped that
        place would leave the copy that reads are served from."""
        placement = self._placement(key)
        if self._replicas == 1:
            return [self._entry_route(placement, memo)]
        pool = self._pool
        servers = pool.ring.locate_n(placement, self._replicas)
        live = [
            _Route(
                server,
                pool.children[server],
                Admission.UP,
                keep_cap=None if server == servers[0] else self._replica_keep,
            )
            for server in servers
            if not pool.health.is_down(server)
        ]
        if len(live) < len(servers):
            failover = self._entry_route(placement, memo)
            if all(route.server != failover.server for route in live):
                live.append(failover)
        return live

    def _read_route(
        self, key: str, memo: dict[str, Admission] | None = None
    ) -> tuple[_Route, str | None]:
        """Where a read of `key` goes, and the primary to repair from when it is a replica."""
        placement = self._placement(key)
        if self._replicas == 1:
            return self._entry_route(placement, memo), None
        pool = self._pool
        servers = pool.ring.locate_n(placement, self._replicas)
        live = [server for server in servers if not pool.health.is_down(server)]
        if not live:
            return self._entry_route(placement, memo), None
        chosen = random.choice(live)
        primary = servers[0] if chosen != servers[0] and servers[0] in live else None
        return _Route(chosen, pool.children[chosen], Admission.UP), primary

    # -- locks ------------------------------------------------------------------------

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
        route = self._lock_route(name, "lock")
        with self._watch(route):
            attempt = route.backend.try_acquire(
                name,
                owner,
                ttl,
                queue_ttl=queue_ttl,
                replicas=replicas,
                replica_timeout=replica_timeout,
            )
        self._granted(name, owner, route, attempt)
        return attempt

    def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        route = self._lock_route(name, "lock", holder=True, owner=owner)
        try:
            with self._watch(route):
                return route.backend.release(name, owner, hold_for)
        finally:
            if is_recompute_lock(name):
                self._pool.claim_of(name, owner, forget=True)

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        route = self._lock_route(name, "lock", holder=True, owner=owner)
        with self._watch(route):
            return route.backend.extend(name, owner, ttl)

    def inspect(self, name: str) -> LockInfo | None:
        route = self._lock_route(name, "lock")
        with self._watch(route):
            return route.backend.inspect(name)

    def force_release(self, name: str) -> bool:
        route = self._lock_route(name, "lock")
        with self._watch(route):
            return route.backend.force_release(name)

    def leave_queue(self, name: str, owner: str) -> None:
        route = self._lock_route(name, "lock")
        with self._watch(route):
            route.backend.leave_queue(name, owner)

    def _holder(self, name: str, kind: str) -> Backend:
        """The child whose releases of `name` a waiter must hear; refused while it is down."""
        pool = self._pool
        placement = placement_key(name)
        if is_recompute_lock(name):
            # Where its entry is now, looked up without taking a down server's probe
            # (a waiter makes no call that could report how the probe went).
            if pool.health.is_down(pool.ring.locate(placement)) and pool.gutter is not None:
                return pool.gutter
            for server in pool.ring.locate_n(placement, len(pool.ring)):
                if not pool.health.is_down(server):
                    return pool.children[server]
        server = pool.ring.locate(placement)
        if self._pool.health.is_down(server):
            raise self._down_error(kind, name, server)
        return self._pool.children[server]

    def waiter(self, name: str) -> Waiter:
        return self._holder(name, "lock").waiter(name)

    def watcher(self, name: str) -> Waiter:
        return self._holder(name, "lock").watcher(name)

    # -- semaphores -------------------------------------------------------------------

    def sem_try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        limit: int,
        *,
        queue_ttl: float | None = None,
    ) -> Attempt:
        route = self._lock_route(name, "semaphore")
        with self._watch(route):
            return route.backend.sem_try_acquire(name, owner, ttl, limit, queue_ttl=queue_ttl)

    def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        route = self._lock_route(name, "semaphore", holder=True)
        with self._watch(route):
            return route.backend.sem_release(name, owner, hold_for)

    def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        route = self._lock_route(name, "semaphore", holder=True)
        with self._watch(route):
            return route.backend.sem_extend(name, owner, ttl)

    def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        route = self._lock_route(name, "semaphore")
        with self._watch(route):
            return route.backend.sem_inspect(name)

    def sem_force_release(self, name: str) -> int:
        route = self._lock_route(name, "semaphore")
        with self._watch(route):
            return route.backend.sem_force_release(name)

    def sem_leave_queue(self, name: str, owner: str) -> None:
        route = self._lock_route(name, "semaphore")
        with self._watch(route):
            route.backend.sem_leave_queue(name, owner)

    def sem_waiter(self, name: str) -> Waiter:
        return self._holder(name, "semaphore").sem_waiter(name)

    # -- cache entries ----------------------------------------------------------------

    def _fetch_on(
        self, route: _Route, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int]:
        with self._watch(route):
            return route.backend.cache_fetch(keys, gen_key)

    def _store_on(self, route: _Route, items: Sequence[tuple[str, bytes, float]]) -> None:
        with self._watch(route):
            route.backend.cache_store(
                [(key, data, route.keep(keep) if keep > 0 else keep) for key, data, keep in items]
            )

    def _raise_on(self, route: _Route, gen_key: str, at_least: int) -> int:
        with self._watch(route):
            return route.backend.cache_raise_generation(gen_key, at_least)

    def _agree(self, gen_key: str, answers: Sequence[tuple[_Route, int]]) -> int:
        """The generation for a read whose servers answered `answers`: the highest this pool
        has seen, to which any server behind it is raised first."""
        highest = self._pool.seen(gen_key, max((g for _, g in answers), default=0))
        behind = [route for route, generation in answers if generation < highest]
        if behind:
            raised = gather(
                [functools.partial(self._raise_on, route, gen_key, highest) for route in behind]
            )
            self._pool.seen(gen_key, max(raised))
        return highest

    def cache_fetch(self, keys: Sequence[str], gen_key: str) -> tuple[list[bytes | None], int]:
        if not keys:
            route = self._entry_route(gen_key)
            _, generation = self._fetch_on(route, (), gen_key)
            return [], self._agree(gen_key, [(route, generation)])
        groups: dict[str, tuple[_Route, list[int]]] = {}
        repairs: list[tuple[int, str, _Route]] = []
        memo: dict[str, Admission] = {}
        for at, key in enumerate(keys):
            route, primary = self._read_route(key, memo)
            groups.setdefault(route.server, (route, []))[1].append(at)
            if primary is not None:
                repairs.append((at, primary, route))
        order = list(groups.values())
        if len(order) == 1:
            route, ats = order[0]
            outcomes: list[tuple[list[bytes | None], int] | _Failed] = [
                self._fetch_on(route, [keys[at] for at in ats], gen_key)
            ]
        else:
            # A server that fails costs the batch its own keys only: the others' answers
            # are kept, and the failure is raised with them (PartialFetch).
            outcomes = gather(
                [
                    functools.partial(
                        self._fetch_or_error, route, [keys[at] for at in ats], gen_key
                    )
                    for route, ats in order
                ]
            )
        failures = [outcome.error for outcome in outcomes if isinstance(outcome, _Failed)]
        if len(failures) == len(outcomes):
            raise failures[0]
        found: list[bytes | None] = [None] * len(keys)
        generations: list[tuple[_Route, int]] = []
        answered: set[int] = set()
        for (route, ats), outcome in zip(order, outcomes, strict=True):
            if isinstance(outcome, _Failed):
                continue
            entries, generation = outcome
            generations.append((route, generation))
            answered.update(ats)
            for at, entry in zip(ats, entries, strict=True):
                found[at] = entry
        missed = [
            (at, primary, route)
            for at, primary, route in repairs
            if found[at] is None and at in answered
        ]
        if missed:
            generations += self._repair(keys, gen_key, missed, found)
        generation = self._agree(gen_key, generations)
        if failures:
            raise PartialFetch(str(failures[0]), found, generation)
        return found, generation

    def _fetch_or_error(
        self, route: _Route, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int] | _Failed:
        try:
            return self._fetch_on(route, keys, gen_key)
        except BackendError as exc:
            return _Failed(exc)  # wrapped: `gather` raises an exception it is handed

    def _repair(
        self,
        keys: Sequence[str],
        gen_key: str,
        missed: Sequence[tuple[int, str, _Route]],
        found: list[bytes | None],
    ) -> list[tuple[_Route, int]]:
        """Read what a replica missed from the primary, and copy it back to the replica for
        the entry's remaining freshness. Best effort: a failing primary leaves a miss."""
        by_primary: dict[str, list[tuple[int, _Route]]] = {}
        for at, primary, replica in missed:
            by_primary.setdefault(primary, []).append((at, replica))
        generations: list[tuple[_Route, int]] = []
        copies: dict[str, tuple[_Route, list[tuple[str, bytes, float]]]] = {}
        routes = [
            _Route(primary, self._pool.children[primary], Admission.UP) for primary in by_primary
        ]
        answers = gather(
            [
                functools.partial(
                    self._try_fetch,
                    route,
                    [keys[at] for at, _ in by_primary[route.server]],
                    gen_key,
                )
                for route in routes
            ]
        )
        now = time.time()
        for route, answer in zip(routes, answers, strict=True):
            if answer is None:
                continue
            entries, generation = answer
            wanted = by_primary[route.server]
            generations.append((route, generation))
            for (at, replica), entry in zip(wanted, entries, strict=True):
                if entry is None:
                    continue
                found[at] = entry
                header = decode_header(entry)
                keep = header.fresh_until - now if header is not None else 0.0
                if self._replica_keep is not None:
                    keep = min(keep, self._replica_keep)
                if keep > 0:
                    copies.setdefault(replica.server, (replica, []))[1].append(
                        (keys[at], entry, keep)
                    )
        if copies:
            with contextlib.suppress(BackendError):
                gather(
                    [
                        functools.partial(self._store_on, route, items)
                        for route, items in copies.values()
                    ]
                )
        return generations

    def _try_fetch(
        self, route: _Route, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int] | None:
        try:
            return self._fetch_on(route, keys, gen_key)
        except BackendError:
            return None

    def cache_read(self, key: str, gen_key: str, claim: Claim | None = None) -> CacheRead:
        if claim is None and self._replicas > 1:
            (entry,), generation = self.cache_fetch([key], gen_key)
            return CacheRead(entry, generation)
        placement = self._placement(key)
        if claim is not None and not (
            is_recompute_lock(claim.lock) and placement_key(claim.lock) == placement
        ):
            # A lock placed elsewhere than the entry: read, then try it on its own server.
            (entry,), generation = self.cache_fetch([key], gen_key)
            attempt = None
            if claim_due(entry, generation, claim.due_before):
                attempt = self.try_acquire(claim.lock, claim.owner, claim.ttl)
            return CacheRead(entry, generation, attempt)
        # With a claim, always the primary: one recompute per expiry, whichever replica.
        route = self._entry_route(placement)
        with self._watch(route):
            read = route.backend.cache_read(key, gen_key, claim)
        if claim is not None:
            self._granted(claim.lock, claim.owner, route, read.attempt)
        highest = self._pool.seen(gen_key, read.generation)
        if read.generation >= highest:
            return read
        # The server missed a clear: raise it, then judge the entry (and the claim) again.
        self._agree(gen_key, [(route, read.generation)])
        if read.attempt is not None and read.attempt.acquired:
            return CacheRead(read.entry, highest, read.attempt)  # a miss now, and ours
        with self._watch(route):
            again = route.backend.cache_read(key, gen_key, claim)
        if claim is not None:
            self._granted(claim.lock, claim.owner, route, again.attempt)
        return CacheRead(again.entry, max(again.generation, highest), again.attempt)

    def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        if not items:
            return
        groups: dict[str, tuple[_Route, list[tuple[str, bytes, float]]]] = {}
        memo: dict[str, Admission] = {}
        for item in items:
            for route in self._write_routes(item[0], memo):
                groups.setdefault(route.server, (route, []))[1].append(item)
        gather(
            [functools.partial(self._store_on, route, group) for route, group in groups.values()]
        )

    def _delete_on(self, route: _Route, key: str) -> bool:
        with self._watch(route):
            return route.backend.cache_delete(key)

    def _invalidate_on(self, route: _Route, key: str, keep: float) -> bool:
        with self._watch(route):
            return route.backend.cache_invalidate(key, route.keep(keep) if keep > 0 else keep)

    def cache_delete(self, key: str) -> bool:
        done = gather(
            [functools.partial(self._delete_on, route, key) for route in self._write_routes(key)]
        )
        self._reached_home(key, "delete")
        return any(done)

    def cache_invalidate(self, key: str, keep: float) -> bool:
        done = gather(
            [
                functools.partial(self._invalidate_on, route, key, keep)
                for route in self._write_routes(key)
            ]
        )
        self._reached_home(key, "invalidate")
        return any(done)

    def _reached_home(self, key: str, action: str) -> None:
        """Raise when `key`'s own server is marked down: the copy it keeps was not reached
        (only where the entry went meanwhile was), and it serves that copy once back."""
        home = self._pool.ring.locate(self._placement(key))
        if self._pool.health.is_down(home):
            raise BackendUnavailable(
                f"cache entry {key!r} on {home} (of {self.server}): could not {action} it "
                "there: that server is marked down, and once back it serves the copy it "
                f"kept (the other servers and the gutter did {action} theirs); "
                f"{action} it again once the server is back"
            )

    def _every_server(self) -> tuple[list[_Route], list[str]]:
        """A route to every server not marked down (and the gutter), and those that are."""
        pool = self._pool
        routes: list[_Route] = []
        down: list[str] = []
        for server in pool.ring.servers:
            admission = pool.health.admit(server)
            if admission is Admission.DOWN:
                down.append(server)
            else:
                routes.append(_Route(server, pool.children[server], admission))
        if pool.gutter is not None:
            routes.append(_Route(_gutter_name(pool), pool.gutter, None))
        return routes, down

    def _try_generation(self, route: _Route, gen_key: str) -> int | None:
        try:
            return (self._fetch_on(route, (), gen_key))[1]
        except BackendUnavailable:
            return None

    def _try_raise(self, route: _Route, gen_key: str, at_least: int) -> int | None:
        try:
            return self._raise_on(route, gen_key, at_least)
        except BackendUnavailable:
            return None

    def _raise_everywhere(
        self, gen_key: str, at_least: int, routes: list[_Route], down: list[str]
    ) -> int:
        raised = gather(
            [functools.partial(self._try_raise, route, gen_key, at_least) for route in routes]
        )
        missed = down + [route.server for route, g in zip(routes, raised, strict=True) if g is None]
        generation = max([at_least, *(g for g in raised if g is not None)])
        self._pool.seen(gen_key, generation)
        if missed:
            raise BackendUnavailable(
                f"cache namespace {gen_key!r} on {self.server}: the generation is now "
                f"{generation} on every server but {', '.join(missed)} (unreachable or marked "
                "down), which may still serve entries written before; this process raises "
                "them before it reads from them again; run clear() again once they are back"
            )
        return generation

    def cache_clear(self, gen_key: str) -> int:
        """Every server to one new generation, above the highest any of them had."""
        routes, down = self._every_server()
        current = gather(
            [functools.partial(self._try_generation, route, gen_key) for route in routes]
        )
        known = self._pool.seen(gen_key, max((g for g in current if g is not None), default=0))
        # A server that did not answer is not asked again: one timeout per call at most.
        down += [route.server for route, g in zip(routes, current, strict=True) if g is None]
        answered = [route for route, g in zip(routes, current, strict=True) if g is not None]
        return self._raise_everywhere(gen_key, known + 1, answered, down)

    def cache_raise_generation(self, gen_key: str, at_least: int) -> int:
        routes, down = self._every_server()
        return self._raise_everywhere(gen_key, at_least, routes, down)

    def _count_on(self, route: _Route, key_prefix: str) -> int | None:
        with self._watch(route):
            return route.backend.cache_count(key_prefix)

    def cache_count(self, key_prefix: str) -> int | None:
        pool = self._pool
        down = [server for server in pool.ring.servers if pool.health.is_down(server)]
        if down:
            raise BackendUnavailable(
                f"cache key prefix {key_prefix!r} on {self.server}: cannot count the entries "
                f"while {', '.join(down)} {'is' if len(down) == 1 else 'are'} marked down"
            )
        counts = gather(
            [
                functools.partial(
                    self._count_on, _Route(server, pool.children[server], Admission.UP), key_prefix
                )
                for server in pool.ring.servers
            ]
        )
        if any(count is None for count in counts):
            return None
        return sum(count for count in counts if count is not None)

    def _close_one(self, backend: Backend) -> None:
        backend.close()

    def close(self) -> None:
        backends = list(self._pool.children.values())
        if self._pool.gutter is not None:
            backends.append(self._pool.gutter)
        gather([functools.partial(self._close_one, backend) for backend in backends])


def _gutter_name(pool: _Shared) -> str:
    return f"the gutter {pool.gutter.server if pool.gutter is not None else ''}"


_KINDS: dict[type[Backend], type[PoolBackend]] = {}
_KINDS_MUTEX = ProcessLock()


def _kind(child_cls: type[Backend]) -> type[PoolBackend]:
    """The pool class for one kind of server: its capabilities are derived from the child's."""
    with _KINDS_MUTEX:
        made = _KINDS.get(child_cls)
        if made is None:
            made = cast(
                "type[PoolBackend]",
                type(
                    f"{child_cls.__name__.removesuffix('Backend')}PoolBackend",
                    (PoolBackend,),
                    {
                        "__module__": __name__,
                        "capabilities": pool_capabilities(child_cls.capabilities),
                        "claims_with_read": child_cls.claims_with_read,
                    },
                ),
            )
            _KINDS[child_cls] = made
        return made


def _flavoured(module: str, cls: str) -> type[Backend]:
    package = __name__.rsplit(".", 1)[0]
    name = cls if package.split(".")[1] == "_async" else cls.removeprefix("Async")
    found: type[Backend] = getattr(importlib.import_module(f"{package}.{module}"), name)
    return found


def _child_class(scheme: str, shown: str) -> type[Backend]:
    spec = BACKENDS[scheme]
    try:
        return _flavoured(spec.module, spec.cls)
    except ImportError as exc:
        if spec.extra is None or (exc.name or "").split(".")[0] not in spec.clients:
            raise
        raise ConfigError(
            f"{shown} needs the {spec.extra!r} extra: pip install 'corral[{spec.extra}]' ({exc})"
        ) from exc


def _open(url: str, clock: Clock, timeout: object = None) -> Backend:
    """A gutter store: any URL, a pool too. It serves the pool's calls, so the pool's
    `timeout` bounds it too, unless its own URL sets one."""
    spec = resolve(url)
    scheme = url.partition("://")[0].lower()
    opener: Any = PoolBackend if spec.module == "pool" else _child_class(scheme, redact(url))
    takes = {option.name for option in _child_class(scheme, redact(url)).url_options}
    options: dict[str, Any] = {}
    if (
        timeout is not None
        and "timeout" in takes
        and "timeout" not in urllib.parse.parse_qs(url.partition("?")[2])
    ):
        options["timeout"] = timeout
    backend: Backend = opener.from_url(url, clock=clock, **options)
    return backend


def _ring_name(host: str, default_port: int) -> str:
    host = host.strip()
    if host.startswith("["):
        return host if "]:" in host else f"{host}:{default_port}"
    return host if ":" in host else f"{host}:{default_port}"


def _hashing(given: dict[str, object], shown: str) -> str:
    hashing = given.get("hashing", "ketama")
    if hashing not in HASHINGS:
        raise ConfigError(f"{shown}: hashing must be one of {', '.join(HASHINGS)}, not {hashing!r}")
    return str(hashing)


def _weights(given: dict[str, object], names: list[str], shown: str) -> Any:
    weights = given.get("weights")
    if weights is None or isinstance(weights, dict):
        return weights
    if isinstance(weights, str):
        parts = weights.split(",")
        if len(parts) != len(names) or not all(part.strip().isdigit() for part in parts):
            raise ConfigError(
                f"{shown}: weights must be {len(names)} whole numbers, one per server in the "
                f"URL's order (weights={','.join('1' * len(names))}), not {weights!r}"
            )
        return [int(part) for part in parts]
    if isinstance(weights, (list, tuple)):
        return list(weights)
    raise ConfigError(
        f"{shown}: weights must be text such as '3,1,1' or a dict server -> weight, "
        f"not {type(weights).__name__}"
    )


def _integer(given: dict[str, object], name: str, default: int, shown: str) -> int:
    value = given.get(name, default)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{shown}: {name} must be a whole number of at least 1, not {value!r}")
    return value


def _seconds(
    given: dict[str, object], name: str, default: float, shown: str, *, zero: bool = False
) -> float:
    value = given.get(name, default)
    try:
        seconds = float(value) if isinstance(value, (str, int, float)) else float("nan")
    except ValueError:
        seconds = float("nan")
    if isinstance(value, bool) or not (seconds >= 0 if zero else seconds > 0) or seconds > 1e9:
        bound = "at least 0" if zero else "more than 0"
        raise ConfigError(f"{shown}: {name} must be a number of seconds {bound}, not {value!r}")
    return seconds
