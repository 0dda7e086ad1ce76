"""`redis+cluster://h1:p1,h2:p2`: locks and caches on a Redis Cluster.

The cluster routes: each key lives in one of 16384 slots, each slot on one
master, so the backend talks to the cluster through redis-py's cluster client,
which keeps the slot map and follows MOVED and ASK redirections. Everything
else is the single-Redis backend's (`corral._async.backends.redis`): the same
Lua scripts, waiters and error handling, with a few methods routed differently.

One slot per script. A Lua script may touch keys of one slot only. A lock's keys
(the lock, its token counter, its queue and the wake-up lists `wake:<owner>`
that scripts build from an argument) all carry the lock name as hash tag
(`corral:{name}:lock`), as they do on one server, so the key layout of locks
and semaphores is the single server's. A cache entry is stored under the hash
tag of its recompute lock (`corral:cache:{\\x00cache:<key>}`), so the read that
finds the entry due claims the lock in the same script. Only the namespace
generation that `clear()` bumps lives elsewhere: it is one key for the whole
namespace, in a slot of its own, read beside the script in the same round trip
(a pipeline, sent to both masters at once). The script cannot see that read, so
it is told the generation this backend last saw; when the two differ (only
after a `clear()`) and the script judged the entry fresh, it runs once more with
the generation just read.

Wake-ups. A release pushes to the lock's wake-up lists (in the lock's slot, so
a waiter's `BLPOP` goes to the master that holds the lock) and publishes on the
lock's channel; a plain `PUBLISH` reaches every node of a cluster, so the
pub/sub feed listens on any one node, and moves to another when that one fails.

What a failover loses: replication is asynchronous, so an acquisition the old
master acknowledged but had not yet sent to its replica is gone once the replica
is promoted, and a second client can take the lock. `replicas=N` (WAIT on the
lock's master) narrows that window. Fencing tokens still increase across a
failover, as they never fall below the server's clock in microseconds, as long
as the promoted replica's clock is not behind the old master's by more than the
failover took.

Calls are not retried by the client (a retried script could run twice): a call
to a master that died fails with BackendUnavailable within `timeout`, and the
slot map is reloaded beside the calls, which go to the new master once found.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar
from urllib.parse import unquote

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.client import NEVER_DECODE
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from corral._async._compat import Job, start_job
from corral._async.backends.redis import (
    _CERT_REQS,
    _SSL_OPTIONS,
    DEFAULT_TIMEOUT,
    SCAN_BATCH,
    UNBOUNDED,
    WAIT_SHARE,
    AsyncRedisBackend,
    AsyncReleaseFeed,
    _lua_number,
    _ms,
    claimed_read,
)
from corral.backends import redis_scripts as scripts
from corral.backends.registry import check_userinfo, redact
from corral.core import envelope, lockflow
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.forks import ProcessLock
from corral.core.options import Option, merge_options
from corral.core.placement import recompute_lock_name
from corral.core.primitives import CacheRead, Claim
from corral.core.validate import check_timeout
from corral.errors import BackendError, BackendUnavailable, ConfigError

__all__ = ["AsyncRedisClusterBackend"]

DEFAULT_PORT = 6379
# Namespace generations remembered (a bounded cache: namespaces may be unbounded).
KNOWN_GENERATIONS = 4096
# A cache read judged under a stale generation runs again, at most this many times in
# all (each clear() between two rounds costs one).
GENERATION_ROUNDS = 3


class _ClusterClient(RedisCluster):  # type: ignore[misc,unused-ignore]
    """redis-py's cluster client with a `__dict__` (it has `__slots__`), so that the
    backend can replace how it reloads its slot map (see `_refresh_beside_calls`).

    The asyncio client loads the slot map within the first call, but decides how
    to route that call before, by whether it has a default node: calls made
    together on a new client would each go to a random master and be redirected.
    Here a call waits for the map first. The client also forgets its default node
    when it closes itself after a CLUSTERDOWN answer, keeping the map: a default is
    put back from that map, so that calls meanwhile still go by slot.
    """

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        # Any: redis-py's blocking cluster client is untyped.
        client: Any = super()
        if client.get_default_node() is None:
            primaries = client.get_primaries() if self.nodes_manager.slots_cache else []
            if primaries:
                self.nodes_manager.default_node = primaries[0]
            else:  # the map is not loaded yet
                # The blocking client loads it as it opens, through its nodes manager.
                await getattr(self, "initialize", self.nodes_manager.initialize)()
        return await client.execute_command(*args, **kwargs)


def _node(item: str, shown: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `host` (port 6379) of a seed node."""
    host, port = item, ""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
        if rest and not rest.startswith(":"):
            port = "?"
    elif ":" in item:
        host, _, port = item.rpartition(":")
    if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ConfigError(
            f"{shown}: {item!r} is not a node; expected redis+cluster://host:port,host:port"
        )
    return host, int(port) if port else DEFAULT_PORT


