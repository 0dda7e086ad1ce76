"""`redis://` and `rediss://`: locks on one Redis server (or a master with replicas).

Every primitive is one Lua script, sent by its SHA (redis-py loads the text
and retries on NOSCRIPT): the check and the change happen atomically on the
server, in one round trip, with the server's clock deciding expiry. A client
get-then-set races; WATCH/MULTI needs several round trips and retries under
contention. The scripts and key names are in `corral.backends.redis_scripts`.

Waiters are woken by the release itself, through lists a release pushes to:
the lock's shared list, holding at most one token, which Redis hands to the
waiter that blocked on it first (`BLPOP`), and, for a waiter in the lock's
queue, a list of its own, pushed only when it is the queue's head. A list keeps
its token until someone takes it, so a release between a waiter's failed
attempt and its wait still wakes it, and nothing needs confirming before the
attempt; the pop returns in the waiting thread or task itself, with no other
thread in between, which is what makes a handoff take one round trip after the
release. A release pushes only when an attempt failed recently (a marker key
with a short TTL), so an uncontended release costs nothing for wake-ups.

The price is a connection per blocked waiter. Past `MAX_BLOCKING` of them in one
process, or when the pool is bounded (a blocked connection must not starve the
other calls), waiters listen to a pub/sub feed instead: one connection per
process for every waiter, subscribed (and confirmed by the server) before the
attempt, so a release after that attempt cannot go unheard. A release also
publishes, naming the queue's head when there is one.

Semaphores work the same way under keys of their own (`SemaphoreKeys`): a
sorted set of slots scored by expiry, one script per primitive, and slot
releases that push to the semaphore's lists: one token per free slot the
queue leaves to waiters outside it, and a push to each queued waiter that may
take a free slot now.

Cache entries are plain strings under keys of their own, each written with a PX
expiry (the server forgets it by its own clock), and a namespace's generation is
a counter beside them. A read is one MGET of the entries and the generation; a
read that may claim the recompute lock is one script, which reads, decides from
the entry's fixed-width header whether it is due and, if so, runs the lock's
own acquisition script (see `redis_scripts.CACHE_READ`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import urlunsplit

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from corral._async._compat import Event, Lock, Worker, sleep, spawn
from corral._async.backends.base import AsyncBackend, AsyncSubscribingWaiter, Feed
from corral.backends import redis_scripts as scripts
from corral.backends.registry import check_userinfo, redact
from corral.core import forks, lockflow
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.forks import ProcessLock
from corral.core.options import Option, merge_options
from corral.core.primitives import (
    Attempt,
    CacheRead,
    Claim,
    ClientBusy,
    LockInfo,
    Outcome,
    SemaphoreInfo,
)
from corral.core.validate import check_timeout
from corral.errors import BackendError, BackendUnavailable, ConfigError

try:
    import hiredis

    pack_command: Callable[[tuple[Any, ...]], bytes] | None = hiredis.pack_command
except ImportError:  # pragma: no cover - hiredis comes with corral[redis]
    pack_command = None

__all__ = ["AsyncRedisBackend"]

log = logging.getLogger("corral.redis")

DEFAULT_TIMEOUT = 5.0
# How long the listener blocks on one read before it looks at its flags again.
LISTEN_POLL = 1.0
# A release message naming the fair queue's head starts with this.
HEAD = scripts.HEAD_PREFIX
# WAIT may use at most this share of the socket timeout, so its reply still arrives in time.
WAIT_SHARE = 0.8

_SSL_OPTIONS = frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"})
_CERT_REQS = ("required", "optional", "none")

_OUTCOMES = {1: Outcome.OK, 0: Outcome.EXPIRED, -1: Outcome.LOST}


def _ms(seconds: float) -> int:
    """Seconds to whole milliseconds, rounded up: Redis takes integers and 0 means "none"."""
    return max(1, math.ceil(round(seconds * 1000, 6)))


def _lua_number(seconds: float) -> str:
    """A time for a script to compare with: Lua's tonumber reads repr() back to the same
    double, but not "inf" or "nan", which become numbers that compare the same way."""
    if math.isnan(seconds):
        return "-1e308"  # `x <= nan` is false in Python: nothing is due by time
    return repr(min(max(seconds, -1e308), 1e308))


# Connections the hot path keeps out of the pool between calls (see `_borrow`).
MAX_SPARES = 8
# A pool "without a limit" (redis-py wants a number).
UNBOUNDED = 2**31
# Lock names whose keys a backend remembers (a bounded cache: names may be unbounded).
KNOWN_KEYS = 4096
# Shorter waits are slept, not spent blocked on a pop (see AsyncRedisWaiter.wait).
BLOCK_AT_LEAST = 0.2
# How late Redis may end a blocked pop: its timers run on a clock tick, 10 a second.
TICK = 0.1
# Keys SCAN looks at per round trip when counting cache entries.
SCAN_BATCH = 1000
# Waiters of one process that may each block a connection of their own (BLPOP); more
# wait on the pub/sub feed, which serves any number over one connection.
MAX_BLOCKING = 64


async def _has_data(connection: Any) -> bool:
    """Whether an idle connection has something to read: the server closed it, or worse."""
    try:
        return bool(await connection.can_read())
    except (RedisError, OSError):
        return True


def _check_max_connections(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"max_connections must be an integer >= 1 or None, got {value!r}")
    return value


@dataclass(slots=True)
class _Channel:
    subscribed_at: int
    """Number of the SUBSCRIBE that made it active: its reply confirms the subscription."""
    events: dict[Event, str | None] = field(default_factory=dict)
    """Each waiter's event, with the owner it waits as (fair locks) or None."""


