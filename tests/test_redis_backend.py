"""What only the Redis backend does: how its waiters are woken, and its connections.

The contract suite shows that waiters get the lock; these tests show *how* they
are woken. The periodic re-check every waiter does is pushed out of reach, so a
waiter that gets the lock within the test's deadline was woken by the release
itself (its list, or the feed), not by its own timer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import corral
from corral._sync import lock as sync_lock
from corral._sync.backends import redis as sync_redis
from corral.backends import redis_scripts
from corral.core import lockflow

pytestmark = pytest.mark.backend("redis")

# Far beyond every deadline below: only a pushed wake-up can be in time.
NO_RECHECK = 120.0


@pytest.fixture
def only_pushed_wake_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    """No timer of a waiter fires within the test: the re-check, the queue place's
    refresh and the starvation guard all wait longer than any deadline here."""
    monkeypatch.setattr(lockflow, "NOTIFIED_RECHECK", NO_RECHECK)
    monkeypatch.setattr(sync_lock, "STARVE_AFTER", NO_RECHECK)
    monkeypatch.setattr(sync_lock, "FAIR_QUEUE_TTL", NO_RECHECK * 3)


@pytest.fixture
def stores(backend_url: str) -> Iterator[tuple[corral.Store, corral.Store]]:
    # A long socket timeout: a blocked pop ends at most at 80% of it.
    with (
        corral.connect(backend_url, timeout=NO_RECHECK) as one,
        corral.connect(backend_url, timeout=NO_RECHECK) as two,
    ):
        yield one, two


def wait_in_thread(lock: corral.Lock, seconds: float) -> tuple[threading.Thread, list[bool]]:
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(lock.acquire(wait=seconds)))
    thread.start()
    return thread, got


@pytest.mark.parametrize("mode", ["list", "feed"])
@pytest.mark.parametrize("fair", [False, True])
def test_a_release_wakes_a_waiter_of_another_store(
    stores: tuple[corral.Store, corral.Store],
    name: str,
    mode: str,
    fair: bool,
    only_pushed_wake_ups: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if mode == "feed":  # no blocked connections: every waiter listens to the feed
        monkeypatch.setattr(sync_redis, "MAX_BLOCKING", 0)
    holder_store, waiter_store = stores
    holder = holder_store.lock(name, ttl=NO_RECHECK * 2, fair=fair)
    assert holder.acquire()
    waiter = waiter_store.lock(name, ttl=30, fair=fair)
    thread, got = wait_in_thread(waiter, 60)
    time.sleep(0.3)  # it attempted, failed and waits now
    assert not got
    holder.release()
    thread.join(30)
    assert got == [True]
    waiter.release()


def test_each_release_wakes_one_waiter_outside_the_queue(
    stores: tuple[corral.Store, corral.Store], name: str, only_pushed_wake_ups: None
) -> None:
    holder_store, waiter_store = stores
    holder = holder_store.lock(name, ttl=60)
    assert holder.acquire()
    plain = [waiter_store.lock(name, ttl=30) for _ in range(3)]
    waiting = [wait_in_thread(lock, 60) for lock in plain]
    time.sleep(0.5)
    holder.release()
    for served in range(1, 4):
        # One token per release: exactly one more waiter gets the lock, no timer helps.
        deadline = time.monotonic() + 30
        while sum(got == [True] for _, got in waiting) < served:
            assert time.monotonic() < deadline, f"waiter {served} was never woken"
            time.sleep(0.05)
        time.sleep(0.3)
        assert sum(got == [True] for _, got in waiting) == served
        next(lock for lock in plain if lock.held).release()
    for thread, _ in waiting:
        thread.join(30)


def test_a_bounded_pool_never_blocks_its_connections_on_a_wait(
    backend_url: str, name: str, only_pushed_wake_ups: None
) -> None:
    with corral.connect(backend_url, max_connections=2, timeout=NO_RECHECK) as store:
        holder = store.lock(name, ttl=60)
        assert holder.acquire()
        waiters = [store.lock(name, ttl=30) for _ in range(3)]
        threads = [wait_in_thread(lock, 60) for lock in waiters]
        time.sleep(0.5)
        # Three waiters blocked on pops would hold more than the pool's two connections.
        info = store.lock_info(name)
        assert info is not None and info.owner == holder.owner
        holder.release()
        for _ in waiters:  # each release wakes the next waiter, through the feed
            deadline = time.monotonic() + 30
            while not any(w.held for w in waiters) and time.monotonic() < deadline:
                time.sleep(0.05)
            next(w for w in waiters if w.held).release()
        for thread, got in threads:
            thread.join(30)
            assert got == [True]


def test_a_release_with_nobody_waiting_spends_nothing_on_wake_ups(
    backend_url: str, name: str
) -> None:
    client: Any = redis.Redis.from_url(backend_url)
    keys = redis_scripts.lock_keys("corral", name)
    with corral.connect(backend_url) as store:
        lock = store.lock(name, ttl=30)
        for _ in range(3):
            assert lock.acquire()
            lock.release()
        assert client.exists(keys.signal, keys.waiting, keys.channel) == 0
        assert lock.acquire()
        assert not store.lock(name, ttl=30).acquire()  # a failed attempt: someone waits
        assert client.exists(keys.waiting) == 1
        lock.release()
        assert client.llen(keys.signal) == 1  # one token for one waiter, never more
        assert lock.acquire()
        lock.release()
        assert client.llen(keys.signal) == 1
    client.close()


def test_a_server_that_refuses_blpop_never_makes_a_waiter_spin(
    backend_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An ACL without BLPOP (or a proxy, or Redis before 6): waiters sleep and then use the
    pub/sub feed, instead of re-attempting as fast as the server answers."""
    admin: Any = redis.Redis.from_url(backend_url)
    user = f"noblock{name[-6:]}"
    admin.acl_setuser(
        user,
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-blpop"],
    )
    host_part = backend_url.split("://", 1)[1]
    url = f"redis://{user}:pw@{host_part}"
    try:
        with corral.connect(backend_url) as holder_store, corral.connect(url) as store:
            holder = holder_store.lock(name, ttl=30)
            assert holder.acquire()
            calls = int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
            assert not store.lock(name, ttl=30).acquire(wait=1.5)
            attempts = int(admin.info("commandstats")["cmdstat_evalsha"]["calls"]) - calls
            assert attempts < 20, f"{attempts} attempts in 1.5 s: the waiter spun"
            assert "refused BLPOP" in caplog.text
            # Later waiters of that store listen to the feed: a release wakes them.
            waiter = store.lock(name, ttl=30)
            thread, got = wait_in_thread(waiter, 30)
            time.sleep(0.3)
            holder.release()
            thread.join(30)
            assert got == [True]
            waiter.release()
    finally:
        admin.acl_deluser(user)
        admin.close()
