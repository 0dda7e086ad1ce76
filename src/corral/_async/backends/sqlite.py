"""`sqlite:///path.db`: locks shared by the processes of one machine through one file.

The embedded default: no server to run, yet every process on the machine that
opens the same file shares the locks. The SQL, the transactions, the clock and
the connection handling live in `corral.backends.sqlite_sql` (blocking, shared
by both flavours; its docstring says why each is as it is); this class runs
them off the event loop and wakes waiters.

**Wake-ups are pushed, by datagram.** SQLite cannot notify anyone, so each
process that has waiters on a store opens one Unix datagram socket
(`corral.backends.sqlite_wake`, which says how it never blocks a release and
never loses a wake-up unseen) and a listener on it: an asyncio task here, a
daemon thread in the blocking flavour. For each name it has waiters for, the
process registers the socket's address in the store's `waiters` table, and
that registration is committed before the waiter's next attempt: a release
committed after it reads the address in its own transaction and sends the
datagram after its COMMIT, so no release that the attempt did not see goes
unheard. A registration lasts `REGISTRATION_TTL` seconds and the listener
renews it while the name still has waiters here; one that lapsed anyway (the
process was stopped) is renewed and its waiters re-attempt, since a release
may have passed meanwhile. A process that dies leaves registrations that
expire, and its vanished socket refuses datagrams at once, which deletes
them sooner. For a fair lock the datagram names the queue's head, and only
that waiter re-attempts. Waiters still re-check once a second, as on every
backend that notifies.

Semaphore waiters use the same socket and listener, but register in a table
of their own and are keyed by their name's digest in a domain apart from lock
names, so a freed slot of semaphore "x" wakes the waiters of semaphore "x",
never those of lock "x" (nor the reverse). A freed slot names no head:
several waiters may fit now, so every waiter of that semaphore re-attempts.

Where no Unix datagram socket can be opened, waiters fall back to that
once-a-second re-check (and to the local bus, for releases made in this
process), with a warning in the log.

**fork.** A child never reads its parent's socket: its first waiter opens a
socket of its own, and the child's copy of the parent's is closed at the fork.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from corral._async._compat import Event, Worker, run_sync, spawn, wait_readable
from corral._async.backends.base import AsyncBackend, AsyncSubscribingWaiter, Feed
from corral.backends.sqlite_sql import (
    DEFAULT_TABLE_PREFIX,
    DEFAULT_TIMEOUT,
    URL_OPTIONS,
    MachineClock,
    SQLiteLocks,
    SQLiteOptions,
    parse_url,
)
from corral.backends.sqlite_wake import Doorbell, WakeUp, digest
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.options import Option
from corral.core.primitives import Attempt, CacheRead, Claim, LockInfo, Outcome, SemaphoreInfo
from corral.errors import BackendError, ConfigError

__all__ = ["AsyncSQLiteBackend"]

log = logging.getLogger("corral.sqlite")

# How long a process's registration for a name's wake-ups lasts unless renewed.
REGISTRATION_TTL = 30.0
# The listener renews a registration that has less than this left while waiters remain...
RENEW_BELOW = 20.0
# ...and a new waiter reuses one that has more than this left, without a write.
REUSE_ABOVE = 10.0
# How long the listener waits for a datagram before it looks at its flags again.
LISTEN_POLL = 1.0


@dataclass(slots=True)
class _Name:
    """One lock or semaphore name this process waits on: its waiters and its registration."""

    name: str
    semaphore: bool
    """A semaphore's name: registered in the semaphores' table, keyed by its own digest."""
    events: dict[Event, bytes | None] = field(default_factory=dict)
    """Each waiter's event, with the digest of the owner it waits as (fair locks) or None."""
    registered_until: float = 0.0
    """When this process's registration for the name expires (machine clock); 0: none."""


