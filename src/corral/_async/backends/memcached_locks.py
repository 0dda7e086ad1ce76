"""The lock primitives on one memcached server (>= 1.6.10), for both flavours.

asyncio here; `corral._sync.backends.memcached_locks` is generated from this
file, so the compare-and-swap loops and the queue exist once. Built on
`memcached_conn` (connections, round trips) and `corral.backends.memcached_proto`
(keys, values, the queue's encoding, with no I/O).
`MemcachedLocks` holds the primitives of *one* server; a pool with client-side
sharding will place each lock on a server by `LockKeys.route` and call that
server's `MemcachedLocks`, unchanged.

**Atomicity.** memcached runs no scripts, so every primitive is built from
single-key atomic steps and compare-and-swap. Release and extend must change
the lock only if it is still the caller's, and a plain `delete` cannot say so:
a holder whose TTL ran out would delete the next holder's lock (dogpile.cache,
tooz and sherlock release that way). So both read the lock with `mg <lock> v c`
(value and CAS in one reply), check the owner, then write with the CAS they
read: `md <lock> C<cas>` (compare-and-delete), or `ms <lock> <len> C<cas>
T<ttl>` (compare-and-set, for extend and `hold_for`). The server applies the
write only if nothing touched the key in between, else answers EX (changed:
read again) or NF (gone: expired). Every round trip of one operation uses one
connection (`MemcachedClient.session`), so a CAS read before a restart is never
compared with the new server's numbers. A server started with `-C` has no CAS
at all and is refused with a clear error.

**Acquisition and fencing tokens.** The probe of an attempt, `mg <lock> N3 s c t`,
returns the lock if it is held (`s` > 0: its size, `t`: its TTL) and otherwise
makes memcached create an empty *placeholder* for it (`N3`: vivify on a miss,
for 3 s at most) and return that placeholder's CAS. In the same round trip the
attempt draws its fencing token from the server's counter, `ma <prefix>:fence`
(atomic increment). The acquisition itself is `ms <lock> C<placeholder's CAS>
T<ttl>` with value `<token>:<owner>`: a compare-and-swap that succeeds only if
nobody took the lock (nor touched the placeholder) since the probe. That is
what orders tokens: every earlier acquisition of this name drew its token
before it took the lock, and its lock was gone before our probe found the
placeholder, which came before our draw; any later acquisition draws after
finding our lock gone. No client can slip a whole acquisition in between, not
even while this one is paused between its two round trips: that acquisition
would have replaced the placeholder, and our compare-and-swap fails. (An `add`
with a token drawn before it could not promise that; one drawn after it would
need a third round trip to record the token.) Two attempts that see the same
placeholder race on its CAS; one wins, the other reads the winner's TTL in the
same round trip. A placeholder nobody takes vanishes within 3 s, and a lock
that is released is deleted, so a name leaves nothing on the server once it is
released and expired.

The counter is one item per server and prefix, for every name: tokens of one
name strictly increase because the counter does, and nothing per name has to
outlive the lock. It never expires but may be evicted, or lost with a restart
or `flush_all`: the increment then recreates it (`ma ... N0 J<now>`) at the
current time in microseconds, above every token issued before, as the Redis
backend does with the server's clock. memcached has no sub-second clock to
read, so the time is the client's that finds the counter missing: a client
whose clock is behind the highest token issued (a clock behind, or more than a
million attempts a second, each drawing one, on average since the counter was
created) could repeat a token. Keep clocks in sync (NTP) and that cannot happen
in practice.

**The waiting queue** (a fair lock's waiters, and every waiter that passes
`queue_ttl`). Each waiter has a *place*: an item `<prefix>:place:<id>` whose TTL
(ceil(queue_ttl) + 2 s) the waiter refreshes with every attempt, so a place
lives only while its waiter does. The order of arrival is a small item per
lock, `<prefix>:queue:<name>`, holding place ids: a waiter joins by appending
its id (`ms MA`, atomic; `ms ME` creates the queue when there is none, both in
one round trip), and entries are removed by compare-and-swap (a release
removes its holder's entry, `leave_queue` its waiter's, the head removes the
dead entries it skipped). The *live head* is the first entry whose place
exists. The probe reads the queue in the same round trip, so an attempt on a
free lock with no queue costs nothing more; with a queue, an attempt whose
entry is not first checks the places ahead of it (one more round trip, 16
places per round trip) and takes the lock only if none of them lives: whether
or not it passed `queue_ttl`, an attempt never takes a free lock from a live
head that is someone else. A dead waiter therefore stalls the queue at most
until its place expires. The queue item is touched by every waiting attempt
(`mg T`), so it lives as long as its longest-lived place.

What memcached cannot give: the queue check and the compare-and-swap are two
round trips, so an attempt that read the queue before a waiter's entry was
appended may still take the lock once (every attempt that starts after the
append respects it). An eviction or restart loses places or the whole queue:
waiters then rejoin at the end in whatever order their next attempts come, so
order is lost but never exclusion: the lock itself stays correct.

**Round trips.** A held lock: one per attempt (probe, queue, token; a waiter
that is not yet in the queue adds one to join it). A free lock: two (the
compare-and-swap and the winner's TTL in case it lost), plus one when entries
are ahead of the caller in the queue. Release and extend cost two, `inspect`,
`force_release` and `leave_queue` one (`leave_queue` two when it must rewrite
the queue).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from corral._async.backends.memcached_conn import Call, MemcachedClient
from corral.backends.memcached_proto import (
    CHECK_CHUNK,
    PLACEHOLDER_TTL,
    CasDisabled,
    LockKeys,
    MemcachedOptions,
    Place,
    ProtocolError,
    QueueState,
    Reply,
    decode_value,
    encode_value,
    fence_key,
    holder_ttl,
    join_requests,
    joined,
    lease_left,
    lock_keys,
    place_id,
    place_key,
    request,
    server_ttl,
)
from corral.core.primitives import Attempt, LockInfo, Outcome
from corral.errors import BackendError

__all__ = ["MemcachedLocks", "count_alive", "draw_token", "join_queue", "parse_queue"]

_ROUNDS = 3
"""Probes per attempt when the placeholder vanished or was replaced by a fresh one."""
_JOIN_TRIES = 3
_CAS_RETRIES = 8


class MemcachedLocks:
    """The lock primitives on one memcached server; safe to share between tasks (or threads,
    in the blocking flavour) and across fork."""

    def __init__(self, options: MemcachedOptions) -> None:
        self.client = MemcachedClient(options)
        self.prefix = options.prefix
        self.timeout = options.timeout
        self.server = options.server
        self._fence = fence_key(options.prefix)

    async def try_acquire(
        self, name: str, owner: str, ttl: float, queue_ttl: float | None = None
    ) -> Attempt:
        """One acquisition attempt; with `queue_ttl`, as a waiter that keeps its place.

        See "Acquisition and fencing tokens" and "The waiting queue" in the module
        docstring. Cancelled once its compare-and-swap is sent, the attempt may have
        taken the lock: the lock logic releases it after the attempt is over (see
        `memcached_conn`, "Cancellation").
        """
        seconds = server_ttl(ttl)
        keys = lock_keys(self.prefix, name)
        place = None
        if queue_ttl is not None:
            found = place_id(keys.lock, owner)
            ttl_sent = server_ttl(queue_ttl, "queue_ttl")
            place = Place(found, place_key(self.prefix, found), ttl_sent)
        async with self.client.session(name, "acquire") as call:
            for _ in range(_ROUNDS):
                attempt = await self._attempt(call, name, owner, keys, seconds, place)
                if attempt is not None:
                    return attempt
        return Attempt(False)  # placeholders kept vanishing: try again later

    async def _attempt(
        self,
        call: Call,
        name: str,
        owner: str,
        keys: LockKeys,
        seconds: int,
        place: Place | None,
    ) -> Attempt | None:
        """One probe and what follows it; None when the placeholder went away under us."""
        probes = [
            request("mg", keys.lock, f"N{PLACEHOLDER_TTL}", "s", "c", "t"),
            request("mg", keys.queue, "v", "c", "t", *([f"T{place.ttl}"] if place else [])),
            request("ma", self._fence, "N0", f"J{time.time_ns() // 1000}", "v"),
        ]
        if place is not None:  # refresh the place first: readers of the queue see it alive
            refresh = request("ms", place.key, f"T{place.ttl}", data=owner.encode(_UTF8, _SP))
            probes.insert(0, refresh)
        replies = await call(*probes)
        if place is not None and replies[0].code != b"HD":
            raise ProtocolError(f"unexpected reply {replies[0]!r} to ms")
        probe, queue_reply, drawn = replies[-3:]
        queue = self._queue(name, keys, queue_reply)
        token = self._token(name, drawn)
        if probe.code != b"HD":
            raise BackendError(
                f"lock {name!r} on {self.server}: could not acquire it: memcached did not "
                f"create its placeholder (answered {probe.code.decode('ascii', 'replace')}; "
                "out of memory?)"
            )
        join = place is not None and place.id not in queue.entries
        if probe.number("s") > 0:  # held, or closed by hold_for
            if join:
                assert place is not None
                await join_queue(call, keys.queue, place)
            return Attempt(False, holder_ttl=holder_ttl(probe))
        ahead = queue.ahead_of(None if place is None else place.id)
        joining = place if join else None
        if ahead and (await count_alive(call, self.prefix, keys.queue, ahead, 1, joining))[0]:
            return Attempt(False)  # a live waiter is ahead: every attempt respects it
        # The lock is free and no live waiter is ahead: take it, if nobody did since the probe.
        requests = []
        if ahead:  # dead waiters only: drop them from the queue (best effort)
            floor = 1 if place is None else place.ttl
            requests.append(queue.rewrite(keys.queue, queue.entries[len(ahead) :], floor))
        value = encode_value(token, owner)
        cas = probe.number("c")
        if cas == 0:
            raise CasDisabled
        requests.append(request("ms", keys.lock, f"C{cas}", f"T{seconds}", data=value))
        requests.append(request("mg", keys.lock, "s", "t"))
        stored, after = (await call(*requests))[-2:]
        if stored.code == b"HD":
            return Attempt(True, token=token)
        if stored.code not in (b"EX", b"NF"):
            raise ProtocolError(f"unexpected reply {stored!r} to ms")
        if after.code == b"HD" and after.number("s") > 0:
            return Attempt(False, holder_ttl=holder_ttl(after))  # another attempt won it
        return None  # the placeholder expired or was replaced: probe again

    def _queue(self, name: str, keys: LockKeys, reply: Reply) -> QueueState:
        return parse_queue(self.client, name, keys.queue, reply)

    def _token(self, name: str, reply: Reply) -> int:
        return draw_token(self.client, name, self._fence, reply)

    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        """Compare-and-delete by owner; with `hold_for`, compare-and-set it ownerless that long.

        The same round trips delete the owner's queue entry and place, if it has an entry.
        """
        hold = server_ttl(hold_for, "hold_for") if hold_for > 0 else None

        def change(key: str, token: int, cas: int) -> bytes:
            if hold is None:
                return request("md", key, f"C{cas}")
            closed = encode_value(token, None)
            return request("ms", key, f"C{cas}", f"T{hold}", data=closed)

        return await self._compare_and(name, owner, "release", change, leave_queue=True)

    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        """Compare-and-set the same value with a new TTL, by owner."""
        seconds = server_ttl(ttl)

        def change(key: str, token: int, cas: int) -> bytes:
            value = encode_value(token, owner)
            return request("ms", key, f"C{cas}", f"T{seconds}", data=value)

        return await self._compare_and(name, owner, "extend", change)

    async def _compare_and(
        self,
        name: str,
        owner: str,
        action: str,
        change: Callable[[str, int, int], bytes],
        *,
        leave_queue: bool = False,
    ) -> Outcome:
        """Read the lock with its CAS, check the owner, change it only if untouched since."""
        keys = lock_keys(self.prefix, name)
        async with self.client.session(name, action) as call:
            for _ in range(_CAS_RETRIES):
                reads = [request("mg", keys.lock, "v", "c")]
                if leave_queue:
                    reads.append(request("mg", keys.queue, "v", "c", "t"))
                found, *rest = await call(*reads)
                if found.code == b"EN":
                    return Outcome.EXPIRED
                if found.code != b"VA" or found.value is None:
                    raise ProtocolError(f"unexpected reply {found!r} to mg")
                if not found.value:
                    return Outcome.EXPIRED  # a placeholder: nobody holds it
                decoded = decode_value(found.value)
                if decoded is None:
                    raise self.client.foreign(name, keys.lock, found.value)
                token, holder = decoded
                if holder != owner:
                    return Outcome.LOST
                cas = found.number("c")
                if cas == 0:
                    raise CasDisabled
                writes = [change(keys.lock, token, cas)]
                if leave_queue:
                    writes += self._leave_requests(name, keys, rest[0], owner)
                done = (await call(*writes))[0]
                if done.code == b"HD":
                    return Outcome.OK
                if done.code == b"NF":
                    return Outcome.EXPIRED  # expired between the read and the write
                if done.code != b"EX":
                    raise ProtocolError(f"unexpected reply {done!r} to a compare-and-swap")
                # EX: changed since the read (this owner's own renewal, or a new holder).
            raise BackendError(
                f"lock {name!r} on {self.server}: could not {action} it: it kept changing "
                f"between reading and writing ({_CAS_RETRIES} times); retry"
            )

    def _leave_requests(
        self, name: str, keys: LockKeys, queue_reply: Reply, owner: str
    ) -> list[bytes]:
        """If the queue lists `owner`, delete its place and rewrite the queue without it.

        A holder that took a free lock without ever joining the queue may leave a
        place behind; nobody reads it (no entry points to it) and it expires, so
        a plain release sends nothing more than its compare-and-delete. A queue
        corral did not write is left alone here: it must not stop a release.
        """
        try:
            queue = self._queue(name, keys, queue_reply)
        except BackendError:
            return []
        if not queue.entries:
            return []
        place = place_id(keys.lock, owner)
        if place not in queue.entries:
            return []
        kept = [entry for entry in queue.entries if entry != place]
        return [request("md", place_key(self.prefix, place)), queue.rewrite(keys.queue, kept, 1)]

    async def leave_queue(self, name: str, owner: str) -> bool:
        """Give up a place in the queue; True when it was first (the next one may now go)."""
        keys = lock_keys(self.prefix, name)
        place = place_id(keys.lock, owner)
        async with self.client.session(name, "leave the queue of") as call:
            _, queue_reply = await call(
                request("md", place_key(self.prefix, place)),
                request("mg", keys.queue, "v", "c", "t"),
            )
            queue = self._queue(name, keys, queue_reply)
            if place in queue.entries:
                kept = [entry for entry in queue.entries if entry != place]
                # EX: changed meanwhile; the place is gone
                await call(queue.rewrite(keys.queue, kept, 1))
        return queue.entries[:1] == (place,)

    async def inspect(self, name: str) -> LockInfo | None:
        keys = lock_keys(self.prefix, name)
        async with self.client.session(name, "inspect") as call:
            (found,) = await call(request("mg", keys.lock, "v", "t"))
        if found.code == b"EN":
            return None
        if found.code != b"VA" or found.value is None:
            raise BackendError(f"lock {name!r} on {self.server}: unexpected reply {found!r}")
        if not found.value:
            return None  # a placeholder: free
        decoded = decode_value(found.value)
        if decoded is None:
            raise self.client.foreign(name, keys.lock, found.value)
        token, owner = decoded
        return LockInfo(name, owner, token, lease_left(found.number("t")))

    async def force_release(self, name: str) -> bool:
        """A plain delete, whoever holds it: for operators (`corral release --force`)."""
        keys = lock_keys(self.prefix, name)
        async with self.client.session(name, "force-release") as call:
            found, done = await call(request("mg", keys.lock, "s"), request("md", keys.lock))
        return done.code == b"HD" and found.code == b"HD" and found.number("s") > 0

    def close(self) -> None:
        self.client.close()


_UTF8, _SP = "utf-8", "surrogatepass"


async def join_queue(call: Call, queue_key: str, place: Place) -> None:
    """Append `place` to a lock's or a semaphore's queue, creating it if there is none."""
    for _ in range(_JOIN_TRIES):
        if joined(await call(*join_requests(queue_key, place))):
            return
    # Created and gone again each time: the next attempt joins.


async def count_alive(
    call: Call,
    prefix: str,
    queue_key: str,
    ahead: Sequence[str],
    enough: int,
    joining: Place | None,
) -> tuple[int, list[str]]:
    """How many places in `ahead` live (stopping at `enough`), and the dead ones seen.

    Joins the queue on the way if asked, in the first check's round trip.
    """
    join = join_requests(queue_key, joining) if joining is not None else []
    alive = 0
    dead: list[str] = []
    for start in range(0, len(ahead), CHECK_CHUNK):
        chunk = ahead[start : start + CHECK_CHUNK]
        checks = [request("mg", place_key(prefix, entry)) for entry in chunk]
        replies = await call(*checks, *join)
        if join:
            assert joining is not None
            if not joined(replies[len(checks) :]):
                await join_queue(call, queue_key, joining)
            join = []
        for entry, reply in zip(chunk, replies, strict=False):  # then the join's replies
            if reply.code == b"HD":
                alive += 1
            else:
                dead.append(entry)
        if alive >= enough:
            break
    return alive, dead


def parse_queue(
    client: MemcachedClient, name: str, key: str, reply: Reply, kind: str = "lock"
) -> QueueState:
    """The queue as an `mg <queue> v c t` reply shows it (empty when there is none)."""
    if reply.code == b"EN":
        return QueueState()
    if reply.code != b"VA" or reply.value is None:
        raise ProtocolError(f"unexpected reply {reply!r} to mg")
    entries = QueueState.parse(reply.value)
    if entries is None:
        raise client.foreign(name, key, reply.value, kind)
    return QueueState(entries, reply.number("c"), reply.number("t"))


def draw_token(
    client: MemcachedClient, name: str, fence: str, reply: Reply, kind: str = "lock"
) -> int:
    """The fencing token from the counter's `VA` reply to `ma`."""
    if reply.code != b"VA" or reply.value is None:
        raise BackendError(
            f"{kind} {name!r} on {client.server}: could not draw a fencing token from "
            f"{fence} (memcached answered {reply.code.decode('ascii', 'replace')}; "
            "out of memory?)"
        )
    if not reply.value.isdigit():
        raise client.foreign(name, fence, reply.value, kind)
    return int(reply.value)
