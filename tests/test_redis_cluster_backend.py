"""What only the Redis Cluster backend does: its URL, its key slots, its wake-ups across
processes, and what a lock keeps and loses when a master fails over.

The contract suite (backend `redis-cluster`) shows that locks, semaphores, elections
and the cache behave as everywhere else; these tests show the cluster's own parts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from redis.crc import key_slot

import corral
from corral._sync import lock as sync_lock
from corral._sync.backends import redis as sync_redis
from corral.backends import redis_scripts
from corral.core import lockflow
from corral.core.placement import recompute_lock_name
from corral.errors import BackendUnavailable, ConfigError
from corral.testing import servers
from tests.conftest import server_missing, start_server

pytestmark = pytest.mark.backend("redis-cluster")

T = TypeVar("T")

# Far beyond every deadline below: only a pushed wake-up can be in time.
NO_RECHECK = 120.0
# How long a failover may take here: the replica notices after cluster-node-timeout
# (1 s), waits up to a second more, then needs the other masters' votes.
FAILOVER_WITHIN = 60.0


def keyslot(key: str) -> int:
    """The slot of `key`, computed as every cluster client does (CRC16 of its hash tag)."""
    return int(key_slot(key.encode("utf-8", "surrogatepass")))


# -- the URL ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://", "no node"),
        ("redis+cluster://h:1/3", "database 0"),
        ("redis+cluster://h:99999", "not a node"),
        ("redis+cluster://h:1,:2", "not a node"),
        ("redis+cluster://h:1?max_connections=3", "unknown option"),
        ("redis+cluster://h:1?timeout=-1", "timeout"),
        ("redis+cluster://h:1?ssl_ca_certs=/ca.crt", "rediss"),
        ("rediss+cluster://h:1?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
    ],
)
def test_a_bad_url_is_refused_before_connecting(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        corral.connect(url)


def test_wrong_credentials_fail_naming_the_cluster_never_the_password(
    backend_url: str,
) -> None:
    url = backend_url.replace("://", "://nobody:s3cret-pw@", 1)
    with pytest.raises(corral.BackendUnavailable) as caught, corral.connect(url) as store:
        assert "s3cret-pw" not in store.server + repr(store)
        store.lock("x").acquire()
    assert "s3cret-pw" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)
    assert "credentials" in str(caught.value)


# -- key slots ---------------------------------------------------------------------------


def test_an_entry_lives_in_the_slot_of_its_recompute_lock(backend_url: str, name: str) -> None:
    for key in (f"{name}:a", "{braces}", "%7B", "x" * 300, "\udcff"):
        entry = redis_scripts.cache_key("corral", key, tagged=True)
        lock = redis_scripts.lock_keys("corral", recompute_lock_name(key))
        slots = {keyslot(k) for k in (entry, lock.lock, lock.fence, lock.wake("o"))}
        assert len(slots) == 1, (key, slots)
    # One server keeps its layout: no hash tag on an entry.
    assert redis_scripts.cache_key("corral", "a") == "corral:cache:a"


def test_entries_spread_over_the_masters(backend_url: str, name: str) -> None:
    """An entry's slot is its own key's, not one slot for the namespace (CRC16 is
    linear, so how many of 50 similar keys share a slot depends on the random name:
    one slot for the namespace would be 1)."""
    slots = {
        keyslot(redis_scripts.cache_key("corral", f"ns:{name}:{i}", tagged=True)) for i in range(50)
    }
    assert len(slots) > 25


# -- wake-ups across processes ---------------------------------------------------------

WAITER = textwrap.dedent(
    """
    import sys, time
    import corral
    from corral.core import lockflow
    from corral._sync import lock as sync_lock
    from corral._sync.backends import redis as sync_redis

    url, name, mode, no_recheck = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    # No timer of the waiter fires within the test: only a pushed wake-up is in time.
    lockflow.NOTIFIED_RECHECK = no_recheck
    sync_lock.STARVE_AFTER = no_recheck
    if mode == "feed":
        sync_redis.MAX_BLOCKING = 0  # no blocked pop: the pub/sub feed only
    with corral.connect(url, timeout=no_recheck) as store:
        lock = store.lock(name, ttl=30)
        print("waiting", flush=True)
        print("acquired" if lock.acquire(wait=no_recheck / 2) else "timed out", flush=True)
        lock.release()
    """
)


@pytest.mark.parametrize("mode", ["list", "feed"])
def test_a_release_wakes_a_waiter_in_another_process(
    backend_url: str, name: str, mode: str
) -> None:
    with corral.connect(backend_url) as store:
        holder = store.lock(name, ttl=NO_RECHECK * 2)
        assert holder.acquire()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, backend_url, name, mode, str(NO_RECHECK)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert waiter.stdout is not None
            assert waiter.stdout.readline().strip() == "waiting"
            time.sleep(1.0)  # it attempted, failed and waits now
            holder.release()
            # Within the test's limit only if the release itself woke it: its own
            # re-check comes after NO_RECHECK seconds.
            assert waiter.wait(NO_RECHECK / 4) == 0
            assert waiter.stdout.read().strip() == "acquired"
        finally:
            waiter.kill()
            waiter.wait()


def test_tls_carries_locks_replica_waits_and_wake_ups(
    backend_name: str, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rediss+cluster://: every connection speaks TLS, the cluster client's, the one
    that sends WAIT for replicas=1, and the pub/sub feed that wakes a waiter."""
    monkeypatch.setattr(lockflow, "NOTIFIED_RECHECK", NO_RECHECK)
    monkeypatch.setattr(sync_lock, "STARVE_AFTER", NO_RECHECK)
    monkeypatch.setattr(sync_redis, "MAX_BLOCKING", 0)  # waiters listen to the feed
    try:
        cluster = servers.start_redis_cluster(tmp_path, tls=True)
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
    try:
        url = f"{cluster.url}?ssl_ca_certs={cluster.ca_file}"
        assert url.startswith("rediss+cluster://")
        with corral.connect(url, timeout=NO_RECHECK) as one, corral.connect(url) as two:
            holder = one.lock(name, ttl=NO_RECHECK * 2, replicas=1)
            assert holder.acquire()
            got: list[bool] = []
            waiter = threading.Thread(target=lambda: got.append(two.lock(name).acquire(wait=60)))
            waiter.start()
            time.sleep(0.5)  # it attempted, failed and listens now
            assert not got
            holder.release()
            waiter.join(30)  # its own re-check comes after NO_RECHECK seconds
            assert got == [True]
            assert one.cache("tls").get_or_compute("k", lambda: "over tls") == "over tls"
        with (
            pytest.raises(BackendUnavailable),
            corral.connect(cluster.url.replace("rediss+", "redis+"), timeout=1) as plain,
        ):
            plain.lock(name).acquire()
    finally:
        cluster.stop()


