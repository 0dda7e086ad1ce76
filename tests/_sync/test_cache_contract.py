# Generated from tests/_async/test_cache_contract.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""What `store.cache()` promises, on every backend, in both flavours.

Each test uses fresh names; two stores stand for two processes where the
backend is shared across processes. Timing tests wait for real TTLs (short
ones); no test asserts on how long something took.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from corral import Store, connect
from corral._sync import cache as cache_module
from corral.core import lockflow
from corral.core.envelope import encode, make_codec
from corral.errors import (
    BackendUnavailable,
    ConfigError,
    LockTimeout,
    SerializationError,
    SourceUnavailable,
)
from tests._sync.computations import Counter, Gated, until
from tests._sync.concurrency import sleep, start

pytestmark = pytest.mark.capability("cache")


@pytest.fixture
def third_store(backend_url: str, other_store: Store) -> Iterator[Store]:
    if other_store.capabilities.cross_process:
        with connect(backend_url) as opened:
            yield opened
    else:
        yield other_store


def test_get_or_compute_computes_once_then_hits(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=30)
    compute = Counter()
    assert cache.get_or_compute("k", compute) == 1
    assert cache.get_or_compute("k", compute) == 1
    assert compute.calls == 1
    stats = cache.stats()
    assert stats["misses"] == 1 and stats["hits"] == 1 and stats["computes"] == 1


def test_none_is_a_value_not_a_miss(store: Store, name: str) -> None:
    cache = store.cache(name)
    calls = 0

    def nothing() -> None:
        nonlocal calls
        calls += 1

    assert cache.get_or_compute("k", nothing) is None
    assert cache.get_or_compute("k", nothing) is None
    assert calls == 1
    assert cache.get("k", default="missing") is None


def test_another_client_reads_what_one_computed(
    store: Store, other_store: Store, name: str
) -> None:
    store.cache(name).get_or_compute("k", Counter({"a": [1, 2.5, "x"]}))
    compute = Counter("other")
    assert other_store.cache(name).get_or_compute("k", compute) == {"a": [1, 2.5, "x"]}
    assert compute.calls == 0


def test_get_set_delete(store: Store, other_store: Store, name: str) -> None:
    cache, other = store.cache(name), other_store.cache(name)
    assert cache.get("k") is None
    assert cache.get("k", default=0) == 0
    cache.set("k", {"v": 1})
    assert other.get("k") == {"v": 1}
    assert other.delete("k") is True
    assert cache.get("k") is None
    assert cache.delete("k") is False


def test_entries_expire_after_ttl(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=1.5)  # outlasts a paused process between set and get
    cache.set("k", 1)
    assert cache.get("k") == 1
    sleep(1.7)
    assert cache.get("k") is None
    compute = Counter()
    assert cache.get_or_compute("k", compute) == 1 and compute.calls == 1


def test_per_call_ttl(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=300)
    cache.set("short", 1, ttl=0.3)
    cache.get_or_compute("also-short", Counter(2), ttl=0.3)
    sleep(0.5)
    assert cache.get("short") is None and cache.get("also-short") is None


def test_get_many_and_set_many(store: Store, other_store: Store, name: str) -> None:
    cache = store.cache(name)
    cache.set_many({f"k{i}": i for i in range(20)})
    found = other_store.cache(name).get_many([f"k{i}" for i in range(25)])
    assert found == {f"k{i}": i for i in range(20)}
    assert cache.get_many([]) == {}


def test_namespaces_are_separate(store: Store, name: str) -> None:
    store.cache(f"{name}-a").set("k", "a")
    store.cache(f"{name}-b").set("k", "b")
    assert store.cache(f"{name}-a").get("k") == "a"
    assert store.cache(f"{name}-b").get("k") == "b"


def test_stale_value_served_with_stale_flag_only(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=0.3, stale_ttl=30)
    cache.set("k", "old")
    sleep(0.5)
    assert cache.get("k") is None
    assert cache.get("k", stale=True) == "old"
    assert cache.get_many(["k"], stale=True) == {"k": "old"}


