"""The cache policy, branch by branch, with chosen times and random draws: no I/O, no sleeps."""

from __future__ import annotations

import math

import pytest

from corral.core import cachepolicy as policy
from corral.core.cachepolicy import Action, CacheOptions, decide
from corral.core.envelope import Entry, EntryHeader
from corral.errors import ConfigError

NOW = 1_000_000.0


def entry(
    fresh_until: float, *, retry_until: float = 0.0, delta: float = 0.05, value: object = "v"
) -> Entry:
    codec = "n" if value is None else "j"
    return Entry(EntryHeader(fresh_until, retry_until, delta, 0, codec), value)


def test_fresh_is_returned() -> None:
    d = decide(entry(NOW + 10), now=NOW, won=None, options=CacheOptions(), draw=0.5)
    assert d.action is Action.RETURN and not d.stale


def test_missing_and_won_computes_missing_and_lost_waits() -> None:
    assert decide(None, now=NOW, won=True, options=CacheOptions(), draw=0.5).action is (
        Action.RECOMPUTE
    )
    assert decide(None, now=NOW, won=False, options=CacheOptions(), draw=0.5).action is Action.WAIT


def test_stale_within_stale_ttl_is_served_to_losers_and_recomputed_by_the_winner() -> None:
    options = CacheOptions(ttl=1, stale_ttl=30)
    old = entry(NOW - 5)
    assert decide(old, now=NOW, won=False, options=options, draw=0.5) == policy.Decision(
        Action.RETURN, stale=True
    )
    assert decide(old, now=NOW, won=True, options=options, draw=0.5).action is Action.RECOMPUTE


def test_stale_with_background_hands_the_recompute_over() -> None:
    options = CacheOptions(ttl=1, stale_ttl=30, background=True)
    d = decide(entry(NOW - 5), now=NOW, won=True, options=options, draw=0.5)
    assert d.action is Action.RECOMPUTE_IN_BACKGROUND and d.stale


def test_stale_past_stale_ttl_is_as_good_as_missing() -> None:
    options = CacheOptions(ttl=1, stale_ttl=3)
    old = entry(NOW - 5)
    assert decide(old, now=NOW, won=False, options=options, draw=0.5).action is Action.WAIT
    assert decide(old, now=NOW, won=True, options=options, draw=0.5).action is Action.RECOMPUTE


def test_without_stale_ttl_an_expired_entry_is_never_served() -> None:
    old = entry(NOW - 0.001)
    assert decide(old, now=NOW, won=False, options=CacheOptions(), draw=0.5).action is Action.WAIT


def test_an_invalidated_entry_is_served_stale_while_the_server_keeps_it() -> None:
    invalidated = entry(0.0)
    options = CacheOptions(stale_ttl=10)
    assert decide(invalidated, now=NOW, won=False, options=options, draw=0.5).stale
    assert decide(invalidated, now=NOW, won=False, options=CacheOptions(), draw=0.5).action is (
        Action.WAIT
    )


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        # now - delta*beta*ln(draw) >= fresh_until  <=>  -ln(draw) >= (fresh_until-now)/delta
        (math.exp(-1.9), Action.RETURN),  # head start 1.9*delta < 2*delta left
        (math.exp(-2.1), Action.TRY_EARLY),  # 2.1*delta >= 2*delta left
    ],
)
def test_xfetch_fires_exactly_at_its_threshold(draw: float, expected: Action) -> None:
    options = CacheOptions(early_recompute="xfetch")
    fresh = entry(NOW + 0.2, delta=0.1)
    assert decide(fresh, now=NOW, won=None, options=options, draw=draw).action is expected


def test_xfetch_probability_rises_towards_expiry() -> None:
    draws = [i / 1000 for i in range(1, 1001)]
    options = CacheOptions(early_recompute="xfetch")

    def share(left: float) -> float:
        fresh = entry(NOW + left, delta=0.1)
        fired = [decide(fresh, now=NOW, won=None, options=options, draw=d) for d in draws]
        return sum(d.action is Action.TRY_EARLY for d in fired) / len(draws)

    shares = [share(left) for left in (1.0, 0.3, 0.1, 0.01)]
    assert shares == sorted(shares) and shares[0] < 0.01 and shares[-1] > 0.85


def test_beta_scales_the_head_start() -> None:
    fresh = entry(NOW + 0.2, delta=0.1)
    draw = math.exp(-1.0)  # head start = delta * beta
    for beta, expected in ((1.0, Action.RETURN), (3.0, Action.TRY_EARLY)):
        options = CacheOptions(early_recompute="xfetch", beta=beta)
        assert decide(fresh, now=NOW, won=None, options=options, draw=draw).action is expected


