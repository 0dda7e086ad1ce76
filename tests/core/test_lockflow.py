"""The lock's decisions, driven by a fake clock: no server, no sleeps."""

from __future__ import annotations

import math
import random

import pytest

import corral
from corral.core.backoff import Backoff
from corral.core.clock import FakeClock
from corral.core.lockflow import (
    NOTIFIED_RECHECK,
    RenewalSchedule,
    WaitPlan,
    make_owner,
    outcome_error,
)
from corral.core.primitives import Attempt, Outcome
from corral.core.validate import check_name, check_ttl, check_wait
from corral.errors import ConfigError, LockExpired, LockLost

BUSY = Attempt(False, holder_ttl=None)


def plan(wait: float | None, *, fail_fast: bool = False, notifies: bool = True) -> WaitPlan:
    return WaitPlan(
        now=100.0,
        wait=wait,
        fail_fast=fail_fast,
        notifies=notifies,
        backoff=Backoff(rng=random.Random(7)),
    )


def test_wait_zero_gives_up_at_once() -> None:
    assert plan(0).next_wait(100.0, BUSY) is None


def test_wait_never_exceeds_the_deadline() -> None:
    p = plan(0.25)
    delay = p.next_wait(100.0, BUSY)
    assert delay is not None and delay <= 0.25
    assert p.next_wait(100.2, BUSY) == pytest.approx(0.05)
    assert p.next_wait(100.25, BUSY) is None


def test_wait_forever_never_gives_up() -> None:
    p = plan(None)
    for now in (100.0, 1e6, 1e9):
        assert p.next_wait(now, BUSY) == NOTIFIED_RECHECK


def test_waiter_wakes_when_the_holder_expires() -> None:
    p = plan(10)
    assert p.next_wait(100.0, Attempt(False, holder_ttl=0.3)) == pytest.approx(0.3)


def test_zero_ttl_still_waits_a_moment() -> None:
    delay = plan(10).next_wait(100.0, Attempt(False, holder_ttl=0.0))
    assert delay is not None and 0 < delay < 0.01


def test_fail_fast_gives_up_when_the_holder_outlasts_the_wait() -> None:
    p = plan(5, fail_fast=True)
    assert p.next_wait(100.0, Attempt(False, holder_ttl=6)) is None
    assert p.next_wait(100.0, Attempt(False, holder_ttl=4)) is not None
    # Later in the wait, less time is left: a 4 s holder now outlasts it.
    assert p.next_wait(102.0, Attempt(False, holder_ttl=4)) is None


def test_fail_fast_needs_a_known_ttl() -> None:
    assert plan(5, fail_fast=True).next_wait(100.0, BUSY) is not None


def test_polling_backends_back_off_with_jitter_under_a_cap() -> None:
    p = plan(None, notifies=False)
    delays = [p.next_wait(100.0, BUSY) for _ in range(200)]
    assert all(d is not None and 0 < d <= p.backoff.cap for d in delays)
    assert len({round(d or 0, 6) for d in delays}) > 20  # jittered, not lock-step
    assert max(d or 0 for d in delays) == pytest.approx(p.backoff.cap)


def test_fair_waiters_refresh_their_place() -> None:
    p = WaitPlan(now=0, wait=None, fail_fast=False, notifies=True, refresh_every=0.2)
    assert p.next_wait(0, BUSY) == pytest.approx(0.2)


def test_a_waiter_joins_the_queue_after_the_starvation_guard() -> None:
    plan = WaitPlan(now=0.0, wait=1.0, fail_fast=False, notifies=False, queue_after=0.1)
    assert not plan.should_queue(0.05)
    assert plan.should_queue(0.1)
    plan.queue(refresh_every=1.0)
    assert not plan.should_queue(0.5)  # once only


def test_a_wait_shorter_than_the_starvation_guard_never_queues() -> None:
    # Even when its first attempt answers after the guard: the wait is over by then.
    plan = WaitPlan(now=0.0, wait=0.05, fail_fast=False, notifies=False, queue_after=0.1)
    assert not plan.should_queue(0.3)
    assert plan.next_wait(0.3, Attempt(acquired=False)) is None


def test_a_wait_as_long_as_the_starvation_guard_never_queues() -> None:
    plan = WaitPlan(now=0.0, wait=0.1, fail_fast=False, notifies=False, queue_after=0.1)
    assert not plan.should_queue(0.1)


