"""Which key decides the server a name lives on, when a store spreads over several.

A cache entry's recompute lock must live on the entry's server: the read that
finds the entry due tries the lock in the same round trip. So its name carries
the placement of its entry, and a pool places such names by that, not by the
whole name. Everything else (locks, semaphores, elections, entries) is placed
by its own name or key.
"""

from __future__ import annotations

__all__ = ["CACHE_LOCK", "is_recompute_lock", "placement_key", "recompute_lock_name"]

CACHE_LOCK = "\x00cache:"
"""Prefix of the recompute lock of an entry placed by its own stored key."""
_SHARDED = "\x00cache@"
"""Prefix of the recompute lock of an entry placed by a shard key: `@<len>:<shard>:<stored>`."""


def recompute_lock_name(stored: str, shard: str | None = None) -> str:
    """The name of the lock that elects the one recomputer of entry `stored`."""
    if shard is None:
        return CACHE_LOCK + stored
    return f"{_SHARDED}{len(shard)}:{shard}:{stored}"


def placement_key(name: str) -> str:
    """The key a ring places `name` by: an entry's own for its recompute lock, else `name`.

    The shard's length is written before it, so a shard holding ":" or NUL is
    still read back exactly.
    """
    if name.startswith(CACHE_LOCK):
        return name[len(CACHE_LOCK) :]
    if name.startswith(_SHARDED):
        length, colon, rest = name[len(_SHARDED) :].partition(":")
        if colon and length.isdigit() and len(rest) > int(length) and rest[int(length)] == ":":
            return rest[: int(length)]
    return name


def is_recompute_lock(name: str) -> bool:
    """Whether `name` is an entry's recompute lock: it lives wherever its entry does, so a
    pool that sends the entry to another server while the first is down sends it too."""
    return name.startswith((CACHE_LOCK, _SHARDED))