def test_a_claim_won_on_a_fresh_entry_is_an_early_recompute() -> None:
    d = decide(entry(NOW + 5), now=NOW, won=True, options=CacheOptions(), draw=0.5)
    assert d.action is Action.RECOMPUTE and d.early


def test_a_remembered_error_serves_stale_or_fails_fast() -> None:
    options = CacheOptions(error_ttl=30, stale_ttl=60)
    with_value = entry(NOW - 5, retry_until=NOW + 10)
    without = entry(0.0, retry_until=NOW + 10, value=None)
    assert decide(with_value, now=NOW, won=False, options=options, draw=0.5) == policy.Decision(
        Action.RETURN, stale=True
    )
    assert decide(without, now=NOW, won=None, options=options, draw=0.5).action is Action.FAIL
    # Won anyway (a race with the marker's write): release without computing.
    assert decide(with_value, now=NOW, won=True, options=options, draw=0.5).action is (
        Action.RELEASE_AND_RETURN
    )
    # Without stale_ttl, an expired value is not served even beside a remembered error.
    no_stale = CacheOptions(error_ttl=30)
    assert decide(with_value, now=NOW, won=False, options=no_stale, draw=0.5).action is (
        Action.FAIL
    )
    # A fresh value beside a remembered error (an early recompute failed) is served.
    fresh = entry(NOW + 5, retry_until=NOW + 10)
    assert decide(fresh, now=NOW, won=False, options=no_stale, draw=0.5) == policy.Decision(
        Action.RETURN
    )


def test_nothing_usable_and_no_claim_made_tries_the_lock() -> None:
    assert decide(None, now=NOW, won=None, options=CacheOptions(), draw=0.5).action is (
        Action.TRY_LOCK
    )


def test_an_expired_error_marker_without_value_is_missing() -> None:
    marker = entry(0.0, retry_until=NOW - 1, value=None)
    d = decide(marker, now=NOW, won=True, options=CacheOptions(), draw=0.5)
    assert d.action is Action.RECOMPUTE


def test_after_wait_timeout() -> None:
    compute, raising = CacheOptions(), CacheOptions(on_timeout="raise")
    assert policy.after_wait_timeout(None, NOW, compute) is Action.RECOMPUTE
    assert policy.after_wait_timeout(None, NOW, raising) is Action.FAIL
    stale = entry(NOW - 1)
    served = CacheOptions(stale_ttl=10, on_timeout="raise")
    assert policy.after_wait_timeout(stale, NOW, served) is Action.RETURN


def test_after_compute_error_serves_stale_if_there_is_one() -> None:
    options = CacheOptions(stale_ttl=10)
    assert policy.after_compute_error(entry(NOW - 1), NOW, options) is Action.RETURN
    assert policy.after_compute_error(None, NOW, options) is Action.FAIL
    assert policy.after_compute_error(entry(NOW - 100), NOW, options) is Action.FAIL
    # An early recompute that fails still has a fresh value to return.
    assert policy.after_compute_error(entry(NOW + 5), NOW, CacheOptions()) is Action.RETURN


def test_jitter_factor_stays_in_range_and_by_key_is_stable() -> None:
    assert policy.jitter_factor(0.0, "random", "k", 0.9) == 1.0
    assert policy.jitter_factor(0.1, "random", "k", 0.0) == pytest.approx(0.9)
    assert policy.jitter_factor(0.1, "random", "k", 0.999999) == pytest.approx(1.1, abs=1e-5)
    by_key = [policy.jitter_factor(0.2, "key", f"user:{i}", 0.5) for i in range(2000)]
    assert all(0.8 <= f <= 1.2 for f in by_key)
    assert by_key == [policy.jitter_factor(0.2, "key", f"user:{i}", 0.1) for i in range(2000)]
    assert min(by_key) < 0.82 and max(by_key) > 1.18  # spread over the whole range


def test_server_keep_covers_stale_ttl_and_errors() -> None:
    assert policy.server_keep(NOW + 10, NOW, 0.0) == pytest.approx(10)
    assert policy.server_keep(NOW + 10, NOW, 5.0) == pytest.approx(15)
    assert policy.server_keep(NOW - 10, NOW, 0.0, retry_until=NOW + 30) == pytest.approx(30)
    assert policy.server_keep(NOW - 10, NOW, 0.0) == policy.MIN_KEEP


@pytest.mark.parametrize(
    "bad",
    [
        {"ttl": 0},
        {"ttl": -1},
        {"ttl": float("nan")},
        {"ttl": "10"},
        {"stale_ttl": -1},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"jitter_by": "time"},
        {"on_timeout": "wait"},
        {"early_recompute": "probabilistic"},
        {"lock_wait": -1},
        {"error_ttl": -1},
        {"local_ttl": -2},
        {"beta": -1},
    ],
)
def test_bad_options_are_config_errors(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        CacheOptions(**bad)  # type: ignore[arg-type]
