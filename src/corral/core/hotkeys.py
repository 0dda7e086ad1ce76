"""Finding the keys that take an outsized share of one server's reads.

A pool spreads keys evenly, but not reads: one popular key sends all its reads
to one server, which saturates while the others idle. This finds such keys from
a sample of reads, so the cache can copy them to several servers (or keep them
near) while they are hot. Pure: the caller hands in each read's server, a
random draw and the time.

Counting is per window: a key is hot for the whole of the next window when,
in the last one, it took at least `share` of its server's sampled reads and
was sampled at least `min_samples` times (so a quiet server's only key is not
"hot"). At most `tracked` keys are counted per window; past that, keys seen
once are dropped first, which keeps memory bounded while a key read thousands
of times a window stays counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from corral.core.forks import ProcessLock

__all__ = ["HotKey", "HotKeys"]


@dataclass(frozen=True, slots=True)
class HotKey:
    key: str
    server: str
    share: float
    """Its share of its server's sampled reads in the last window."""


class HotKeys:
    def __init__(
        self,
        now: Callable[[], float],
        *,
        sample: float = 1 / 16,
        window: float = 10.0,
        share: float = 0.1,
        min_samples: int = 32,
        tracked: int = 2048,
    ) -> None:
        if not 0 < sample <= 1:
            raise ValueError(f"sample must be in (0, 1], got {sample!r}")
        self._now = now
        self.sample = sample
        self.window = window
        self.share = share
        self.min_samples = min_samples
        self.tracked = tracked
        self._window_end = now() + window
        self._keys: dict[str, tuple[str, int]] = {}
        self._servers: dict[str, int] = {}
        self._hot: dict[str, HotKey] = {}
        # Threads (or tasks of several loops) share one finder; the critical sections
        # never await, so a thread lock serves both flavours.
        self._mutex = ProcessLock()

    def observe(self, key: str, locate: Callable[[str], str], draw: float) -> None:
        """Count one read of `key` when `draw` (uniform in [0, 1)) falls in the sample.

        `locate` gives the key's server; it is only called for sampled reads.
        """
        if draw >= self.sample:
            self._roll_if_due()
            return
        with self._mutex:
            self._count(key, locate)

    def _count(self, key: str, locate: Callable[[str], str]) -> None:
        self._roll()
        known = self._keys.get(key)
        if known is None:
            if len(self._keys) >= self.tracked:
                self._keys = {k: v for k, v in self._keys.items() if v[1] > 1}
                if len(self._keys) >= self.tracked:
                    return
            server = locate(key)
            self._keys[key] = (server, 1)
        else:
            server = known[0]
            self._keys[key] = (server, known[1] + 1)
        self._servers[server] = self._servers.get(server, 0) + 1

    def is_hot(self, key: str) -> bool:
        self._roll_if_due()
        return key in self._hot

    def hot(self) -> list[HotKey]:
        """The keys hot now, the largest share first."""
        self._roll_if_due()
        return sorted(self._hot.values(), key=lambda h: (-h.share, h.key))

    def _roll_if_due(self) -> None:
        if self._now() >= self._window_end:
            with self._mutex:
                self._roll()

    def _roll(self) -> None:
        now = self._now()
        if now < self._window_end:
            return
        hot: dict[str, HotKey] = {}
        if now < self._window_end + self.window:  # counts older than one window say nothing
            for key, (server, count) in self._keys.items():
                total = self._servers.get(server, 0)
                if count >= self.min_samples and total and count / total >= self.share:
                    hot[key] = HotKey(key, server, count / total)
        self._hot = hot
        self._keys = {}
        self._servers = {}
        self._window_end = now + self.window
