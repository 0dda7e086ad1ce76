# Generated from tests/_async/test_cache_placement.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Where entries live: shard keys, replicas and hot keys, on every backend.

On one server these options change nothing about where an entry lives, but
they are accepted, validated and keep every other promise; the tests marked
for pools check placement on several servers.
"""

from __future__ import annotations

import pytest

from corral import Store
from corral.core.placement import placement_key, recompute_lock_name
from corral.errors import ConfigError
from tests._sync.computations import Counter

pytestmark = pytest.mark.capability("cache")


def test_shard_key_reaches_the_same_entry_for_every_method(
    store: Store, other_store: Store, name: str
) -> None:
    cache, other = store.cache(name), other_store.cache(name)
    cache.set("profile", {"n": 1}, shard_key="user:7")
    cache.set_many({"a": 1, "b": 2}, shard_key="user:7")
    assert other.get("profile", shard_key="user:7") == {"n": 1}
    assert other.get_many(["a", "b", "c"], shard_key="user:7") == {"a": 1, "b": 2}
    compute = Counter("computed")
    assert other.get_or_compute("a", compute, shard_key="user:7") == 1
    assert compute.calls == 0
    assert other.invalidate("a", shard_key="user:7")
    assert other.get("a", shard_key="user:7") is None
    assert other.delete("b", shard_key="user:7")
    assert cache.get("b", shard_key="user:7") is None
    assert cache.get_or_compute("b", compute, shard_key="user:7") == "computed"
    assert compute.calls == 1


def test_a_shard_key_must_be_a_str(store: Store, name: str) -> None:
    cache = store.cache(name)
    with pytest.raises(TypeError):
        cache.get("k", shard_key=7)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.set("k", 1, shard_key=b"7")  # type: ignore[arg-type]
    assert cache.get("k") is None  # nothing written


def test_replicas_beyond_the_servers_are_refused(store: Store, name: str) -> None:
    servers = len(store.backend.servers)
    with pytest.raises(ConfigError, match="replicas"):
        store.cache(name, replicas=servers + 1)
    for bad in (0, -1, True, 1.5, "some"):
        with pytest.raises(ConfigError, match="replicas"):
            store.cache(name, replicas=bad)  # type: ignore[arg-type]
    cache = store.cache(name, replicas="all")
    assert cache.replicas == servers
    with pytest.raises(ConfigError, match="replicas"):
        cache.set("k", 1, replicas=servers + 1)
    with pytest.raises(ConfigError, match="replicas"):
        cache.get_or_compute("k", Counter(), replicas=0)
    assert cache.get("k") is None  # nothing written by a refused call


def test_replicated_entries_are_read_written_and_deleted(
    store: Store, other_store: Store, name: str
) -> None:
    cache, other = store.cache(name, replicas="all"), other_store.cache(name)
    cache.set("k", "v")
    for _ in range(10):  # whichever replica a read picks
        assert cache.get("k") == "v"
        assert other.get("k") == "v"
    assert other.delete("k")
    for _ in range(10):
        assert cache.get("k") is None
    compute = Counter()
    assert cache.get_or_compute("k", compute, replicas="all") == 1
    assert cache.get_or_compute("k", compute) == 1
    assert compute.calls == 1


def test_hot_keys_are_named_in_stats(store: Store, name: str) -> None:
    cache = store.cache(name, hot_keys=True)
    assert cache.stats()["hot_keys"] == []
    hot = cache._hot
    assert hot is not None
    hot.sample, hot.min_samples, hot.window = 1.0, 10, 0.3
    hot._window_end = store.clock.now() + hot.window
    compute = Counter()
    for i in range(40):
        cache.get_or_compute("popular", compute)
        if i % 4 == 0:
            cache.get_or_compute(f"other-{i}", compute)
    while store.clock.now() < hot._window_end:
        cache.get("popular")
    assert cache.stats()["hot_keys"] == [cache.stored_key("popular")]
    assert cache.get_or_compute("popular", compute) == 1  # still the same entry


def test_a_recompute_lock_is_placed_with_its_entry() -> None:
    assert placement_key(recompute_lock_name("ns:k")) == "ns:k"
    assert placement_key(recompute_lock_name("ns:k", "user:7")) == "user:7"
    for shard in ["", ":", "a:b", "\x00cache@3:abc:", "7" * 30]:
        for stored in ["", "ns:k", "ns:\x00cache@1:x:y"]:
            assert placement_key(recompute_lock_name(stored, shard)) == shard
    assert placement_key("report") == "report"
    assert placement_key("\x00cache@9:short") == "\x00cache@9:short"
