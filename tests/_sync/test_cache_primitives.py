# Generated from tests/_async/test_cache_primitives.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""What every backend's cache primitives promise, called directly.

The cache policy above them (tests/core/test_cachepolicy.py) and the public
cache API (test_cache_contract.py) rely on exactly these promises: entries are
bytes kept for `keep` seconds by the server, a read returns the namespace's
generation with them, a claim tries the recompute lock only when the entry is
due, `invalidate` rewrites freshness in place and `clear` bumps the generation.
"""

from __future__ import annotations

import time

import pytest

from corral import Store
from corral.core.envelope import decode_header, encode, make_codec
from corral.core.primitives import Claim
from tests._sync.concurrency import sleep

pytestmark = pytest.mark.capability("cache")

CODEC = make_codec("json", None)


def entry(key: str, value: object, *, fresh_for: float, generation: int = 0) -> bytes:
    return encode(
        value, CODEC, key, fresh_until=time.time() + fresh_for, delta=0.05, generation=generation
    )


def dropped_by(store: Store, key: str, deadline: float) -> bool:
    """Whether the server has dropped `key` by the `time.monotonic()` deadline: polled,
    since most servers drop it long before their TTL slack has run out."""
    while True:
        if (store.backend.cache_fetch([key], "g"))[0] == [None]:
            return True
        if time.monotonic() >= deadline:
            return False
        sleep(0.1)


def claim(name: str, due_before: float | None = None) -> Claim:
    return Claim(
        lock=f"recompute-{name}",
        owner=f"owner-{name}",
        ttl=10.0,
        due_before=time.time() if due_before is None else due_before,
    )


def test_store_then_fetch_returns_the_bytes_and_generation_0(
    store: Store, other_store: Store, name: str
) -> None:
    backend = store.backend
    data = entry(f"ns:{name}", {"n": 1}, fresh_for=30)
    backend.cache_store([(f"ns:{name}", data, 60.0)])
    found, generation = other_store.backend.cache_fetch(
        [f"ns:{name}", f"ns:{name}-missing"], f"gen-{name}"
    )
    assert found == [data, None]
    assert generation == 0


def test_store_many_and_fetch_many_keep_order(store: Store, name: str) -> None:
    backend = store.backend
    keys = [f"ns:{name}:{i}" for i in range(30)]
    items = [(key, entry(key, i, fresh_for=30), 60.0) for i, key in enumerate(keys)]
    backend.cache_store(items)
    found, _ = backend.cache_fetch([*reversed(keys), "ns:nothing-" + name], f"gen-{name}")
    assert found == [data for _, data, _ in reversed(items)] + [None]


def test_an_entry_is_kept_for_keep_seconds_by_the_server(store: Store, name: str) -> None:
    backend = store.backend
    ttl_slack = store.capabilities.ttl_slack
    key = f"ns:{name}"
    data = entry(key, 1, fresh_for=0.5)
    backend.cache_store([(key, data, 3.0)])  # outlasts a paused process till the fetch
    stored = time.monotonic()
    assert (backend.cache_fetch([key], "g"))[0] == [data]
    assert dropped_by(store, key, stored + 3.0 + ttl_slack + 0.3)


def test_store_replaces_and_delete_removes(store: Store, name: str) -> None:
    backend = store.backend
    key = f"ns:{name}"
    backend.cache_store([(key, entry(key, 1, fresh_for=30), 60.0)])
    second = entry(key, 2, fresh_for=30)
    backend.cache_store([(key, second, 60.0)])
    assert (backend.cache_fetch([key], "g"))[0] == [second]
    assert backend.cache_delete(key) is True
    assert (backend.cache_fetch([key], "g"))[0] == [None]
    assert backend.cache_delete(key) is False


def test_values_of_any_bytes_and_size_round_trip(store: Store, name: str) -> None:
    backend = store.backend
    key = f"ns:{name}"
    data = entry(key, "x", fresh_for=30) + bytes(range(256)) * 2000  # ~0.5 MB, every byte
    backend.cache_store([(key, data, 60.0)])
    assert (backend.cache_fetch([key], "g"))[0] == [data]


@pytest.mark.parametrize(
    "odd",
    ["with spaces", "nul\x00byte", "new\r\nline", "é€😀", "lone \ud800", "{tag}", "x" * 300],
    ids=lambda odd: repr(odd)[:16],
)
def test_any_str_is_a_key_and_neighbours_do_not_collide(store: Store, name: str, odd: str) -> None:
    backend = store.backend
    key = f"ns:{name}-{odd}"
    sibling = key + "!"
    first, second = entry(key, 1, fresh_for=30), entry(sibling, 2, fresh_for=30)
    backend.cache_store([(key, first, 60.0), (sibling, second, 60.0)])
    found, _ = backend.cache_fetch([key, sibling], "g")
    assert found == [first, second]
    assert backend.cache_delete(key)
    assert (backend.cache_fetch([key, sibling], "g"))[0] == [None, second]


def test_clear_bumps_the_generation_seen_by_every_client(
    store: Store, other_store: Store, name: str
) -> None:
    gen_key = f"gen-{name}"
    assert (store.backend.cache_fetch([], gen_key))[1] == 0
    first = store.backend.cache_clear(gen_key)
    assert first >= 1
    assert (other_store.backend.cache_fetch([], gen_key))[1] == first
    second = other_store.backend.cache_clear(gen_key)
    assert second > first
    assert (store.backend.cache_fetch([], gen_key))[1] == second
    # Another namespace's generation is its own.
    assert (store.backend.cache_fetch([], gen_key + "-other"))[1] == 0


def test_invalidate_marks_stale_in_place_and_keeps_the_value(store: Store, name: str) -> None:
    backend = store.backend
    key = f"ns:{name}"
    data = entry(key, {"v": 1}, fresh_for=300)
    backend.cache_store([(key, data, 600.0)])
    assert backend.cache_invalidate(key, 30.0) is True
    (found,), _ = backend.cache_fetch([key], "g")
    assert found is not None
    header = decode_header(found)
    assert header is not None and header.fresh_until == 0.0
    assert found[66:] == data[66:]
    assert found[19:] == data[19:]  # only fresh_until changed
    assert backend.cache_invalidate(key + "-missing", 30.0) is False


def test_invalidate_with_keep_0_deletes(store: Store, name: str) -> None:
    backend = store.backend
    key = f"ns:{name}"
    backend.cache_store([(key, entry(key, 1, fresh_for=300), 600.0)])
    assert backend.cache_invalidate(key, 0.0) is True
    assert (backend.cache_fetch([key], "g"))[0] == [None]


def test_invalidate_shortens_what_the_server_keeps(store: Store, name: str) -> None:
    backend = store.backend
    key = f"ns:{name}"
    backend.cache_store([(key, entry(key, 1, fresh_for=300), 600.0)])
    assert backend.cache_invalidate(key, 1.0)
    invalidated = time.monotonic()
    assert dropped_by(store, key, invalidated + 1.0 + store.capabilities.ttl_slack + 0.3)


def test_a_read_claims_the_lock_of_a_missing_entry(
    store: Store, other_store: Store, name: str
) -> None:
    read = store.backend.cache_read(f"ns:{name}", f"gen-{name}", claim(name))
    assert read.entry is None and read.generation == 0
    assert read.attempt is not None and read.attempt.acquired and read.attempt.token is not None
    info = other_store.lock_info(f"recompute-{name}")
    assert info is not None and info.owner == f"owner-{name}"
    # A second reader finds the lock taken: refused, with the holder's TTL.
    again = other_store.backend.cache_read(
        f"ns:{name}", f"gen-{name}", Claim(f"recompute-{name}", "someone-else", 10.0, time.time())
    )
    assert again.attempt is not None and not again.attempt.acquired
    slack = store.capabilities.ttl_slack
    assert again.attempt.holder_ttl is None or 0 < again.attempt.holder_ttl <= 10.0 + slack + 1
    store.backend.release(f"recompute-{name}", f"owner-{name}")


def test_a_read_of_a_fresh_entry_claims_nothing(store: Store, name: str) -> None:
    key = f"ns:{name}"
    data = entry(key, 1, fresh_for=30)
    store.backend.cache_store([(key, data, 60.0)])
    read = store.backend.cache_read(key, f"gen-{name}", claim(name))
    assert read.entry == data and read.attempt is None
    assert store.lock_info(f"recompute-{name}") is None


def test_a_read_claims_a_stale_entry_and_returns_it(store: Store, name: str) -> None:
    key = f"ns:{name}"
    data = entry(key, 1, fresh_for=-1)  # fresh_until one second ago
    store.backend.cache_store([(key, data, 60.0)])
    read = store.backend.cache_read(key, f"gen-{name}", claim(name))
    assert read.entry == data
    assert read.attempt is not None and read.attempt.acquired


def test_due_before_is_the_policys_choice(store: Store, name: str) -> None:
    """XFetch and the like move `due_before`; the backend only compares."""
    key = f"ns:{name}"
    data = entry(key, 1, fresh_for=30)
    store.backend.cache_store([(key, data, 60.0)])
    read = store.backend.cache_read(key, f"gen-{name}", claim(name, time.time() + 60))
    assert read.entry == data and read.attempt is not None and read.attempt.acquired


def test_a_remembered_error_holds_back_the_claim(store: Store, name: str) -> None:
    key = f"ns:{name}"
    marker = encode(
        None, None, key, fresh_until=0.0, delta=0.0, generation=0, retry_until=time.time() + 30
    )
    store.backend.cache_store([(key, marker, 60.0)])
    read = store.backend.cache_read(key, f"gen-{name}", claim(name))
    assert read.entry == marker and read.attempt is None


def test_an_entry_of_an_older_generation_is_due(store: Store, name: str) -> None:
    key, gen_key = f"ns:{name}", f"gen-{name}"
    store.backend.cache_store([(key, entry(key, 1, fresh_for=30, generation=0), 60.0)])
    generation = store.backend.cache_clear(gen_key)
    read = store.backend.cache_read(key, gen_key, claim(name))
    assert read.generation == generation
    assert read.attempt is not None and read.attempt.acquired


def test_a_foreign_value_is_due(store: Store, name: str) -> None:
    key = f"ns:{name}"
    store.backend.cache_store([(key, b"written by something else", 60.0)])
    read = store.backend.cache_read(key, f"gen-{name}", claim(name))
    assert read.entry == b"written by something else"
    assert read.attempt is not None and read.attempt.acquired


def test_a_claim_takes_a_lock_like_any_other(store: Store, name: str) -> None:
    """The claimed lock is the lock: its token follows the name's, its release wakes waiters."""
    lock = store.lock(f"recompute-{name}", ttl=10)
    assert lock.acquire()
    first = lock.token
    lock.release()
    read = store.backend.cache_read(f"ns:{name}", f"gen-{name}", claim(name))
    assert read.attempt is not None and read.attempt.acquired
    assert first is not None and read.attempt.token is not None and read.attempt.token > first
    assert not store.lock(f"recompute-{name}", ttl=10).acquire()
