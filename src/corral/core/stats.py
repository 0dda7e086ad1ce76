"""Counters and histograms of what a store's locks (and, later, caches) did.

One mechanism for every kind of object: a `Metrics` is a named set of counters
and histograms, updated under a thread lock (cheap next to any round trip) and
read as a plain snapshot. `store.stats()` returns the snapshots;
`corral.prometheus` exposes the same numbers to Prometheus. Nothing here is
per lock name: names can be unbounded (`init-user:{id}`), a metric must not be.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.core.forks import ProcessLock

__all__ = [
    "CACHE_COUNTERS",
    "CACHE_HISTOGRAMS",
    "LOCK_COUNTERS",
    "LOCK_HISTOGRAMS",
    "Histogram",
    "Metrics",
    "StoreStats",
]

# Seconds: from a fast handoff on one machine to a long wait or a long job.
SECONDS_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    3600.0,
)

LOCK_COUNTERS: Mapping[str, str] = {
    "acquisitions": "acquisitions granted by the server (re-entries not counted)",
    "contended": "acquisitions that found the lock taken at first and had to wait",
    "timeouts": "acquire() calls that gave up (wait ran out, fail_fast, or one busy attempt)",
    "losses": "acquisitions found lost: expired or taken over (renewal, extend, check, release)",
    "renewals": "successful automatic renewals",
    "renewal_failures": "automatic renewals that failed on the network and were retried",
}
LOCK_HISTOGRAMS: Mapping[str, str] = {
    "wait_seconds": "time from acquire() to the grant, for granted acquisitions",
    "hold_seconds": "time from the grant to the release",
}

CACHE_COUNTERS: Mapping[str, str] = {
    "hits": "fresh values returned (from the store or the near cache)",
    "local_hits": "of the hits, those served by the near cache (local_ttl) without a round trip",
    "misses": "reads that found no usable entry",
    "stale_served": "stale values returned (while another caller recomputes, or after an error)",
    "early_recomputes": "recomputes started before expiry (XFetch)",
    "computes": "calls of compute() that returned a value",
    "compute_errors": "calls of compute() that raised",
    "lock_waits": "callers that waited for another caller's computation",
    "lock_timeouts": "waits for another caller's computation that ran out (lock_wait)",
    "backend_errors": "reads and writes the server failed (the call went on without the cache)",
}
CACHE_HISTOGRAMS: Mapping[str, str] = {
    "compute_seconds": "how long compute() took, for calls that returned a value",
}


@dataclass(slots=True)
class Histogram:
    """Observations counted into fixed upper bounds, as Prometheus histograms are."""

    bounds: tuple[float, ...] = SECONDS_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        cumulative: dict[str, int] = {}
        running = 0
        for bound, counted in zip(self.bounds, self.counts[:-1], strict=True):
            running += counted
            cumulative[repr(bound)] = running
        cumulative["+Inf"] = self.count
        return {"count": self.count, "sum": self.total, "buckets": cumulative}


class Metrics:
    """A named set of counters and histograms, safe to update from any thread."""

    def __init__(self, counters: Iterable[str], histograms: Iterable[str]) -> None:
        self._mutex = ProcessLock()
        self._counters = dict.fromkeys(counters, 0)
        self._histograms = {name: Histogram() for name in histograms}

    def add(self, counter: str, amount: int = 1) -> None:
        with self._mutex:
            self._counters[counter] += amount

    def add_each(self, counters: tuple[str, ...]) -> None:
        """Add one to each of `counters`, under one lock (a hot path counts two at once)."""
        with self._mutex:
            for counter in counters:
                self._counters[counter] += 1

    def observe(self, histogram: str, value: float) -> None:
        with self._mutex:
            self._histograms[histogram].observe(value)

    def record(self, counters: tuple[str, ...], histogram: str, value: float) -> None:
        """Add one to each of `counters` and observe `value`, under one lock."""
        with self._mutex:
            for counter in counters:
                self._counters[counter] += 1
            self._histograms[histogram].observe(value)

    def snapshot(self) -> dict[str, Any]:
        with self._mutex:
            shot: dict[str, Any] = dict(self._counters)
            for name, histogram in self._histograms.items():
                shot[name] = histogram.snapshot()
        return shot

    def _after_fork_in_child(self) -> None:
        self._mutex = ProcessLock()


class StoreStats:
    """Everything one store counts: its locks now; its caches add their own `Metrics`."""

    def __init__(self) -> None:
        self.locks = Metrics(LOCK_COUNTERS, LOCK_HISTOGRAMS)
        # The same counts for semaphore slots (elections count as locks they are).
        self.semaphores = Metrics(LOCK_COUNTERS, LOCK_HISTOGRAMS)
        self._mutex = ProcessLock()
        self._caches: dict[str, Metrics] = {}

    def cache(self, namespace: str, counters: Iterable[str], histograms: Iterable[str]) -> Metrics:
        """The metrics of one cache namespace, made on first use."""
        with self._mutex:
            found = self._caches.get(namespace)
            if found is None:
                found = self._caches[namespace] = Metrics(counters, histograms)
            return found

    def snapshot(self) -> dict[str, Any]:
        with self._mutex:
            caches = dict(self._caches)
        return {
            "locks": self.locks.snapshot(),
            "semaphores": self.semaphores.snapshot(),
            "caches": {name: metrics.snapshot() for name, metrics in caches.items()},
        }