class AsyncWakeFeed:
    """One socket and one listener per backend and process, shared by every waiter.

    A feed whose listener fails is not repaired (datagrams may have been
    missed): it wakes every waiter, and the next wait starts a new feed.
    """

    def __init__(self, db: SQLiteLocks) -> None:
        self.pid = os.getpid()
        self._db = db
        # Guards the tables; a thread lock in both flavours, never held across I/O.
        self._mutex = threading.Lock()
        self._names: dict[bytes, _Name] = {}
        self._worker: Worker | None = None
        self._next_renewal = 0.0
        self.failure: BaseException | None = None
        self.closed = False
        self._bell = _open_doorbell()
        _FEEDS.add(self)

    @property
    def usable(self) -> bool:
        return self.failure is None and not self.closed and self.pid == os.getpid()

    async def join(
        self, name: str, key: bytes, event: Event, owner: str | None, *, semaphore: bool = False
    ) -> None:
        """Have `event` set on every wake-up for `name`; return once registered for it.

        `key` is the name's digest (in the semaphores' domain for a semaphore).
        """
        with self._mutex:
            self._raise_if_unusable(name)
            entry = self._names.get(key)
            if entry is None:
                entry = self._names[key] = _Name(name, semaphore)
            entry.events[event] = None if owner is None else digest(owner)
            bell = self._bell
            if bell is None:
                return  # polling: see the module docstring
            if self._worker is None:
                self._worker = spawn(self._listen, name="corral-sqlite-wake-ups")
            if entry.registered_until - self._db.clock.now() > REUSE_ABOVE:
                return  # registered, and committed, by an earlier waiter
        try:
            _, until = await run_sync(
                functools.partial(self._db.register, semaphore=semaphore),
                [name],
                bell.address,
                REGISTRATION_TTL,
            )
        except BaseException:
            self.leave(key, event)
            raise
        with self._mutex:
            entry.registered_until = max(entry.registered_until, until)

    def retarget(self, key: bytes, event: Event, owner: str | None) -> None:
        """The waiter behind `event` now waits as `owner` (it joined the lock's queue)."""
        with self._mutex:
            entry = self._names.get(key)
            if entry is not None and event in entry.events:
                entry.events[event] = None if owner is None else digest(owner)

    def leave(self, key: bytes, event: Event) -> None:
        """Undo one `join`; the registration is left to expire (a next waiter may reuse it)."""
        with self._mutex:
            entry = self._names.get(key)
            if entry is not None:
                entry.events.pop(event, None)

    async def _listen(self) -> None:
        bell = self._bell
        assert bell is not None
        try:
            while self.usable:
                if await wait_readable(bell.socket, LISTEN_POLL):
                    self._dispatch(*bell.drain())
                if self.usable:
                    await self._renew()
        except Exception as exc:
            self._fail(exc)
        finally:
            self._fail(OSError("the wake-up listener stopped"))
            if self.pid == os.getpid():
                bell.close()

    def _dispatch(self, datagrams: list[bytes], overflowed: bool) -> None:
        with self._mutex:
            if overflowed:
                # A wake-up may have been dropped before these: everyone re-attempts.
                ready = [event for entry in self._names.values() for event in entry.events]
            else:
                ready = []
                for datagram in datagrams:
                    wake_up = WakeUp.parse(datagram)
                    entry = None if wake_up is None else self._names.get(wake_up.name)
                    if wake_up is None or entry is None:
                        continue
                    head = wake_up.head
                    # Naming the queue's head wakes only it: nobody else may take the
                    # lock before it (waiters outside the queue re-check on their timers).
                    ready.extend(
                        event
                        for event, mine in entry.events.items()
                        if head is None or mine == head
                    )
        for event in ready:
            event.set()

    async def _renew(self) -> None:
        """Renew the registrations of names that still have waiters, before they lapse."""
        now = self._db.clock.now()
        if now < self._next_renewal or self._bell is None:
            return
        self._next_renewal = now + LISTEN_POLL
        with self._mutex:
            for key in [
                key
                for key, entry in self._names.items()
                if not entry.events and entry.registered_until <= now
            ]:
                del self._names[key]
            due = [
                entry
                for entry in self._names.values()
                if entry.events and entry.registered_until - now < RENEW_BELOW
            ]
        for semaphore in (False, True):
            kind = [entry for entry in due if entry.semaphore is semaphore]
            if kind:
                await self._renew_kind(kind, semaphore)

    async def _renew_kind(self, due: list[_Name], semaphore: bool) -> None:
        names = [entry.name for entry in due]
        assert self._bell is not None
        try:
            written_at, until = await run_sync(
                functools.partial(self._db.register, semaphore=semaphore),
                names,
                self._bell.address,
                REGISTRATION_TTL,
            )
        except BackendError as exc:
            log.debug("could not renew wake-up registrations on %s (%s)", self._db.server, exc)
            return
        lapsed: list[Event] = []
        with self._mutex:
            for entry in due:
                if entry.registered_until <= written_at:
                    # Unregistered for a while: a release may have gone unheard.
                    lapsed.extend(entry.events)
                entry.registered_until = max(entry.registered_until, until)
        for event in lapsed:
            event.set()

    def _raise_if_unusable(self, name: str) -> None:
        if self.closed:
            raise BackendError(
                f"lock {name!r} on {self._db.server}: the store is closed; open a new one"
            )
        if self.failure is not None:
            raise BackendError(
                f"lock {name!r} on {self._db.server}: the wake-up listener failed "
                f"({self.failure}); the next wait starts a new one"
            )

    def _fail(self, exc: BaseException) -> None:
        with self._mutex:
            if self.failure is None and not self.closed:
                self.failure = exc
        self._wake_all()

    def _wake_all(self) -> None:
        """Wake every waiter: each re-attempts, and nothing hangs on a dead listener."""
        with self._mutex:
            events = [event for entry in self._names.values() for event in entry.events]
        for event in events:
            event.set()

    async def aclose(self) -> None:
        with self._mutex:
            self.closed = True
            worker = self._worker
        self._wake_all()
        bell = self._bell
        if bell is None or self.pid != os.getpid():
            return
        if worker is not None:
            bell.ring_self()  # ends the listener's wait at once; it closes the socket
            await worker.join()
        bell.close()

    def forget_in_child(self) -> None:
        """In a forked child: close this process's copy of the parent's socket.

        Its locks are replaced, not taken: a parent thread may have held one at the fork.
        """
        self._mutex = threading.Lock()
        bell = self._bell
        if bell is not None and self.pid != os.getpid():
            bell.forget_in_child()


