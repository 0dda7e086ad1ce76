"""What only the Redis backend does: how its waiters are woken, and its connections.

The contract suite shows that waiters get the lock; these tests show *how* they
are woken. The periodic re-check every waiter does is pushed out of reach, so a
waiter that gets the lock within the test's deadline was woken by the release
itself (its list, or the feed), not by its own timer.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import corral
import corral.aio
from corral._async import lock as async_lock
from corral._sync import lock as sync_lock
from corral._sync.backends import redis as sync_redis
from corral.backends import redis_scripts
from corral.core import lockflow
from corral.core.envelope import claim_due, encode, make_codec
from corral.core.primitives import CacheRead, Claim

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


# -- semaphores ---------------------------------------------------------------------


def hold_slots(store: corral.Store, name: str, limit: int, count: int) -> list[corral.Semaphore]:
    slots = [store.semaphore(name, limit, ttl=NO_RECHECK * 2) for _ in range(count)]
    for slot in slots:
        assert slot.acquire()
    return slots


def wait_for_slots(
    store: corral.Store, name: str, limit: int, count: int, *, fair: bool = False
) -> list[tuple[corral.Semaphore, threading.Thread, list[bool]]]:
    waiting = []
    for _ in range(count):
        slot = store.semaphore(name, limit, ttl=30, fair=fair)
        thread, got = wait_in_thread(slot, 60)
        waiting.append((slot, thread, got))
    time.sleep(0.5)  # they attempted, failed and wait now
    assert not any(got for _, _, got in waiting)
    return waiting


def until(condition: Any, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("mode", ["list", "feed"])
@pytest.mark.parametrize("fair", [False, True])
def test_a_slot_release_wakes_a_waiter_of_another_store(
    stores: tuple[corral.Store, corral.Store],
    name: str,
    mode: str,
    fair: bool,
    only_pushed_wake_ups: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if mode == "feed":
        monkeypatch.setattr(sync_redis, "MAX_BLOCKING", 0)
    holder_store, waiter_store = stores
    holders = hold_slots(holder_store, name, 2, 2)
    [(waiter, thread, got)] = wait_for_slots(waiter_store, name, 2, 1, fair=fair)
    started = time.monotonic()
    holders[0].release()
    thread.join(30)
    # Its own re-check would come NO_RECHECK seconds later: the release woke it.
    assert got == [True] and time.monotonic() - started < 10
    waiter.release()
    holders[1].release()


def test_a_lock_release_does_not_wake_a_semaphore_waiter(
    stores: tuple[corral.Store, corral.Store],
    backend_url: str,
    name: str,
    only_pushed_wake_ups: None,
) -> None:
    holder_store, waiter_store = stores
    lock = holder_store.lock(name, ttl=60)
    assert lock.acquire()
    [holder] = hold_slots(holder_store, name, 1, 1)
    client: Any = redis.Redis.from_url(backend_url)
    keys = redis_scripts.semaphore_keys("corral", name)
    try:
        [(waiter, thread, got)] = wait_for_slots(waiter_store, name, 1, 1)
        lock.release()  # the lock's lists and channel only
        assert client.llen(keys.signal) == 0
        time.sleep(0.3)
        assert not got
        holder.release()
        thread.join(30)
        assert got == [True]
        waiter.release()
    finally:
        client.close()


@pytest.mark.parametrize("fair", [False, True])
def test_freeing_many_slots_wakes_as_many_waiters(
    stores: tuple[corral.Store, corral.Store], name: str, fair: bool, only_pushed_wake_ups: None
) -> None:
    """One wake-up per freed slot: a force-release of three slots, or three releases in a
    row before any waiter woke, lets three waiters in, with no timer's help."""
    holder_store, waiter_store = stores
    for free in ("force", "releases"):
        holders = hold_slots(holder_store, name, 3, 3)
        waiting = wait_for_slots(waiter_store, name, 3, 3, fair=fair)
        if free == "force":
            assert holder_store.force_release_semaphore(name) == 3
        else:
            for holder in holders:
                holder.release()
        got_all = [got for _, _, got in waiting]
        until(lambda got_all=got_all: all(got == [True] for got in got_all), f"not all ({free})")
        for slot, thread, _ in waiting:
            thread.join(30)
            slot.release()


