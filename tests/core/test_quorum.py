"""The quorum decisions of `redis+redlock://`, without a server."""

from __future__ import annotations

import pytest

from corral.core import quorum
from corral.core.primitives import Attempt, LockInfo, Outcome

GRANT = Attempt(True, token=10)


def held(ttl: float | None) -> Attempt:
    return Attempt(False, holder_ttl=ttl)


@pytest.mark.parametrize(("masters", "needed"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)])
def test_a_majority_is_more_than_half(masters: int, needed: int) -> None:
    assert quorum.majority(masters) == needed


def test_no_masters_is_no_quorum() -> None:
    with pytest.raises(ValueError, match="at least one"):
        quorum.majority(0)


def test_validity_is_the_ttl_less_time_spent_and_drift() -> None:
    assert quorum.drift(10.0) == pytest.approx(0.102)
    assert quorum.validity(10.0, 0.5) == pytest.approx(10.0 - 0.5 - 0.102)
    assert quorum.validity(1.0, 0.99) < 0


def test_one_master_is_waited_for_at_most_a_third_of_the_ttl() -> None:
    assert quorum.master_timeout(30.0, 5.0) == 5.0
    assert quorum.master_timeout(3.0, 5.0) == pytest.approx(1.0)


def test_granted_by_a_majority_takes_the_largest_token() -> None:
    replies = [Attempt(True, token=7), None, Attempt(True, token=12)]
    decision = quorum.decide_acquire(replies, ttl=10.0, elapsed=0.1)
    assert decision.granted and decision.reachable
    assert decision.token == 12
    assert decision.grants == 2
    assert decision.validity == pytest.approx(10.0 - 0.1 - 0.102)


def test_a_majority_granted_too_late_is_not_granted() -> None:
    decision = quorum.decide_acquire([GRANT, GRANT, GRANT], ttl=1.0, elapsed=0.995)
    assert not decision.granted
    assert decision.reachable
    assert decision.holder_ttl is None  # nobody else holds it: retry at once


def test_a_minority_of_grants_is_not_granted() -> None:
    decision = quorum.decide_acquire([GRANT, held(4.0), held(2.0)], ttl=10.0, elapsed=0.0)
    assert not decision.granted and decision.reachable
    # One more master must be free; the sooner of the two holders frees one.
    assert decision.holder_ttl == 2.0


def test_holder_ttl_is_when_a_majority_could_be_free() -> None:
    decision = quorum.decide_acquire(
        [held(1.0), held(5.0), held(3.0), held(9.0), held(2.0)], ttl=10.0, elapsed=0.0
    )
    assert decision.holder_ttl == 3.0  # three of five must be free: the third soonest


def test_holder_ttl_is_unknown_when_too_few_masters_said() -> None:
    decision = quorum.decide_acquire([held(1.0), held(None), None], ttl=10.0, elapsed=0.0)
    assert decision.holder_ttl is None
    assert decision.reachable  # two answered: a refusal is an answer


def test_fewer_than_a_majority_answering_is_unreachable() -> None:
    decision = quorum.decide_acquire([GRANT, None, None], ttl=10.0, elapsed=0.0)
    assert not decision.granted and not decision.reachable


def test_a_change_holds_when_a_majority_applied_it() -> None:
    assert quorum.decide_change([Outcome.OK, Outcome.OK, None]) is Outcome.OK
    assert quorum.decide_change([Outcome.OK, Outcome.EXPIRED, Outcome.OK]) is Outcome.OK


def test_a_change_without_a_majority_answering_is_undecided() -> None:
    assert quorum.decide_change([Outcome.OK, None, None]) is None


def test_a_change_that_failed_is_lost_when_another_may_hold_a_majority() -> None:
    assert quorum.decide_change([Outcome.LOST, Outcome.LOST, Outcome.OK]) is Outcome.LOST
    assert quorum.decide_change([Outcome.LOST, None, Outcome.EXPIRED]) is Outcome.LOST
    assert quorum.decide_change([Outcome.LOST, Outcome.EXPIRED, Outcome.OK]) is Outcome.EXPIRED
    assert quorum.decide_change([Outcome.EXPIRED, Outcome.EXPIRED, None]) is Outcome.EXPIRED


def test_a_release_counts_the_silent_masters_as_possibly_still_holding() -> None:
    # Granted by A and B, then A died: B's release is the owner's to make.
    assert quorum.decide_release([None, Outcome.OK, Outcome.EXPIRED]) is Outcome.OK
    assert quorum.decide_release([None, Outcome.OK, Outcome.LOST]) is Outcome.OK
    assert quorum.decide_release([None, Outcome.EXPIRED, Outcome.EXPIRED]) is Outcome.EXPIRED
    assert quorum.decide_release([None, Outcome.LOST, Outcome.LOST]) is Outcome.LOST
    assert quorum.decide_release([Outcome.OK, Outcome.EXPIRED, Outcome.EXPIRED]) is (
        Outcome.EXPIRED
    )
    assert quorum.decide_release([Outcome.OK, None, None]) is None


def test_an_extend_applied_too_late_does_not_hold() -> None:
    applied = [Outcome.OK, Outcome.OK, Outcome.OK]
    assert quorum.decide_change(applied, elapsed=0.2, ttl=1.0) is Outcome.OK
    assert quorum.decide_change(applied, elapsed=1.0, ttl=1.0) is Outcome.EXPIRED


def info(owner: str | None, token: int, ttl: float) -> LockInfo:
    return LockInfo("n", owner, token, ttl)


def test_the_holder_is_the_owner_found_on_a_majority() -> None:
    found = [info("a", 7, 9.0), info("a", 7, 8.0), info("b", 9, 3.0)]
    assert quorum.decide_inspect("n", found, 3) == info("a", 7, 8.0)
    five = [info("a", 5, 9.0), info("a", 7, 8.0), info("a", 6, 2.0), None, None]
    assert quorum.decide_inspect("n", five, 5) == info("a", 5, 2.0)


def test_the_token_is_the_one_a_majority_holds() -> None:
    # The acquisition wrote its token back to a majority; a master whose grant came
    # too late to count has its own, larger one.
    found = [info("a", 7, 9.0), info("a", 9, 8.0), info("a", 7, 8.0)]
    assert quorum.decide_inspect("n", found, 3) == info("a", 7, 8.0)
    # One of the majority is down: the late grant's token is the larger one.
    assert quorum.decide_inspect("n", [info("a", 9, 8.0), info("a", 7, 8.0)], 3).token == 7


def test_no_owner_on_a_majority_is_free() -> None:
    assert quorum.decide_inspect("n", [info("a", 5, 9.0), None, info("b", 6, 9.0)], 3) is None
    assert quorum.decide_inspect("n", [info("a", 5, 9.0), None], 3) is None


def test_a_lock_closed_by_hold_for_is_held_by_nobody() -> None:
    found = [info(None, 6, 1.0), info(None, 6, 2.0), None]
    assert quorum.decide_inspect("n", found, 3) == info(None, 6, 1.0)
