"""The lock contract: the same behaviour on every backend, in both flavours.

Small TTLs and real sleeps are used where expiry itself is the behaviour under
test; assertions are about what happened, never about how fast.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import pytest

from corral.aio import AsyncStore
from corral.errors import (
    ConfigError,
    LockError,
    LockExpired,
    LockLost,
    LockTimeout,
)
from tests._async.concurrency import sleep, start
from tests._async.delayed import delayed, eventually, wait_until


async def test_acquire_release_and_identity(store: AsyncStore, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.token is None and lock.owner is None
    assert await lock.acquire()
    assert isinstance(lock.token, int) and lock.token > 0
    assert lock.owner is not None
    host, pid = lock.owner.split(":")[:2]
    assert host == socket.gethostname() and pid == str(os.getpid())
    assert lock.held
    info = await store.lock_info(name)
    assert info is not None
    assert info.owner == lock.owner and info.token == lock.token
    assert 0 < info.ttl <= 10
    assert await lock.locked() and await lock.owned()
    await lock.release()
    assert not lock.held and lock.token is None
    assert await store.lock_info(name) is None
    assert not await lock.locked()


async def test_only_one_holder(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    first = store.lock(name, ttl=10)
    second = other_store.lock(name, ttl=10)
    assert await first.acquire()
    assert not await second.acquire()
    assert not await second.acquire(wait=0.2)
    assert second.token is None and not second.held
    await first.release()
    assert await second.acquire()
    await second.release()


async def test_tokens_strictly_increase(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    tokens = []
    for i in range(6):
        lock = (store if i % 2 else other_store).lock(name, ttl=10)
        assert await lock.acquire()
        assert lock.token is not None
        tokens.append(lock.token)
        if i == 3:
            assert await store.force_release(name)
        else:
            await lock.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


async def test_release_of_unheld_handle_is_an_error(store: AsyncStore, name: str) -> None:
    lock = store.lock(name, ttl=10)
    with pytest.raises(LockError, match=name):
        await lock.release()
    holder = store.lock(name, ttl=10)
    assert await holder.acquire()
    with pytest.raises(LockError):
        await lock.release()
    assert await holder.owned()  # the failed release freed nothing
    await holder.release()


async def test_expired_then_taken_is_lost(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    stale = store.lock(name, ttl=0.3)
    assert await stale.acquire()
    await sleep(lapse(0.3))
    fresh = other_store.lock(name, ttl=10)
    assert await fresh.acquire()
    assert fresh.token is not None and stale.token is not None
    assert fresh.token > stale.token
    with pytest.raises(LockLost, match=name):
        await stale.extend()
    with pytest.raises(LockLost, match=name):
        await stale.release()
    assert await fresh.owned()  # the stale holder freed nothing
    await fresh.release()


async def test_expired_and_free_is_expired(
    store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    lock = store.lock(name, ttl=0.3)
    assert await lock.acquire()
    await sleep(lapse(0.3))
    with pytest.raises(LockExpired, match=name):
        await lock.release()
    assert await lock.acquire()
    await sleep(lapse(0.3))
    with pytest.raises(LockExpired):
        await lock.extend()


async def test_extend_resets_ttl(
    store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    # The extend comes before the TTL runs out, even if the process pauses.
    lock = store.lock(name, ttl=1.5)
    assert await lock.acquire()
    await lock.extend(ttl=10)
    info = await store.lock_info(name)
    assert info is not None and info.ttl > 5
    await sleep(lapse(1.5))
    assert await lock.owned()
    await lock.extend()  # back to the lock's own ttl
    info = await store.lock_info(name)
    assert info is not None and info.ttl <= lapse(1.5)
    await lock.release()


async def test_release_hold_for_keeps_it_closed(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    lock = store.lock(name, ttl=10)
    assert await lock.acquire()
    token = lock.token
    await lock.release(hold_for=1.5)  # outlasts the next round trips, even if paused
    info = await store.lock_info(name)
    assert info is not None and info.owner is None and info.token == token
    assert await lock.locked()
    other = other_store.lock(name, ttl=10)
    assert not await other.acquire()
    await eventually(other.acquire, within=lapse(1.5))
    assert other.token is not None and token is not None and other.token > token
    await other.release()


async def test_waiter_gets_lock_when_released(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    holder = store.lock(name, ttl=30)
    assert await holder.acquire()

    async def wait_for_it() -> int | None:
        waiter = other_store.lock(name, ttl=30)
        assert await waiter.acquire(wait=20)
        token = waiter.token
        await waiter.release()
        return token

    job = start(wait_for_it)
    await sleep(0.3)
    assert not job.done()
    await holder.release()
    token = await job.result()
    assert token is not None and holder.token is None and token > 0


async def test_waiter_gets_lock_when_ttl_runs_out(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    holder = store.lock(name, ttl=0.5)
    assert await holder.acquire()
    waiter = other_store.lock(name, ttl=10)
    assert await waiter.acquire(wait=10)
    assert waiter.token is not None and holder.token is not None
    assert waiter.token > holder.token
    await waiter.release()


async def test_wait_gives_up(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    holder = store.lock(name, ttl=30)
    assert await holder.acquire()
    waiter = other_store.lock(name, ttl=30, wait=0.3)
    assert not await waiter.acquire()
    assert not waiter.held
    assert await holder.owned()
    await holder.release()


async def test_fail_fast_does_not_wait_for_a_long_holder(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    holder = store.lock(name, ttl=300)
    assert await holder.acquire()
    waiter = other_store.lock(name, ttl=30)

    async def try_it() -> bool:
        return await waiter.acquire(wait=120, fail_fast=True)

    job = start(try_it)
    for _ in range(200):  # give it a moment to give up by itself
        if job.done():
            break
        await sleep(0.05)
    # Had it kept waiting, this release would hand it the lock well within its 120 s.
    await holder.release()
    assert await job.result() is False
    assert not waiter.held


async def test_fail_fast_still_waits_for_a_short_holder(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    holder = store.lock(name, ttl=0.4)
    assert await holder.acquire()
    waiter = other_store.lock(name, ttl=30)
    assert await waiter.acquire(wait=10, fail_fast=True)
    await waiter.release()


async def test_context_manager(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    async with store.lock(name, ttl=10) as lock:
        assert await lock.owned()
        with pytest.raises(LockTimeout, match=name):
            async with other_store.lock(name, ttl=10, wait=0.1):
                pass
    assert await store.lock_info(name) is None
    with pytest.raises(ZeroDivisionError):
        async with store.lock(name, ttl=10):
            1 / 0  # noqa: B018
    assert await store.lock_info(name) is None


async def test_context_manager_reports_loss_on_exit(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    with pytest.raises(LockLost):
        async with store.lock(name, ttl=0.3):
            await sleep(lapse(0.3))
            assert await other_store.lock(name, ttl=10).acquire()
    assert await store.force_release(name)
    with pytest.raises(LockExpired):
        async with store.lock(name, ttl=0.3):
            await sleep(lapse(0.3))


async def test_context_manager_never_masks_the_error_in_flight(
    store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    with pytest.raises(KeyError) as caught:
        async with store.lock(name, ttl=0.3):
            await sleep(lapse(0.3))
            raise KeyError("the real problem")
    notes = getattr(caught.value, "__notes__", [])
    assert any(name in note for note in notes)


async def test_reentrant(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    lock = store.lock(name, ttl=10, reentrant=True)
    assert await lock.acquire()
    token = lock.token
    assert await lock.acquire()
    assert lock.token == token
    await lock.release()
    assert await lock.owned()
    assert not await other_store.lock(name, ttl=10).acquire()
    await lock.release()
    assert await store.lock_info(name) is None


async def test_non_reentrant_second_acquire_is_an_error(store: AsyncStore, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert await lock.acquire()
    with pytest.raises(LockError, match="reentrant"):
        await lock.acquire()
    assert await lock.owned()
    await lock.release()


async def test_auto_renew_keeps_it(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    # Renewed every TTL/3, the lock outlives its TTL only through renewals (two at least);
    # the TTL leaves a renewal 1.2 s to be answered, as a machine running the suite's
    # parts side by side can pause a process for a second or more.
    lock = store.lock(name, ttl=1.8, auto_renew=True)
    assert await lock.acquire()
    await sleep(2.6)
    assert await lock.owned()
    assert not await other_store.lock(name, ttl=10).acquire()
    await lock.check()
    await lock.release()
    assert await store.lock_info(name) is None


async def test_auto_renew_reports_loss(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    lost = []
    # Force-released, not lost to a paused renewal.
    lock = store.lock(name, ttl=1.8, auto_renew=True, on_lost=lost.append)
    assert await lock.acquire()
    assert await other_store.force_release(name)
    await wait_until(lambda: bool(lost))
    assert lost == [lock]
    assert not lock.held
    with pytest.raises(LockExpired):
        await lock.check()
    with pytest.raises(LockExpired):
        await lock.extend()
    with pytest.raises(LockExpired):
        await lock.release()


async def test_check_owned_locked(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    lock = store.lock(name, ttl=0.3)
    assert not await lock.locked()
    assert not await lock.owned()
    assert await lock.acquire()
    await lock.check()
    await sleep(lapse(0.3))
    assert not await lock.owned()
    other = other_store.lock(name, ttl=10)
    assert await other.acquire()
    with pytest.raises(LockLost):
        await lock.check()
    assert await lock.locked()
    await other.release()


async def test_force_release(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    assert not await store.force_release(name)
    lock = other_store.lock(name, ttl=10)
    assert await lock.acquire()
    assert await store.force_release(name)
    assert await store.lock_info(name) is None
    with pytest.raises(LockExpired):
        await lock.release()


@pytest.mark.capability("fair")
async def test_fair_serves_in_arrival_order(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    holder = store.lock(name, ttl=30, fair=True)
    assert await holder.acquire()
    # Connected before the waiters come, so that joining the queue takes one round trip.
    assert await other_store.lock_info(name) is not None
    # Spies of the backends: they tell when the server queued a waiter.
    spies = [delayed(other_store), delayed(store)]
    order: list[int] = []

    async def waiter(index: int) -> None:
        lock = spies[index % 2][0].lock(name, ttl=30, fair=True)
        assert await lock.acquire(wait=30)
        order.append(index)
        await sleep(0.02)
        await lock.release()

    async def queued(count: int) -> None:
        await wait_until(lambda: sum(len(spy.queued) for _, spy in spies) >= count)

    jobs = []
    for index in range(4):
        jobs.append(start(waiter, index))
        await queued(index + 1)  # each waiter joins the queue before the next arrives
    await holder.release()
    for job in jobs:
        await job.result()
    assert order == [0, 1, 2, 3]


@pytest.mark.capability("fair")
async def test_fair_queue_skips_a_waiter_that_gave_up(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    holder = store.lock(name, ttl=30, fair=True)
    assert await holder.acquire()
    quitter = other_store.lock(name, ttl=30, fair=True)
    assert not await quitter.acquire(wait=0.3)
    patient = other_store.lock(name, ttl=30, fair=True)
    job = start(patient.acquire, 30)
    await sleep(0.2)
    await holder.release()
    assert await job.result()
    await patient.release()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"ttl": 0}, ConfigError),
        ({"ttl": -1}, ConfigError),
        ({"ttl": float("inf")}, ConfigError),
        ({"ttl": "10"}, ConfigError),
        ({"wait": -1}, ConfigError),
        ({"on_lost": 3}, ConfigError),
        ({"replicas": -1}, ConfigError),
    ],
)
async def test_bad_lock_options(
    store: AsyncStore, name: str, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        store.lock(name, **kwargs)  # type: ignore[arg-type]
    assert await store.lock_info(name) is None


async def test_bad_names(store: AsyncStore) -> None:
    with pytest.raises(TypeError):
        store.lock(123)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.lock_info(b"x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        store.lock("")


async def test_bad_arguments_leave_the_lock_as_it_was(store: AsyncStore, name: str) -> None:
    lock = store.lock(name, ttl=10)
    with pytest.raises(ConfigError):
        await lock.acquire(wait=-1)
    assert await store.lock_info(name) is None
    assert await lock.acquire()
    with pytest.raises(ConfigError):
        await lock.release(hold_for=-1)
    with pytest.raises(ConfigError):
        await lock.extend(ttl=0)
    assert await lock.owned()
    await lock.release()
    assert await store.lock_info(name) is None