def test_a_slow_first_attempt_does_not_queue_past_the_deadline() -> None:
    # A wait longer than the guard, whose first attempt answered after the wait ended:
    # no queue place, and no further attempt.
    plan = WaitPlan(now=0.0, wait=0.5, fail_fast=False, notifies=False, queue_after=0.1)
    assert not plan.should_queue(0.6)
    assert plan.next_wait(0.6, Attempt(acquired=False)) is None
    # Answered within the wait: it queues.
    plan = WaitPlan(now=0.0, wait=0.5, fail_fast=False, notifies=False, queue_after=0.1)
    assert plan.should_queue(0.3)


def test_backoff_validates() -> None:
    with pytest.raises(ValueError):
        Backoff(initial=0)
    with pytest.raises(ValueError):
        Backoff(initial=1, cap=0.5)
    b = Backoff(initial=0.01, cap=0.02, rng=random.Random(1))
    assert all(0.01 <= b.next() <= 0.02 for _ in range(50))
    b.reset()


def test_renewal_every_third_of_the_ttl() -> None:
    s = RenewalSchedule(ttl=30, acquired_at=0)
    assert s.due == pytest.approx(10)
    assert s.valid_until == pytest.approx(30)
    s.renewed(sent_at=10)
    assert s.due == pytest.approx(20) and s.valid_until == pytest.approx(40)
    s.renewed(sent_at=20, ttl=60)
    assert s.due == pytest.approx(40) and s.valid_until == pytest.approx(80)


def test_renewal_retries_while_the_lease_lasts_then_gives_up() -> None:
    s = RenewalSchedule(ttl=3, acquired_at=0)
    now = 1.0
    retries = 0
    while s.failed(now):
        retries += 1
        assert now < s.due < 3  # every retry lands inside the lease
        now = s.due
    assert retries > 3
    assert now < 3 and not s.failed(3.0)


def test_outcome_errors_name_the_lock_and_server() -> None:
    assert outcome_error(Outcome.OK, "job", "redis://h:1/0", "release") is None
    expired = outcome_error(Outcome.EXPIRED, "job", "redis://h:1/0", "release")
    lost = outcome_error(Outcome.LOST, "job", "redis://h:1/0", "extend")
    assert isinstance(expired, LockExpired) and isinstance(lost, LockLost)
    for error in (expired, lost):
        assert "'job'" in str(error) and "redis://h:1/0" in str(error)


def test_owner_is_unique_and_readable() -> None:
    owners = {make_owner("worker-1") for _ in range(1000)}
    assert len(owners) == 1000
    assert all(":worker-1:" in owner for owner in owners)


def test_validation() -> None:
    assert check_ttl(1) == 1.0
    for bad in (0, -1, math.inf, math.nan, True, "1", None, 0.0001):
        with pytest.raises(ConfigError):
            check_ttl(bad)
    assert check_wait(None) is None and check_wait(math.inf) is None
    with pytest.raises(ConfigError):
        check_wait(-0.1)
    with pytest.raises(TypeError):
        check_name(b"x")
    with pytest.raises(ConfigError):
        check_name("")


# The whole lock over the in-process backend, with the clock in the test's hands.


def test_ttl_is_exact_under_a_fake_clock() -> None:
    clock = FakeClock()
    store = corral.connect("memory://", clock=clock)
    first = store.lock("job", ttl=30)
    second = store.lock("job", ttl=30)
    assert first.acquire()
    clock.advance(29.999)
    assert not second.acquire()
    info = store.lock_info("job")
    assert info is not None and info.ttl == pytest.approx(0.001)
    clock.advance(0.002)
    assert second.acquire()
    assert second.token == 2
    with pytest.raises(LockLost):
        first.release()
    clock.advance(31)
    with pytest.raises(LockExpired):
        second.extend()


def test_acquiring_again_after_the_lease_ran_out_reports_the_loss() -> None:
    clock = FakeClock()
    store = corral.connect("memory://", clock=clock)
    lock = store.lock("job", ttl=10)
    other = store.lock("job", ttl=10)
    assert lock.acquire() and lock.held
    clock.advance(10)
    assert not lock.held
    # The holder's second acquire must not quietly start a new acquisition: the
    # first one's work may have overlapped with somebody else's.
    with pytest.raises(LockExpired):
        lock.acquire()
    assert lock.acquire()  # the loss was reported; the handle starts afresh
    assert lock.token == 2
    lock.release()
    assert lock.acquire()
    clock.advance(10)
    assert other.acquire()
    with pytest.raises(LockLost):
        lock.acquire()
    assert other.token == 4


def test_hold_for_under_a_fake_clock() -> None:
    clock = FakeClock()
    store = corral.connect("memory://", clock=clock)
    lock = store.lock("daily", ttl=60)
    assert lock.acquire()
    lock.release(hold_for=3600)
    clock.advance(3599)
    assert not lock.acquire()
    clock.advance(2)
    assert lock.acquire()
