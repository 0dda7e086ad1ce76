"""memcached-specific behaviour: keys, whole-second TTLs, compare-and-swap races, eviction,
restarts, fork, threads, TLS, authentication, semaphore slots, cache entries.

The lock contract itself runs over memcached in tests/_async and tests/_sync; this file covers
what only memcached has. The framing and key tests need no server; the rest run against real
memcached processes, the shared one or private ones started with the flags a test needs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import itertools
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.aio
from corral._async.backends import memcached_conn as async_conn
from corral._sync._compat import Stream
from corral._sync.backends import memcached_slots
from corral._sync.backends.memcached_conn import Connection
from corral._sync.backends.memcached_locks import MemcachedLocks
from corral._sync.backends.memcached_slots import MAX_LIMIT, MemcachedSemaphores
from corral.backends import memcached_cache
from corral.backends import memcached_proto as proto
from corral.backends.memcached_proto import (
    MAX_KEY_BYTES,
    PLACEHOLDER_TTL,
    TTL_MARGIN,
    ProtocolError,
    QueueState,
    Reply,
    ReplyParser,
    SemaphoreKeys,
    cache_key,
    decode_slot,
    decode_value,
    encode_slot,
    encode_value,
    entry_ttl,
    fence_key,
    generation_key,
    lease_left,
    lock_keys,
    parse_url,
    place_id,
    place_key,
    request,
    semaphore_keys,
    server_ttl,
    shown_url,
)
from corral.core.envelope import HEADER_SIZE, decode_header, encode, make_codec
from corral.core.primitives import Claim, Outcome
from corral.errors import BackendError, BackendUnavailable, ConfigError, LockExpired, LockLost
from corral.testing import servers
from tests.conftest import server_missing
from tests.footprint import footprint_for

# Server tests take `backend_name`, so `--backends` without memcached leaves them out.
pytestmark = pytest.mark.backend("memcached")

AWKWARD_NAMES = [
    "has space",
    "tab\there",
    "new\nline\r\n",
    "nul\x00byte",
    "del\x7f",
    "ünïcödé 名前",
    "lone surrogate \udcff",
    "x" * 300,
    "y" * 1000 + " tail",
]


def locks_of(store: corral.Store) -> MemcachedLocks:
    locks: MemcachedLocks = store.backend._locks  # type: ignore[attr-defined]
    return locks


def is_take(request_line: bytes, name: str, prefix: str = "corral") -> bool:
    """Whether a request is an attempt's compare-and-swap on the free lock `name`."""
    head = request_line.split(b"\r\n", 1)[0].split()
    key = lock_keys(prefix, name).lock.encode()
    return head[:2] == [b"ms", key] and any(flag.startswith(b"C") for flag in head[3:])


def host_port(url: str) -> tuple[str, int]:
    options = parse_url(url, {})
    return options.host, options.port


def raw(url: str, *requests: bytes) -> list[Reply]:
    """Commands straight to the server, around corral."""
    with socket.create_connection(host_port(url), timeout=5) as sock:
        return Connection(Stream(sock)).call(time.monotonic() + 10, *requests)


def stat(url: str, name: str) -> int:
    with socket.create_connection(host_port(url), timeout=5) as sock:
        sock.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            data += sock.recv(65536)
    found = re.search(rb"STAT " + name.encode() + rb" (\d+)", data)
    assert found is not None, data
    return int(found.group(1))


# -- keys, values, TTLs and framing: no server -----------------------------------


def test_plain_names_keep_readable_keys() -> None:
    keys = lock_keys("corral", "nightly-report:eu")
    assert keys.lock == "corral:lock:nightly-report:eu"
    assert keys.queue == "corral:queue:nightly-report:eu"
    assert keys.route == keys.lock  # a router places every key of a lock by the lock key
    assert fence_key("corral") == "corral:fence"


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_awkward_names_are_hashed_into_valid_keys(name: str) -> None:
    keys = lock_keys("corral", name)
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    for key, kind in ((keys.lock, "lock"), (keys.queue, "queue")):
        assert re.fullmatch(r"[\x21-\x7e]+", key), key
        assert len(key.encode()) <= MAX_KEY_BYTES
        assert key.startswith(f"corral:{kind}#") and key.endswith(f"#{digest}")
    assert lock_keys("corral", name) == keys  # deterministic


def test_hashed_and_plain_keys_never_collide() -> None:
    names = [*AWKWARD_NAMES, "x" * 299, "x" * 301, "has_space"]
    # A plain name that spells out another name's hashed key stays apart.
    names.append(lock_keys("corral", "has space").lock.removeprefix("corral:lock:"))
    names.append(lock_keys("corral", "has space").lock.removeprefix("corral:"))
    keys = [lock_keys("corral", name) for name in names]
    assert len({k.lock for k in keys}) == len(names)
    assert len({k.queue for k in keys} | {k.lock for k in keys}) == 2 * len(names)


def test_the_longest_plain_key_is_kept_and_one_more_byte_is_hashed() -> None:
    room = MAX_KEY_BYTES - len("corral:queue:")
    assert lock_keys("corral", "a" * room).queue == "corral:queue:" + "a" * room
    assert "#" in lock_keys("corral", "a" * (room + 1)).queue


def test_waiter_places_have_valid_keys_for_any_name_and_owner() -> None:
    owners = ["host:1:MainThread:abc", "with space", "名前\udcff", "nul\x00"]
    ids = set()
    for name in AWKWARD_NAMES:
        lock = lock_keys("corral", name).lock
        for owner in owners:
            found = place_id(lock, owner)
            key = place_key("corral", found)
            assert re.fullmatch(r"[0-9a-f]{32}", found)
            assert re.fullmatch(r"[\x21-\x7e]+", key) and len(key) <= MAX_KEY_BYTES
            ids.add(found)
    assert len(ids) == len(AWKWARD_NAMES) * len(owners)
    # Length-prefixed parts: moving a NUL between lock key and owner is another place.
    assert place_id("a\x00b", "c") != place_id("a", "b\x00c")


def test_queue_values() -> None:
    a, b, c = "a" * 32, "b" * 32, "c" * 32
    assert QueueState.encode([a, b]) == f"{a} {b} ".encode()
    assert QueueState.parse(QueueState.encode([a, b])) == (a, b)
    assert QueueState.parse(b"") == ()
    for foreign in (b"x", f"{a}".encode(), f"{a}  ".encode(), b"\xff ", b"A" * 32 + b" "):
        assert QueueState.parse(foreign) is None
    queue = QueueState((a, b, c, b), cas=7, ttl=4)
    assert queue.ahead_of(b) == (a,) and queue.ahead_of(None) == (a, b, c, b)
    assert queue.ahead_of("d" * 32) == (a, b, c, b) and queue.ahead_of(a) == ()
    assert queue.rewrite("q", [], 5) == b"md q C7\r\n"
    assert queue.rewrite("q", [c], 2) == request("ms", "q", "C7", "T5", data=f"{c} ".encode())
    assert queue.rewrite("q", [c], 9) == request("ms", "q", "C7", "T9", data=f"{c} ".encode())


@pytest.mark.parametrize("prefix", ["", "has space", "tab\t", "é", "p" * 101, 7, None])
def test_bad_prefixes(prefix: object) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        parse_url("memcached://localhost", {"prefix": prefix})


@pytest.mark.parametrize("ttl", [0.001, 0.3, 0.999, 1, 1.0000001, 2.5, 30, 86400.5])
def test_server_ttl_never_lets_a_lock_end_before_its_ttl(ttl: float) -> None:
    # memcached may end an item given T<n> up to 2 ticks (almost 2 s) early.
    assert server_ttl(ttl) - 2 >= ttl - 1e-6
    assert server_ttl(ttl) - 2 < ttl + 1


def test_ttls_past_30_days_are_sent_as_unix_times() -> None:
    # memcached reads a TTL above 30 days as a Unix time.
    assert server_ttl(30 * 86400 - TTL_MARGIN) == 30 * 86400
    now = time.time()
    assert server_ttl(40 * 86400) - now >= 40 * 86400 + TTL_MARGIN
    assert server_ttl(40 * 86400) - now <= 40 * 86400 + TTL_MARGIN + 2
    with pytest.raises(ConfigError, match="2038"):
        server_ttl(2**31 - now + 10)


def test_lease_left() -> None:
    assert lease_left(12) == 10
    assert lease_left(1) == 0
    assert lease_left(-1) == float("inf")


@pytest.mark.parametrize(
    "owner", ["host:1:MainThread:abc", "a:b:c", "名前\udcff", "MN\r\n", "", None]
)
def test_values_round_trip(owner: str | None) -> None:
    assert decode_value(encode_value(1795322269413151, owner)) == (1795322269413151, owner or None)


@pytest.mark.parametrize("raw_value", [b"", b"hello", b"12x:owner", b":owner", b"-1:x", b"1:\xff"])
def test_foreign_values_are_recognised(raw_value: bytes) -> None:
    assert decode_value(raw_value) is None


def test_requests() -> None:
    assert request("mg", "k", "v", "c", "t") == b"mg k v c t\r\n"
    assert request("md", "k") == b"md k\r\n"
    assert request("ms", "k", "ME", "T3", data=b"a\r\nb") == b"ms k 4 ME T3\r\na\r\nb\r\n"


def test_replies_are_framed_by_length_whatever_the_chunks() -> None:
    # A value may hold CRLF (or look like a reply); only its length says where it ends.
    value = b"EN\r\nHD\r\n"
    stream = b"VA 8 c3 t12\r\n" + value + b"\r\nEN\r\nHD c4\r\nMN\r\n"
    for size in (1, 2, 5, len(stream)):
        parser = ReplyParser()
        replies = []
        for start in range(0, len(stream), size):
            parser.feed(stream[start : start + size])
            while (reply := parser.next()) is not None:
                replies.append(reply)
        assert replies == [
            Reply(b"VA", (b"c3", b"t12"), value),
            Reply(b"EN"),
            Reply(b"HD", (b"c4",)),
            Reply(b"MN"),
        ]
        assert replies[0].number("c") == 3 and replies[0].number("t") == 12
        assert parser.pending == 0


def test_error_replies_and_garbage() -> None:
    for line in (b"ERROR", b"CLIENT_ERROR bad command line format", b"SERVER_ERROR out of memory"):
        parser = ReplyParser()
        parser.feed(line + b"\r\n")
        with pytest.raises(proto.ServerRefused):
            parser.next()
    for garbage in (b"\r\n", b"VA x\r\n", b"VA 2\r\nabcd\r\n", b"x" * 9000):
        parser = ReplyParser()
        parser.feed(garbage)
        with pytest.raises(ProtocolError):
            parser.next()
    with pytest.raises(ProtocolError):
        Reply(b"HD").number("t")


# -- URLs and options -------------------------------------------------------------


