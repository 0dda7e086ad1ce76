"""Cache entries on one memcached server (>= 1.6.10), for both flavours.

asyncio here; `corral._sync.backends.memcached_cache` is generated from this
file. How entries, generations and batches are kept, and why, is said in
`corral.backends.memcached_cache`, which holds what both flavours share.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from corral._async.backends.memcached_conn import MemcachedClient
from corral.backends.memcached_cache import (
    BATCH_BYTES,
    BATCH_ITEMS,
    ENTRY,
    GENERATION,
    batches,
    describe,
    opaque,
    position,
)
from corral.backends.memcached_proto import (
    CasDisabled,
    ProtocolError,
    ServerRefused,
    cache_key,
    entry_ttl,
    generation_key,
    request,
)
from corral.core.envelope import mark_stale
from corral.errors import BackendError

__all__ = ["MemcachedCache"]

_CAS_RETRIES = 8


class MemcachedCache:
    """The cache entry primitives on one memcached server; safe to share between tasks (or
    threads, in the blocking flavour)."""

    def __init__(self, client: MemcachedClient) -> None:
        self.client = client
        self.prefix = client.prefix
        self.server = client.server

    async def fetch(self, keys: Sequence[str], gen_key: str) -> tuple[list[bytes | None], int]:
        """Each key's bytes (None where missing) and the namespace's generation, one round trip.

        The opaque of each read is its position: 0 the generation, i + 1 key i.
        """
        reads = [request("mg", generation_key(self.prefix, gen_key), "v", "q", "O0")]
        reads += [
            request("mg", cache_key(self.prefix, key), "v", "q", f"O{at}")
            for at, key in enumerate(keys, start=1)
        ]
        found: list[bytes | None] = [None] * len(keys)
        generation = 0
        subject = describe(keys) if keys else f"{GENERATION} {gen_key!r}"
        async with self.client.session_about(
            subject, "read it" if len(keys) <= 1 else "read them"
        ) as s:
            for batch in batches(reads, max_bytes=BATCH_BYTES):
                for reply in await s.quiet(*batch):
                    at = position(reply, len(reads))
                    value = reply.value
                    assert value is not None  # _position checked it
                    if at == 0:
                        generation = self._generation(gen_key, value)
                    else:
                        found[at - 1] = value
        return found, generation

    def _generation(self, gen_key: str, value: bytes) -> int:
        digits = value.rstrip(b" ")  # memcached pads a number that shrank; ours only grow
        if not digits.isdigit():
            raise self.client.foreign(
                gen_key, generation_key(self.prefix, gen_key), value, GENERATION
            )
        return int(digits)

    async def store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        """Write every item in one round trip (quiet `ms`, or `md` where keep <= 0)."""
        if not items:
            return
        limit = self.client.item_size_max
        if limit is not None:
            for key, data, keep in items:
                if keep > 0 and len(data) > limit:  # surely refused: send nothing
                    raise BackendError(
                        f"{ENTRY} {key!r} on {self.server}: could not store it: "
                        + self.client.too_large(size=len(data))
                    )
        writes = []
        for at, (key, data, keep) in enumerate(items):
            where = cache_key(self.prefix, key)
            if keep <= 0:
                writes.append(request("md", where, "q", f"O{at}"))
            else:
                ttl = f"T{entry_ttl(keep)}"
                writes.append(request("ms", where, ttl, "q", f"O{at}", data=bytes(data)))
        keys = [key for key, _, _ in items]
        action = "store it" if len(items) == 1 else "store them"
        async with self.client.session_about(describe(keys), action) as s:
            try:
                replies = []
                for batch in batches(writes, max_count=BATCH_ITEMS):
                    replies += await s.quiet(*batch)
            except ServerRefused as exc:
                if b"too large" not in exc.line:
                    raise
                # The connection is closed (replies unread); the other items may be stored.
                stored = [item for item in items if item[2] > 0]
                key, data, _ = max(stored, key=lambda item: len(item[1]))
                raise BackendError(
                    f"{ENTRY} {key!r} on {self.server}: could not store it: "
                    + self.client.too_large(exc.line.decode("ascii", "replace"), len(data))
                ) from None
        for reply in replies:
            index = opaque(reply)
            if index is None or not 0 <= index < len(items):
                raise BackendError(
                    f"{describe(keys)} on {self.server}: could not {action}: unexpected reply "
                    f"{reply!r}"
                )
            key, _, keep = items[index]
            if keep <= 0 and reply.code == b"NF":
                continue  # deleting what was not there
            raise BackendError(
                f"{ENTRY} {key!r} on {self.server}: could not store it: memcached answered "
                f"{reply.code.decode('ascii', 'replace')} (out of memory, with -M?)"
            )

    async def delete(self, key: str) -> bool:
        async with self.client.session(key, "delete", ENTRY) as call:
            (done,) = await call(request("md", cache_key(self.prefix, key)))
            if done.code not in (b"HD", b"NF"):
                raise ProtocolError(f"unexpected reply {done!r} to md")
        return done.code == b"HD"

    async def invalidate(self, key: str, keep: float) -> bool:
        """Zero fresh_until by compare-and-swap, keeping the rest, for `keep` more seconds.

        Bytes that are not an entry of ours are deleted (by compare-and-swap too),
        as `keep <= 0` deletes any.
        """
        if keep <= 0:
            return await self.delete(key)
        where = cache_key(self.prefix, key)
        ttl = f"T{entry_ttl(keep)}"
        async with self.client.session(key, "invalidate", ENTRY) as call:
            for _ in range(_CAS_RETRIES):
                (found,) = await call(request("mg", where, "v", "c"))
                if found.code == b"EN":
                    return False
                if found.code != b"VA" or found.value is None:
                    raise ProtocolError(f"unexpected reply {found!r} to mg")
                cas = found.number("c")
                if cas == 0:
                    raise CasDisabled
                stale = mark_stale(found.value)
                if stale is None:
                    write = request("md", where, f"C{cas}")
                else:
                    write = request("ms", where, f"C{cas}", ttl, data=stale)
                (done,) = await call(write)
                if done.code == b"HD":
                    return True
                if done.code == b"NF":
                    return False  # deleted or expired since the read: nothing to invalidate
                if done.code != b"EX":
                    raise ProtocolError(f"unexpected reply {done!r} to a compare-and-swap")
                # EX: stored again since the read; invalidate what is there now.
        raise BackendError(
            f"{ENTRY} {key!r} on {self.server}: could not invalidate it: it kept changing "
            f"between reading and writing ({_CAS_RETRIES} times); retry"
        )

    async def clear(self, gen_key: str) -> int:
        """Increment the namespace's generation; a missing counter starts at the time in µs."""
        where = generation_key(self.prefix, gen_key)
        subject = f"{GENERATION} {gen_key!r}"
        async with self.client.session_about(subject, "increment it") as call:
            (done,) = await call(request("ma", where, "N0", f"J{time.time_ns() // 1000}", "v"))
        if done.code != b"VA" or done.value is None:
            raise BackendError(
                f"{subject} on {self.server}: could not increment it: memcached answered "
                f"{done.code.decode('ascii', 'replace')} (out of memory?)"
            )
        return self._generation(gen_key, done.value)

    async def raise_generation(self, gen_key: str, at_least: int) -> int:
        """Set the namespace's generation to max(current, `at_least`); return what it is now.

        By compare-and-swap on what it read (or an add when there is no counter), so a
        concurrent `clear` is never undone: a write that lost to one reads again. Never
        lowers the counter; when it is already at least `at_least`, nothing is written.
        A missing counter is created at `at_least` itself (not at the time, as a first
        clear would): pass a generation read elsewhere, which started at a time too.
        """
        if isinstance(at_least, bool) or not isinstance(at_least, int) or at_least < 0:
            raise ValueError(f"at_least must be an int >= 0, got {at_least!r}")
        where = generation_key(self.prefix, gen_key)
        subject = f"{GENERATION} {gen_key!r}"
        value = b"%d" % at_least
        async with self.client.session_about(subject, "raise it") as call:
            for _ in range(_CAS_RETRIES):
                (found,) = await call(request("mg", where, "v", "c"))
                if found.code == b"EN":
                    if at_least == 0:
                        # Reads as 0 already; a counter made at 0 would lose the start
                        # at the time that a first clear gives it.
                        return 0
                    # No counter: create it with no expiry, as `ma N0` would.
                    (done,) = await call(request("ms", where, "ME", "T0", data=value))
                    if done.code == b"HD":
                        return at_least
                    if done.code != b"NS":
                        raise ProtocolError(f"unexpected reply {done!r} to ms ME")
                    continue  # created meanwhile: read it
                if found.code != b"VA" or found.value is None:
                    raise ProtocolError(f"unexpected reply {found!r} to mg")
                current = self._generation(gen_key, found.value)
                if current >= at_least:
                    return current
                cas = found.number("c")
                if cas == 0:
                    raise CasDisabled
                # T0: no expiry, as the counter `ma N0` creates has none.
                (done,) = await call(request("ms", where, f"C{cas}", "T0", data=value))
                if done.code == b"HD":
                    return at_least
                if done.code not in (b"EX", b"NF"):
                    raise ProtocolError(f"unexpected reply {done!r} to a compare-and-swap")
                # EX: incremented since the read; NF: gone. Read again.
        raise BackendError(
            f"{subject} on {self.server}: could not raise it: it kept changing between "
            f"reading and writing ({_CAS_RETRIES} times); retry"
        )