def test_a_slot_release_with_nobody_waiting_spends_nothing_on_wake_ups(
    backend_url: str, name: str
) -> None:
    client: Any = redis.Redis.from_url(backend_url)
    keys = redis_scripts.semaphore_keys("corral", name)
    with corral.connect(backend_url) as store:
        slots = [store.semaphore(name, 2, ttl=30) for _ in range(2)]
        for _ in range(3):
            for slot in slots:
                assert slot.acquire()
            for slot in slots:
                slot.release()
        assert client.exists(keys.signal, keys.waiting) == 0
        for slot in slots:
            assert slot.acquire()
        assert not store.semaphore(name, 2, ttl=30).acquire()  # someone waits now
        assert client.exists(keys.waiting) == 1
        slots[0].release()
        assert client.llen(keys.signal) == 1  # one token for the one free slot
        slots[1].release()
        assert client.llen(keys.signal) == 2
        # A failed attempt saw no slot for it: the tokens were stale, and are dropped.
        for slot in slots:
            assert slot.acquire()
        assert not store.semaphore(name, 2, ttl=30).acquire()
        assert client.llen(keys.signal) == 0
        for slot in slots:
            slot.release()
    client.close()


NAMES = ["plain", "nul\0byte", "ünïcødé ✓", "{braces}%7B", "long" * 300, "lone \ud800"]