def test_invalidate_keeps_the_value_for_stale_readers(
    store: Store, other_store: Store, name: str
) -> None:
    cache = store.cache(name, ttl=300, stale_ttl=30)
    cache.set("k", "v1")
    assert other_store.cache(name, stale_ttl=30).invalidate("k") is True
    assert cache.get("k") is None
    assert cache.get("k", stale=True) == "v1"
    # The next get_or_compute wins the lock (nobody else computes) and recomputes.
    assert cache.get_or_compute("k", Counter("v2")) == "v2"
    assert cache.get("k") == "v2"
    assert cache.invalidate("missing") is False


def test_invalidate_without_stale_ttl_is_gone_for_readers(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=300)
    cache.set("k", "v1")
    assert cache.invalidate("k") is True
    assert cache.get("k", stale=True) is None


def test_clear_is_seen_by_every_client_at_once(store: Store, other_store: Store, name: str) -> None:
    cache, other = store.cache(name, stale_ttl=60), other_store.cache(name, stale_ttl=60)
    cache.set_many({"a": 1, "b": 2})
    other.clear()
    assert cache.get_many(["a", "b"], stale=True) == {}
    assert cache.get("a", stale=True) is None
    compute = Counter("new")
    assert cache.get_or_compute("a", compute) == "new" and compute.calls == 1
    cache.set("b", 3)
    assert other.get_many(["a", "b"]) == {"a": "new", "b": 3}


def test_waiters_on_a_miss_get_the_winners_value(
    store: Store, other_store: Store, third_store: Store, name: str
) -> None:
    """One computes; the others wait for its release and read the value it stored."""
    compute = Gated("computed")
    caches = [s.cache(name, lock_wait=10) for s in (store, other_store, third_store)]
    jobs = [start(c.get_or_compute, "k", compute) for c in caches]
    try:
        assert compute.entered.wait(30)
        if store.capabilities.cross_process:  # one store here: the others join its flight
            until(
                lambda: sum(c.stats()["lock_waits"] for c in caches) >= 2,
                "the other two wait for the release",
            )
    finally:
        compute.release.set()
    assert [job.result() for job in jobs] == ["computed"] * 3
    assert compute.calls == 1


