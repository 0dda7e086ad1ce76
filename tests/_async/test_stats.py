"""`store.stats()`: what a store's locks did, counted the same way on every backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from corral.aio import AsyncStore
from corral.errors import LockExpired
from tests._async.concurrency import sleep, start


def delta(before: dict[str, Any], after: dict[str, Any], key: str) -> int:
    if isinstance(after[key], dict):
        return int(after[key]["count"] - before[key]["count"])
    return int(after[key] - before[key])


async def test_stats_count_what_the_locks_did(
    store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    before = store.stats()["locks"]
    first = store.lock(name, ttl=10)
    second = store.lock(name, ttl=10)
    assert await first.acquire()
    assert not await second.acquire(wait=0)
    waiting = start(second.acquire, 20)
    await sleep(0.2)
    await first.release()
    assert await waiting.result()
    assert await store.force_release(name)
    with pytest.raises(LockExpired):
        await second.check()
    with pytest.raises(LockExpired):
        await second.release()
    renewed = store.lock(f"{name}-renewed", ttl=0.6, auto_renew=True)
    assert await renewed.acquire()
    await sleep(lapse(0.6))
    await renewed.release()
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