def test_a_semaphore_name_used_once_leaves_no_key_behind(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key a semaphore writes (slots, tokens, limit, fence, queue, wake-up lists,
    the waiting marker) expires with its last use, under the store's prefix only."""
    # Short markers and queue places, so the test need not wait out the defaults.
    monkeypatch.setattr(lockflow, "NOTIFIED_RECHECK", 0.2)
    monkeypatch.setattr(sync_lock, "FAIR_QUEUE_TTL", 0.6)
    prefix = f"sem-{uuid.uuid4().hex[:8]}"
    client: Any = redis.Redis.from_url(backend_url)
    before = set(client.scan_iter(match="*", count=1000))
    try:
        with (
            corral.connect(backend_url, prefix=prefix) as one,
            corral.connect(backend_url, prefix=prefix) as two,
        ):
            for index, base in enumerate(NAMES):
                name = f"{base}-{index}"
                # Slots outlive the 0.6 s spent on purpose below, even with a pause on top.
                slots = [one.semaphore(name, 2, ttl=2) for _ in range(2)]
                for slot in slots:
                    assert slot.acquire()
                # Waiters that give up, in the queue and outside it, and ones that get in.
                assert not two.semaphore(name, 2, ttl=1, fair=True).acquire(wait=0.3)
                assert not two.semaphore(name, 2, ttl=1).acquire(wait=0.3)
                waiter = two.semaphore(name, 2, ttl=2, fair=True)
                thread, got = wait_in_thread(waiter, 10)
                time.sleep(0.1)
                slots[0].release()
                thread.join(10)
                assert got == [True]
                waiter.release(hold_for=1.0)
                slots[1].extend(ttl=1.5)  # left to expire, as a crashed holder's
                info = one.semaphore_info(name)
                assert info is not None and info.limit == 2 and len(info.holders) == 2
            new = set(client.scan_iter(match="*", count=1000)) - before
            assert new and all(key.startswith(prefix.encode() + b":{") for key in new), new
            # The fence follows the longest slot: the waiter's, 2 s from its acquire.
            time.sleep(3.2)
            for index, base in enumerate(NAMES):
                assert one.semaphore_info(f"{base}-{index}") is None
        left = [key for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
        assert left == [], f"{len(left)} keys left: {left[:5]}"
    finally:
        client.close()


def test_tokens_increase_while_the_fence_outlives_every_slot(backend_url: str, name: str) -> None:
    client: Any = redis.Redis.from_url(backend_url)
    keys = redis_scripts.semaphore_keys("corral", name)
    with corral.connect(backend_url) as store:
        # Slots live through a few round trips, even when the test is paused.
        first = store.semaphore(name, 2, ttl=3)
        assert first.acquire()
        first.extend(ttl=20)
        # The fence lives at least as long as the longest slot, extended or held.
        assert client.pttl(keys.fence) > 15_000
        second = store.semaphore(name, 2, ttl=3)
        assert second.acquire()
        tokens = [first.token, second.token]
        second.release(hold_for=30)
        assert client.pttl(keys.fence) > 25_000
        assert client.pttl(keys.slots) > 25_000 and client.pttl(keys.owners) > 25_000
        first.release()
        third = store.semaphore(name, 2, ttl=3)
        assert third.acquire()
        tokens.append(third.token)
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        info = store.semaphore_info(name)
        assert info is not None
        assert [h.owner for h in info.holders] == [None, third.owner]  # oldest token first
        assert store.force_release_semaphore(name) == 2
    client.close()


def test_concurrent_attempts_from_many_connections_never_exceed_the_limit(
    backend_url: str, name: str
) -> None:
    """Each attempt is one script: 16 connections attempting at the same instant get
    exactly `limit` slots, with distinct tokens above every earlier one."""
    limit, contenders = 3, 16
    client: Any = redis.Redis.from_url(backend_url)
    keys = redis_scripts.semaphore_keys("corral", name)
    stores = [corral.connect(backend_url) for _ in range(contenders)]
    try:
        last = 0
        for _ in range(5):
            slots = [store.semaphore(name, limit, ttl=30) for store in stores]
            barrier = threading.Barrier(contenders)
            granted: list[bool] = [False] * contenders

            def attempt(
                index: int, barrier: threading.Barrier, slot: corral.Semaphore, granted: list[bool]
            ) -> None:
                barrier.wait()
                granted[index] = slot.acquire()

            threads = [
                threading.Thread(target=attempt, args=(i, barrier, slots[i], granted))
                for i in range(contenders)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert sum(granted) == limit
            assert client.zcard(keys.slots) == limit
            assert client.hlen(keys.owners) == limit + 1  # one token each, and the limit
            tokens = sorted(slot.token for slot in slots if slot.token is not None)
            assert len(set(tokens)) == limit and tokens[0] > last
            last = tokens[-1]
            for slot in slots:
                if slot.held:
                    slot.release()
        assert client.exists(keys.slots, keys.owners) == 0
    finally:
        for store in stores:
            store.close()
        client.close()


def test_a_cancelled_wait_takes_no_slot_and_leaves_the_queue(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A place that outlives the test: only leaving the queue empties it.
    monkeypatch.setattr(async_lock, "FAIR_QUEUE_TTL", 300.0)
    client: Any = redis.Redis.from_url(backend_url)
    keys = redis_scripts.semaphore_keys("corral", name)

    async def scenario() -> None:
        async with corral.aio.connect(backend_url) as store:
            holder = store.semaphore(name, 1, ttl=30)
            assert await holder.acquire()
            waiter = store.semaphore(name, 1, ttl=30, fair=True)
            task = asyncio.create_task(waiter.acquire(wait=30))
            deadline = time.monotonic() + 30
            while client.zcard(keys.queue) == 0:  # it attempted, failed and waits now
                assert time.monotonic() < deadline, "the waiter never took a place"
                await asyncio.sleep(0.02)
            assert client.zcard(keys.queue) == 1
            deadline = time.monotonic() + 30
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not waiter.held
            # It leaves its place: at once if the cancel found it waiting, once the answer
            # is in if the cancel landed on the attempt that took the place.
            while client.zcard(keys.queue) != 0:
                assert time.monotonic() < deadline, "the cancelled waiter kept its place"
                await asyncio.sleep(0.02)
            info = await store.semaphore_info(name)
            assert info is not None and [h.owner for h in info.holders] == [holder.owner]
            await holder.release()
            assert await store.semaphore_info(name) is None
            newcomer = store.semaphore(name, 1, ttl=30)
            assert await newcomer.acquire()  # no stale place ahead of it
            await newcomer.release()

    try:
        asyncio.run(scenario())
    finally:
        client.close()


def test_semaphore_keys_share_the_lock_hash_tag_and_never_its_keys() -> None:
    for name in NAMES:
        lock = redis_scripts.lock_keys("app", name)
        sem = redis_scripts.semaphore_keys("app", name)
        tag = lock.lock[: lock.lock.index("}") + 1]
        sem_keys = [*sem[:-1], sem.wake("owner")]
        assert all(key.startswith(tag + ":sem:") for key in sem_keys)
        assert not set(sem_keys) & {*lock[:-1], lock.wake("owner")}
        assert len(set(sem_keys)) == len(sem_keys)


# -- cache entries ------------------------------------------------------------------

CODEC = make_codec("json", None)


def cache_entry(key: str, value: object, *, fresh_for: float = 30.0, generation: int = 0) -> bytes:
    return encode(
        value, CODEC, key, fresh_until=time.time() + fresh_for, delta=0.01, generation=generation
    )


def recompute_claim(name: str, owner: str = "me") -> Claim:
    return Claim(lock=f"recompute-{name}", owner=owner, ttl=30.0, due_before=time.time())


@pytest.fixture
def store(backend_url: str) -> Iterator[corral.Store]:
    with corral.connect(backend_url) as opened:
        yield opened


@pytest.fixture
def client(backend_url: str) -> Iterator[Any]:
    raw: Any = redis.Redis.from_url(backend_url)
    yield raw
    raw.close()


def count_writes(backend: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the backend writes to a socket: one write, then its answers, is
    one round trip (a command and its reads alternate on a connection)."""
    writes = [0]
    wrapped: set[int] = set()
    borrow = backend._borrow

    def counting_borrow() -> Any:
        connection = borrow()
        if id(connection) not in wrapped:
            wrapped.add(id(connection))
            send = connection.send_packed_command

            def counting_send(*args: Any, **kwargs: Any) -> Any:
                writes[0] += 1
                return send(*args, **kwargs)

            monkeypatch.setattr(connection, "send_packed_command", counting_send)
        return connection

    monkeypatch.setattr(backend, "_borrow", counting_borrow)
    return writes


def monitored(url: str, action: Callable[[], object]) -> list[dict[str, Any]]:
    """The commands the server ran while `action` ran, as MONITOR reports them (the
    commands a script runs come with client_type "lua")."""
    watcher: Any = redis.Redis.from_url(url, decode_responses=True)
    ender: Any = redis.Redis.from_url(url)
    ender.ping()  # connected now: the marker below is all it sends while watched
    marker = f"end-{uuid.uuid4().hex}"
    seen: list[dict[str, Any]] = []
    started = threading.Event()

    def listen() -> None:
        with watcher.monitor() as monitor:
            started.set()
            while True:
                command = monitor.next_command()
                if command["command"] == f"ECHO {marker}":
                    return
                seen.append(command)

    thread = threading.Thread(target=listen)
    thread.start()
    try:
        assert started.wait(10)
        action()
    finally:
        ender.echo(marker)
        thread.join(10)
        watcher.close()
        ender.close()
    return seen


def test_a_read_that_claims_is_one_script_call_in_one_round_trip(
    backend_url: str, store: corral.Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend: Any = store.backend
    key = f"ns:{name}"
    backend.cache_read(f"{key}-warm", "g", recompute_claim(f"{name}-warm"))  # connect, load
    writes = count_writes(backend, monkeypatch)
    reads: list[CacheRead] = []
    commands = monitored(
        backend_url, lambda: reads.append(backend.cache_read(key, "g", recompute_claim(name)))
    )
    (read,) = reads
    assert read.entry is None and read.attempt is not None and read.attempt.acquired
    assert writes == [1]
    sent = [c["command"].split(" ")[0] for c in commands if c["client_type"] != "lua"]
    assert sent == ["EVALSHA"]
    in_script = [c["command"].split(" ")[0] for c in commands if c["client_type"] == "lua"]
    assert in_script[0] == "MGET" and "SET" in in_script  # read, then the lock taken
    lock_key = redis_scripts.lock_keys("corral", f"recompute-{name}").lock
    assert any(c["command"].startswith(f"SET {lock_key} ") for c in commands)


def test_fetch_store_and_clear_cost_one_round_trip_each(
    backend_url: str, store: corral.Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend: Any = store.backend
    keys = [f"ns:{name}:{i}" for i in range(20)]
    backend.cache_fetch(keys[:1], "g")  # connect
    writes = count_writes(backend, monkeypatch)
    backend.cache_store([(key, cache_entry(key, i), 60.0) for i, key in enumerate(keys)])
    assert writes == [1]
    found, generation = backend.cache_fetch(keys, f"gen-{name}")
    assert writes == [2] and all(found) and generation == 0
    commands = monitored(backend_url, lambda: backend.cache_fetch(keys, f"gen-{name}"))
    (mget,) = [c["command"] for c in commands]
    assert mget.startswith("MGET ")
    assert mget.endswith(redis_scripts.cache_gen_key("corral", f"gen-{name}"))
    assert backend.cache_clear(f"gen-{name}") == 1
    assert writes == [4]


@pytest.mark.parametrize(
    ("keep", "px"), [(60.0, 60000), (2.0001, 2001), (0.0000001, 1), (1e-3, 1), (0.5, 500)]
)
def test_an_entry_carries_a_px_expiry_in_whole_ms_rounded_up(
    backend_url: str, store: corral.Store, name: str, keep: float, px: int
) -> None:
    key = f"ns:{name}"
    store.backend.cache_fetch([key], "g")  # connect
    commands = monitored(
        backend_url, lambda: store.backend.cache_store([(key, cache_entry(key, 1), keep)])
    )
    (command,) = [c["command"] for c in commands]
    assert command.startswith(f"SET {redis_scripts.cache_key('corral', key)} ")
    assert command.endswith(f" PX {px}")


def test_keep_0_deletes_and_invalidate_resets_the_server_expiry(
    store: corral.Store, client: Any, name: str
) -> None:
    backend = store.backend
    key = f"ns:{name}"
    raw_key = redis_scripts.cache_key("corral", key)
    backend.cache_store([(key, cache_entry(key, 1), 600.0)])
    assert 590_000 < client.pttl(raw_key) <= 600_000
    assert backend.cache_invalidate(key, 30.0)
    assert 25_000 < client.pttl(raw_key) <= 30_000
    backend.cache_store([(key, cache_entry(key, 2), 0.0)])
    assert client.exists(raw_key) == 0


def test_invalidate_deletes_what_is_not_an_entry(
    store: corral.Store, client: Any, name: str
) -> None:
    backend = store.backend
    foreign = f"ns:{name}-foreign"
    # The magic, but no header behind it: not rewritten in place, deleted.
    backend.cache_store([(foreign, b"c1" + b"x" * 80, 60.0)])
    listed = f"ns:{name}-list"
    client.rpush(redis_scripts.cache_key("corral", listed), "something else's")
    assert backend.cache_invalidate(foreign, 30.0) is True
    assert backend.cache_invalidate(listed, 30.0) is True
    assert (
        client.exists(
            redis_scripts.cache_key("corral", foreign), redis_scripts.cache_key("corral", listed)
        )
        == 0
    )


def test_a_key_of_another_type_reads_as_missing(
    store: corral.Store, client: Any, name: str
) -> None:
    key = f"ns:{name}"
    client.hset(redis_scripts.cache_key("corral", key), "field", "value")
    assert store.backend.cache_fetch([key], "g") == ([None], 0)
    read = store.backend.cache_read(key, "g", recompute_claim(name))
    assert read.entry is None and read.attempt is not None and read.attempt.acquired


@pytest.mark.parametrize("odd", [*NAMES, "x" * 10_000], ids=lambda odd: repr(odd)[:12])
def test_cache_keys_are_escaped_like_lock_names_and_meet_no_lock_key(
    store: corral.Store, client: Any, name: str, odd: str
) -> None:
    key = f"{name}:{odd}"
    store.backend.cache_store([(key, cache_entry(key, 1), 60.0)])
    raw_key = redis_scripts.cache_key("corral", key)
    assert client.get(raw_key) is not None
    lock_keys = redis_scripts.lock_keys("corral", key)
    assert "{" not in raw_key.removeprefix("corral:") and "}" not in raw_key
    lock = store.lock(key, ttl=30)
    assert lock.acquire()
    try:
        assert client.exists(lock_keys.lock) == 1
        assert store.backend.cache_fetch([key], key)[0][0] is not None
        assert store.backend.cache_clear(key) == 1
        assert store.lock_info(key) is not None
        assert client.get(redis_scripts.cache_gen_key("corral", key)) == b"1"
    finally:
        lock.release()
        store.backend.cache_delete(key)
        client.delete(redis_scripts.cache_gen_key("corral", key))


def test_cache_keys_and_generation_keys_live_under_the_store_prefix(
    backend_url: str, client: Any, name: str
) -> None:
    prefix = f"app-{name}"
    with corral.connect(f"{backend_url}?prefix={prefix}") as store:
        store.backend.cache_store([("k", cache_entry("k", 1), 60.0)])
        store.backend.cache_clear("k")
        found = sorted(client.scan_iter(match=f"{prefix}:*"))
        assert found == [f"{prefix}:cache:k".encode(), f"{prefix}:cachegen:k".encode()]
        assert client.ttl(f"{prefix}:cachegen:k") == -1  # a generation is never forgotten
        store.backend.cache_delete("k")
        client.delete(f"{prefix}:cachegen:k")


def test_count_quotes_glob_characters_in_the_key_prefix(store: corral.Store, name: str) -> None:
    backend = store.backend
    keys = [f"{name}:{tail}" for tail in ["a*", "a*b", "ab", "a?", "[a]", "a\\", "a\\b", "%"]]
    backend.cache_store([(key, cache_entry(key, 1), 60.0) for key in keys])
    assert backend.cache_count(f"{name}:") == len(keys)
    assert backend.cache_count(f"{name}:a*") == 2
    assert backend.cache_count(f"{name}:a?") == 1
    assert backend.cache_count(f"{name}:[a]") == 1
    assert backend.cache_count(f"{name}:a\\") == 2
    assert backend.cache_count(f"{name}:%") == 1
    assert backend.cache_count(f"{name}:nothing") == 0


def test_a_read_after_the_server_lost_its_scripts_sends_the_text(
    store: corral.Store, client: Any, name: str
) -> None:
    key = f"ns:{name}"
    store.backend.cache_read(key, "g")
    client.script_flush()
    read = store.backend.cache_read(key, "g", recompute_claim(name))
    assert read.attempt is not None and read.attempt.acquired
    store.backend.cache_store([(key, cache_entry(key, 1), 60.0)])
    client.script_flush()
    assert store.backend.cache_invalidate(key, 30.0)


def test_the_release_of_a_claimed_lock_wakes_its_waiter(
    stores: tuple[corral.Store, corral.Store], name: str, only_pushed_wake_ups: None
) -> None:
    reader, other = stores
    read = reader.backend.cache_read(f"ns:{name}", "g", recompute_claim(name, "reader"))
    assert read.attempt is not None and read.attempt.acquired
    waiter = other.lock(f"recompute-{name}", ttl=30)
    thread, got = wait_in_thread(waiter, 60)
    time.sleep(0.3)
    assert not got
    started = time.monotonic()
    reader.backend.release(f"recompute-{name}", "reader")
    thread.join(30)
    assert got == [True] and time.monotonic() - started < 5
    waiter.release()


def header_cases() -> list[tuple[str, bytes, int, float]]:
    """(what, stored bytes, current generation, due_before), around every edge of the rule."""
    at = 1_700_000_000.5

    def made(fresh: float, retry: float = 0.0, generation: int = 0) -> bytes:
        return encode(
            "v",
            CODEC,
            "k",
            fresh_until=fresh,
            delta=0.25,
            generation=generation,
            retry_until=retry,
        )

    good = made(at)
    return [
        ("fresh until exactly due_before", good, 0, at),
        ("fresh until a microsecond after due_before", good, 0, at - 0.000001),
        ("fresh until long after due_before", good, 0, at - 100),
        ("held back by a remembered error", made(at - 100, retry=at + 1), 0, at),
        ("error remembered until exactly due_before", made(0.0, retry=at), 0, at),
        ("written under the current generation", made(at + 5, generation=7), 7, at),
        ("written under another generation", made(at + 5, generation=6), 7, at),
        ("a huge generation", made(at + 5, generation=10**15 + 3), 10**15 + 3, at),
        ("an empty value", b"", 0, at),
        ("no magic", b"c2" + good[2:], 0, at),
        ("a short header", good[:65], 0, at),
        ("no newline after the header", good[:65] + b" " + good[66:], 0, at),
        ("a codec letter that is no ASCII", good[:64] + b"\xe9" + good[65:], 0, at),
        ("a field that is not a number", good[:2] + b"x" * 17 + good[19:], 0, at),
        ("a header and no payload", good[:66], 0, at - 1),
    ]


@pytest.mark.parametrize(
    ("what", "data", "generation", "due_before"), header_cases(), ids=lambda v: str(v)[:40]
)
def test_the_server_decides_due_as_claim_due_does(
    store: corral.Store,
    client: Any,
    name: str,
    what: str,
    data: bytes,
    generation: int,
    due_before: float,
) -> None:
    key, gen_key = f"ns:{name}", f"gen-{name}"
    store.backend.cache_store([(key, data, 60.0)])
    if generation:
        client.set(redis_scripts.cache_gen_key("corral", gen_key), generation)
    claim = Claim(f"recompute-{name}", "me", 30.0, due_before)
    read = store.backend.cache_read(key, gen_key, claim)
    assert read.entry == data and read.generation == generation
    assert (read.attempt is not None) == claim_due(data, generation, due_before), what
    client.delete(redis_scripts.cache_gen_key("corral", gen_key))


def unreachable_url(listener: socket.socket | None) -> str:
    """A URL with a password, on a port where nothing answers (or nothing listens)."""
    if listener is not None:
        port = listener.getsockname()[1]
    else:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    return f"redis://:hunter2@127.0.0.1:{port}/0?timeout=0.5"


@pytest.mark.parametrize("server", ["closed", "silent"])
def test_cache_calls_on_a_dead_server_raise_backend_unavailable_in_time(server: str) -> None:
    listener = None
    if server == "silent":  # accepts connections, never answers
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
    url = unreachable_url(listener)
    calls: list[Callable[[Any], object]] = [
        lambda b: b.cache_fetch(["k"], "g"),
        lambda b: b.cache_read("k", "g", recompute_claim("k")),
        lambda b: b.cache_store([("k", b"data", 60.0)]),
        lambda b: b.cache_delete("k"),
        lambda b: b.cache_invalidate("k", 30.0),
        lambda b: b.cache_clear("g"),
        lambda b: b.cache_count("k"),
    ]
    try:
        with corral.connect(url) as store:
            for call in calls:
                started = time.monotonic()
                with pytest.raises(corral.BackendUnavailable) as caught:
                    call(store.backend)
                assert time.monotonic() - started < 0.5 * 2 + 3  # room for a paused test
                message = str(caught.value)
                assert "127.0.0.1" in message and "hunter2" not in message
    finally:
        if listener is not None:
            listener.close()


def test_cache_key_mapping_is_injective_and_apart_from_lock_keys() -> None:
    samples = [*NAMES, "%7B", "%25", "%uD800", "a:b", "a", "a:", ""]
    mapped = [redis_scripts.cache_key("app", key) for key in samples]
    assert len(set(mapped)) == len(samples)
    generations = [redis_scripts.cache_gen_key("app", key) for key in samples]
    assert not set(mapped) & set(generations)
    for key in samples:
        lock = redis_scripts.lock_keys("app", key)
        sem = redis_scripts.semaphore_keys("app", key)
        assert redis_scripts.cache_key("app", key) not in {*lock, *sem}
