"""Capped, jittered exponential backoff for backends that cannot push wake-ups.

Jitter matters more than the curve: N pollers that start together must not
keep hitting the server in the same millisecond ("decorrelated jitter").
"""

from __future__ import annotations

import random

__all__ = ["Backoff"]

# One generator for every backoff: seeding a new one per lock costs more than the
# lock's own bookkeeping, and jitter needs no independence guarantees.
_SHARED = random.Random()


class Backoff:
    """Delays that grow from `initial` towards `cap`, each drawn at random.

    Each delay is uniform in [initial, 3 * previous], clipped to `cap`, so the
    sequence grows on average but two waiters rarely poll in lock-step.
    """

    def __init__(
        self,
        initial: float = 0.002,
        cap: float = 0.05,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or cap < initial:
            raise ValueError("backoff needs 0 < initial <= cap")
        self.initial = initial
        self.cap = cap
        self._rng = rng or _SHARED
        self._previous = initial

    def next(self) -> float:
        upper = max(self.initial, self._previous * 3)
        delay = min(self.cap, self._rng.uniform(self.initial, upper))
        self._previous = delay
        return delay

    def reset(self) -> None:
        self._previous = self.initial