def test_url_defaults_and_options() -> None:
    options = parse_url("memcached://cache.example", {})
    assert (options.host, options.port, options.prefix) == ("cache.example", 11211, "corral")
    assert options.timeout == 5.0 and options.tls_context is None
    options = parse_url("memcached://[::1]:11300/?timeout=0.5&prefix=app&max_connections=4", {})
    assert (options.host, options.port, options.timeout) == ("::1", 11300, 0.5)
    assert (options.prefix, options.max_connections) == ("app", 4)
    assert options.server == "memcached://[::1]:11300"


def test_credentials_never_show() -> None:
    options = parse_url("memcached://alice:s3cr%40t@h:1", {})
    assert (options.username, options.password) == ("alice", "s3cr@t")
    assert "s3cr" not in options.server and "s3cr" not in repr(options)
    with pytest.raises(ConfigError) as caught:
        parse_url("memcached://alice:s3cret@h:1", {"colour": "red"})
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("memcached://a:1,b:2", {}, "list of servers"),
        ("memcached://h:1/0", {}, "no databases"),
        ("memcached://h:99999", {}, "port"),
        ("memcached://", {}, "no host"),
        ("memcached://alice@h", {}, "both a user and a password"),
        ("memcached://h?colour=red", {}, "unknown option"),
        ("memcached://h?timeout=1", {"timeout": 2}, "twice"),
        ("memcached://h?timeout=soon", {}, "timeout"),
        ("memcached://h", {"timeout": 0}, "timeout"),
        ("memcached://h", {"max_connections": 0}, "max_connections"),
        ("memcached://h?tls=maybe", {}, "tls"),
        ("memcached://h?tls=false&tls_ca_file=/x", {}, "contradicts"),
        ("memcached://h", {"tls_ca_file": "/nonexistent/ca.pem"}, "certificates"),
        ("memcached://h", {"tls_keyfile": "/x.key"}, "tls_certfile"),
        ("memcached://h", {"tls_context": "yes"}, "SSLContext"),
        ("memcached://h?tls_context=x", {}, "keyword"),
    ],
)
def test_bad_urls(url: str, options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_url(url, options)


@pytest.mark.parametrize(
    "url",
    [
        "memcached://app:qX7/kV9@127.0.0.1:1",
        "memcached://app:qX7?kV9@127.0.0.1:1",
        "memcached://app:qX7?x=1@127.0.0.1:1",
        "memcached://app:qX7#kV9@127.0.0.1:1",
        "memcached://app:qX7@kV9@127.0.0.1:notaport",
    ],
)
def test_a_password_with_unencoded_reserved_characters_never_shows(url: str) -> None:
    """'/', '?' or '#' end the host part early: the password's tail must not show anywhere."""
    assert "qX7" not in shown_url(url) and "kV9" not in shown_url(url)
    with pytest.raises(ConfigError) as caught:
        corral.connect(url)
    shown = "".join(traceback.format_exception(caught.value)) + repr(caught.value)
    assert "qX7" not in shown and "kV9" not in shown, shown


def test_the_options_table_matches_what_connect_takes() -> None:
    declared = {option.name: option for option in proto.OPTIONS}
    assert set(declared) == {
        "prefix", "timeout", "max_connections", "tls", "tls_ca_file", "tls_certfile",
        "tls_keyfile", "tls_context",
    }  # fmt: skip
    assert not declared["tls_context"].query
    for option in declared.values():
        if option.example is not None:
            parse_url(f"memcached://h?{option.name}={option.example}", {})


def test_tls_options_make_a_context() -> None:
    assert parse_url("memcached://h?tls=true", {}).tls_context is not None
    context = ssl.create_default_context()
    assert parse_url("memcached://h", {"tls_context": context}).tls_context is context
    with pytest.raises(ConfigError, match="drop tls_ca_file"):
        parse_url("memcached://h", {"tls_context": context, "tls_ca_file": "/x"})


def test_capabilities_and_unsupported_options() -> None:
    caps = corral.connect("memcached://127.0.0.1:1").capabilities
    assert not caps.notifies and caps.fair and not caps.replicas and caps.cross_host
    assert "evict" in caps.on_memory_pressure and "fencing token" in caps.on_memory_pressure
    assert "order" in caps.on_memory_pressure and "microseconds" in caps.fencing_tokens
    assert caps.state_per_name.startswith("nothing")
    with corral.connect("memcached://127.0.0.1:1") as store:
        store.lock("x", fair=True)  # a handle: nothing is sent until it is acquired
        with pytest.raises(ConfigError, match="replicas"):
            store.lock("x", replicas=1)


# -- on the shared server -----------------------------------------------------------


@pytest.fixture
def store(backend_url: str) -> Iterator[corral.Store]:
    with corral.connect(backend_url) as opened:
        yield opened


@pytest.fixture
def other_store(backend_url: str) -> Iterator[corral.Store]:
    with corral.connect(backend_url) as opened:
        yield opened


def test_awkward_names_work_on_the_server(store: corral.Store, name: str) -> None:
    names = [f"{name} {awkward}" for awkward in AWKWARD_NAMES]
    names.append(names[-1][:-1] + "!")  # differs only past the readable part
    locks = [store.lock(n, ttl=30) for n in names]
    for lock in locks:
        assert lock.acquire()
    for lock in locks:
        info = store.lock_info(lock.name)
        assert info is not None and info.owner == lock.owner and info.token == lock.token
        assert not store.lock(lock.name).acquire()
    for lock in locks:
        lock.release()
        assert store.lock_info(lock.name) is None


def test_prefixes_keep_stores_apart(backend_url: str, name: str) -> None:
    with (
        corral.connect(backend_url, prefix="app-a") as a,
        corral.connect(f"{backend_url}?prefix=app-b") as b,
    ):
        first, second = a.lock(name), b.lock(name)
        assert first.acquire() and second.acquire()
        assert raw(backend_url, request("mg", f"app-a:lock:{name}"))[0].code == b"HD"
        first.release()
        second.release()


def test_a_one_second_lock_is_never_freed_early(store: corral.Store, name: str) -> None:
    lock = store.lock(name, ttl=1)
    assert lock.acquire()
    deadline = time.monotonic() + 0.95
    while time.monotonic() < deadline:
        assert store.lock_info(name) is not None
        time.sleep(0.05)
    info = store.lock_info(name)
    assert info is not None and info.owner == lock.owner
    lock.release()


def wait_until_free(store: corral.Store, name: str, within: float) -> float:
    began = time.monotonic()
    while store.lock_info(name) is not None:
        assert time.monotonic() - began < within, "the lock outlived its TTL by too much"
        time.sleep(0.05)
    return time.monotonic() - began


def test_whole_second_expiry_then_lost_or_expired(
    store: corral.Store, other_store: corral.Store, name: str
) -> None:
    """The contract's expiry tests, with TTLs memcached can express (whole seconds)."""
    stale = store.lock(name, ttl=1)
    assert stale.acquire()
    waited = wait_until_free(store, name, within=1 + TTL_MARGIN + 0.5)
    assert waited > 0.9
    fresh = other_store.lock(name, ttl=10)
    assert fresh.acquire()
    assert fresh.token is not None and stale.token is not None and fresh.token > stale.token
    with pytest.raises(LockLost, match=name):
        stale.extend()
    with pytest.raises(LockLost, match=name):
        stale.release()
    assert fresh.owned()
    fresh.release()
    assert fresh.acquire()
    fresh.release()
    lonely = store.lock(name, ttl=1)
    assert lonely.acquire()
    wait_until_free(store, name, within=1 + TTL_MARGIN + 0.5)
    with pytest.raises(LockExpired, match=name):
        lonely.release()


def test_hold_for_keeps_it_closed_whole_seconds(
    store: corral.Store, other_store: corral.Store, name: str
) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    token = lock.token
    lock.release(hold_for=1)
    info = store.lock_info(name)
    assert info is not None and info.owner is None and info.token == token
    other = other_store.lock(name, ttl=10)
    assert not other.acquire()
    assert other.acquire(wait=1 + TTL_MARGIN + 1)
    assert other.token is not None and token is not None and other.token > token
    other.release()


def test_inspect_shows_the_lease_left(store: corral.Store, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert lock.acquire()
    info = store.lock_info(name)
    assert info is not None and 8 <= info.ttl <= 10
    lock.extend(ttl=100)
    info = store.lock_info(name)
    assert info is not None and 98 <= info.ttl <= 100
    lock.release()


def test_locks_and_holds_longer_than_30_days(store: corral.Store, name: str) -> None:
    lock = store.lock(name, ttl=40 * 86400)
    assert lock.acquire()
    info = store.lock_info(name)
    assert info is not None and 40 * 86400 - 5 <= info.ttl <= 40 * 86400 + TTL_MARGIN
    lock.release(hold_for=31 * 86400)  # a monthly job that must run at most once a month
    info = store.lock_info(name)
    assert info is not None and info.owner is None and info.ttl >= 31 * 86400 - 5
    assert store.force_release(name)


def test_failed_attempt_reports_the_holders_ttl(store: corral.Store, name: str) -> None:
    lock = store.lock(name, ttl=20)
    assert lock.acquire()
    attempt = locks_of(store).try_acquire(name, "someone", 5)
    assert not attempt.acquired and attempt.holder_ttl is not None
    assert 19 <= attempt.holder_ttl <= 20 + TTL_MARGIN
    lock.release()


# The compare-and-swap races: another client changes the lock between our read and our write.


@pytest.fixture
def interfere(monkeypatch: pytest.MonkeyPatch) -> Callable[[bytes, Callable[[], None]], list[int]]:
    """Run `action` just before the first command that starts with `prefix` is sent."""

    def install(prefix: bytes, action: Callable[[], None]) -> list[int]:
        fired: list[int] = []
        original = Connection.call

        def call(self: Connection, deadline: float, *requests: bytes) -> list[Reply]:
            if not fired and requests[0].startswith(prefix):
                fired.append(1)
                action()
            return original(self, deadline, *requests)

        monkeypatch.setattr(Connection, "call", call)
        return fired

    return install


def test_release_never_frees_a_lock_taken_over_between_read_and_delete(
    store: corral.Store, other_store: corral.Store, name: str, interfere: Any
) -> None:
    stale = store.lock(name, ttl=30)
    assert stale.acquire()
    fresh = other_store.lock(name, ttl=30)

    def take_over() -> None:  # as if the TTL ran out and another process acquired
        assert other_store.force_release(name)
        assert fresh.acquire()

    fired = interfere(b"md " + lock_keys("corral", name).lock.encode() + b" C", take_over)
    with pytest.raises(LockLost):
        stale.release()
    assert fired and fresh.owned()
    fresh.release()


def test_extend_never_touches_a_lock_taken_over_between_read_and_write(
    store: corral.Store, other_store: corral.Store, name: str, interfere: Any
) -> None:
    stale = store.lock(name, ttl=30)
    assert stale.acquire()
    fresh = other_store.lock(name, ttl=5)

    def take_over() -> None:
        assert other_store.force_release(name)
        assert fresh.acquire()

    fired = interfere(b"ms " + lock_keys("corral", name).lock.encode() + b" ", take_over)
    with pytest.raises(LockLost):
        stale.extend(ttl=100)
    info = store.lock_info(name)
    assert fired and info is not None and info.owner == fresh.owner and info.ttl <= 5
    fresh.release()


def test_release_after_a_force_release_between_read_and_delete_is_expired(
    store: corral.Store, other_store: corral.Store, name: str, interfere: Any
) -> None:
    lock = store.lock(name, ttl=30)
    assert lock.acquire()

    def free_it() -> None:
        assert other_store.force_release(name)

    fired = interfere(b"md " + lock_keys("corral", name).lock.encode() + b" C", free_it)
    with pytest.raises(LockExpired):
        lock.release()
    assert fired and store.lock_info(name) is None


def test_own_renewal_between_read_and_delete_is_retried(
    store: corral.Store, name: str, interfere: Any
) -> None:
    lock = store.lock(name, ttl=30)
    assert lock.acquire()
    owner = lock.owner
    assert owner is not None
    # The renewal worker's extend lands between release's read and its delete.
    fired = interfere(
        b"md " + lock_keys("corral", name).lock.encode() + b" C",
        lambda: locks_of(store).extend(name, owner, 30) and None,
    )
    lock.release()
    assert fired and store.lock_info(name) is None


def test_a_token_drawn_meanwhile_cannot_reorder_acquisitions(
    store: corral.Store, other_store: corral.Store, name: str, interfere: Any
) -> None:
    """B reads the counter; A acquires and releases; then B's add lands: B's token is higher."""
    early = other_store.lock(name, ttl=30)
    tokens: list[int] = []

    def full_cycle() -> None:
        assert early.acquire()
        assert early.token is not None
        tokens.append(early.token)
        early.release()

    fired = interfere(b"ms " + lock_keys("corral", name).lock.encode() + b" ", full_cycle)
    late = store.lock(name, ttl=30)
    assert late.acquire()
    assert fired and late.token is not None and late.token > tokens[0]
    info = store.lock_info(name)
    assert info is not None and info.token == late.token
    late.release()


def test_a_take_after_another_acquisition_fails_and_reports_the_holder(
    store: corral.Store, other_store: corral.Store, name: str, interfere: Any
) -> None:
    """The compare-and-swap on the placeholder refuses a lock taken since the probe."""
    winner = other_store.lock(name, ttl=20)
    fired = interfere(b"ms " + lock_keys("corral", name).lock.encode() + b" ", winner.acquire)
    attempt = locks_of(store).try_acquire(name, "late", 30)
    assert fired and not attempt.acquired
    assert attempt.holder_ttl is not None and 19 <= attempt.holder_ttl <= 20 + TTL_MARGIN
    info = store.lock_info(name)
    assert info is not None and info.owner == winner.owner and info.token == winner.token
    winner.release()


def test_a_placeholder_gone_before_the_take_is_probed_again(
    backend_url: str, store: corral.Store, name: str, interfere: Any
) -> None:
    """Expired (or deleted) between probe and take: the attempt probes again, draws anew."""
    drawn: list[int] = []
    keys = lock_keys("corral", name)

    def delete_placeholder_and_draw() -> None:
        assert raw(backend_url, request("md", keys.lock))[0].code == b"HD"
        (counter,) = raw(backend_url, request("mg", fence_key("corral"), "v"))
        assert counter.value is not None
        drawn.append(int(counter.value))

    fired = interfere(b"ms " + keys.lock.encode() + b" ", delete_placeholder_and_draw)
    lock = store.lock(name, ttl=30)
    assert lock.acquire()
    assert fired and lock.token is not None and lock.token > drawn[0]
    lock.release()


def test_a_placeholder_is_no_lock(
    backend_url: str, store: corral.Store, other_store: corral.Store, name: str
) -> None:
    """A probe of a free lock leaves an empty placeholder for a moment: it is free."""
    keys = lock_keys("corral", name)
    (probe,) = raw(backend_url, request("mg", keys.lock, f"N{PLACEHOLDER_TTL}", "s", "t"))
    assert probe.code == b"HD" and probe.number("s") == 0
    assert 0 < probe.number("t") <= PLACEHOLDER_TTL
    assert store.lock_info(name) is None
    assert not store.lock(name).locked()
    assert not store.force_release(name)
    assert locks_of(store).release(name, "nobody") is Outcome.EXPIRED
    assert locks_of(store).extend(name, "nobody", 10) is Outcome.EXPIRED
    lock = other_store.lock(name, ttl=10)
    assert lock.acquire()  # over the placeholder
    lock.release()
    assert raw(backend_url, request("mg", keys.lock))[0].code == b"EN"  # released: deleted


async def test_cancelled_attempt_leaves_no_lock_behind(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its take is on its way: the take lands, and only then is it undone.

    The take-back must not overtake the take (it would find nothing, and the lock would
    stay held by an owner nobody knows until its TTL): the server sees the release after
    the compare-and-swap that took the lock.
    """
    original = async_conn.Connection.call
    taking = asyncio.Event()
    seen: list[bytes] = []
    lock_key = lock_keys("corral", name).lock.encode()

    async def slow_take(
        self: async_conn.Connection, deadline: float, *requests: bytes
    ) -> list[Reply]:
        if any(is_take(line, name) for line in requests):
            taking.set()
            await asyncio.sleep(0.3)  # the caller is cancelled meanwhile
            seen.append(b"take")
        elif any(line.startswith(b"md " + lock_key) for line in requests):
            seen.append(b"release")
        return await original(self, deadline, *requests)

    monkeypatch.setattr(async_conn.Connection, "call", slow_take)
    async with corral.aio.connect(backend_url) as store:
        task = asyncio.create_task(store.lock(name, ttl=60).acquire())
        await asyncio.wait_for(taking.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):  # the undo runs in the background, after the take
            if seen[-1:] == [b"release"]:
                break
            await asyncio.sleep(0.05)
        assert seen == [b"take", b"release"]
        assert await store.lock_info(name) is None
        assert await store.lock(name, ttl=5).acquire()


async def test_a_call_cancelled_mid_round_trip_leaves_the_pool_usable(
    backend_url: str, name: str
) -> None:
    """The cancelled call's reply is never read by the next caller: its connection is gone."""
    async with corral.aio.connect(backend_url, max_connections=1) as store:
        held = store.lock(name, ttl=30)
        assert await held.acquire()
        pool = store.backend._locks.client._pool  # type: ignore[attr-defined]
        (conn,) = pool._idle
        original = conn.stream.recv
        sent = asyncio.Event()

        async def stalled(deadline: float) -> bytes:
            sent.set()  # the request is on the wire; its reply is never read here
            await asyncio.sleep(60)
            return await original(deadline)

        conn.stream.recv = stalled  # type: ignore[method-assign]
        task = asyncio.create_task(store.lock_info(name))
        await asyncio.wait_for(sent.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn.broken and not pool._idle and not pool._lent  # closed, not pooled again
        # The next callers get a fresh connection and their own replies, not the stale one.
        assert await store.lock_info(f"{name}-other") is None
        info = await store.lock_info(name)
        assert info is not None and info.owner == held.owner
        await held.release()
        assert await store.lock_info(name) is None


async def test_tasks_cancelled_while_waiting_for_a_connection_leave_it_to_the_others(
    backend_url: str, name: str
) -> None:
    async with corral.aio.connect(backend_url, max_connections=2) as store:
        tasks = [asyncio.create_task(store.lock_info(f"{name}-{i}")) for i in range(30)]
        await asyncio.sleep(0)  # all started: two hold connections, the rest wait
        for task in tasks[1::3]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for i, result in enumerate(results):
            assert result is None or (i % 3 == 1 and isinstance(result, asyncio.CancelledError))
        pool = store.backend._locks.client._pool  # type: ignore[attr-defined]
        assert len(pool._idle) + len(pool._lent) <= 2 and not pool._lent
        assert await store.lock_info(name) is None


async def test_the_async_flavour_makes_no_thread_hop(backend_url: str, name: str) -> None:
    """Every call is awaited on the event loop: the default executor is never used."""

    class Refusing(concurrent.futures.ThreadPoolExecutor):
        used: list[str] = []

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            self.used.append(repr(fn))
            return super().submit(fn, *args, **kwargs)

    loop = asyncio.get_running_loop()
    refusing = Refusing(max_workers=1)
    loop.set_default_executor(refusing)
    try:
        threads = threading.active_count()
        url = backend_url.replace("localhost", "127.0.0.1")  # no name to resolve
        async with corral.aio.connect(url, max_connections=2) as store:
            lock = store.lock(name, ttl=30)
            assert await lock.acquire()
            assert (await store.lock_info(name)) is not None
            await lock.extend(ttl=20)
            await lock.release()
            sem = store.semaphore(name, 2, ttl=30)
            assert await sem.acquire()
            await sem.release()
            backend = store.backend
            await backend.cache_store([(f"{name}-k", b"v", 30)])
            assert (await backend.cache_fetch([f"{name}-k"], "g"))[0] == [b"v"]
            await backend.cache_clear(f"{name}-g")
            assert threading.active_count() <= threads  # no thread started for corral
        assert Refusing.used == []
    finally:
        refusing.shutdown()


async def test_a_stopped_server_is_bounded_by_the_timeout_in_async_too(tmp_path: Path) -> None:
    server = servers.start_memcached(tmp_path)
    try:
        async with corral.aio.connect(server.url, timeout=0.5, max_connections=1) as store:
            name = "stopped"
            assert await store.lock_info(name) is None  # a pooled connection, then a pause
            server.pause()
            try:
                with pytest.raises(BackendUnavailable, match=r"did not answer within 0\.5 s"):
                    await store.lock(name, ttl=10).acquire(wait=0)
                with pytest.raises(BackendUnavailable, match=r"did not answer within 0\.5 s"):
                    await store.lock_info(name)
            finally:
                server.resume()
            # The connections that timed out were dropped: the next call works.
            assert await store.lock_info(name) is None
            lock = store.lock(name, ttl=10)
            assert await lock.acquire()
            await lock.release()
            # Waiting for a connection counts: with the only one lent out, a call gives up.
            pool = store.backend._locks.client._pool  # type: ignore[attr-defined]
            async with pool.connection(time.monotonic() + 60):
                with pytest.raises(BackendUnavailable, match=r"stayed busy.*max_connections"):
                    await store.lock_info(name)
            assert await store.lock_info(name) is None
    finally:
        server.stop()


def test_foreign_data_under_our_prefix(backend_url: str, name: str) -> None:
    prefix = f"foreign-{name}"  # its own counter: the shared one stays intact
    keys = lock_keys(prefix, name)
    with corral.connect(backend_url, prefix=prefix) as store:
        raw(backend_url, request("ms", keys.lock, "T60", data=b"not corral's"))
        with pytest.raises(BackendError, match="did not write"):
            store.lock_info(name)
        with pytest.raises(BackendError, match="did not write"):
            locks_of(store).release(name, "someone")
        raw(backend_url, request("md", keys.lock))
        held = store.lock(name, ttl=30)
        assert held.acquire()
        raw(backend_url, request("ms", keys.queue, "T60", data=b"not a queue"))
        held.release()  # a foreign queue never stops a release
        with pytest.raises(BackendError, match="prefix"):
            store.lock(name).acquire()
        raw(backend_url, request("md", keys.queue))
        raw(backend_url, request("ms", fence_key(prefix), "T60", data=b"abc"))
        with pytest.raises(BackendError, match="prefix"):
            store.lock(name).acquire()
        assert store.lock_info(name) is None  # nothing was taken meanwhile
        raw(backend_url, request("md", fence_key(prefix)))


def test_a_lost_counter_restarts_above_every_earlier_token(backend_url: str, name: str) -> None:
    prefix = f"lost-{name}"
    with corral.connect(backend_url, prefix=prefix) as store:
        lock = store.lock(name, ttl=30)
        assert lock.acquire()
        first = lock.token
        lock.release()
        # Evicted, or lost with a restart: the next token starts from the time in microseconds.
        assert raw(backend_url, request("md", fence_key(prefix)))[0].code == b"HD"
        assert lock.acquire()
        assert lock.token is not None and first is not None and lock.token > first
        assert lock.token >= time.time_ns() // 1000 - 60_000_000
        lock.release()


def test_one_counter_serves_every_name(backend_url: str, name: str) -> None:
    """Tokens come from one item per prefix, so no name keeps a counter of its own."""
    prefix = f"one-{name}"
    with corral.connect(backend_url, prefix=prefix) as store:
        tokens = []
        for index in range(5):
            lock = store.lock(f"{name}-{index}", ttl=30)
            assert lock.acquire()
            assert lock.token is not None
            tokens.append(lock.token)
            lock.release()
        (counter,) = raw(backend_url, request("mg", fence_key(prefix), "v", "t"))
        assert counter.value is not None and counter.number("t") == -1  # never expires
        assert tokens == sorted(tokens) and len(set(tokens)) == 5
        assert int(counter.value) >= tokens[-1]


# The waiting queue: places, entries, and what each primitive leaves behind.


def queue_of(url: str, name: str) -> tuple[str, ...] | None:
    (found,) = raw(url, request("mg", lock_keys("corral", name).queue, "v"))
    if found.code == b"EN":
        return None
    assert found.value is not None
    return QueueState.parse(found.value)


def place_alive(url: str, name: str, owner: str) -> bool:
    key = place_key("corral", place_id(lock_keys("corral", name).lock, owner))
    return raw(url, request("mg", key))[0].code == b"HD"


def attempt(store: corral.Store, name: str, owner: str, queue_ttl: float | None = None) -> Any:
    locks = locks_of(store)
    return locks.try_acquire(name, owner, 30, queue_ttl)


def entry(name: str, owner: str) -> str:
    return place_id(lock_keys("corral", name).lock, owner)


def test_a_waiter_joins_once_and_its_place_lives_while_it_refreshes(
    backend_url: str, store: corral.Store, name: str
) -> None:
    assert attempt(store, name, "holder").acquired
    for _ in range(3):
        assert not attempt(store, name, "waiter", queue_ttl=1).acquired
    assert queue_of(backend_url, name) == (entry(name, "waiter"),)
    assert place_alive(backend_url, name, "waiter")
    (place,) = raw(backend_url, request("mg", place_key("corral", entry(name, "waiter")), "t"))
    assert 0 < place.number("t") <= server_ttl(1)
    # Not refreshed any more (the waiter died): the place goes, the entry stays until pruned.
    began = time.monotonic()
    while place_alive(backend_url, name, "waiter"):
        assert time.monotonic() - began < server_ttl(1) + 1
        time.sleep(0.1)
    assert locks_of(store).release(name, "holder") is Outcome.OK
    assert attempt(store, name, "newcomer").acquired  # the dead head no longer counts
    assert queue_of(backend_url, name) is None  # and was dropped from the queue
    locks_of(store).release(name, "newcomer")


def test_release_and_leave_queue_remove_places_and_entries(
    backend_url: str, store: corral.Store, other_store: corral.Store, name: str
) -> None:
    assert attempt(store, name, "holder").acquired
    for owner in ("first", "second", "third"):
        assert not attempt(other_store, name, owner, queue_ttl=10).acquired
    order = tuple(entry(name, owner) for owner in ("first", "second", "third"))
    assert queue_of(backend_url, name) == order
    locks_of(other_store).leave_queue(name, "second")
    assert not place_alive(backend_url, name, "second")
    assert queue_of(backend_url, name) == (order[0], order[2])
    assert locks_of(store).release(name, "holder") is Outcome.OK
    assert not attempt(other_store, name, "third", queue_ttl=10).acquired  # "first" is ahead
    assert attempt(other_store, name, "first", queue_ttl=10).acquired
    assert locks_of(other_store).release(name, "first") is Outcome.OK
    assert not place_alive(backend_url, name, "first")
    assert queue_of(backend_url, name) == (order[2],)
    assert attempt(other_store, name, "third", queue_ttl=10).acquired
    assert locks_of(other_store).release(name, "third", hold_for=1) is Outcome.OK
    assert queue_of(backend_url, name) is None and not place_alive(backend_url, name, "third")
    assert store.force_release(name)


def test_dead_places_beyond_one_round_trip_of_checks(
    backend_url: str, store: corral.Store, name: str
) -> None:
    """Twenty dead places before a live one: the checks go on past the first sixteen."""
    assert attempt(store, name, "holder").acquired
    dead = [f"dead-{index}" for index in range(20)]
    for owner in [*dead, "live"]:
        assert not attempt(store, name, owner, queue_ttl=30).acquired
    for owner in dead:
        locks_of(store).leave_queue(name, owner)  # then put the entries back, places gone
    raw(
        backend_url,
        request(
            "ms",
            lock_keys("corral", name).queue,
            "T30",
            data=QueueState.encode([entry(name, owner) for owner in [*dead, "live"]]),
        ),
    )
    locks_of(store).release(name, "holder")
    assert not attempt(store, name, "newcomer").acquired  # "live" is 21st, and alive
    locks_of(store).leave_queue(name, "live")
    assert attempt(store, name, "newcomer").acquired  # all dead: free for anyone
    assert queue_of(backend_url, name) is None
    locks_of(store).release(name, "newcomer")


def test_a_lost_queue_loses_order_not_exclusion(
    backend_url: str, store: corral.Store, other_store: corral.Store, name: str
) -> None:
    """Evicted (or lost with a restart): waiters rejoin with their next attempt."""
    assert attempt(store, name, "holder").acquired
    assert not attempt(other_store, name, "first", queue_ttl=10).acquired
    assert not attempt(other_store, name, "second", queue_ttl=10).acquired
    raw(backend_url, request("md", lock_keys("corral", name).queue))
    assert not attempt(other_store, name, "second", queue_ttl=10).acquired
    assert not attempt(other_store, name, "first", queue_ttl=10).acquired
    assert queue_of(backend_url, name) == (entry(name, "second"), entry(name, "first"))
    assert locks_of(store).release(name, "holder") is Outcome.OK
    assert not attempt(store, name, "first", queue_ttl=10).acquired
    assert attempt(store, name, "second", queue_ttl=10).acquired
    assert not attempt(store, name, "first", queue_ttl=10).acquired  # held: exclusion holds
    locks_of(store).release(name, "second")
    locks_of(store).leave_queue(name, "first")


def test_a_killed_waiter_stalls_the_queue_only_until_its_place_expires(
    backend_url: str, store: corral.Store, other_store: corral.Store, name: str
) -> None:
    """A real process queued behind a holder is SIGKILLed: the next waiter still gets it."""
    holder = store.lock(name, ttl=60, fair=True)
    assert holder.acquire()
    script = (
        "import sys, corral\n"
        "store = corral.connect(sys.argv[1])\n"
        "store.lock(sys.argv[2], ttl=60, fair=True).acquire(wait=120)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, backend_url, name],
        env={**os.environ, "PYTHONPATH": str(Path(corral.__file__).parents[1])},
    )
    try:
        deadline = time.monotonic() + 30
        while not queue_of(backend_url, name):
            assert child.poll() is None and time.monotonic() < deadline, "it never queued"
            time.sleep(0.05)
        (queued,) = queue_of(backend_url, name) or ()
        assert raw(backend_url, request("mg", place_key("corral", queued)))[0].code == b"HD"
    finally:
        child.kill()
        child.wait()
    holder.release()
    # Its place stays until it expires (it is no longer refreshed), then the queue moves on.
    waiter = other_store.lock(name, ttl=10, fair=True)
    assert waiter.acquire(wait=30)
    assert raw(backend_url, request("mg", place_key("corral", queued)))[0].code == b"EN"
    waiter.release()


# Round trips per primitive: what an attempt, a release, a queue costs on the wire.


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts `_Connection.call`s and `call_quiet`s (one write, then every reply: one round
    trip each)."""
    calls: list[int] = []
    original = Connection.call
    original_quiet = Connection.call_quiet

    def call(self: Connection, deadline: float, *requests: bytes) -> list[Reply]:
        calls.append(len(requests))
        return original(self, deadline, *requests)

    def call_quiet(self: Connection, deadline: float, *requests: bytes) -> list[Reply]:
        calls.append(len(requests))
        return original_quiet(self, deadline, *requests)

    monkeypatch.setattr(Connection, "call", call)
    monkeypatch.setattr(Connection, "call_quiet", call_quiet)
    return calls


def test_round_trips(
    store: corral.Store, other_store: corral.Store, name: str, round_trips: list[int]
) -> None:
    locks = locks_of(store)
    store.lock_info(name)  # opens the pooled connection: its greeting is not counted below

    def cost(action: Callable[[], object]) -> int:
        round_trips.clear()
        action()
        return len(round_trips)

    assert cost(lambda: attempt(store, name, "a")) == 2  # free, empty queue
    assert cost(lambda: attempt(store, name, "b")) == 1  # held
    assert cost(lambda: locks.extend(name, "a", 30)) == 2
    assert cost(lambda: store.lock_info(name)) == 1
    assert cost(lambda: attempt(store, name, "w", queue_ttl=3)) == 2  # held, joins
    assert cost(lambda: attempt(store, name, "w", queue_ttl=3)) == 1  # held, refreshes
    assert cost(lambda: locks.release(name, "a")) == 2
    assert cost(lambda: attempt(store, name, "c")) == 2  # free, "w" ahead: checked, alive
    assert cost(lambda: attempt(store, name, "w", queue_ttl=3)) == 2  # free, "w" first
    assert cost(lambda: locks.release(name, "w")) == 2  # leaves the queue on the way
    assert cost(lambda: locks.leave_queue(name, "nobody")) == 1
    assert cost(lambda: store.force_release(name)) == 1


def test_threads_share_one_store_without_overlap(backend_url: str, name: str) -> None:
    records: list[tuple[float, float, int]] = []
    errors: list[BaseException] = []
    with corral.connect(backend_url, max_connections=4) as store:

        def worker() -> None:
            try:
                for _ in range(10):
                    lock = store.lock(name, ttl=30)
                    assert lock.acquire(wait=60)
                    began = time.monotonic()
                    time.sleep(0.001)
                    assert lock.token is not None
                    records.append((began, time.monotonic(), lock.token))
                    lock.release()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        pool = locks_of(store).client._pool
        assert len(pool._idle) + len(pool._lent) <= 4
    assert not errors, errors
    records.sort()
    for (_, end, token), (start, _, next_token) in itertools.pairwise(records):
        assert end <= start and token < next_token


def test_a_full_pool_fails_within_the_timeout(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Connection.call
    entered, failed = threading.Event(), threading.Event()

    def slow(self: Connection, deadline: float, *requests: bytes) -> list[Reply]:
        if requests and requests[0].startswith(b"mg ") and not entered.is_set():
            entered.set()
            failed.wait(30)  # holds the connection until the other call has failed
        return original(self, deadline, *requests)

    monkeypatch.setattr(Connection, "call", slow)
    with corral.connect(backend_url, max_connections=1, timeout=0.5) as store:
        outcome: list[BaseException] = []

        def hold_the_only_connection() -> None:
            try:
                store.lock_info(name)
            except BaseException as exc:
                outcome.append(exc)

        busy = threading.Thread(target=hold_the_only_connection)
        busy.start()
        assert entered.wait(5)
        began = time.monotonic()
        try:
            with pytest.raises(BackendUnavailable, match="max_connections"):
                store.lock_info(name)
            assert time.monotonic() - began < 2.5  # the 0.5 s timeout, and room for a pause
        finally:
            failed.set()
        busy.join()
        # Its own call overran the timeout too, once its reply came: reported, not hung.
        assert len(outcome) == 1 and isinstance(outcome[0], BackendUnavailable)


def test_a_closed_store_says_so(backend_url: str, name: str) -> None:
    store = corral.connect(backend_url)
    assert store.lock_info(name) is None
    store.close()
    with pytest.raises(BackendError, match="closed"):
        store.lock_info(name)


def test_a_forked_child_opens_its_own_connection(backend_url: str, name: str) -> None:
    with corral.connect(backend_url) as store:
        assert store.lock_info(name) is None  # leaves one idle connection in the pool
        pool = locks_of(store).client._pool
        parent_port = pool._idle[0].stream.sock.getsockname()[1]
        stop = threading.Event()
        parent_errors: list[BaseException] = []

        def hammer() -> None:  # the parent keeps using its connections during the fork
            try:
                while not stop.is_set():
                    assert store.lock_info(name) is None
            except BaseException as exc:
                parent_errors.append(exc)

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    lock = store.lock(f"{name}-child", ttl=10)
                    for _ in range(200):
                        if not lock.acquire() or store.lock_info(lock.name) is None:
                            code = 3
                        lock.release()
                    ports = {c.stream.sock.getsockname()[1] for c in pool._idle}
                    if parent_port in ports:
                        code = 4
                except BaseException:
                    code = 5
                os._exit(code)
            _, status = os.waitpid(pid, 0)
        finally:
            stop.set()
            thread.join()
        assert os.waitstatus_to_exitcode(status) == 0
        assert not parent_errors, parent_errors
        assert store.lock_info(name) is None


async def test_a_forked_child_of_an_async_store_opens_its_own_connection(
    backend_url: str, name: str
) -> None:
    async with corral.aio.connect(backend_url) as store:
        assert await store.lock_info(name) is None  # leaves one idle connection in the pool
        pool = store.backend._locks.client._pool  # type: ignore[attr-defined]
        parent_port = pool._idle[0].stream.sock.getsockname()[1]
        pid = os.fork()
        if pid == 0:
            code = 0
            try:

                async def in_child() -> int:  # a new event loop, the same store
                    lock = store.lock(f"{name}-child", ttl=10)
                    if not await lock.acquire():
                        return 3
                    await lock.release()
                    ports = {c.stream.sock.getsockname()[1] for c in pool._idle}
                    return 4 if parent_port in ports or not ports else 0

                code = asyncio.run(in_child())
            except BaseException:
                traceback.print_exc()
                code = 5
            os._exit(code)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's connection survived the child: still pooled, still answering.
        assert pool._idle[0].stream.sock.getsockname()[1] == parent_port
        assert await store.lock_info(name) is None


# -- private servers: eviction, restart, flags -------------------------------------


class CustomMemcached(servers.MemcachedServer):
    """memcached with extra flags, and a probe that copes with TLS or authentication."""

    def __init__(
        self,
        workdir: Path,
        port: int,
        extra: list[str],
        *,
        memory_mb: int = 64,
        tls: ssl.SSLContext | None = None,
        login: bytes = b"",
    ) -> None:
        super().__init__(workdir, port, memory_mb=memory_mb)
        self.extra = extra
        self.tls = tls
        self.login = login

    def _command(self) -> list[str]:
        return [*super()._command(), *self.extra]

    def _probe(self) -> bool:
        with socket.create_connection((self.host, self.port), timeout=1.0) as plain:
            sock = self.tls.wrap_socket(plain, server_hostname=self.host) if self.tls else plain
            sock.sendall(self.login + b"version\r\n")
            with sock.makefile("rb") as stream:
                lines = [stream.readline() for _ in range(2 if self.login else 1)]
                return lines[-1].startswith(b"VERSION ")


@pytest.fixture
def start_memcached(tmp_path: Path) -> Iterator[Callable[..., CustomMemcached]]:
    started: list[CustomMemcached] = []

    def start(*extra: str, **kwargs: Any) -> CustomMemcached:
        try:
            server = CustomMemcached(
                servers._server_dir(tmp_path, "memcached"),
                servers.free_port(),
                list(extra),
                **kwargs,
            )
        except servers.ServerUnavailable as exc:
            server_missing(str(exc))
            raise
        started.append(server)
        return servers._start_with_port_retries(server)

    yield start
    for server in started:
        server.stop()


def test_eviction_frees_a_held_lock_and_tokens_still_increase(
    backend_name: str, start_memcached: Callable[..., CustomMemcached], name: str
) -> None:
    """Documented behaviour: a full memcached evicts held locks; the fencing token protects."""
    server = start_memcached(memory_mb=2)
    with corral.connect(server.url) as store:
        holder = store.lock(name, ttl=600)
        assert holder.acquire()
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            for batch in range(30):
                chunk = bytearray()
                for i in range(10_000):
                    data = b"x" * (30 + i % 60)  # the lock's slab class and its neighbours
                    chunk += request("ms", f"flood:{batch}:{i}", "T0", "q", data=data)
                sock.sendall(bytes(chunk) + b"mn\r\n")
                received = b""
                while not received.endswith(b"MN\r\n"):
                    received += sock.recv(65536)
        assert stat(server.url, "evictions") > 0
        assert store.lock_info(name) is None, "the flood did not evict the lock"
        usurper = store.lock(name, ttl=30)
        assert usurper.acquire()  # while the holder still believes it holds the lock
        assert holder.held
        assert usurper.token is not None and holder.token is not None
        assert usurper.token > holder.token
        with pytest.raises(LockLost):
            holder.release()
        usurper.release()


def test_restart_forgets_locks_but_tokens_still_increase(
    backend_name: str, start_memcached: Callable[..., CustomMemcached], name: str
) -> None:
    server = start_memcached()
    with corral.connect(server.url, timeout=2) as store:
        lock = store.lock(name, ttl=600)
        assert lock.acquire()
        before = lock.token
        server.restart()
        # The pooled connection died with the server: it is replaced, not reported.
        assert store.lock_info(name) is None
        with pytest.raises(LockExpired):
            lock.release()
        assert lock.acquire()
        assert lock.token is not None and before is not None and lock.token > before
        lock.release()

    async def over_asyncio() -> None:  # the loop has not read the end of stream yet
        async with corral.aio.connect(server.url, timeout=2) as store:
            assert await store.lock_info(name) is None  # one pooled connection
            server.restart()
            assert await store.lock_info(name) is None  # replaced, not reported

    asyncio.run(over_asyncio())


def test_a_server_without_cas_is_refused(
    backend_name: str, start_memcached: Callable[..., CustomMemcached], name: str
) -> None:
    server = start_memcached("-C")
    with corral.connect(server.url) as store, pytest.raises(BackendError, match="-C"):
        store.lock(name, ttl=30).acquire()
    assert raw(server.url, request("mg", lock_keys("corral", name).lock))[0].code == b"EN"


def test_tls(
    backend_name: str, start_memcached: Callable[..., CustomMemcached], tmp_path: Path, name: str
) -> None:
    try:
        ca_file, _, cert_file, key_file = servers._make_tls_files(tmp_path)
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
    trusting = ssl.create_default_context(cafile=str(ca_file))
    server = start_memcached(
        "-Z", "-o", f"ssl_chain_cert={cert_file},ssl_key={key_file}", tls=trusting
    )
    for url, options in [
        (server.url, {"tls_ca_file": str(ca_file)}),
        (f"{server.url}?tls_ca_file={ca_file}", {}),
        (server.url, {"tls_context": trusting}),
    ]:
        with corral.connect(url, **options) as store:
            lock = store.lock(name, ttl=10)
            assert lock.acquire()
            assert store.lock_info(name) is not None
            lock.release()
    with (
        corral.connect(server.url, tls=True, timeout=2) as store,
        pytest.raises(BackendError, match="not trusted"),
    ):
        store.lock_info(name)
    with (
        corral.connect(server.url, timeout=2) as store,
        pytest.raises(BackendUnavailable, match="tls=true"),
    ):
        store.lock_info(name)

    async def over_asyncio() -> None:  # asyncio's own TLS, not the ssl module's sockets
        async with corral.aio.connect(server.url, tls_ca_file=str(ca_file)) as store:
            lock = store.lock(name, ttl=10)
            assert await lock.acquire()
            assert await store.lock_info(name) is not None
            await lock.release()
        async with corral.aio.connect(server.url, tls=True, timeout=2) as store:
            with pytest.raises(BackendError, match="not trusted"):
                await store.lock_info(name)
        async with corral.aio.connect(server.url, timeout=2) as store:
            with pytest.raises(BackendUnavailable, match="tls=true"):
                await store.lock_info(name)

    asyncio.run(over_asyncio())


def test_authentication(
    backend_name: str, start_memcached: Callable[..., CustomMemcached], tmp_path: Path, name: str
) -> None:
    auth_file = tmp_path / "auth"
    auth_file.write_text("alice:s3cret\n")
    server = start_memcached("-Y", str(auth_file), login=b"set a 0 0 12\r\nalice s3cret\r\n")
    where = f"{server.host}:{server.port}"
    with corral.connect(f"memcached://alice:s3cret@{where}") as store:
        lock = store.lock(name, ttl=10)
        assert lock.acquire()
        lock.release()
    with corral.connect(f"memcached://alice:wrong@{where}") as store:
        with pytest.raises(BackendError, match="refused the credentials") as caught:
            store.lock_info(name)
        assert "wrong" not in str(caught.value)
    with (
        corral.connect(f"memcached://{where}") as store,
        pytest.raises(BackendError, match="requires authentication"),
    ):
        store.lock_info(name)

    async def over_asyncio() -> None:
        async with corral.aio.connect(f"memcached://alice:s3cret@{where}") as store:
            assert await store.lock_info(name) is None
        async with corral.aio.connect(f"memcached://alice:wrong@{where}") as store:
            with pytest.raises(BackendError, match="refused the credentials"):
                await store.lock_info(name)

    asyncio.run(over_asyncio())


def test_an_old_memcached_is_refused(backend_name: str, name: str) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"VERSION 1.5.22\r\n")
            conn.recv(1024)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with (
        corral.connect(f"memcached://127.0.0.1:{port}", timeout=2) as store,
        pytest.raises(BackendError, match=r"1\.5\.22.*1\.6\.10"),
    ):
        store.lock_info(name)
    listener.close()
    thread.join(5)


def test_an_unreachable_server_fails_within_the_timeout(backend_name: str, name: str) -> None:
    port = servers.free_port()  # nobody listens
    with corral.connect(f"memcached://127.0.0.1:{port}", timeout=1) as store:
        began = time.monotonic()
        with pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port}"):
            store.lock(name).acquire()
        assert time.monotonic() - began < 4.5  # room for a pause, short of the 5 s default timeout


# -- semaphores: a key per slot ------------------------------------------------------


def slot_keys(name: str, limit: int, prefix: str = "corral") -> list[str]:
    keys = semaphore_keys(prefix, name)
    return [keys.slot(index) for index in range(limit)]


def is_slot_take(request_line: bytes, name: str, limit: int) -> bool:
    """Whether a request is an attempt's compare-and-swap on a slot of semaphore `name`."""
    head = request_line.split(b"\r\n", 1)[0].split()
    slots = {key.encode() for key in slot_keys(name, limit)}
    return head[:1] == [b"ms"] and head[1] in slots and any(f.startswith(b"C") for f in head[3:])


@pytest.mark.parametrize("name", ["pool", *AWKWARD_NAMES])
def test_semaphore_keys_are_valid_and_apart_from_lock_keys(name: str) -> None:
    keys = semaphore_keys("corral", name)
    lock = lock_keys("corral", name)
    every = [keys.header, keys.queue, *slot_keys(name, MAX_LIMIT)]
    for key in every:
        assert re.fullmatch(r"[\x21-\x7e]+", key) and len(key) <= MAX_KEY_BYTES, key
    assert len(set(every)) == len(every)
    assert not set(every) & {lock.lock, lock.queue}
    assert keys.route == keys.header  # a router places every key of a semaphore together
    assert semaphore_keys("corral", name) == keys


def test_slot_keys_never_collide_across_names() -> None:
    # The index follows the last "#": "a#1" slot 0 is not "a" slot 10, nor "a#10" slot 0.
    pairs = [("a#1", 0), ("a", 10), ("a#10", 0), ("a", 1), ("a#", 10)]
    assert len({semaphore_keys("corral", n).slot(i) for n, i in pairs}) == len(pairs)
    assert isinstance(semaphore_keys("corral", "x"), SemaphoreKeys)


@pytest.mark.parametrize("owner", ["host:1:MainThread:abc", None, "ünï \x00 \udcff"])
def test_slot_values_round_trip(owner: str | None) -> None:
    assert decode_slot(encode_slot(42, 3, owner)) == (42, 3, owner)
    assert decode_slot(b"42:x:owner") is None
    assert decode_slot(b"42:owner") is None
    assert decode_slot(b"") is None


def test_the_limit_is_bounded(store: corral.Store, name: str) -> None:
    too_many = store.semaphore(name, MAX_LIMIT + 1, ttl=5)
    with pytest.raises(ConfigError, match=f"limit={MAX_LIMIT + 1} is above {MAX_LIMIT}"):
        too_many.acquire()
    assert not too_many.held
    largest = store.semaphore(name, MAX_LIMIT, ttl=5)
    assert largest.acquire()
    info = store.semaphore_info(name)
    assert info is not None and info.limit == MAX_LIMIT and info.free == MAX_LIMIT - 1
    largest.release()
    assert store.semaphore_info(name) is None


def test_awkward_semaphore_names_work_on_the_server(store: corral.Store, name: str) -> None:
    names = [f"{name} {awkward}" for awkward in AWKWARD_NAMES]
    slots = [store.semaphore(n, 2, ttl=30) for n in names for _ in range(2)]
    for slot in slots:
        assert slot.acquire()
    for n in names:
        info = store.semaphore_info(n)
        assert info is not None and info.free == 0 and len(info.holders) == 2
        assert not store.semaphore(n, 2).acquire()
    for slot in slots:
        slot.release()
    for n in names:
        assert store.semaphore_info(n) is None


def test_slot_keys_are_gone_after_release(
    backend_url: str, store: corral.Store, other_store: corral.Store, name: str
) -> None:
    slots = [(store, other_store)[i % 2].semaphore(name, 3, ttl=30) for i in range(3)]
    for slot in slots:
        assert slot.acquire()
    keys = slot_keys(name, 3)
    found = raw(backend_url, *(request("mg", key, "v") for key in keys))
    owners = {decode_slot(reply.value or b"")[2] for reply in found}  # type: ignore[index]
    assert owners == {slot.owner for slot in slots}  # one slot key per holder
    for slot in slots:
        slot.release()
    assert [r.code for r in raw(backend_url, *(request("mg", k) for k in keys))] == [b"EN"] * 3
    header = semaphore_keys("corral", name).header
    assert raw(backend_url, request("mg", header, "v"))[0].value == b"3"  # lingers, bounded


def test_state_per_semaphore_name_is_bounded(backend_url: str) -> None:
    """Names used once leave nothing: slots go with their TTL, the header by twice it."""
    footprint = footprint_for("memcached", backend_url)
    prefix = footprint.fresh_prefix()
    with corral.connect(backend_url, prefix=prefix) as store:
        before = footprint.count(store)
        first: dict[str, int] = {}
        for index in range(60):
            slot = store.semaphore(f"{prefix}:{index}", 1 + index % 4, ttl=1)
            assert slot.acquire() and slot.token is not None
            first[slot.name] = slot.token
            if index % 3 == 1:
                slot.release(hold_for=0.5)
            elif index % 3 == 2:
                pass  # left to expire, as a crashed holder's would
            else:
                slot.release()
        assert footprint.count(store) > before
        time.sleep(2 * 1 + TTL_MARGIN + 1.2)  # the header: T(2 * ttl), and memcached's tick
        # What stays: the fencing counter, shared by every name.
        assert footprint.count(store) - before <= 1
        for semaphore_name, token in list(first.items())[:5]:
            again = store.semaphore(semaphore_name, 2, ttl=5)
            assert again.acquire() and again.token is not None and again.token > token
            again.release()


def test_many_clients_never_exceed_the_limit(backend_url: str, name: str) -> None:
    """Four stores (connections) of four threads each hammer one semaphore of 3."""
    limit = 3
    guard = threading.Lock()
    inside: set[str] = set()
    most = 0
    tokens: list[int] = []
    errors: list[BaseException] = []
    stores = [corral.connect(backend_url) for _ in range(4)]
    try:

        def worker(store: corral.Store) -> None:
            nonlocal most
            try:
                for _ in range(6):
                    slot = store.semaphore(name, limit, ttl=30)
                    assert slot.acquire(wait=60)
                    assert slot.owner is not None and slot.token is not None
                    with guard:
                        inside.add(slot.owner)
                        most = max(most, len(inside))
                        tokens.append(slot.token)
                    info = store.semaphore_info(name)
                    assert info is not None and len(info.holders) <= limit
                    time.sleep(0.002)
                    with guard:
                        inside.discard(slot.owner)
                    slot.release()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(s,)) for s in stores for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for opened in stores:
            opened.close()
    assert not errors, errors
    assert len(tokens) == 96 and len(set(tokens)) == 96
    assert 1 <= most <= limit


def test_a_limit_that_loses_the_race_for_the_header_gives_its_slot_back(
    backend_url: str,
    store: corral.Store,
    other_store: corral.Store,
    name: str,
    interfere: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two limits on a free semaphore at once: only one becomes its identity."""
    # Each takes the last free slot it saw: the winner slot 2, the loser slot 1, so the
    # loser's take succeeds and only the header tells it that it lost.
    monkeypatch.setattr(memcached_slots.random, "choice", lambda seq: seq[-1])
    given_back: list[int] = []
    give_back = MemcachedSemaphores._give_back

    def spy(self: MemcachedSemaphores, call: Any, keys: Any, index: int, stored: Reply) -> None:
        given_back.append(index)
        give_back(self, call, keys, index, stored)

    monkeypatch.setattr(MemcachedSemaphores, "_give_back", spy)
    winner = other_store.semaphore(name, 3, ttl=30)

    def first_the_other_limit() -> None:  # between the probe and the take
        assert winner.acquire()

    header = semaphore_keys("corral", name).header
    fired = interfere(b"ms " + header.encode() + b" ", first_the_other_limit)
    loser = store.semaphore(name, 2, ttl=30)
    with pytest.raises(ConfigError, match="limit=3"):
        loser.acquire()
    assert fired and not loser.held and given_back == [1]
    info = store.semaphore_info(name)
    assert info is not None and info.limit == 3
    assert [holder.owner for holder in info.holders] == [winner.owner]
    replies = raw(backend_url, *(request("mg", key, "v") for key in slot_keys(name, 3)))
    limits = {decode_slot(r.value)[1] for r in replies if r.value}  # type: ignore[index]
    assert limits == {3}  # the loser's slot, if it took one, is gone
    winner.release()


def test_a_stale_header_yields_to_a_new_limit(
    backend_url: str, store: corral.Store, name: str
) -> None:
    """After the last release the header lingers; a new limit replaces it, smaller or larger."""
    for limit in (4, 2, 5):
        slot = store.semaphore(name, limit, ttl=30)
        assert slot.acquire()
        info = store.semaphore_info(name)
        assert info is not None and info.limit == limit
        slot.release()


def test_release_finds_its_slot_without_the_remembered_index(
    store: corral.Store, other_store: corral.Store, name: str
) -> None:
    slots = [store.semaphore(name, 3, ttl=30) for _ in range(2)]
    for slot in slots:
        assert slot.acquire()
    semaphores = store.backend._semaphores  # type: ignore[attr-defined]
    semaphores._remembered = type(semaphores._remembered)()  # as after the cache dropped them
    slots[0].extend(ttl=20)
    slots[0].release()
    slots[1].release()
    assert store.semaphore_info(name) is None


async def test_cancelled_semaphore_attempt_takes_no_slot(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = async_conn.Connection.call
    taking = asyncio.Event()
    taken = asyncio.Event()

    async def slow_take(
        self: async_conn.Connection, deadline: float, *requests: bytes
    ) -> list[Reply]:
        if not any(is_slot_take(line, name, 2) for line in requests):
            return await original(self, deadline, *requests)
        taking.set()
        await asyncio.sleep(0.3)
        try:
            return await original(self, deadline, *requests)
        finally:
            taken.set()

    monkeypatch.setattr(async_conn.Connection, "call", slow_take)
    async with corral.aio.connect(backend_url) as store:
        task = asyncio.create_task(store.semaphore(name, 2, ttl=60).acquire())
        await asyncio.wait_for(taking.wait(), 10)  # the take is on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The attempt goes on in a task of its own and takes the slot; the undo then
        # gives it back, in the background, long before its 60 s TTL.
        await asyncio.wait_for(taken.wait(), 10)
        for _ in range(100):
            if await store.semaphore_info(name) is None:
                break
            await asyncio.sleep(0.05)
        assert await store.semaphore_info(name) is None
        slots = [store.semaphore(name, 2, ttl=5) for _ in range(2)]
        for slot in slots:
            assert await slot.acquire()  # both slots are free
        for slot in slots:
            await slot.release()


def test_semaphore_round_trips(store: corral.Store, name: str, round_trips: list[int]) -> None:
    store.lock_info(name)  # opens the pooled connection: its greeting is not counted below

    def cost(action: Callable[[], object]) -> int:
        round_trips.clear()
        action()
        return len(round_trips)

    slots = [store.semaphore(name, 2, ttl=30) for _ in range(3)]
    assert cost(slots[0].acquire) == 2  # free: probe every slot, then take one
    assert cost(slots[1].acquire) == 2
    assert cost(slots[2].acquire) == 1  # full: the probe says so
    assert round_trips == [1 + 2 + 1 + 1]  # one write: header, two slots, queue, counter
    assert cost(slots[0].extend) == 2
    assert cost(lambda: store.semaphore_info(name)) == 2  # the header, then its slots
    assert cost(slots[0].release) == 2
    assert cost(lambda: store.force_release_semaphore(name)) == 1


def test_a_lost_header_comes_back_with_the_next_extension(
    backend_url: str, store: corral.Store, name: str
) -> None:
    """As after an eviction of the header alone: readers see nothing until it is written."""
    long = store.semaphore(name, 2, ttl=60)
    short = store.semaphore(name, 2, ttl=1)
    assert long.acquire() and short.acquire()
    header = semaphore_keys("corral", name).header
    (kept,) = raw(backend_url, request("mg", header, "t"))
    assert kept.number("t") >= 60  # a shorter holder never lowers it
    assert raw(backend_url, request("md", header))[0].code == b"HD"
    assert store.semaphore_info(name) is None  # readers go by the header
    short.extend()
    info = store.semaphore_info(name)
    assert info is not None and info.limit == 2 and len(info.holders) == 2
    with pytest.raises(ConfigError, match="limit=2"):
        store.semaphore(name, 3).acquire()
    long.release()
    short.release()


def test_a_holder_of_the_headers_limit_is_seen_by_a_racer_replacing_a_stale_header(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit-3 holder takes slot 2 while a limit-2 attempt, having found the header "3"
    stale, replaces it: the limit-2 attempt must see the holder, give its slot back and
    put the header back, so that no limit-2 holder ever sits beside a limit-3 one."""
    stores = [corral.connect(backend_url) for _ in range(4)]
    try:
        x, y, z, h = (store.backend._semaphores for store in stores)  # type: ignore[attr-defined]
        assert h.try_acquire(name, "h", 30, 3).acquired
        assert h.release(name, "h") is Outcome.OK  # the header "3" lingers
        real_session = x.client.session
        calls = itertools.count(1)

        def session(*args: Any, **kwargs: Any) -> Any:
            import contextlib

            @contextlib.contextmanager
            def wrapped_session() -> Iterator[Callable[..., Any]]:
                with real_session(*args, **kwargs) as call:

                    def wrapped(*requests: bytes) -> Any:
                        if next(calls) == 3:  # just before the limit-2 take
                            with monkeypatch.context() as patch:
                                patch.setattr(memcached_slots.random, "choice", lambda seq: seq[-1])
                                # takes slot 2
                                assert y.try_acquire(name, "y", 30, 3).acquired
                        return call(*requests)

                    yield wrapped

            return wrapped_session()

        monkeypatch.setattr(x.client, "session", session)
        attempt = x.try_acquire(name, "x", 30, 2)
        monkeypatch.undo()
        assert not attempt.acquired and attempt.limit == 3
        later = z.try_acquire(name, "z", 30, 2)
        assert not later.acquired and later.limit == 3
        info = stores[0].semaphore_info(name)
        assert info is not None and info.limit == 3
        assert [holder.owner for holder in info.holders] == ["y"]
    finally:
        for store in stores:
            store.close()


# -- cache entries: an item per entry, a counter per namespace ------------------------

CODEC = make_codec("json", None)


def cache_entry(key: str, value: object, *, fresh_for: float = 30, generation: int = 0) -> bytes:
    return encode(
        value, CODEC, key, fresh_until=time.time() + fresh_for, delta=0.01, generation=generation
    )


def cache_claim(name: str, owner: str | None = None) -> Claim:
    return Claim(f"recompute-{name}", owner or f"owner-{name}", 10.0, time.time())


def test_plain_cache_keys_stay_readable_and_apart_from_every_other_key() -> None:
    assert cache_key("corral", "users:1") == "corral:cache:users:1"
    assert generation_key("corral", "users") == "corral:gen:users"
    name = "report"
    others = {
        *lock_keys("corral", name)[:2],
        semaphore_keys("corral", name).header,
        semaphore_keys("corral", name).queue,
        semaphore_keys("corral", name).slot(0),
        fence_key("corral"),
    }
    assert cache_key("corral", name) not in others
    assert generation_key("corral", name) not in others
    assert cache_key("corral", name) != generation_key("corral", name)


@pytest.mark.parametrize("key", [*AWKWARD_NAMES, "x" * 10_000, "k\x00", ""])
def test_awkward_cache_keys_are_hashed_into_valid_keys(key: str) -> None:
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    for made, kind in ((cache_key("app", key), "cache"), (generation_key("app", key), "gen")):
        assert re.fullmatch(r"[\x21-\x7e]+", made), made
        assert len(made.encode()) <= MAX_KEY_BYTES
        if re.fullmatch(r"[\x21-\x7e]*", key) and len(key) < 200:
            assert made == f"app:{kind}:{key}"
        else:
            assert made.startswith(f"app:{kind}#") and made.endswith(f"#{digest}")
    assert cache_key("app", key) == cache_key("app", key)  # deterministic


def test_hashed_and_plain_cache_keys_never_collide() -> None:
    keys = [*AWKWARD_NAMES, "x" * 237, "x" * 238, "x" * 10_000, "x" * 10_001, "has_space"]
    # A plain key that spells out another key's hashed form stays apart.
    keys.append(cache_key("corral", "has space").removeprefix("corral:cache:"))
    keys.append(cache_key("corral", "has space").removeprefix("corral:"))
    made = {cache_key("corral", key) for key in keys} | {generation_key("corral", k) for k in keys}
    assert len(made) == 2 * len(keys)


@pytest.mark.parametrize("keep", [0.001, 0.3, 1, 1.0000001, 2.5, 300, 86400.5])
def test_entry_ttl_keeps_an_entry_at_least_keep_seconds(keep: float) -> None:
    # memcached may end an item given T<n> up to 2 ticks (almost 2 s) early.
    assert entry_ttl(keep) == server_ttl(keep)
    assert entry_ttl(keep) - TTL_MARGIN >= keep - 1e-6
    assert entry_ttl(keep) - TTL_MARGIN < keep + 1


def test_entry_ttl_past_30_days_is_a_unix_time_and_past_2038_no_expiry() -> None:
    now = time.time()
    assert entry_ttl(30 * 86400 - TTL_MARGIN) == 30 * 86400
    assert 0 <= entry_ttl(40 * 86400) - now - (40 * 86400 + TTL_MARGIN) <= 2
    assert entry_ttl(2**31 - now + 10) == 0  # memcached's T0: kept until deleted or evicted
    assert entry_ttl(float("inf")) == 0


def test_many_requests_are_split_into_bounded_writes() -> None:
    batches = memcached_cache.batches
    small = [b"x" * 100] * 1000
    by_bytes = list(batches(small, max_bytes=memcached_cache.BATCH_BYTES))
    assert [r for batch in by_bytes for r in batch] == small
    assert all(sum(map(len, batch)) <= memcached_cache.BATCH_BYTES for batch in by_bytes)
    assert len(by_bytes) == -(-100_000 // memcached_cache.BATCH_BYTES)
    assert list(batches([b"y" * 50_000, b"z"], max_bytes=10)) == [[b"y" * 50_000], [b"z"]]
    by_count = list(batches(small, max_count=300))
    assert [len(batch) for batch in by_count] == [300, 300, 300, 100]
    assert list(batches(small[:5])) == [small[:5]]
    assert list(batches([])) == []


def test_cache_entries_live_under_their_own_keys_and_respect_the_prefix(
    backend_url: str, name: str
) -> None:
    with (
        corral.connect(backend_url, prefix="app-a") as a,
        corral.connect(backend_url, prefix="app-b") as b,
    ):
        key = f"ns:{name}"
        data = cache_entry(key, "a")
        a.backend.cache_store([(key, data, 60)])
        (found,) = raw(backend_url, request("mg", f"app-a:cache:{key}", "v"))
        assert found.value == data
        assert b.backend.cache_fetch([key], "g") == ([None], 0)
        generation = a.backend.cache_clear(f"gen-{name}")
        (counter,) = raw(backend_url, request("mg", f"app-a:gen:gen-{name}", "v"))
        assert counter.value == b"%d" % generation
        assert b.backend.cache_fetch([], f"gen-{name}") == ([], 0)
        # A lock of the same name as the entry's key is another key.
        assert a.lock(key, ttl=10).acquire()
        assert a.backend.cache_fetch([key], "g")[0] == [data]


def test_odd_and_long_keys_work_on_the_server(store: corral.Store, name: str) -> None:
    keys = [f"ns:{name} {odd}" for odd in [*AWKWARD_NAMES, "z" * 10_000]]
    keys.append(keys[-1][:-1] + "!")  # differs only past the readable part
    items = [(key, cache_entry(key, i), 60.0) for i, key in enumerate(keys)]
    store.backend.cache_store(items)
    found, _ = store.backend.cache_fetch(keys, f"gen {name}\x00\udcff")
    assert found == [data for _, data, _ in items]
    for key in keys:
        assert store.backend.cache_invalidate(key, 30)
        assert store.backend.cache_delete(key)
    assert store.backend.cache_fetch(keys, "g")[0] == [None] * len(keys)
    assert store.backend.cache_clear(f"gen {name}\x00\udcff") >= 1


def test_the_server_keeps_an_entry_ceil_keep_plus_2_seconds(
    store: corral.Store, backend_url: str, name: str
) -> None:
    def kept(keep: float) -> int:
        key = f"ns:{name}:{keep}"
        store.backend.cache_store([(key, cache_entry(key, 1), keep)])
        (found,) = raw(backend_url, request("mg", cache_key("corral", key), "t"))
        return found.number("t")

    assert kept(1.2) in (3, 4)  # T4: 1.2 rounded up, and the 2 s margin for the tick
    assert kept(0.01) in (2, 3)
    # Sent as a Unix time: the server subtracts its own clock, which ticks once a second
    # and falls a few seconds behind on a loaded machine, so the remainder can read high.
    assert kept(40 * 86400) in range(40 * 86400, 40 * 86400 + 15)
    assert kept(float("inf")) == -1  # never expires (still evictable)
    key = f"ns:{name}:invalidated"
    store.backend.cache_store([(key, cache_entry(key, 1), 600)])
    assert store.backend.cache_invalidate(key, 1.2)
    (found,) = raw(backend_url, request("mg", cache_key("corral", key), "t"))
    assert found.number("t") in (3, 4)


def test_cache_round_trips(store: corral.Store, name: str, round_trips: list[int]) -> None:
    backend = store.backend
    store.lock_info(name)  # opens the pooled connection: its greeting is not counted below
    keys = [f"ns:{name}:{i}" for i in range(50)]

    def cost(action: Callable[[], object]) -> int:
        round_trips.clear()
        action()
        return len(round_trips)

    items = [(key, cache_entry(key, i), 60.0) for i, key in enumerate(keys)]
    assert cost(lambda: backend.cache_store(items)) == 1
    assert cost(lambda: backend.cache_store([*items, (f"ns:{name}:gone", b"", 0)])) == 1
    assert cost(lambda: backend.cache_fetch([*keys, f"ns:{name}:missing"], f"g-{name}")) == 1
    assert cost(lambda: backend.cache_fetch([], f"g-{name}")) == 1
    assert cost(lambda: backend.cache_clear(f"g-{name}")) == 1
    assert cost(lambda: backend.cache_delete(keys[0])) == 1
    assert cost(lambda: backend.cache_invalidate(keys[1], 30)) == 2
    assert cost(lambda: backend.cache_invalidate(keys[2], 0)) == 1
    # A read whose entry is fresh (written under generation 0, never cleared) claims nothing:
    # one round trip.
    never_cleared = f"other-{name}"
    assert cost(lambda: backend.cache_read(keys[3], never_cleared, cache_claim(name))) == 1
    # A due read (here: missing) then tries the lock: the attempt on a free lock costs two.
    assert cost(lambda: backend.cache_read(keys[0], never_cleared, cache_claim(name))) == 3
    # ... and one on a held lock.
    other = cache_claim(name, "someone-else")
    assert cost(lambda: backend.cache_read(keys[0], never_cleared, other)) == 2


def test_very_many_keys_are_read_in_writes_the_sockets_can_hold(
    store: corral.Store, name: str, round_trips: list[int]
) -> None:
    keys = [f"ns:{name}:{i:05d}:" + "k" * 200 for i in range(1500)]
    items = [(key, cache_entry(key, "v" * 3000), 60.0) for key in keys]
    store.backend.cache_store(items)
    round_trips.clear()
    found, generation = store.backend.cache_fetch(keys, f"gen-{name}")
    assert found == [data for _, data, _ in items] and generation == 0
    # About 260 bytes a read: a dozen writes of at most BATCH_BYTES, not one of 390 KB.
    assert sum(round_trips) == len(keys) + 1 and len(round_trips) >= 12


def test_large_values_round_trip_and_one_over_the_limit_is_refused_clearly(
    store: corral.Store, name: str
) -> None:
    backend = store.backend
    key = f"ns:{name}"
    near = cache_entry(key, "x") + os.urandom(1_000_000)
    backend.cache_store([(key, near, 60)])
    assert backend.cache_fetch([key], "g")[0] == [near]
    client = locks_of(store).client
    assert client.item_size_max == 1024 * 1024  # memcached's default -I, read on connecting
    over = near + os.urandom(1_100_000)
    began = time.monotonic()
    with pytest.raises(BackendError, match=r"item size limit of 1048576 bytes.*-I") as caught:
        backend.cache_store([(key + "-small", b"small", 60), (key + "-big", over, 60)])
    assert f"{key}-big" in str(caught.value) and str(len(over)) in str(caught.value)
    assert backend.cache_fetch([key + "-small"], "g")[0] == [None]  # refused before sending
    # Just under the limit by the value's length, over it with the item's own overhead: the
    # server refuses it (and reads past it), and says so.
    barely = b"b" * (1024 * 1024 - 10)
    with pytest.raises(BackendError, match=r"item size limit.*too large.*-I"):
        backend.cache_store([(key + "-a", b"a", 60), (key + "-barely", barely, 60)])
    assert time.monotonic() - began < 5
    assert backend.cache_fetch([key + "-a", key], "g")[0] == [b"a", near]  # still usable


def test_invalidate_rewrites_only_fresh_until_by_compare_and_swap(
    store: corral.Store, other_store: corral.Store, name: str, interfere: Any
) -> None:
    key = f"ns:{name}"
    first = cache_entry(key, "first", fresh_for=300)
    second = cache_entry(key, "second", fresh_for=300)
    store.backend.cache_store([(key, first, 600)])

    def store_meanwhile() -> None:  # another client stores a new value between read and write
        other_store.backend.cache_store([(key, second, 600)])

    fired = interfere(b"ms " + cache_key("corral", key).encode() + b" ", store_meanwhile)
    assert store.backend.cache_invalidate(key, 60)
    assert fired
    ((found,), _) = store.backend.cache_fetch([key], "g")
    assert found is not None and found[HEADER_SIZE:] == second[HEADER_SIZE:]  # not the old one
    header = decode_header(found)
    assert header is not None and header.fresh_until == 0.0
    assert found[19:] == second[19:]


def test_invalidate_deletes_bytes_corral_did_not_write(store: corral.Store, name: str) -> None:
    key = f"ns:{name}"
    store.backend.cache_store([(key, b"c1 but too short", 600)])
    assert store.backend.cache_invalidate(key, 60)
    assert store.backend.cache_fetch([key], "g")[0] == [None]


def test_a_first_clear_starts_at_the_time_and_a_lost_counter_restarts_above(
    store: corral.Store, backend_url: str, name: str
) -> None:
    gen_key = f"gen-{name}"
    before = time.time_ns() // 1000
    first = store.backend.cache_clear(gen_key)
    assert before <= first <= time.time_ns() // 1000
    assert store.backend.cache_clear(gen_key) == first + 1
    # Evicted (or flushed) while entries written under it survive: the next clear must not
    # hand out a generation those entries carry.
    key = f"ns:{name}"
    store.backend.cache_store([(key, cache_entry(key, 1, generation=first + 1), 600)])
    assert raw(backend_url, request("md", generation_key("corral", gen_key)))[0].code == b"HD"
    assert store.backend.cache_fetch([], gen_key)[1] == 0
    assert store.backend.cache_clear(gen_key) > first + 1


def test_raise_generation_never_lowers_and_never_undoes_a_clear(
    store: corral.Store, other_store: corral.Store, backend_url: str, name: str, interfere: Any
) -> None:
    backend = store.backend
    gen_key = f"gen-{name}"
    where = generation_key("corral", gen_key)
    assert backend.cache_raise_generation(gen_key, 0) == 0  # nothing to raise: not created
    assert raw(backend_url, request("mg", where))[0].code == b"EN"
    assert backend.cache_raise_generation(gen_key, 5) == 5  # no counter yet: created
    assert backend.cache_fetch([], gen_key)[1] == 5
    assert backend.cache_raise_generation(gen_key, 3) == 5  # never lowered
    assert backend.cache_clear(gen_key) == 6  # still a counter `ma` increments
    (found,) = raw(backend_url, request("mg", where, "t"))
    assert found.number("t") == -1  # kept with no expiry, as a clear's counter is

    def two_clears() -> None:  # between the read and the compare-and-swap
        other_store.backend.cache_clear(gen_key)
        other_store.backend.cache_clear(gen_key)

    fired = interfere(b"ms " + where.encode(), two_clears)
    assert backend.cache_raise_generation(gen_key, 7) == 8  # read again: 8 is above 7
    assert fired and backend.cache_fetch([], gen_key)[1] == 8
    assert backend.cache_raise_generation(gen_key, 10**15) == 10**15
    assert backend.cache_clear(gen_key) == 10**15 + 1


def test_a_foreign_generation_counter_is_reported(
    store: corral.Store, backend_url: str, name: str
) -> None:
    gen_key = f"gen-{name}"
    where = generation_key("corral", gen_key)
    raw(backend_url, request("ms", where, "T60", data=b"not a number"))
    with pytest.raises(BackendError, match=r"did not write.*prefix"):
        store.backend.cache_fetch([f"ns:{name}"], gen_key)
    with pytest.raises(BackendError, match=r"did not write.*prefix"):
        store.backend.cache_clear(gen_key)


def test_cache_entries_and_generations_on_restart(
    backend_name: str, start_memcached: Callable[..., CustomMemcached], name: str
) -> None:
    server = start_memcached()
    with corral.connect(server.url, timeout=2) as store:
        key = f"ns:{name}"
        store.backend.cache_store([(key, cache_entry(key, 1), 600)])
        generation = store.backend.cache_clear("g")
        server.restart()
        # The pooled connection died with the server: it is replaced, not reported.
        assert store.backend.cache_fetch([key], "g") == ([None], 0)
        assert store.backend.cache_clear("g") > generation


def test_cache_calls_on_an_unreachable_or_silent_server_fail_within_the_timeout(
    backend_name: str, name: str
) -> None:
    port = servers.free_port()  # nobody listens
    with corral.connect(f"memcached://alice:s3cret@127.0.0.1:{port}", timeout=1) as store:
        calls: list[Callable[[], object]] = [
            lambda: store.backend.cache_fetch([f"ns:{name}"], "g"),
            lambda: store.backend.cache_store([(f"ns:{name}", b"x", 60)]),
            lambda: store.backend.cache_delete(f"ns:{name}"),
            lambda: store.backend.cache_invalidate(f"ns:{name}", 60),
            lambda: store.backend.cache_clear("g"),
            lambda: store.backend.cache_read(f"ns:{name}", "g", cache_claim(name)),
        ]
        for call in calls:
            began = time.monotonic()
            with pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port}") as caught:
                call()
            assert "s3cret" not in str(caught.value)
            assert time.monotonic() - began < 4.5  # short of the 5 s default
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    port = listener.getsockname()[1]
    try:
        with corral.connect(f"memcached://127.0.0.1:{port}", timeout=1) as store:
            began = time.monotonic()
            with pytest.raises(BackendUnavailable, match="did not answer within 1 s"):
                store.backend.cache_fetch([f"ns:{name}"], "g")
            assert time.monotonic() - began < 4.5  # short of the 5 s default
    finally:
        listener.close()