class AsyncReleaseFeed:
    """One pub/sub connection (and one listener) per backend and process, shared by every waiter.

    Subscriptions are counted per channel: the first waiter of a lock name
    subscribes, the last one out unsubscribes. Confirmation is tracked by
    order: (un)subscribe commands are sent one channel at a time under one
    lock, so the server answers them in the order they were numbered, and a
    waiter is confirmed once the listener has read as many replies as the
    number of its channel's SUBSCRIBE. A feed that fails is never repaired
    (messages may have been missed): it wakes every waiter and the backend
    starts a new one on next use.
    """

    def __init__(self, pool: ConnectionPool, keepalive: str) -> None:
        self.pid = os.getpid()
        self._pubsub = PubSub(pool)
        # Subscribed first and never left: with no subscription, redis-py's blocking
        # flavour waits on an internal event instead of reading the socket, and then
        # closing the connection could not end the listener's wait at once.
        self._keepalive = keepalive
        # Orders the (un)subscribe commands on the wire, matching their numbers.
        self._send_lock = Lock()
        # Guards the tables; a thread lock in both flavours, never held across I/O.
        self._mutex = ProcessLock()
        self._channels: dict[str, _Channel] = {}
        self._sent = 0
        self._answered = 0
        self._pending: list[tuple[int, Event]] = []
        self._worker: Worker | None = None
        self._shut = False
        self.failure: BaseException | None = None
        self.closed = False

    @property
    def usable(self) -> bool:
        return self.failure is None and not self.closed and self.pid == os.getpid()

    async def join(self, channel: str, event: Event, owner: str | None, timeout: float) -> None:
        """Have `event` set on messages on `channel`; return once the server confirmed it.

        A message naming the head of the lock's queue wakes only that waiter: the
        rest could not take the lock anyway, and eight processes stampeding the
        server for one grant slow the handoff.
        """
        confirmed = Event()
        async with self._send_lock:
            with self._mutex:
                self._raise_if_unusable()
                sends = []
                if self._worker is None:
                    sends.append(self._keepalive)
                entry = self._channels.get(channel)
                if entry is None:
                    sends.append(channel)
                    entry = self._channels[channel] = _Channel(self._sent + len(sends))
                self._sent += len(sends)
                entry.events[event] = owner
                if self._answered >= entry.subscribed_at:
                    confirmed.set()
                else:
                    self._pending.append((entry.subscribed_at, confirmed))
            try:
                for name in sends:
                    await self._pubsub.subscribe(name)
                if self._worker is None:
                    self._worker = spawn(self._listen, name="corral-redis-releases")
            except BaseException as exc:
                self._fail(exc)
                await self._shutdown()
                raise
        try:
            if not await confirmed.wait(timeout):
                self._fail(RedisTimeoutError(f"no SUBSCRIBE confirmation within {timeout} s"))
            with self._mutex:
                self._raise_if_unusable()
        except BaseException:
            await self.leave(channel, event)
            raise

    def retarget(self, channel: str, event: Event, owner: str | None) -> None:
        """The waiter behind `event` now waits as `owner` (it joined the lock's queue)."""
        with self._mutex:
            entry = self._channels.get(channel)
            if entry is not None and event in entry.events:
                entry.events[event] = owner

    async def leave(self, channel: str, event: Event) -> None:
        """Undo one `join`; the last waiter of a channel unsubscribes."""
        async with self._send_lock:
            with self._mutex:
                entry = self._channels.get(channel)
                if entry is None:
                    return
                entry.events.pop(event, None)
                if entry.events or not self.usable:
                    return
                del self._channels[channel]
                self._sent += 1
            try:
                # untyped in redis-py's blocking flavour only
                await self._pubsub.unsubscribe(channel)  # type: ignore[no-untyped-call,unused-ignore]
            except Exception as exc:
                # Nothing to report to the waiter that is leaving; the next one starts afresh.
                self._fail(exc)

    async def aclose(self) -> None:
        with self._mutex:
            self.closed = True
        self._wake_all()
        await self._shutdown()
        worker = self._worker
        if worker is not None:
            await worker.join()

    def _raise_if_unusable(self) -> None:
        if self.closed:
            raise RedisConnectionError("the backend is closed")
        if self.failure is not None:
            raise RedisConnectionError(f"the pub/sub connection failed ({self.failure})")

    async def _listen(self) -> None:
        try:
            while self.usable:
                message = await self._pubsub.get_message(timeout=LISTEN_POLL)
                if message is not None:
                    self._dispatch(message)
        except Exception as exc:
            self._fail(exc)
        finally:
            self._fail(RedisConnectionError("the pub/sub listener stopped"))
            await self._shutdown()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        ready: list[Event] = []
        with self._mutex:
            if kind in ("subscribe", "unsubscribe"):
                self._answered += 1
                waiting: list[tuple[int, Event]] = []
                for number, confirmed in self._pending:
                    if number <= self._answered:
                        ready.append(confirmed)
                    else:
                        waiting.append((number, confirmed))
                self._pending = waiting
            elif kind == "message":
                entry = self._channels.get(message["channel"])
                if entry is not None:
                    data = message.get("data")
                    head = (
                        data[len(HEAD) :]
                        if isinstance(data, str) and data.startswith(HEAD)
                        else None
                    )
                    # A release naming the queue's head wakes only that waiter: nobody
                    # else may take the lock before it, so waking them is a herd of
                    # attempts bound to fail. They still re-check on their own timers.
                    ready.extend(
                        event
                        for event, owner in entry.events.items()
                        if head is None or owner == head
                    )
        for event in ready:
            event.set()

    def _fail(self, exc: BaseException) -> None:
        with self._mutex:
            if self.failure is None and not self.closed:
                self.failure = exc
        self._wake_all()

    def _wake_all(self) -> None:
        """Wake every waiter and every pending confirmation: they re-check, nothing hangs."""
        with self._mutex:
            events = [confirmed for _, confirmed in self._pending]
            self._pending = []
            for entry in self._channels.values():
                events.extend(entry.events)
        for event in events:
            event.set()

    async def _shutdown(self) -> None:
        """Close the pub/sub connection once; this also ends a read the listener is blocked in."""
        with self._mutex:
            if self._shut or self.pid != os.getpid():
                return
            self._shut = True
        with contextlib.suppress(Exception):  # it may have failed already: best effort
            await self._pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]


