# Generated from tests/_async/test_lock_contract.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""The lock contract: the same behaviour on every backend, in both flavours.

Small TTLs and real sleeps are used where expiry itself is the behaviour under
test; assertions are about what happened, never about how fast.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import pytest

from corral import Store
from corral.errors import (
    ConfigError,
    LockError,
    LockExpired,
    LockLost,
    LockTimeout,
)
from tests._sync.concurrency import sleep, start
from tests._sync.delayed import delayed, eventually, wait_until


def test_acquire_release_and_identity(store: Store, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.token is None and lock.owner is None
    assert lock.acquire()
    assert isinstance(lock.token, int) and lock.token > 0
    assert lock.owner is not None
    host, pid = lock.owner.split(":")[:2]
    assert host == socket.gethostname() and pid == str(os.getpid())
    assert lock.held
    info = store.lock_info(name)
    assert info is not None
    assert info.owner == lock.owner and info.token == lock.token
    assert 0 < info.ttl <= 10
    assert lock.locked() and lock.owned()
    lock.release()
    assert not lock.held and lock.token is None
    assert store.lock_info(name) is None
    assert not lock.locked()


def test_only_one_holder(store: Store, other_store: Store, name: str) -> None:
    first = store.lock(name, ttl=10)
    second = other_store.lock(name, ttl=10)
    assert first.acquire()
    assert not second.acquire()
    assert not second.acquire(wait=0.2)
    assert second.token is None and not second.held
    first.release()
    assert second.acquire()
    second.release()


def test_tokens_strictly_increase(store: Store, other_store: Store, name: str) -> None:
    tokens = []
    for i in range(6):
        lock = (store if i % 2 else other_store).lock(name, ttl=10)
        assert lock.acquire()
        assert lock.token is not None
        tokens.append(lock.token)
        if i == 3:
            assert store.force_release(name)
        else:
            lock.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_release_of_unheld_handle_is_an_error(store: Store, name: str) -> None:
    lock = store.lock(name, ttl=10)
    with pytest.raises(LockError, match=name):
        lock.release()
    holder = store.lock(name, ttl=10)
    assert holder.acquire()
    with pytest.raises(LockError):
        lock.release()
    assert holder.owned()  # the failed release freed nothing
    holder.release()


def test_expired_then_taken_is_lost(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    stale = store.lock(name, ttl=0.3)
    assert stale.acquire()
    sleep(lapse(0.3))
    fresh = other_store.lock(name, ttl=10)
    assert fresh.acquire()
    assert fresh.token is not None and stale.token is not None
    assert fresh.token > stale.token
    with pytest.raises(LockLost, match=name):
        stale.extend()
    with pytest.raises(LockLost, match=name):
        stale.release()
    assert fresh.owned()  # the stale holder freed nothing
    fresh.release()


def test_expired_and_free_is_expired(
    store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    lock = store.lock(name, ttl=0.3)
    assert lock.acquire()
    sleep(lapse(0.3))
    with pytest.raises(LockExpired, match=name):
        lock.release()
    assert lock.acquire()
    sleep(lapse(0.3))
    with pytest.raises(LockExpired):
        lock.extend()


def test_extend_resets_ttl(store: Store, name: str, lapse: Callable[[float], float]) -> None:
    # The extend comes before the TTL runs out, even if the process pauses.
    lock = store.lock(name, ttl=1.5)
    assert lock.acquire()
    lock.extend(ttl=10)
    info = store.lock_info(name)
    assert info is not None and info.ttl > 5
    sleep(lapse(1.5))
    assert lock.owned()
    lock.extend()  # back to the lock's own ttl
    info = store.lock_info(name)
    assert info is not None and info.ttl <= lapse(1.5)
    lock.release()


def test_release_hold_for_keeps_it_closed(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    token = lock.token
    lock.release(hold_for=1.5)  # outlasts the next round trips, even if paused
    info = store.lock_info(name)
    assert info is not None and info.owner is None and info.token == token
    assert lock.locked()
    other = other_store.lock(name, ttl=10)
    assert not other.acquire()
    eventually(other.acquire, within=lapse(1.5))
    assert other.token is not None and token is not None and other.token > token
    other.release()


def test_waiter_gets_lock_when_released(store: Store, other_store: Store, name: str) -> None:
    holder = store.lock(name, ttl=30)
    assert holder.acquire()

    def wait_for_it() -> int | None:
        waiter = other_store.lock(name, ttl=30)
        assert waiter.acquire(wait=20)
        token = waiter.token
        waiter.release()
        return token

    job = start(wait_for_it)
    sleep(0.3)
    assert not job.done()
    holder.release()
    token = job.result()
    assert token is not None and holder.token is None and token > 0


def test_waiter_gets_lock_when_ttl_runs_out(store: Store, other_store: Store, name: str) -> None:
    holder = store.lock(name, ttl=0.5)
    assert holder.acquire()
    waiter = other_store.lock(name, ttl=10)
    assert waiter.acquire(wait=10)
    assert waiter.token is not None and holder.token is not None
    assert waiter.token > holder.token
    waiter.release()


def test_wait_gives_up(store: Store, other_store: Store, name: str) -> None:
    holder = store.lock(name, ttl=30)
    assert holder.acquire()
    waiter = other_store.lock(name, ttl=30, wait=0.3)
    assert not waiter.acquire()
    assert not waiter.held
    assert holder.owned()
    holder.release()


def test_fail_fast_does_not_wait_for_a_long_holder(
    store: Store, other_store: Store, name: str
) -> None:
    holder = store.lock(name, ttl=300)
    assert holder.acquire()
    waiter = other_store.lock(name, ttl=30)

    def try_it() -> bool:
        return waiter.acquire(wait=120, fail_fast=True)

    job = start(try_it)
    for _ in range(200):  # give it a moment to give up by itself
        if job.done():
            break
        sleep(0.05)
    # Had it kept waiting, this release would hand it the lock well within its 120 s.
    holder.release()
    assert job.result() is False
    assert not waiter.held


def test_fail_fast_still_waits_for_a_short_holder(
    store: Store, other_store: Store, name: str
) -> None:
    holder = store.lock(name, ttl=0.4)
    assert holder.acquire()
    waiter = other_store.lock(name, ttl=30)
    assert waiter.acquire(wait=10, fail_fast=True)
    waiter.release()


def test_context_manager(store: Store, other_store: Store, name: str) -> None:
    with store.lock(name, ttl=10) as lock:
        assert lock.owned()
        with pytest.raises(LockTimeout, match=name):
            with other_store.lock(name, ttl=10, wait=0.1):
                pass
    assert store.lock_info(name) is None
    with pytest.raises(ZeroDivisionError):
        with store.lock(name, ttl=10):
            1 / 0  # noqa: B018
    assert store.lock_info(name) is None


def test_context_manager_reports_loss_on_exit(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    with pytest.raises(LockLost):
        with store.lock(name, ttl=0.3):
            sleep(lapse(0.3))
            assert other_store.lock(name, ttl=10).acquire()
    assert store.force_release(name)
    with pytest.raises(LockExpired):
        with store.lock(name, ttl=0.3):
            sleep(lapse(0.3))


def test_context_manager_never_masks_the_error_in_flight(
    store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    with pytest.raises(KeyError) as caught:
        with store.lock(name, ttl=0.3):
            sleep(lapse(0.3))
            raise KeyError("the real problem")
    notes = getattr(caught.value, "__notes__", [])
    assert any(name in note for note in notes)


def test_reentrant(store: Store, other_store: Store, name: str) -> None:
    lock = store.lock(name, ttl=10, reentrant=True)
    assert lock.acquire()
    token = lock.token
    assert lock.acquire()
    assert lock.token == token
    lock.release()
    assert lock.owned()
    assert not other_store.lock(name, ttl=10).acquire()
    lock.release()
    assert store.lock_info(name) is None


def test_non_reentrant_second_acquire_is_an_error(store: Store, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    with pytest.raises(LockError, match="reentrant"):
        lock.acquire()
    assert lock.owned()
    lock.release()


def test_auto_renew_keeps_it(store: Store, other_store: Store, name: str) -> None:
    # Renewed every TTL/3, the lock outlives its TTL only through renewals (two at least);
    # the TTL leaves a renewal 1.2 s to be answered, as a machine running the suite's
    # parts side by side can pause a process for a second or more.
    lock = store.lock(name, ttl=1.8, auto_renew=True)
    assert lock.acquire()
    sleep(2.6)
    assert lock.owned()
    assert not other_store.lock(name, ttl=10).acquire()
    lock.check()
    lock.release()
    assert store.lock_info(name) is None


def test_auto_renew_reports_loss(store: Store, other_store: Store, name: str) -> None:
    lost = []
    # Force-released, not lost to a paused renewal.
    lock = store.lock(name, ttl=1.8, auto_renew=True, on_lost=lost.append)
    assert lock.acquire()
    assert other_store.force_release(name)
    wait_until(lambda: bool(lost))
    assert lost == [lock]
    assert not lock.held
    with pytest.raises(LockExpired):
        lock.check()
    with pytest.raises(LockExpired):
        lock.extend()
    with pytest.raises(LockExpired):
        lock.release()


def test_check_owned_locked(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    lock = store.lock(name, ttl=0.3)
    assert not lock.locked()
    assert not lock.owned()
    assert lock.acquire()
    lock.check()
    sleep(lapse(0.3))
    assert not lock.owned()
    other = other_store.lock(name, ttl=10)
    assert other.acquire()
    with pytest.raises(LockLost):
        lock.check()
    assert lock.locked()
    other.release()


def test_force_release(store: Store, other_store: Store, name: str) -> None:
    assert not store.force_release(name)
    lock = other_store.lock(name, ttl=10)
    assert lock.acquire()
    assert store.force_release(name)
    assert store.lock_info(name) is None
    with pytest.raises(LockExpired):
        lock.release()


@pytest.mark.capability("fair")
def test_fair_serves_in_arrival_order(store: Store, other_store: Store, name: str) -> None:
    holder = store.lock(name, ttl=30, fair=True)
    assert holder.acquire()
    # Connected before the waiters come, so that joining the queue takes one round trip.
    assert other_store.lock_info(name) is not None
    # Spies of the backends: they tell when the server queued a waiter.
    spies = [delayed(other_store), delayed(store)]
    order: list[int] = []

    def waiter(index: int) -> None:
        lock = spies[index % 2][0].lock(name, ttl=30, fair=True)
        assert lock.acquire(wait=30)
        order.append(index)
        sleep(0.02)
        lock.release()

    def queued(count: int) -> None:
        wait_until(lambda: sum(len(spy.queued) for _, spy in spies) >= count)

    jobs = []
    for index in range(4):
        jobs.append(start(waiter, index))
        queued(index + 1)  # each waiter joins the queue before the next arrives
    holder.release()
    for job in jobs:
        job.result()
    assert order == [0, 1, 2, 3]


@pytest.mark.capability("fair")
def test_fair_queue_skips_a_waiter_that_gave_up(
    store: Store, other_store: Store, name: str
) -> None:
    holder = store.lock(name, ttl=30, fair=True)
    assert holder.acquire()
    quitter = other_store.lock(name, ttl=30, fair=True)
    assert not quitter.acquire(wait=0.3)
    patient = other_store.lock(name, ttl=30, fair=True)
    job = start(patient.acquire, 30)
    sleep(0.2)
    holder.release()
    assert job.result()
    patient.release()


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
def test_bad_lock_options(
    store: Store, name: str, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        store.lock(name, **kwargs)  # type: ignore[arg-type]
    assert store.lock_info(name) is None


def test_bad_names(store: Store) -> None:
    with pytest.raises(TypeError):
        store.lock(123)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.lock_info(b"x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        store.lock("")


def test_bad_arguments_leave_the_lock_as_it_was(store: Store, name: str) -> None:
    lock = store.lock(name, ttl=10)
    with pytest.raises(ConfigError):
        lock.acquire(wait=-1)
    assert store.lock_info(name) is None
    assert lock.acquire()
    with pytest.raises(ConfigError):
        lock.release(hold_for=-1)
    with pytest.raises(ConfigError):
        lock.extend(ttl=0)
    assert lock.owned()
    lock.release()
    assert store.lock_info(name) is None
