"""What every backend's primitives promise, whatever the lock logic above them does.

These tests call the backend's primitives directly where the promise is about
one atomic step (a waiting queue that every attempt respects), and go through
the public API where it is about what a user can pass (any `str` as a name) or
what stays on the server (state per name is bounded).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral.aio import AsyncStore
from tests._async.concurrency import sleep
from tests._async.delayed import eventually
from tests.footprint import Footprint

# Names a user may pass: every `str` is a valid lock name on every backend.
ODD_NAMES = [
    "with spaces and\ttabs",
    "nul\x00byte",
    "newline\r\nin it",
    "é€😀 unicode",
    "lone \ud800 surrogate",
    "{hash-tag}",
    "%7Bescaped%7D",
    "colon:separated:name",
    "x" * 300,
    "y" * 10_000,
]


@pytest.mark.parametrize("odd", ODD_NAMES, ids=lambda n: repr(n)[:24])
async def test_any_str_is_a_lock_name(
    store: AsyncStore, other_store: AsyncStore, name: str, odd: str
) -> None:
    lock_name = f"{name}-{odd}"
    lock = store.lock(lock_name, ttl=10)
    assert await lock.acquire()
    info = await other_store.lock_info(lock_name)
    assert info is not None and info.owner == lock.owner and info.token == lock.token
    assert not await other_store.lock(lock_name, ttl=10).acquire()
    # A name that differs only past where a long name might be cut is another lock.
    sibling = other_store.lock(lock_name + "!", ttl=10)
    assert await sibling.acquire()
    await sibling.release()
    await lock.release()
    assert await other_store.lock_info(lock_name) is None


@pytest.mark.capability("fair")
async def test_every_attempt_respects_a_live_queue(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    """A free lock with a waiter queued for it goes to that waiter, not to a newcomer.

    This is what keeps the default (unfair) lock from starving a waiter: one that
    has waited too long joins the queue, and from then on nobody barges past it.
    """
    backend, other = store.backend, other_store.backend
    assert (await backend.try_acquire(name, "holder", 30)).acquired
    queued = await other.try_acquire(name, "queued", 30, queue_ttl=10)
    assert not queued.acquired
    assert await backend.release(name, "holder") is not None
    newcomer = await backend.try_acquire(name, "newcomer", 30)
    assert not newcomer.acquired
    assert await store.lock_info(name) is None
    granted = await other.try_acquire(name, "queued", 30, queue_ttl=10)
    assert granted.acquired
    await other.release(name, "queued")
    # The queue is empty again: anyone may take the free lock.
    assert (await backend.try_acquire(name, "newcomer", 30)).acquired
    await backend.release(name, "newcomer")


@pytest.mark.capability("fair")
async def test_a_dead_waiter_stalls_the_queue_only_until_its_place_expires(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    backend, other = store.backend, other_store.backend
    assert (await backend.try_acquire(name, "holder", 30)).acquired
    # A place that outlasts the next two round trips, even if the process pauses.
    assert not (await other.try_acquire(name, "dies", 30, queue_ttl=1.5)).acquired
    await backend.release(name, "holder")
    assert not (await backend.try_acquire(name, "newcomer", 30)).acquired

    async def newcomer_takes_it() -> bool:
        return (await backend.try_acquire(name, "newcomer", 30)).acquired

    await eventually(newcomer_takes_it, within=lapse(1.5))
    await backend.release(name, "newcomer")


async def test_state_per_name_is_bounded(
    store: AsyncStore,
    other_store: AsyncStore,
    footprint: Footprint,
    lapse: Callable[[float], float],
) -> None:
    """Names used once (`init-user:{id}`) leave nothing behind once released and expired,
    and tokens still strictly increase per name."""
    prefix = footprint.fresh_prefix()
    before = footprint.count(store)
    first_tokens: dict[str, int] = {}
    for index in range(600):
        lock_name = f"{prefix}:{index}"
        lock = (store if index % 2 else other_store).lock(lock_name, ttl=1)
        assert await lock.acquire()
        assert lock.token is not None
        first_tokens[lock_name] = lock.token
        if index % 5 == 3:
            await lock.release(hold_for=0.5)
        elif index % 5 == 4:
            pass  # left to expire, as a crashed holder's would
        else:
            await lock.release()
    held = store.lock(f"{prefix}:held", ttl=60)
    assert await held.acquire()
    await sleep(lapse(1.0))
    # Some backends collect expired entries as they go: a little traffic on other names
    # (whose own traces, such as a token kept for the TTL, must be gone a TTL later too).
    for index in range(100):
        lock = store.lock(f"{prefix}:traffic:{index}", ttl=1)
        assert await lock.acquire()
        await lock.release()
    await sleep(lapse(1.0))
    after = footprint.count(store)
    assert after - before <= footprint.per_held + footprint.constant, (
        f"{after - before} entries left for 1 held lock after 700 names were used once"
    )
    for lock_name in list(first_tokens)[:5]:
        again = other_store.lock(lock_name, ttl=10)
        assert await again.acquire()
        assert again.token is not None and again.token > first_tokens[lock_name]
        await again.release()
    await held.release()
