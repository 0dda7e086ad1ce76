"""The semaphore primitives on one memcached server (>= 1.6.10), for both flavours.

asyncio here; `corral._sync.backends.memcached_slots` is generated from
this file. Built on the same pieces as the lock (`memcached_locks`, whose
docstring explains the placeholder, the fencing counter and the queue): this
module only says how `limit` slots are kept.

**Slots.** Semaphore `name` of `limit` has `limit` slot keys, `<prefix>:slot:<name>#<i>`
for 0 <= i < limit (hashed as a lock's keys are when too long or not printable),
each taken exactly as a free lock is: the probe `mg <slot> N3 v c t` returns the
slot if it is taken (value `<token>:<limit>:<owner>`, TTL `t`) and otherwise leaves
an empty placeholder and returns its CAS; the slot is then taken by `ms <slot>
C<placeholder's CAS> T<ttl>`, which succeeds only if nobody touched that slot
since the probe. An attempt probes every slot in one round trip (one write of
`limit` pipelined commands, with the fencing counter's `ma` and the queue's `mg`),
picks one of the free slots at random (waiters woken together spread over the
free slots instead of all racing for the first), and takes it by that one
compare-and-swap. So each slot is one atomic step on one key, as a lock is: at
most one holder per slot key, and there are `limit` keys, so never more than
`limit` holders, whatever the clients do in between. If the chosen slot was
taken meanwhile, the attempt probes again (at most 3 times, then it reports a
busy semaphore and the lock logic waits). An attempt therefore costs one round
trip on a full semaphore and two on one with a free slot, whatever the limit;
the probe's size grows with the limit, which is why `limit` is at most
`MAX_LIMIT` here.

**Tokens.** The lock's counter (`<prefix>:fence`, one per server and prefix) is
drawn in the probe's round trip. Per slot key the placeholder's CAS orders tokens
exactly as for a lock. Across slots: an acquisition that ends before another
begins drew its token first, so tokens strictly increase in the order of
acquisitions that do not overlap; two that overlap (both between their probe
and their compare-and-swap) may end in either order. A lock and a semaphore of
the same name draw from the same counter but never share a key.

**The limit.** Every taken slot records the limit it was taken with, and the
*header* `<prefix>:sem:<name>` records the limit of the current holders: it is
created by the first acquisition (`ms ME`: add, so of two first acquisitions
with different limits only one writes it) and raised by compare-and-swap by
every acquisition, extension and `hold_for` that would outlive it, to twice
their TTL, so it outlives every slot (and, after the last release, lingers up
to twice the TTL, then vanishes). An attempt whose limit disagrees with a
header that still has holders of its limit is refused with that limit; a
header without such holders is stale and replaced. After taking its slot an
attempt reads the header again: if another limit won it meanwhile, it gives
its slot back and is refused. `inspect` reads the header, then its `limit`
slots; release and extend go straight to the slot this process took (it
remembers the index per owner) and read every slot only when that slot is no
longer the caller's, to tell LOST (every slot taken) from EXPIRED.

**The queue** is the lock's, under `<prefix>:semqueue:<name>` with places of their
own: a waiter that keeps a place may take a slot only when fewer live places
are ahead of it than slots are free (the places ahead are checked 16 per round
trip, and the check stops as soon as enough live ones are found), and an
attempt without a place takes a slot only when the live places ahead leave one
free. A queued waiter that takes a slot deletes its place and its entry in a
third round trip.

**What memcached cannot give.** Eviction under memory pressure can drop a taken
slot (another process may then take it while the first still works: only the
fencing token protects downstream storage) or the header (the limit is then
checked only against the slots a caller reads, `[0, its limit)`, and
`inspect` reports no holders until the next acquisition writes it again). A
restart or `flush_all` forgets every slot. Two processes that disagree on the
limit and race on a free semaphore may both hold a slot for one round trip
before the loser gives its back.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from corral._async.backends.memcached_conn import Call, MemcachedClient
from corral._async.backends.memcached_locks import (
    count_alive,
    draw_token,
    join_queue,
    parse_queue,
)
from corral.backends.memcached_proto import (
    PLACEHOLDER_TTL,
    TTL_MARGIN,
    CasDisabled,
    MemcachedOptions,
    Place,
    ProtocolError,
    Reply,
    SemaphoreKeys,
    decode_slot,
    encode_slot,
    fence_key,
    fork_aware,
    lease_left,
    place_id,
    place_key,
    request,
    semaphore_keys,
    server_ttl,
)
from corral.core.primitives import Attempt, LockInfo, Outcome, SemaphoreInfo
from corral.errors import BackendError, ConfigError

__all__ = ["MAX_LIMIT", "MemcachedSemaphores"]

MAX_LIMIT = 100
"""The largest `limit` on memcached: every attempt probes all of its slots."""
_ROUNDS = 3
"""Probes per attempt when the chosen slot was taken (or its placeholder replaced) meanwhile."""
_CAS_RETRIES = 8
_REMEMBERED = 65536
"""Slot indexes remembered per process (owner -> slot); a forgotten one costs a scan."""
_KIND = "semaphore"
_UTF8, _SP = "utf-8", "surrogatepass"


@dataclass(frozen=True, slots=True)
class _Slot:
    """One slot as a read saw it."""

    index: int
    cas: int
    ttl: int
    """Whole seconds it has left (memcached's `t`; -1: no expiry)."""
    token: int = 0
    limit: int = 0
    owner: str | None = None
    taken: bool = False
    """False for a free slot (missing, or a placeholder)."""


@dataclass(frozen=True, slots=True)
class _Header:
    limit: int
    cas: int
    ttl: int


class _Remembered:
    """Which slot each owner of this process took: release and extend go straight to it."""

    def __init__(self) -> None:
        self._reset()
        fork_aware(self)

    def _reset(self) -> None:
        self._mutex = threading.Lock()
        self._slots: OrderedDict[tuple[str, str], int] = OrderedDict()

    def after_fork(self) -> None:
        self._reset()  # the child owns none of the parent's slots

    def put(self, name: str, owner: str, index: int) -> None:
        with self._mutex:
            self._slots[(name, owner)] = index
            while len(self._slots) > _REMEMBERED:
                self._slots.popitem(last=False)

    def get(self, name: str, owner: str) -> int | None:
        with self._mutex:
            return self._slots.get((name, owner))

    def forget(self, name: str, owner: str) -> None:
        with self._mutex:
            self._slots.pop((name, owner), None)


def check_limit(name: str, limit: int, server: str) -> None:
    if limit > MAX_LIMIT:
        raise ConfigError(
            f"semaphore {name!r} on {server}: limit={limit} is above {MAX_LIMIT}, the largest "
            f"limit memcached:// keeps (every attempt reads all of a semaphore's slots, so "
            "its cost grows with the limit); use a lower limit, or Redis or PostgreSQL"
        )


def _lifetime(ttl: float) -> int:
    """The whole seconds an item sent with `server_ttl(ttl)` lives at least."""
    return math.ceil(round(ttl, 6)) + TTL_MARGIN


def _header_ttl(ttl: float) -> str:
    """The `T` of a header raised for a slot of `ttl`: twice that, so raises are rare."""
    try:
        return f"T{server_ttl(2 * ttl)}"
    except ConfigError:  # twice would pass 2038: as long as the slot, then
        return f"T{server_ttl(ttl)}"


class MemcachedSemaphores:
    """The semaphore primitives on one memcached server; safe to share between tasks (or
    threads, in the blocking flavour) and across fork."""

    def __init__(self, client: MemcachedClient, options: MemcachedOptions) -> None:
        self.client = client
        self.prefix = options.prefix
        self.timeout = options.timeout
        self.server = options.server
        self._fence = fence_key(options.prefix)
        self._remembered = _Remembered()

    # -- reading ------------------------------------------------------------------

    def _slot(self, name: str, keys: SemaphoreKeys, index: int, reply: Reply) -> _Slot:
        """A slot from `mg <slot> v c t` (with or without `N`): free when missing or empty."""
        if reply.code == b"EN":
            return _Slot(index, 0, -1)
        if reply.code != b"VA" or reply.value is None:
            raise ProtocolError(f"unexpected reply {reply!r} to mg")
        cas = reply.number("c") if reply.flag("c") is not None else 0
        ttl = reply.number("t") if reply.flag("t") is not None else -1
        if not reply.value:
            return _Slot(index, cas, ttl)  # a placeholder: free
        decoded = decode_slot(reply.value)
        if decoded is None:
            raise self.client.foreign(name, keys.slot(index), reply.value, _KIND)
        token, limit, owner = decoded
        return _Slot(index, cas, ttl, token, limit, owner, taken=True)

    def _header(self, name: str, keys: SemaphoreKeys, reply: Reply) -> _Header | None:
        if reply.code == b"EN":
            return None
        if reply.code != b"VA" or reply.value is None:
            raise ProtocolError(f"unexpected reply {reply!r} to mg")
        if not reply.value.isdigit() or int(reply.value) < 1:
            raise self.client.foreign(name, keys.header, reply.value, _KIND)
        cas = reply.number("c") if reply.flag("c") is not None else 0
        ttl = reply.number("t") if reply.flag("t") is not None else -1
        return _Header(int(reply.value), cas, ttl)

    async def _read_slots(
        self, call: Call, name: str, keys: SemaphoreKeys, indexes: Iterable[int]
    ) -> list[_Slot]:
        indexes = list(indexes)
        if not indexes:
            return []
        replies = await call(*(request("mg", keys.slot(i), "v", "c", "t") for i in indexes))
        return [self._slot(name, keys, i, reply) for i, reply in zip(indexes, replies, strict=True)]

    @staticmethod
    def _raise_header(
        keys: SemaphoreKeys, header: _Header | None, limit: int, ttl: float
    ) -> list[bytes]:
        """The write that keeps the header of `limit` alive at least as long as a slot of `ttl`.

        Adds it when missing, replaces it when it names another limit (the caller
        found it stale), raises it by compare-and-swap when it would end first; a
        concurrent write wins, and the caller's read-back shows which.
        """
        value = b"%d" % limit
        if header is None:
            return [request("ms", keys.header, "ME", _header_ttl(ttl), data=value)]
        if header.limit == limit and (header.ttl < 0 or header.ttl > _lifetime(ttl)):
            return []
        if header.cas == 0:
            raise CasDisabled
        return [request("ms", keys.header, f"C{header.cas}", _header_ttl(ttl), data=value)]

    # -- acquiring ----------------------------------------------------------------

    async def try_acquire(
        self, name: str, owner: str, ttl: float, limit: int, queue_ttl: float | None = None
    ) -> Attempt:
        """One attempt to take a free slot of `limit`; see the module docstring.

        Cancelled once its compare-and-swap is sent, the attempt may have taken a
        slot: the lock logic releases it after the attempt is over, as for a lock.
        """
        check_limit(name, limit, self.server)
        seconds = server_ttl(ttl)
        keys = semaphore_keys(self.prefix, name)
        place = None
        if queue_ttl is not None:
            found = place_id(keys.header, owner)
            ttl_sent = server_ttl(queue_ttl, "queue_ttl")
            place = Place(found, place_key(self.prefix, found), ttl_sent)
        async with self.client.session(name, "acquire", _KIND) as call:
            for _ in range(_ROUNDS):
                attempt = await self._attempt(call, name, owner, keys, ttl, seconds, limit, place)
                if attempt is not None:
                    return attempt
        return Attempt(False)  # the chosen slots kept being taken first: try again later

    async def _attempt(
        self,
        call: Call,
        name: str,
        owner: str,
        keys: SemaphoreKeys,
        ttl: float,
        seconds: int,
        limit: int,
        place: Place | None,
    ) -> Attempt | None:
        """One probe of every slot and what follows it; None to probe again."""
        probes = [request("mg", keys.header, "v", "c", "t")]
        probes += [
            request("mg", keys.slot(i), f"N{PLACEHOLDER_TTL}", "v", "c", "t") for i in range(limit)
        ]
        probes += [
            request("mg", keys.queue, "v", "c", "t", *([f"T{place.ttl}"] if place else [])),
            request("ma", self._fence, "N0", f"J{time.time_ns() // 1000}", "v"),
        ]
        if place is not None:  # refresh the place first: readers of the queue see it alive
            refresh = request("ms", place.key, f"T{place.ttl}", data=owner.encode(_UTF8, _SP))
            probes.insert(0, refresh)
        replies = await call(*probes)
        if place is not None:
            if replies[0].code != b"HD":
                raise ProtocolError(f"unexpected reply {replies[0]!r} to ms")
            replies = replies[1:]
        header = self._header(name, keys, replies[0])
        for reply in replies[1 : limit + 1]:
            if reply.code != b"VA":
                raise BackendError(
                    f"semaphore {name!r} on {self.server}: could not acquire it: memcached did "
                    f"not create a slot's placeholder (answered "
                    f"{reply.code.decode('ascii', 'replace')}; out of memory?)"
                )
        slots = [self._slot(name, keys, i, reply) for i, reply in enumerate(replies[1 : limit + 1])]
        queue = parse_queue(self.client, name, keys.queue, replies[limit + 1], _KIND)
        token = draw_token(self.client, name, self._fence, replies[limit + 2], _KIND)

        theirs = await self._their_limit(call, name, keys, header, slots, limit)
        if theirs is not None:
            return Attempt(False, limit=theirs)
        join = place is not None and place.id not in queue.entries
        free = [slot for slot in slots if not slot.taken]
        if not free:
            if join:
                assert place is not None
                await join_queue(call, keys.queue, place)
            left = [slot.ttl for slot in slots if slot.ttl >= 0]
            return Attempt(False, holder_ttl=float(min(left)) if left else None)
        ahead = queue.ahead_of(None if place is None else place.id)
        dead: list[str] = []
        if ahead:
            alive, dead = await count_alive(
                call, self.prefix, keys.queue, ahead, len(free), place if join else None
            )
            if alive >= len(free):
                return Attempt(False)  # the live waiters ahead take the free slots
        # A slot is free for us: take it, if nobody touched it since the probe.
        chosen = random.choice(free)
        if chosen.cas == 0:
            raise CasDisabled
        requests = self._raise_header(keys, header, limit, ttl)
        if dead and place is None:  # drop dead waiters ahead (best effort)
            kept = [entry for entry in queue.entries if entry not in dead]
            requests.append(queue.rewrite(keys.queue, kept, 1))
        value = encode_slot(token, limit, owner)
        requests.append(
            request("ms", keys.slot(chosen.index), f"C{chosen.cas}", f"T{seconds}", "c", data=value)
        )
        requests.append(request("mg", keys.header, "v", "c", "t"))
        # Read every slot a holder of another limit could be in, after the take (one
        # connection answers in order): a holder of the limit the probe's header named
        # writes no header, so the header alone cannot show that it took a slot between
        # this probe and this attempt's replacing the header.
        span = max(limit, header.limit if header is not None else 0)
        others = [i for i in range(span) if i != chosen.index]
        requests += [request("mg", keys.slot(i), "v", "c", "t") for i in others]
        replies = await call(*requests)
        stored, after = replies[-2 - len(others) : len(replies) - len(others)]
        if stored.code in (b"EX", b"NF"):
            return None  # taken (or its placeholder replaced) since the probe: probe again
        if stored.code != b"HD":
            raise ProtocolError(f"unexpected reply {stored!r} to ms")
        self._remembered.put(name, owner, chosen.index)
        winner = self._header(name, keys, after)
        mixed = [
            slot
            for slot in (
                self._slot(name, keys, i, reply)
                for i, reply in zip(others, replies[len(replies) - len(others) :], strict=True)
            )
            if slot.taken and slot.limit != limit
        ]
        if (winner is not None and winner.limit != limit) or mixed:
            # Another limit won the header meanwhile, or holds a slot beside ours: its
            # holders are the semaphore (two such racers may both give back; the next
            # attempts find the header to go by).
            await self._give_back(call, keys, chosen.index, stored)
            self._remembered.forget(name, owner)
            if winner is not None and winner.limit != limit:
                return Attempt(False, limit=winner.limit)
            # This attempt replaced the header with its own limit: put the holders'
            # back, or a later attempt of this limit would not look at their slots.
            other = mixed[0]
            await call(
                request(
                    "ms",
                    keys.header,
                    _header_ttl(float(max(other.ttl, 1))),
                    data=b"%d" % other.limit,
                )
            )
            return Attempt(False, limit=other.limit)
        follow = self._raise_header(keys, winner, limit, ttl)  # lost a race to a shorter raise
        if place is not None:  # served from the queue: leave it, so nobody waits behind us
            follow.append(request("md", place.key))
            kept = [entry for entry in queue.entries if entry not in dead and entry != place.id]
            if len(kept) < len(queue.entries):
                follow.append(queue.rewrite(keys.queue, kept, 1))  # EX: changed; place is gone
        if follow:
            await call(*follow)
        return Attempt(True, token=token)

    async def _their_limit(
        self,
        call: Call,
        name: str,
        keys: SemaphoreKeys,
        header: _Header | None,
        slots: Sequence[_Slot],
        limit: int,
    ) -> int | None:
        """The holders' limit when it is not `limit`, else None (the caller may go on)."""
        if header is not None and header.limit != limit:
            seen = [slot for slot in slots if slot.taken]
            if header.limit > limit:  # its holders may be beyond what the probe read
                seen += await self._read_slots(call, name, keys, range(limit, header.limit))
            if any(slot.limit == header.limit for slot in seen):
                return header.limit
            header = None  # stale: nobody holds a slot with its limit; it will be replaced
        if header is None:  # no header to go by: the holders in sight decide
            for slot in slots:
                if slot.taken and slot.limit != limit:
                    return slot.limit
        return None

    async def _give_back(self, call: Call, keys: SemaphoreKeys, index: int, stored: Reply) -> None:
        """Delete the slot just taken, if it is still as stored (its CAS from `ms ... c`)."""
        cas = stored.flag("c")
        if cas is not None and cas.isdigit() and int(cas):
            await call(request("md", keys.slot(index), f"C{int(cas)}"))

    # -- holding ------------------------------------------------------------------

    async def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        """Compare-and-delete the owner's slot; with `hold_for`, keep it closed that long."""
        hold = server_ttl(hold_for, "hold_for") if hold_for > 0 else None

        def change(key: str, slot: _Slot) -> bytes:
            if hold is None:
                return request("md", key, f"C{slot.cas}")
            closed = encode_slot(slot.token, slot.limit, None)
            return request("ms", key, f"C{slot.cas}", f"T{hold}", data=closed)

        try:
            return await self._compare_and(name, owner, "release", change, hold_for or None)
        finally:
            self._remembered.forget(name, owner)

    async def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        """Compare-and-set the owner's slot with a new TTL."""
        seconds = server_ttl(ttl)

        def change(key: str, slot: _Slot) -> bytes:
            value = encode_slot(slot.token, slot.limit, owner)
            return request("ms", key, f"C{slot.cas}", f"T{seconds}", data=value)

        outcome = await self._compare_and(name, owner, "extend", change, ttl)
        if outcome is not Outcome.OK:
            self._remembered.forget(name, owner)
        return outcome

    async def _compare_and(
        self,
        name: str,
        owner: str,
        action: str,
        change: Callable[[str, _Slot], bytes],
        lasting: float | None,
    ) -> Outcome:
        """Find the owner's slot, change it only if untouched since; raise the header to last."""
        keys = semaphore_keys(self.prefix, name)
        async with self.client.session(name, action, _KIND) as call:
            for _ in range(_CAS_RETRIES):
                header, found = await self._find(call, name, keys, owner)
                if isinstance(found, Outcome):
                    return found
                if found.cas == 0:
                    raise CasDisabled
                writes = [change(keys.slot(found.index), found)]
                if lasting is not None and (header is None or header.limit == found.limit):
                    # Keep the header at least as long (re-adding it if it was evicted);
                    # one naming another limit is left alone: it is the identity.
                    writes += self._raise_header(keys, header, found.limit, lasting)
                done = (await call(*writes))[0]
                if done.code == b"HD":
                    return Outcome.OK
                if done.code not in (b"EX", b"NF"):
                    raise ProtocolError(f"unexpected reply {done!r} to a compare-and-swap")
                # Changed or gone since the read: read again (LOST or EXPIRED if gone).
            raise BackendError(
                f"semaphore {name!r} on {self.server}: could not {action} its slot: it kept "
                f"changing between reading and writing ({_CAS_RETRIES} times); retry"
            )

    async def _find(
        self, call: Call, name: str, keys: SemaphoreKeys, owner: str
    ) -> tuple[_Header | None, _Slot | Outcome]:
        """The header and the owner's slot, or LOST / EXPIRED when the owner has none."""
        index = self._remembered.get(name, owner)
        reads = [request("mg", keys.header, "v", "c", "t")]
        if index is not None:
            reads.append(request("mg", keys.slot(index), "v", "c", "t"))
        replies = await call(*reads)
        header = self._header(name, keys, replies[0])
        if index is not None:
            slot = self._slot(name, keys, index, replies[1])
            if slot.taken and slot.owner == owner:
                return header, slot
        # Not where it was taken (or taken by another process): read every slot.
        slots = await self._read_slots(
            call, name, keys, range(header.limit if header else MAX_LIMIT)
        )
        for slot in slots:
            if slot.taken and slot.owner == owner:
                self._remembered.put(name, owner, slot.index)
                return header, slot
        taken = [slot for slot in slots if slot.taken]
        limit = header.limit if header is not None else min((s.limit for s in taken), default=0)
        return header, Outcome.LOST if taken and len(taken) >= limit else Outcome.EXPIRED

    # -- looking and operating ----------------------------------------------------

    async def inspect(self, name: str) -> SemaphoreInfo | None:
        """The header's limit and the live slots, oldest token first; None when none is taken."""
        keys = semaphore_keys(self.prefix, name)
        async with self.client.session(name, "inspect", _KIND) as call:
            (reply,) = await call(request("mg", keys.header, "v", "c", "t"))
            header = self._header(name, keys, reply)
            if header is None:
                return None  # the header outlives every slot
            slots = await self._read_slots(call, name, keys, range(header.limit))
        taken = sorted((slot for slot in slots if slot.taken), key=lambda slot: slot.token)
        if not taken:
            return None
        return SemaphoreInfo(
            name,
            header.limit,
            tuple(LockInfo(name, s.owner, s.token, lease_left(s.ttl)) for s in taken),
        )

    async def force_release(self, name: str) -> int:
        """Delete every slot (up to `MAX_LIMIT`, whatever the limit) and the header."""
        keys = semaphore_keys(self.prefix, name)
        requests = []
        for index in range(MAX_LIMIT):
            requests += [request("mg", keys.slot(index), "s"), request("md", keys.slot(index))]
        requests.append(request("md", keys.header))
        async with self.client.session(name, "force-release", _KIND) as call:
            replies = await call(*requests)
        freed = 0
        for found, done in zip(replies[0:-1:2], replies[1:-1:2], strict=True):
            if found.code == b"HD" and found.number("s") > 0 and done.code == b"HD":
                freed += 1
        return freed

    async def leave_queue(self, name: str, owner: str) -> None:
        """Give up a place in the queue: delete the place and the entry."""
        keys = semaphore_keys(self.prefix, name)
        place = place_id(keys.header, owner)
        async with self.client.session(name, "leave the queue of", _KIND) as call:
            _, reply = await call(
                request("md", place_key(self.prefix, place)),
                request("mg", keys.queue, "v", "c", "t"),
            )
            queue = parse_queue(self.client, name, keys.queue, reply, _KIND)
            if place in queue.entries:
                kept = [entry for entry in queue.entries if entry != place]
                # EX: changed meanwhile; the place is gone
                await call(queue.rewrite(keys.queue, kept, 1))
