"""Pools of servers under failure: what a delete, a batch read or a lock's release must still
do while one server of the pool is stopped or marked down.

Each test pauses (SIGSTOP) a server of a small pool of its own and resumes it before it ends.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import corral
from corral.core.placement import recompute_lock_name
from corral.core.ring import Ring
from corral.testing import servers
from tests.pools import started

FAST = {"timeout": 0.5, "failure_limit": 2, "retry_after": 60}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerPool]:
    members = started(
        lambda workdir: servers.start_memcached_pool(workdir, 3),
        tmp_path_factory.mktemp("reviewpool"),
    )
    yield members
    members.stop()


@pytest.fixture(scope="module")
def redis_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerPool]:
    members = started(
        lambda workdir: servers.start_redis_pool(workdir, 2),
        tmp_path_factory.mktemp("reviewredispool"),
    )
    yield members
    members.stop()


@pytest.fixture(scope="module")
def gutter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.MemcachedServer]:
    server = started(servers.start_memcached, tmp_path_factory.mktemp("reviewgutter"))
    yield server
    server.stop()


def fresh() -> str:
    return f"review-{uuid.uuid4().hex[:10]}"


def key_on(ring: Ring, server: str, namespace: str) -> str:
    """A fresh cache key whose entry in `namespace` `ring` places on `server`."""
    while True:
        key = fresh()
        if ring.locate(f"{namespace}:{key}") == server:
            return key


def mark_down(store: Any, cache: Any, key: str, server: str) -> None:
    """Fail reads of `key` until the pool marks its (paused) server down."""
    while not store.backend.health.is_down(server):
        cache.get(key)  # a failed read is a miss; each waits at most `timeout`


@pytest.mark.parametrize("action", ["delete", "invalidate"])
def test_delete_reaches_the_gutter_that_took_a_down_servers_entry(
    pool: servers.ServerPool, gutter: servers.MemcachedServer, action: str
) -> None:
    # While the key's server is down its entry lives in the gutter; `delete` (and
    # `invalidate`) must remove it there, or the next read serves the value just deleted.
    ring = Ring(pool.hosts)
    victim = pool.hosts[0]
    namespace = fresh()
    key = key_on(ring, victim, namespace)
    with corral.connect(pool.url, gutter=gutter.url, **FAST) as store:
        cache = store.cache(namespace)
        pool.member(victim).pause()
        try:
            mark_down(store, cache, key, victim)
            cache.set(key, "written while away")
            assert cache.get(key) == "written while away"  # from the gutter
            # Raising, to say that the down server may keep a copy, is fine; serving it is not.
            with contextlib.suppress(corral.BackendUnavailable):
                getattr(cache, action)(key)
            assert cache.get(key) is None
        finally:
            pool.member(victim).resume()


def test_clear_with_no_server_answering_raises_backend_unavailable(
    pool: servers.ServerPool,
) -> None:
    # Every server failing the generation read leaves nothing to raise: clear() must still
    # say BackendUnavailable (naming the servers), not fail on an empty fan-out.
    with corral.connect(pool.url, **FAST) as store:
        cache = store.cache(fresh())
        pool.pause()
        try:
            with pytest.raises(corral.BackendUnavailable) as info:
                cache.clear()
        finally:
            pool.resume()
    assert all(server in str(info.value) for server in pool.hosts)


def test_a_recompute_lock_is_released_where_it_was_taken_after_its_server_went_down(
    pool: servers.ServerPool,
) -> None:
    # A recompute lock follows its entry, but one already granted stays where it was
    # granted: its release (and renewals) must go there even after the entry moved on,
    # or the lock stays held on its server and the key's readers wait for it there.
    ring = Ring(pool.hosts)
    victim = pool.hosts[2]
    namespace = fresh()
    stored = f"{namespace}:{key_on(ring, victim, namespace)}"
    name = recompute_lock_name(stored)
    with corral.connect(pool.url, **FAST) as store:
        backend = store.backend
        assert backend.try_acquire(name, "computing", 30).acquired
        pool.member(victim).pause()
        try:
            while not backend.health.is_down(victim):
                with contextlib.suppress(corral.BackendUnavailable):
                    backend.cache_fetch([stored], "gen")
        finally:
            pool.member(victim).resume()
        backend.release(name, "computing")
    with corral.connect(pool.member(victim).url) as alone:
        assert alone.backend.inspect(name) is None


def test_the_gutter_waits_no_longer_than_the_pools_timeout(
    pool: servers.ServerPool, gutter: servers.MemcachedServer
) -> None:
    # `timeout` bounds a call on a failing server; the gutter (given as a bare URL) serves
    # the pool's calls, so the pool's timeout bounds it too, not the gutter's default.
    ring = Ring(pool.hosts)
    victim = pool.hosts[0]
    namespace = fresh()
    key = key_on(ring, victim, namespace)
    with corral.connect(pool.url, gutter=gutter.url, **FAST) as store:
        cache = store.cache(namespace)
        pool.member(victim).pause()
        gutter.pause()
        try:
            mark_down(store, cache, key, victim)
            with pytest.raises(corral.BackendUnavailable) as info:
                store.backend.cache_fetch([f"{namespace}:{key}"], namespace)
        finally:
            gutter.resume()
            pool.member(victim).resume()
    assert f"within {FAST['timeout']:g} s" in str(info.value)


@pytest.mark.parametrize("action", ["delete", "invalidate"])
def test_delete_of_a_key_whose_server_is_down_raises(pool: servers.ServerPool, action: str) -> None:
    # The down server still holds the value and serves it again once it is back: like
    # clear(), a delete that cannot reach it says so instead of succeeding silently.
    ring = Ring(pool.hosts)
    victim = pool.hosts[1]
    namespace = fresh()
    key = key_on(ring, victim, namespace)
    with corral.connect(pool.url, **FAST) as store:
        cache = store.cache(namespace)
        cache.set(key, "to be deleted")
        pool.member(victim).pause()
        try:
            mark_down(store, cache, key, victim)
            with pytest.raises(corral.BackendUnavailable, match=victim):
                getattr(cache, action)(key)
        finally:
            pool.member(victim).resume()


def test_this_processs_busy_connections_do_not_mark_a_server_down(
    pool: servers.ServerPool,
) -> None:
    # All of max_connections lent out in this process is local load, not the server failing:
    # marking it down would move its keys and refuse its locks while it answers fine.
    ring = Ring(pool.hosts)
    victim = pool.hosts[2]
    namespace = fresh()
    key = key_on(ring, victim, namespace)
    with corral.connect(pool.url, max_connections=1, **FAST) as store:
        cache = store.cache(namespace)
        cache.set(key, "kept")
        client = store.backend.child(victim)._locks.client
        with client.session_about("a long operation", "hold it"):  # the only connection
            for _ in range(FAST["failure_limit"] + 1):
                with pytest.raises(corral.BackendUnavailable, match="max_connections"):
                    store.backend.cache_fetch([f"{namespace}:{key}"], namespace)
        assert not store.backend.health.is_down(victim)
        assert cache.get(key) == "kept"


def test_this_processs_busy_redis_connections_do_not_mark_a_server_down(
    redis_pool: servers.ServerPool,
) -> None:
    ring = Ring(redis_pool.hosts)
    victim = redis_pool.hosts[0]
    namespace = fresh()
    key = key_on(ring, victim, namespace)
    with corral.connect(redis_pool.url, max_connections=1, **FAST) as store:
        cache = store.cache(namespace)
        cache.set(key, "kept")
        connections = store.backend.child(victim)._pool
        held = connections.get_connection()  # the only connection
        try:
            for _ in range(FAST["failure_limit"] + 1):
                with pytest.raises(corral.BackendUnavailable, match="max_connections"):
                    store.backend.cache_fetch([f"{namespace}:{key}"], namespace)
        finally:
            connections.release(held)
        assert not store.backend.health.is_down(victim)
        assert cache.get(key) == "kept"
