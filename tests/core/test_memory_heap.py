"""The memory store's expiry heap stays small, and rebuilding it stays cheap."""

from __future__ import annotations

import corral
from corral.core.clock import FakeClock


def test_the_expiry_heap_of_one_busy_name_stays_small() -> None:
    clock = FakeClock()
    with corral.connect("memory://", clock=clock) as store:
        lock = store.lock("x", ttl=3600)
        for _ in range(20_000):
            assert lock.acquire()
            lock.release()
        # Every cycle pushed an expiry an hour away; rebuilds keep only what is live.
        assert len(store.backend._expiries) <= 2 * 1 + 64 + 1


def test_many_queued_waiters_do_not_make_every_push_rebuild_the_heap() -> None:
    clock = FakeClock()
    with corral.connect("memory://", clock=clock) as store:
        backend = store.backend
        assert store.lock("x", ttl=3600).acquire()
        rebuilds = 0
        for index in range(2000):
            before = len(backend._expiries)
            assert not backend.try_acquire("x", f"waiter-{index}", 60, queue_ttl=30).acquired
            rebuilds += len(backend._expiries) < before
        # Doubling between rebuilds: a handful, not one per push.
        assert rebuilds <= 12
