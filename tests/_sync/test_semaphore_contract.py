# Generated from tests/_async/test_semaphore_contract.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""The semaphore contract: the same behaviour on every backend that keeps semaphores.

A semaphore's slot is a lock's acquisition (the lock contract covers the
machinery they share); these tests pin what is the semaphore's own: `limit`
holders at once, the limit as part of the name's identity, LOST meaning "every
slot is taken by others", tokens increasing across slots.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral import Semaphore, Store
from corral.errors import ConfigError, LockError, LockExpired, LockLost, LockTimeout
from tests._sync.concurrency import sleep, start
from tests._sync.delayed import delayed, eventually, wait_until

pytestmark = pytest.mark.capability("semaphores")


def _take(store: Store, name: str, count: int, ttl: float = 30) -> list[Semaphore]:
    slots = [store.semaphore(name, 3, ttl=ttl) for _ in range(count)]
    for slot in slots:
        assert slot.acquire()
    return slots


def test_up_to_limit_holders(store: Store, other_store: Store, name: str) -> None:
    first = store.semaphore(name, 3, ttl=10)
    assert first.token is None and first.owner is None
    slots = [first, other_store.semaphore(name, 3, ttl=10), store.semaphore(name, 3, ttl=10)]
    for slot in slots:
        assert slot.acquire()
        assert slot.held and isinstance(slot.token, int)
    assert len({slot.owner for slot in slots}) == 3
    fourth = other_store.semaphore(name, 3, ttl=10)
    assert not fourth.acquire()
    assert not fourth.acquire(wait=0.2)
    assert not fourth.held and fourth.token is None
    info = store.semaphore_info(name)
    assert info is not None and info.limit == 3 and info.free == 0
    assert [holder.owner for holder in info.holders] == [slot.owner for slot in slots]
    assert [holder.token for holder in info.holders] == [slot.token for slot in slots]
    assert all(0 < holder.ttl <= 10 for holder in info.holders)
    assert fourth.locked() and first.locked()
    slots[1].release()
    assert not first.locked()
    assert fourth.acquire()
    for slot in (slots[0], slots[2], fourth):
        slot.release()
    assert store.semaphore_info(name) is None


