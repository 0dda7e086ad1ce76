# Generated from tests/_async/test_gather_within.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`_compat.gather_within`: calls side by side on independent servers (Redlock's quorum)."""

from __future__ import annotations

from collections.abc import Sequence

from corral._sync._compat import Event, gather_within


def answer(value: int) -> int:
    return value


def fail() -> int:
    raise ValueError("refused")


def test_each_call_answers_in_order_with_its_error_or_its_silence() -> None:
    never = Event()

    def silent() -> int:
        never.wait(30)
        return 3

    try:
        # Long enough for the instant answers (threads in the blocking flavour) to come
        # in, even if the process pauses.
        answers = gather_within([lambda: answer(1), fail, silent], 2.0)
    finally:
        never.set()  # frees the blocking flavour's thread
    assert answers[0] == 1
    assert isinstance(answers[1], ValueError)
    assert isinstance(answers[2], TimeoutError)


def test_enough_ends_the_wait_and_the_rest_finish_on_their_own() -> None:
    go_on = Event()
    finished = Event()

    def slow() -> int:
        go_on.wait(30)
        finished.set()
        return 3

    def two(found: Sequence[object]) -> bool:
        return sum(answer is not None for answer in found) >= 2

    answers = gather_within([lambda: answer(1), slow, lambda: answer(2)], 30, two)
    assert answers == [1, None, 2]
    go_on.set()
    assert finished.wait(10), "the call still running was abandoned"


def test_enough_may_decide_before_any_answer() -> None:
    go_on = Event()

    def slow() -> int:
        go_on.wait(30)
        return 1

    try:
        assert gather_within([slow, slow], 30, lambda found: True) == [None, None]
    finally:
        go_on.set()
    assert gather_within([], 30) == []
