"""Behaviour that exists in only one flavour: task cancellation (asyncio) and fork (blocking)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pytest

import corral
import corral.aio
from corral.errors import LockError


async def test_cancelled_waiter_leaves_nothing_behind(backend_url: str, name: str) -> None:
    async with corral.aio.connect(backend_url) as store:
        holder = store.lock(name, ttl=30)
        assert await holder.acquire()
        waiter = store.lock(name, ttl=30)
        task = asyncio.create_task(waiter.acquire(wait=30))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not waiter.held
        info = await store.lock_info(name)
        assert info is not None and info.owner == holder.owner
        await holder.release()
        assert await store.lock_info(name) is None


@pytest.mark.capability("fair")
async def test_cancelled_fair_waiter_does_not_stall_the_queue(backend_url: str, name: str) -> None:
    async with corral.aio.connect(backend_url) as store:
        holder = store.lock(name, ttl=30, fair=True)
        assert await holder.acquire()
        quitter = store.lock(name, ttl=30, fair=True)
        task = asyncio.create_task(quitter.acquire(wait=30))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await holder.release()
        # The cancelled waiter left the queue: a newcomer gets the lock at once.
        newcomer = store.lock(name, ttl=30, fair=True)
        assert await newcomer.acquire(wait=0)
        await newcomer.release()


async def test_cancelled_release_leaves_the_handle_not_holding(backend_url: str, name: str) -> None:
    async with corral.aio.connect(backend_url) as store:
        lock = store.lock(name, ttl=0.5, auto_renew=True)
        assert await lock.acquire()
        task = asyncio.create_task(lock.release())
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert not lock.held
        # Whether or not the delete reached the server, the lock is free by its TTL.
        other = store.lock(name, ttl=5)
        assert await other.acquire(wait=5)
        await other.release()


async def test_async_on_lost_callback_is_awaited(backend_url: str, name: str) -> None:
    seen: list[str] = []

    async def on_lost(lock: corral.aio.AsyncLock) -> None:
        await asyncio.sleep(0)
        seen.append(lock.name)

    async with corral.aio.connect(backend_url) as store:
        lock = store.lock(name, ttl=0.6, auto_renew=True, on_lost=on_lost)
        assert await lock.acquire()
        assert await store.force_release(name)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
        assert seen == [name]


@pytest.mark.capability("cross_process")
def test_forked_child_does_not_own_the_parents_lock(backend_url: str, name: str) -> None:
    with corral.connect(backend_url) as store:
        lock = store.lock(name, ttl=2, auto_renew=True)
        assert lock.acquire()
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            code = 0
            try:
                if lock.held or lock.token is not None:
                    code = 3
                try:
                    lock.release()
                    code = 4
                except LockError:
                    pass
                # The child has its own renewal worker for its own locks.
                own = store.lock(name + "-child", ttl=1, auto_renew=True)
                if not own.acquire():
                    code = 6
                time.sleep(1.6)
                if not own.owned():
                    code = 7
                own.release()
            except BaseException:
                code = 5
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent still holds it, and keeps renewing it past its TTL.
        assert lock.owned()
        time.sleep(2.5)
        assert lock.owned()
        lock.release()