class AsyncRedisWaiter(AsyncSubscribingWaiter):
    """Waits for a release of one lock name, by a blocking list pop or through the feed.

    Usually the waiter blocks (`BLPOP`) on a connection of its own, on a list a
    release pushes to: the lock's shared list, which holds one token per release
    and hands it to the waiter that blocked first, or, once the waiter is in the
    lock's queue, its own list, pushed only when it is the queue's head. A list
    keeps its token until someone takes it, so a release between the failed
    attempt and the wait still wakes the waiter, with no subscription to confirm
    first, and the wake-up reaches the waiting thread or task directly. Only
    when this process already blocks `MAX_BLOCKING` connections that way, or the
    pool is bounded (a blocked connection must not starve other calls), does a
    waiter listen to the pub/sub feed instead.
    """

    def __init__(
        self,
        backend: AsyncRedisBackend,
        name: str,
        *,
        semaphore: bool = False,
        every_release: bool = False,
    ) -> None:
        super().__init__(backend.semaphore_bus if semaphore else backend.local_bus, name)
        self._backend = backend
        # A semaphore's waiters wait on lists and a channel of its own, which its slot
        # releases feed exactly as a lock's release feeds the lock's.
        self._keys: scripts.LockKeys | scripts.SemaphoreKeys = (
            backend._semaphore_keys(name) if semaphore else backend._keys(name)
        )
        self._kind = "semaphore" if semaphore else "lock"
        self._channel = self._keys.channel
        self._blocking = False
        # A list hands each release's token to one waiter; the feed tells every listener.
        self._every_release = every_release

    async def __aenter__(self) -> AsyncRedisWaiter:
        if not self._every_release and self._backend._take_blocking_slot():
            self._blocking = True
            # The failed attempt set the marker, so any release since pushed a token
            # that the first pop will take: no need to attempt again before waiting.
            self.attempt_on_entering = False
            return self
        await super().__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._blocking:
            self._blocking = False
            self._backend._give_blocking_slot()
            return
        await super().__aexit__(exc_type, exc, tb)

    async def wait(self, timeout: float) -> bool:
        if not self._blocking:
            return await super().wait(timeout)
        if timeout >= BLOCK_AT_LEAST:
            key = self._keys.signal if self.owner is None else self._keys.wake(self.owner)
            # Redis ends a blocked pop's timeout on its clock tick (10 a second), up to
            # 0.1 s late: block for the wait less that, the rest is slept here.
            popped = await self._backend._block_on(key, timeout - TICK)
            if popped is not None:
                return popped
        # A short wait (the holder's TTL about to end, the caller's wait about to run
        # out) is slept exactly; so is one whose pop the server could not take.
        await sleep(timeout)
        return False

    async def _join(self) -> Feed:
        return await self._backend._subscribe(
            self._name, self._channel, self._event, self.owner, self._kind
        )

    async def _leave(self, feed: Feed) -> None:
        assert isinstance(feed, AsyncReleaseFeed)
        await feed.leave(self._channel, self._event)

    def _owner_changed(self) -> None:
        feed = self._feed
        if isinstance(feed, AsyncReleaseFeed):
            feed.retarget(self._channel, self._event, self.owner)


