"""Real faults, on every backend whose locks cross processes: SIGKILL, SIGSTOP, races.

Written once; a backend added to the contract suite inherits every test here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import corral
import corral.aio
from tests.conftest import start_server

pytestmark = pytest.mark.capability("cross_process")

ROOT = Path(__file__).resolve().parents[2]
FLAVOURS = ["sync", "async"]


class Holder:
    """A child process running tests/faults/holder.py."""

    def __init__(self, url: str, name: str, mode: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.holder", url, name, mode, *extra],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = self.proc.stdout.readline()
        assert raw, f"holder exited early with status {self.proc.wait()}"
        result: dict[str, Any] = json.loads(raw)
        return result

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        if holder.proc.poll() is None:
            os.kill(holder.proc.pid, signal.SIGCONT)
        holder.stop()


@pytest.fixture
def store(backend_url: str) -> Iterator[corral.Store]:
    with corral.connect(backend_url) as opened:
        yield opened


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_killed_holder_frees_the_lock_after_its_ttl_not_before(
    backend_url: str, store: corral.Store, name: str, holders: list[Holder], flavour: str
) -> None:
    holder = Holder(backend_url, name, "hold", "--ttl", "5", "--flavour", flavour)
    holders.append(holder)
    token = holder.line()["token"]
    os.kill(holder.proc.pid, signal.SIGKILL)
    holder.proc.wait()
    lock = store.lock(name, ttl=10)
    assert not lock.acquire(), "a SIGKILLed holder's lock was free before its TTL"
    info = store.lock_info(name)
    assert info is not None and info.token == token
    time.sleep(1.0)
    info = store.lock_info(name)
    assert info is not None and info.token == token, "freed before its TTL ran out"
    assert lock.acquire(wait=15)
    assert lock.token is not None and lock.token > token
    lock.release()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_stopped_holder_past_its_ttl_finds_the_lock_lost(
    backend_url: str, store: corral.Store, name: str, holders: list[Holder], flavour: str
) -> None:
    holder = Holder(backend_url, name, "stdin", "--ttl", "1", "--flavour", flavour)
    holders.append(holder)
    old_token = holder.line()["token"]
    os.kill(holder.proc.pid, signal.SIGSTOP)
    lock = store.lock(name, ttl=30)
    assert lock.acquire(wait=15)
    assert lock.token is not None and lock.token > old_token
    os.kill(holder.proc.pid, signal.SIGCONT)
    holder.send("go\n")
    assert holder.line() == {"extend": "LockLost", "release": "LockLost"}
    assert lock.owned()  # the stale holder's release freed nothing
    lock.release()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_racing_processes_never_overlap_and_tokens_increase(
    backend_url: str, name: str, holders: list[Holder], flavour: str
) -> None:
    workers = [
        Holder(backend_url, name, "worker", "--cycles", "15", "--ttl", "30", "--flavour", flavour)
        for _ in range(8)
    ]
    holders.extend(workers)
    records = []
    for worker in workers:
        assert worker.proc.stdout is not None
        out, _ = worker.proc.communicate(timeout=180)
        assert worker.proc.returncode == 0, out
        records.extend(json.loads(line) for line in out.splitlines())
    assert len(records) == 8 * 15
    records.sort(key=lambda r: r["start"])
    for before, after in itertools.pairwise(records):
        assert before["end"] <= after["start"], f"two holders overlapped: {before} {after}"
        assert before["token"] < after["token"], f"tokens went backwards: {before} {after}"


TIMEOUT = 1.0


def wait_on_dead_server(url: str, name: str, flavour: str, fault: Callable[[], None]) -> float:
    """Hold the lock, start a waiter that would wait forever, inflict `fault` on the server,
    and return how long the waiter took to fail with BackendUnavailable after it."""
    if flavour == "sync":
        with corral.connect(url, timeout=TIMEOUT) as store:
            assert store.lock(name, ttl=60).acquire()
            outcome: list[BaseException | None] = []

            def waiter() -> None:
                try:
                    store.lock(name, ttl=60).acquire(wait=None)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=waiter, daemon=True)
            thread.start()
            time.sleep(0.5)
            assert thread.is_alive()
            fault()
            began = time.monotonic()
            thread.join(60)
            assert not thread.is_alive(), "the waiter hung on a dead server"
            elapsed = time.monotonic() - began
            assert isinstance(outcome[0], corral.BackendUnavailable), outcome
            hosts = urlsplit(url).netloc.rpartition("@")[2].split(",")
            assert any(host in str(outcome[0]) for host in hosts)  # names the server
            return elapsed

    async def scenario() -> float:
        async with corral.aio.connect(url, timeout=TIMEOUT) as store:
            assert await store.lock(name, ttl=60).acquire()
            task = asyncio.create_task(store.lock(name, ttl=60).acquire(wait=None))
            await asyncio.sleep(0.5)
            assert not task.done()
            await asyncio.to_thread(fault)
            began = time.monotonic()
            with pytest.raises(corral.BackendUnavailable):
                await asyncio.wait_for(task, 60)
            return time.monotonic() - began

    return asyncio.run(scenario())


@pytest.mark.capability("cross_host")
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("fault", ["stop", "pause"])
def test_server_lost_while_waiting_fails_within_the_timeout(
    backend_name: str, tmp_path: Path, name: str, flavour: str, fault: str
) -> None:
    server = start_server(backend_name, tmp_path)
    try:
        elapsed = wait_on_dead_server(server.url, name, flavour, getattr(server, fault))
    finally:
        server.stop()
    # SPEC: BackendUnavailable "within the configured timeout, never a hang". A waiter
    # re-checks at least every second, then fails within one timeout; the margin is
    # wide, since what this catches is a hang or a timeout multiplied by retries.
    assert elapsed < 5 * TIMEOUT + 2


@pytest.mark.capability("cross_host")
def test_renewal_rides_out_a_short_server_stall(
    backend_name: str, tmp_path: Path, name: str
) -> None:
    """A renewal that times out is retried while the lease lasts, and the lock is kept."""
    server = start_server(backend_name, tmp_path)
    try:
        with corral.connect(server.url, timeout=0.5) as store:
            lost: list[corral.Lock] = []
            lock = store.lock(name, ttl=4, auto_renew=True, on_lost=lost.append)
            assert lock.acquire()
            time.sleep(1.5)  # the first renewal (at ttl/3) has happened
            server.pause()
            time.sleep(1.5)  # the next renewal times out at least once
            server.resume()
            time.sleep(4.5)  # well past the TTL of the last successful renewal
            assert lost == []
            assert lock.owned()
            other = store.lock(name, ttl=5)
            assert not other.acquire()
            lock.release()
    finally:
        server.stop()
