# Generated from tests/_async/test_lock_edges.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""The lock's edges: slow replies, renewals racing releases, re-entry after a loss,
a handle shared by several threads or tasks, and waiters a barging holder would starve.

Every test runs over every backend (the slowness is injected by wrapping the
real backend, see `tests._sync.delayed`), and asserts on what happened, in
which order, never on how long it took.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral import Lock, Store
from corral.errors import LockError, LockLost, LockTimeout
from tests._sync.concurrency import sleep, start
from tests._sync.delayed import delayed, wait_until

# A lock renewed every third of this TTL is lost only if a renewal is not answered within
# 1.2 s: a process running beside the suite's other parts on two cores may pause over 1 s.
RENEWED_TTL = 1.8


def test_a_slow_renewal_does_not_delay_another_locks_renewal(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    slow_name, quick_name = f"{name}-slow", f"{name}-quick"
    slow_store, backend = delayed(store, only={slow_name}, extend=lapse(RENEWED_TTL) + 2)
    slow = slow_store.lock(slow_name, ttl=3, auto_renew=True)
    assert slow.acquire()
    wait_until(lambda: "extend" in backend.calls)  # its server answers late
    quick = slow_store.lock(quick_name, ttl=RENEWED_TTL, auto_renew=True)
    assert quick.acquire()
    sleep(lapse(RENEWED_TTL))
    # Renewed all along, though the other lock's renewal is still waiting for its server.
    assert quick.owned()
    assert not other_store.lock(quick_name, ttl=10).acquire()
    quick.release()


def test_a_renewal_that_outlives_the_lease_reports_the_loss_at_once(
    store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    events: list[str] = []
    slow_store, backend = delayed(store, extend=lapse(0.9) + 1)

    def on_lost(lock: Lock) -> None:
        events.append("on_lost")

    lock = slow_store.lock(name, ttl=0.9, auto_renew=True, on_lost=on_lost)
    assert lock.acquire()
    wait_until(lambda: "extend" in backend.calls)
    wait_until(lambda: bool(events))
    # Reported while the renewal was still waiting for its answer, not after it.
    assert backend.calls.count("extend") == 1 and events == ["on_lost"]
    assert isinstance(lock.lost, LockLost)
    assert not lock.held
    with pytest.raises(LockLost):
        lock.check()


def test_a_slow_on_lost_callback_does_not_delay_other_renewals(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    called: list[str] = []

    def slow_callback(lock: Lock) -> None:
        called.append(lock.name)
        sleep(lapse(RENEWED_TTL) + 2)

    doomed = store.lock(f"{name}-doomed", ttl=RENEWED_TTL, auto_renew=True, on_lost=slow_callback)
    assert doomed.acquire()
    assert other_store.force_release(f"{name}-doomed")
    wait_until(lambda: bool(called))
    kept = store.lock(f"{name}-kept", ttl=RENEWED_TTL, auto_renew=True)
    assert kept.acquire()
    sleep(lapse(RENEWED_TTL))
    assert kept.owned()
    kept.release()


def test_extend_with_a_shorter_ttl_brings_the_next_renewal_forward(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    lost: list[Lock] = []
    lock = store.lock(name, ttl=30, auto_renew=True, on_lost=lost.append)
    assert lock.acquire()
    lock.extend(ttl=RENEWED_TTL)  # renewals now every 0.6 s, not every 10 s
    sleep(lapse(RENEWED_TTL) + 0.6)  # outlives it only through two renewals or more
    assert lost == []
    assert lock.owned()
    assert not other_store.lock(name, ttl=10).acquire()
    lock.release()


def test_a_renewal_in_flight_at_release_does_not_report_a_loss(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost: list[Lock] = []
    # The extend reaches the server after the release, and after the lease would have
    # run out (renewal due at 0.6 s, the lease until 1.8 s, the extend lands at 2 s).
    slow_store, backend = delayed(store, extend=1.4)
    losses_before = slow_store.stats()["locks"]["losses"]
    lock = slow_store.lock(name, ttl=RENEWED_TTL, auto_renew=True, on_lost=lost.append)
    renewals_over: list[None] = []
    renew_once = lock.renew_once

    def renew_and_tell() -> None:
        try:
            renew_once()
        finally:
            renewals_over.append(None)

    monkeypatch.setattr(lock, "renew_once", renew_and_tell)
    assert lock.acquire()
    wait_until(lambda: "extend" in backend.calls)
    lock.release()  # while the renewal's extend is on its way
    wait_until(lambda: bool(renewals_over))  # its answer is in, and was judged
    # A loss is counted as it is found; `on_lost` would follow in a job of its own.
    assert slow_store.stats()["locks"]["losses"] == losses_before
    sleep(0.2)
    assert lost == []
    assert store.lock_info(name) is None


def test_re_entering_after_a_loss_raises_it(
    store: Store, other_store: Store, name: str, lapse: Callable[[float], float]
) -> None:
    # A lease that runs out while held; on Redlock, a TTL/3 of 0.4 s for the masters'
    # answers to a busy machine's acquisition.
    lock = store.lock(name, ttl=1.2, wait=1, reentrant=True)
    with pytest.raises(LockLost):
        with lock:
            sleep(lapse(1.2))
            assert other_store.lock(name, ttl=30).acquire()
            with lock:  # must not quietly become a brand-new acquisition
                pytest.fail("re-entered a lock another owner holds")
    assert not lock.held
    info = store.lock_info(name)
    assert info is not None and info.owner != lock.owner


def test_a_shared_handle_excludes_threads_and_tasks(store: Store, name: str) -> None:
    lock = store.lock(name, ttl=30, wait=30)
    inside: list[str] = []
    overlaps: list[str] = []

    def worker(label: str) -> None:
        for _ in range(3):
            with lock:
                if inside:
                    overlaps.append(label)
                inside.append(label)
                sleep(0.05)
                inside.remove(label)

    jobs = [start(worker, label) for label in "abc"]
    for job in jobs:
        job.result()
    assert overlaps == []
    assert store.lock_info(name) is None


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_shared_handle_makes_the_second_wait_or_time_out(
    store: Store, name: str, reentrant: bool
) -> None:
    lock = store.lock(name, ttl=30, reentrant=reentrant)
    assert lock.acquire()
    done: list[bool] = []

    def take_then_release() -> bool:
        got = lock.acquire(wait=30)
        wait_until(lambda: bool(done))
        if got:
            lock.release()
        return got

    def try_briefly() -> bool:
        return lock.acquire(wait=0.2)

    assert start(try_briefly).result() is False  # times out, never enters
    waiting = start(take_then_release)
    sleep(0.2)
    assert not waiting.done()
    lock.release()
    wait_until(lambda: lock.held)
    if reentrant:
        with pytest.raises(LockError, match="another thread or task"):
            lock.release()  # only its holder releases a reentrant lock
    done.append(True)
    assert waiting.result() is True
    assert store.lock_info(name) is None


def test_any_thread_or_task_may_release_a_plain_handle(store: Store, name: str) -> None:
    lock = store.lock(name, ttl=30)
    assert lock.acquire()

    def release() -> None:
        lock.release()

    start(release).result()  # as with threading.Lock
    assert not lock.held and store.lock_info(name) is None


def test_the_holder_re_enters_only_a_reentrant_handle(store: Store, name: str) -> None:
    plain = store.lock(name, ttl=30)
    assert plain.acquire()
    with pytest.raises(LockError, match="reentrant=True") as caught:
        plain.acquire()
    assert "other threads and tasks still wait" in str(caught.value)
    assert plain.owned()
    plain.release()


@pytest.mark.capability("fair")
def test_a_waiter_is_not_starved_by_a_holder_that_takes_it_straight_back(
    store: Store, other_store: Store, name: str
) -> None:
    """The default lock lets a newcomer barge, until a waiter has waited too long."""
    stop: list[bool] = []
    cycles: list[int] = []

    def barge() -> None:
        lock = store.lock(name, ttl=30)
        while not stop:
            if lock.acquire(wait=5):
                cycles.append(1)
                sleep(0.002)
                lock.release()

    job = start(barge)
    wait_until(lambda: len(cycles) >= 3)
    waiter = other_store.lock(name, ttl=30)
    got = waiter.acquire(wait=10)
    stop.append(True)
    if got:
        waiter.release()
    job.result()
    assert got


def test_lock_timeout_says_who_holds_it_and_where(
    store: Store, other_store: Store, name: str
) -> None:
    holder = store.lock(name, ttl=30)
    assert holder.acquire()
    with pytest.raises(LockTimeout) as caught:
        with other_store.lock(name, ttl=30, wait=0.1):
            pytest.fail("entered a held lock")
    error = caught.value
    assert error.owner == holder.owner and error.token == holder.token
    assert error.ttl is not None and 0 < error.ttl <= 30
    assert error.server == store.server and name in str(error)
    assert holder.owner is not None and holder.owner in str(error)
    holder.release(hold_for=20)
    with pytest.raises(LockTimeout) as caught:
        with other_store.lock(name, ttl=30):
            pytest.fail("entered a closed lock")
    assert caught.value.owner is None and caught.value.ttl is not None
    assert "kept closed" in str(caught.value)
    assert store.force_release(name)


def test_leaving_a_block_never_releases_another_threads_acquisition(
    store: Store, name: str
) -> None:
    lock = store.lock(name, ttl=30, wait=30)
    steps: list[str] = []

    def first() -> None:
        with lock as held:
            steps.append("first inside")
            held.release()  # done early; the block goes on a little
            wait_until(lambda: "second inside" in steps)
        steps.append("first left")

    def second() -> bool:
        wait_until(lambda: "first inside" in steps)
        with lock as held:
            steps.append("second inside")
            wait_until(lambda: "first left" in steps)
            # The first block left after this one entered: this acquisition is untouched.
            return held.held and held.owned()

    one, two = start(first), start(second)
    one.result()
    assert two.result() is True
    assert store.lock_info(name) is None


def test_release_reports_a_loss_already_reported_by_the_renewal(store: Store, name: str) -> None:
    """The server applied the renewal, but answered after the lease surely ran out: the
    loss was reported, so the release must say so too, whatever the server says now."""
    lost: list[Lock] = []
    # Renewal due at 0.8 s, applied at 1.2 s (the server keeps it until 3.6 s), answered
    # at 3.6 s: the loss is reported at 2.4 s, leaving the release 1.2 s to find it held.
    slow_store, backend = delayed(store, extend=0.4, extend_reply=2.4)
    lock = slow_store.lock(name, ttl=2.4, auto_renew=True, on_lost=lost.append)
    assert lock.acquire()
    wait_until(lambda: bool(lost))
    with pytest.raises(LockLost):
        lock.release()
    assert store.lock_info(name) is None  # freed by the release, not by its TTL
    wait_until(lambda: backend.extends_done == 1)  # answered, or abandoned


def test_hold_for_on_an_inner_release_applies_when_the_last_one_frees_it(
    store: Store, other_store: Store, name: str
) -> None:
    lock = store.lock(name, ttl=30, reentrant=True)
    assert lock.acquire() and lock.acquire()
    lock.release(hold_for=30)  # still held by the outer acquisition
    assert lock.owned()
    lock.release()
    info = store.lock_info(name)
    assert info is not None and info.owner is None  # kept closed, ownerless
    assert not other_store.lock(name, ttl=10).acquire()
    assert store.force_release(name)
