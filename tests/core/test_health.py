"""Marking a pool's servers down and back, with a fake clock: no server, no sleep."""

from __future__ import annotations

import pytest

from corral.core.health import Admission, Change, Health


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(limit: int = 3, retry_after: float = 10.0) -> tuple[Health, FakeClock]:
    clock = FakeClock()
    return Health(["a", "b"], failure_limit=limit, retry_after=retry_after, clock=clock), clock


def test_a_server_is_up_until_failure_limit_consecutive_failures() -> None:
    health, _ = make()
    assert health.failed("a") is None
    assert health.failed("a") is None
    assert health.admit("a") is Admission.UP
    assert health.failed("a", "timed out") is Change.WENT_DOWN
    assert health.admit("a") is Admission.DOWN
    assert health.is_down("a") and health.any_down
    assert health.last_error("a") == "timed out"
    assert health.admit("b") is Admission.UP


def test_a_success_resets_the_count() -> None:
    health, _ = make()
    health.failed("a")
    health.failed("a")
    assert health.succeeded("a") is None
    health.failed("a")
    health.failed("a")
    assert health.admit("a") is Admission.UP


def test_one_probe_after_retry_after_and_others_still_see_it_down() -> None:
    health, clock = make(limit=1)
    assert health.failed("a") is Change.WENT_DOWN
    assert health.down_until("a") == 1010.0
    clock.now = 1009.9
    assert health.admit("a") is Admission.DOWN
    clock.now = 1010.0
    assert health.admit("a") is Admission.PROBE
    assert health.admit("a") is Admission.DOWN  # the probe is taken
    assert health.is_down("a")
    assert health.succeeded("a") is Change.CAME_BACK
    assert health.admit("a") is Admission.UP
    assert not health.is_down("a") and not health.any_down


def test_a_failed_probe_keeps_it_down_for_another_interval() -> None:
    health, clock = make(limit=2)
    health.failed("a")
    health.failed("a")
    clock.now = 1015.0
    assert health.admit("a") is Admission.PROBE
    assert health.failed("a") is Change.STILL_DOWN
    assert health.down_until("a") == 1025.0
    assert health.admit("a") is Admission.DOWN
    clock.now = 1025.0
    assert health.admit("a") is Admission.PROBE


def test_an_abandoned_probe_frees_the_probe() -> None:
    health, clock = make(limit=1)
    health.failed("a")
    clock.now = 1010.0
    assert health.admit("a") is Admission.PROBE
    health.abandoned("a")
    assert health.admit("a") is Admission.PROBE


def test_late_failures_of_calls_admitted_before_do_not_extend_the_interval() -> None:
    health, clock = make(limit=1)
    health.failed("a")
    clock.now = 1005.0
    assert health.failed("a") is None
    assert health.down_until("a") == 1010.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Health(["a"], failure_limit=0, retry_after=1, clock=FakeClock())
    with pytest.raises(ValueError):
        Health(["a"], failure_limit=1, retry_after=-1, clock=FakeClock())
