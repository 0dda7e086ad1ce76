"""Pools of servers against real ones: placement, one request per server, failures, gutter,
generations kept equal, replicas, options.

The contract suite runs on pools too (`memcached-pool`, `redis-pool`); these tests
stop and pause servers of pools of their own, so they never disturb it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import corral
from corral.backends.memcached_proto import cache_key
from corral.core.envelope import encode, make_codec
from corral.core.ring import Ring
from corral.testing import servers
from tests.pools import started

FAST = {"timeout": 0.5, "failure_limit": 2, "retry_after": 0.5}


@pytest.fixture(scope="module")
def memcached_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerPool]:
    pool = started(servers.start_memcached_pool, tmp_path_factory.mktemp("mcpool"))
    yield pool
    pool.stop()


@pytest.fixture(scope="module")
def gutter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.MemcachedServer]:
    server = started(servers.start_memcached, tmp_path_factory.mktemp("gutter"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerPool]:
    pool = started(servers.start_redis_pool, tmp_path_factory.mktemp("redispool"))
    yield pool
    pool.stop()


def fresh() -> str:
    return f"pool-{uuid.uuid4().hex[:10]}"


def entry(value: Any, fresh_for: float = 60.0) -> bytes:
    codec = make_codec("json", None)
    return encode(value, codec, "k", fresh_until=time.time() + fresh_for, delta=0, generation=0)


def key_on(ring: Ring, server: str, prefix: str = "") -> str:
    """A fresh key (or lock name) that `ring` places on `server`."""
    while True:
        key = f"{prefix}{fresh()}"
        if ring.locate(key) == server:
            return key


def memcached_ttl(server: Any, key: str) -> int:
    """The seconds memcached will keep cache entry `key` (meta `mg ... t`)."""
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(f"mg {cache_key('corral', key)} t\r\n".encode())
        line = sock.makefile("rb").readline().decode()
    assert line.startswith("HD"), line
    return int(line.split()[1][1:])


def test_placement_is_the_rings_and_a_single_server_store_finds_the_entry(
    memcached_pool: servers.ServerPool,
) -> None:
    ring = Ring(memcached_pool.hosts)
    namespace = fresh()
    keys = [f"k{i}" for i in range(40)]
    with corral.connect(memcached_pool.url) as store:
        assert store.backend.servers == tuple(memcached_pool.hosts)
        store.cache(namespace).set_many({key: key.upper() for key in keys})
        for key in keys:
            stored = f"{namespace}:{key}"
            assert store.backend.locate(stored) == ring.locate(stored)
    used = set()
    for key in keys:
        server = ring.locate(f"{namespace}:{key}")
        used.add(server)
        single = memcached_pool.member(server).url
        with corral.connect(single) as alone:
            assert alone.cache(namespace).get(key) == key.upper()
            assert alone.backend.locate(key) == alone.backend.server
    assert len(used) > 1


def test_get_many_sends_one_request_per_server_all_at_once(
    memcached_pool: servers.ServerPool,
) -> None:
    namespace = fresh()
    keys = [f"k{i}" for i in range(60)]
    with corral.connect(memcached_pool.url) as store:
        cache = store.cache(namespace)
        cache.set_many({key: i for i, key in enumerate(keys)})
        calls: dict[str, int] = {}
        # Every server's request must be under way before any proceeds: sent one after
        # another, the first would wait here for the others, and the barrier would break.
        together = threading.Barrier(len(store.backend.servers), timeout=30)
        for server in store.backend.servers:
            child = store.backend.child(server)
            original = child.cache_fetch

            def counted(wanted: Any, gen_key: str, _o: Any = original, _s: str = server) -> Any:
                calls[_s] = calls.get(_s, 0) + 1
                together.wait()
                return _o(wanted, gen_key)

            child.cache_fetch = counted
        found = cache.get_many(keys)
    assert found == {key: i for i, key in enumerate(keys)}
    assert sorted(calls) == sorted(memcached_pool.hosts)  # 60 keys reach all 5
    assert set(calls.values()) == {1}


def test_a_stopped_server_is_marked_down_its_entries_move_and_it_comes_back(
    memcached_pool: servers.ServerPool, caplog: pytest.LogCaptureFixture
) -> None:
    ring = Ring(memcached_pool.hosts)
    victim = memcached_pool.hosts[1]
    stored = key_on(ring, victim)
    lock_name = key_on(ring, victim, "lock-")
    # Down long enough for the calls below, paused or not, to find it still down.
    with corral.connect(memcached_pool.url, **{**FAST, "retry_after": 3}) as store:
        backend = store.backend
        held = f"held-{lock_name}"
        while backend.locate(held) != victim:
            held += "x"
        assert backend.try_acquire(held, "me", 30).acquired
        memcached_pool.member(victim).pause()
        try:
            with caplog.at_level(logging.WARNING, logger="corral"):
                for _ in range(2):  # failure_limit: each bounded by the timeout
                    with pytest.raises(corral.BackendUnavailable, match=victim):
                        backend.cache_fetch([stored], "gen")
            assert backend.health.is_down(victim)
            assert any("went down" in r.getMessage() for r in caplog.records)
            # Entries go to the next server on the ring, without waiting on the first.
            backup = ring.locate_n(stored, 2)[1]
            backend.cache_store([(stored, entry("moved"), 60)])
            found, _ = backend.child(backup).cache_fetch([stored], "gen")
            assert found[0] is not None
            assert backend.cache_fetch([stored], "gen")[0] == found
            # A lock on it raises at once: it says so instead of waiting for the server.
            with pytest.raises(corral.BackendUnavailable, match="marked down until") as info:
                store.lock(lock_name).acquire()
            assert "never moves" in str(info.value) and victim in str(info.value)
            # Its holder's renewal still tries it (bounded by the timeout): giving up
            # without trying would lose the lock for sure.
            with pytest.raises(corral.BackendUnavailable) as info:
                backend.extend(held, "me", 30)
            assert "marked down" not in str(info.value)
        finally:
            memcached_pool.member(victim).resume()
        until = backend.health.down_until(victim)
        assert until is not None
        time.sleep(max(0.0, until - store.clock.now()) + 0.1)
        # The next call probes it; the answer brings it back, and its entries live there.
        with caplog.at_level(logging.WARNING, logger="corral"):
            backend.cache_store([(stored, entry("home"), 60)])
        assert not backend.health.is_down(victim)
        assert any("back in the pool" in r.getMessage() for r in caplog.records)
        found, _ = backend.child(victim).cache_fetch([stored], "gen")
        assert found[0] is not None and b"home" in found[0]
        with store.lock(lock_name):
            pass


def test_with_a_gutter_a_down_servers_entries_go_there_kept_briefly(
    memcached_pool: servers.ServerPool, gutter: servers.MemcachedServer
) -> None:
    ring = Ring(memcached_pool.hosts)
    victim = memcached_pool.hosts[2]
    stored = key_on(ring, victim)
    options = {**FAST, "retry_after": 60, "gutter": gutter.url, "gutter_ttl": 1}
    with corral.connect(memcached_pool.url, **options) as store:
        backend = store.backend
        memcached_pool.member(victim).pause()
        try:
            for _ in range(2):
                with pytest.raises(corral.BackendUnavailable):
                    backend.cache_fetch([stored], "gen")
            backend.cache_store([(stored, entry("in the gutter"), 3600)])
            found, _ = backend.cache_fetch([stored], "gen")
            assert found[0] is not None and b"in the gutter" in found[0]
            # Kept by the gutter for gutter_ttl (1 s, memcached adds 2), not for an hour;
            # and by no other server of the pool.
            assert memcached_ttl(gutter, stored) <= 3
            for server in ring.servers:
                if server != victim:
                    assert backend.child(server).cache_fetch([stored], "gen")[0] == [None]
        finally:
            memcached_pool.member(victim).resume()


def test_clear_with_a_server_down_raises_and_that_server_serves_nothing_old(
    memcached_pool: servers.ServerPool,
) -> None:
    ring = Ring(memcached_pool.hosts)
    victim = memcached_pool.hosts[3]
    namespace = fresh()
    # Enough keys that some land on the victim whatever the random namespace.
    keys = [f"k{i}" for i in range(100)]
    on_victim = [key for key in keys if ring.locate(f"{namespace}:{key}") == victim]
    assert on_victim
    with corral.connect(memcached_pool.url, **FAST) as store:
        cache = store.cache(namespace)
        cache.set_many({key: "old" for key in keys})
        assert cache.get_many(keys) == {key: "old" for key in keys}
        memcached_pool.member(victim).pause()
        try:
            with pytest.raises(corral.BackendUnavailable, match=victim):
                cache.clear()
        finally:
            memcached_pool.member(victim).resume()
        assert cache.get_many(keys) == {}
        # Back (probed after retry_after), the victim still holds its old generation and
        # entries: the pool raises it before it serves them.
        time.sleep(FAST["retry_after"] + 0.1)
        assert cache.get_many(keys) == {}
        assert not store.backend.health.is_down(victim)
        gen_key = cache._gen_key
        generations = {
            server: store.backend.child(server).cache_fetch([], gen_key)[1]
            for server in ring.servers
        }
        assert len(set(generations.values())) == 1 and 0 not in generations.values()
    with corral.connect(memcached_pool.member(victim).url) as alone:
        assert alone.cache(namespace).get_many(on_victim) == {}


def test_a_clear_leaves_every_server_at_one_generation_and_raise_never_lowers(
    redis_pool: servers.ServerPool,
) -> None:
    with corral.connect(redis_pool.url) as store:
        backend = store.backend
        gen_key = fresh()
        child = backend.child(backend.servers[0])
        assert child.cache_raise_generation(gen_key, 7) == 7
        assert child.cache_raise_generation(gen_key, 5) == 7
        generation = backend.cache_clear(gen_key)
        assert generation == 8
        assert {backend.child(s).cache_fetch([], gen_key)[1] for s in backend.servers} == {8}
        assert backend.cache_clear(gen_key) == 9


def test_memcached_raise_generation_never_lowers(memcached_pool: servers.ServerPool) -> None:
    with corral.connect(memcached_pool.members[0].url) as store:
        gen_key = fresh()
        assert store.backend.cache_raise_generation(gen_key, 12) == 12
        assert store.backend.cache_raise_generation(gen_key, 3) == 12
        cleared = store.backend.cache_clear(gen_key)  # `ma` increments what raise wrote
        assert cleared == 13


def test_placed_views_route_by_shard_and_keep_replicas(memcached_pool: servers.ServerPool) -> None:
    with corral.connect(memcached_pool.url) as store:
        backend = store.backend
        sharded = backend.placed(shard="user-42")
        keys = [fresh() for _ in range(10)]
        sharded.cache_store([(key, entry(key), 60) for key in keys])
        home = backend.ring.locate("user-42")
        found, _ = backend.child(home).cache_fetch(keys, "gen")
        assert all(found)
        hot = backend.placed(replicas=2)
        key = fresh()
        primary, replica = backend.ring.locate_n(key, 2)
        hot.cache_store([(key, entry("hot", fresh_for=100), 600)])
        for server in (primary, replica):
            assert backend.child(server).cache_fetch([key], "gen")[0][0] is not None
        assert backend.child(replica).cache_delete(key)
        for _ in range(40):  # each read picks a replica at random: the replica, surely
            (data,), _ = hot.cache_fetch([key], "gen")
            assert data is not None and b"hot" in data
        assert backend.child(replica).cache_fetch([key], "gen")[0][0] is not None
        assert 0 < memcached_ttl(memcached_pool.member(replica), key) <= 103


def test_copies_made_for_a_hot_spell_are_kept_briefly_on_replicas_but_the_first(
    memcached_pool: servers.ServerPool,
) -> None:
    with corral.connect(memcached_pool.url) as store:
        backend = store.backend
        spell = backend.placed(replicas=3, replica_keep=5.0)
        key = fresh()
        first, second, third = backend.ring.locate_n(key, 3)
        spell.cache_store([(key, entry("hot", fresh_for=600), 600)])
        assert memcached_ttl(memcached_pool.member(first), key) > 500  # as long as asked
        for server in (second, third):
            assert 0 < memcached_ttl(memcached_pool.member(server), key) <= 5 + 3
        assert backend.child(second).cache_delete(key)
        for _ in range(60):  # a read of the second replica repairs it from the first
            spell.cache_fetch([key], "gen")
        assert 0 < memcached_ttl(memcached_pool.member(second), key) <= 5 + 3


def test_a_hot_key_is_spread_over_three_servers_and_named(
    memcached_pool: servers.ServerPool,
) -> None:
    with corral.connect(memcached_pool.url) as store:
        cache = store.cache(fresh(), ttl=600, hot_keys=True)
        finder = cache._hot
        assert finder is not None
        finder.sample, finder.min_samples, finder.window = 1.0, 10, 0.5
        finder._window_end = store.clock.now() + finder.window
        stored = cache.stored_key("popular")
        for i in range(30):
            cache.get_or_compute("popular", lambda: "v")
            cache.get_or_compute(f"cold-{i}", lambda: "c")
        while store.clock.now() < finder._window_end:
            cache.get("popular")
        assert cache.stats()["hot_keys"] == [stored]
        finder._window_end = store.clock.now() + 30  # hot through the reads below, even paused
        for _ in range(40):  # reads now go to any of three servers, each filled from the first
            assert cache.get_or_compute("popular", lambda: "recomputed") == "v"
        holders = [
            server
            for server in store.backend.servers
            if store.backend.child(server).cache_fetch([stored], cache.namespace)[0][0]
        ]
        assert sorted(holders) == sorted(store.backend.ring.locate_n(stored, 3))


def test_weights_in_the_url_and_as_a_dict(memcached_pool: servers.ServerPool) -> None:
    names = memcached_pool.hosts
    expected = Ring(names, weights=[3, 1, 1, 1, 2])
    with corral.connect(memcached_pool.url + "?weights=3,1,1,1,2&hashing=ketama") as store:
        assert dict(store.backend.ring.weights) == dict(zip(names, [3, 1, 1, 1, 2], strict=True))
        keys = [fresh() for _ in range(100)]
        assert [store.backend.locate(k) for k in keys] == [expected.locate(k) for k in keys]
    weights = dict(zip(names, [3, 1, 1, 1, 2], strict=True))
    with corral.connect(memcached_pool.url, weights=weights, hashing="maglev") as store:
        maglev = Ring(names, hashing="maglev", weights=weights)
        assert [store.backend.locate(k) for k in keys] == [maglev.locate(k) for k in keys]


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("hashing=nope", "hashing must be one of"),
        ("weights=1,2", "weights must be 3 whole numbers"),
        ("failure_limit=0", "failure_limit must be"),
        ("retry_after=-1", "retry_after must be"),
        ("gutter_ttl=0", "gutter_ttl must be"),
        ("gutter=nothing", "gutter must be"),
        ("colour=blue", "failure_limit, gutter, gutter_ttl, hashing"),
    ],
)
def test_bad_options_are_refused_without_the_password(query: str, words: str) -> None:
    url = f"memcached://user:sekret@h1:11211,h2:11211,h3:11211?{query}"
    with pytest.raises(corral.ConfigError, match=words) as info:
        corral.connect(url)
    assert "sekret" not in str(info.value)


def test_a_pool_says_where_it_is_without_the_password() -> None:
    with corral.connect("redis://:sekret@h1:6379,h2:6380/0") as store:
        assert "sekret" not in repr(store) and "sekret" not in store.backend.server
        assert store.backend.servers == ("h1:6379", "h2:6380")
        assert "never moves" in store.capabilities.on_partition
    gutter = "memcached://user:sekret@g:11211"
    with corral.connect("memcached://h1:11211,h2:11211", gutter=gutter) as store:
        assert "sekret" not in repr(store) and "sekret" not in store.url


def test_tls_urls_and_gutter_pools_are_built_of_their_kind() -> None:
    with corral.connect("rediss://h1:6379,h2:6380/2", gutter="memcached://g1,g2:11212") as store:
        child = store.backend.child("h1:6379")
        assert child.server.startswith("rediss://") and child.server.endswith("/2")
        gutter = store.backend._pool.gutter
        assert gutter is not None and gutter.servers == ("g1:11211", "g2:11212")