def test_a_lock_and_a_semaphore_may_share_a_name(store: Store, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    slot = store.semaphore(name, 1, ttl=10)
    assert slot.acquire()
    assert (store.lock_info(name)) is not None
    slot.release()
    assert lock.owned()
    lock.release()


def test_tokens_strictly_increase(store: Store, other_store: Store, name: str) -> None:
    seen: list[int] = []
    for round_ in range(3):
        slots = _take(store if round_ % 2 else other_store, name, 3)
        seen += [slot.token for slot in slots if slot.token is not None]
        for slot in slots:
            slot.release()
    assert len(seen) == 9 and seen == sorted(seen) and len(set(seen)) == 9


def test_a_disagreeing_limit_is_refused(store: Store, other_store: Store, name: str) -> None:
    holder = store.semaphore(name, 2, ttl=10)
    assert holder.acquire()
    for limit in (1, 3):
        wrong = other_store.semaphore(name, limit, ttl=10)
        with pytest.raises(ConfigError, match="limit=2"):
            wrong.acquire()
        with pytest.raises(ConfigError, match=name):
            wrong.acquire(wait=0.5)
        assert not wrong.held
    info = store.semaphore_info(name)
    assert info is not None and info.limit == 2 and len(info.holders) == 1
    holder.release()
    # Every slot is free: the next holder's limit is the semaphore's now.
    renamed = other_store.semaphore(name, 3, ttl=10)
    assert renamed.acquire()
    info = store.semaphore_info(name)
    assert info is not None and info.limit == 3
    renamed.release()


def test_expired_then_full_is_lost(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    stale = store.semaphore(name, 2, ttl=0.3)
    assert stale.acquire()
    sleep(lapse(0.3))
    others = [other_store.semaphore(name, 2, ttl=10) for _ in range(2)]
    for other in others:
        assert other.acquire()
        assert other.token is not None and stale.token is not None
        assert other.token > stale.token
    with pytest.raises(LockLost, match=name):
        stale.extend()
    with pytest.raises(LockLost, match="every slot"):
        stale.release()
    for other in others:
        assert other.owned()  # the stale holder freed nothing
        other.release()


def test_expired_with_a_free_slot_is_expired(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    stale = store.semaphore(name, 2, ttl=0.3)
    assert stale.acquire()
    sleep(lapse(0.3))
    other = other_store.semaphore(name, 2, ttl=10)
    assert other.acquire()
    with pytest.raises(LockExpired, match=name):
        stale.release()
    assert other.owned()
    other.release()


def test_extend_resets_ttl(store: Store, name: str, lapse: Callable[[float], float]) -> None:
    # The extend comes before the TTL runs out, even if the process pauses.
    slot = store.semaphore(name, 2, ttl=1.5)
    assert slot.acquire()
    slot.extend(ttl=30)
    sleep(lapse(1.5))
    assert slot.owned()
    info = store.semaphore_info(name)
    assert info is not None and info.holders[0].ttl > 20
    slot.release()


def test_release_hold_for_keeps_the_slot_closed(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    slot = store.semaphore(name, 1, ttl=10)
    assert slot.acquire()
    token = slot.token
    slot.release(hold_for=1.5)  # outlasts the next round trips, even if paused
    info = store.semaphore_info(name)
    assert info is not None and info.free == 0
    assert info.holders[0].owner is None and info.holders[0].token == token
    other = other_store.semaphore(name, 1, ttl=10)
    assert not other.acquire()
    eventually(other.acquire, within=lapse(1.5))
    assert other.token is not None and token is not None and other.token > token
    other.release()


def test_waiter_gets_a_slot_when_one_is_released(
    store: Store, other_store: Store, name: str
) -> None:
    slots = _take(store, name, 3)

    def wait_for_it() -> int | None:
        waiter = other_store.semaphore(name, 3, ttl=30)
        assert waiter.acquire(wait=20)
        token = waiter.token
        waiter.release()
        return token

    job = start(wait_for_it)
    sleep(0.3)
    assert not job.done()
    slots[1].release()
    token = job.result()
    assert token is not None and slots[2].token is not None and token > slots[2].token
    slots[0].release()
    slots[2].release()


def test_waiter_gets_a_slot_when_a_ttl_runs_out(
    store: Store, other_store: Store, name: str
) -> None:
    long = store.semaphore(name, 2, ttl=30)
    short = store.semaphore(name, 2, ttl=0.5)
    assert long.acquire() and short.acquire()
    waiter = other_store.semaphore(name, 2, ttl=10)
    assert waiter.acquire(wait=10)
    assert long.owned()
    waiter.release()
    long.release()


def test_wait_gives_up_and_fail_fast(store: Store, other_store: Store, name: str) -> None:
    slots = [store.semaphore(name, 2, ttl=60) for _ in range(2)]
    for slot in slots:
        assert slot.acquire()
    waiter = other_store.semaphore(name, 2, ttl=30, wait=0.3)
    assert not waiter.acquire()
    assert not waiter.acquire(wait=30, fail_fast=True)
    assert not waiter.held
    for slot in slots:
        slot.release()


def test_context_manager(store: Store, other_store: Store, name: str) -> None:
    with store.semaphore(name, 1, ttl=10) as slot:
        assert isinstance(slot.token, int) and isinstance(slot.owner, str)
        with pytest.raises(LockTimeout) as caught:
            with other_store.semaphore(name, 1, ttl=10, wait=0.2):
                raise AssertionError("entered a full semaphore")
        assert caught.value.owner == slot.owner
        assert caught.value.token == slot.token
        assert "all 1 slots are taken" in str(caught.value) and name in str(caught.value)
    assert store.semaphore_info(name) is None


def test_context_manager_reports_loss_on_exit(store: Store, other_store: Store, name: str) -> None:
    with pytest.raises(LockExpired):
        with store.semaphore(name, 2, ttl=10):
            assert other_store.force_release_semaphore(name) == 1


def test_auto_renew_keeps_it_and_reports_loss(store: Store, other_store: Store, name: str) -> None:
    lost: list[object] = []
    # Renewed every 0.6 s, so a renewal has 1.2 s to be answered: more than a pause of the
    # process lasts. Outlives its TTL only through renewals.
    slot = store.semaphore(name, 1, ttl=1.8, auto_renew=True, on_lost=lost.append)
    assert slot.acquire()
    sleep(2.6)
    assert slot.owned()
    assert not other_store.semaphore(name, 1, ttl=10).acquire()
    assert other_store.force_release_semaphore(name) == 1
    wait_until(lambda: bool(lost))
    assert lost == [slot]
    with pytest.raises(LockExpired):
        slot.release()


def test_check_owned(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    slot = store.semaphore(name, 1, ttl=0.3)
    assert not slot.owned()
    assert slot.acquire()
    slot.check()
    assert slot.owned()
    sleep(lapse(0.3))
    assert not slot.owned()
    other = other_store.semaphore(name, 1, ttl=10)
    assert other.acquire()
    with pytest.raises(LockLost):
        slot.check()
    other.release()


def test_force_release(store: Store, other_store: Store, name: str) -> None:
    assert store.force_release_semaphore(name) == 0
    slots = _take(other_store, name, 2)
    assert store.force_release_semaphore(name) == 2
    assert store.semaphore_info(name) is None
    for slot in slots:
        with pytest.raises(LockExpired):
            slot.release()


def test_many_waiters_never_exceed_the_limit(store: Store, other_store: Store, name: str) -> None:
    inside: list[int] = []
    most = 0
    entered = 0

    def worker(index: int) -> None:
        nonlocal most, entered
        slot = (store if index % 2 else other_store).semaphore(name, 3, ttl=30, wait=30)
        for _ in range(3):
            with slot:
                inside.append(index)
                most = max(most, len(inside))
                entered += 1
                sleep(0.01)
                inside.remove(index)

    jobs = [start(worker, index) for index in range(8)]
    for job in jobs:
        job.result()
    assert entered == 24
    assert 1 <= most <= 3


@pytest.mark.capability("fair")
def test_fair_serves_in_arrival_order(store: Store, other_store: Store, name: str) -> None:
    holders = [store.semaphore(name, 2, ttl=30, fair=True) for _ in range(2)]
    for holder in holders:
        assert holder.acquire()
    # Connected before the waiters come, so that joining the queue takes one round trip.
    assert other_store.semaphore_info(name) is not None
    # Spies of the backends: they tell when the server queued a waiter.
    spies = [delayed(other_store), delayed(store)]
    order: list[int] = []

    def waiter(index: int) -> None:
        slot = spies[index % 2][0].semaphore(name, 2, ttl=30, fair=True)
        assert slot.acquire(wait=30)
        order.append(index)
        sleep(0.02)
        slot.release()

    def queued(count: int) -> None:
        wait_until(lambda: sum(len(spy.queued) for _, spy in spies) >= count)

    jobs = []
    for index in range(4):
        jobs.append(start(waiter, index))
        queued(index + 1)  # each waiter joins the queue before the next arrives
    holders[0].release()
    for job in jobs:
        job.result()
    holders[1].release()
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
def test_bad_semaphore_options(
    store: Store, name: str, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    with pytest.raises(ConfigError):
        store.semaphore(name, *args, **kwargs)  # type: ignore[arg-type]
    assert store.semaphore_info(name) is None


def test_bad_names(store: Store) -> None:
    with pytest.raises(TypeError):
        store.semaphore(123, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.semaphore_info(b"x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        store.semaphore("", 2)


def test_one_handle_holds_one_slot(store: Store, name: str) -> None:
    slot = store.semaphore(name, 3, ttl=10)
    assert slot.acquire()
    with pytest.raises(LockError, match="semaphore"):
        slot.acquire()
    info = store.semaphore_info(name)
    assert info is not None and len(info.holders) == 1
    slot.release()


def test_a_shared_handle_lets_limit_blocks_in(store: Store, name: str) -> None:
    shared = store.semaphore(name, 3, ttl=30, wait=30)
    inside: list[int] = []
    most = 0
    tokens: list[int] = []

    def block(index: int) -> None:
        nonlocal most
        with shared as slot:
            tokens.append(slot.token)
            inside.append(index)
            most = max(most, len(inside))
            # Stays until three blocks were in at once, however late the others came.
            wait_until(lambda: most >= 3, deadline=10)
            sleep(0.3)
            inside.remove(index)

    jobs = [start(block, index) for index in range(5)]
    for job in jobs:
        job.result()
    assert most == 3  # as threading.Semaphore / asyncio.Semaphore: one slot per block
    assert len(set(tokens)) == 5
    assert store.semaphore_info(name) is None
