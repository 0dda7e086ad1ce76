# Generated from tests/_async/test_pool_review.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Pools of servers under failure, in this flavour: what a batch read keeps when one server
of the pool is stopped.

The test pauses (SIGSTOP) a server of a small pool of its own and resumes it before it ends.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from corral import connect
from corral.core.ring import Ring
from corral.testing import servers
from tests.conftest import server_missing

FAST = {"timeout": 0.5, "failure_limit": 2, "retry_after": 60}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerPool]:
    try:
        started = servers.start_memcached_pool(tmp_path_factory.mktemp("reviewpool"), 3)
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
    yield started
    started.stop()


def test_get_many_keeps_the_answers_of_the_servers_that_answered(
    pool: servers.ServerPool,
) -> None:
    # One stopped server must cost a batch read its own keys, not every key of the batch:
    # a failure degrades, it does not cascade to the servers that answered.
    victim = pool.members[1]
    ring = Ring([f"{m.host}:{m.port}" for m in pool.members])
    namespace = f"review-{uuid.uuid4().hex[:10]}"
    keys = [f"k{i}" for i in range(30)]
    elsewhere = {
        key for key in keys if ring.locate(f"{namespace}:{key}") != f"{victim.host}:{victim.port}"
    }
    assert elsewhere and len(elsewhere) < len(keys)
    with connect(pool.url, **FAST) as store:
        cache = store.cache(namespace)
        cache.set_many({key: key.upper() for key in keys})
        victim.pause()
        try:
            found = cache.get_many(keys)
            assert cache.stats()["backend_errors"] == 1
        finally:
            victim.resume()
    assert found == {key: key.upper() for key in elsewhere}
