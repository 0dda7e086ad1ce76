"""A cache server that stops mid-run: calls still answer, none hangs, and it is used again.

SPEC: with the cache server unreachable, `get_or_compute` computes through,
`get` returns the default, `set` is dropped, each counted in `backend_errors`,
none waiting past the socket timeout; when the server returns, the cache is
used again without a restart of the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

import corral
import corral.aio
from tests.conftest import start_server
from tests.faults.test_faults import FLAVOURS

pytestmark = [pytest.mark.capability("cache", "cross_host"), pytest.mark.slow]

TIMEOUT = 1.0
# What "no hang" means here: a call may meet a connect and a read timeout, a
# waiter a re-check; a hang (or a timeout multiplied by retries) is far beyond.
HANG = 5 * TIMEOUT + 2


def test_a_stopped_server_degrades_the_cache_and_its_return_restores_it(
    backend_name: str, tmp_path: Path, name: str
) -> None:
    server = start_server(backend_name, tmp_path)
    try:
        with corral.connect(server.url, timeout=TIMEOUT) as store:
            cache = store.cache(name, ttl=30)
            calls = []

            def compute() -> int:
                calls.append(1)
                return len(calls)

            assert cache.get_or_compute("k", compute) == 1
            assert cache.get_or_compute("k", compute) == 1
            # A cluster cannot be started again member by member here: pause it instead.
            restartable = hasattr(server, "start")
            if restartable:
                server.stop()
            else:
                server.pause()
            slowest = 0.0
            for _ in range(3):
                began = time.monotonic()
                assert cache.get_or_compute("k", compute) >= 2  # computed through
                assert cache.get("k", default="default") == "default"
                cache.set("k", 5)  # dropped, not raised
                assert cache.get_many(["k"]) == {}
                slowest = max(slowest, time.monotonic() - began)
            with pytest.raises(corral.BackendUnavailable):
                cache.delete("k")
            assert slowest < HANG, f"a call waited {slowest:.1f} s on a dead server"
            errors = cache.stats()["backend_errors"]
            assert errors >= 9
            if restartable:
                server.start()
            else:
                server.resume()
            # Used again: a value stored now is read back (reconnecting may take a call).
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                cache.set("back", "again")
                if cache.get("back") == "again":
                    break
                time.sleep(0.2)
            assert cache.get("back") == "again"
            before = len(calls)
            assert cache.get_or_compute("k2", compute) == before + 1
            assert cache.get_or_compute("k2", compute) == before + 1
    finally:
        server.stop()


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("fault", ["stop", "pause"])
def test_waiters_on_a_miss_do_not_hang_when_the_server_goes(
    backend_name: str, tmp_path: Path, name: str, flavour: str, fault: str
) -> None:
    """One caller computes slowly while others wait for it; then the server goes away.

    The waiters must come back (computing through, or with the winner's value),
    not wait for a release nobody can deliver.
    """
    server = start_server(backend_name, tmp_path)
    try:
        if flavour == "sync":
            elapsed = _sync_scenario(server.url, name, getattr(server, fault))
        else:
            elapsed = asyncio.run(_async_scenario(server.url, name, getattr(server, fault)))
    finally:
        if fault == "pause":
            server.resume()
        server.stop()
    assert max(elapsed) < HANG + 3, elapsed


def _sync_scenario(url: str, name: str, fault: object) -> list[float]:
    import threading

    results: list[object] = []
    elapsed: list[float] = []
    stores = [corral.connect(url, timeout=TIMEOUT) for _ in range(3)]
    try:

        def slow() -> str:
            time.sleep(2.0)
            return "slow"

        def call(store: corral.Store) -> None:
            began = time.monotonic()
            try:
                results.append(store.cache(name, lock_wait=30).get_or_compute("k", slow))
            except Exception as exc:  # the winner's release may fail: that is allowed
                results.append(exc)
            elapsed.append(time.monotonic() - began)

        threads = [threading.Thread(target=call, args=(s,), daemon=True) for s in stores]
        for thread in threads:
            thread.start()
            time.sleep(0.2)
        time.sleep(0.3)
        began = time.monotonic()
        fault()  # type: ignore[operator]
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive(), "a caller hung on a dead server"
        assert time.monotonic() - began < 60
        assert all(result == "slow" for result in results), results
        return elapsed
    finally:
        for store in stores:
            with contextlib.suppress(corral.CorralError):
                store.close()


async def _async_scenario(url: str, name: str, fault: object) -> list[float]:
    stores = [corral.aio.connect(url, timeout=TIMEOUT) for _ in range(3)]
    try:

        async def slow() -> str:
            await asyncio.sleep(2.0)
            return "slow"

        async def call(store: corral.aio.AsyncStore) -> float:
            began = time.monotonic()
            assert await store.cache(name, lock_wait=30).get_or_compute("k", slow) == "slow"
            return time.monotonic() - began

        tasks = []
        for store in stores:
            tasks.append(asyncio.create_task(call(store)))
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(fault)  # type: ignore[arg-type]
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))
    finally:
        for store in stores:
            with contextlib.suppress(corral.CorralError):
                await store.aclose()
