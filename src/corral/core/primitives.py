"""The values that pass between the lock logic and a backend's primitives.

A backend answers every primitive with one of these plain values; the lock
logic above decides what they mean for the caller. Keeping them here, free of
I/O, is what lets one lock implementation serve every backend.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from corral.errors import BackendUnavailable

__all__ = [
    "Attempt",
    "CacheRead",
    "Claim",
    "ClientBusy",
    "LockInfo",
    "Outcome",
    "PartialFetch",
    "SemaphoreInfo",
]


@dataclass(frozen=True, slots=True)
class Attempt:
    """The answer to one atomic acquisition attempt.

    `token` is the fencing token of the new acquisition when `acquired`.
    `holder_ttl` is how many seconds the current holder has left when not
    acquired (None when unknown), so waiters can sleep until the expiry
    instead of guessing, and `fail_fast` can give up at once.
    `replicas_acked` answers `replicas=N`: how many replicas had the
    acquisition before the attempt returned (None when not asked).
    `limit` answers a semaphore attempt refused because the current holders
    took their slots with another limit: theirs (None otherwise).
    `valid_for` is how long a grant is promised, counted from before its request
    was sent, when that is less than the ttl asked (a quorum's drift allowance);
    None when the whole ttl is.
    """

    acquired: bool
    token: int | None = None
    holder_ttl: float | None = None
    replicas_acked: int | None = None
    limit: int | None = None
    valid_for: float | None = None


class Outcome(enum.Enum):
    """What a compare-and-delete or compare-and-extend found on the server."""

    OK = "ok"
    """The caller still owned the lock; the operation was applied."""
    EXPIRED = "expired"
    """Nobody holds the lock now: the caller's TTL ran out or it was forced free.

    For a semaphore: the caller's slot is gone and a slot is free now.
    """
    LOST = "lost"
    """Another owner holds the lock now.

    For a semaphore: the caller's slot is gone and every slot is taken now.
    """


@dataclass(frozen=True, slots=True)
class LockInfo:
    """What any process can see about a lock: who holds it, with which token, for how long.

    `owner` is None while a lock is closed by `release(hold_for=...)`.
    """

    name: str
    owner: str | None
    token: int
    ttl: float


@dataclass(frozen=True, slots=True)
class SemaphoreInfo:
    """What any process can see about a semaphore: its limit and who holds its slots.

    `holders` are ordered by token (oldest acquisition first); a holder's
    `owner` is None for a slot kept closed by `release(hold_for=...)`.
    """

    name: str
    limit: int
    holders: tuple[LockInfo, ...]

    @property
    def free(self) -> int:
        """How many slots are free now."""
        return max(0, self.limit - len(self.holders))


@dataclass(frozen=True, slots=True)
class Claim:
    """A recompute lock to try in the same round trip as a cache read, if the entry is due.

    The entry is due when it is missing, was written under another namespace
    generation than the current one, or both its `fresh_until` and its
    `retry_until` header fields (see `corral.core.envelope`) are at or before
    `due_before`. The backend compares; the cache policy chose `due_before`.
    The attempt is the lock's own `try_acquire(lock, owner, ttl)`.
    """

    lock: str
    owner: str
    ttl: float
    due_before: float


class ClientBusy(BackendUnavailable):
    """Every connection this process may open to a server stayed lent out for the whole
    timeout (`max_connections`): local load, not the server failing, so a pool does not
    count it against the server's health (marking it down would move its keys and refuse
    its locks while it answers everyone else)."""


class PartialFetch(BackendUnavailable):
    """A read of many entries that some servers of a pool answered and others did not.

    It carries what the answers hold (None for every key of a server that
    failed) and their generation, so the cache serves those and counts the
    failure, instead of turning one stopped server into a miss for every key.
    """

    def __init__(self, message: str, entries: Sequence[bytes | None], generation: int) -> None:
        super().__init__(message)
        self.entries = list(entries)
        self.generation = generation


@dataclass(frozen=True, slots=True)
class CacheRead:
    """The answer to one cache read: the stored bytes, the namespace generation, the claim.

    `entry` is None when nothing is stored under the key. `generation` is the
    namespace's current generation (0 when it was never cleared). `attempt` is
    the claimed recompute lock's attempt, or None when no claim was asked or
    the entry was not due.
    """

    entry: bytes | None
    generation: int
    attempt: Attempt | None = None