# -- failover ----------------------------------------------------------------------------


@pytest.fixture
def cluster(backend_name: str, tmp_path: Path) -> Iterator[servers.RedisClusterServers]:
    """A cluster of the test's own, since the test kills a master."""
    started = start_server(backend_name, tmp_path)
    assert isinstance(started, servers.RedisClusterServers)
    try:
        yield started
    finally:
        started.stop()


def eventually(call: Callable[[], T], within: float = FAILOVER_WITHIN) -> T:
    """`call()`'s result once the cluster serves it again (BackendUnavailable meanwhile)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call()
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def replica_of(
    cluster: servers.RedisClusterServers, master: servers.RedisClusterNode
) -> servers.RedisClusterNode:
    return cluster.replicas[cluster.masters.index(master)]


def test_locks_and_entries_survive_their_master_failing_over(
    cluster: servers.RedisClusterServers, name: str
) -> None:
    """SIGKILL the master of a lock's slot: once its replica is promoted, the lock is
    still held (replicas=1 made sure the replica had it), the cache entry is still
    there, and new acquisitions on that slot work with larger fencing tokens."""
    with corral.connect(cluster.url, timeout=2) as store:
        held = store.lock(name, ttl=120, replicas=1)
        assert held.acquire()
        token = held.token
        assert token is not None
        cache = store.cache("failover", ttl=120)
        key = name  # its entry's slot differs from the lock's; both must come back
        assert cache.get_or_compute(key, lambda: "kept") == "kept"
        master = cluster.master_of(keyslot(redis_scripts.lock_keys("corral", name).lock))
        replica = replica_of(cluster, master)
        master.kill()
        # The lock is still held by `held` on the promoted replica: nobody else gets it.
        assert eventually(lambda: store.lock(name, ttl=5).acquire(wait=0)) is False
        assert cluster.master_of(keyslot(f"{{{name}}}")) is replica
        held.release()
        again = store.lock(name, ttl=5)
        assert eventually(lambda: again.acquire(wait=0))
        assert again.token is not None and again.token > token
        again.release()
        deadline = time.monotonic() + FAILOVER_WITHIN
        while cache.get(key) != "kept":  # the cache answers None while it cannot read
            assert time.monotonic() < deadline, "the entry did not come back"
            time.sleep(0.2)


def test_a_failover_can_lose_an_unreplicated_acquisition(
    cluster: servers.RedisClusterServers, name: str
) -> None:
    """What the capabilities say a lock can lose: an acquisition the master granted but
    never sent to its replica is gone once the replica is promoted, so a second client
    gets the lock. Its fencing token is still larger, and replicas=1 would have
    refused the first acquisition instead of granting what it could not keep."""
    lock_key = redis_scripts.lock_keys("corral", name).lock
    master = cluster.master_of(keyslot(lock_key))
    replica = replica_of(cluster, master)
    with corral.connect(cluster.url, timeout=2) as store:
        assert store.lock(f"{{{name}}}warm", ttl=1).acquire()  # the slot map is loaded
        # Cut the replica off: a wrong password keeps it from reconnecting (Redis 7
        # reconnects at once, and a stopped replica would still find in its socket
        # what the master sent meanwhile), then drop its link.
        replica.call("CONFIG", "SET", "masterauth", "not-the-password")
        replica.call("CLIENT", "KILL", "TYPE", "master")
        careful = store.lock(name, ttl=120, replicas=1)
        with pytest.raises(BackendUnavailable, match="replicas acknowledged"):
            careful.acquire()
        first = store.lock(name, ttl=120)
        assert first.acquire()
        assert first.token is not None
        assert "master_link_status:down" in replica.call("INFO", "replication")
        master.kill()
        second = store.lock(name, ttl=120)
        assert eventually(lambda: second.acquire(wait=0)), "the acquisition survived"
        assert cluster.master_of(keyslot(lock_key)) is replica
        assert second.token is not None and second.token > first.token
        second.release()
