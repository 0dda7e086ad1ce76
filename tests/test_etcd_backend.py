"""What only the etcd backend does: several members and failover, leases of whole seconds,
round trips, watches, answers lost after the cluster applied a request, dead fair
waiters, authentication and TLS.

The contract suite (tests/_async, tests/_sync) and the fault tests already run
over `etcd` and `etcd-cluster`; these tests cover what they cannot see.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import select
import signal
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.aio
from corral._sync.backends import etcd as sync_etcd
from corral._sync.backends.etcd import EtcdBackend
from corral.backends import etcd_api as api
from corral.core.envelope import claim_due, encode, make_codec, mark_stale
from corral.core.primitives import CacheRead, Claim, Outcome
from corral.errors import BackendError, BackendUnavailable, ConfigError, LockExpired
from corral.testing import servers
from tests.conftest import server_missing

JSON = make_codec("json", None)

# -- no server --------------------------------------------------------------------


def test_url_lists_every_member_with_default_ports() -> None:
    options = api.parse_url("etcd://a:1,b,[::1]:3", {})
    assert options.endpoints == ("http://a:1", "http://b:2379", "http://[::1]:3")
    assert options.server == "etcd://a:1,b:2379,[::1]:3"
    assert options.timeout == api.DEFAULT_TIMEOUT and options.prefix == "corral"
    tls = api.parse_url("etcds://a?timeout=2&ca_file=/ca.pem", {"prefix": "app"})
    assert tls.endpoints == ("https://a:2379",) and tls.tls
    assert tls.timeout == 2.0 and tls.ca_file == "/ca.pem" and tls.prefix == "app"


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("etcd://a:1", {"colour": "red", "size": 1}, "colour, size"),
        ("etcd://a:1?colour=red", {}, "colour"),
        ("etcd://a:1", {"ca_file": "/ca.pem"}, "etcds://"),
        ("etcds://a:1", {"cert_file": "/c.pem"}, "key_file"),
        ("etcd://a:1", {"timeout": 0}, "timeout"),
        ("etcd://a:1?timeout=soon", {}, "timeout"),
        ("etcd://a:1?timeout=2", {"timeout": 3}, "twice"),
        ("etcd://a:99999", {}, "port"),
        ("etcd://", {}, "member"),
        ("etcd://a:1/locks", {}, "prefix="),
        ("etcd://::1", {}, "brackets"),
        ("etcd://a:1", {"prefix": ""}, "prefix"),
    ],
)
def test_bad_urls_and_options(url: str, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        corral.connect(url, **options)


def test_credentials_never_appear(unused_port: int) -> None:
    url = f"etcd://alice:s3cret@127.0.0.1:{unused_port},127.0.0.1:{unused_port}"
    with pytest.raises(ConfigError) as bad:
        corral.connect(url + "?bogus=1")
    assert "s3cret" not in str(bad.value)
    with corral.connect(url, timeout=0.5) as store:
        assert "s3cret" not in store.server and "s3cret" not in repr(store)
        assert "s3cret" not in repr(store.lock("x"))
        assert store.server == f"etcd://alice:***@127.0.0.1:{unused_port},127.0.0.1:{unused_port}"
        with pytest.raises(BackendUnavailable) as down:
            store.lock("x").acquire()
        assert "s3cret" not in str(down.value) and "'x'" in str(down.value)
        assert f"127.0.0.1:{unused_port}" in str(down.value)


def test_lease_seconds_round_up() -> None:
    assert [api.lease_seconds(t) for t in (0.001, 0.3, 1.0, 1.0000001, 2.5, 30.0)] == [
        1,
        1,
        1,
        1,
        3,
        30,
    ]


def test_each_lock_has_its_own_prefix() -> None:
    plain, nested = api.lock_keys("corral", "a"), api.lock_keys("corral", "a/b")
    assert not nested.scope.startswith(plain.scope)
    assert plain.holder.startswith(plain.scope) and plain.queue.startswith(plain.scope)
    assert api.lock_keys("corral", "%2F").scope != api.lock_keys("corral", "/").scope
    assert api.prefix_end(b"a/") == b"a0" and api.prefix_end(b"a\xff") == b"b"


def test_capabilities_are_declared() -> None:
    caps = EtcdBackend.capabilities
    assert (caps.linearizable, caps.cross_host, caps.notifies, caps.fair) == (True,) * 4
    assert not caps.replicas


def test_tries_share_the_timeout_between_members() -> None:
    now = [100.0]
    endpoints = api.Endpoints(["http://a", "http://b", "http://c"], ["a", "b", "c"])
    tries = api.Tries(endpoints, 3.0, 103.0, lambda: now[0])
    first = tries.next()
    assert first is not None and (first.index, first.within, first.pause) == (0, 1.0, 0.0)
    now[0] += 1.0
    tries.failed(0, api.Failure.SLOW, " did not answer")
    second = tries.next()
    assert second is not None and second.index == 1 and endpoints.order()[0] == 1
    tries.failed(1, api.Failure.BUSY, ": no leader")
    third = tries.next()
    assert third is not None and third.index == 2
    tries.failed(2, api.Failure.BUSY, ": no leader")
    # Another round while time is left, the slow member last.
    again = [tries.next() for _ in range(3)]
    assert [t.index for t in again if t is not None] == [1, 2, 0]
    now[0] = 103.0
    assert tries.next() is None
    assert tries.problems[:2] == ["a did not answer", "b: no leader"]


def test_tries_give_up_at_once_when_every_member_is_down() -> None:
    endpoints = api.Endpoints(["http://a", "http://b"], ["a", "b"])
    tries = api.Tries(endpoints, 5.0, 1e9, lambda: 0.0)
    for _ in range(2):
        chosen = tries.next()
        assert chosen is not None
        tries.failed(chosen.index, api.Failure.DOWN, ": refused")
    assert tries.next() is None
    busy = api.Tries(endpoints, 5.0, 1e9, lambda: 0.0)
    for _ in range(2):
        chosen = busy.next()
        assert chosen is not None
        busy.failed(chosen.index, api.Failure.BUSY, ": no leader")
    chosen = busy.next()
    assert chosen is not None and chosen.pause == api.ROUND_PAUSE  # an election: pause


def test_any_str_is_a_key_and_long_names_are_hashed() -> None:
    names = ["a", "a/b", "a%2Fb", "nul\x00", "lone \ud800", "\ud83d\ude00", "😀", "x" * 300]
    scopes = [api.lock_keys("corral", n).scope for n in names]
    assert len(set(scopes)) == len(names)  # one-to-one, surrogates included
    assert api.lock_keys("corral", "x" * 300) == api.lock_keys("corral", "x" * 300)
    long = api.lock_keys("corral", "x" * 300).scope
    assert len(long) < 200 and b"%#" in long
    assert api.lock_keys("corral", "x" * 300 + "!").scope != long
    # A short name can never look like a cut one: "%" is always escaped.
    assert b"%#" not in api.lock_keys("corral", "%#").scope


def test_semaphore_keys_keep_limits_and_kinds_apart() -> None:
    keys = api.semaphore_keys("corral", "a")
    assert not keys.scope.startswith(api.lock_keys("corral", "a").scope)
    assert keys.slot(3, 2) == keys.slots + b"3/2" and keys.parse_slot(keys.slot(3, 2)) == (3, 2)
    # No limit's slots fall in another limit's range: "3/" covers neither "30/" nor "13/".
    for other in (1, 13, 30, 300):
        assert not keys.slot(other, 0).startswith(keys.of_limit(3))
        start, end = keys.of_limit(3), api.prefix_end(keys.of_limit(3))
        assert not start <= keys.slot(other, 0) < end
    for bad in (keys.slots + b"3/3", keys.slots + b"x/0", keys.queue + b"3/0"):
        with pytest.raises(ValueError):
            keys.parse_slot(bad)
    assert EtcdBackend.capabilities.semaphores


def test_lease_ids_are_positive_int64() -> None:
    ids = {api.new_lease_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(0 < i < 2**63 for i in ids)


def test_which_refusals_may_still_be_applied() -> None:
    assert api.maybe_applied("etcdserver: request timed out")
    assert api.maybe_applied("etcdserver: leader changed")
    assert not api.maybe_applied("etcdserver: no leader")
    assert not api.maybe_applied("etcdserver: too many requests")
    exists = {"message": "etcdserver: lease already exists", "code": 9}
    trouble = api.server_error(400, json.dumps(exists).encode()).trouble
    assert trouble is api.Trouble.LEASE_EXISTS


def test_options_are_declared_and_the_password_is_never_shown() -> None:
    assert [o.name for o in EtcdBackend.url_options] == [
        "prefix",
        "timeout",
        "ca_file",
        "cert_file",
        "key_file",
    ]
    options = api.parse_url("etcd://alice:pw-secret@a:1?timeout=2", {"prefix": "app"})
    assert (options.timeout, options.prefix, options.password) == (2.0, "app", "pw-secret")
    assert "pw-secret" not in repr(options) and "pw-secret" not in options.server


def test_errors_are_classified() -> None:
    def trouble(status: int, body: object) -> api.Trouble:
        return api.server_error(status, json.dumps(body).encode()).trouble

    no_leader = {"error": "etcdserver: no leader", "message": "etcdserver: no leader", "code": 14}
    assert trouble(503, no_leader) is api.Trouble.ELSEWHERE
    closing = {"error": {"grpc_code": 1, "message": "grpc: the client connection is closing"}}
    assert trouble(200, closing) is api.Trouble.ELSEWHERE
    gone = {"message": "etcdserver: requested lease not found", "code": 5}
    assert trouble(404, gone) is api.Trouble.LEASE_NOT_FOUND
    token = {"message": "etcdserver: invalid auth token", "code": 16}
    assert trouble(401, token) is api.Trouble.BAD_TOKEN
    assert api.server_error(502, b"<html>").trouble is api.Trouble.ELSEWHERE


# -- one member -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.EtcdServer]:
    try:
        server = servers.start_etcd(tmp_path_factory.mktemp("etcd-single"))
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
    yield server
    server.stop()


@pytest.fixture
def unused_port() -> int:
    return servers.free_port()


@pytest.fixture
def store(single: servers.EtcdServer) -> Iterator[corral.Store]:
    with corral.connect(single.url) as opened:
        yield opened


def backend_of(store: corral.Store) -> EtcdBackend:
    backend = store.backend
    assert isinstance(backend, EtcdBackend)
    return backend


@pytest.fixture
def requests(store: corral.Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every request the store's backend sends, in order."""
    backend = backend_of(store)
    sent: list[str] = []
    original = backend._post

    def counting(path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        sent.append(path)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(backend, "_post", counting)
    return sent


def test_round_trips(store: corral.Store, requests: list[str], name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    assert requests == ["/v3/lease/grant", "/v3/kv/txn"]
    requests.clear()
    lock.extend()
    assert requests == ["/v3/lease/keepalive"]
    requests.clear()
    lock.release()
    assert requests == ["/v3/lease/revoke"]  # an uncontended cycle: 3 round trips
    requests.clear()
    assert store.lock_info(name) is None
    assert requests == ["/v3/kv/range"]


def test_fair_round_trips(
    store: corral.Store, single: servers.EtcdServer, requests: list[str], name: str
) -> None:
    lock = store.lock(name, ttl=10, fair=True)
    assert lock.acquire()
    assert requests == ["/v3/lease/grant", "/v3/kv/txn"]  # an idle lock: as for any lock
    requests.clear()
    with corral.connect(single.url) as other:
        assert not other.lock(name, ttl=10, fair=True).acquire(wait=0)
        waiter = backend_of(store).try_acquire(name, "newcomer", 10, queue_ttl=3)
    assert not waiter.acquired
    # The attempt, the queue lease, the transaction that queues, the holder's time left.
    assert requests == [
        "/v3/lease/grant",
        "/v3/kv/txn",
        "/v3/lease/grant",
        "/v3/kv/txn",
        "/v3/lease/timetolive",
    ]
    backend_of(store).leave_queue(name, "newcomer")
    lock.release()


def test_a_waiter_reuses_its_lease(
    store: corral.Store, single: servers.EtcdServer, requests: list[str], name: str
) -> None:
    with corral.connect(single.url) as other:
        holder = other.lock(name, ttl=30)
        assert holder.acquire()
        waiter = store.lock(name, ttl=30)
        job = threading.Thread(target=waiter.acquire, args=(20,))
        started = time.monotonic()
        job.start()
        time.sleep(2.5)  # two re-checks, a second apart
        holder.release()
        job.join(20)
        waited = time.monotonic() - started  # longer than planned when paused
        assert waiter.held
        waiter.release()
    # One lease for every attempt, kept alive when it finally won, and one for the place
    # the waiter takes in the queue once it has waited a while; no polling: a few
    # attempts (first, after the watch, on joining the queue, a re-check a second, the
    # wake-up), not hundreds.
    assert requests.count("/v3/lease/grant") == 2
    assert requests.count("/v3/lease/keepalive") <= 1 + waited, requests
    assert 3 <= requests.count("/v3/kv/txn") <= 5 + 2 * waited, requests


def test_tokens_are_revisions_increasing_across_names(store: corral.Store, name: str) -> None:
    tokens = []
    for lock_name in (name, name + "-b", name, name + "-c"):
        lock = store.lock(lock_name, ttl=10)
        assert lock.acquire()
        assert lock.token is not None
        tokens.append(lock.token)
        lock.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


def test_a_sub_second_lock_ends_at_its_ttl_while_its_holder_lives(
    store: corral.Store, single: servers.EtcdServer, requests: list[str], name: str
) -> None:
    # Below the server's minimum lease, and long enough to be read while still held.
    lock = store.lock(name, ttl=1.5)
    assert lock.acquire()
    state = backend_of(store)._process
    assert state is not None
    lease = state.held[(name, lock.owner or "")]
    assert lease.granted >= 2 and lease.deadline is not None  # the server's minimum lease
    info = store.lock_info(name)
    assert info is not None and info.ttl <= 1.5
    with corral.connect(single.url) as other:
        assert other.lock(name, ttl=10).acquire(wait=5)
    # The holder's process ended the lease itself at the TTL (the server would have
    # waited for its 2 s minimum).
    assert lease.dead and "/v3/lease/revoke" in requests
    with pytest.raises(corral.LockLost):
        lock.release()


def test_a_frozen_holder_keeps_a_sub_second_lock_for_the_server_lease(
    store: corral.Store, single: servers.EtcdServer, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A holder that cannot end its lease itself (frozen, crashed) keeps the lock until the
    # server's lease runs out: the TTL rounded up, at least the cluster's minimum (2 s).
    monkeypatch.setattr(backend_of(store), "_end_early", lambda lease, name: None)
    lock = store.lock(name, ttl=0.3)
    asked = time.monotonic()
    assert lock.acquire()
    taken = time.monotonic()
    with corral.connect(single.url) as other:
        contender = other.lock(name, ttl=10)
        time.sleep(0.6)
        # Past its TTL, within the server's lease (2 s from after `asked`): still held,
        # unless this test was paused that long.
        got = contender.acquire()
        assert not got or time.monotonic() - asked >= 2
        assert got or contender.acquire(wait=10)
        assert time.monotonic() - taken > 1.0
        contender.release()
    with pytest.raises(LockExpired):
        lock.release()


def test_extend_to_another_ttl_keeps_the_token(store: corral.Store, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    token = lock.token
    lock.extend(ttl=40)
    info = store.lock_info(name)
    assert info is not None and 30 < info.ttl <= 40 and info.token == token
    lock.extend(ttl=5)
    info = store.lock_info(name)
    assert info is not None and info.ttl <= 5 and info.token == token
    lock.release()


def test_force_release_tells_the_holder(
    store: corral.Store, single: servers.EtcdServer, name: str
) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    with corral.connect(single.url) as other:
        assert other.force_release(name)
        assert not other.force_release(name)
    backend = backend_of(store)
    assert backend.extend(name, lock.owner or "", 10) is Outcome.EXPIRED
    with pytest.raises(LockExpired):
        lock.release()


def test_the_watch_is_confirmed_before_the_waiter_returns(
    store: corral.Store, single: servers.EtcdServer, name: str
) -> None:
    with corral.connect(single.url) as other:
        holder = other.lock(name, ttl=30)
        assert holder.acquire()
        with backend_of(store).waiter(name) as waiter:
            holder.release()  # from another store: only the watch can tell this one
            assert waiter.wait(10)


def test_a_dead_fair_waiter_cannot_stall_the_queue(
    store: corral.Store, single: servers.EtcdServer, name: str
) -> None:
    holder = store.lock(name, ttl=30, fair=True)
    assert holder.acquire()
    with corral.connect(single.url) as other:
        # A waiter that queued once and then died: its place lapses with its short lease.
        dead = backend_of(other).try_acquire(name, "dead-owner", 30, queue_ttl=1)
        assert not dead.acquired
        patient = store.lock(name, ttl=30, fair=True)
        job = threading.Thread(target=patient.acquire, args=(20,))
        job.start()
        time.sleep(0.3)
        holder.release()
        job.join(20)
        assert patient.held
        patient.release()


def fair_waiter_killed_where(url: str, name: str, method: str, when: str, ready: int) -> None:
    """In a forked child: wait for a fair lock, and stop (to be SIGKILLed) at `method`."""
    with corral.connect(url) as store:
        backend = backend_of(store)
        original = getattr(backend, method)

        def stop_here(*args: Any, **kwargs: Any) -> Any:
            if when in args:
                os.write(ready, b"!")
                time.sleep(600)
            return original(*args, **kwargs)

        setattr(backend, method, stop_here)
        store.lock(name, ttl=600, fair=True).acquire(wait=60)


@pytest.mark.parametrize(
    ("method", "when"),
    [
        ("_grant", "queue for"),  # its first attempt failed; its queue lease is on its way
        ("_seconds_left", "acquire"),  # it has just queued
    ],
    ids=["before its place", "just queued"],
)
def test_a_fair_waiter_killed_at_any_moment_stalls_the_queue_only_for_its_place(
    store: corral.Store, single: servers.EtcdServer, name: str, method: str, when: str
) -> None:
    holder = store.lock(name, ttl=600, fair=True)
    assert holder.acquire()
    ready, signalled = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(ready)
            fair_waiter_killed_where(single.url, name, method, when, signalled)
        except BaseException:
            code = 4
        os._exit(code)
    os.close(signalled)
    try:
        readable, _, _ = select.select([ready], [], [], 30)
        assert readable and os.read(ready, 1) == b"!", "the child never got there"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready)
    holder.release()
    # The dead waiter may be ahead in the queue, on its own short lease: the next waiter
    # gets the lock once that lease runs out (a few seconds), not after the lock's 600 s.
    patient = store.lock(name, ttl=600, fair=True)
    assert patient.acquire(wait=30)
    patient.release()


def test_a_waiter_that_gives_up_has_its_lease_revoked(
    store: corral.Store, single: servers.EtcdServer, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock logic says nothing when an unfair wait ends: the lease the waiter kept for
    # its next attempt is revoked once no attempt came for IDLE_AFTER seconds.
    monkeypatch.setattr(sync_etcd, "IDLE_AFTER", 1.0)
    # The kept lease is caught as it is kept: looking it up afterwards would race the
    # reaper, which may already have revoked it if this process was paused for IDLE_AFTER.
    backend = backend_of(store)
    kept: list[tuple[str, int]] = []
    keep = backend._keep_for_next_attempt

    def spy(state: Any, key: tuple[str, str], lease: Any, lock_name: str) -> None:
        kept.append((lock_name, lease.id))
        keep(state, key, lease, lock_name)

    monkeypatch.setattr(backend, "_keep_for_next_attempt", spy)
    with corral.connect(single.url) as other:
        holder = other.lock(name, ttl=600)
        assert holder.acquire()
        # Shorter than the wait after which a waiter joins the queue: an unfair wait.
        assert not store.lock(name, ttl=600).acquire(wait=0.05)
        assert {lock_name for lock_name, _ in kept} == {name}
        # The lease was granted for the lock's 600 s: only the reaper ends it this soon.
        unused = kept[-1][1]
        for _ in range(100):
            if not lease_alive(store, unused):
                break
            time.sleep(0.1)
        assert not lease_alive(store, unused)
        assert holder.held
        holder.release()


def test_closing_revokes_the_leases_no_lock_uses(single: servers.EtcdServer, name: str) -> None:
    with corral.connect(single.url) as other:
        holder = other.lock(name, ttl=600)
        assert holder.acquire()
        with corral.connect(single.url) as store:
            assert not store.lock(name, ttl=600).acquire(wait=0.05)  # never queued
            # A fair waiter's place, as the lock logic holds it while it waits.
            assert not backend_of(store).try_acquire(name, "queued", 600, queue_ttl=30).acquired
            state = backend_of(store)._process
            assert state is not None
            unused = [lease.id for lease in state.pending.values()]
            places = [place.lease.id for place in state.places.values()]
            assert len(unused) == 2 and len(places) == 1
            assert all(lease_alive(other, lease_id) for lease_id in unused + places)
        assert not any(lease_alive(other, lease_id) for lease_id in unused + places)
        assert other.lock_info(name) is not None  # a lock held elsewhere stays held
        holder.release()


def test_forked_child_uses_its_own_connections(store: corral.Store, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    lock.release()  # the parent has connections (and maybe a worker) by now
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            child = store.lock(name + "-child", ttl=10)
            if not child.acquire(wait=5):
                code = 3
            child.release()
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert lock.acquire()  # the parent's connections were left alone
    lock.release()


# -- semaphores --------------------------------------------------------------------------


def count_under(store: corral.Store, prefix: bytes) -> int:
    body = {
        "key": api.b64(prefix),
        "range_end": api.b64(api.prefix_end(prefix)),
        "count_only": True,
    }
    answer = backend_of(store)._post("/v3/kv/range", body, time.monotonic() + 10, "", "count")
    return int(answer.get("count", 0))


def test_semaphore_round_trips(store: corral.Store, requests: list[str], name: str) -> None:
    slot = store.semaphore(name, 3, ttl=10)
    assert slot.acquire()  # an idle semaphore: its first slot, chosen unread, is free
    assert requests == ["/v3/lease/grant", "/v3/kv/txn"]
    requests.clear()
    slot.extend()
    assert requests == ["/v3/lease/keepalive"]
    requests.clear()
    slot.release()
    assert requests == ["/v3/lease/revoke"]
    requests.clear()
    assert store.semaphore_info(name) is None
    assert requests == ["/v3/kv/range"]


def test_a_semaphore_name_used_once_leaves_nothing_behind(
    single: servers.EtcdServer, name: str
) -> None:
    before = lease_ids_of(single)
    with corral.connect(single.url, prefix=f"foot-{name}") as store:
        backend = backend_of(store)
        for index in range(30):
            sem_name = f"{name}:{index}"
            # Slots that outlive a pause between their acquire and release.
            slots = [store.semaphore(sem_name, 2, ttl=2) for _ in range(2)]
            for slot in slots:
                assert slot.acquire()
            if index % 3 == 0:
                slots[0].release(hold_for=0.5)
            elif index % 3 == 1:
                slots[0].release()
            # index % 3 == 2: left to expire, as a crashed holder's would
            slots[1].release()
        # A fair waiter's place, and one it gave up.
        held = store.semaphore(f"{name}:fair", 1, ttl=2, fair=True)
        assert held.acquire()
        assert not backend.sem_try_acquire(f"{name}:fair", "queued", 1, 1, queue_ttl=1).acquired
        backend.sem_leave_queue(f"{name}:fair", "queued")
        assert not store.semaphore(f"{name}:fair", 1, ttl=1, fair=True).acquire(wait=0.3)
        held.release()
        # The 2 s slots' leases run out on the server, a little after their TTL.
        for _ in range(100):
            if count_under(store, api.encode(f"foot-{name}/")) == 0:
                break
            time.sleep(0.1)
        assert count_under(store, api.encode(f"foot-{name}/")) == 0
    for _ in range(50):
        if not lease_ids_of(single) - before:
            break
        time.sleep(0.1)
    assert lease_ids_of(single) - before == set()


def lease_ids_of(single: servers.EtcdServer) -> set[int]:
    with corral.connect(single.url) as store:
        return lease_ids(store)


def test_a_semaphore_waiter_is_woken_by_the_watch(
    store: corral.Store, single: servers.EtcdServer, name: str
) -> None:
    with corral.connect(single.url) as other:
        slot = other.semaphore(name, 1, ttl=30)
        assert slot.acquire()
        lock = other.lock(name, ttl=30)
        assert lock.acquire()
        backend = backend_of(store)
        with backend.sem_waiter(name) as waiter, backend.waiter(name) as lock_waiter:
            # Another store's release: only the watch can tell this one.
            slot.release()
            assert waiter.wait(10)  # a waiter's wait ends early only when woken: the watch
            # The lock of the same name is another thing: its waiters hear nothing.
            assert not lock_waiter.wait(0.3)
            lock.release()
            assert lock_waiter.wait(10)
            assert not waiter.wait(0.3)


def test_a_queued_place_holds_back_only_the_slots_it_could_take(
    store: corral.Store, single: servers.EtcdServer, name: str
) -> None:
    holders = [store.semaphore(name, 2, ttl=30) for _ in range(2)]
    for holder in holders:
        assert holder.acquire()
    with corral.connect(single.url) as other:
        # A waiter that queued and then stopped attempting (its place lives 30 s).
        assert not backend_of(other).sem_try_acquire(name, "asleep", 30, 2, queue_ttl=30).acquired
        holders[0].release()
        newcomer = store.semaphore(name, 2, ttl=30)
        assert not newcomer.acquire()  # the one free slot is the queued waiter's
        holders[1].release()
        assert newcomer.acquire()  # two free, one queued: a newcomer may pass
        assert not store.semaphore(name, 2, ttl=30).acquire()
        turn = backend_of(other).sem_try_acquire(name, "asleep", 30, 2, queue_ttl=30)
        assert turn.acquired and turn.token is not None and newcomer.token is not None
        assert backend_of(other).sem_release(name, "asleep") is Outcome.OK
        newcomer.release()


def test_concurrent_attempts_never_exceed_the_limit(single: servers.EtcdServer, name: str) -> None:
    limit = 3
    inside: set[str] = set()
    most = [0]
    mutex = threading.Lock()
    tokens: list[int] = []
    errors: list[BaseException] = []

    def worker(store: corral.Store, index: int) -> None:
        backend = backend_of(store)
        try:
            for round_ in range(6):
                owner = f"w{index}-{round_}"
                attempt = backend.sem_try_acquire(name, owner, 30, limit)
                if not attempt.acquired:
                    continue
                with mutex:
                    inside.add(owner)
                    most[0] = max(most[0], len(inside))
                    assert attempt.token is not None
                    tokens.append(attempt.token)
                info = backend.sem_inspect(name)
                assert info is not None and len(info.holders) <= limit
                time.sleep(0.01)
                with mutex:
                    inside.discard(owner)
                assert backend.sem_release(name, owner) is Outcome.OK
        except BaseException as exc:
            errors.append(exc)

    with corral.connect(single.url) as first, corral.connect(single.url) as second:
        jobs = [
            threading.Thread(target=worker, args=(first if i % 2 else second, i)) for i in range(12)
        ]
        for job in jobs:
            job.start()
        for job in jobs:
            job.join(60)
        assert not errors, errors
        assert 1 <= most[0] <= limit
        assert len(tokens) == len(set(tokens)) and len(tokens) >= limit
        assert first.semaphore_info(name) is None


# -- a three-member cluster ------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[servers.EtcdCluster]:
    try:
        started = servers.start_etcd_cluster(tmp_path)
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
    yield started
    for member in started.members:
        # One at a time: stopped together, each member waits 7 s to hand over leadership.
        if member.is_running:
            member.resume()
        member.stop()


def stop_current(backend: Any, cluster: servers.EtcdCluster) -> int:
    index: int = backend.endpoints.order()[0]
    cluster.members[index].stop()
    return index


def test_the_lock_keeps_working_when_its_member_stops(
    cluster: servers.EtcdCluster, name: str
) -> None:
    with corral.connect(cluster.url) as store, corral.connect(cluster.url) as other:
        holder = store.lock(name, ttl=30)
        assert holder.acquire()
        token = holder.token
        assert token is not None
        waiter = other.lock(name, ttl=30)
        outcome: list[bool] = []
        job = threading.Thread(target=lambda: outcome.append(waiter.acquire(wait=30)))
        job.start()
        time.sleep(0.5)  # the waiter watches through the member both clients talk to
        stopped = stop_current(store.backend, cluster)
        assert backend_of(store).endpoints.order()[0] == stopped  # nobody noticed yet
        holder.release()  # through another member; the waiter's watch moves there too
        job.join(30)
        assert outcome == [True] and waiter.token is not None and waiter.token > token
        waiter.extend()
        info = store.lock_info(name)
        assert info is not None and info.owner == waiter.owner
        waiter.release()
        assert store.backend.endpoints.order()[0] != stopped
        again = store.lock(name, ttl=30)
        assert again.acquire()
        again.release()


def test_the_lock_keeps_working_when_its_member_stops_async(
    cluster: servers.EtcdCluster, name: str
) -> None:
    async def scenario() -> None:
        async with corral.aio.connect(cluster.url) as store:
            holder = store.lock(name, ttl=30)
            assert await holder.acquire()
            waiter = store.lock(name, ttl=30)
            task = asyncio.create_task(waiter.acquire(wait=30))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(stop_current, store.backend, cluster)
            await holder.release()
            assert await asyncio.wait_for(task, 30)
            await waiter.release()
            assert await store.lock(name, ttl=30).acquire(wait=5)

    asyncio.run(scenario())


def test_a_member_paused_mid_wait_is_replaced(cluster: servers.EtcdCluster, name: str) -> None:
    # A frozen member answers nothing and its watch streams go silent: calls move on
    # after their share of the timeout, and the waiter watches through another member.
    with corral.connect(cluster.url) as store:
        holder = store.lock(name, ttl=30)
        assert holder.acquire()
        waiter = store.lock(name, ttl=30)
        outcome: list[bool] = []
        job = threading.Thread(target=lambda: outcome.append(waiter.acquire(wait=30)))
        job.start()
        time.sleep(0.5)
        index = backend_of(store).endpoints.order()[0]
        cluster.members[index].pause()
        holder.release()
        job.join(30)
        assert outcome == [True]
        waiter.release()


def test_losing_the_majority_refuses_rather_than_grants(
    cluster: servers.EtcdCluster, name: str
) -> None:
    with corral.connect(cluster.url, timeout=1.5) as store:
        lock = store.lock(name, ttl=30)
        assert lock.acquire()
        lock.release()
        for member in cluster.members[1:]:
            member.pause()
        time.sleep(3)  # the remaining member notices it has no leader
        began = time.monotonic()
        with pytest.raises(BackendUnavailable, match="majority"):
            lock.acquire()
        assert time.monotonic() - began < 4.5  # room for a pause, short of the 5 s default timeout
        for member in cluster.members[1:]:
            member.resume()
        # Until the members have elected a leader again. An attempt that failed meanwhile
        # may still be applied (a proposal that commits once the majority is back): its
        # lease is revoked as soon as the cluster answers, so it holds the lock that long,
        # not for its TTL.
        for _ in range(40):
            try:
                assert lock.acquire(wait=5)
                break
            except BackendUnavailable:
                time.sleep(0.5)
        lock.release()


# -- authentication and TLS ------------------------------------------------------------


def post(url: str, path: str, body: dict[str, Any], token: str | None = None) -> Any:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": token} if token else {},
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        return json.loads(response.read())


def test_users_and_token_renewal(tmp_path: Path, name: str) -> None:
    server = servers.start_etcd(tmp_path)
    try:
        base = server.client_url
        post(base, "/v3/auth/user/add", {"name": "root", "password": "pw"})
        post(base, "/v3/auth/role/add", {"name": "root"})
        post(base, "/v3/auth/user/grant", {"user": "root", "role": "root"})
        post(base, "/v3/auth/enable", {})
        host = f"{server.host}:{server.port}"
        with corral.connect(f"etcd://root:pw@{host}") as store:
            lock = store.lock(name, ttl=10)
            assert lock.acquire()
            # Simple tokens expire after idle minutes: a stale one is renewed once.
            state = backend_of(store)._process
            assert state is not None and state.token
            state.token = "stale"
            lock.extend()
            lock.release()
        with corral.connect(f"etcd://root:wrong@{host}") as store:
            with pytest.raises(BackendError, match="user and password") as refused:
                store.lock(name).acquire()
            assert "wrong" not in str(refused.value)
        with corral.connect(f"etcd://{host}") as store, pytest.raises(BackendError, match="user"):
            store.lock(name).acquire()
    finally:
        server.stop()


class TLSEtcd(servers.EtcdServer):
    """One member serving clients over TLS, requiring a client certificate."""

    def __init__(self, workdir: Path, files: tuple[Path, Path, Path]) -> None:
        port, peer_port = servers.free_port(), servers.free_port()
        super().__init__(workdir, port, peer_port=peer_port)
        self.ca_file, self.cert_file, self.key_file = files

    @property
    def url(self) -> str:
        return f"etcds://{self.host}:{self.port}"

    @property
    def client_url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def _command(self) -> list[str]:
        return [
            *super()._command(),
            "--cert-file", str(self.cert_file),
            "--key-file", str(self.key_file),
            "--trusted-ca-file", str(self.ca_file),
            "--client-cert-auth",
        ]  # fmt: skip

    def _probe(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1, context=context):
                return True
        except OSError:
            return False


def test_tls_with_a_client_certificate(tmp_path: Path, name: str) -> None:
    try:
        ca_file, _, cert_file, key_file = servers._make_tls_files(tmp_path)
    except servers.ServerError as exc:
        pytest.skip(f"cannot make certificates: {exc}")
    server = TLSEtcd(tmp_path / "etcd", (ca_file, cert_file, key_file))
    (tmp_path / "etcd").mkdir()
    server.start()
    try:
        files = {"ca_file": str(ca_file), "cert_file": str(cert_file), "key_file": str(key_file)}
        with corral.connect(server.url, **files) as store:
            lock = store.lock(name, ttl=10)
            assert lock.acquire()
            info = store.lock_info(name)
            assert info is not None and info.owner == lock.owner
            lock.release()
        without_certificate = corral.connect(server.url, ca_file=str(ca_file), timeout=2)
        with without_certificate as store, pytest.raises(BackendUnavailable):
            store.lock(name).acquire()
    finally:
        server.stop()


# -- answers lost after the cluster applied the request ------------------------------


class DropPlan:
    """Which answers the proxies lose: the next `times` requests to `path` (whose body
    contains `marker`), whichever member they go to."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._path = ""
        self._marker = b""
        self._left = 0
        self.lost: list[str] = []

    def arm(self, path: str, *, marker: bytes = b"", times: int = 1) -> None:
        with self._mutex:
            self._path, self._marker, self._left = path, marker, times

    def disarm(self) -> None:
        with self._mutex:
            self._left = 0

    def take(self, path: str, body: bytes) -> bool:
        with self._mutex:
            if self._left and path == self._path and self._marker in body:
                self._left -= 1
                self.lost.append(path)
                return True
        return False


class LossyProxy:
    """A TCP proxy in front of one etcd member that can lose answers for real.

    Each request goes to the member on a connection of its own (sent with
    `Connection: close`, so the member's answer ends where the connection does),
    and the member applies it; when the plan says so, the proxy then either
    closes the client's connection without a word (`mode="close"`) or keeps it
    silent until the client gives up (`mode="hold"`). Watch streams pass through.
    """

    def __init__(self, host: str, port: int, plan: DropPlan, mode: str) -> None:
        self.upstream = (host, port)
        self.plan = plan
        self.mode = mode
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self._open.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @staticmethod
    def _read_request(client: socket.socket) -> tuple[bytes, bytes] | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = client.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            field, _, value = line.partition(b":")
            if field.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = client.recv(65536)
            if not chunk:
                return None
            body += chunk
        return head, body

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            request = self._read_request(client)
            if request is None:
                return
            head, body = request
            path = head.split(b" ", 2)[1].decode()
            upstream = socket.create_connection(self.upstream)
            self._open.add(upstream)
            if path == "/v3/watch":
                upstream.sendall(head + b"\r\n\r\n" + body)
                self._splice(client, upstream)
                return
            lines = [
                line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")
            ]
            upstream.sendall(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body)
            answer = b""
            while chunk := upstream.recv(65536):
                answer += chunk
            if self.plan.take(path, body):
                if self.mode == "hold":
                    client.recv(1)  # until the client gives up and closes
                return  # the member applied it; the client never hears so
            client.sendall(answer)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    self._open.discard(sock)
                    sock.close()

    def _splice(self, client: socket.socket, upstream: socket.socket) -> None:
        def pump(source: socket.socket, sink: socket.socket) -> None:
            try:
                while chunk := source.recv(65536):
                    sink.sendall(chunk)
            except OSError:
                pass
            finally:
                for sock in (source, sink):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)

    def close(self) -> None:
        self._closing = True
        self.server.close()
        for sock in list(self._open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.EtcdCluster]:
    try:
        started = servers.start_etcd_cluster(tmp_path_factory.mktemp("etcd-three"))
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
    yield started
    started.stop()


class Lossy:
    """A store whose every request goes through lossy proxies, and a direct one to check."""

    def __init__(self, store: corral.Store, direct: corral.Store, plan: DropPlan) -> None:
        self.store = store
        self.direct = direct
        self.plan = plan


TOPOLOGIES = [
    "one member, connection closed",
    "three members, connection closed",
    "three members, answer held",
]


@pytest.fixture(params=TOPOLOGIES)
def lossy(request: pytest.FixtureRequest, single: servers.EtcdServer) -> Iterator[Lossy]:
    topology: str = request.param
    if topology.startswith("one"):
        members: list[servers.EtcdServer] = [single]
    else:
        members = request.getfixturevalue("three").members
    plan = DropPlan()
    mode = "hold" if "held" in topology else "close"
    proxies = [LossyProxy(m.host, m.port, plan, mode) for m in members]
    url = "etcd://" + ",".join(f"127.0.0.1:{p.port}" for p in proxies)
    direct_url = "etcd://" + ",".join(f"{m.host}:{m.port}" for m in members)
    # Three members share the 3 s: a try that hears nothing gives up after 1 s.
    try:
        with corral.connect(url, timeout=3) as store, corral.connect(direct_url) as direct:
            yield Lossy(store, direct, plan)
    finally:
        for proxy in proxies:
            proxy.close()


def lease_alive(store: corral.Store, lease_id: int) -> bool:
    answer = backend_of(store)._post(
        "/v3/lease/timetolive", {"ID": str(lease_id)}, time.monotonic() + 10, "", "check"
    )
    return int(answer.get("TTL", -1)) > 0


def test_an_acquisition_whose_answer_is_lost_is_recognised(lossy: Lossy, name: str) -> None:
    lock = lossy.store.lock(name, ttl=60)
    lossy.plan.arm("/v3/kv/txn")
    assert lock.acquire()  # the retry finds the holder: this owner, this lease
    assert lossy.plan.lost == ["/v3/kv/txn"]
    info = lossy.direct.lock_info(name)
    assert info is not None and info.owner == lock.owner and info.token == lock.token
    lock.release()
    assert lossy.direct.lock_info(name) is None


def lease_ids(store: corral.Store) -> set[int]:
    answer = backend_of(store)._post("/v3/lease/leases", {}, time.monotonic() + 10, "", "list")
    return {int(lease["ID"]) for lease in answer.get("leases") or []}


def test_a_grant_whose_answer_is_lost_leaves_no_second_lease(lossy: Lossy, name: str) -> None:
    before = lease_ids(lossy.direct)
    lock = lossy.store.lock(name, ttl=600)
    lossy.plan.arm("/v3/lease/grant")
    assert lock.acquire()  # the retried grant is told its lease exists: it is this one
    assert lossy.plan.lost == ["/v3/lease/grant"]
    lock.release()
    assert lossy.direct.lock_info(name) is None
    # Not a lease of 600 s that nobody will ever use or revoke. (A member lists leases
    # from its own state: give it a moment to apply the last revoke.)
    for _ in range(50):
        if not lease_ids(lossy.direct) - before:
            break
        time.sleep(0.1)
    assert lease_ids(lossy.direct) - before == set()


def test_a_release_whose_answer_is_lost_succeeds(lossy: Lossy, name: str) -> None:
    lock = lossy.store.lock(name, ttl=60)
    assert lock.acquire()
    lossy.plan.arm("/v3/lease/revoke")
    lock.release()  # the retried revoke finds the lease gone, though it cannot have run out
    assert lossy.plan.lost == ["/v3/lease/revoke"]
    assert lossy.direct.lock_info(name) is None


def test_a_hold_whose_answer_is_lost_keeps_the_lock_closed(lossy: Lossy, name: str) -> None:
    lock = lossy.store.lock(name, ttl=60)
    assert lock.acquire()
    token = lock.token
    lossy.plan.arm("/v3/kv/txn", marker=b'"LEASE"')
    lock.release(hold_for=60)  # the retried move finds the key on the hold lease already
    assert lossy.plan.lost == ["/v3/kv/txn"]
    info = lossy.direct.lock_info(name)
    assert info is not None and info.owner is None and info.token == token and info.ttl > 30
    assert not lossy.direct.lock(name, ttl=10).acquire()
    assert lossy.direct.force_release(name)


def test_an_extend_whose_answer_is_lost_keeps_the_lock(lossy: Lossy, name: str) -> None:
    lock = lossy.store.lock(name, ttl=10)
    assert lock.acquire()
    lossy.plan.arm("/v3/kv/txn", marker=b'"LEASE"')
    lock.extend(ttl=60)  # the retried move finds the key on the new lease already
    assert lossy.plan.lost == ["/v3/kv/txn"]
    info = lossy.direct.lock_info(name)
    assert info is not None and info.owner == lock.owner and info.token == lock.token
    assert info.ttl > 30
    lock.extend()  # the record follows the new lease: a keep-alive of it
    lock.release()
    assert lossy.direct.lock_info(name) is None


def test_a_force_release_whose_answer_is_lost_reports_it(lossy: Lossy, name: str) -> None:
    lock = lossy.direct.lock(name, ttl=60)
    assert lock.acquire()
    lossy.plan.arm("/v3/lease/revoke")
    assert lossy.store.force_release(name)
    assert lossy.plan.lost == ["/v3/lease/revoke"]
    with pytest.raises(LockExpired):
        lock.release()


def test_an_acquisition_given_up_on_is_taken_back(lossy: Lossy, name: str) -> None:
    """Every answer to the attempt is lost, so the call fails, but its first try was
    applied: a lock with an owner nobody will ever use. It is revoked as soon as the
    cluster answers, not left held for its TTL."""
    lock = lossy.store.lock(name, ttl=600)
    lossy.plan.arm("/v3/kv/txn", times=1000)
    with pytest.raises(BackendUnavailable):
        lock.acquire()
    lossy.plan.disarm()
    assert lossy.plan.lost and not lock.held
    contender = lossy.direct.lock(name, ttl=10)
    assert contender.acquire(wait=30)
    contender.release()


def test_a_slot_acquisition_whose_answer_is_lost_is_recognised(lossy: Lossy, name: str) -> None:
    slot = lossy.store.semaphore(name, 1, ttl=60)
    lossy.plan.arm("/v3/kv/txn")
    assert slot.acquire()  # the retry finds this owner's slot on this lease: its own
    assert lossy.plan.lost == ["/v3/kv/txn"]
    info = lossy.direct.semaphore_info(name)
    assert info is not None and len(info.holders) == 1
    assert info.holders[0].owner == slot.owner and info.holders[0].token == slot.token
    assert not lossy.direct.semaphore(name, 1, ttl=10).acquire()  # counted once
    slot.release()
    assert lossy.direct.semaphore_info(name) is None


def test_a_queued_turn_whose_answer_is_lost_is_recognised(lossy: Lossy, name: str) -> None:
    holder = lossy.direct.semaphore(name, 1, ttl=60, fair=True)
    assert holder.acquire()
    backend = backend_of(lossy.store)
    assert not backend.sem_try_acquire(name, "queued", 60, 1, queue_ttl=5).acquired
    holder.release()
    # Only the turn's transaction deletes the waiter's place.
    lossy.plan.arm("/v3/kv/txn", marker=b"request_delete_range")
    attempt = backend.sem_try_acquire(name, "queued", 60, 1, queue_ttl=5)
    assert attempt.acquired and lossy.plan.lost == ["/v3/kv/txn"]
    info = lossy.direct.semaphore_info(name)
    assert info is not None and [h.owner for h in info.holders] == ["queued"]
    assert info.holders[0].token == attempt.token
    keys = api.semaphore_keys(backend.prefix, name)
    assert count_under(lossy.direct, keys.queue) == 0  # the place went with the turn
    assert backend.sem_release(name, "queued") is Outcome.OK
    assert lossy.direct.semaphore_info(name) is None


def test_a_slot_hold_whose_answer_is_lost_keeps_the_slot_closed(lossy: Lossy, name: str) -> None:
    slot = lossy.store.semaphore(name, 1, ttl=60)
    assert slot.acquire()
    token = slot.token
    lossy.plan.arm("/v3/kv/txn", marker=b'"LEASE"')
    slot.release(hold_for=60)  # the retried move finds the slot on the hold lease already
    assert lossy.plan.lost == ["/v3/kv/txn"]
    info = lossy.direct.semaphore_info(name)
    assert info is not None and len(info.holders) == 1
    assert info.holders[0].owner is None and info.holders[0].token == token
    assert not lossy.direct.semaphore(name, 1, ttl=10).acquire()
    assert lossy.direct.force_release_semaphore(name) == 1


def test_a_slot_acquisition_given_up_on_is_taken_back(lossy: Lossy, name: str) -> None:
    slot = lossy.store.semaphore(name, 1, ttl=600)
    lossy.plan.arm("/v3/kv/txn", times=1000)
    with pytest.raises(BackendUnavailable):
        slot.acquire()
    lossy.plan.disarm()
    assert lossy.plan.lost and not slot.held
    contender = lossy.direct.semaphore(name, 1, ttl=10)
    assert contender.acquire(wait=30)
    contender.release()


def test_an_acquisition_given_up_on_is_taken_back_async(
    single: servers.EtcdServer, name: str
) -> None:
    plan = DropPlan()
    proxy = LossyProxy(single.host, single.port, plan, "close")

    async def scenario() -> None:
        url = f"etcd://127.0.0.1:{proxy.port}"
        async with corral.aio.connect(url, timeout=2) as store:
            plan.arm("/v3/kv/txn", times=1000)
            with pytest.raises(BackendUnavailable):
                await store.lock(name, ttl=600).acquire()
            plan.disarm()
            # The reaper task revokes the orphaned attempt's lease in the background.
            async with corral.aio.connect(single.url) as direct:
                contender = direct.lock(name, ttl=10)
                assert await contender.acquire(wait=30)
                await contender.release()

    try:
        asyncio.run(scenario())
    finally:
        proxy.close()


# -- cache entries ------------------------------------------------------------------------


def cache_entry(key: str, value: object, *, fresh_for: float, generation: int = 0) -> bytes:
    return encode(
        value, JSON, key, fresh_until=time.time() + fresh_for, delta=0.05, generation=generation
    )


def cache_claim(name: str, owner: str = "reader", due_before: float | None = None) -> Claim:
    when = time.time() if due_before is None else due_before
    return Claim(lock=f"recompute-{name}", owner=f"{owner}-{name}", ttl=10.0, due_before=when)


def test_the_due_stamp_decides_as_claim_due_does() -> None:
    """What the server compares (a stamp strictly between two bounds) is `claim_due`, negated,
    whatever the header, the generation and `due_before`."""
    rng = random.Random(7)
    now = 1_700_000_000.0
    times = [0.0, 1e-6, now, now + 1e-6, now - 1e-6, now + 0.5, 9_999_999_999.999999]
    for _ in range(3000):
        fresh, retry = rng.choice(times), rng.choice([0.0, *times])
        written = rng.choice([0, 1, 2, 41, 10**16 - 1])
        current = rng.choice([0, 1, 2, 41, 10**16 - 1, 10**16])
        due_before = rng.choice([*times, now + rng.uniform(-1, 1), -1.0, math.nan, 1e11])
        data = encode(
            1, JSON, "k", fresh_until=fresh, retry_until=retry, delta=0.0, generation=written
        )
        if rng.random() < 0.1:
            data = rng.choice([b"foreign", data[:40], b"c2" + data[2:]])
        stamp = api.due_stamp(data)
        low, high = api.due_bounds(current, due_before)
        not_due = stamp is not None and low < stamp < high
        assert not_due == (not claim_due(data, current, due_before)), (data, current, due_before)


def test_cache_keys_have_their_own_space_one_to_one() -> None:
    keys = ["a", "a/b", "%2F", "nul\x00", "lone \ud800", "\ud83d\ude00", "😀", "x" * 10_000]
    entries = [api.cache_keys("corral", key).entry for key in keys]
    assert len(set(entries)) == len(keys)  # surrogates included, long keys uncut
    assert api.cache_keys("corral", "x" * 10_000).entry.endswith(b"x" * 10_000)
    for key in keys:
        mapped = api.cache_keys("app", key)
        assert mapped.entry.startswith(b"app/cache/e/") and mapped.due.startswith(b"app/cache/d/")
        assert api.generation_key("app", key).startswith(b"app/cache/g/")
        for other in (api.lock_keys("app", key).scope, api.semaphore_keys("app", key).scope):
            assert not other.startswith(b"app/cache/")
    # A key's prefix range holds exactly the keys that start with it.
    request = api.cache_count_request("app", "ns:")
    assert api.unb64(request["key"]) == b"app/cache/e/ns:"
    assert api.unb64(request["range_end"]) == b"app/cache/e/ns;"


def test_batches_fit_etcd_limits() -> None:
    assert api.batches([], 1, reserved=1) == [range(0, 0)]
    runs = api.batches([10] * 300, 1, reserved=1)
    assert [len(run) for run in runs] == [127, 128, 45]
    assert [len(run) for run in api.batches([10] * 100, 2)] == [64, 36]
    big = api.TXN_BYTES // 2 + 1
    assert [len(run) for run in api.batches([big, big, 5, big * 3], 2)] == [1, 2, 1]


@pytest.fixture
def cache_store(single: servers.EtcdServer, name: str) -> Iterator[corral.Store]:
    """A store of its own prefix, so that what a test leaves on the server can be counted."""
    with corral.connect(single.url, prefix=f"cache-{name}") as opened:
        yield opened


def test_cache_round_trips(
    store: corral.Store, single: servers.EtcdServer, requests: list[str], name: str
) -> None:
    backend = backend_of(store)
    key, gen_key = f"ns:{name}", f"gen-{name}"
    backend.cache_store([(key, cache_entry(key, 1, fresh_for=30), 60.0)])
    assert requests == ["/v3/lease/grant", "/v3/kv/txn"]  # no shared lease yet
    requests.clear()
    backend.cache_store([(f"{key}:{i}", cache_entry(key, i, fresh_for=30), 61.0) for i in range(5)])
    assert requests == ["/v3/kv/txn"]  # the lease of the first, shared
    requests.clear()
    assert backend.cache_fetch([key, *(f"{key}:{i}" for i in range(5))], gen_key)[1] == 0
    assert requests == ["/v3/kv/txn"]
    requests.clear()
    fresh = backend.cache_read(key, gen_key, cache_claim(name))
    assert fresh.entry is not None and fresh.attempt is None
    assert requests == ["/v3/kv/txn"]  # a fresh entry: one transaction, no lease
    requests.clear()
    # A missing entry: read, then (without a spare lease) a lease and the claimed read.
    won = backend.cache_read(f"{key}-missing", gen_key, cache_claim(name))
    assert won.attempt is not None and won.attempt.acquired
    assert requests == ["/v3/kv/txn", "/v3/lease/grant", "/v3/kv/txn"]
    requests.clear()
    # Another reader's claim is refused; its lease stays for its next claimed read.
    refused = backend.cache_read(f"{key}-missing", gen_key, cache_claim(name, "other"))
    assert refused.attempt is not None and not refused.attempt.acquired
    assert requests == ["/v3/kv/txn", "/v3/lease/grant", "/v3/kv/txn"]
    requests.clear()
    backend.release(f"recompute-{name}", f"reader-{name}")
    requests.clear()
    again = backend.cache_read(f"{key}-missing", gen_key, cache_claim(name, "other"))
    assert again.attempt is not None and again.attempt.acquired
    # One transaction reads, compares and takes the lock; the kept lease is restarted.
    assert requests == ["/v3/kv/txn", "/v3/lease/keepalive"]
    backend.release(f"recompute-{name}", f"other-{name}")
    requests.clear()
    assert backend.cache_clear(gen_key) == 1
    assert requests == ["/v3/kv/txn"]
    requests.clear()
    stale = backend.cache_read(key, gen_key, cache_claim(name))  # written under generation 0
    assert stale.generation == 1 and stale.attempt is not None and stale.attempt.acquired
    assert requests == ["/v3/kv/txn", "/v3/lease/grant", "/v3/kv/txn"]
    backend.release(f"recompute-{name}", f"reader-{name}")
    requests.clear()
    assert backend.cache_invalidate(key, 30.0)
    assert requests == ["/v3/kv/range", "/v3/lease/grant", "/v3/kv/txn"]  # a 30 s lease
    requests.clear()
    assert backend.cache_invalidate(f"{key}:0", 30.0)
    assert requests == ["/v3/kv/range", "/v3/kv/txn"]  # shared
    requests.clear()
    assert backend.cache_delete(key)
    assert requests == ["/v3/kv/txn"]
    requests.clear()
    assert backend.cache_count(f"{key}:") == 5
    assert requests == ["/v3/kv/range"]


def test_a_clear_by_another_client_is_seen_by_the_next_claimed_read(
    store: corral.Store, single: servers.EtcdServer, requests: list[str], name: str
) -> None:
    backend = backend_of(store)
    key, gen_key = f"ns:{name}", f"gen-{name}"
    backend.cache_store([(key, cache_entry(key, 1, fresh_for=30), 60.0)])
    assert backend.cache_read(key, gen_key, cache_claim(name)).attempt is None
    with corral.connect(single.url) as other:
        assert backend_of(other).cache_clear(gen_key) == 1
    requests.clear()
    read = backend.cache_read(key, gen_key, cache_claim(name))
    assert read.generation == 1 and read.attempt is not None and read.attempt.acquired
    # The generation it knew had moved: read again knowing it, then claim on a lease.
    assert requests == ["/v3/kv/txn", "/v3/kv/txn", "/v3/lease/grant", "/v3/kv/txn"]
    backend.release(f"recompute-{name}", f"reader-{name}")
    stored = cache_entry(key, 2, fresh_for=30, generation=1)
    backend.cache_store([(key, stored, 60.0)])
    requests.clear()
    assert backend.cache_read(key, gen_key, cache_claim(name)) == CacheRead(stored, 1)
    assert requests == ["/v3/kv/txn"]


def test_many_keys_take_several_transactions(store: corral.Store, requests: list[str]) -> None:
    backend = backend_of(store)
    keys = [f"many:{uuid.uuid4().hex}" for _ in range(300)]
    items = [(key, cache_entry(key, i, fresh_for=30), 60.0) for i, key in enumerate(keys)]
    backend.cache_store(items)
    assert requests.count("/v3/kv/txn") == 5  # 2 operations a key, 128 a transaction
    requests.clear()
    found, generation = backend.cache_fetch(keys, "many")
    assert found == [data for _, data, _ in items] and generation == 0
    assert requests == ["/v3/kv/txn"] * 3
    # The last write of a key wins, as written one after the other.
    first, second = cache_entry(keys[0], "a", fresh_for=30), cache_entry(keys[0], "b", fresh_for=30)
    backend.cache_store([(keys[0], first, 60.0), (keys[1], first, 0.0), (keys[0], second, 60.0)])
    assert backend.cache_fetch(keys[:2], "many")[0] == [second, None]


def test_cache_keys_live_under_the_prefix_apart_from_locks(
    cache_store: corral.Store, name: str
) -> None:
    backend = backend_of(cache_store)
    prefix = f"cache-{name}"
    lock = cache_store.lock("ns:same", ttl=30)
    assert lock.acquire()
    odd = ["ns:same", "ns:a/b", "ns:nul\x00", "ns:lone \ud800", "ns:" + "é" * 10_000]
    items = [(key, cache_entry(key, key, fresh_for=30), 60.0) for key in odd]
    backend.cache_store([*items, ("ns:foreign", b"not an envelope", 60.0)])
    assert backend.cache_clear("ns") == 1
    assert backend.cache_fetch(odd, "ns") == ([data for _, data, _ in items], 1)
    assert count_under(cache_store, api.encode(f"{prefix}/cache/e/")) == len(odd) + 1
    # A due stamp beside each envelope; none for bytes that are not one.
    assert count_under(cache_store, api.encode(f"{prefix}/cache/d/")) == len(odd)
    assert count_under(cache_store, api.encode(f"{prefix}/cache/g/")) == 1
    assert backend.cache_count("ns:") == len(odd) + 1
    assert backend.cache_count("ns:a/") == 1 and backend.cache_count("other") == 0
    long_key = odd[-1]
    read = backend.cache_read(long_key, "ns", cache_claim(name))
    assert read.entry == items[-1][1] and read.attempt is not None and read.attempt.acquired
    backend.release(f"recompute-{name}", f"reader-{name}")
    assert backend.cache_invalidate(long_key, 30.0)
    assert backend.cache_delete(long_key) and not backend.cache_delete(long_key)
    assert backend.cache_delete("ns:same")
    assert count_under(cache_store, api.encode(f"{prefix}/cache/d/")) == len(odd) - 2
    info = cache_store.lock_info("ns:same")  # the lock of the same name is untouched
    assert info is not None and info.owner == lock.owner
    lock.release()


def lease_of(store: corral.Store, key: bytes) -> tuple[int, int]:
    """The lease a key is on, and that lease's granted TTL."""
    found = backend_of(store)._post(
        "/v3/kv/range", api.range_request(key), time.monotonic() + 10, "", "check"
    )
    lease = int(found["kvs"][0]["lease"])
    answer = backend_of(store)._post(
        "/v3/lease/timetolive", {"ID": str(lease)}, time.monotonic() + 10, "", "check"
    )
    return lease, int(answer["grantedTTL"])


@pytest.mark.parametrize(
    ("keep", "granted"), [(0.2, (2,)), (1.0, (2,)), (2.3, (3,)), (60.0, (62,)), (600.0, (619,))]
)
def test_an_entry_lease_is_keep_rounded_up_and_a_little_more(
    cache_store: corral.Store, name: str, keep: float, granted: tuple[int, ...]
) -> None:
    """At least `keep` (and the cluster's minimum), at most a 16th more (and half a second),
    rounded up: the lease is shared by the entries stored meanwhile with about that keep."""
    backend = backend_of(cache_store)
    key = f"ns:{name}"
    backend.cache_store([(key, cache_entry(key, 1, fresh_for=keep), keep)])
    lease, ttl = lease_of(cache_store, api.cache_keys(f"cache-{name}", key).entry)
    assert ttl in granted
    backend.cache_store([(key + "-2", cache_entry(key, 2, fresh_for=keep), keep)])
    assert lease_of(cache_store, api.cache_keys(f"cache-{name}", key + "-2").entry)[0] == lease
    assert lease_of(cache_store, api.cache_keys(f"cache-{name}", key).due)[0] == lease


def test_expired_entries_and_their_leases_are_gone(single: servers.EtcdServer, name: str) -> None:
    before = lease_ids_of(single)
    with corral.connect(single.url, prefix=f"cache-{name}") as store:
        backend = backend_of(store)
        for index in range(40):
            key = f"ns:{index}"
            # Kept 3 s: all 40 still there once the loop is done, even if it was paused.
            backend.cache_store([(key, cache_entry(key, index, fresh_for=2.0), 3.0)])
            read = backend.cache_read(key, "ns", cache_claim(f"{name}-{index}", due_before=0))
            assert read.attempt is None
            if index % 4 == 0:
                assert backend.cache_invalidate(key, 3.0)
            if index % 10 == 0:
                missing = backend.cache_read(f"{key}-missing", "ns", cache_claim(f"{name}-m"))
                assert missing.attempt is not None
                if missing.attempt.acquired:
                    backend.release(f"recompute-{name}-m", f"reader-{name}-m")
            time.sleep(0.02)
        assert backend.cache_count("") == 40
        assert len(lease_ids_of(single) - before) <= 5  # shared, not one per entry
        # Keep 3 s: leases of 4 s at most, run out on the server a little later.
        for _ in range(100):
            if backend.cache_count("") == 0:
                break
            time.sleep(0.1)
        assert backend.cache_count("") == 0
        assert count_under(store, api.encode(f"cache-{name}/cache/d/")) == 0
    # The spare claim leases are revoked on closing, the entries' ran out.
    for _ in range(50):
        if not lease_ids_of(single) - before:
            break
        time.sleep(0.1)
    assert lease_ids_of(single) - before == set()


def test_cache_calls_on_a_dead_server_fail_in_time(unused_port: int, name: str) -> None:
    url = f"etcd://alice:s3cret@127.0.0.1:{unused_port}"
    with corral.connect(url, timeout=0.5) as store:
        backend = backend_of(store)
        calls: list[Callable[[], object]] = [
            lambda: backend.cache_fetch(["k", "l"], "g"),
            lambda: backend.cache_read("k", "g"),
            lambda: backend.cache_read("k", "g", cache_claim(name)),
            lambda: backend.cache_store([("k", b"x", 10.0)]),
            lambda: backend.cache_delete("k"),
            lambda: backend.cache_invalidate("k", 10.0),
            lambda: backend.cache_clear("g"),
            lambda: backend.cache_count("k"),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable) as down:
                call()
            assert time.monotonic() - started < 0.5 * 2 + 3  # room for a paused test
            assert f"127.0.0.1:{unused_port}" in str(down.value)
            assert "s3cret" not in str(down.value)
        assert "cache key 'k'" in str(down.value) or "cache keys" in str(down.value)


def test_a_value_too_large_for_etcd_is_refused_with_advice(store: corral.Store, name: str) -> None:
    key = f"ns:{name}"
    data = cache_entry(key, "x" * (2 << 20), fresh_for=30)
    with pytest.raises(BackendError, match="max-request-bytes") as refused:
        backend_of(store).cache_store([(key, data, 60.0)])
    assert f"cache key {key!r}" in str(refused.value)


def test_a_claimed_read_whose_answer_is_lost_is_recognised(lossy: Lossy, name: str) -> None:
    backend = backend_of(lossy.store)
    key, claim = f"ns:{name}", cache_claim(name)
    # Only the claimed read carries the lock's key: lose its answer, once.
    lossy.plan.arm(
        "/v3/kv/txn", marker=api.b64(api.lock_keys("corral", claim.lock).holder).encode()
    )
    read = backend.cache_read(key, f"gen-{name}", claim)
    assert lossy.plan.lost == ["/v3/kv/txn"]
    assert read.attempt is not None and read.attempt.acquired  # its own: this owner, this lease
    info = lossy.direct.lock_info(claim.lock)
    assert info is not None and info.owner == claim.owner and info.token == read.attempt.token
    assert backend.release(claim.lock, claim.owner) is Outcome.OK
    assert lossy.direct.lock_info(claim.lock) is None


def test_an_invalidate_whose_answer_is_lost_marks_stale_once(lossy: Lossy, name: str) -> None:
    backend = backend_of(lossy.store)
    key = f"ns:{name}"
    data = cache_entry(key, {"v": 1}, fresh_for=300)
    backend.cache_store([(key, data, 600.0)])
    entry_key = api.cache_keys("corral", key).entry
    lossy.plan.arm("/v3/kv/txn", marker=api.b64(entry_key).encode())  # the swap, not the read
    assert backend.cache_invalidate(key, 30.0)
    assert lossy.plan.lost == ["/v3/kv/txn"]
    (found,), _ = backend_of(lossy.direct).cache_fetch([key], "g")
    assert found is not None and found == mark_stale(data)
