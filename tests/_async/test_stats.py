"""`store.stats()`: what a store's locks did, counted the same way on every backend."""

from __future__ import annotations

from typing import Any

import pytest

from corral.aio import AsyncStore
from corral.errors import LockExpired
from tests._async.concurrency import sleep, start
from tests._async.delayed import delayed, wait_until


def delta(before: dict[str, Any], after: dict[str, Any], key: str) -> int:
    if isinstance(after[key], dict):
        return int(after[key]["count"] - before[key]["count"])
    return int(after[key] - before[key])


async def test_stats_count_what_the_locks_did(store: AsyncStore, name: str) -> None:
    spied, backend = delayed(store)  # no delays: it tells when an attempt was refused
    before = spied.stats()["locks"]
    first = spied.lock(name, ttl=10)
    second = spied.lock(name, ttl=10)
    assert await first.acquire()
    assert not await second.acquire(wait=0)
    waiting = start(second.acquire, 20)
    await wait_until(lambda: backend.refused >= 2)  # waiting, however late it started
    await sleep(0.2)
    await first.release()
    assert await waiting.result()
    assert await spied.force_release(name)
    with pytest.raises(LockExpired):
        await second.check()
    with pytest.raises(LockExpired):
        await second.release()
    # A TTL that a pause of the process does not outlast; released once renewed.
    renewed = spied.lock(f"{name}-renewed", ttl=1.8, auto_renew=True)
    assert await renewed.acquire()
    await wait_until(lambda: delta(before, spied.stats()["locks"], "renewals") >= 1)
    await renewed.release()
    after = spied.stats()["locks"]
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
