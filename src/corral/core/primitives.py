"""The values that pass between the lock logic and a backend's primitives.

A backend answers every primitive with one of these plain values; the lock
logic above decides what they mean for the caller. Keeping them here, free of
I/O, is what lets one lock implementation serve every backend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Attempt", "LockInfo", "Outcome", "SemaphoreInfo"]


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
    """

    acquired: bool
    token: int | None = None
    holder_ttl: float | None = None
    replicas_acked: int | None = None
    limit: int | None = None


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
