"""What `store.cache()` promises, on every backend, in both flavours.

Each test uses fresh names; two stores stand for two processes where the
backend is shared across processes. Timing tests wait for real TTLs (short
ones); no test asserts on how long something took.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from corral._async import cache as cache_module
from corral.aio import AsyncStore, connect
from corral.core import lockflow
from corral.core.envelope import encode, make_codec
from corral.errors import (
    BackendUnavailable,
    ConfigError,
    LockTimeout,
    SerializationError,
    SourceUnavailable,
)
from tests._async.computations import Counter, Gated, until
from tests._async.concurrency import sleep, start

pytestmark = pytest.mark.capability("cache")


@pytest.fixture
async def third_store(backend_url: str, other_store: AsyncStore) -> AsyncIterator[AsyncStore]:
    if other_store.capabilities.cross_process:
        async with connect(backend_url) as opened:
            yield opened
    else:
        yield other_store


async def test_get_or_compute_computes_once_then_hits(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, ttl=30)
    compute = Counter()
    assert await cache.get_or_compute("k", compute) == 1
    assert await cache.get_or_compute("k", compute) == 1
    assert compute.calls == 1
    stats = cache.stats()
    assert stats["misses"] == 1 and stats["hits"] == 1 and stats["computes"] == 1


async def test_none_is_a_value_not_a_miss(store: AsyncStore, name: str) -> None:
    cache = store.cache(name)
    calls = 0

    async def nothing() -> None:
        nonlocal calls
        calls += 1

    assert await cache.get_or_compute("k", nothing) is None
    assert await cache.get_or_compute("k", nothing) is None
    assert calls == 1
    assert await cache.get("k", default="missing") is None


async def test_another_client_reads_what_one_computed(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    await store.cache(name).get_or_compute("k", Counter({"a": [1, 2.5, "x"]}))
    compute = Counter("other")
    assert await other_store.cache(name).get_or_compute("k", compute) == {"a": [1, 2.5, "x"]}
    assert compute.calls == 0


async def test_get_set_delete(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    cache, other = store.cache(name), other_store.cache(name)
    assert await cache.get("k") is None
    assert await cache.get("k", default=0) == 0
    await cache.set("k", {"v": 1})
    assert await other.get("k") == {"v": 1}
    assert await other.delete("k") is True
    assert await cache.get("k") is None
    assert await cache.delete("k") is False


async def test_entries_expire_after_ttl(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, ttl=1.5)  # outlasts a paused process between set and get
    await cache.set("k", 1)
    assert await cache.get("k") == 1
    await sleep(1.7)
    assert await cache.get("k") is None
    compute = Counter()
    assert await cache.get_or_compute("k", compute) == 1 and compute.calls == 1


async def test_per_call_ttl(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, ttl=300)
    await cache.set("short", 1, ttl=0.3)
    await cache.get_or_compute("also-short", Counter(2), ttl=0.3)
    await sleep(0.5)
    assert await cache.get("short") is None and await cache.get("also-short") is None


async def test_get_many_and_set_many(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    cache = store.cache(name)
    await cache.set_many({f"k{i}": i for i in range(20)})
    found = await other_store.cache(name).get_many([f"k{i}" for i in range(25)])
    assert found == {f"k{i}": i for i in range(20)}
    assert await cache.get_many([]) == {}


async def test_namespaces_are_separate(store: AsyncStore, name: str) -> None:
    await store.cache(f"{name}-a").set("k", "a")
    await store.cache(f"{name}-b").set("k", "b")
    assert await store.cache(f"{name}-a").get("k") == "a"
    assert await store.cache(f"{name}-b").get("k") == "b"


async def test_stale_value_served_with_stale_flag_only(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, ttl=0.3, stale_ttl=30)
    await cache.set("k", "old")
    await sleep(0.5)
    assert await cache.get("k") is None
    assert await cache.get("k", stale=True) == "old"
    assert await cache.get_many(["k"], stale=True) == {"k": "old"}


async def test_invalidate_keeps_the_value_for_stale_readers(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    cache = store.cache(name, ttl=300, stale_ttl=30)
    await cache.set("k", "v1")
    assert await other_store.cache(name, stale_ttl=30).invalidate("k") is True
    assert await cache.get("k") is None
    assert await cache.get("k", stale=True) == "v1"
    # The next get_or_compute wins the lock (nobody else computes) and recomputes.
    assert await cache.get_or_compute("k", Counter("v2")) == "v2"
    assert await cache.get("k") == "v2"
    assert await cache.invalidate("missing") is False


async def test_invalidate_without_stale_ttl_is_gone_for_readers(
    store: AsyncStore, name: str
) -> None:
    cache = store.cache(name, ttl=300)
    await cache.set("k", "v1")
    assert await cache.invalidate("k") is True
    assert await cache.get("k", stale=True) is None


async def test_clear_is_seen_by_every_client_at_once(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    cache, other = store.cache(name, stale_ttl=60), other_store.cache(name, stale_ttl=60)
    await cache.set_many({"a": 1, "b": 2})
    await other.clear()
    assert await cache.get_many(["a", "b"], stale=True) == {}
    assert await cache.get("a", stale=True) is None
    compute = Counter("new")
    assert await cache.get_or_compute("a", compute) == "new" and compute.calls == 1
    await cache.set("b", 3)
    assert await other.get_many(["a", "b"]) == {"a": "new", "b": 3}


async def test_waiters_on_a_miss_get_the_winners_value(
    store: AsyncStore, other_store: AsyncStore, third_store: AsyncStore, name: str
) -> None:
    """One computes; the others wait for its release and read the value it stored."""
    compute = Gated("computed")
    caches = [s.cache(name, lock_wait=10) for s in (store, other_store, third_store)]
    jobs = [start(c.get_or_compute, "k", compute) for c in caches]
    try:
        assert await compute.entered.wait(30)
        if store.capabilities.cross_process:  # one store here: the others join its flight
            await until(
                lambda: sum(c.stats()["lock_waits"] for c in caches) >= 2,
                "the other two wait for the release",
            )
    finally:
        compute.release.set()
    assert [await job.result() for job in jobs] == ["computed"] * 3
    assert compute.calls == 1


@pytest.mark.capability("notifies")
async def test_every_waiter_is_woken_by_the_release(
    backend_url: str, store: AsyncStore, name: str, monkeypatch: pytest.MonkeyPatch
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
    stores = [await connect(backend_url).__aenter__() if shared else store for _ in range(6)]
    # The waiters that are waiting: subscribed, so only a wake-up can end their wait.
    waiting: set[int] = set()

    def spy_on_watchers(backend: Any) -> None:
        watcher = backend.watcher

        def spying_watcher(lock_name: str) -> Any:
            subscription = watcher(lock_name)
            wait = subscription.wait

            async def wait_and_tell(timeout: float) -> bool:
                waiting.add(id(subscription))
                return await wait(timeout)  # type: ignore[no-any-return]

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
            assert await compute.entered.wait(30)
            jobs = [
                start(functools.partial(c.get_or_compute, ttl=3), "k", compute) for c in caches[1:]
            ]
            if shared:  # one store here: the others join its flight
                await until(lambda: len(waiting) >= 6, "all six wait for the release")
        finally:
            compute.release.set()
        assert await first.result() == "computed"
        assert [await job.result() for job in jobs] == ["computed"] * 6
        assert compute.calls == 1
        assert sum(c.stats()["lock_timeouts"] for c in caches) == 0
    finally:
        if shared:
            for opened in stores:
                await opened.aclose()


async def test_callers_in_one_cache_share_one_computation(store: AsyncStore, name: str) -> None:
    cache = store.cache(name)
    compute = Counter("once", delay=0.3)
    jobs = [start(cache.get_or_compute, "k", compute) for _ in range(8)]
    assert [await job.result() for job in jobs] == ["once"] * 8
    assert compute.calls == 1


async def test_stale_readers_are_served_while_one_recomputes(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    cache = store.cache(name, ttl=30, stale_ttl=30)  # "new" stays fresh until read below
    await cache.set("k", "old", ttl=0.3)
    await sleep(0.5)
    slow = Gated("new")
    recompute = start(cache.get_or_compute, "k", slow)
    other = other_store.cache(name, ttl=30, stale_ttl=30)
    quick = Counter("must not run")
    try:
        assert await slow.entered.wait(30)  # the recompute holds the lock now
        assert await other.get_or_compute("k", quick) == "old"
    finally:
        slow.release.set()
    assert quick.calls == 0
    assert other.stats()["stale_served"] == 1
    assert await recompute.result() == "new"
    assert slow.calls == 1
    assert await other.get("k") == "new"


async def test_background_recompute_serves_stale_at_once(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, ttl=30, stale_ttl=30, background=True)  # "new" stays fresh
    await cache.set("k", "old", ttl=0.3)
    await sleep(0.5)
    compute = Counter("new", delay=0.2)
    assert await cache.get_or_compute("k", compute) == "old"
    for _ in range(100):
        if await cache.get("k") == "new":
            break
        await sleep(0.05)
    assert await cache.get("k") == "new" and compute.calls == 1


async def test_xfetch_recomputes_before_expiry(store: AsyncStore, name: str) -> None:
    # beta so large that any read of an entry that took 50 ms to compute fires.
    cache = store.cache(name, ttl=30, early_recompute="xfetch", beta=1e6)
    compute = Counter(delay=0.05)
    assert await cache.get_or_compute("k", compute) == 1
    assert await cache.get_or_compute("k", compute) == 2  # recomputed while still fresh
    assert cache.stats()["early_recomputes"] == 1


async def test_xfetch_with_a_small_beta_does_not_recompute_early(
    store: AsyncStore, name: str
) -> None:
    cache = store.cache(name, ttl=30, early_recompute="xfetch", beta=1e-6)
    compute = Counter(delay=0.01)
    for _ in range(5):
        assert await cache.get_or_compute("k", compute) == 1


async def test_a_corrupt_entry_is_a_miss(
    store: AsyncStore, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = store.cache(name)
    await store.backend.cache_store([(cache.stored_key("k"), b"\x80not an entry", 60.0)])
    caplog.set_level(logging.WARNING, logger="corral")
    assert await cache.get("k", default="miss") == "miss"
    assert await cache.get_or_compute("k", Counter("fresh")) == "fresh"
    assert await cache.get("k") == "fresh"
    assert "does not decode" in caplog.text


async def test_an_entry_of_another_serializer_is_a_miss(store: AsyncStore, name: str) -> None:
    msgpack = make_codec("msgpack", None)
    cache = store.cache(name)
    data = encode("packed", msgpack, cache.stored_key("k"), fresh_until=9e9, delta=0, generation=0)
    await store.backend.cache_store([(cache.stored_key("k"), data, 60.0)])
    assert await cache.get("k", default="miss") == "miss"
    assert await store.cache(name, serializer="msgpack").get("k") == "packed"


async def test_pickle_entries_are_signed(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, serializer="pickle", hmac_key=b"k1")
    await cache.set("k", {1, 2})
    assert await cache.get("k") == {1, 2}
    assert await store.cache(name, serializer="pickle", hmac_key=b"k2").get("k") is None
    assert await store.cache(name).get("k", default="json-only") == "json-only"


async def test_a_compute_error_serves_the_stale_value(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, ttl=0.3, stale_ttl=30)
    await cache.set("k", "old")
    await sleep(0.5)
    failing = Counter(fail=True)
    assert await cache.get_or_compute("k", failing) == "old"
    assert failing.calls == 1
    assert cache.stats()["compute_errors"] == 1


async def test_a_compute_error_without_stale_value_raises(store: AsyncStore, name: str) -> None:
    cache = store.cache(name)
    with pytest.raises(RuntimeError, match="source is down"):
        await cache.get_or_compute("k", Counter(fail=True))
    # Nothing remembered without error_ttl: the next caller tries again.
    assert await cache.get_or_compute("k", Counter("ok")) == "ok"


async def test_error_ttl_makes_every_client_fail_fast(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    cache = store.cache(name, error_ttl=30)
    with pytest.raises(RuntimeError):
        await cache.get_or_compute("k", Counter(fail=True))
    other = other_store.cache(name, error_ttl=30)
    never = Counter("must not run")
    with pytest.raises(SourceUnavailable, match="error_ttl"):
        await other.get_or_compute("k", never)
    assert never.calls == 0
    # delete clears the remembered error.
    await other.delete("k")
    assert await other.get_or_compute("k", Counter("back")) == "back"


async def test_error_ttl_with_a_stale_value_serves_it_without_computing(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    cache = store.cache(name, ttl=0.3, stale_ttl=60, error_ttl=30)
    await cache.set("k", "old")
    await sleep(0.5)
    assert await cache.get_or_compute("k", Counter(fail=True)) == "old"
    never = Counter("must not run")
    other = other_store.cache(name, ttl=0.3, stale_ttl=60, error_ttl=30)
    assert await other.get_or_compute("k", never) == "old"
    assert never.calls == 0


async def test_error_ttl_runs_out(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, error_ttl=1.5)  # outlasts a paused process between the calls
    with pytest.raises(RuntimeError):
        await cache.get_or_compute("k", Counter(fail=True))
    with pytest.raises(SourceUnavailable):
        await cache.get_or_compute("k", Counter("no"))
    await sleep(1.7)
    assert await cache.get_or_compute("k", Counter("yes")) == "yes"


async def _hold_recompute_lock(store: AsyncStore, name: str) -> Any:
    cache = store.cache(name)
    lock = store.lock("\x00cache:" + cache.stored_key("k"), ttl=30)
    assert await lock.acquire()
    return lock


async def test_on_timeout_raise(store: AsyncStore, name: str) -> None:
    lock = await _hold_recompute_lock(store, name)
    cache = store.cache(name, lock_wait=0.3, on_timeout="raise")
    with pytest.raises(LockTimeout, match="lock_wait") as raised:
        await cache.get_or_compute("k", Counter("no"))
    assert raised.value.owner == lock.owner
    assert cache.stats()["lock_timeouts"] == 1
    await lock.release()


async def test_on_timeout_compute(store: AsyncStore, name: str) -> None:
    lock = await _hold_recompute_lock(store, name)
    cache = store.cache(name, lock_wait=0.3)
    compute = Counter("myself")
    assert await cache.get_or_compute("k", compute) == "myself"
    assert compute.calls == 1
    await lock.release()


async def test_a_value_that_cannot_be_encoded_writes_nothing_and_holds_nothing(
    store: AsyncStore, name: str
) -> None:
    cache = store.cache(name)
    with pytest.raises(SerializationError, match=":k'"):
        await cache.get_or_compute("k", Counter({1, 2}))
    assert await store.lock_info("\x00cache:" + cache.stored_key("k")) is None
    assert await cache.get("k", stale=True) is None
    with pytest.raises(SerializationError):
        await cache.set_many({"a": 1, "b": object()})
    assert await cache.get_many(["a", "b"]) == {}


async def test_bad_input(store: AsyncStore, name: str) -> None:
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
        await cache.get(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await cache.get_or_compute(b"k", Counter())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await cache.set_many({1: 2})  # type: ignore[dict-item]
    with pytest.raises(ConfigError):
        await cache.set("k", 1, ttl=0)


@pytest.mark.parametrize("odd", ["with spaces", "nul\x00", "é€😀", "x" * 400, "a:b:c", ""])
async def test_any_str_is_a_key(store: AsyncStore, name: str, odd: str) -> None:
    cache = store.cache(name)
    await cache.set(odd, odd)
    await cache.set(odd + "!", "sibling")
    assert await cache.get(odd) == odd
    assert await cache.get_many([odd, odd + "!"]) == {odd: odd, odd + "!": "sibling"}


async def test_jitter_by_key_gives_one_key_one_lifetime(store: AsyncStore, name: str) -> None:
    from corral.core.envelope import decode_header

    cache = store.cache(name, ttl=100, jitter=0.5, jitter_by="key")
    lifetimes = []
    for _ in range(2):
        await cache.set("k", 1)
        (data,), _ = await store.backend.cache_fetch([cache.stored_key("k")], name)
        assert data is not None
        header = decode_header(data)
        assert header is not None
        lifetimes.append(header.fresh_until - store.wall_clock.now())
    assert abs(lifetimes[0] - lifetimes[1]) < 5
    assert 50 <= lifetimes[0] <= 150


async def test_the_decorator(store: AsyncStore, name: str) -> None:
    cache = store.cache(name)
    calls = []

    @cache.cached(key="user:{user_id}")
    async def load_user(user_id: int, verbose: bool = False) -> dict[str, Any]:
        calls.append(user_id)
        return {"id": user_id}

    assert await load_user(1) == {"id": 1}
    assert await load_user(user_id=1) == {"id": 1}
    assert calls == [1]
    assert await cache.get("user:1") == {"id": 1}
    await cache.invalidate("user:1")
    assert await load_user(1) == {"id": 1} and calls == [1, 1]
    assert load_user.__name__ == "load_user"

    with pytest.raises(ConfigError, match="userid"):

        @cache.cached(key="user:{userid}")
        async def typo(user_id: int) -> int:
            return user_id


async def test_the_decorator_without_a_template(store: AsyncStore, name: str) -> None:
    cache = store.cache(name)

    @cache.cached(ttl=30)
    async def add(a: int, b: int = 2) -> int:
        return a + b

    assert await add(1) == 3 and await add(1, b=2) == 3 and await add(2) == 4


async def test_the_near_cache_answers_without_the_server(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, local_ttl=30)
    compute = Counter("v")
    assert await cache.get_or_compute("k", compute) == "v"
    await store.backend.cache_delete(cache.stored_key("k"))  # behind the near cache's back
    assert await cache.get_or_compute("k", compute) == "v"
    assert compute.calls == 1 and cache.stats()["local_hits"] == 1
    await cache.delete("k")  # through the cache: the near copy goes too
    assert await cache.get("k") is None


async def test_the_near_cache_is_bounded(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, local_ttl=30, local_max=10)
    for i in range(50):
        await cache.set(f"k{i}", i)
    assert len(cache._near or ()) == 10


async def test_a_refresher_keeps_the_key_computed(store: AsyncStore, name: str) -> None:
    cache = store.cache(name, ttl=30)
    compute = Counter()
    async with cache.refresher("k", compute, every=0.2) as refresher:
        # A round's lock is held closed for most of the period; a server that counts
        # whole seconds (memcached, etcd) rounds that up, so rounds come less often.
        for _ in range(400):
            if compute.calls >= 3:
                break
            await sleep(0.05)
    calls = compute.calls
    assert calls >= 3 and refresher.rounds == calls
    assert await cache.get("k") is not None
    await sleep(0.4)
    assert compute.calls == calls  # stopped


async def test_delete_invalidate_clear_raise_when_the_server_fails(
    store: AsyncStore, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = store.cache(name)

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable(f"{store.server} is down (test)")

    for primitive in ("cache_delete", "cache_invalidate", "cache_clear"):
        monkeypatch.setattr(store.backend, primitive, down)
    with pytest.raises(BackendUnavailable):
        await cache.delete("k")
    with pytest.raises(BackendUnavailable):
        await cache.invalidate("k")
    with pytest.raises(BackendUnavailable):
        await cache.clear()


async def test_reads_and_writes_go_on_when_the_server_fails(
    store: AsyncStore, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = store.cache(name)

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable(f"{store.server} is down (test)")

    for primitive in ("cache_fetch", "cache_read", "cache_store"):
        monkeypatch.setattr(store.backend, primitive, down)
    compute = Counter("computed through")
    assert await cache.get_or_compute("k", compute) == "computed through"
    assert await cache.get("k", default="d") == "d"
    await cache.set("k", 1)  # dropped
    assert await cache.get_many(["k"]) == {}
    assert cache.stats()["backend_errors"] >= 4