class AsyncRedisBackend(AsyncBackend):
    capabilities: ClassVar[Capabilities] = Capabilities(
        scheme="redis",
        notifies=True,
        cross_process=True,
        cross_host=True,
        linearizable=False,
        fair=True,
        replicas=True,
        ttl_clock="the Redis server's clock",
        on_client_crash=(
            "the lock stays held until its TTL runs out on the server, then anyone may take it"
        ),
        on_server_restart=(
            "without persistence (RDB/AOF) a restart forgets every lock, so a holder can "
            "overlap with a new one; fencing tokens still increase, as they never fall "
            "below the server's time in microseconds"
        ),
        on_partition=(
            "replication is asynchronous, so a failover can promote a replica that never saw "
            "an acquisition and grant the lock twice; replicas=N narrows that window but is "
            "not consensus"
        ),
        on_memory_pressure=(
            "any maxmemory-policy but noeviction can evict a held lock or semaphore slot "
            "(their keys carry a TTL, so volatile-* policies pick them too, volatile-ttl "
            "first); use noeviction, where a full Redis refuses new locks instead"
        ),
        fencing_tokens=(
            "the Redis server's clock in microseconds (`TIME`), or the name's last token + 1 "
            "while that is kept (for the lock's TTL), whichever is larger; they keep "
            "increasing across restarts and failovers, unless the server's wall clock is set "
            "back by more than the time since the name was last acquired"
        ),
        state_per_name=(
            "nothing: the lock key goes at release (or when its TTL or hold_for ends), the "
            "last token is kept only for the lock's TTL, and a queue's keys expire with their "
            "last place; a semaphore's keys expire with its last slot or queue place"
        ),
        semaphores=(
            "a sorted set of slot owners scored by their expiry on the server's clock, "
            "with each slot's token and the limit in a hash, changed by one Lua script each"
        ),
        cache=(
            "strings kept with a PX expiry by the Redis server's clock; one Lua script "
            "reads an entry and claims its recompute lock"
        ),
    )
    claims_with_read: ClassVar[bool] = True

    def __init__(
        self,
        *,
        pool: ConnectionPool,
        pubsub_pool: ConnectionPool,
        server: str,
        prefix: str = scripts.DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__()
        self.prefix = scripts.check_prefix(prefix)
        self._server = server
        self._timeout = timeout
        self._pool = pool
        self._pubsub_pool = pubsub_pool
        self._client = Redis(connection_pool=pool)
        self._acquire = self._client.register_script(scripts.ACQUIRE)
        self._release = self._client.register_script(scripts.RELEASE)
        self._extend = self._client.register_script(scripts.EXTEND)
        self._inspect = self._client.register_script(scripts.INSPECT)
        self._force_release = self._client.register_script(scripts.FORCE_RELEASE)
        self._leave_queue = self._client.register_script(scripts.LEAVE_QUEUE)
        self._sem_acquire = self._client.register_script(scripts.SEM_ACQUIRE)
        self._sem_release = self._client.register_script(scripts.SEM_RELEASE)
        self._sem_extend = self._client.register_script(scripts.SEM_EXTEND)
        self._sem_inspect = self._client.register_script(scripts.SEM_INSPECT)
        self._sem_force_release = self._client.register_script(scripts.SEM_FORCE_RELEASE)
        self._sem_leave_queue = self._client.register_script(scripts.SEM_LEAVE_QUEUE)
        self._cache_read = self._client.register_script(scripts.CACHE_READ)
        self._cache_invalidate = self._client.register_script(scripts.CACHE_INVALIDATE)
        self._cache_raise = self._client.register_script(scripts.CACHE_RAISE_GENERATION)
        self._feed_mutex = ProcessLock()
        self._feed: AsyncReleaseFeed | None = None
        self._spares: list[Any] | None = (
            [] if getattr(pool, "max_connections", None) == UNBOUNDED else None
        )
        self._spares_pid = forks.pid()
        self._closed = False
        self._known_keys: dict[str, scripts.LockKeys] = {}
        self._known_semaphore_keys: dict[str, scripts.SemaphoreKeys] = {}
        # Waiters of this process now blocked on a connection of their own (BLPOP).
        self._blocking = 0
        self._blocking_pid = forks.pid()
        self._blocking_refused = False

    url_options: ClassVar[tuple[Option, ...]] = (
        Option(
            "prefix", f"`{scripts.DEFAULT_PREFIX}`", "first part of every key corral writes", "app"
        ),
        Option(
            "timeout", f"{DEFAULT_TIMEOUT:g}", "seconds for connecting and for each reply", "2.5"
        ),
        Option(
            "max_connections",
            "unbounded",
            "connections in the pool; beyond it, callers wait for one (up to `timeout`)",
            "8",
        ),
        Option("username", "from the URL", "ACL user (or put `user:password@` in the URL)"),
        Option("password", "from the URL", "AUTH password (never shown in messages or logs)"),
        Option("ssl_ca_certs", "system CAs", "`rediss://` only: CA file to verify the server"),
        Option("ssl_certfile", "none", "`rediss://` only: client certificate file"),
        Option("ssl_keyfile", "none", "`rediss://` only: client key file"),
        Option(
            "ssl_cert_reqs",
            "`required`",
            "`rediss://` only: `required`, `optional` or `none` (no verification)",
        ),
    )

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> AsyncRedisBackend:
        """Open a backend on `url`; the clock is unused, as the server's clock decides expiry.

        corral's options come out of the query before redis-py sees the URL, so
        redis-py never gets (nor crashes on) an option it does not know.
        """
        shown = redact(url)
        check_userinfo(url, shown)
        base, _, query = url.partition("?")
        given, _ = merge_options(shown, query, options, cls.url_options, backend="redis")
        scheme = base.partition("://")[0].lower()
        ssl = {key: given[key] for key in _SSL_OPTIONS & set(given)}
        if ssl and scheme != "rediss":
            raise ConfigError(f"{shown}: {', '.join(sorted(ssl))} need(s) a rediss:// URL (TLS)")
        if "ssl_cert_reqs" in ssl and ssl["ssl_cert_reqs"] not in _CERT_REQS:
            raise ConfigError(
                f"{shown}: ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, "
                f"got {ssl['ssl_cert_reqs']!r}"
            )
        prefix = scripts.check_prefix(given.get("prefix", scripts.DEFAULT_PREFIX))
        timeout = check_timeout(given.get("timeout", DEFAULT_TIMEOUT), shown)
        max_connections = _check_max_connections(given.get("max_connections"))
        credentials: dict[str, Any] = {
            key: str(given[key]) for key in ("username", "password") if key in given
        }
        common: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "decode_responses": True,
            **ssl,
            **credentials,
        }
        url = base
        try:
            if max_connections is None:
                # No retries: a call fails within `timeout` instead of several times it,
                # and the lock logic decides what a failure means. Unbounded, as documented
                # (redis-py's own default would refuse the 101st concurrent call).
                pool = ConnectionPool.from_url(
                    url, retry=Retry(NoBackoff(), 0), max_connections=UNBOUNDED, **common
                )
            else:
                # Callers beyond the limit wait for a connection, up to the timeout.
                pool = BlockingConnectionPool.from_url(
                    url,
                    retry=Retry(NoBackoff(), 0),
                    max_connections=max_connections,
                    timeout=timeout,
                    **common,
                )
            # The feed must notice every failure itself (a silent reconnect would
            # hide missed messages), so redis-py may not retry or reconnect it.
            pubsub_pool = ConnectionPool.from_url(
                url,
                retry=Retry(NoBackoff(), 0, supported_errors=()),
                max_connections=UNBOUNDED,
                **common,
            )
        except (ValueError, TypeError) as exc:
            # redis-py's message may quote the URL: show neither it nor its chain.
            raise ConfigError(
                f"{shown}: not a valid Redis URL ({redact(str(exc))}); expected "
                "redis://[user:password@]host:port/db"
            ) from None
        params = pool.connection_kwargs
        host = str(params.get("host", "localhost"))
        netloc = f"[{host}]" if ":" in host else host
        netloc = f"{netloc}:{params.get('port', 6379)}"
        user = params.get("username")
        if user:
            netloc = f"{user}@{netloc}"
        server = urlunsplit((scheme, netloc, f"/{params.get('db', 0)}", "", ""))
        return cls(
            pool=pool, pubsub_pool=pubsub_pool, server=server, prefix=prefix, timeout=timeout
        )

    @property
    def server(self) -> str:
        return self._server

    # -- errors -----------------------------------------------------------------

    def _error(
        self,
        exc: BaseException,
        name: str,
        action: str,
        kind: str = "lock",
        where: str | None = None,
    ) -> BackendError:
        """The corral error for a redis-py failure: names the lock and server, says what to do.

        `where` replaces the opening "<kind> <name> on <server>: could not <action> it".
        """
        if where is None:
            where = f"{kind} {name!r} on {self._server}: could not {action} it"
        if isinstance(exc, AuthenticationError):
            return BackendUnavailable(
                f"{where}: Redis refused the credentials ({exc}); check the user and "
                "password in the URL"
            )
        if isinstance(exc, RedisConnectionError) and str(exc) == "No connection available.":
            # redis-py's BlockingConnectionPool: this process's connections stayed lent out.
            return ClientBusy(
                f"{where}: all {getattr(self._pool, 'max_connections', '')} connections stayed "
                f"busy for {self._timeout:g} s; raise max_connections= or timeout="
            )
        if isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError)):
            return BackendUnavailable(
                f"{where}: the server is unreachable or did not answer within "
                f"{self._timeout:g} s ({exc}); check that Redis is running and reachable "
                "from here, or raise timeout="
            )
        if isinstance(exc, ReadOnlyError):
            return BackendError(
                f"{where}: the server is a read-only replica ({exc}); point the URL at the master"
            )
        return BackendError(
            f"{where}: Redis answered with an error ({exc}); check the server's logs, "
            "its ACL permissions (EVALSHA, BLPOP, PUBLISH, SUBSCRIBE; for caches also MGET, "
            "SET, DEL, INCR, SCAN) and maxmemory settings"
        )

    # -- primitives ---------------------------------------------------------------

    async def _run(
        self,
        script: AsyncScript,
        name: str,
        action: str,
        keys: list[str],
        args: list[str],
        kind: str = "lock",
        *,
        raw: bool = False,
        where: str | None = None,
    ) -> Any:
        """EVALSHA on a pooled connection, straight from the connection.

        redis-py's client path adds retries (disabled here anyway), events and
        metrics around every command; on the lock's hot path that costs more
        than the server's work. The script text is sent once if the server has
        lost its script cache (restart, SCRIPT FLUSH). `raw` leaves the answer's
        strings as bytes (cache entries are not text).
        """
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        answers = await self._send(
            (command,), name, action, kind, raw=raw, where=where, script=script
        )
        return answers[0]

    async def _send(
        self,
        commands: Sequence[tuple[Any, ...]],
        name: str,
        action: str,
        kind: str = "lock",
        *,
        raw: bool = False,
        where: str | None = None,
        script: AsyncScript | None = None,
    ) -> list[Any]:
        """Send `commands` in one write and read their answers: one round trip.

        Every answer is read before an error answer is raised, so the connection
        stays in step and goes back to the pool. With `script`, the first command
        is its EVALSHA, sent again as EVAL if the server does not know the script.
        """
        # redis-py types these connection-level calls unevenly across its two flavours.
        pool: Any = self._pool
        self._raise_if_closed(name, action, kind)
        try:
            connection: Any = await self._borrow()
        except (RedisError, OSError) as exc:
            raise self._error(exc, name, action, kind, where) from exc
        sound = False
        try:
            if pack_command is None:
                packed = connection.pack_commands(commands)
            else:  # hiredis packs in C what redis-py would walk through in Python
                packed = [pack_command(command) for command in commands]
            await connection.send_packed_command(packed, False)
            answers: list[Any] = []
            for _ in commands:
                try:
                    answers.append(await connection.read_response(disable_decoding=raw))
                except ResponseError as exc:  # the server's error reply: read on
                    answers.append(exc)
            sound = True
            if script is not None and isinstance(answers[0], NoScriptError):
                sound = False
                await connection.send_command("EVAL", script.script, *commands[0][2:])
                answers[0] = await connection.read_response(disable_decoding=raw)
                sound = True
            for answer in answers:
                if isinstance(answer, ResponseError):
                    raise answer
            return answers
        except ResponseError as exc:  # the server's error reply: the connection is fine
            sound = True
            raise self._error(exc, name, action, kind, where) from exc
        except (RedisError, OSError) as exc:
            await connection.disconnect()
            raise self._error(exc, name, action, kind, where) from exc
        except BaseException:
            # Cancelled between the command and its answer: the connection would hand
            # the stale answer to the next caller, so it is dropped, not reused.
            await connection.disconnect()
            raise
        finally:
            if sound and self._spares is not None and len(self._spares) < MAX_SPARES:
                self._spares.append(connection)
            else:
                await pool.release(connection)

    async def _borrow(self) -> Any:
        """A connection for one command: a kept one when it is still sound, else the pool's.

        Taking a connection from redis-py's pool and giving it back costs about as
        much as the lock's own work on the server (its events and metrics), so the
        hot path keeps a few connections out of the pool between calls, in a list
        whose `pop` and `append` are atomic. A kept connection with anything to
        read (the server closed it, say after a restart) is handed back to the pool,
        which reconnects it. Only an unbounded pool keeps spares: a bounded one must
        see every connection come back.
        """
        spares = self._spares
        if spares is not None:
            if self._spares_pid != forks.pid():  # a forked child: the parent's sockets
                spares.clear()
                self._spares_pid = forks.pid()
            try:
                connection = spares.pop()
            except IndexError:
                pass
            else:
                if not await _has_data(connection):
                    return connection
                await connection.disconnect()
                await self._pool.release(connection)
        pool: Any = self._pool
        return await pool.get_connection()

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
        keys = self._keys(name)
        script_keys = [keys.lock, keys.fence, keys.queue, keys.queue_expiry, keys.waiting]
        args = [
            owner,
            str(_ms(ttl)),
            "" if queue_ttl is None else str(_ms(queue_ttl)),
            keys.wake(owner),
            # Read at each call: the longest pause between a waiter's attempts.
            str(_ms(lockflow.NOTIFIED_RECHECK * scripts.WAITING_PAUSES)),
        ]
        acked: int | None = None
        if replicas:
            result, acked = await self._acquire_and_wait(
                name, script_keys, args, replicas, replica_timeout
            )
        else:
            result = await self._run(self._acquire, name, "acquire", script_keys, args)
        granted, number = int(result[0]), int(result[1])
        if granted:
            return Attempt(True, token=number, replicas_acked=acked)
        return Attempt(False, holder_ttl=number / 1000 if number >= 0 else None)

    async def _acquire_and_wait(
        self, name: str, keys: list[str], args: list[str], replicas: int, replica_timeout: float
    ) -> tuple[Any, int]:
        """The script and WAIT in one pipeline: WAIT counts only its own connection's writes."""
        wait_ms = min(_ms(replica_timeout), _ms(self._timeout * WAIT_SHARE))
        try:
            result, acked = await self._pipelined_acquire(keys, args, replicas, wait_ms, True)
            if isinstance(result, NoScriptError):
                # The server lost its script cache (restart, SCRIPT FLUSH): send the text once.
                result, acked = await self._pipelined_acquire(keys, args, replicas, wait_ms, False)
            for answer in (result, acked):
                if isinstance(answer, Exception):
                    raise answer
        except (RedisError, OSError) as exc:
            raise self._error(exc, name, "acquire") from exc
        return result, int(acked)

    async def _pipelined_acquire(
        self, keys: list[str], args: list[str], replicas: int, wait_ms: int, by_sha: bool
    ) -> list[Any]:
        # redis-py's Script in a pipeline would first send SCRIPT EXISTS: a second round trip.
        async with self._client.pipeline(transaction=False) as pipe:
            if by_sha:
                pipe.evalsha(self._acquire.sha, len(keys), *keys, *args)
            else:
                pipe.eval(scripts.ACQUIRE, len(keys), *keys, *args)
            pipe.wait(replicas, wait_ms)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        keys = self._keys(name)
        hold = str(_ms(hold_for)) if hold_for > 0 else "0"
        result = await self._run(
            self._release,
            name,
            "release",
            [keys.lock, keys.queue, keys.queue_expiry, keys.signal, keys.waiting],
            [owner, hold, keys.channel, keys.wake_prefix],
        )
        outcome = _OUTCOMES[int(result)]
        if outcome is Outcome.OK and hold_for <= 0:
            self.local_bus.notify(name)
        return outcome

    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        keys = self._keys(name)
        result = await self._run(self._extend, name, "extend", [keys.lock], [owner, str(_ms(ttl))])
        return _OUTCOMES[int(result)]

    async def inspect(self, name: str) -> LockInfo | None:
        keys = self._keys(name)
        result = await self._run(self._inspect, name, "inspect", [keys.lock], [])
        if result is None:
            return None
        value, pttl = str(result[0]), int(result[1])
        token, _, owner = value.partition(":")
        if not token.isdigit():
            raise BackendError(
                f"lock {name!r} on {self._server}: {keys.lock} holds {value!r}, which corral "
                "did not write; another program uses the same key prefix (choose another prefix=)"
            )
        ttl = pttl / 1000 if pttl >= 0 else math.inf
        return LockInfo(name, owner or None, int(token), ttl)

    async def force_release(self, name: str) -> bool:
        keys = self._keys(name)
        result = await self._run(
            self._force_release,
            name,
            "force-release",
            [keys.lock, keys.queue, keys.queue_expiry, keys.signal, keys.waiting],
            [keys.channel, keys.wake_prefix],
        )
        if int(result):
            self.local_bus.notify(name)
        return bool(int(result))

    async def leave_queue(self, name: str, owner: str) -> None:
        keys = self._keys(name)
        result = await self._run(
            self._leave_queue,
            name,
            "leave the queue of",
            [keys.queue, keys.queue_expiry, keys.signal, keys.waiting, keys.lock],
            [owner, keys.channel, keys.wake_prefix],
        )
        if int(result):
            self.local_bus.notify(name)

    # -- semaphores -----------------------------------------------------------------

    async def sem_try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        limit: int,
        *,
        queue_ttl: float | None = None,
    ) -> Attempt:
        keys = self._semaphore_keys(name)
        result = await self._run(
            self._sem_acquire,
            name,
            "acquire",
            [
                keys.slots,
                keys.owners,
                keys.fence,
                keys.queue,
                keys.queue_expiry,
                keys.waiting,
                keys.signal,
            ],
            [
                owner,
                str(_ms(ttl)),
                str(limit),
                "" if queue_ttl is None else str(_ms(queue_ttl)),
                keys.wake(owner),
                str(_ms(lockflow.NOTIFIED_RECHECK * scripts.WAITING_PAUSES)),
            ],
            "semaphore",
        )
        granted, number = int(result[0]), int(result[1])
        if granted:
            return Attempt(True, token=number)
        if number == -3:
            return Attempt(False, limit=int(result[2]))
        return Attempt(False, holder_ttl=number / 1000 if number >= 0 else None)

    async def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        keys = self._semaphore_keys(name)
        result = await self._run(
            self._sem_release,
            name,
            "release",
            self._semaphore_wake_keys(keys),
            [owner, str(_ms(hold_for)) if hold_for > 0 else "0", keys.channel, keys.wake_prefix],
            "semaphore",
        )
        outcome = _OUTCOMES[int(result)]
        if outcome is Outcome.OK and hold_for <= 0:
            self.semaphore_bus.notify(name)
        return outcome

    async def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        keys = self._semaphore_keys(name)
        result = await self._run(
            self._sem_extend,
            name,
            "extend",
            [keys.slots, keys.owners, keys.fence],
            [owner, str(_ms(ttl))],
            "semaphore",
        )
        return _OUTCOMES[int(result)]

    async def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        keys = self._semaphore_keys(name)
        result = await self._run(
            self._sem_inspect, name, "inspect", [keys.slots, keys.owners], [], "semaphore"
        )
        if result is None:
            return None
        limit, rest = str(result[0]), [str(item) for item in result[1:]]
        holders = []
        for member, left, token in zip(rest[0::3], rest[1::3], rest[2::3], strict=True):
            if not token.isdigit() or not (limit.isdigit() or not limit):
                raise BackendError(
                    f"semaphore {name!r} on {self._server}: {keys.owners} holds a token "
                    f"{token!r} or limit {limit!r} that corral did not write; another program "
                    "uses the same key prefix (choose another prefix=)"
                )
            owner = None if member.startswith(scripts.HELD) else member
            holders.append(LockInfo(name, owner, int(token), int(left) / 1000))
        holders.sort(key=lambda holder: holder.token)
        # A limit lost while slots live (evicted under memory pressure): as many as there are.
        return SemaphoreInfo(name, int(limit) if limit else len(holders), tuple(holders))

    async def sem_force_release(self, name: str) -> int:
        keys = self._semaphore_keys(name)
        result = await self._run(
            self._sem_force_release,
            name,
            "force-release",
            self._semaphore_wake_keys(keys),
            [keys.channel, keys.wake_prefix],
            "semaphore",
        )
        if int(result):
            self.semaphore_bus.notify(name)
        return int(result)

    async def sem_leave_queue(self, name: str, owner: str) -> None:
        keys = self._semaphore_keys(name)
        result = await self._run(
            self._sem_leave_queue,
            name,
            "leave the queue of",
            self._semaphore_wake_keys(keys),
            [owner, keys.channel, keys.wake_prefix],
            "semaphore",
        )
        if int(result):
            self.semaphore_bus.notify(name)

    @staticmethod
    def _semaphore_wake_keys(keys: scripts.SemaphoreKeys) -> list[str]:
        """The keys of the scripts that may free slots, in their order (see redis_scripts)."""
        return [
            keys.slots,
            keys.owners,
            keys.fence,
            keys.queue,
            keys.queue_expiry,
            keys.signal,
            keys.waiting,
        ]

    def sem_waiter(self, name: str) -> AsyncRedisWaiter:
        return AsyncRedisWaiter(self, name, semaphore=True)

    # -- cache entries --------------------------------------------------------------

    def _cache_where(self, what: str, action: str) -> str:
        return f"{what} on {self._server}: could not {action}"

    def _entries_where(self, keys: Sequence[str], action: str) -> str:
        if len(keys) == 1:
            return self._cache_where(f"cache entry {keys[0]!r}", f"{action} it")
        shown = f"{keys[0]!r}, ..." if keys else "none"
        return self._cache_where(f"{len(keys)} cache entries ({shown})", f"{action} them")

    def _generation(self, stored: Any, gen_key: str) -> int:
        """A namespace's generation as stored (bytes or str, None when never bumped)."""
        if stored is None:
            return 0
        text = stored.decode("ascii", "replace") if isinstance(stored, bytes) else str(stored)
        if not text.isdigit():
            raise BackendError(
                f"cache namespace {gen_key!r} on {self._server}: its generation key holds "
                f"{text[:40]!r}, which corral did not write; another program uses the same "
                "key prefix (choose another prefix=)"
            )
        return int(text)

    def _cache_key(self, key: str) -> str:
        """The Redis key of cache entry `key` (Redis Cluster puts it in its lock's slot)."""
        return scripts.cache_key(self.prefix, key)

    async def cache_fetch(
        self, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int]:
        # One MGET: the entries and, last, the generation.
        command = (
            "MGET",
            *(self._cache_key(key) for key in keys),
            scripts.cache_gen_key(self.prefix, gen_key),
        )
        (found,) = await self._send(
            (command,),
            keys[0] if keys else gen_key,
            "read",
            "cache entry",
            raw=True,
            where=self._entries_where(keys, "read"),
        )
        return list(found[:-1]), self._generation(found[-1], gen_key)

    async def cache_read(self, key: str, gen_key: str, claim: Claim | None = None) -> CacheRead:
        keys = [self._cache_key(key), scripts.cache_gen_key(self.prefix, gen_key)]
        args = [""]
        if claim is not None:
            lock = self._keys(claim.lock)
            keys += [
                lock.lock,
                lock.fence,
                lock.queue,
                lock.queue_expiry,
                lock.waiting,
                lock.wake(claim.owner),
            ]
            args = [
                _lua_number(claim.due_before),
                claim.owner,
                str(_ms(claim.ttl)),
                "",
                str(_ms(lockflow.NOTIFIED_RECHECK * scripts.WAITING_PAUSES)),
            ]
        result = await self._run(
            self._cache_read,
            key,
            "read",
            keys,
            args,
            raw=True,
            where=self._cache_where(f"cache entry {key!r}", "read it"),
        )
        entry, generation = result[0], self._generation(result[1], gen_key)
        granted = int(result[2])
        return claimed_read(entry, generation, granted, result[3] if granted >= 0 else 0)

    async def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        if not items:
            return
        keys = [key for key, _, _ in items]
        await self._send(
            self._store_commands(items),
            keys[0],
            "store",
            "cache entry",
            where=self._entries_where(keys, "store"),
        )

    def _store_commands(self, items: Sequence[tuple[str, bytes, float]]) -> list[tuple[Any, ...]]:
        """SET with a PX expiry each (whole ms, rounded up), DEL for keep <= 0."""
        return [
            ("SET", self._cache_key(key), data, "PX", _ms(keep))
            if keep > 0
            else ("DEL", self._cache_key(key))
            for key, data, keep in items
        ]

    async def cache_delete(self, key: str) -> bool:
        (deleted,) = await self._send(
            (("DEL", self._cache_key(key)),), key, "delete", "cache entry"
        )
        return bool(deleted)

    async def cache_invalidate(self, key: str, keep: float) -> bool:
        result = await self._run(
            self._cache_invalidate,
            key,
            "invalidate",
            [self._cache_key(key)],
            [str(_ms(keep)) if keep > 0 else "0"],
            "cache entry",
        )
        return bool(int(result))

    async def cache_clear(self, gen_key: str) -> int:
        (generation,) = await self._send(
            (("INCR", scripts.cache_gen_key(self.prefix, gen_key)),),
            gen_key,
            "clear",
            "cache namespace",
        )
        return int(generation)

    async def cache_raise_generation(self, gen_key: str, at_least: int) -> int:
        result = await self._run(
            self._cache_raise,
            gen_key,
            "raise the generation of",
            [scripts.cache_gen_key(self.prefix, gen_key)],
            [str(at_least)],
            "cache namespace",
        )
        return self._generation(result, gen_key)

    async def cache_count(self, key_prefix: str) -> int | None:
        # SCAN walks the whole keyspace, a batch per round trip; it may return a key
        # twice (while the server rehashes), hence the set. Expired keys are not returned.
        pattern = scripts.cache_pattern(self.prefix, key_prefix)
        seen: set[bytes] = set()
        cursor: Any = b"0"
        while True:
            (answer,) = await self._send(
                (("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_BATCH),),
                key_prefix,
                "count the entries of",
                "cache key prefix",
                raw=True,
            )
            cursor, found = answer
            seen.update(found)
            if int(cursor) == 0:
                return len(seen)

    # -- wake-ups -------------------------------------------------------------------

    def waiter(self, name: str) -> AsyncRedisWaiter:
        return AsyncRedisWaiter(self, name)

    def watcher(self, name: str) -> AsyncRedisWaiter:
        return AsyncRedisWaiter(self, name, every_release=True)

    def _keys(self, name: str) -> scripts.LockKeys:
        """The keys of `name`, remembered: the hot path would build them twice per cycle."""
        keys = self._known_keys.get(name)
        if keys is None:
            if len(self._known_keys) >= KNOWN_KEYS:
                self._known_keys.clear()
            keys = self._known_keys[name] = scripts.lock_keys(self.prefix, name)
        return keys

    def _semaphore_keys(self, name: str) -> scripts.SemaphoreKeys:
        """The keys of semaphore `name`, remembered as `_keys` remembers a lock's."""
        keys = self._known_semaphore_keys.get(name)
        if keys is None:
            if len(self._known_semaphore_keys) >= KNOWN_KEYS:
                self._known_semaphore_keys.clear()
            keys = self._known_semaphore_keys[name] = scripts.semaphore_keys(self.prefix, name)
        return keys

    def _take_blocking_slot(self) -> bool:
        """May one more waiter of this process block a connection of its own?"""
        if self._spares is None:
            return False  # a bounded pool: see AsyncRedisWaiter
        with self._feed_mutex:
            if self._blocking_pid != forks.pid():
                self._blocking_pid, self._blocking = forks.pid(), 0
            if self._blocking >= MAX_BLOCKING or self._closed or self._blocking_refused:
                return False
            if self._timeout * WAIT_SHARE < BLOCK_AT_LEAST:
                return False  # a pop could never outlast the socket timeout: use the feed
            self._blocking += 1
            return True

    def _give_blocking_slot(self) -> None:
        with self._feed_mutex:
            if self._blocking_pid == forks.pid() and self._blocking > 0:
                self._blocking -= 1

    async def _block_on(self, key: str, timeout: float) -> bool | None:
        """BLPOP `key` for up to `timeout` seconds: True when a token came, False when not,
        None when no pop could be made (the caller then sleeps instead).

        None, never a quick True, on trouble: a waiter that re-attempted at once
        would spin against a server that refuses the pop but takes the attempt. A
        server that refuses BLPOP itself (an ACL without it, Redis before 6, a proxy)
        is remembered, and later waiters of this store use the pub/sub feed.
        """
        if self._closed:
            return True  # the next attempt says the store is closed
        seconds = min(timeout, self._timeout * WAIT_SHARE)
        pool: Any = self._pool
        try:
            connection: Any = await pool.get_connection()
        except (RedisError, OSError):
            return None
        try:
            await connection.send_command("BLPOP", key, f"{seconds:.3f}")
            reply = await connection.read_response()
        except ResponseError as exc:
            self._refuse_blocking(exc)
            return None
        except (RedisError, OSError):
            await connection.disconnect()
            return None
        except BaseException:
            # Cancelled while blocked: the reply may still come; never reuse the connection.
            await connection.disconnect()
            raise
        finally:
            await pool.release(connection)
        return reply is not None

    def _refuse_blocking(self, exc: ResponseError) -> None:
        with self._feed_mutex:
            first = not self._blocking_refused
            self._blocking_refused = True
        if first:
            log.warning(
                "%s refused BLPOP (%s): waiters fall back to the pub/sub feed, which wakes "
                "them later; allow BLPOP to corral's ACL user (Redis >= 6 needed)",
                self._server,
                exc,
            )

    def _current_feed(self) -> AsyncReleaseFeed:
        with self._feed_mutex:
            feed = self._feed
            # A forked child must not share its parent's connection or (vanished) listener.
            if feed is None or not feed.usable:
                feed = self._feed = AsyncReleaseFeed(
                    self._pubsub_pool, scripts.feed_channel(self.prefix)
                )
            return feed

    def _raise_if_closed(self, name: str, action: str, kind: str = "lock") -> None:
        if self._closed:
            raise BackendError(
                f"{kind} {name!r} on {self._server}: could not {action} it: the store is "
                "closed; open a new one"
            )

    async def _subscribe(
        self, name: str, channel: str, event: Event, owner: str | None, kind: str = "lock"
    ) -> AsyncReleaseFeed:
        # A closed store starts no new feed (a waiter woken by the close would otherwise
        # open a pub/sub connection and a listener that nobody ever closes).
        self._raise_if_closed(name, "wait for", kind)
        feed = self._current_feed()
        try:
            await feed.join(channel, event, owner, self._timeout)
        except (RedisError, OSError) as exc:
            raise self._error(exc, name, "wait for", kind) from exc
        return feed

    async def aclose(self) -> None:
        with self._feed_mutex:
            self._closed = True
            feed, self._feed = self._feed, None
        if feed is not None and feed.pid == os.getpid():
            await feed.aclose()
        await self._client.aclose()
        await self._pool.disconnect()
        await self._pubsub_pool.disconnect()


def claimed_read(entry: bytes | None, generation: int, granted: int, number: Any) -> CacheRead:
    """A cache read script's answer: `granted` < 0 when no claim was due, else the lock
    attempt's (1 with its token in `number`, 0 with the holder's ms left or -1)."""
    if granted < 0:
        return CacheRead(entry, generation)
    value = int(number)
    if granted:
        return CacheRead(entry, generation, Attempt(True, token=value))
    return CacheRead(
        entry, generation, Attempt(False, holder_ttl=value / 1000 if value >= 0 else None)
    )
