# Generated from tests/_async/test_stats.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`store.stats()`: what a store's locks did, counted the same way on every backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from corral import Store
from corral.errors import LockExpired
from tests._sync.concurrency import sleep, start


def delta(before: dict[str, Any], after: dict[str, Any], key: str) -> int:
    if isinstance(after[key], dict):
        return int(after[key]["count"] - before[key]["count"])
    return int(after[key] - before[key])


def test_stats_count_what_the_locks_did(
    store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    before = store.stats()["locks"]
    first = store.lock(name, ttl=10)
    second = store.lock(name, ttl=10)
    assert first.acquire()
    assert not second.acquire(wait=0)
    waiting = start(second.acquire, 20)
    sleep(0.2)
    first.release()
    assert waiting.result()
    assert store.force_release(name)
    with pytest.raises(LockExpired):
        second.check()
    with pytest.raises(LockExpired):
        second.release()
    renewed = store.lock(f"{name}-renewed", ttl=0.6, auto_renew=True)
    assert renewed.acquire()
    sleep(lapse(0.6))
    renewed.release()
    after = store.stats()["locks"]
    assert delta(before, after, "acquisitions") == 3
    assert delta(before, after, "contended") == 1
    assert delta(before, after, "timeouts") == 1
    assert delta(before, after, "losses") == 1
    assert delta(before, after, "renewals") >= 1
    assert delta(before, after, "renewal_failures") == 0
    assert delta(before, after, "wait_seconds") == 3
    assert delta(before, after, "hold_seconds") == 3
    waits = after["wait_seconds"]
    assert waits["buckets"]["+Inf"] == waits["count"]
    assert waits["sum"] - before["wait_seconds"]["sum"] >= 0.2  # the contended wait
