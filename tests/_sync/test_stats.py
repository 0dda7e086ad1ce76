# Generated from tests/_async/test_stats.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`store.stats()`: what a store's locks did, counted the same way on every backend."""

from __future__ import annotations

from typing import Any

import pytest

from corral import Store
from corral.errors import LockExpired
from tests._sync.concurrency import sleep, start
from tests._sync.delayed import delayed, wait_until


def delta(before: dict[str, Any], after: dict[str, Any], key: str) -> int:
    if isinstance(after[key], dict):
        return int(after[key]["count"] - before[key]["count"])
    return int(after[key] - before[key])


def test_stats_count_what_the_locks_did(store: Store, name: str) -> None:
    spied, backend = delayed(store)  # no delays: it tells when an attempt was refused
    before = spied.stats()["locks"]
    first = spied.lock(name, ttl=10)
    second = spied.lock(name, ttl=10)
    assert first.acquire()
    assert not second.acquire(wait=0)
    waiting = start(second.acquire, 20)
    wait_until(lambda: backend.refused >= 2)  # waiting, however late it started
    sleep(0.2)
    first.release()
    assert waiting.result()
    assert spied.force_release(name)
    with pytest.raises(LockExpired):
        second.check()
    with pytest.raises(LockExpired):
        second.release()
    # A TTL that a pause of the process does not outlast; released once renewed.
    renewed = spied.lock(f"{name}-renewed", ttl=1.8, auto_renew=True)
    assert renewed.acquire()
    wait_until(lambda: delta(before, spied.stats()["locks"], "renewals") >= 1)
    renewed.release()
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