_FEEDS: weakref.WeakSet[AsyncWakeFeed] = weakref.WeakSet()
_BACKENDS: weakref.WeakSet[AsyncSQLiteBackend] = weakref.WeakSet()
_warned_no_socket = False


def _open_doorbell() -> Doorbell | None:
    global _warned_no_socket
    try:
        return Doorbell()
    except (OSError, AttributeError) as exc:  # AttributeError: no AF_UNIX on this system
        if not _warned_no_socket:
            _warned_no_socket = True
            log.warning(
                "cannot open a Unix datagram socket for SQLite wake-ups (%s); waiters in "
                "this process re-check every %g s instead",
                exc,
                LISTEN_POLL,
            )
        return None


def _forget_parents_feeds() -> None:
    for feed in list(_FEEDS):
        feed.forget_in_child()
    for backend in list(_BACKENDS):
        backend._mutex = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents_feeds)


class AsyncSQLiteWaiter(AsyncSubscribingWaiter):
    """Hears releases from every process on the machine through the backend's feed.

    With `semaphore`, the slot releases of the semaphore `name` (whose wake-ups
    are apart from those of the lock `name`).
    """

    def __init__(self, backend: AsyncSQLiteBackend, name: str, *, semaphore: bool = False) -> None:
        super().__init__(backend.semaphore_bus if semaphore else backend.local_bus, name)
        self._backend = backend
        self._semaphore = semaphore
        self._key = digest(name, semaphore=semaphore)

    async def _join(self) -> Feed:
        return await self._backend._subscribe(
            self._name, self._key, self._event, self.owner, semaphore=self._semaphore
        )

    async def _leave(self, feed: Feed) -> None:
        assert isinstance(feed, AsyncWakeFeed)
        feed.leave(self._key, self._event)

    def _owner_changed(self) -> None:
        feed = self._feed
        if isinstance(feed, AsyncWakeFeed):
            feed.retarget(self._key, self._event, self.owner)


