"""Hot-key detection on a fake clock: no server, no sleep."""

from __future__ import annotations

import random

from corral.core.hotkeys import HotKeys


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def servers(key: str) -> str:
    return "a" if key.startswith("a") else "b"


def feed(hot: HotKeys, reads: list[str], rng: random.Random) -> None:
    for key in reads:
        hot.observe(key, servers, rng.random())


def test_a_key_taking_a_large_share_of_its_server_is_hot_in_the_next_window() -> None:
    clock = FakeTime()
    hot = HotKeys(clock, sample=1.0, window=10, share=0.1, min_samples=32)
    rng = random.Random(1)
    reads = ["a-popular"] * 300 + [f"a-{i}" for i in range(1000)] + [f"b-{i}" for i in range(900)]
    rng.shuffle(reads)
    feed(hot, reads, rng)
    assert not hot.is_hot("a-popular")  # judged when the window ends
    clock.now = 10.0
    assert hot.is_hot("a-popular")
    assert not hot.is_hot("a-1")
    (found,) = hot.hot()
    assert (found.key, found.server) == ("a-popular", "a")
    assert abs(found.share - 300 / 1300) < 1e-9


def test_even_reads_make_no_key_hot() -> None:
    clock = FakeTime()
    hot = HotKeys(clock, sample=1.0, window=10, share=0.1, min_samples=32)
    rng = random.Random(2)
    feed(hot, [f"a-{i % 50}" for i in range(5000)], rng)
    clock.now = 10.0
    assert hot.hot() == []


def test_a_quiet_server_s_only_key_is_not_hot() -> None:
    clock = FakeTime()
    hot = HotKeys(clock, sample=1.0, window=10, share=0.1, min_samples=32)
    feed(hot, ["b-lonely"] * 5 + [f"a-{i}" for i in range(1000)], random.Random(3))
    clock.now = 10.0
    assert not hot.is_hot("b-lonely")


def test_hotness_ends_when_the_reads_stop() -> None:
    clock = FakeTime()
    hot = HotKeys(clock, sample=1.0, window=10, share=0.1, min_samples=32)
    feed(hot, ["a-popular"] * 100 + ["a-x"] * 100, random.Random(4))
    clock.now = 10.0
    assert hot.is_hot("a-popular")
    clock.now = 20.0  # a window with no reads
    assert not hot.is_hot("a-popular")


def test_counts_older_than_a_window_are_ignored() -> None:
    clock = FakeTime()
    hot = HotKeys(clock, sample=1.0, window=10, share=0.1, min_samples=32)
    feed(hot, ["a-popular"] * 100, random.Random(5))
    clock.now = 35.0  # idle for two windows: those reads are history
    assert not hot.is_hot("a-popular")


def test_sampling_counts_about_the_sampled_share() -> None:
    clock = FakeTime()
    hot = HotKeys(clock, sample=0.25, window=10, share=0.1, min_samples=32)
    rng = random.Random(6)
    feed(hot, ["a-popular"] * 4000 + [f"a-{i}" for i in range(4000)], rng)
    clock.now = 10.0
    (found,) = hot.hot()
    assert 0.4 < found.share < 0.6


def test_memory_is_bounded_and_a_heavy_key_survives_the_pruning() -> None:
    clock = FakeTime()
    hot = HotKeys(clock, sample=1.0, window=10, share=0.05, min_samples=32, tracked=100)
    rng = random.Random(7)
    reads = []
    for i in range(10_000):
        reads.append(f"a-once-{i}")
        if i % 10 == 0:
            reads.append("a-popular")
    feed(hot, reads, rng)
    assert len(hot._keys) <= 100
    clock.now = 10.0
    assert [h.key for h in hot.hot()] == ["a-popular"]


def test_locate_is_asked_only_for_sampled_reads() -> None:
    clock = FakeTime()
    hot = HotKeys(clock, sample=0.5, window=10)
    asked: list[str] = []

    def locate(key: str) -> str:
        asked.append(key)
        return "a"

    hot.observe("k", locate, 0.9)
    assert asked == []
    hot.observe("k", locate, 0.1)
    hot.observe("k", locate, 0.2)
    assert asked == ["k"]  # once per key and window
