"""The Redis Cluster backend when the cluster changes under it (a slot moved to another
master after the client loaded its slot map), and on a client that has not loaded it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import corral
import corral.aio
from corral.backends import redis_scripts
from corral.errors import BackendUnavailable
from corral.testing import servers
from tests.conftest import start_server

pytestmark = pytest.mark.backend("redis-cluster")


@pytest.fixture
def cluster(backend_name: str, tmp_path: Path) -> Iterator[servers.RedisClusterServers]:
    """A cluster of the test's own, since the test moves a slot."""
    started = start_server(backend_name, tmp_path)
    assert isinstance(started, servers.RedisClusterServers)
    try:
        yield started
    finally:
        started.stop()


def move_slot(cluster: servers.RedisClusterServers, slot: int) -> servers.RedisClusterNode:
    """Hand `slot` to another master, as a resharding does, dropping what it held (a
    released lock's token counter and markers); the new master."""
    source = cluster.master_of(slot)
    with redis.Redis(host=source.host, port=source.port) as direct:
        for key in direct.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            direct.delete(key)
    target = next(node for node in cluster.masters if node is not source)
    target.call("CLUSTER", "SETSLOT", str(slot), "IMPORTING", source.node_id)
    source.call("CLUSTER", "SETSLOT", str(slot), "MIGRATING", target.node_id)
    # The new owner first, then the old one (which then answers MOVED), then the rest.
    for node in [target, source, *(n for n in cluster.masters if n not in (target, source))]:
        node.call("CLUSTER", "SETSLOT", str(slot), "NODE", target.node_id)
    assert cluster.master_of(slot) is target
    return target


def test_a_lock_waiting_for_replicas_follows_its_slot_to_another_master(
    cluster: servers.RedisClusterServers, name: str
) -> None:
    """replicas=N sends the script and WAIT straight to the slot's master, outside the
    cluster client; once the slot has moved, the old master answers MOVED. The attempt
    must go to the new master (as every other call does), not fail."""
    keys = redis_scripts.lock_keys("corral", name)
    slot = cluster.keyslot(keys.lock)
    with corral.connect(cluster.url, timeout=2) as store:
        warm = store.lock(name, ttl=5, replicas=1)
        assert warm.acquire()  # the slot map and the master's connection are loaded
        warm.release()
        move_slot(cluster, slot)
        lock = store.lock(name, ttl=5, replicas=1)
        assert lock.acquire(wait=0)
        info = store.lock_info(name)
        assert info is not None and info.owner == lock.owner
        lock.release()


def redirections(url: str) -> int:
    """How many MOVED answers the nodes of `url` have given since they started."""
    total = 0
    for node in url.partition("://")[2].split(","):
        host, _, port = node.rpartition(":")
        with redis.Redis(host=host, port=int(port)) as direct:
            total += int(direct.info("errorstats").get("errorstat_MOVED", {}).get("count", 0))
    return total


async def test_calls_made_together_on_a_new_store_go_straight_to_their_masters(
    backend_url: str, name: str
) -> None:
    """The asyncio cluster client loads its slot map within the first call, after
    deciding where to send it: calls made together on a new store each went to a
    random master and were redirected, and after five redirections redis-py closed
    every connection of the client, failing the other calls in flight."""
    before = redirections(backend_url)
    for _ in range(3):
        async with corral.aio.connect(backend_url) as store:
            locks = [store.lock(f"{name}-{index}", ttl=10) for index in range(12)]
            assert all(await asyncio.gather(*(lock.acquire(wait=0) for lock in locks)))
            await asyncio.gather(*(lock.release() for lock in locks))
    assert redirections(backend_url) == before


async def test_after_a_clusterdown_answer_calls_still_go_straight_to_their_masters(
    cluster: servers.RedisClusterServers, name: str
) -> None:
    """After a CLUSTERDOWN answer redis-py closes its client, forgetting its default
    node but keeping the slot map; it then sent every call to a random master until
    a reload finished, and each redirection cost a round trip."""
    down = f"{name}-down"
    slot = cluster.keyslot(redis_scripts.lock_keys("corral", down).lock)
    async with corral.aio.connect(cluster.url, timeout=2) as store:
        warm = store.lock(name, ttl=10)
        assert await warm.acquire()  # the slot map is loaded
        await warm.release()
        owner = cluster.master_of(slot)
        owner.call("CLUSTER", "DELSLOTS", str(slot))  # owner answers CLUSTERDOWN for it
        try:
            with pytest.raises(BackendUnavailable):
                await store.lock(down, ttl=10).acquire(wait=0)
        finally:
            owner.call("CLUSTER", "ADDSLOTS", str(slot))
        cluster.wait_ok()
        before = redirections(cluster.url)
        locks = [store.lock(f"{name}-{index}", ttl=10) for index in range(12)]
        assert all(await asyncio.gather(*(lock.acquire(wait=0) for lock in locks)))
        await asyncio.gather(*(lock.release() for lock in locks))
    assert redirections(cluster.url) == before