class AsyncSQLiteBackend(AsyncBackend):
    capabilities: ClassVar[Capabilities] = Capabilities(
        scheme="sqlite",
        notifies=True,
        cross_process=True,
        # SQLite relies on the filesystem's locks, which network filesystems (NFS,
        # SMB) do not implement reliably, and WAL needs memory shared by all users.
        cross_host=False,
        linearizable=True,
        fair=True,
        replicas=False,
        ttl_clock="this machine's boot-time clock (its wall clock off Linux)",
        on_client_crash="the lock stays held until its TTL runs out, then anyone may take it",
        on_server_restart=(
            "a reboot of the machine expires every lock (but see On SQLite for processes "
            "that cannot read the kernel's boot id); fencing tokens keep increasing, "
            "unless a power cut lost their last commits"
        ),
        on_partition="not applicable: every process is on the one machine that has the file",
        on_memory_pressure="never evicted: locks live in a file on disk",
        fencing_tokens=(
            "one counter for the whole file, incremented by the transaction that grants the "
            "lock, so each token is larger than every earlier one of any name; a power cut "
            "or kernel crash may lose the last commits (synchronous=NORMAL) and hand their "
            "tokens out again"
        ),
        state_per_name=(
            "nothing: a release deletes the lock's row; a row that expires instead (a "
            "crashed holder's, hold_for's) is deleted by a sweep that looks at 32 rows per "
            "acquisition, so the table is swept whole every (rows / 32) acquisitions; dead "
            "waiters' queue places and dead processes' wake-up registrations are deleted by "
            "later acquisitions, 8 of each per acquisition; semaphore slots, places and "
            "registrations are deleted the same way, 8 of each per slot taken; the file "
            "keeps one row for the token counter"
        ),
        semaphores=(
            "one row per slot in the file, with its owner, token, limit and expiry, "
            "checked and taken in one write transaction"
        ),
        cache=(
            "one row per entry in the file, expiring by the machine clock; read without "
            "the write lock, a due entry read again and claimed in one write transaction"
        ),
    )
    url_options: ClassVar[tuple[Option, ...]] = URL_OPTIONS

    claims_with_read: ClassVar[bool] = True

    def __init__(
        self,
        path: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        machine_clock: MachineClock | None = None,
    ) -> None:
        super().__init__()
        self._db = SQLiteLocks(SQLiteOptions(path, timeout, table_prefix), machine_clock)
        self._mutex = threading.Lock()
        self._feed: AsyncWakeFeed | None = None
        self._closed = False
        _BACKENDS.add(self)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> AsyncSQLiteBackend:
        # `clock` is the store's, for its own deadlines; TTLs here are enforced by the
        # machine's clock, the only one every process sharing the file can read.
        parsed = parse_url(url, options)
        return cls(parsed.path, timeout=parsed.timeout, table_prefix=parsed.table_prefix)

    @property
    def server(self) -> str:
        return self._db.server

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.server}>"

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
        return await run_sync(self._db.try_acquire, name, owner, ttl, queue_ttl)

    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        outcome = await run_sync(self._db.release, name, owner, hold_for)
        if outcome is Outcome.OK and hold_for <= 0:
            self.local_bus.notify(name)
        return outcome

    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        return await run_sync(self._db.extend, name, owner, ttl)

    async def inspect(self, name: str) -> LockInfo | None:
        return await run_sync(self._db.inspect, name)

    async def force_release(self, name: str) -> bool:
        released = await run_sync(self._db.force_release, name)
        if released:
            self.local_bus.notify(name)
        return released

    async def leave_queue(self, name: str, owner: str) -> None:
        if await run_sync(self._db.leave_queue, name, owner):
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
        return await run_sync(self._db.sem_try_acquire, name, owner, ttl, limit, queue_ttl)

    async def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        outcome = await run_sync(self._db.sem_release, name, owner, hold_for)
        if outcome is Outcome.OK and hold_for <= 0:
            self.semaphore_bus.notify(name)
        return outcome

    async def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        return await run_sync(self._db.sem_extend, name, owner, ttl)

    async def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        return await run_sync(self._db.sem_inspect, name)

    async def sem_force_release(self, name: str) -> int:
        released = await run_sync(self._db.sem_force_release, name)
        if released:
            self.semaphore_bus.notify(name)
        return released

    async def sem_leave_queue(self, name: str, owner: str) -> None:
        if await run_sync(self._db.sem_leave_queue, name, owner):
            self.semaphore_bus.notify(name)

    # -- cache entries --------------------------------------------------------------

    async def cache_fetch(
        self, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int]:
        return await run_sync(self._db.cache_fetch, keys, gen_key)

    async def cache_read(self, key: str, gen_key: str, claim: Claim | None = None) -> CacheRead:
        return await run_sync(self._db.cache_read, key, gen_key, claim)

    async def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        await run_sync(self._db.cache_store, items)

    async def cache_delete(self, key: str) -> bool:
        return await run_sync(self._db.cache_delete, key)

    async def cache_invalidate(self, key: str, keep: float) -> bool:
        return await run_sync(self._db.cache_invalidate, key, keep)

    async def cache_clear(self, gen_key: str) -> int:
        return await run_sync(self._db.cache_clear, gen_key)

    async def cache_count(self, key_prefix: str) -> int | None:
        return await run_sync(self._db.cache_count, key_prefix)

    # -- wake-ups -------------------------------------------------------------------

    def waiter(self, name: str) -> AsyncSQLiteWaiter:
        return AsyncSQLiteWaiter(self, name)

    def sem_waiter(self, name: str) -> AsyncSQLiteWaiter:
        return AsyncSQLiteWaiter(self, name, semaphore=True)

    def _current_feed(self, name: str) -> AsyncWakeFeed:
        with self._mutex:
            if self._closed:
                raise BackendError(
                    f"lock {name!r} on {self.server}: the store is closed; open a new one"
                )
            feed = self._feed
            if feed is None or not feed.usable:
                feed = self._feed = AsyncWakeFeed(self._db)
            return feed

    async def _subscribe(
        self, name: str, key: bytes, event: Event, owner: str | None, *, semaphore: bool = False
    ) -> AsyncWakeFeed:
        feed = self._current_feed(name)
        await feed.join(name, key, event, owner, semaphore=semaphore)
        return feed

    async def aclose(self) -> None:
        with self._mutex:
            self._closed = True
            feed, self._feed = self._feed, None
        if feed is not None:
            await feed.aclose()
        await run_sync(self._db.close)