def _answers(answers: Sequence[Any]) -> list[Any]:
    """A pipeline's answers, raising the first error answer."""
    for answer in answers:
        if isinstance(answer, Exception):
            raise answer
    return list(answers)


class AsyncRedisClusterBackend(AsyncRedisBackend):
    capabilities: ClassVar[Capabilities] = replace(
        AsyncRedisBackend.capabilities,
        scheme="redis+cluster",
        ttl_clock="the clock of the master serving the name's slot",
        on_server_restart=(
            "a master that fails is replaced by its replica (after cluster-node-timeout); "
            "calls to its slots fail with BackendUnavailable until then. Without "
            "persistence, a master restarted with no replica left forgets its locks"
        ),
        on_partition=(
            "replication is asynchronous: an acquisition the failed master acknowledged "
            "but had not sent to its replica is lost when the replica is promoted, and "
            "a second client can take the lock; replicas=N (WAIT) narrows that window "
            "but is not consensus. A master cut off from the majority stops accepting "
            "writes after cluster-node-timeout"
        ),
        fencing_tokens=(
            "the master's clock in microseconds (`TIME`), or the name's last token + 1 "
            "while that is kept (for the lock's TTL), whichever is larger; they keep "
            "increasing across failovers unless the promoted replica's clock is behind the "
            "old master's by more than the failover took"
        ),
        cache=(
            "strings kept with a PX expiry in the slot of their recompute lock; one Lua "
            "script reads an entry and claims that lock, pipelined with the read of the "
            "namespace generation"
        ),
    )

    url_options: ClassVar[tuple[Option, ...]] = (
        Option(
            "prefix", f"`{scripts.DEFAULT_PREFIX}`", "first part of every key corral writes", "app"
        ),
        Option(
            "timeout", f"{DEFAULT_TIMEOUT:g}", "seconds for connecting and for each reply", "2.5"
        ),
        Option("username", "from the URL", "ACL user (or put `user:password@` in the URL)"),
        Option("password", "from the URL", "AUTH password (never shown in messages or logs)"),
        Option(
            "ssl_ca_certs", "system CAs", "`rediss+cluster://` only: CA file to verify the nodes"
        ),
        Option("ssl_certfile", "none", "`rediss+cluster://` only: client certificate file"),
        Option("ssl_keyfile", "none", "`rediss+cluster://` only: client key file"),
        Option(
            "ssl_cert_reqs",
            "`required`",
            "`rediss+cluster://` only: `required`, `optional` or `none` (no verification)",
        ),
    )

    def __init__(
        self,
        *,
        seeds: Sequence[tuple[str, int]],
        connection: dict[str, Any],
        tls: dict[str, Any] | None = None,
        server: str,
        prefix: str = scripts.DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._connection = connection
        # TLS options as redis-py's connections take them (None: plain TCP).
        self._tls = tls
        self._node_pools: dict[tuple[str, int], ConnectionPool] = {}
        self._node_clients: dict[tuple[str, int], Redis] = {}
        self._seeds = list(seeds)
        # The pool of the first seed: the single-Redis backend keeps its scripts' SHAs
        # on a client of it, and lets waiters block a connection each (BLPOP) because
        # the pool is unbounded; every call of this backend goes through `_cluster`.
        first = self._pubsub_pool_for(self._seeds[0])
        super().__init__(
            pool=first, pubsub_pool=first, server=server, prefix=prefix, timeout=timeout
        )
        # Opened on first use (redis-py's blocking flavour connects as it opens).
        self._cluster_client: Any = None
        self._cluster_mutex = ProcessLock()
        # The slot map's own reload, and the job reloading it beside the calls.
        self._reload_now: Any = None
        self._reload_jobs: list[Job] = []
        self._feed_node = random.randrange(len(self._seeds))
        self._cache_read_given = self._client.register_script(scripts.CACHE_READ_GIVEN_GENERATION)
        # The generation each namespace had when this backend last read it.
        self._generations: dict[str, int] = {}

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> AsyncRedisClusterBackend:
        """Open a backend on the cluster the seed nodes of `url` belong to.

        The clock is unused: each master's clock decides expiry. Any node of the
        cluster will do as a seed; several let a client start while one is down.
        """
        shown = redact(url)
        check_userinfo(url, shown)
        base, _, query = url.partition("?")
        given, _ = merge_options(shown, query, options, cls.url_options, backend="redis+cluster")
        scheme, _, rest = base.partition("://")
        userinfo, at, hosts = rest.rpartition("@")
        hosts, _, path = hosts.partition("/")
        if path not in ("", "0"):
            raise ConfigError(f"{shown}: Redis Cluster has only database 0, not /{path}")
        if not hosts:
            raise ConfigError(f"{shown}: no node given; expected redis+cluster://host:port,...")
        seeds = [_node(item.strip(), shown) for item in hosts.split(",")]
        scheme = scheme.lower()
        ssl = {key: given[key] for key in _SSL_OPTIONS & set(given)}
        if ssl and scheme != "rediss+cluster":
            raise ConfigError(
                f"{shown}: {', '.join(sorted(ssl))} need(s) a rediss+cluster:// URL (TLS)"
            )
        if "ssl_cert_reqs" in ssl and ssl["ssl_cert_reqs"] not in _CERT_REQS:
            raise ConfigError(
                f"{shown}: ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, "
                f"got {ssl['ssl_cert_reqs']!r}"
            )
        credentials: dict[str, Any] = {}
        if at:
            user, colon, password = userinfo.partition(":")
            if user:
                credentials["username"] = unquote(user)
            if colon:
                credentials["password"] = unquote(password)
        credentials.update(
            {key: str(given[key]) for key in ("username", "password") if key in given}
        )
        prefix = scripts.check_prefix(given.get("prefix", scripts.DEFAULT_PREFIX))
        timeout = check_timeout(given.get("timeout", DEFAULT_TIMEOUT), shown)
        connection: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "decode_responses": True,
            **credentials,
        }
        user = str(credentials.get("username") or "")
        netloc = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in seeds)
        server = f"{scheme}://{user + '@' if user else ''}{netloc}"
        return cls(
            seeds=seeds,
            connection=connection,
            tls=ssl if scheme == "rediss+cluster" else None,
            server=server,
            prefix=prefix,
            timeout=timeout,
        )

    @property
    def _cluster(self) -> Any:
        """redis-py's cluster client (Any: its blocking flavour is untyped), opened on
        first use, so a store can be opened while the cluster is down; an opening that
        fails is tried again by the next call."""
        cluster = self._cluster_client
        if cluster is None:
            with self._cluster_mutex:
                cluster = self._cluster_client
                if cluster is None:
                    if self._closed:
                        raise RedisConnectionError("the backend is closed")
                    client_class: Any = _ClusterClient
                    node_class: Any = ClusterNode
                    # No retries: a call fails within `timeout` instead of several times
                    # it (a retried script could also run twice), and the lock logic
                    # decides what a failure means. Redirections (MOVED, ASK) are still
                    # followed, each patching the slot map; after every fifth redirection
                    # redis-py would instead close every connection of the client, the
                    # ones other calls are using included, so that is turned off
                    # (`reinitialize_steps=0`): a full reload follows connection errors.
                    cluster = client_class(
                        startup_nodes=[node_class(host, port) for host, port in self._seeds],
                        retry=Retry(NoBackoff(), 0),
                        reinitialize_steps=0,
                        max_connections=UNBOUNDED,
                        **self._connection,
                        **({"ssl": True, **self._tls} if self._tls is not None else {}),
                    )
                    self._refresh_beside_calls(cluster)
                    self._cluster_client = cluster
        return cluster

    def _refresh_beside_calls(self, cluster: Any) -> None:
        """Reload the slot map beside the calls that found a node failing, not within one.

        After a connection error or timeout redis-py reloads the slot map, asking
        one node after another: the blocking client inside the very call that
        failed, the asyncio one at the start of the next call. While every node is
        frozen or cut off, that call would wait one timeout per node. Here, once a
        map is loaded, the reload runs as a background job (one at a time), and
        calls meanwhile use the map they have, each failing within its own timeout.
        The first load still happens in the call that needs it, and in every call
        that comes while it runs: the asyncio client fills the slot map before it
        has learnt from the server where each command's keys are, and a call let
        through then would go to any node and be redirected.
        """
        manager = cluster.nodes_manager
        # The blocking client loads the map as it opens; the asyncio one at first use.
        loaded = [True] if manager.slots_cache else []
        self._reload_now = manager.initialize
        # The asyncio client reloads through its own `initialize`, the blocking one
        # through its nodes manager's.
        owner = cluster if hasattr(cluster, "initialize") else manager
        reload = owner.initialize
        running: list[Job] = []

        async def reload_quietly(kwargs: dict[str, Any]) -> None:
            with contextlib.suppress(Exception):  # the next failing call starts another
                await reload(**kwargs)

        async def initialize(*args: Any, **kwargs: Any) -> Any:
            if not loaded or args:
                answer = await reload(*args, **kwargs)  # no map yet: the call needs one
                loaded[:] = [True]
                return answer
            with self._cluster_mutex:
                if not (running and not running[0].done()) and not self._closed:
                    running[:] = [start_job(reload_quietly, kwargs)]
            return None

        owner.initialize = initialize
        self._reload_jobs = running

    # -- errors -----------------------------------------------------------------

    def _error(
        self,
        exc: BaseException,
        name: str,
        action: str,
        kind: str = "lock",
        where: str | None = None,
    ) -> BackendError:
        # A cluster error (CLUSTERDOWN, a slot no master serves, redirections without
        # end or left over, a slot being migrated, no node reachable) is the cluster's
        # state, not a fault of the call; keys of several slots in one script would be
        # corral's fault, and are reported so.
        if isinstance(exc, (ClusterError, AskError, TryAgainError)) or (
            isinstance(exc, RedisClusterException) and "same" not in str(exc)
        ):
            where = where or f"{kind} {name!r} on {self._server}: could not {action} it"
            if isinstance(exc.__cause__, AuthenticationError):
                # The cluster client reports a refused login as a failure to connect.
                return super()._error(exc.__cause__, name, action, kind, where)
            return BackendUnavailable(
                f"{where}: the cluster cannot serve it now ({exc}); check that its nodes "
                "run and are reachable from here, and CLUSTER INFO on them (while a master "
                "fails over, retry shortly)"
            )
        return super()._error(exc, name, action, kind, where)

    # -- routing --------------------------------------------------------------------

    async def _send(
        self,
        commands: Sequence[tuple[Any, ...]],
        name: str,
        action: str,
        kind: str = "lock",
        *,
        raw: bool = False,
        where: str | None = None,
        script: Any = None,
    ) -> list[Any]:
        """Each command to the master of its keys' slot (all in one slot per command).

        With `script`, the first command is its EVALSHA, sent again as EVAL if the
        master does not know the script (a replica promoted since, a restart).
        """
        self._raise_if_closed(name, action, kind)
        options = {NEVER_DECODE: True} if raw else {}
        answers: list[Any] = []
        try:
            for index, command in enumerate(commands):
                try:
                    answers.append(await self._cluster.execute_command(*command, **options))
                except NoScriptError:
                    if script is None or index:
                        raise
                    answers.append(
                        await self._cluster.execute_command(
                            "EVAL", script.script, *command[2:], **options
                        )
                    )
        except (RedisError, RedisClusterException, OSError) as exc:
            raise self._error(exc, name, action, kind, where) from exc
        return answers

    async def _pipeline(
        self,
        commands: Sequence[tuple[Any, ...]],
        name: str,
        action: str,
        kind: str,
        *,
        raw: bool = False,
        where: str | None = None,
    ) -> list[Any]:
        """Commands of any slots in one round trip: each master gets its own at once.

        Error answers come back in the list; the caller decides.
        """
        self._raise_if_closed(name, action, kind)
        options = {NEVER_DECODE: True} if raw else {}
        try:
            pipe = self._cluster.pipeline()
            for command in commands:
                pipe.execute_command(*command, **options)
            answers: list[Any] = await pipe.execute(raise_on_error=False)
        except (RedisError, RedisClusterException, OSError) as exc:
            raise self._error(exc, name, action, kind, where) from exc
        return answers

    def _pubsub_pool_for(self, node: tuple[str, int]) -> ConnectionPool:
        pool = self._node_pools.get(node)
        if pool is None:
            host, port = node
            # The feed must notice every failure itself (a silent reconnect would hide
            # missed messages), so redis-py may not retry or reconnect it.
            tls: dict[str, Any] = {}
            if self._tls is not None:
                tls = {"connection_class": SSLConnection, **self._tls}
            pool = self._node_pools[node] = ConnectionPool(
                host=host,
                port=port,
                retry=Retry(NoBackoff(), 0, supported_errors=()),
                max_connections=UNBOUNDED,
                **self._connection,
                **tls,
            )
        return pool

    def _current_feed(self) -> AsyncReleaseFeed:
        """The release feed, on one node of the cluster: a PUBLISH reaches them all.

        A feed that failed (its node died, say) is replaced by one on the next node
        the cluster client knows, so a dead node is not tried again at once.
        """
        with self._feed_mutex:
            feed = self._feed
            if feed is None or not feed.usable:
                client = self._cluster_client
                known = sorted(
                    (node.host, int(node.port)) for node in (client.get_nodes() if client else [])
                )
                nodes = known or self._seeds
                self._feed_node = (self._feed_node + 1) % len(nodes)
                feed = self._feed = AsyncReleaseFeed(
                    self._pubsub_pool_for(nodes[self._feed_node]),
                    scripts.feed_channel(self.prefix),
                )
            return feed

    async def _block_on(self, key: str, timeout: float) -> bool | None:
        """BLPOP `key` on the master of its slot (see the single-Redis backend's)."""
        if self._closed:
            return True
        seconds = min(timeout, self._timeout * WAIT_SHARE)
        try:
            reply = await self._cluster.execute_command("BLPOP", key, f"{seconds:.3f}")
        except ResponseError as exc:
            if type(exc) in (ResponseError, NoPermissionError):
                self._refuse_blocking(exc)
            return None
        except (RedisError, RedisClusterException, OSError):
            return None
        return reply is not None

    async def _node_client(self, key: str) -> Redis:
        """A client of the master that serves `key`'s slot, for a script and WAIT that
        must share one connection (WAIT counts that connection's writes only)."""
        node = None
        with contextlib.suppress(RedisError, RedisClusterException):
            node = self._cluster.get_node_from_key(key)
        if node is None:
            # The slot map is not loaded yet: any keyed command loads it.
            await self._cluster.execute_command("EXISTS", key)
            node = self._cluster.get_node_from_key(key)
        if node is None:
            raise RedisConnectionError(f"no master serves the slot of {key!r}")
        address = (node.host, int(node.port))
        client = self._node_clients.get(address)
        if client is None:
            tls = {"ssl": True, **self._tls} if self._tls is not None else {}
            client = self._node_clients[address] = Redis(
                host=address[0],
                port=address[1],
                retry=Retry(NoBackoff(), 0),
                **self._connection,
                **tls,
            )
        return client

    async def _pipelined_acquire(
        self, keys: list[str], args: list[str], replicas: int, wait_ms: int, by_sha: bool
    ) -> list[Any]:
        # Straight to the slot's master, outside the cluster client, which follows no
        # redirection here: a master that no longer serves the slot (moved by a
        # resharding, or a failover the map has not seen) answers MOVED without running
        # the script, so it is sent once more to the master the reloaded map names.
        for _ in range(2):
            client = await self._node_client(keys[0])
            try:
                async with client.pipeline(transaction=False) as pipe:
                    if by_sha:
                        pipe.evalsha(self._acquire.sha, len(keys), *keys, *args)
                    else:
                        pipe.eval(scripts.ACQUIRE, len(keys), *keys, *args)
                    pipe.wait(replicas, wait_ms)
                    results: list[Any] = await pipe.execute(raise_on_error=False)
            except (RedisError, OSError):
                await self._reload_slots()  # the master may have failed over
                raise
            if not isinstance(results[0], MovedError):
                break
            await self._reload_slots()
        return results

    async def _reload_slots(self) -> None:
        # On failure, the next call through the cluster client tries again.
        with contextlib.suppress(RedisError, RedisClusterException, OSError):
            cluster = self._cluster
            await (self._reload_now or cluster.nodes_manager.initialize)()

    # -- cache entries ----------------------------------------------------------------

    def _cache_key(self, key: str) -> str:
        return scripts.cache_key(self.prefix, key, tagged=True)

    def _remember(self, gen_key: str, generation: int) -> None:
        if len(self._generations) >= KNOWN_GENERATIONS:
            self._generations.clear()
        self._generations[gen_key] = generation

    async def cache_fetch(
        self, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int]:
        # MGET of one key each (entries live in many slots), and the generation last.
        commands = [("MGET", self._cache_key(key)) for key in keys]
        commands.append(("MGET", scripts.cache_gen_key(self.prefix, gen_key)))
        where = self._entries_where(keys, "read")
        answers = await self._pipeline(
            commands, keys[0] if keys else gen_key, "read", "cache entry", raw=True, where=where
        )
        try:
            found = [answer[0] for answer in _answers(answers)]
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, gen_key, "read", "cache entry", where) from exc
        generation = self._generation(found[-1], gen_key)
        self._remember(gen_key, generation)
        return found[:-1], generation

    async def cache_read(self, key: str, gen_key: str, claim: Claim | None = None) -> CacheRead:
        where = self._cache_where(f"cache entry {key!r}", "read it")
        entry_key = self._cache_key(key)
        gen = scripts.cache_gen_key(self.prefix, gen_key)
        if claim is None:
            entries, generation = await self.cache_fetch([key], gen_key)
            return CacheRead(entries[0], generation)
        if claim.lock != recompute_lock_name(key):
            # A lock of another name lives in another slot: read, then try it (the
            # cache's own recompute lock takes the one-script path below).
            entries, generation = await self.cache_fetch([key], gen_key)
            if not envelope.claim_due(entries[0], generation, claim.due_before):
                return CacheRead(entries[0], generation)
            attempt = await self.try_acquire(claim.lock, claim.owner, claim.ttl)
            return CacheRead(entries[0], generation, attempt)
        lock = self._keys(claim.lock)
        keys = [
            entry_key,
            lock.lock,
            lock.fence,
            lock.queue,
            lock.queue_expiry,
            lock.waiting,
            lock.wake(claim.owner),
        ]
        expected = self._generations.get(gen_key, 0)
        args = [
            _lua_number(claim.due_before),
            claim.owner,
            str(_ms(claim.ttl)),
            "",
            str(_ms(lockflow.NOTIFIED_RECHECK * scripts.WAITING_PAUSES)),
            str(expected),
        ]
        script = self._cache_read_given
        for _ in range(GENERATION_ROUNDS):
            command = ("EVALSHA", script.sha, len(keys), *keys, *args)
            answers = await self._pipeline(
                [("MGET", gen), command], key, "read", "cache entry", raw=True, where=where
            )
            try:
                if isinstance(answers[1], NoScriptError):
                    (answers[1],) = await self._send(
                        [command], key, "read", "cache entry", raw=True, where=where, script=script
                    )
                stored, result = _answers(answers)
            except (RedisError, RedisClusterException) as exc:
                raise self._error(exc, key, "read", "cache entry", where) from exc
            generation = self._generation(stored[0], gen_key)
            self._remember(gen_key, generation)
            granted = int(result[1])
            if generation == expected:
                break
            # Judged under a generation that is no longer current (a clear() since this
            # backend last looked): judge again under the current one. A claim won on
            # the wrong judgement is given back first: a claim tells the cache to compute.
            if granted > 0:
                await self.release(claim.lock, claim.owner)
            expected = generation
            args[-1] = str(generation)
        return claimed_read(result[0], generation, granted, result[2] if granted >= 0 else 0)

    async def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        if not items:
            return
        keys = [key for key, _, _ in items]
        where = self._entries_where(keys, "store")
        commands = self._store_commands(items)
        answers = await self._pipeline(commands, keys[0], "store", "cache entry", where=where)
        try:
            _answers(answers)
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, keys[0], "store", "cache entry", where) from exc

    async def cache_clear(self, gen_key: str) -> int:
        generation = int(await super().cache_clear(gen_key))
        self._remember(gen_key, generation)
        return generation

    async def cache_count(self, key_prefix: str) -> int | None:
        # SCAN on every master, a batch per round trip each; see the single-Redis backend's.
        pattern = scripts.cache_pattern(self.prefix, key_prefix, tagged=True)
        where = self._cache_where(f"cache key prefix {key_prefix!r}", "count the entries of it")
        seen: set[bytes] = set()
        try:
            if not self._cluster.get_primaries():
                await self._cluster.execute_command("EXISTS", pattern)  # loads the slot map
            for node in self._cluster.get_primaries():
                cursor: Any = b"0"
                while True:
                    answer = await self._cluster.execute_command(
                        "SCAN",
                        cursor,
                        "MATCH",
                        pattern,
                        "COUNT",
                        SCAN_BATCH,
                        target_nodes=node,
                        **{NEVER_DECODE: True},
                    )
                    # redis-py answers a cluster SCAN with the cursor of each node asked.
                    cursors, found = answer
                    cursor = next(iter(cursors.values())) if isinstance(cursors, dict) else cursors
                    seen.update(found)
                    if int(cursor) == 0:
                        break
        except (RedisError, RedisClusterException, OSError) as exc:
            raise self._error(
                exc, key_prefix, "count the entries of", "cache key prefix", where
            ) from exc
        return len(seen)

    # -- where a key lives -------------------------------------------------------------

    def locate(self, key: str) -> str:
        """The master that holds cache entry `key` (and its recompute lock), as the
        cluster client last saw the slot map; the cluster's URL before the first call."""
        node = None
        client = self._cluster_client
        if client is not None:
            with contextlib.suppress(RedisError, RedisClusterException):
                node = client.get_node_from_key(self._cache_key(key))
        if node is None:
            return self._server
        host = f"[{node.host}]" if ":" in node.host else node.host
        return f"{host}:{node.port}"

    async def aclose(self) -> None:
        await super().aclose()
        for client in list(self._node_clients.values()):
            await client.aclose()
        for pool in list(self._node_pools.values()):
            await pool.disconnect()
        with self._cluster_mutex:
            cluster, self._cluster_client = self._cluster_client, None
            for job in self._reload_jobs:
                job.cancel()
        if cluster is not None:
            await cluster.aclose()
