"""`etcd://h1:2379,h2:2379,...` and `etcds://`: locks on an etcd v3 cluster.

**Why etcd.** A lock is granted by a Raft transaction agreed by a majority of
the members, so it is linearizable: no failover can grant it twice. A lock is
a key created on a lease, only if it does not exist (`create_revision == 0`);
its create revision is the fencing token, which grows with every write to the
cluster, forever, so it strictly increases across all locks. The key dies with
its lease, and etcd announces that deletion to watchers, so waiters are woken
by releases and by expiries alike, without polling.

**Why the JSON gateway over httpx, not an etcd client library.** The Python
etcd3 clients (python-etcd3, etcd3gw, aioetcd3) are unmaintained, and the
gRPC ones break with new grpcio/protobuf releases. Every etcd member serves
the same API as JSON over HTTP (the grpc-gateway, under `/v3/` since etcd 3.4),
and httpx gives one client for both flavours (`httpx.AsyncClient` here,
`httpx.Client` in the generated blocking twin). The requests and answers are
built and read in `corral.backends.etcd_api`, which is shared by both.
`trust_env=False` keeps proxy settings from intercepting the cluster, and
every request carries the gateway header for gRPC metadata `hasleader`, so a
member cut off from its leader refuses at once instead of hanging.

**Members and timeouts.** A call starts at the member that answered last. A
member that refuses the connection, does not answer, or cannot serve (no
leader, shutting down) passes the turn to the next; each try may take at most
`timeout / members`, and the members are asked in rounds, those that were slow
last, until the call's `timeout` is spent, so a call fails with
`BackendUnavailable` within about `timeout` whatever the members do, and rides
out a leader election that ends within it. When every member refuses the
connection the call fails at once. The plan is `etcd_api.Tries`.

**A request may be applied twice, or late.** A member can apply a write and
lose its answer (a timeout, a dropped connection, a proposal that commits
after the member said it timed out), and the call then asks again. Every
write is therefore idempotent or recognised as this process's own: leases are
granted with IDs chosen here (a grant sent twice answers "lease already
exists"); a failed acquisition reads the holder, and the holder with this
attempt's owner on this attempt's lease is this attempt's success; a move to
a new lease (`extend` to another TTL, `hold_for`) that finds the key already
on the new lease was applied; a revoke that finds its lease gone although the
lease cannot have run out was applied. When a call gives up after a try that
may still be applied (`_Trace`), what that try could have created cannot be
used by anyone (its owner id was this attempt's): its lease is revoked in the
background as soon as the cluster answers (`LeaseReaper.drop`), so an
acquisition that failed with `BackendUnavailable` and committed later holds
the lock only until then, not for its TTL. A request that reaches the cluster
after that revoke finds its lease gone and changes nothing. Cache writes are
idempotent (puts, deletes, an invalidation's swap, which swaps again from what
it finds) or harmless twice (a clear sent twice bumps the generation twice).

**Round trips.** Leases are not part of etcd transactions, and a key must be
attached to its lease when it is created (attached later, a crash in between
would leave the lock held forever), so:

- uncontended acquisition: 2 (lease grant, then the transaction);
- failed attempt: the transaction, plus the holder's lease time-to-live (for
  `fail_fast` and to sleep until the expiry); the unused lease is kept for the
  waiter's next attempt, so a re-attempt that wins costs the transaction and a
  keep-alive of that lease (restarting its count-down), never a new grant. A
  waiter that gives up without a word (the lock logic says nothing when an
  unfair wait ends) leaves its lease unused: it is revoked in the background
  `IDLE_AFTER` seconds after its last attempt;
- release: 1, a lease revoke. The lease belongs to this acquisition alone, so
  revoking it is the compare-by-owner delete: it deletes our key if it is
  still ours and nothing else, and the deletion wakes the waiters. Only when
  the lease is gone does a read follow, to tell EXPIRED from LOST;
- extend with the same TTL: 1, a lease keep-alive (a read follows only when
  gone). A different TTL needs a new lease, as a lease's TTL is fixed at
  grant: grant, transaction moving the key to it, revoke of the old one (3);
- `release(hold_for=S)`: 3 (grant, transaction, revoke), the key staying,
  ownerless, on a new lease of S seconds;
- `inspect`: 2 (read, lease time-to-live); `force_release`: 2 (read, revoke);
- so an uncontended acquire + release cycle is 3 round trips;
- fair locks: the same 2 for a newcomer to an idle lock; a newcomer that must
  queue adds 2 (the grant of its queue lease, and a transaction that takes the
  lock if it came free meanwhile, else queues on that lease) besides the
  holder's time-to-live; a queued waiter's attempt is one transaction (plus a
  keep-alive of its queue lease at most every `queue_ttl/4`). The queue lease,
  unused once its waiter takes the lock, is revoked in the background.

**Semaphores.** A slot is a lock's `holder` under another key,
`<prefix>/sem/<name>/slot/<limit>/<i>` (see `etcd_api.SemaphoreKeys`), with all
of the above: one lease per acquisition, its create revision as the token,
release by revoking the lease, extend and `hold_for` by keep-alive or move, the
early end at the TTL, the reaper. etcd transactions cannot count keys, so taking
a slot is one transaction that creates one chosen slot if it is absent, no slot
of another limit exists and nobody queues; a choice gone stale fails, and the
slots the failure reads give the next choice. A newcomer that finds waiters
queued may still pass them when fewer queue than slots are free, in a
transaction that checks that nobody queued and no slot was taken since. The limit lives in
the slot keys, so it goes with the last slot. Round trips: a newcomer's first
choice is made unread, at random, so an idle semaphore is taken in 2 (grant,
transaction) and a busy one in a few more; a full one answers after the
transaction and one lease time-to-live per slot (the soonest to free is the
waiter's `holder_ttl`); release, extend and `hold_for` as for a lock (release
reads the slots only when its lease is gone); `semaphore_info` is a read and
one time-to-live per slot. A queued waiter (fair, or waiting too long) first
reads the slots and up to `limit` waiters ahead of it, and takes a slot only
when fewer are ahead than slots are free, in a transaction that also checks
that no slot was taken since that reading and that its place still exists, so
the count it decided on still holds. Waiters watch the semaphore's prefix, as
a lock's watch its own: every slot freed (released, expired, forced) and every
place left wakes them.

**Cache entries.** An entry is the key `<prefix>/cache/e/<key>`, holding the
envelope's bytes as given, and beside it `<prefix>/cache/d/<key>`, its due stamp:
the entry's generation and the later of its fresh-until and retry-until, at fixed
width (`etcd_api.due_stamp`), because an etcd transaction compares whole values,
never a part of one. Both are written, rewritten and deleted in one transaction, on
one lease, so they expire together too. A namespace's generation is
`<prefix>/cache/g/<gen_key>`, absent (0) until the first clear. Each process
remembers the generation it last saw with its key's mod revision.

Entries share leases instead of taking one each (which would cost a grant before
every store, and the cluster a lease to track per entry): an entry goes on a lease
that ends no sooner than `keep` from now (counted before the request, by the
leader's clock), and at most its spread (a 16th of `keep`, at least 0.5 s) and the
rounding to whole seconds later, or, for a `keep` under the cluster's minimum
lease, that minimum; this process finds one in its table or grants one, which the
entries stored with about the same `keep` during the next half spread share. So
the grants follow the time, not the number of entries: about one per half spread
per `keep` in use. Entry leases are never revoked: they end with their entries.

A claimed read (`cache_read` with a claim) is one transaction: it reads the entry
and the generation, and, if the generation key is still at the mod revision last
seen, compares the entry's stamp between bounds made for that generation and the
claim's `due_before` (`etcd_api.due_bounds`) and, when the entry is due (missing,
foreign, of another generation, stale), runs the lock's own acquisition
transaction (`acquire_txn`, nested), on a lease. So reading and claiming are one
atomic step, and a claim won on a miss needs no second read. The lease is a spare
this process kept from an earlier claim that was refused; with none, the first
transaction reads and compares only, as most reads find a fresh entry and need no
lease, and a due entry is read again, atomically, on a new one. A generation that
moved since last seen costs one more transaction (after `CLAIM_TRIES` of them,
while clients clear the namespace without pause, the read falls back to reading,
then trying the lock). A refused claim's `holder_ttl` is None: no time-to-live
read. A claim won on a kept spare restarts its lease with a keep-alive, as a
waiter's kept lease does; spares unused for `IDLE_AFTER` seconds are revoked.

Round trips: `cache_fetch` 1 (a range per key and one for the generation; one
more per 128 keys or 1 MiB of keys); claimed read of a fresh entry 1, of a due one
1 on a spare (and a keep-alive if it wins) or 3 (read, grant, claimed read);
`cache_store` 1 (2 operations per entry; one more per 64 entries or 1 MiB) and a
grant when no shared lease fits; `cache_invalidate` 2 (read, then a compare-and-
swap on the entry's mod revision that puts the stale bytes and stamp on a lease
for `keep`); `cache_delete` 1; `cache_clear` 1 (a compare-and-swap on the
generation key's mod revision, from the generation last seen; again from what a
failed one read); `cache_count` 1 (a counted range).

**Every attempt respects the queue.** Any acquisition, fair or not, takes the
lock only if nobody queues for it: its transaction also compares the queue's
key range, empty or not, which costs nothing more when it is empty. A waiter
that the lock logic moves into the queue (one that waited too long, or a fair
one) is therefore never passed by a newcomer; a dead one's place goes with its
short lease.

**Short and fractional TTLs.** etcd leases count whole seconds, and a cluster
raises every lease to its minimum (1.5 election timeouts, rounded up: 2 s by
default), with expiry checked every 0.5 s. A lease is asked for the TTL rounded
up to whole seconds; when the server's lease outlasts the lock's TTL, this
process revokes it itself at the TTL (one background task or thread per
backend; `LeaseReaper`), so a 0.3 s lock is free 0.3 s after it was taken, as
on every other backend. If the holder's process dies or freezes, the lock is
held until the server's lease runs out: the TTL rounded up to whole seconds,
at least the cluster's minimum. Either way the holder itself stops trusting
the lock after the TTL (the lock logic counts from before the request), so
the early revoke never frees a lock its holder still believes it owns.
`lock_info` reports at most the TTL the holder asked for. The same holds for
a fair waiter's place: a dead waiter's place lasts its queue lease, at least
the cluster's minimum.

**Fair locks** follow etcd's own election and lock recipes: a waiter puts a key
under the lock's `queue/` prefix on a short lease of its own that it refreshes
while it waits (dead waiters' keys expire, so they cannot stall the queue),
and the key with the lowest create revision goes first. A newcomer's first
transaction takes the lock if it is free and nobody queues (the same two
round trips as an unfair lock); if not, it is granted its queue lease and its
next transaction queues it on that lease (or takes the lock, if it came free
meanwhile with nobody queued). Its place is born on its own short lease, so
there is no moment at which a waiter that dies holds a place for longer than
that lease. Taking a turn is one transaction that checks the lock is free,
the waiter's key still exists and no older key does (nobody can queue ahead
of an existing key).

**Watches.** A waiter watches its lock's prefix for deletions. One watch
stream (one HTTP connection, read by one task or daemon thread) serves every
waiter of a lock name in a process; the waiter returns from `__aenter__` only
once etcd confirmed the watch, so a release after its next attempt cannot go
unheard. A stream that breaks, or whose member has since failed a call (a
paused member's stream is simply silent), is replaced before the waiter's next
attempt. The gateway cannot cancel one watch of a stream (that would need a
bidirectional HTTP stream), so a watch ends by closing its connection.

**Authentication** (`etcd://user:password@h1,h2`) uses `/v3/auth/authenticate`
and sends the token in the `Authorization` header; an expired token is renewed
once per call. TLS: `etcds://` with `ca_file`, `cert_file`, `key_file`.

**Closing** a store revokes the leases this process was granted and holds no
lock with (waiters' unused leases, queue places, leases left to revoke in the
background), within at most `CLOSE_WITHIN` seconds; the locks it still holds
stay held until their TTLs, as on every backend.

After `fork`, a child process uses none of its parent's connections, watch
streams, leases or background workers: everything per process is rebuilt on
first use.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import os
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from corral._async._compat import Event, Worker, sleep, spawn
from corral._async.backends.base import AsyncBackend, AsyncSubscribingWaiter, Feed, LocalBus
from corral.backends import etcd_api as api
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.envelope import mark_stale
from corral.core.options import Option
from corral.core.primitives import Attempt, CacheRead, Claim, LockInfo, Outcome, SemaphoreInfo
from corral.errors import BackendError, BackendUnavailable, ConfigError

__all__ = ["AsyncEtcdBackend"]

log = logging.getLogger("corral.etcd")

# A waiter's unused lease is reused for its next attempt while at least this much of it
# is surely left; otherwise a new one is granted.
LEASE_REUSE_MARGIN = 1.0
# A waiter's unused lease is revoked this long after its last attempt: the lock logic
# attempts again at least every second while it waits, so by then the waiter is gone.
IDLE_AFTER = 5.0
# A lease left to revoke (see `LeaseReaper.drop`) is tried again this often while the
# cluster does not answer, for as long as the lease may live.
DROP_RETRY = 1.0
# How long closing a store may spend revoking the leases it leaves unused.
CLOSE_WITHIN = 1.0
# A server lease longer than the lock's TTL by more than this is ended early, at the TTL.
EARLY_END = 0.001
# A confirmed watch stream silent this long is replaced (its waiters watch again): a
# bound on how long a stream can hang on a member that stopped answering unnoticed.
WATCH_QUIET = 300.0
# How many transactions one semaphore attempt sends at most, each on a slot chosen from
# what the previous one found, before it reports the semaphore busy (to be tried again).
SEM_TRIES = 10
# A cache entry is put on a lease shared with the entries to be kept until about the
# same time: its spread, this share of `keep` and at least ENTRY_SPREAD_MIN seconds,
# bounds how much longer than `keep` the server keeps it (see `_entry_lease`). A lease
# is granted about every half spread per `keep` in use, however many entries are stored.
ENTRY_SPREAD_SHARE = 1 / 16
ENTRY_SPREAD_MIN = 0.5
# When no grant has shown the cluster's minimum lease yet, assume etcd's default one
# (1.5 election timeouts of 1 s, rounded up): an entry kept less is kept that long anyway.
DEFAULT_LEASE_FLOOR = 2
# How many shared entry leases a process remembers (the soonest to run out are forgotten).
ENTRY_LEASES_KEPT = 256
# etcd's longest lease is 9e9 s; longer keeps are kept for this long.
KEEP_MAX = 3e9
# A process keeps at most this many unused leases per lease length for the claims of
# cache reads, and the generations of this many namespaces.
SPARES = 4
GENERATIONS_KEPT = 4096
# How many transactions one claimed cache read sends at most (each generation change
# it meets costs one) before it falls back to reading, then trying the lock.
CLAIM_TRIES = 5
# How many compare-and-swaps `cache_invalidate` and `cache_clear` try before giving up.
SWAP_TRIES = 32
# Members answering with this header set refuse at once when they have no leader.
_HEADERS = {"Grpc-Metadata-hasleader": "true"}

_UNAVAILABLE_ADVICE = (
    "check that the etcd members are running and reachable from here and that a majority "
    "of them is up, or raise timeout="
)


@dataclass(slots=True, eq=False)
class _Lease:
    """A lease this process was granted, and what it knows about it."""

    id: int
    granted: int
    """The TTL the server granted (whole seconds, at least its minimum)."""
    ttl: float
    """The TTL of the lock (or hold, or queue place) it carries."""
    refreshed: float
    """Clock reading taken before it was granted or last kept alive."""
    deadline: float | None = None
    """When this process ends it (the lock's TTL is shorter than the lease), else None."""
    dead: bool = False
    """This process ended it at its deadline (or is doing so)."""
    key: bytes = b""
    """The key it carries, when it carries one: a lock's `holder`, or a semaphore's slot."""

    def surely_left(self, now: float) -> float:
        return self.refreshed + self.granted - now


@dataclass(slots=True, eq=False)
class _Place:
    """A fair waiter's place: its queue key's lease and create revision."""

    lease: _Lease
    revision: int


@dataclass(slots=True)
class _Trace:
    """What one call learnt about its tries: may one of them have been applied?

    A try that timed out after sending, or whose connection broke before the
    answer, or that a member answered with "timed out" (a proposal that may
    still commit), may have been applied; a refused connection was not.
    """

    maybe_applied: bool = False


@dataclass(slots=True, eq=False)
class _EntryLease:
    """A lease shared by the cache entries to be kept until about the same time."""

    id: int
    low: float
    """Clock reading until which the server surely keeps it (taken before the grant)."""
    high: float
    """Clock reading by which the server ends it (taken after the grant's answer), barring a
    leader change (a new leader restarts every lease)."""


@dataclass(slots=True)
class _Tried:
    """One acquisition transaction's result: the won attempt, else the holder it found."""

    won: Attempt | None
    holder: api.Holder | None = None


class _Job(enum.Enum):
    END = "end the lease of a held lock at the lock's TTL"
    IDLE = "revoke a waiter's unused lease once the waiter is surely gone"
    SPARE = "revoke a spare lease of cache claims that no read took for a while"
    DROP = "revoke a lease nobody uses, at once, again while the cluster does not answer"


@dataclass(slots=True, eq=False)
class _Due:
    """A lease the reaper revokes at `at`."""

    job: _Job
    lease: _Lease
    name: str
    at: float
    waiter: tuple[str, str] | None = None
    """IDLE: the (name, owner) whose unused lease it is, if it still is."""
    until: float = 0.0
    """DROP: give up trying after this (the lease has surely run out by then)."""
    announce: bool = False
    """DROP: the lease may carry a lock: wake this process's waiters once it is gone."""


# Guards the creation of a backend's per-process state. A forked child gets a new one,
# in case another thread of the parent held it at the fork.
_STATE_MUTEX = threading.Lock()


def _new_state_mutex() -> None:
    global _STATE_MUTEX
    _STATE_MUTEX = threading.Lock()


os.register_at_fork(after_in_child=_new_state_mutex)


class _SemaphoreName(str):
    """A semaphore's name, where the helpers shared with locks take a name.

    A lock and a semaphore may share a name; this type tells the shared helpers
    (messages, the local wake-ups, the watch's keys) which of the two they serve.
    """

    __slots__ = ()
    kind = "semaphore"


class _CacheName(str):
    """A cache entry's key, where the request helpers take a name."""

    __slots__ = ()
    kind = "cache key"


class _GenerationName(str):
    """A cache namespace's generation key, where the request helpers take a name."""

    __slots__ = ()
    kind = "cache generation"


class _Described(str):
    """A whole subject for messages (several cache keys, a key prefix), where a name goes."""

    __slots__ = ()


def _kind(name: str) -> str:
    if isinstance(name, (_SemaphoreName, _CacheName, _GenerationName)):
        return name.kind
    return "lock"


def _subject(name: str) -> str:
    """What a message says a call was about: `lock 'x'`, `cache key 'k'`, ..."""
    if isinstance(name, _Described):
        return str(name)
    return f"{_kind(name)} {name!r}"


def _cache_subject(keys: Sequence[str], gen_key: str) -> str:
    if not keys:
        return _GenerationName(gen_key)
    if len(keys) == 1:
        return _CacheName(keys[0])
    return _Described(f"cache keys {keys[0]!r} and {len(keys) - 1} more")


_CLAIMS = _Described("the spare leases of cache claims")


class _LeaseNotFound(BackendError):
    """The lease named in a request no longer exists (expired or revoked)."""


class _LeaseExists(BackendError):
    """A grant named a lease ID that exists already."""


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _ProcessState:
    """Everything that must not cross a fork: connections, records, workers."""

    def __init__(self, client_options: dict[str, Any]) -> None:
        self.pid = os.getpid()
        # A thread lock in both flavours: its critical sections never await.
        self.mutex = threading.Lock()
        self.client = httpx.AsyncClient(**client_options)
        # Each watch stream holds its connection while it lasts; none is kept for reuse.
        self.watch_client = httpx.AsyncClient(
            **client_options,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )
        self.token: str | None = None
        self.held: dict[tuple[str, str], _Lease] = {}
        self.pending: dict[tuple[str, str], _Lease] = {}
        self.places: dict[tuple[str, str], _Place] = {}
        # By the watched keys' prefix: a lock and a semaphore of one name have their own.
        self.feeds: dict[bytes, AsyncWatchFeed] = {}
        self.reaper: AsyncLeaseReaper | None = None
        # Cache entries: the shared leases they are put on; unused leases for the claims
        # of cache reads, by lease length; each namespace's generation as last seen, with
        # its key's mod revision (what a read compares to know it is still current).
        self.entry_leases: list[_EntryLease] = []
        self.spares: dict[int, list[_Lease]] = {}
        self.generations: dict[str, tuple[int, int]] = {}


class AsyncLeaseReaper:
    """Revokes, in the background, the leases of this process that must end before the server
    would end them.

    Three jobs: a held lock's lease that outlasts the lock's TTL ends at the
    TTL (`schedule`); a waiter's unused lease ends once the waiter is surely
    gone (`idle`); a lease nobody uses, or one that a request that may still be
    applied could have attached a key to, ends at once, and again while the
    cluster does not answer (`drop`). One worker per backend and process,
    sleeping until the earliest job; it exits when nothing is scheduled and is
    started again on demand. Its table is guarded by the process state's
    mutex, which `extend` and the acquisition also take, so a renewal and an
    early end never both win, nor a reused lease and its idle revoke.
    """

    def __init__(self, backend: AsyncEtcdBackend, state: _ProcessState) -> None:
        self._backend = backend
        self._state = state
        self._due: dict[int, _Due] = {}
        self._wake = Event()
        self._worker: Worker | None = None
        self._closed = False

    def _add(self, due: _Due) -> None:
        self._due[due.lease.id] = due
        if not self._closed and (self._worker is None or not self._worker.alive()):
            self._worker = spawn(self._run, name="corral-etcd-reaper")
        self._wake.set()

    def schedule(self, lease: _Lease, name: str) -> None:
        """(Re)schedule a held lock's `lease` at its deadline, or forget it; hold the mutex."""
        if lease.deadline is None:
            self._due.pop(lease.id, None)
            return
        self._add(_Due(_Job.END, lease, name, lease.deadline))

    def idle(self, lease: _Lease, name: str, waiter: tuple[str, str], now: float) -> None:
        """Revoke `waiter`'s unused `lease` unless it is used again soon; hold the mutex."""
        if lease.surely_left(now) > IDLE_AFTER:
            self._add(_Due(_Job.IDLE, lease, name, now + IDLE_AFTER, waiter))

    def drop(self, lease: _Lease, name: str, now: float, *, announce: bool = False) -> None:
        """Revoke `lease` as soon as the cluster answers; hold the mutex."""
        until = now + max(lease.granted, api.lease_seconds(lease.ttl)) + 1.0
        self._add(_Due(_Job.DROP, lease, name, now, until=until, announce=announce))

    def spare(self, lease: _Lease, now: float) -> None:
        """Revoke a spare lease of cache claims unless a read takes it soon; hold the mutex."""
        if lease.surely_left(now) > IDLE_AFTER:
            self._add(_Due(_Job.SPARE, lease, _CLAIMS, now + IDLE_AFTER))

    def cancel(self, lease: _Lease) -> None:
        """Forget `lease`; hold the mutex."""
        self._due.pop(lease.id, None)

    async def _run(self) -> None:
        clock = self._backend.clock
        while True:
            due: list[_Due] = []
            delay: float | None = None
            with self._state.mutex:
                if self._closed or not self._due:
                    self._worker = None
                    return
                now = clock.now()
                for lease_id, job in list(self._due.items()):
                    if job.at > now:
                        left = job.at - now
                        delay = left if delay is None else min(delay, left)
                        continue
                    del self._due[lease_id]
                    if job.job is _Job.END:
                        job.lease.dead = True
                    elif job.job is _Job.IDLE:
                        assert job.waiter is not None
                        if self._state.pending.get(job.waiter) is not job.lease:
                            continue  # used again meanwhile
                        del self._state.pending[job.waiter]
                    elif job.job is _Job.SPARE:
                        spares = self._state.spares.get(api.lease_seconds(job.lease.ttl), [])
                        if job.lease not in spares:
                            continue  # taken by a read meanwhile
                        spares.remove(job.lease)
                    due.append(job)
            # Locks first: their early end is what other processes may be waiting for.
            due.sort(key=lambda job: job.job is not _Job.END)
            unanswered = False
            for job in due:
                if job.job is _Job.END:
                    await self._backend._end_early(job.lease, job.name)
                    continue
                # Once the cluster did not answer, the rest wait for the next round rather
                # than each wait out the timeout.
                done = not unanswered and await self._backend._revoke_unused(
                    job.lease, job.name, job.announce
                )
                unanswered = unanswered or not done
                retry = clock.now() + DROP_RETRY
                if not done and job.job is _Job.DROP and retry < job.until:
                    job.at = retry
                    with self._state.mutex:
                        self._due.setdefault(job.lease.id, job)
            if not due:
                await self._wake.wait(delay)
                self._wake.clear()

    async def aclose(self) -> list[_Lease]:
        """Stop; return the leases it was still to revoke (not the held locks' early ends)."""
        with self._state.mutex:
            self._closed = True
            worker = self._worker
            left = [job.lease for job in self._due.values() if job.job is not _Job.END]
            self._due.clear()
        self._wake.set()
        if worker is not None:
            await worker.join()
        return left


class AsyncWatchFeed:
    """One watch stream on one lock's (or semaphore's) keys, shared by this process's waiters
    of that lock.

    Every deletion under the lock's prefix (a release, an expiry, a waiter
    leaving the queue) sets every subscribed event. A feed that fails is never
    repaired, as events may have been missed: it wakes its waiters, and each
    subscribes again (on a new feed) before its next attempt.
    """

    def __init__(
        self,
        backend: AsyncEtcdBackend,
        state: _ProcessState,
        name: str,
        scope: bytes,
        index: int,
        within: float,
    ) -> None:
        self.pid = os.getpid()
        self.name = name
        self.scope = scope
        self.index = index
        self._within = within
        self._backend = backend
        self._state = state
        self._generation = backend.endpoints.failures(index)
        self._body = api.watch_create(scope)
        self._headers = backend._auth_headers(state)
        self.events: set[Event] = set()
        self.ready = Event()
        """Set once the watch is confirmed, or has failed."""
        self.confirmed = False
        self.failure: str | None = None
        self.trouble: api.Trouble | None = None
        self.timed_out = False
        self._mutex = threading.Lock()
        self._socket: Any = None
        self._stopping = False
        self._worker: Worker | None = None

    @property
    def usable(self) -> bool:
        return (
            self.failure is None
            and not self._stopping
            and self.pid == os.getpid()
            and self._backend.endpoints.failures(self.index) == self._generation
        )

    def start(self) -> None:
        self._worker = spawn(self._run, name="corral-etcd-watch")

    async def _run(self) -> None:
        endpoints = self._backend.endpoints
        url = endpoints.urls[self.index] + "/v3/watch"
        try:
            async with self._state.watch_client.stream(
                "POST", url, json=self._body, headers=self._headers, timeout=self._within
            ) as response:
                network = response.extensions.get("network_stream")
                with self._mutex:
                    self._socket = network.get_extra_info("socket") if network else None
                    if self._stopping:
                        return
                if response.status_code != 200:
                    body = b""
                    async for line in response.aiter_lines():
                        body = line.encode()
                        break
                    error = api.server_error(response.status_code, body)
                    self._fail(error.message, error.trouble)
                    return
                # The member answered in time; from now on the stream is silent until
                # something is deleted. httpcore reads the read timeout from the request's
                # extensions when the body starts, so it can be lengthened here (were that
                # to change, a quiet stream would only be replaced more often).
                timeouts = response.request.extensions.get("timeout")
                if isinstance(timeouts, dict):
                    response.request.extensions["timeout"] = {**timeouts, "read": WATCH_QUIET}
                async for line in response.aiter_lines():
                    if line.strip():
                        self._handle(line)
                self._fail("the member closed the watch stream")
        except httpx.TimeoutException as exc:
            self.timed_out = True
            # Once confirmed, a timeout means quiet, not broken: replace the stream
            # without blaming the member. Before, the caller blames it.
            self._fail(f"no answer in time ({_describe(exc)})", blame=False)
        except Exception as exc:
            self._fail(_describe(exc))
        finally:
            self._fail("the watch stream ended")

    def _handle(self, line: str) -> None:
        message = api.decode_answer(line.encode())
        if "error" in message:
            error = api.server_error(200, line.encode())
            self._fail(error.message, error.trouble)
            return
        result = message.get("result") or {}
        if result.get("canceled"):
            reason = str(result.get("cancel_reason") or "etcd cancelled the watch")
            self._fail(reason, api.classify(None, reason))
            return
        if result.get("created") and not self.confirmed:
            self.confirmed = True
            self.ready.set()
        if result.get("events"):
            self._wake_all()

    def _fail(self, reason: str, trouble: api.Trouble | None = None, *, blame: bool = True) -> None:
        with self._mutex:
            if self.failure is not None:
                return
            self.failure = reason
            self.trouble = trouble
            expected = self._stopping
        if blame and self.confirmed and not expected and self.pid == os.getpid():
            # A broken stream says as much about the member as a failed call (before
            # confirmation, `_subscribe` blames the member itself).
            self._backend.endpoints.failed(self.index)
        self.ready.set()
        self._wake_all()

    def _wake_all(self) -> None:
        with self._state.mutex:
            events = list(self.events)
        for event in events:
            event.set()

    def abandon(self, reason: str) -> None:
        """Give up on a member that did not confirm the watch in time (the caller blames it)."""
        self._fail(reason, blame=False)
        self.stop()

    def stop(self) -> None:
        """End the stream: closing its socket ends a read the worker is blocked in."""
        with self._mutex:
            self._stopping = True
            sock = self._socket
        if sock is not None and self.pid == os.getpid():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    async def join(self) -> None:
        worker = self._worker
        if worker is not None and self.pid == os.getpid():
            await worker.join()


class AsyncEtcdWaiter(AsyncSubscribingWaiter):
    """Hears this lock's (or semaphore's) releases and expiries through a watch (etcd
    announces both)."""

    def __init__(self, backend: AsyncEtcdBackend, name: str) -> None:
        super().__init__(backend._bus(name), name)
        self._backend = backend

    async def _join(self) -> Feed:
        return await self._backend._subscribe(self._name, self._event)

    async def _leave(self, feed: Feed) -> None:
        assert isinstance(feed, AsyncWatchFeed)
        self._backend._unsubscribe(feed, self._event)


class AsyncEtcdBackend(AsyncBackend):
    capabilities: ClassVar[Capabilities] = Capabilities(
        scheme="etcd",
        notifies=True,
        cross_process=True,
        cross_host=True,
        linearizable=True,
        fair=True,
        replicas=False,
        ttl_clock=(
            "the etcd leader's clock (leases of whole seconds, at least the cluster's "
            "minimum; a live holder ends a longer lease itself at the TTL)"
        ),
        on_client_crash=(
            "the lock stays held until its lease runs out on the server: the TTL rounded up "
            "to whole seconds and at least the cluster's minimum lease (2 s by default), "
            "then anyone may take it and waiters are woken"
        ),
        on_server_restart=(
            "locks and fencing tokens survive member restarts (Raft log on disk); a new "
            "leader extends every lease by an election timeout, so a crashed holder's lock "
            "may outlive its TTL a little, never the reverse"
        ),
        on_partition=(
            "a majority loss stops all acquisitions (BackendUnavailable) rather than granting "
            "a lock twice; a member cut off in a minority refuses and the client asks another"
        ),
        on_memory_pressure=(
            "never evicted; at its space quota etcd refuses writes (NOSPACE alarm) and "
            "acquisitions fail with BackendError until it is compacted and defragmented"
        ),
        # A dead holder's (or waiter's) lease lasts its TTL rounded up to whole seconds,
        # at least the cluster's minimum (2 s by default), plus up to the 0.5 s between
        # the leader's expiry checks: at most 2.5 s past a TTL, with the default settings.
        ttl_slack=2.5,
        fencing_tokens=(
            "the lock key's create revision: etcd's store revision, which every write to "
            "the cluster raises and which never goes back (compaction keeps it, Raft keeps "
            "it across restarts and leader changes), so tokens increase across all names; "
            "only restoring an older snapshot or rebuilding the cluster from empty data "
            "directories could issue a token again"
        ),
        state_per_name=(
            "nothing of corral's: the lock's key goes with its lease (revoked at release, "
            "else expired), a hold_for key with its own lease, a queue place with its short "
            "lease, and waiters' unused leases are revoked; etcd keeps every old revision in "
            "its history until the cluster is compacted (--auto-compaction-retention)"
        ),
        semaphores=(
            "a key per slot (slot/<limit>/<i>) on its acquisition's lease, taken by a "
            "transaction that compares that slot and every other limit's slots as absent"
        ),
        cache=(
            "a key per entry and a due stamp beside it, on leases shared by the entries "
            "kept until about the same time; one transaction reads, compares the stamp "
            "and tries the claim"
        ),
    )
    url_options: ClassVar[tuple[Option, ...]] = api.URL_OPTIONS
    claims_with_read: ClassVar[bool] = True

    def __init__(self, options: api.EtcdOptions, *, clock: Clock) -> None:
        super().__init__()
        self.options = options
        self.clock = clock
        self.prefix = options.prefix
        self.timeout = options.timeout
        self.endpoints = api.Endpoints(options.endpoints, options.hosts)
        self._client_options: dict[str, Any] = {
            "trust_env": False,
            "headers": _HEADERS,
            "timeout": options.timeout,
        }
        # One TLS context per backend, built here: httpx would otherwise load the CA
        # bundle for every client (tens of milliseconds, blocking the event loop). Plain
        # http has no certificates to verify, so it needs none.
        self._client_options["verify"] = _tls_context(options) if options.tls else False
        self._process: _ProcessState | None = None
        self._closed = False
        # The cluster's minimum lease, once a grant has shown it (a grant answered only
        # with "lease already exists" does not say what was granted).
        self._lease_floor = 0

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> AsyncEtcdBackend:
        """Open a backend on `url`; the clock times this process's early lease ends."""
        return cls(api.parse_url(url, options), clock=clock)

    @property
    def server(self) -> str:
        return self.options.server

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.server}>"

    # -- per-process state ------------------------------------------------------------

    def _state(self) -> _ProcessState:
        state = self._process
        if state is not None and state.pid == os.getpid():
            return state
        with _STATE_MUTEX:
            state = self._process
            if state is None or state.pid != os.getpid():
                if state is not None:
                    # A forked child: the parent's connections, streams, leases and
                    # workers are its own; the child starts afresh and never touches
                    # them, nor a lock another thread of the parent may have held.
                    self.endpoints = api.Endpoints(self.options.endpoints, self.options.hosts)
                state = self._process = _ProcessState(self._client_options)
        return state

    def _reaper(self, state: _ProcessState) -> AsyncLeaseReaper:
        if state.reaper is None:
            state.reaper = AsyncLeaseReaper(self, state)
        return state.reaper

    def _auth_headers(self, state: _ProcessState) -> dict[str, str]:
        return {"Authorization": state.token} if state.token else {}

    # -- errors -------------------------------------------------------------------------

    def _bus(self, name: str) -> LocalBus:
        """This process's wake-ups for lock `name`, or for semaphore `name`."""
        return self.semaphore_bus if isinstance(name, _SemaphoreName) else self.local_bus

    def _scope(self, name: str) -> bytes:
        """The prefix of every key of lock (or semaphore) `name`."""
        if isinstance(name, _SemaphoreName):
            return api.semaphore_keys(self.prefix, name).scope
        return api.lock_keys(self.prefix, name).scope

    def _where(self, name: str, action: str) -> str:
        pronoun = "them" if isinstance(name, _Described) else "it"
        return f"{_subject(name)} on {self.server}: could not {action} {pronoun}"

    def _unavailable(self, name: str, action: str, problems: list[str]) -> BackendUnavailable:
        seen = "; ".join(dict.fromkeys(problems)) or f"no member answered within {self.timeout:g} s"
        return BackendUnavailable(f"{self._where(name, action)}: {seen}; {_UNAVAILABLE_ADVICE}")

    def _refused(self, error: api.ServerError, name: str, action: str, host: str) -> BackendError:
        where = f"{self._where(name, action)}: {host} answered {error.message!r}"
        trouble = error.trouble
        if trouble is api.Trouble.LEASE_NOT_FOUND:
            return _LeaseNotFound(where)
        if trouble is api.Trouble.LEASE_EXISTS:
            return _LeaseExists(where)
        if trouble is api.Trouble.CREDENTIALS:
            return BackendError(f"{where}; check the user and password in the URL")
        if trouble in (api.Trouble.AUTH_REQUIRED, api.Trouble.BAD_TOKEN):
            return BackendError(
                f"{where}; the cluster has authentication enabled: put a user in the URL "
                "(etcd://user:password@host:2379)"
            )
        if trouble is api.Trouble.PERMISSION:
            return BackendError(
                f"{where}; grant the user's role readwrite on the prefix {self.prefix}/ "
                f"(etcdctl role grant-permission ROLE --prefix=true readwrite {self.prefix}/)"
            )
        if trouble is api.Trouble.NO_SPACE:
            return BackendError(
                f"{where}; etcd is over its space quota: compact and defragment it, then "
                "disarm the NOSPACE alarm (etcdctl alarm disarm)"
            )
        if trouble is api.Trouble.TOO_LARGE:
            return BackendError(
                f"{where}; etcd refuses requests over its --max-request-bytes (1.5 MiB by "
                "default): store smaller values, or raise it on every member"
            )
        return BackendError(f"{where}; check the members' logs")

    # -- requests -----------------------------------------------------------------------

    async def _post(
        self,
        path: str,
        body: dict[str, Any],
        deadline: float,
        name: str,
        action: str,
        *,
        authenticate: bool = True,
        trace: _Trace | None = None,
    ) -> dict[str, Any]:
        """One request, to the first member that answers it, within `deadline` (monotonic).

        Each member tried gets an equal share of the time left, so a member that
        does not answer cannot use up the whole call. The same request may reach
        the cluster twice (it was applied but the answer was lost, then another
        member is asked), or be applied after the call gave up: `trace` says
        whether a try may have been, and every caller recognises its own earlier
        success.
        """
        if self._closed:
            raise BackendError(f"{self._where(name, action)}: the store is closed")
        trace = trace if trace is not None else _Trace()
        state = self._state()
        if authenticate:
            await self._authenticate(state, deadline, name, action)
        tries = api.Tries(self.endpoints, self.timeout, deadline)
        renewed_token = False
        while (chosen := tries.next()) is not None:
            if chosen.pause:
                await sleep(chosen.pause)
            index, within = chosen.index, chosen.within
            host = self.endpoints.hosts[index]
            headers = self._auth_headers(state) if authenticate else None
            try:
                response = await state.client.post(
                    self.endpoints.urls[index] + path, json=body, headers=headers, timeout=within
                )
            except (httpx.ConnectTimeout, httpx.PoolTimeout):
                tries.failed(index, api.Failure.SLOW, f" did not answer within {within:.2g} s")
                continue
            except httpx.TimeoutException:
                trace.maybe_applied = True  # sent, and not answered in time
                tries.failed(index, api.Failure.SLOW, f" did not answer within {within:.2g} s")
                continue
            except httpx.ConnectError as exc:
                tries.failed(index, api.Failure.DOWN, f": {_describe(exc)}")
                continue
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
                # The connection broke after the request went out: the member may have
                # applied it, and may well answer the next try (it is not refusing).
                trace.maybe_applied = True
                tries.failed(index, api.Failure.BUSY, f": {_describe(exc)}")
                continue
            except (httpx.HTTPError, OSError) as exc:
                tries.failed(index, api.Failure.DOWN, f": {_describe(exc)}")
                continue
            if response.status_code == 200:
                try:
                    answer = api.decode_answer(response.content)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise BackendError(
                        f"{self._where(name, action)}: {host} answered with something that "
                        f"is not etcd's JSON ({exc}); is it an etcd client URL?"
                    ) from exc
                if "error" not in answer:
                    self.endpoints.succeeded(index)
                    return answer
            error = api.server_error(response.status_code, response.content)
            if error.trouble is api.Trouble.ELSEWHERE:
                if api.maybe_applied(error.message):
                    trace.maybe_applied = True
                tries.failed(index, api.Failure.BUSY, f": {error.message}")
                continue
            if (
                error.trouble in (api.Trouble.BAD_TOKEN, api.Trouble.AUTH_REQUIRED)
                and authenticate
                and self.options.username is not None
                and not renewed_token
            ):
                # Simple tokens expire after a few idle minutes: log in again, once.
                renewed_token = True
                state.token = None
                await self._authenticate(state, deadline, name, action)
                tries.again(index)
                continue
            raise self._refused(error, name, action, host)
        raise self._unavailable(name, action, tries.problems)

    async def _authenticate(
        self, state: _ProcessState, deadline: float, name: str, action: str
    ) -> None:
        if self.options.username is None or state.token is not None:
            return
        body = {"name": self.options.username, "password": self.options.password or ""}
        try:
            answer = await self._post(
                "/v3/auth/authenticate", body, deadline, name, action, authenticate=False
            )
        except BackendError as exc:
            if "authentication is not enabled" not in str(exc):
                raise
            state.token = ""  # the cluster does not check users: send none
            return
        state.token = str(answer.get("token") or "")

    async def _txn(
        self,
        body: dict[str, Any],
        deadline: float,
        name: str,
        action: str,
        trace: _Trace | None = None,
    ) -> dict[str, Any]:
        return await self._post("/v3/kv/txn", body, deadline, name, action, trace=trace)

    async def _grant(self, ttl: float, deadline: float, name: str, action: str) -> _Lease:
        """A new lease for `ttl`, with an ID chosen here, so a grant sent twice is recognised."""
        asked = api.lease_seconds(ttl)
        sent = self.clock.now()
        lease_id = api.new_lease_id()
        for _ in range(3):
            trace = _Trace()
            body = {"TTL": str(asked), "ID": str(lease_id)}
            try:
                answer = await self._post(
                    "/v3/lease/grant", body, deadline, name, action, trace=trace
                )
            except _LeaseExists:
                if trace.maybe_applied:
                    # An earlier try of this very grant was applied before its answer was lost.
                    granted = await self._granted(lease_id, asked, deadline, name, action)
                    return _Lease(lease_id, granted, ttl, sent)
                lease_id = api.new_lease_id()  # someone else's: another ID
                continue
            except BaseException as exc:
                if trace.maybe_applied or not isinstance(exc, Exception):
                    # Applied, or cancelled on its way: revoke what it may yet create.
                    self._drop(_Lease(lease_id, asked, ttl, sent), name)
                raise
            granted_id, granted = int(answer.get("ID", 0)), int(answer.get("TTL", 0))
            if granted_id != lease_id or granted <= 0:
                raise BackendError(
                    f"{self._where(name, action)}: etcd granted no usable lease "
                    f"({answer.get('error') or answer}); check the members' logs"
                )
            if granted > asked:
                self._lease_floor = max(self._lease_floor, granted)
            return _Lease(lease_id, granted, ttl, sent)
        raise BackendError(
            f"{self._where(name, action)}: etcd refused three lease IDs as taken; check the "
            "members' logs"
        )

    async def _granted(
        self, lease_id: int, asked: int, deadline: float, name: str, action: str
    ) -> int:
        """The TTL granted to a lease whose grant's answer was lost: the cluster raises it to
        its minimum, which an earlier grant may have shown, else the lease itself says."""
        if self._lease_floor:
            return max(asked, self._lease_floor)
        answer = await self._post(
            "/v3/lease/timetolive", {"ID": str(lease_id)}, deadline, name, action
        )
        return max(asked, int(answer.get("grantedTTL", 0)))

    async def _keepalive(self, lease_id: int, deadline: float, name: str, action: str) -> int:
        """Restart a lease's count-down; its TTL, or 0 when the lease is gone."""
        answer = await self._post(
            "/v3/lease/keepalive", {"ID": str(lease_id)}, deadline, name, action
        )
        return int((answer.get("result") or {}).get("TTL", 0))

    async def _revoke(
        self,
        lease_id: int,
        deadline: float,
        name: str,
        action: str,
        trace: _Trace | None = None,
    ) -> None:
        await self._post(
            "/v3/lease/revoke", {"ID": str(lease_id)}, deadline, name, action, trace=trace
        )

    async def _revoke_quietly(self, lease_id: int, deadline: float, name: str) -> None:
        """Revoke a lease nothing depends on any more; if that fails it expires on its own."""
        try:
            await self._revoke(lease_id, deadline, name, "clean up after")
        except BackendError as exc:
            log.debug("lease %x of lock %r was left to expire: %s", lease_id, name, exc)

    async def _revoke_unused(self, lease: _Lease, name: str, announce: bool) -> bool:
        """The reaper's revoke of a lease nobody uses; False when it should be tried again."""
        try:
            await self._revoke(lease.id, self._deadline(), name, "clean up after")
        except _LeaseNotFound:
            return True
        except BackendUnavailable as exc:
            log.debug("lease %x of lock %r not revoked yet: %s", lease.id, name, exc)
            return False
        except BackendError as exc:
            log.debug("lease %x of lock %r was left to expire: %s", lease.id, name, exc)
            return True
        if announce:
            self._bus(name).notify(name)
        return True

    def _holder(self, kv: dict[str, Any] | None, name: str) -> api.Holder | None:
        if kv is None:
            return None
        try:
            return api.parse_holder(kv)
        except (ValueError, TypeError, KeyError) as exc:
            raise self._foreign(name, api.unb64(kv.get("key")), exc) from exc

    def _foreign(self, name: str, key: bytes, exc: Exception) -> BackendError:
        return BackendError(
            f"{_subject(name)} on {self.server}: the key "
            f"{key.decode(errors='replace')!r} holds a value corral did not write ({exc}); "
            "another program uses the same keys (choose another prefix=)"
        )

    async def _read_holder(self, name: str, deadline: float, action: str) -> api.Holder | None:
        keys = api.lock_keys(self.prefix, name)
        answer = await self._post(
            "/v3/kv/range", api.range_request(keys.holder), deadline, name, action
        )
        kvs = answer.get("kvs") or []
        return self._holder(kvs[0] if kvs else None, name)

    async def _seconds_left(
        self, holder: api.Holder | None, deadline: float, name: str, action: str
    ) -> float | None:
        """At most how long `holder` has left: its lease's whole seconds (rounded down) + 1,
        and never more than the TTL it asked for, which its process enforces itself."""
        if holder is None:
            return None
        if holder.lease == 0:
            return math.inf  # not written by corral's lock logic: it never expires
        answer = await self._post(
            "/v3/lease/timetolive", {"ID": str(holder.lease)}, deadline, name, action
        )
        left = int(answer.get("TTL", -1))
        if left < 0:
            return 0.0  # expired this instant: the deletion is on its way
        return min(float(left + 1), holder.ttl)

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout

    def _drop(self, lease: _Lease, name: str, *, announce: bool = False) -> None:
        """Have the reaper revoke `lease`, which nobody uses (or may carry an orphaned key)."""
        state = self._state()
        with state.mutex:
            self._reaper(state).drop(lease, name, self.clock.now(), announce=announce)

    def _prune(self, state: _ProcessState, now: float) -> None:
        """Forget leases the server has surely expired: unused ones and queue places of
        waiters that gave up, and locks whose handles were dropped without a release.
        (A release or extend without a record asks the server, with the same outcome.)"""
        with state.mutex:
            for key in [k for k, lease in state.held.items() if lease.surely_left(now) < 0]:
                if state.held[key].deadline is None or state.held[key].dead:
                    del state.held[key]
            for key in [k for k, lease in state.pending.items() if lease.surely_left(now) < 0]:
                del state.pending[key]
            for key in [k for k, place in state.places.items() if place.lease.surely_left(now) < 0]:
                del state.places[key]

    # -- acquire ------------------------------------------------------------------------

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
            raise ConfigError(f"{self.server} does not support replicas=N (Raft replaces it)")
        deadline = self._deadline()
        start = self.clock.now()
        state = self._state()
        keys = api.lock_keys(self.prefix, name)
        value = api.holder_value(owner, ttl)
        self._prune(state, start)

        def unfair(lease_id: int) -> dict[str, Any]:
            return api.acquire_txn(keys, value, lease_id)

        if queue_ttl is None:
            tried = await self._attempt(state, name, owner, ttl, deadline, unfair)
            return tried.won or await self._missed(tried.holder, deadline, name)
        place = await self._refresh_place(state, name, owner, queue_ttl, start, deadline)
        if place is not None:
            revision = place.revision

            def take(lease_id: int) -> dict[str, Any]:
                return api.fair_take_txn(keys, owner, value, lease_id, revision)

            tried = await self._attempt(state, name, owner, ttl, deadline, take, place=place)
            return tried.won or await self._missed(tried.holder, deadline, name)
        # A newcomer: an idle lock with nobody queued is taken as any lock is.
        tried = await self._attempt(state, name, owner, ttl, deadline, unfair)
        if tried.won is not None:
            return tried.won
        return await self._queue(state, name, owner, ttl, queue_ttl, deadline)

    async def _missed(self, holder: api.Holder | None, deadline: float, name: str) -> Attempt:
        return Attempt(
            False, holder_ttl=await self._seconds_left(holder, deadline, name, "acquire")
        )

    async def _attempt(
        self,
        state: _ProcessState,
        name: str,
        owner: str,
        ttl: float,
        deadline: float,
        build: Callable[[int], dict[str, Any]],
        *,
        queue: _Lease | None = None,
        place: _Place | None = None,
    ) -> _Tried:
        """One acquisition transaction on a lease (the waiter's unused one, else a new one).

        With `queue`, it is a fair newcomer's transaction, which queues on that
        lease when it fails; with `place`, it is a queued waiter's turn. A
        transaction whose answer was lost may have been applied: one sent again
        finds the holder with this owner on this lease (its own success), and
        one the call gave up on leaves its lease to the reaper, which revokes
        whatever it may have created.
        """
        key = (name, owner)
        lease, fresh = await self._lease_for(state, name, owner, ttl, deadline)
        trace = _Trace()
        try:
            try:
                answer = await self._txn(build(lease.id), deadline, name, "acquire", trace)
            except _LeaseNotFound:
                if fresh:
                    raise
                # The kept lease ran out on the server sooner than expected: take a new one.
                lease, fresh = await self._grant(ttl, deadline, name, "acquire"), True
                trace = _Trace()
                answer = await self._txn(build(lease.id), deadline, name, "acquire", trace)
            found = api.txn_ranges(answer)
            holder = self._holder(found[0] if found else None, name)
        except BaseException as exc:
            maybe = trace.maybe_applied or not isinstance(exc, Exception)
            if maybe:
                # It may hold the lock (or a place) for an owner nobody will use again.
                self._drop(lease, name, announce=True)
            elif not isinstance(exc, _LeaseNotFound):
                self._keep_for_next_attempt(state, key, lease, name)
            if queue is not None:
                self._drop(queue, name, announce=maybe)
            raise
        # The holder with this owner on this lease: an earlier try of this very request
        # was applied, and its answer lost.
        mine = holder is not None and holder.owner == owner and holder.lease == lease.id
        if api.txn_succeeded(answer) or mine:
            token = holder.token if mine and holder is not None else api.txn_revision(answer)
            if place is not None:
                self._leave_place(state, key, place)
                self._drop(place.lease, name)  # its key went in the same transaction
            if queue is not None:
                self._drop(queue, name)  # unused, or holding a place a retry queued
            try:
                holder_key = api.lock_keys(self.prefix, name).holder
                return _Tried(await self._took(state, name, owner, lease, fresh, token, holder_key))
            except BaseException:
                self._drop(lease, name, announce=True)  # held, but by nobody who knows
                raise
        self._keep_for_next_attempt(state, key, lease, name)
        if queue is not None:
            with state.mutex:
                state.places[key] = _Place(queue, api.put_revision(answer))
        if place is not None:
            queued = found[1] if len(found) > 1 else None
            if queued is None or int(queued.get("create_revision", 0)) != place.revision:
                self._leave_place(state, key, place)  # the place expired: queue again next time
        return _Tried(None, holder)

    async def _lease_for(
        self, state: _ProcessState, name: str, owner: str, ttl: float, deadline: float
    ) -> tuple[_Lease, bool]:
        """The lease of an acquisition attempt: the waiter's unused one, else a new one (fresh)."""
        with state.mutex:
            lease = state.pending.pop((name, owner), None)
            if lease is not None:
                self._reaper(state).cancel(lease)
        fresh = (
            lease is None
            or lease.ttl != ttl
            or lease.surely_left(self.clock.now()) < LEASE_REUSE_MARGIN
        )
        if lease is not None and fresh:
            self._drop(lease, name)
        if lease is None or fresh:
            lease = await self._grant(ttl, deadline, name, "acquire")
        return lease, fresh

    def _keep_for_next_attempt(
        self, state: _ProcessState, key: tuple[str, str], lease: _Lease, name: str
    ) -> None:
        """Keep a waiter's unused lease for its next attempt, and revoke it if none comes."""
        with state.mutex:
            state.pending[key] = lease
            self._reaper(state).idle(lease, name, key, self.clock.now())

    async def _took(
        self,
        state: _ProcessState,
        name: str,
        owner: str,
        lease: _Lease,
        fresh: bool,
        token: int,
        key: bytes,
    ) -> Attempt:
        start = self.clock.now()
        lease.key = key
        if not fresh:
            # A kept lease has been counting down since it was granted: restart it, so the
            # lock gets its whole TTL. If it ran out first, the key went with it.
            deadline = self._deadline()
            if await self._keepalive(lease.id, deadline, name, "acquire") <= 0:
                return Attempt(False)
            lease.refreshed = start
        if lease.ttl < lease.granted - EARLY_END:
            lease.deadline = lease.refreshed + lease.ttl
        with state.mutex:
            state.held[(name, owner)] = lease
            self._reaper(state).schedule(lease, name)
        return Attempt(True, token=token)

    # -- fair queue ---------------------------------------------------------------------

    async def _queue(
        self,
        state: _ProcessState,
        name: str,
        owner: str,
        ttl: float,
        queue_ttl: float,
        deadline: float,
    ) -> Attempt:
        """Queue a fair newcomer on a short lease of its own (or take the lock, come free).

        The place is born on that lease: a waiter that dies at any moment holds
        it only until the lease runs out, never for the lock's TTL.
        """
        keys = api.lock_keys(self.prefix, name)
        value = api.holder_value(owner, ttl)
        queue = await self._grant(queue_ttl, deadline, name, "queue for")

        def first(lease_id: int) -> dict[str, Any]:
            return api.fair_first_txn(keys, owner, value, lease_id, queue.id)

        tried = await self._attempt(state, name, owner, ttl, deadline, first, queue=queue)
        return tried.won or await self._missed(tried.holder, deadline, name)

    async def _refresh_place(
        self,
        state: _ProcessState,
        name: str,
        owner: str,
        queue_ttl: float,
        start: float,
        deadline: float,
    ) -> _Place | None:
        key = (name, owner)
        with state.mutex:
            place = state.places.get(key)
        if place is None:
            return None
        # The lock logic attempts at least every queue_ttl / 3: keeping alive at a quarter
        # of it refreshes the place well before it expires, and skips most keep-alives.
        if start - place.lease.refreshed < queue_ttl / 4:
            return place
        if await self._keepalive(place.lease.id, deadline, name, "queue for") <= 0:
            self._leave_place(state, key, place)
            return None  # the place expired (this process was paused?): queue again
        place.lease.refreshed = start
        return place

    def _leave_place(self, state: _ProcessState, key: tuple[str, str], place: _Place) -> None:
        with state.mutex:
            if state.places.get(key) is place:
                del state.places[key]

    async def leave_queue(self, name: str, owner: str) -> None:
        await self._leave_queue(name, owner)

    async def _leave_queue(self, name: str, owner: str) -> None:
        state = self._state()
        with state.mutex:
            place = state.places.pop((name, owner), None)
            unused = state.pending.pop((name, owner), None)
            if unused is not None:
                self._reaper(state).drop(unused, name, self.clock.now())
        if place is not None:
            # Revoking the place's lease deletes its key, which wakes the waiters behind.
            with contextlib.suppress(_LeaseNotFound):
                await self._revoke(place.lease.id, self._deadline(), name, "leave the queue of")
            self._bus(name).notify(name)

    # -- release, extend ----------------------------------------------------------------

    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        return await self._release(name, owner, hold_for)

    async def _release(self, name: str, owner: str, hold_for: float) -> Outcome:
        """Release a lock, or a semaphore's slot (`name` a `_SemaphoreName`)."""
        deadline = self._deadline()
        state = self._state()
        key = (name, owner)
        with state.mutex:
            lease = state.held.pop(key, None)
            unused = state.pending.pop(key, None)
            if unused is not None:
                self._reaper(state).drop(unused, name, self.clock.now())
        if hold_for > 0:
            return await self._hold(state, name, owner, lease, hold_for, deadline)
        if lease is None:
            return await self._release_by_owner(name, owner, deadline)
        trace = _Trace()
        try:
            await self._revoke(lease.id, deadline, name, "release", trace)
        except _LeaseNotFound:
            # Gone although it cannot have run out: an earlier try of this revoke was
            # applied (or, in the same instant, a force-release freed it: free either way).
            mine = trace.maybe_applied and not lease.dead
            gone = not (mine and lease.surely_left(self.clock.now()) > 0)
        except BaseException:
            # The handle forgets the lock (the lock logic does too); the reaper frees it
            # as soon as the cluster answers, else its lease runs out.
            self._drop(lease, name, announce=True)
            raise
        else:
            gone = False
        # Only now: until the revoke is through, the reaper still ends a short lease at its TTL.
        with state.mutex:
            self._reaper(state).cancel(lease)
        if gone:
            return await self._release_by_owner(name, owner, deadline)
        if lease.dead:
            # Its TTL ran out while the release was on its way.
            return await self._gone(name, None, deadline, "release")
        self._bus(name).notify(name)
        return Outcome.OK

    async def _find(
        self, name: str, owner: str, deadline: float, action: str
    ) -> tuple[api.Holder | None, Outcome]:
        """The key `owner` holds (the lock, or its semaphore slot), else None and what a
        release or extend must answer: LOST when another holds the lock, or when every
        slot of the semaphore is taken; else EXPIRED."""
        if isinstance(name, _SemaphoreName):
            view = await self._read_slots(name, deadline, action)
            mine = view.owned_by(owner)
            if mine is not None:
                return mine, Outcome.OK
            return None, self._slot_gone(view)
        holder = await self._read_holder(name, deadline, action)
        if holder is None:
            return None, Outcome.EXPIRED
        if holder.owner != owner:
            return None, Outcome.LOST
        return holder, Outcome.OK

    async def _gone(
        self, name: str, holder: api.Holder | None, deadline: float, action: str
    ) -> Outcome:
        """What a release or extend answers when the owner's key is gone, `holder` being what
        is on it now: for a lock, LOST when another holds it; for a semaphore, LOST when every
        slot is taken now. Else EXPIRED."""
        if isinstance(name, _SemaphoreName):
            return self._slot_gone(await self._read_slots(name, deadline, action))
        return Outcome.EXPIRED if holder is None else Outcome.LOST

    async def _release_by_owner(self, name: str, owner: str, deadline: float) -> Outcome:
        """Release without a record of the lease (or with a stale one): find it by owner."""
        holder, outcome = await self._find(name, owner, deadline, "release")
        if holder is None:
            return outcome
        trace = _Trace()
        try:
            await self._revoke(holder.lease, deadline, name, "release", trace)
        except _LeaseNotFound:
            if not trace.maybe_applied:
                return Outcome.EXPIRED  # it ran out between the read and the revoke
        self._bus(name).notify(name)
        return Outcome.OK

    async def _hold(
        self,
        state: _ProcessState,
        name: str,
        owner: str,
        lease: _Lease | None,
        hold_for: float,
        deadline: float,
    ) -> Outcome:
        """Keep the lock (or the slot) closed and ownerless for `hold_for` seconds, on a lease
        of its own."""
        start = self.clock.now()
        if lease is None:
            holder, outcome = await self._find(name, owner, deadline, "release")
            if holder is None:
                return outcome
            current, key = holder.lease, holder.key
        else:
            current, key = lease.id, lease.key
        hold = await self._grant(hold_for, deadline, name, "release")
        hold.key = key
        value = api.holder_value(None, hold_for)
        trace = _Trace()
        try:
            answer = await self._txn(
                api.move_txn(key, current, value, hold.id), deadline, name, "release", trace
            )
        except BaseException as exc:
            if not trace.maybe_applied and isinstance(exc, Exception):
                self._drop(hold, name)  # not applied: the hold lease carries nothing
            # Else the lock is closed on the hold lease or still on its own: either way
            # it opens when that lease runs out.
            raise
        found = api.txn_ranges(answer)
        holder = self._holder(found[0] if found else None, name)
        if not api.txn_succeeded(answer) and (holder is None or holder.lease != hold.id):
            await self._revoke_quietly(hold.id, deadline, name)
            return await self._gone(name, holder, deadline, "release")
        # (Else applied, maybe by an earlier try whose answer was lost.)
        hold.refreshed = start
        if hold_for < hold.granted - EARLY_END:
            hold.deadline = start + hold_for
        with state.mutex:
            if lease is not None:
                self._reaper(state).cancel(lease)
            self._reaper(state).schedule(hold, name)
        await self._revoke_quietly(current, deadline, name)
        return Outcome.OK

    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        return await self._extend(name, owner, ttl)

    async def _extend(self, name: str, owner: str, ttl: float) -> Outcome:
        """Extend a lock, or a semaphore's slot (`name` a `_SemaphoreName`)."""
        deadline = self._deadline()
        start = self.clock.now()
        state = self._state()
        key = (name, owner)
        with state.mutex:
            lease = state.held.get(key)
        if lease is None or lease.dead:
            holder, outcome = await self._find(name, owner, deadline, "extend")
            if holder is None:
                return outcome
            if lease is not None:
                return Outcome.EXPIRED  # being ended at its TTL by the reaper
            # Ours, but not on record.
            lease = _Lease(holder.lease, 0, holder.ttl, start, key=holder.key)
        elif ttl == lease.ttl:
            if await self._keepalive(lease.id, deadline, name, "extend") <= 0:
                holder, outcome = await self._find(name, owner, deadline, "extend")
                return outcome if holder is None else Outcome.LOST
            with state.mutex:
                if lease.dead:
                    return Outcome.EXPIRED  # ended at its TTL while the renewal was on its way
                lease.refreshed = start
                if lease.deadline is not None:
                    lease.deadline = start + ttl
                self._reaper(state).schedule(lease, name)
            return Outcome.OK
        return await self._move(state, name, owner, lease, ttl, deadline, start)

    async def _move(
        self,
        state: _ProcessState,
        name: str,
        owner: str,
        lease: _Lease,
        ttl: float,
        deadline: float,
        start: float,
    ) -> Outcome:
        """Extend to another TTL: a lease's TTL is fixed at its grant, so move the key to a
        new lease (the put keeps its create revision, so the token stays)."""
        key = (name, owner)
        new = await self._grant(ttl, deadline, name, "extend")
        new.key = lease.key
        value = api.holder_value(owner, ttl)
        current = lease.id
        for _ in range(2):
            trace = _Trace()
            try:
                answer = await self._txn(
                    api.move_txn(lease.key, current, value, new.id),
                    deadline,
                    name,
                    "extend",
                    trace,
                )
            except BaseException as exc:
                if trace.maybe_applied or not isinstance(exc, Exception):
                    # The key is on one lease or the other: forget the record, so the
                    # next extend or release finds the lease by owner.
                    with state.mutex:
                        if state.held.get(key) is lease:
                            del state.held[key]
                else:
                    self._drop(new, name)
                raise
            found = api.txn_ranges(answer)
            holder = self._holder(found[0] if found else None, name)
            if api.txn_succeeded(answer) or (holder is not None and holder.lease == new.id):
                break  # applied (maybe by an earlier try whose answer was lost)
            if holder is None or holder.owner != owner:
                await self._revoke_quietly(new.id, deadline, name)
                return await self._gone(name, holder, deadline, "extend")
            # Ours, on another lease: an earlier move that was given up on was applied
            # late. Move it from there.
            current = holder.lease
        else:
            await self._revoke_quietly(new.id, deadline, name)
            return Outcome.LOST
        new.refreshed = start
        if ttl < new.granted - EARLY_END:
            new.deadline = start + ttl
        with state.mutex:
            reaper = self._reaper(state)
            reaper.cancel(lease)
            if state.held.get(key) in (lease, None):
                state.held[key] = new
            reaper.schedule(new, name)
        for old in dict.fromkeys((current, lease.id)):
            await self._revoke_quietly(old, deadline, name)
        return Outcome.OK

    async def _end_early(self, lease: _Lease, name: str) -> None:
        """The reaper's job: the lock's TTL ran out before the server's lease would."""
        try:
            await self._revoke(lease.id, self._deadline(), name, "end")
        except _LeaseNotFound:
            return
        except BackendError as exc:
            log.debug("could not end the lease of %s %r at its TTL: %s", _kind(name), name, exc)
            return
        self._bus(name).notify(name)

    # -- inspect, force_release --------------------------------------------------------

    async def inspect(self, name: str) -> LockInfo | None:
        deadline = self._deadline()
        holder = await self._read_holder(name, deadline, "inspect")
        if holder is None:
            return None
        left = await self._seconds_left(holder, deadline, name, "inspect")
        assert left is not None
        return LockInfo(name, holder.owner, holder.token, left)

    async def force_release(self, name: str) -> bool:
        deadline = self._deadline()
        holder = await self._read_holder(name, deadline, "force-release")
        if holder is None:
            return False
        released = await self._force(holder, deadline, name)
        if released:
            self.local_bus.notify(name)
        return released

    async def _force(self, holder: api.Holder, deadline: float, name: str) -> bool:
        """Free the key `holder` was read from, whoever holds it; True when this call did."""
        trace = _Trace()
        if holder.lease == 0:
            body = {
                "compare": [
                    {
                        "key": api.b64(holder.key),
                        "target": "MOD",
                        "result": "EQUAL",
                        "mod_revision": str(holder.mod_revision),
                    }
                ],
                "success": [{"request_delete_range": {"key": api.b64(holder.key)}}],
            }
            answer = await self._txn(body, deadline, name, "force-release", trace)
            # A compare that fails after an unanswered try: that try deleted it.
            released = api.txn_succeeded(answer) or trace.maybe_applied
        else:
            try:
                # The lease belongs to that one acquisition: revoking it frees exactly the
                # holder just read, and tells it so at its next extend or release.
                await self._revoke(holder.lease, deadline, name, "force-release", trace)
                released = True
            except _LeaseNotFound:
                # It ran out on its own meanwhile, unless an unanswered try revoked it.
                released = trace.maybe_applied
        return released

    # -- semaphores ---------------------------------------------------------------------
    #
    # A slot is a lock's `holder` under another key (see `etcd_api.SemaphoreKeys`): the
    # same lease per acquisition, early end at the TTL, release by revoking the lease,
    # hold_for and extend by moving the key to a new lease. Only taking one differs.

    async def sem_try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        limit: int,
        *,
        queue_ttl: float | None = None,
    ) -> Attempt:
        deadline = self._deadline()
        start = self.clock.now()
        state = self._state()
        subject = _SemaphoreName(name)
        self._prune(state, start)
        if queue_ttl is not None:
            place = await self._refresh_place(state, subject, owner, queue_ttl, start, deadline)
            if place is not None:
                return await self._sem_attempt(state, subject, owner, ttl, limit, deadline, place)
        attempt = await self._sem_attempt(state, subject, owner, ttl, limit, deadline)
        if queue_ttl is not None and not attempt.acquired and attempt.limit is None:
            await self._sem_queue(state, subject, owner, queue_ttl, deadline)
        return attempt

    async def _sem_attempt(
        self,
        state: _ProcessState,
        name: _SemaphoreName,
        owner: str,
        ttl: float,
        limit: int,
        deadline: float,
        place: _Place | None = None,
    ) -> Attempt:
        """Take a slot while fewer waiters are ahead than slots are free: every queued waiter
        is ahead of a newcomer; a queued waiter (`place`) has those queued before it.

        Each transaction creates one slot chosen free; a choice gone stale fails, and
        what the failure read gives the next choice (`SEM_TRIES` at most). A newcomer
        chooses its first slot at random, unread, so an idle semaphore is taken in one
        transaction; a queued waiter reads first, and uses no lease until the queue
        lets it in. A transaction sent again after the first was applied fails and
        finds this owner's slot on this lease: its own success. One the call gave up
        on leaves its lease to the reaper, which revokes whatever it may have created.
        """
        keys = api.semaphore_keys(self.prefix, name)
        value = api.holder_value(owner, ttl)
        key = (name, owner)
        view: api.SlotView | None = None
        if place is not None:
            body = api.sem_view_txn(keys, owner, limit, place.revision)
            view = self._slot_view(name, await self._txn(body, deadline, name, "acquire"))
        lease: _Lease | None = None
        fresh = False
        won: tuple[int, bytes] | None = None
        missed: Attempt | None = None
        trace = _Trace()
        try:
            for _ in range(SEM_TRIES):
                if view is None:
                    index = secrets.randbelow(limit)
                else:
                    mine = None if lease is None else view.mine(owner, lease.id)
                    if mine is not None:
                        won = mine.token, mine.key
                        break
                    if view.limit is not None and view.limit != limit:
                        missed = Attempt(False, limit=view.limit)
                        break
                    free = view.free(limit)
                    if place is not None and view.place != place.revision:
                        # The place expired (this process was paused?): queue again next time.
                        self._leave_place(state, key, place)
                        missed = Attempt(False)
                        break
                    if len(free) <= view.queued:
                        break  # full, or the free slots are for waiters ahead
                    index = secrets.choice(free)
                if lease is None:
                    lease, fresh = await self._lease_for(state, name, owner, ttl, deadline)
                if view is not None and place is not None:
                    body = api.sem_take_txn(
                        keys, limit, index, owner, value, lease.id, place.revision, view.revision
                    )
                elif view is not None and view.queued:
                    body = api.sem_pass_txn(
                        keys, limit, index, owner, value, lease.id, view.revision
                    )
                else:
                    body = api.sem_acquire_txn(keys, limit, index, owner, value, lease.id)
                trace = _Trace()
                try:
                    answer = await self._txn(body, deadline, name, "acquire", trace)
                except _LeaseNotFound:
                    if fresh:
                        raise
                    # The kept lease ran out on the server sooner than expected: a new one.
                    lease, fresh = await self._grant(ttl, deadline, name, "acquire"), True
                    continue
                if api.txn_succeeded(answer):
                    won = api.txn_revision(answer), keys.slot(limit, index)
                    break
                view = self._slot_view(name, answer)
        except BaseException as exc:
            if lease is not None:
                if trace.maybe_applied or not isinstance(exc, Exception):
                    # It may hold a slot for an owner nobody will use again.
                    self._drop(lease, name, announce=True)
                elif not isinstance(exc, _LeaseNotFound):
                    self._keep_for_next_attempt(state, key, lease, name)
            raise
        if won is None:
            if lease is not None:
                if missed is not None and missed.limit is not None:
                    self._drop(lease, name)  # the caller gives up on this limit
                else:
                    self._keep_for_next_attempt(state, key, lease, name)
            if missed is not None or view is None:
                return missed or Attempt(False)
            return Attempt(False, holder_ttl=await self._soonest(view, limit, deadline, name))
        assert lease is not None
        if place is not None:
            self._leave_place(state, key, place)
            self._drop(place.lease, name)  # its key went in the same transaction
        token, slot = won
        try:
            return await self._took(state, name, owner, lease, fresh, token, slot)
        except BaseException:
            self._drop(lease, name, announce=True)  # held, but by nobody who knows
            raise

    async def _sem_queue(
        self,
        state: _ProcessState,
        name: _SemaphoreName,
        owner: str,
        queue_ttl: float,
        deadline: float,
    ) -> None:
        """Queue a newcomer on a short lease of its own, as a fair lock's waiter queues: the
        place is born on that lease, so a waiter that dies holds it only that long."""
        keys = api.semaphore_keys(self.prefix, name)
        queue = await self._grant(queue_ttl, deadline, name, "queue for")
        trace = _Trace()
        try:
            answer = await self._txn(
                api.sem_queue_txn(keys, owner, queue.id), deadline, name, "queue for", trace
            )
        except BaseException as exc:
            # Unused, or holding a place nobody will refresh.
            self._drop(queue, name, announce=trace.maybe_applied or not isinstance(exc, Exception))
            raise
        with state.mutex:
            state.places[(name, owner)] = _Place(queue, api.put_revision(answer))

    def _slot_view(self, name: str, answer: dict[str, Any]) -> api.SlotView:
        keys = api.semaphore_keys(self.prefix, name)
        try:
            return api.parse_slots(keys, answer)
        except (ValueError, TypeError, KeyError) as exc:
            raise self._foreign(name, keys.slots, exc) from exc

    async def _read_slots(self, name: str, deadline: float, action: str) -> api.SlotView:
        keys = api.semaphore_keys(self.prefix, name)
        body = api.range_request(keys.slots, prefix=True)
        return self._slot_view(name, await self._post("/v3/kv/range", body, deadline, name, action))

    @staticmethod
    def _slot_gone(view: api.SlotView) -> Outcome:
        full = view.limit is not None and len(view.holders) >= view.limit
        return Outcome.LOST if full else Outcome.EXPIRED

    async def _soonest(
        self, view: api.SlotView, limit: int, deadline: float, name: str
    ) -> float | None:
        """Seconds until the soonest slot frees when every slot is taken, else None."""
        if len(view.holders) < limit:
            return None
        soonest = math.inf
        for holder in view.holders:
            left = await self._seconds_left(holder, deadline, name, "acquire")
            soonest = min(soonest, math.inf if left is None else left)
        return soonest

    async def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        return await self._release(_SemaphoreName(name), owner, hold_for)

    async def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        return await self._extend(_SemaphoreName(name), owner, ttl)

    async def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        deadline = self._deadline()
        subject = _SemaphoreName(name)
        view = await self._read_slots(subject, deadline, "inspect")
        if view.limit is None:
            return None
        holders = []
        for holder in view.holders:
            left = await self._seconds_left(holder, deadline, subject, "inspect")
            assert left is not None
            holders.append(LockInfo(name, holder.owner, holder.token, left))
        return SemaphoreInfo(name, view.limit, tuple(holders))

    async def sem_force_release(self, name: str) -> int:
        deadline = self._deadline()
        subject = _SemaphoreName(name)
        view = await self._read_slots(subject, deadline, "force-release")
        freed = 0
        for holder in view.holders:
            # Each slot's lease belongs to that one acquisition (or hold): revoking it frees
            # exactly that slot, and tells its holder so at its next extend or release.
            freed += await self._force(holder, deadline, subject)
        if freed:
            self.semaphore_bus.notify(name)
        return freed

    async def sem_leave_queue(self, name: str, owner: str) -> None:
        await self._leave_queue(_SemaphoreName(name), owner)

    def sem_waiter(self, name: str) -> AsyncEtcdWaiter:
        return AsyncEtcdWaiter(self, _SemaphoreName(name))

    # -- cache entries ------------------------------------------------------------------
    #
    # An entry is a key holding the envelope's bytes, with its due stamp beside it (see
    # `etcd_api.cache_keys`), both on a lease shared with the entries to be kept until
    # about the same time. A claimed read is one transaction that reads, checks the
    # stamp against the generation and `due_before`, and runs the lock's own
    # acquisition transaction when due, on a spare lease kept for cache claims.

    def _generation(
        self, state: _ProcessState, gen_key: str, kv: dict[str, Any] | None
    ) -> tuple[int, int]:
        """The generation (and its key's mod revision) a read found; remembered for the next
        claimed read of the namespace."""
        try:
            seen = api.parse_generation(kv)
        except ValueError as exc:
            key = api.generation_key(self.prefix, gen_key)
            raise self._foreign(_GenerationName(gen_key), key, exc) from exc
        with state.mutex:
            if len(state.generations) >= GENERATIONS_KEPT and gen_key not in state.generations:
                state.generations.clear()
            state.generations[gen_key] = seen
        return seen

    async def _entry_lease(
        self, state: _ProcessState, keep: float, deadline: float, subject: str
    ) -> int:
        """A lease the server keeps at least `keep` seconds from now, and not much longer:
        a shared one if one fits, else a new one, which later entries share.

        A new lease is asked for `keep` and half the spread, rounded up to whole
        seconds (and raised to the cluster's minimum); a shared one fits when it
        ends no sooner than `keep` from now and no later than half a spread after
        a new one would. So an entry is kept at most the spread and a second (of
        rounding) longer than `keep` (or than the cluster's minimum lease), and
        the entries stored with about one `keep` during about half a spread share
        a lease.
        """
        now = self.clock.now()
        keep = keep if keep < KEEP_MAX else KEEP_MAX  # (infinite, or not a number)
        spread = max(ENTRY_SPREAD_MIN, keep * ENTRY_SPREAD_SHARE)
        asked = api.lease_seconds(keep + spread / 2)
        latest = now + max(asked, self._lease_floor or DEFAULT_LEASE_FLOOR) + spread / 2
        with state.mutex:
            state.entry_leases = [lease for lease in state.entry_leases if lease.low > now]
            fits = [
                lease
                for lease in state.entry_leases
                if lease.low >= now + keep and lease.high <= latest
            ]
            if fits:
                return min(fits, key=lambda lease: lease.low).id
        granted = await self._grant(asked, deadline, subject, "store")
        shared = _EntryLease(
            granted.id,
            low=granted.refreshed + granted.granted,
            high=self.clock.now() + granted.granted,
        )
        with state.mutex:
            state.entry_leases.append(shared)
            if len(state.entry_leases) > ENTRY_LEASES_KEPT:
                state.entry_leases.remove(min(state.entry_leases, key=lambda lease: lease.low))
        return shared.id

    def _forget_entry_leases(self, state: _ProcessState, ids: set[int]) -> None:
        """Forget shared leases the server no longer has (revoked by an operator, or run out
        sooner than this process's clock expected): the store that met one takes new ones."""
        with state.mutex:
            state.entry_leases = [lease for lease in state.entry_leases if lease.id not in ids]

    def _take_spare(self, state: _ProcessState, ttl: float) -> _Lease | None:
        """An unused lease for a claim of `ttl`, with enough of it surely left, if one is kept."""
        now = self.clock.now()
        asked = api.lease_seconds(ttl)
        with state.mutex:
            spares = state.spares.get(asked)
            while spares:
                lease = spares.pop()
                self._reaper(state).cancel(lease)
                if lease.surely_left(now) >= LEASE_REUSE_MARGIN:
                    return lease
                # Nearly run out: let it (it carries nothing).
            state.spares.pop(asked, None)
        return None

    def _keep_spare(self, state: _ProcessState, lease: _Lease) -> None:
        """Keep an unused claim lease for the next claimed read (revoked if none takes it)."""
        now = self.clock.now()
        with state.mutex:
            spares = state.spares.setdefault(api.lease_seconds(lease.ttl), [])
            if len(spares) < SPARES:
                spares.append(lease)
                self._reaper(state).spare(lease, now)
                return
        self._drop(lease, _CLAIMS)

    async def cache_fetch(
        self, keys: Sequence[str], gen_key: str
    ) -> tuple[list[bytes | None], int]:
        deadline = self._deadline()
        state = self._state()
        subject = _cache_subject(keys, gen_key)
        entries = [api.cache_keys(self.prefix, key).entry for key in keys]
        found: list[bytes | None] = []
        generation = 0
        # One transaction, unless the keys are too many (or too long) for one.
        for index, run in enumerate(api.batches([len(e) + 16 for e in entries], 1, reserved=1)):
            gen = api.generation_key(self.prefix, gen_key) if index == 0 else None
            body = api.cache_fetch_txn([entries[i] for i in run], gen)
            kvs = api.txn_ranges(await self._txn(body, deadline, subject, "read"))
            if index == 0:
                generation, _ = self._generation(state, gen_key, kvs.pop(0))
            found += [None if kv is None else api.unb64(kv.get("value")) for kv in kvs]
        return found, generation

    async def cache_read(self, key: str, gen_key: str, claim: Claim | None = None) -> CacheRead:
        if claim is None:
            found, generation = await self.cache_fetch([key], gen_key)
            return CacheRead(found[0], generation)
        deadline = self._deadline()
        state = self._state()
        self._prune(state, self.clock.now())
        subject = _CacheName(key)
        keys = api.cache_keys(self.prefix, key)
        gen = api.generation_key(self.prefix, gen_key)
        lock = api.lock_keys(self.prefix, claim.lock)
        value = api.holder_value(claim.owner, claim.ttl)
        with state.mutex:
            generation, believed = state.generations.get(gen_key, (0, 0))
        # Without a spare lease the first transaction only reads and checks: most reads
        # find a fresh entry, and need no lease. A due one is read again with a new lease.
        lease = self._take_spare(state, claim.ttl)
        fresh = False
        for _ in range(CLAIM_TRIES):
            attempt = None if lease is None else api.acquire_txn(lock, value, lease.id)
            bounds = api.due_bounds(generation, claim.due_before)
            body = api.cache_read_txn(keys, gen, believed, bounds, attempt)
            trace = _Trace()
            try:
                answer = await self._txn(body, deadline, subject, "read", trace)
                reading = api.parse_cache_read(answer)
                seen = self._generation(state, gen_key, reading.generation)
                holder = self._holder(reading.holder, claim.lock)
            except _LeaseNotFound:
                if lease is None or fresh:
                    raise
                # The spare ran out on the server sooner than expected (it carries nothing,
                # and nothing was applied): read again, on a new lease.
                lease, fresh = await self._grant(claim.ttl, deadline, claim.lock, "acquire"), True
                continue
            except BaseException as exc:
                if lease is not None:
                    if trace.maybe_applied or not isinstance(exc, Exception):
                        # It may hold the lock for an owner nobody will use again.
                        self._drop(lease, claim.lock, announce=True)
                    else:
                        self._keep_spare(state, lease)
                raise
            entry = None if reading.entry is None else api.unb64(reading.entry.get("value"))
            if not reading.current:
                generation, believed = seen  # cleared since last seen: decide again
                continue
            if reading.due and lease is None:
                lease, fresh = await self._grant(claim.ttl, deadline, claim.lock, "acquire"), True
                continue
            # The holder with this owner on this lease: an earlier try of this very
            # transaction was applied, and its answer lost.
            mine = (
                holder is not None
                and lease is not None
                and holder.owner == claim.owner
                and holder.lease == lease.id
            )
            if lease is not None and (reading.won or mine):
                token = holder.token if mine and holder is not None else api.txn_revision(answer)
                lease.ttl = claim.ttl
                try:
                    won = await self._took(
                        state, claim.lock, claim.owner, lease, fresh, token, lock.holder
                    )
                except BaseException:
                    self._drop(lease, claim.lock, announce=True)  # held, but by nobody who knows
                    raise
                return CacheRead(entry, seen[0], won)
            if lease is not None:
                if trace.maybe_applied:
                    # A try that was applied may have taken the lock on it before a write
                    # made the entry fresh: never share a lease that may carry a lock.
                    self._drop(lease, claim.lock, announce=True)
                else:
                    self._keep_spare(state, lease)
            return CacheRead(entry, seen[0], Attempt(False) if reading.attempted else None)
        # The namespace was cleared at every try: read, then try the lock (two steps).
        if lease is not None:
            self._keep_spare(state, lease)
        return await super().cache_read(key, gen_key, claim)

    async def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        if not items:
            return
        deadline = self._deadline()
        state = self._state()
        # A transaction may not write one key twice: the last write of a key wins.
        last = {key: (bytes(data), keep) for key, data, keep in items}
        names = list(last)
        subject = _cache_subject(names, "")
        sizes = [2 * len(api.encode(key)) + len(data) + 64 for key, (data, _) in last.items()]
        for run in api.batches(sizes, 2):
            for again in (False, True):
                ops: list[dict[str, Any]] = []
                used: set[int] = set()
                for index in run:
                    data, keep = last[names[index]]
                    keys = api.cache_keys(self.prefix, names[index])
                    if keep <= 0:
                        ops += api.cache_store_ops(keys, None, 0)
                        continue
                    lease = await self._entry_lease(state, keep, deadline, subject)
                    used.add(lease)
                    ops += api.cache_store_ops(keys, data, lease)
                try:
                    await self._txn({"compare": [], "success": ops}, deadline, subject, "store")
                except _LeaseNotFound:
                    self._forget_entry_leases(state, used)
                    if again:
                        raise
                    continue
                break

    async def cache_delete(self, key: str) -> bool:
        keys = api.cache_keys(self.prefix, key)
        trace = _Trace()
        answer = await self._txn(
            api.cache_delete_txn(keys), self._deadline(), _CacheName(key), "delete", trace
        )
        # Nothing deleted after an unanswered try: that try deleted it.
        return api.deleted(answer) > 0 or trace.maybe_applied

    async def cache_invalidate(self, key: str, keep: float) -> bool:
        if keep <= 0:
            return await self.cache_delete(key)
        deadline = self._deadline()
        state = self._state()
        subject = _CacheName(key)
        keys = api.cache_keys(self.prefix, key)
        answer = await self._post(
            "/v3/kv/range", api.range_request(keys.entry), deadline, subject, "invalidate"
        )
        kvs = answer.get("kvs") or []
        if not kvs:
            return False
        kv: dict[str, Any] | None = kvs[0]
        lease: int | None = None
        for _ in range(SWAP_TRIES):
            if kv is None:
                return True  # deleted meanwhile: it was there when this call began
            stale = mark_stale(api.unb64(kv.get("value")))  # None: not ours, delete it
            if stale is not None and lease is None:
                lease = await self._entry_lease(state, keep, deadline, subject)
            body = api.cache_swap_txn(keys, int(kv.get("mod_revision", 0)), stale, lease or 0)
            try:
                answer = await self._txn(body, deadline, subject, "invalidate")
            except _LeaseNotFound:
                self._forget_entry_leases(state, {lease or 0})
                lease = None
                continue
            if api.txn_succeeded(answer):
                return True
            # Written since it was read (by this very swap, whose answer was lost, too):
            # swap what is there now.
            found = api.txn_ranges(answer)
            kv = found[0] if found else None
        # Every swap met a newer write, made after this call began: the invalidation is
        # ordered before them, as it would have been had it come first.
        return True

    async def cache_clear(self, gen_key: str) -> int:
        deadline = self._deadline()
        state = self._state()
        subject = _GenerationName(gen_key)
        key = api.generation_key(self.prefix, gen_key)
        with state.mutex:
            generation, mod = state.generations.get(gen_key, (0, 0))
        for _ in range(SWAP_TRIES):
            body = api.generation_bump_txn(key, mod, generation + 1)
            answer = await self._txn(body, deadline, subject, "clear")
            if api.txn_succeeded(answer):
                with state.mutex:
                    state.generations[gen_key] = (generation + 1, api.txn_revision(answer))
                return generation + 1
            # Bumped since last seen (by this very bump, whose answer was lost, too: then
            # this bumps it once more, which changes nothing for readers).
            found = api.txn_ranges(answer)
            generation, mod = self._generation(state, gen_key, found[0] if found else None)
        raise BackendError(
            f"{self._where(subject, 'clear')}: it changed at each of {SWAP_TRIES} tries "
            "(other clients clear it without pause)"
        )

    async def cache_count(self, key_prefix: str) -> int | None:
        answer = await self._post(
            "/v3/kv/range",
            api.cache_count_request(self.prefix, key_prefix),
            self._deadline(),
            _Described(f"the cache keys under {key_prefix!r}"),
            "count",
        )
        return int(answer.get("count", 0))

    # -- wake-ups -----------------------------------------------------------------------

    def waiter(self, name: str) -> AsyncEtcdWaiter:
        return AsyncEtcdWaiter(self, name)

    async def _subscribe(self, name: str, event: Event) -> AsyncWatchFeed:
        """Have `event` set on every deletion under lock `name`; return once etcd confirmed it.

        Members are tried as `_post` tries them: each gets an equal share of what is
        left of the timeout to confirm the watch.
        """
        deadline = self._deadline()
        state = self._state()
        await self._authenticate(state, deadline, name, "wait for")
        tries = api.Tries(self.endpoints, self.timeout, deadline)
        renewed_token = False
        while (chosen := tries.next()) is not None:
            if chosen.pause:
                await sleep(chosen.pause)
            scope = self._scope(name)
            with state.mutex:
                feed = state.feeds.get(scope)
                if feed is None or not feed.usable:
                    feed = AsyncWatchFeed(self, state, name, scope, chosen.index, chosen.within)
                    state.feeds[scope] = feed
                    feed.start()
                feed.events.add(event)
            await feed.ready.wait(chosen.within)
            if feed.confirmed and feed.usable:
                return feed
            self._unsubscribe(feed, event)
            index, host = feed.index, self.endpoints.hosts[feed.index]
            if not feed.ready.is_set() or feed.timed_out:
                feed.abandon("no confirmation in time")
                text = f" did not confirm the watch within {chosen.within:.2g} s"
                tries.failed(index, api.Failure.SLOW, text)
                continue
            trouble = feed.trouble
            if (
                trouble in (api.Trouble.BAD_TOKEN, api.Trouble.AUTH_REQUIRED)
                and self.options.username is not None
                and not renewed_token
            ):
                renewed_token = True
                state.token = None
                await self._authenticate(state, deadline, name, "wait for")
                tries.again(index)
                continue
            if trouble is not None and trouble is not api.Trouble.ELSEWHERE:
                error = api.ServerError(trouble, feed.failure or "")
                raise self._refused(error, name, "wait for", host)
            failure = api.Failure.DOWN if trouble is None else api.Failure.BUSY
            tries.failed(index, failure, f": {feed.failure}")
        raise self._unavailable(name, "wait for", tries.problems)

    def _unsubscribe(self, feed: AsyncWatchFeed, event: Event) -> None:
        """Undo one `_subscribe`; the last waiter of a feed closes its stream."""
        state = self._process
        if state is None or feed.pid != os.getpid():
            return
        with state.mutex:
            feed.events.discard(event)
            if feed.events:
                return
            if state.feeds.get(feed.scope) is feed:
                del state.feeds[feed.scope]
        feed.stop()

    async def aclose(self) -> None:
        state = self._process
        if state is None or state.pid != os.getpid():
            self._closed = True
            return  # nothing opened, or the parent's: a forked child leaves them alone
        with state.mutex:
            feeds = list(state.feeds.values())
            state.feeds.clear()
            reaper = state.reaper
            unused = list(state.pending.values()) + [p.lease for p in state.places.values()]
            unused += [lease for spares in state.spares.values() for lease in spares]
            state.pending.clear()
            state.places.clear()
            state.spares.clear()
        for feed in feeds:
            feed.stop()
        if reaper is not None:
            unused += await reaper.aclose()
        await self._revoke_unused_at_close(unused)
        self._closed = True
        for feed in feeds:
            await feed.join()
        await state.client.aclose()
        await state.watch_client.aclose()

    async def _revoke_unused_at_close(self, leases: list[_Lease]) -> None:
        """Revoke the leases no lock of this store uses, rather than leave them to run out.

        Queue places go too (their waiters are gone with the store). At most
        `CLOSE_WITHIN` seconds, and nothing more once the cluster does not answer:
        the leases run out by themselves anyway.
        """
        deadline = time.monotonic() + min(self.timeout, CLOSE_WITHIN)
        now = self.clock.now()
        for lease in {lease.id: lease for lease in leases}.values():
            if lease.surely_left(now) <= 0 or time.monotonic() >= deadline:
                continue
            try:
                await self._revoke(lease.id, deadline, "", "clean up after closing")
            except _LeaseNotFound:
                continue
            except BackendError as exc:
                log.debug("leases left to expire on closing: %s", exc)
                return


def _tls_context(options: api.EtcdOptions) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=options.ca_file)
        if options.cert_file is not None:
            context.load_cert_chain(options.cert_file, options.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{options.server}: cannot load the TLS files (ca_file, cert_file, key_file): {exc}"
        ) from exc
    return context
