"""Cache entries on one memcached server (>= 1.6.10): what both flavours share, with no I/O.

The steps themselves (round trips) are `MemcachedCache` in
`corral._async.backends.memcached_cache` and its generated blocking twin; this
module has what they build their requests with, and says how entries are kept.

**Keys.** An entry lives under `<prefix>:cache:<key>` and a namespace's
generation under `<prefix>:gen:<gen key>`; a key that memcached would refuse
(over 250 bytes, spaces, control characters, non-ASCII, lone surrogates) is
hashed as a lock name is (`<prefix>:cache#<readable part>#<32 hex digits of
sha256>`), so any `str` is a key, deterministically, and neither kind ever
shares a key with a lock, a semaphore or the other kind.

**Entries** are the envelope's bytes as they are, kept by memcached's own
expiry: `T<ceil(keep) + 2>` (memcached counts whole seconds on a clock that
ticks once a second, so an entry lives at least `keep` seconds and at most 3 s
more; past 30 days as a Unix time; past 2038, or forever, `T0`, kept until
deleted or evicted). Freshness is the envelope's fresh_until, read by the
clients; the server's expiry only bounds how long an entry is kept, so an
expired entry leaves nothing behind. Eviction under memory pressure can drop
any entry earlier (a miss, never a wrong value).

**Round trips.** `fetch`: one write of `mg <key> v q O<i>` per key with the
generation's `mg` and a no-op `mn`: quiet mode leaves misses unanswered and
the opaque `O<i>` says which key each hit answers, so a read of many keys is
one round trip. Very many keys (over about 32 KiB of requests, a hundred keys
of 250 bytes or a thousand short ones) are split into writes of that size, one
round trip each: memcached stops reading a connection whose replies back up,
so a client still writing a long pipeline while megabytes of values come back
would wait for a server that waits for it, until the timeout. `store`: one
write of quiet `ms` (and quiet `md` for `keep <= 0`) and `mn`, one round trip
for up to 2048 items, however large; not atomic across keys. `delete`: one
`md`. `clear`: one `ma` (atomic increment). `raise_generation`: `mg v c`, then a
compare-and-swap (`ms C<cas>`, or `ms ME` to create it), again when it changed
in between. `invalidate`: `mg v c`, then, by
compare-and-swap on what it read, `ms C<cas>` with the same bytes but
fresh_until zeroed (two round trips, again when the entry changed in between),
so a store that lands meanwhile is never overwritten with the old value.

**Generations.** `clear` increments the namespace's counter with `ma`, which
creates a missing counter (`N0`: no expiry) at the current time in
microseconds rather than at 1: a counter that memcached evicted while entries
written under its later values survive must not, when recreated, come back
to a value those entries carry, or a clear would be undone. So the first
clear of a namespace returns a large number, every later one that number plus
one, and a counter lost and recreated restarts above every generation issued
before it (given clocks in sync, as for the fencing counter). `raise_generation`
sets the counter to at least a given number (a generation learned elsewhere),
never lowering it, by compare-and-swap on what it read, so it never undoes a
concurrent clear; a counter it creates has no expiry either. A namespace
never cleared reads as generation 0. A lost counter reads as 0 until the next
clear: entries written before the namespace's first clear that are still kept
would then be read again, which only an eviction of the hot counter item
ahead of those entries (another slab class under pressure) can bring about.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from corral.backends.memcached_proto import ProtocolError, Reply

__all__ = [
    "BATCH_BYTES",
    "BATCH_ITEMS",
    "ENTRY",
    "GENERATION",
    "batches",
    "describe",
    "opaque",
    "position",
]

BATCH_BYTES = 32 * 1024
"""Request bytes per write of a multi-key read: far below what the sockets buffer, so the
write never waits for the server while the server waits to write its replies."""
BATCH_ITEMS = 2048
"""Items per write of a store: each may answer (a miss of a delete), so their replies stay
far below what the sockets buffer, however large the values sent."""
ENTRY = "cache entry"
GENERATION = "cache namespace generation"


def describe(keys: Sequence[str]) -> str:
    """The keys an operation touches, for its error messages."""
    if len(keys) == 1:
        return f"{ENTRY} {keys[0]!r}"
    shown = ", ".join(repr(key) for key in keys[:2])
    more = f" and {len(keys) - 2} more" if len(keys) > 2 else ""
    return f"cache entries {shown}{more}"


def batches(
    requests: Sequence[bytes], *, max_bytes: float = math.inf, max_count: float = math.inf
) -> Iterator[list[bytes]]:
    """`requests` in consecutive writes of at most `max_count` requests and, unless one
    request alone is larger, at most `max_bytes` bytes."""
    batch: list[bytes] = []
    size = 0
    for item in requests:
        if batch and (size + len(item) > max_bytes or len(batch) >= max_count):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += len(item)
    if batch:
        yield batch


def opaque(reply: Reply) -> int | None:
    """The opaque (`O<n>`) a reply carries back, as a number."""
    raw = reply.flag("O")
    return int(raw) if raw is not None and raw.isdigit() else None


def position(reply: Reply, count: int) -> int:
    """Which read a quiet `mg` hit answers, by its opaque; ProtocolError for anything else."""
    at = opaque(reply)
    if reply.code != b"VA" or reply.value is None or at is None or not 0 <= at < count:
        raise ProtocolError(f"unexpected reply {reply!r} to a quiet mg")
    return at
