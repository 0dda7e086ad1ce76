"""A small in-process cache in front of the store (`local_ttl`): bounded, LRU, no I/O.

A hit costs a dict lookup under a thread lock, no round trip. An entry lives
at most `ttl` seconds here and never past the stored entry's own freshness,
so a near cache can only make a value older by `local_ttl`, which is the
trade the user asked for. Other processes' writes are not seen here until
then; this process's own `set`, `delete`, `invalidate` and `clear` are.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from corral.core.forks import ProcessLock

__all__ = ["NearCache"]


class NearCache:
    """One per namespace and store, shared by every handle on it, so a `delete` through
    one handle is seen through the others.

    `epoch` moves with every `discard` and `clear`: a caller takes it before a
    round trip and hands it to `put`, which drops the value if anything was
    discarded meanwhile (a read answered after this process's `delete` must not
    put the deleted value back).
    """

    def __init__(self, max_entries: int, clock: Callable[[], float]) -> None:
        self.max_entries = max_entries
        self._clock = clock
        self._mutex = ProcessLock()
        # key -> (expires_at, put_at, value)
        self._entries: OrderedDict[str, tuple[float, float, Any]] = OrderedDict()
        self.epoch = 0

    def get(self, key: str, max_age: float) -> tuple[bool, Any]:
        """(True, value) on a live hit no older than `max_age` (the asking handle's
        `local_ttl`: handles on one namespace may ask for different ones), else (False, None).

        No lock: each dict operation is atomic, and a hit is the hot path (a
        microsecond matters there). A key removed by another thread between the
        lookup and the reordering is still a hit for the value it had.
        """
        found = self._entries.get(key)
        if found is None:
            return False, None
        expires_at, put_at, value = found
        now = self._clock()
        if now - put_at > max_age:
            return False, None
        if expires_at <= now:
            with self._mutex:
                if self._entries.get(key) is found:
                    del self._entries[key]
            return False, None
        with contextlib.suppress(KeyError):
            self._entries.move_to_end(key)
        return True, value

    def put(self, key: str, value: Any, fresh_for: float, ttl: float, since: int) -> None:
        """Keep `value` for `ttl` (the handle's `local_ttl`), or less when the entry is
        fresh for less; not at all if anything was discarded since epoch `since`."""
        lifetime = min(ttl, fresh_for)
        with self._mutex:
            if since != self.epoch:
                return
            if lifetime <= 0:
                self._entries.pop(key, None)
                return
            now = self._clock()
            self._entries[key] = (now + lifetime, now, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def discard(self, key: str) -> None:
        with self._mutex:
            self.epoch += 1
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._mutex:
            self.epoch += 1
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
