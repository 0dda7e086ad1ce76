"""The semaphore contract: the same behaviour on every backend that keeps semaphores.

A semaphore's slot is a lock's acquisition (the lock contract covers the
machinery they share); these tests pin what is the semaphore's own: `limit`
holders at once, the limit as part of the name's identity, LOST meaning "every
slot is taken by others", tokens increasing across slots.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral.aio import AsyncSemaphore, AsyncStore
from corral.errors import ConfigError, LockError, LockExpired, LockLost, LockTimeout
from tests._async.concurrency import sleep, start
from tests._async.delayed import delayed, eventually, wait_until

pytestmark = pytest.mark.capability("semaphores")


async def _take(store: AsyncStore, name: str, count: int, ttl: float = 30) -> list[AsyncSemaphore]:
    slots = [store.semaphore(name, 3, ttl=ttl) for _ in range(count)]
    for slot in slots:
        assert await slot.acquire()
    return slots


async def test_up_to_limit_holders(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    first = store.semaphore(name, 3, ttl=10)
    assert first.token is None and first.owner is None
    slots = [first, other_store.semaphore(name, 3, ttl=10), store.semaphore(name, 3, ttl=10)]
    for slot in slots:
        assert await slot.acquire()
        assert slot.held and isinstance(slot.token, int)
    assert len({slot.owner for slot in slots}) == 3
    fourth = other_store.semaphore(name, 3, ttl=10)
    assert not await fourth.acquire()
    assert not await fourth.acquire(wait=0.2)
    assert not fourth.held and fourth.token is None
    info = await store.semaphore_info(name)
    assert info is not None and info.limit == 3 and info.free == 0
    assert [holder.owner for holder in info.holders] == [slot.owner for slot in slots]
    assert [holder.token for holder in info.holders] == [slot.token for slot in slots]
    assert all(0 < holder.ttl <= 10 for holder in info.holders)
    assert await fourth.locked() and await first.locked()
    await slots[1].release()
    assert not await first.locked()
    assert await fourth.acquire()
    for slot in (slots[0], slots[2], fourth):
        await slot.release()
    assert await store.semaphore_info(name) is None


async def test_a_lock_and_a_semaphore_may_share_a_name(store: AsyncStore, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert await lock.acquire()
    slot = store.semaphore(name, 1, ttl=10)
    assert await slot.acquire()
    assert (await store.lock_info(name)) is not None
    await slot.release()
    assert await lock.owned()
    await lock.release()


async def test_tokens_strictly_increase(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    seen: list[int] = []
    for round_ in range(3):
        slots = await _take(store if round_ % 2 else other_store, name, 3)
        seen += [slot.token for slot in slots if slot.token is not None]
        for slot in slots:
            await slot.release()
    assert len(seen) == 9 and seen == sorted(seen) and len(set(seen)) == 9


async def test_a_disagreeing_limit_is_refused(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    holder = store.semaphore(name, 2, ttl=10)
    assert await holder.acquire()
    for limit in (1, 3):
        wrong = other_store.semaphore(name, limit, ttl=10)
        with pytest.raises(ConfigError, match="limit=2"):
            await wrong.acquire()
        with pytest.raises(ConfigError, match=name):
            await wrong.acquire(wait=0.5)
        assert not wrong.held
    info = await store.semaphore_info(name)
    assert info is not None and info.limit == 2 and len(info.holders) == 1
    await holder.release()
    # Every slot is free: the next holder's limit is the semaphore's now.
    renamed = other_store.semaphore(name, 3, ttl=10)
    assert await renamed.acquire()
    info = await store.semaphore_info(name)
    assert info is not None and info.limit == 3
    await renamed.release()


async def test_expired_then_full_is_lost(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    stale = store.semaphore(name, 2, ttl=0.3)
    assert await stale.acquire()
    await sleep(lapse(0.3))
    others = [other_store.semaphore(name, 2, ttl=10) for _ in range(2)]
    for other in others:
        assert await other.acquire()
        assert other.token is not None and stale.token is not None
        assert other.token > stale.token
    with pytest.raises(LockLost, match=name):
        await stale.extend()
    with pytest.raises(LockLost, match="every slot"):
        await stale.release()
    for other in others:
        assert await other.owned()  # the stale holder freed nothing
        await other.release()


async def test_expired_with_a_free_slot_is_expired(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    stale = store.semaphore(name, 2, ttl=0.3)
    assert await stale.acquire()
    await sleep(lapse(0.3))
    other = other_store.semaphore(name, 2, ttl=10)
    assert await other.acquire()
    with pytest.raises(LockExpired, match=name):
        await stale.release()
    assert await other.owned()
    await other.release()


async def test_extend_resets_ttl(
    store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    # The extend comes before the TTL runs out, even if the process pauses.
    slot = store.semaphore(name, 2, ttl=1.5)
    assert await slot.acquire()
    await slot.extend(ttl=30)
    await sleep(lapse(1.5))
    assert await slot.owned()
    info = await store.semaphore_info(name)
    assert info is not None and info.holders[0].ttl > 20
    await slot.release()


async def test_release_hold_for_keeps_the_slot_closed(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    slot = store.semaphore(name, 1, ttl=10)
    assert await slot.acquire()
    token = slot.token
    await slot.release(hold_for=1.5)  # outlasts the next round trips, even if paused
    info = await store.semaphore_info(name)
    assert info is not None and info.free == 0
    assert info.holders[0].owner is None and info.holders[0].token == token
    other = other_store.semaphore(name, 1, ttl=10)
    assert not await other.acquire()
    await eventually(other.acquire, within=lapse(1.5))
    assert other.token is not None and token is not None and other.token > token
    await other.release()


async def test_waiter_gets_a_slot_when_one_is_released(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    slots = await _take(store, name, 3)

    async def wait_for_it() -> int | None:
        waiter = other_store.semaphore(name, 3, ttl=30)
        assert await waiter.acquire(wait=20)
        token = waiter.token
        await waiter.release()
        return token

    job = start(wait_for_it)
    await sleep(0.3)
    assert not job.done()
    await slots[1].release()
    token = await job.result()
    assert token is not None and slots[2].token is not None and token > slots[2].token
    await slots[0].release()
    await slots[2].release()


async def test_waiter_gets_a_slot_when_a_ttl_runs_out(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    long = store.semaphore(name, 2, ttl=30)
    short = store.semaphore(name, 2, ttl=0.5)
    assert await long.acquire() and await short.acquire()
    waiter = other_store.semaphore(name, 2, ttl=10)
    assert await waiter.acquire(wait=10)
    assert await long.owned()
    await waiter.release()
    await long.release()


async def test_wait_gives_up_and_fail_fast(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    slots = [store.semaphore(name, 2, ttl=60) for _ in range(2)]
    for slot in slots:
        assert await slot.acquire()
    waiter = other_store.semaphore(name, 2, ttl=30, wait=0.3)
    assert not await waiter.acquire()
    assert not await waiter.acquire(wait=30, fail_fast=True)
    assert not waiter.held
    for slot in slots:
        await slot.release()


async def test_context_manager(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    async with store.semaphore(name, 1, ttl=10) as slot:
        assert isinstance(slot.token, int) and isinstance(slot.owner, str)
        with pytest.raises(LockTimeout) as caught:
            async with other_store.semaphore(name, 1, ttl=10, wait=0.2):
                raise AssertionError("entered a full semaphore")
        assert caught.value.owner == slot.owner
        assert caught.value.token == slot.token
        assert "all 1 slots are taken" in str(caught.value) and name in str(caught.value)
    assert await store.semaphore_info(name) is None


async def test_context_manager_reports_loss_on_exit(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    with pytest.raises(LockExpired):
        async with store.semaphore(name, 2, ttl=10):
            assert await other_store.force_release_semaphore(name) == 1


async def test_auto_renew_keeps_it_and_reports_loss(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    lost: list[object] = []
    # Renewed every 0.6 s, so a renewal has 1.2 s to be answered: more than a pause of the
    # process lasts. Outlives its TTL only through renewals.
    slot = store.semaphore(name, 1, ttl=1.8, auto_renew=True, on_lost=lost.append)
    assert await slot.acquire()
    await sleep(2.6)
    assert await slot.owned()
    assert not await other_store.semaphore(name, 1, ttl=10).acquire()
    assert await other_store.force_release_semaphore(name) == 1
    await wait_until(lambda: bool(lost))
    assert lost == [slot]
    with pytest.raises(LockExpired):
        await slot.release()


async def test_check_owned(
    store: AsyncStore, other_store: AsyncStore, name: str, lapse: Callable[[float], float]
) -> None:
    slot = store.semaphore(name, 1, ttl=0.3)
    assert not await slot.owned()
    assert await slot.acquire()
    await slot.check()
    assert await slot.owned()
    await sleep(lapse(0.3))
    assert not await slot.owned()
    other = other_store.semaphore(name, 1, ttl=10)
    assert await other.acquire()
    with pytest.raises(LockLost):
        await slot.check()
    await other.release()


async def test_force_release(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    assert await store.force_release_semaphore(name) == 0
    slots = await _take(other_store, name, 2)
    assert await store.force_release_semaphore(name) == 2
    assert await store.semaphore_info(name) is None
    for slot in slots:
        with pytest.raises(LockExpired):
            await slot.release()


async def test_many_waiters_never_exceed_the_limit(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    inside: list[int] = []
    most = 0
    entered = 0

    async def worker(index: int) -> None:
        nonlocal most, entered
        slot = (store if index % 2 else other_store).semaphore(name, 3, ttl=30, wait=30)
        for _ in range(3):
            async with slot:
                inside.append(index)
                most = max(most, len(inside))
                entered += 1
                await sleep(0.01)
                inside.remove(index)

    jobs = [start(worker, index) for index in range(8)]
    for job in jobs:
        await job.result()
    assert entered == 24
    assert 1 <= most <= 3


@pytest.mark.capability("fair")
async def test_fair_serves_in_arrival_order(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    holders = [store.semaphore(name, 2, ttl=30, fair=True) for _ in range(2)]
    for holder in holders:
        assert await holder.acquire()
    # Connected before the waiters come, so that joining the queue takes one round trip.
    assert await other_store.semaphore_info(name) is not None
    # Spies of the backends: they tell when the server queued a waiter.
    spies = [delayed(other_store), delayed(store)]
    order: list[int] = []

    async def waiter(index: int) -> None:
        slot = spies[index % 2][0].semaphore(name, 2, ttl=30, fair=True)
        assert await slot.acquire(wait=30)
        order.append(index)
        await sleep(0.02)
        await slot.release()

    async def queued(count: int) -> None:
        await wait_until(lambda: sum(len(spy.queued) for _, spy in spies) >= count)

    jobs = []
    for index in range(4):
        jobs.append(start(waiter, index))
        await queued(index + 1)  # each waiter joins the queue before the next arrives
    await holders[0].release()
    for job in jobs:
        await job.result()
    await holders[1].release()
    assert order == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((0,), {}),
        ((-1,), {}),
        ((2.5,), {}),
        ((True,), {}),
        (("3",), {}),
        ((None,), {}),
        ((3,), {"ttl": 0}),
        ((3,), {"ttl": -1}),
        ((3,), {"wait": -1}),
        ((3,), {"on_lost": 3}),
    ],
)
async def test_bad_semaphore_options(
    store: AsyncStore, name: str, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    with pytest.raises(ConfigError):
        store.semaphore(name, *args, **kwargs)  # type: ignore[arg-type]
    assert await store.semaphore_info(name) is None


async def test_bad_names(store: AsyncStore) -> None:
    with pytest.raises(TypeError):
        store.semaphore(123, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.semaphore_info(b"x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        store.semaphore("", 2)


async def test_one_handle_holds_one_slot(store: AsyncStore, name: str) -> None:
    slot = store.semaphore(name, 3, ttl=10)
    assert await slot.acquire()
    with pytest.raises(LockError, match="semaphore"):
        await slot.acquire()
    info = await store.semaphore_info(name)
    assert info is not None and len(info.holders) == 1
    await slot.release()


async def test_a_shared_handle_lets_limit_blocks_in(store: AsyncStore, name: str) -> None:
    shared = store.semaphore(name, 3, ttl=30, wait=30)
    inside: list[int] = []
    most = 0
    tokens: list[int] = []

    async def block(index: int) -> None:
        nonlocal most
        async with shared as slot:
            tokens.append(slot.token)
            inside.append(index)
            most = max(most, len(inside))
            # Stays until three blocks were in at once, however late the others came.
            await wait_until(lambda: most >= 3, deadline=10)
            await sleep(0.3)
            inside.remove(index)

    jobs = [start(block, index) for index in range(5)]
    for job in jobs:
        await job.result()
    assert most == 3  # as threading.Semaphore / asyncio.Semaphore: one slot per block
    assert len(set(tokens)) == 5
    assert await store.semaphore_info(name) is None