@pytest.mark.capability("notifies")
def test_every_waiter_is_woken_by_the_release(
    backend_url: str, store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release wakes every waiter on a miss, not only the next in line.

    No timer of the cache could end these waits before `lock_wait` (the re-check
    and the recompute lock's TTL lie beyond it); a backend may still cut a
    blocked wait short after a few seconds, so the value lives only 3 s: a
    waiter that was not woken finds it gone and computes again.
    """
    monkeypatch.setattr(lockflow, "NOTIFIED_RECHECK", 120.0)
    monkeypatch.setattr(cache_module, "RECOMPUTE_LOCK_TTL", 120.0)
    compute = Gated("computed")
    shared = store.capabilities.cross_process
    stores = [connect(backend_url).__enter__() if shared else store for _ in range(6)]
    # The waiters that are waiting: subscribed, so only a wake-up can end their wait.
    waiting: set[int] = set()

    def spy_on_watchers(backend: Any) -> None:
        watcher = backend.watcher

        def spying_watcher(lock_name: str) -> Any:
            subscription = watcher(lock_name)
            wait = subscription.wait

            def wait_and_tell(timeout: float) -> bool:
                waiting.add(id(subscription))
                return wait(timeout)  # type: ignore[no-any-return]

            monkeypatch.setattr(subscription, "wait", wait_and_tell)
            return subscription

        monkeypatch.setattr(backend, "watcher", spying_watcher)

    if shared:
        for each in stores:
            spy_on_watchers(each.backend)
    try:
        caches = [s.cache(name, lock_wait=30) for s in [store, *stores]]
        first = start(functools.partial(caches[0].get_or_compute, ttl=3), "k", compute)
        try:
            assert compute.entered.wait(30)
            jobs = [
                start(functools.partial(c.get_or_compute, ttl=3), "k", compute) for c in caches[1:]
            ]
            if shared:  # one store here: the others join its flight
                until(lambda: len(waiting) >= 6, "all six wait for the release")
        finally:
            compute.release.set()
        assert first.result() == "computed"
        assert [job.result() for job in jobs] == ["computed"] * 6
        assert compute.calls == 1
        assert sum(c.stats()["lock_timeouts"] for c in caches) == 0
    finally:
        if shared:
            for opened in stores:
                opened.close()


def test_callers_in_one_cache_share_one_computation(store: Store, name: str) -> None:
    cache = store.cache(name)
    compute = Counter("once", delay=0.3)
    jobs = [start(cache.get_or_compute, "k", compute) for _ in range(8)]
    assert [job.result() for job in jobs] == ["once"] * 8
    assert compute.calls == 1


def test_stale_readers_are_served_while_one_recomputes(
    store: Store, other_store: Store, name: str
) -> None:
    cache = store.cache(name, ttl=30, stale_ttl=30)  # "new" stays fresh until read below
    cache.set("k", "old", ttl=0.3)
    sleep(0.5)
    slow = Gated("new")
    recompute = start(cache.get_or_compute, "k", slow)
    other = other_store.cache(name, ttl=30, stale_ttl=30)
    quick = Counter("must not run")
    try:
        assert slow.entered.wait(30)  # the recompute holds the lock now
        assert other.get_or_compute("k", quick) == "old"
    finally:
        slow.release.set()
    assert quick.calls == 0
    assert other.stats()["stale_served"] == 1
    assert recompute.result() == "new"
    assert slow.calls == 1
    assert other.get("k") == "new"


def test_background_recompute_serves_stale_at_once(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=30, stale_ttl=30, background=True)  # "new" stays fresh
    cache.set("k", "old", ttl=0.3)
    sleep(0.5)
    compute = Counter("new", delay=0.2)
    assert cache.get_or_compute("k", compute) == "old"
    for _ in range(100):
        if cache.get("k") == "new":
            break
        sleep(0.05)
    assert cache.get("k") == "new" and compute.calls == 1


def test_xfetch_recomputes_before_expiry(store: Store, name: str) -> None:
    # beta so large that any read of an entry that took 50 ms to compute fires.
    cache = store.cache(name, ttl=30, early_recompute="xfetch", beta=1e6)
    compute = Counter(delay=0.05)
    assert cache.get_or_compute("k", compute) == 1
    assert cache.get_or_compute("k", compute) == 2  # recomputed while still fresh
    assert cache.stats()["early_recomputes"] == 1


def test_xfetch_with_a_small_beta_does_not_recompute_early(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=30, early_recompute="xfetch", beta=1e-6)
    compute = Counter(delay=0.01)
    for _ in range(5):
        assert cache.get_or_compute("k", compute) == 1


def test_a_corrupt_entry_is_a_miss(
    store: Store, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = store.cache(name)
    store.backend.cache_store([(cache.stored_key("k"), b"\x80not an entry", 60.0)])
    caplog.set_level(logging.WARNING, logger="corral")
    assert cache.get("k", default="miss") == "miss"
    assert cache.get_or_compute("k", Counter("fresh")) == "fresh"
    assert cache.get("k") == "fresh"
    assert "does not decode" in caplog.text


def test_an_entry_of_another_serializer_is_a_miss(store: Store, name: str) -> None:
    msgpack = make_codec("msgpack", None)
    cache = store.cache(name)
    data = encode("packed", msgpack, cache.stored_key("k"), fresh_until=9e9, delta=0, generation=0)
    store.backend.cache_store([(cache.stored_key("k"), data, 60.0)])
    assert cache.get("k", default="miss") == "miss"
    assert store.cache(name, serializer="msgpack").get("k") == "packed"


def test_pickle_entries_are_signed(store: Store, name: str) -> None:
    cache = store.cache(name, serializer="pickle", hmac_key=b"k1")
    cache.set("k", {1, 2})
    assert cache.get("k") == {1, 2}
    assert store.cache(name, serializer="pickle", hmac_key=b"k2").get("k") is None
    assert store.cache(name).get("k", default="json-only") == "json-only"


def test_a_compute_error_serves_the_stale_value(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=0.3, stale_ttl=30)
    cache.set("k", "old")
    sleep(0.5)
    failing = Counter(fail=True)
    assert cache.get_or_compute("k", failing) == "old"
    assert failing.calls == 1
    assert cache.stats()["compute_errors"] == 1


def test_a_compute_error_without_stale_value_raises(store: Store, name: str) -> None:
    cache = store.cache(name)
    with pytest.raises(RuntimeError, match="source is down"):
        cache.get_or_compute("k", Counter(fail=True))
    # Nothing remembered without error_ttl: the next caller tries again.
    assert cache.get_or_compute("k", Counter("ok")) == "ok"


def test_error_ttl_makes_every_client_fail_fast(
    store: Store, other_store: Store, name: str
) -> None:
    cache = store.cache(name, error_ttl=30)
    with pytest.raises(RuntimeError):
        cache.get_or_compute("k", Counter(fail=True))
    other = other_store.cache(name, error_ttl=30)
    never = Counter("must not run")
    with pytest.raises(SourceUnavailable, match="error_ttl"):
        other.get_or_compute("k", never)
    assert never.calls == 0
    # delete clears the remembered error.
    other.delete("k")
    assert other.get_or_compute("k", Counter("back")) == "back"


def test_error_ttl_with_a_stale_value_serves_it_without_computing(
    store: Store, other_store: Store, name: str
) -> None:
    cache = store.cache(name, ttl=0.3, stale_ttl=60, error_ttl=30)
    cache.set("k", "old")
    sleep(0.5)
    assert cache.get_or_compute("k", Counter(fail=True)) == "old"
    never = Counter("must not run")
    other = other_store.cache(name, ttl=0.3, stale_ttl=60, error_ttl=30)
    assert other.get_or_compute("k", never) == "old"
    assert never.calls == 0


def test_error_ttl_runs_out(store: Store, name: str) -> None:
    cache = store.cache(name, error_ttl=1.5)  # outlasts a paused process between the calls
    with pytest.raises(RuntimeError):
        cache.get_or_compute("k", Counter(fail=True))
    with pytest.raises(SourceUnavailable):
        cache.get_or_compute("k", Counter("no"))
    sleep(1.7)
    assert cache.get_or_compute("k", Counter("yes")) == "yes"


def _hold_recompute_lock(store: Store, name: str) -> Any:
    cache = store.cache(name)
    lock = store.lock("\x00cache:" + cache.stored_key("k"), ttl=30)
    assert lock.acquire()
    return lock


def test_on_timeout_raise(store: Store, name: str) -> None:
    lock = _hold_recompute_lock(store, name)
    cache = store.cache(name, lock_wait=0.3, on_timeout="raise")
    with pytest.raises(LockTimeout, match="lock_wait") as raised:
        cache.get_or_compute("k", Counter("no"))
    assert raised.value.owner == lock.owner
    assert cache.stats()["lock_timeouts"] == 1
    lock.release()


def test_on_timeout_compute(store: Store, name: str) -> None:
    lock = _hold_recompute_lock(store, name)
    cache = store.cache(name, lock_wait=0.3)
    compute = Counter("myself")
    assert cache.get_or_compute("k", compute) == "myself"
    assert compute.calls == 1
    lock.release()


def test_a_value_that_cannot_be_encoded_writes_nothing_and_holds_nothing(
    store: Store, name: str
) -> None:
    cache = store.cache(name)
    with pytest.raises(SerializationError, match=":k'"):
        cache.get_or_compute("k", Counter({1, 2}))
    assert store.lock_info("\x00cache:" + cache.stored_key("k")) is None
    assert cache.get("k", stale=True) is None
    with pytest.raises(SerializationError):
        cache.set_many({"a": 1, "b": object()})
    assert cache.get_many(["a", "b"]) == {}


def test_bad_input(store: Store, name: str) -> None:
    for bad in (
        {"ttl": 0},
        {"ttl": -1},
        {"stale_ttl": -1},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"serializer": "yaml"},
        {"serializer": "pickle"},
        {"on_timeout": "later"},
    ):
        with pytest.raises(ConfigError):
            store.cache(name, **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        store.cache("has:colon")
    cache = store.cache(name)
    with pytest.raises(TypeError):
        cache.get(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.get_or_compute(b"k", Counter())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.set_many({1: 2})  # type: ignore[dict-item]
    with pytest.raises(ConfigError):
        cache.set("k", 1, ttl=0)


@pytest.mark.parametrize("odd", ["with spaces", "nul\x00", "é€😀", "x" * 400, "a:b:c", ""])
def test_any_str_is_a_key(store: Store, name: str, odd: str) -> None:
    cache = store.cache(name)
    cache.set(odd, odd)
    cache.set(odd + "!", "sibling")
    assert cache.get(odd) == odd
    assert cache.get_many([odd, odd + "!"]) == {odd: odd, odd + "!": "sibling"}


def test_jitter_by_key_gives_one_key_one_lifetime(store: Store, name: str) -> None:
    from corral.core.envelope import decode_header

    cache = store.cache(name, ttl=100, jitter=0.5, jitter_by="key")
    lifetimes = []
    for _ in range(2):
        cache.set("k", 1)
        (data,), _ = store.backend.cache_fetch([cache.stored_key("k")], name)
        assert data is not None
        header = decode_header(data)
        assert header is not None
        lifetimes.append(header.fresh_until - store.wall_clock.now())
    assert abs(lifetimes[0] - lifetimes[1]) < 5
    assert 50 <= lifetimes[0] <= 150


def test_the_decorator(store: Store, name: str) -> None:
    cache = store.cache(name)
    calls = []

    @cache.cached(key="user:{user_id}")
    def load_user(user_id: int, verbose: bool = False) -> dict[str, Any]:
        calls.append(user_id)
        return {"id": user_id}

    assert load_user(1) == {"id": 1}
    assert load_user(user_id=1) == {"id": 1}
    assert calls == [1]
    assert cache.get("user:1") == {"id": 1}
    cache.invalidate("user:1")
    assert load_user(1) == {"id": 1} and calls == [1, 1]
    assert load_user.__name__ == "load_user"

    with pytest.raises(ConfigError, match="userid"):

        @cache.cached(key="user:{userid}")
        def typo(user_id: int) -> int:
            return user_id


def test_the_decorator_without_a_template(store: Store, name: str) -> None:
    cache = store.cache(name)

    @cache.cached(ttl=30)
    def add(a: int, b: int = 2) -> int:
        return a + b

    assert add(1) == 3 and add(1, b=2) == 3 and add(2) == 4


def test_the_near_cache_answers_without_the_server(store: Store, name: str) -> None:
    cache = store.cache(name, local_ttl=30)
    compute = Counter("v")
    assert cache.get_or_compute("k", compute) == "v"
    store.backend.cache_delete(cache.stored_key("k"))  # behind the near cache's back
    assert cache.get_or_compute("k", compute) == "v"
    assert compute.calls == 1 and cache.stats()["local_hits"] == 1
    cache.delete("k")  # through the cache: the near copy goes too
    assert cache.get("k") is None


def test_the_near_cache_is_bounded(store: Store, name: str) -> None:
    cache = store.cache(name, local_ttl=30, local_max=10)
    for i in range(50):
        cache.set(f"k{i}", i)
    assert len(cache._near or ()) == 10


def test_a_refresher_keeps_the_key_computed(store: Store, name: str) -> None:
    cache = store.cache(name, ttl=30)
    compute = Counter()
    with cache.refresher("k", compute, every=0.2) as refresher:
        # A round's lock is held closed for most of the period; a server that counts
        # whole seconds (memcached, etcd) rounds that up, so rounds come less often.
        for _ in range(400):
            if compute.calls >= 3:
                break
            sleep(0.05)
    calls = compute.calls
    assert calls >= 3 and refresher.rounds == calls
    assert cache.get("k") is not None
    sleep(0.4)
    assert compute.calls == calls  # stopped


def test_delete_invalidate_clear_raise_when_the_server_fails(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = store.cache(name)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable(f"{store.server} is down (test)")

    for primitive in ("cache_delete", "cache_invalidate", "cache_clear"):
        monkeypatch.setattr(store.backend, primitive, down)
    with pytest.raises(BackendUnavailable):
        cache.delete("k")
    with pytest.raises(BackendUnavailable):
        cache.invalidate("k")
    with pytest.raises(BackendUnavailable):
        cache.clear()


def test_reads_and_writes_go_on_when_the_server_fails(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = store.cache(name)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable(f"{store.server} is down (test)")

    for primitive in ("cache_fetch", "cache_read", "cache_store"):
        monkeypatch.setattr(store.backend, primitive, down)
    compute = Counter("computed through")
    assert cache.get_or_compute("k", compute) == "computed through"
    assert cache.get("k", default="d") == "d"
    cache.set("k", 1)  # dropped
    assert cache.get_many(["k"]) == {}
    assert cache.stats()["backend_errors"] >= 4
