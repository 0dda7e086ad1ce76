"""Behaviour that exists in only one flavour: task cancellation (asyncio) and fork (blocking)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
import threading
import time
from typing import Any

import pytest

import corral
import corral.aio
from corral._sync import renewer as sync_renewer
from corral.errors import LockError
from tests._async.delayed import delayed
from tests.conftest import capabilities


async def eventually_free(store: corral.aio.AsyncStore, name: str, deadline: float = 20.0) -> bool:
    for _ in range(int(deadline / 0.05)):
        if await store.lock_info(name) is None:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_cancellation_after_the_grant_takes_the_lock_back(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Granted, then cancelled while leaving the wake-up subscription (Redis: UNSUBSCRIBE):
    the caller never learns it holds the lock, so corral must give it back."""
    async with corral.aio.connect(backend_url) as store:
        slow, backend = delayed(store, leave=0.5)
        waiting = asyncio.Event()
        subscribe = backend.waiter

        def spying_waiter(lock_name: str) -> Any:
            waiting.set()  # its first attempt was refused: it waits now
            return subscribe(lock_name)

        monkeypatch.setattr(backend, "waiter", spying_waiter)
        holder = store.lock(name, ttl=30)
        assert await holder.acquire()
        victim = slow.lock(name, ttl=30, wait=20, auto_renew=True)

        async def job() -> None:
            async with victim:
                pytest.fail("entered the block")

        task = asyncio.create_task(job())
        await asyncio.wait_for(waiting.wait(), 30)
        await holder.release()
        for _ in range(400):  # until the grant is in and the subscription is being left
            if "leave" in backend.calls:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not victim.held
        assert await eventually_free(store, name)
        assert await store.lock(name, ttl=5).acquire()


async def test_the_take_back_of_a_cancelled_attempt_never_overtakes_it(
    backend_url: str, name: str
) -> None:
    """The attempt is on the wire when its caller is cancelled; the server acts on it later.
    Taking it back at once would find nothing and leave an owner nobody knows holding it."""
    async with corral.aio.connect(backend_url) as store:
        slow, backend = delayed(store, wire=0.5)
        victim = slow.lock(name, ttl=30)
        task = asyncio.create_task(victim.acquire())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(600):  # until it is taken back
            if "release" in backend.calls:
                break
            await asyncio.sleep(0.05)
        assert "release" in backend.calls
        # Taken back only once the server had acted on the attempt: a take-back before
        # would find nothing, and the attempt would then leave an unknown owner holding it.
        assert backend.calls.index("answered") < backend.calls.index("release")
        assert await eventually_free(store, name)
        assert not victim.held


@pytest.mark.capability("fair")
async def test_a_cancelled_queued_attempt_leaves_no_place_behind(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refused attempt of a fair waiter lands after its caller left the queue: its
    place must go too, or the next fair waiter would wait behind nobody for seconds."""
    async with corral.aio.connect(backend_url) as store:
        holder = store.lock(name, ttl=30)
        assert await holder.acquire()
        slow, backend = delayed(store, wire=0.5)
        undone = asyncio.Event()
        leave_queue = backend.leave_queue

        async def spy(lock_name: str, owner: str) -> None:
            # The caller leaves at once; what counts is the leave after the server acted
            # on the attempt, which alone removes the place that attempt took.
            landed = "answered" in backend.calls
            await leave_queue(lock_name, owner)
            if landed:
                undone.set()

        monkeypatch.setattr(backend, "leave_queue", spy)
        victim = slow.lock(name, ttl=30, fair=True)
        task = asyncio.create_task(victim.acquire(wait=10))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(undone.wait(), 30)  # the attempt has landed, and been undone
        await holder.release()
        newcomer = store.lock(name, ttl=30, fair=True)
        assert await newcomer.acquire(wait=0), "a dead queue place held the free lock back"
        await newcomer.release()


@pytest.mark.capability("cross_process")
def test_a_child_forked_while_threads_were_inside_corral_does_not_hang(
    backend_url: str, name: str
) -> None:
    with corral.connect(backend_url) as store:
        holder = store.lock(name, ttl=30, auto_renew=True)
        assert holder.acquire()
        waiting = threading.Thread(target=lambda: store.lock(name, ttl=30).acquire(wait=30))
        waiting.start()
        time.sleep(0.3)
        # Mutexes some thread of the parent may hold at the instant of a fork; holding
        # them on purpose makes the test independent of luck.
        held = [
            store.backend.local_bus._mutex,
            sync_renewer._REGISTRY_MUTEX,
            store.metrics.locks._mutex,
        ]
        for mutex in held:
            mutex.acquire()
        try:
            pid = os.fork()
            if pid == 0:  # the child: report through the exit status only
                code = 0
                try:
                    signal.alarm(20)  # a hang ends the child with SIGALRM
                    # Held until released below, however long the attempt takes.
                    own = store.lock(name + "-child", ttl=10, auto_renew=True)
                    if not own.acquire(wait=5):
                        code = 3
                    if store.lock(name, ttl=5).acquire(wait=0.3):
                        code = 4  # the parent holds it
                    own.release()
                except BaseException:
                    code = 5
                os._exit(code)
        finally:
            for mutex in held:
                mutex.release()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        holder.release()
        waiting.join(30)
        assert not waiting.is_alive()


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
        # TTLs with room for a pause between two renewals of a busy machine.
        lock = store.lock(name, ttl=3, auto_renew=True)
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
                own = store.lock(name + "-child", ttl=2, auto_renew=True)
                if not own.acquire():
                    code = 6
                time.sleep(2.6)  # past its TTL: renewed
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


def test_an_interruption_between_the_grant_and_acquire_returning_takes_it_back(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: object, lock: object) -> None:
        raise KeyboardInterrupt

    with corral.connect(backend_url) as store:
        lock = store.lock(name, ttl=30, auto_renew=True)
        monkeypatch.setattr(sync_renewer.Renewer, "register", interrupted)
        with pytest.raises(KeyboardInterrupt):
            lock.acquire()
        monkeypatch.undo()
        assert not lock.held and lock.token is None
        assert store.lock_info(name) is None
        assert lock.acquire()  # the handle is usable again
        lock.release()


async def test_wait_zero_is_refused_at_once_while_a_woken_waiter_takes_over(
    backend_url: str, name: str
) -> None:
    async with corral.aio.connect(backend_url) as store:
        lock = store.lock(name, ttl=30)
        assert await lock.acquire()
        waiting = asyncio.create_task(lock.acquire(wait=None))
        await asyncio.sleep(0.1)
        await lock.release()  # hands the handle to `waiting`, which has not run yet
        # One attempt, no waiting: refused at once, not queued behind `waiting`.
        assert await asyncio.wait_for(lock.acquire(wait=0), 10) is False
        assert await waiting
        await lock.release()


def test_event_loops_that_renewed_locks_are_not_kept(backend_url: str, name: str) -> None:
    """Programs that call asyncio.run() per job must not keep every finished loop."""
    from corral._async import renewer as async_renewer

    async def job() -> None:
        async with corral.aio.connect(backend_url) as store:
            lock = store.lock(name, ttl=30, auto_renew=True)
            assert await lock.acquire()
            await lock.release()

    gc.collect()
    before = len(async_renewer._RENEWERS)  # loops of other tests may still be alive
    for _ in range(5):
        asyncio.run(job())
    gc.collect()
    assert len(async_renewer._RENEWERS) <= before


@pytest.mark.capability("cross_process")
def test_a_dropped_auto_renewed_handle_stops_being_renewed(
    backend_name: str, backend_url: str, name: str
) -> None:
    """Nobody can release a handle nobody can reach: renewing it would hold it forever."""
    with corral.connect(backend_url) as store:
        lock = store.lock(name, ttl=0.6, auto_renew=True)
        assert lock.acquire()
        del lock
        gc.collect()
        deadline = time.monotonic() + 0.6 + capabilities(backend_name).ttl_slack + 5
        while store.lock_info(name) is not None:
            assert time.monotonic() < deadline, "still renewed"
            time.sleep(0.1)


@pytest.mark.capability("cross_process")
def test_closing_a_store_while_a_thread_waits_starts_nothing_new(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = corral.connect(backend_url)
    holder = corral.connect(backend_url)
    # Told when the waiter waits: subscribed, with every thread its wait needs started.
    waiting = threading.Event()
    subscribe = store.backend.waiter

    def spying_waiter(lock_name: str) -> Any:
        subscription = subscribe(lock_name)
        wait = subscription.wait

        def wait_and_tell(timeout: float) -> bool:
            waiting.set()
            return wait(timeout)

        monkeypatch.setattr(subscription, "wait", wait_and_tell)
        return subscription

    monkeypatch.setattr(store.backend, "waiter", spying_waiter)
    try:
        assert holder.lock(name, ttl=30).acquire()
        outcome: list[BaseException | bool] = []

        def wait() -> None:
            try:
                outcome.append(store.lock(name, ttl=30).acquire(wait=20))
            except BaseException as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        assert waiting.wait(30)
        before = {t.ident for t in threading.enumerate()}
        store.close()
        waiter.join(30)
        assert not waiter.is_alive()
        assert outcome and outcome[0] is not True  # it did not get the lock after the close
        time.sleep(0.5)
        started = [t.name for t in threading.enumerate() if t.ident not in before]
        assert not [n for n in started if "corral" in n], started
    finally:
        holder.force_release(name)
        holder.close()


@pytest.mark.capability("cross_process")
def _wait_until_corral_jobs_are_idle(within: float = 30.0) -> None:
    from corral._sync import _compat

    pool = _compat._POOL
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        workers = [t for t in threading.enumerate() if t.name == "corral-job"]
        with pool._mutex:
            if not pool._jobs and pool._idle >= len(workers):
                return
        time.sleep(0.01)
    raise AssertionError("corral's background jobs did not go idle")


def _wait_until_other_threads_are_blocked(within: float = 30.0) -> None:
    """Until every other thread sits in one blocking call (three looks 20 ms apart find
    it at the same instruction), so none holds the GIL or a lock the child will need."""
    me = threading.get_ident()

    def where() -> dict[int, tuple[int, int]]:
        return {
            ident: (id(frame), frame.f_lasti)
            for ident, frame in sys._current_frames().items()
            if ident != me
        }

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        first = where()
        time.sleep(0.02)
        second = where()
        time.sleep(0.02)
        if first == second == where():
            return
    raise AssertionError("the other threads never sat still")


def _reap_or_kill(pid: int, within: float = 60.0) -> int:
    """The child's exit code; a child that hangs is killed, so the run leaves nothing."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the forked child hung for {within} s")


def test_a_child_forked_without_pythons_fork_hooks_has_its_own_identity(
    backend_url: str, name: str
) -> None:
    """uWSGI's prefork (and snapshot clones) fork from C: no os.register_at_fork hook runs.
    The child must still not own the parent's lock, nor share its owner ids or sockets."""
    import ctypes

    from corral.core.lockflow import make_owner

    libc = ctypes.CDLL(None, use_errno=True)
    with corral.connect(backend_url) as store:
        lock = store.lock(name, ttl=30)
        assert lock.acquire()  # the store now has connections, maybe kept for reuse
        parent_owner = make_owner("x")
        # A fork from C copies no thread but the caller, and ctypes lets go of the GIL
        # for the call: were another thread running Python then (Redlock's reply from its
        # last master, still being read), the child would wait for it forever. uWSGI forks
        # before any such thread runs; so does this test, once corral's jobs are idle.
        _wait_until_corral_jobs_are_idle()
        # Nor any other thread (a connection pool's, opening connections in the
        # background).
        _wait_until_other_threads_are_blocked()
        pid = libc.fork()
        assert pid >= 0
        if pid == 0:  # the child, forked behind Python's back: exit status only
            code = 0
            try:
                if lock.held or lock.owner is not None:
                    code = 3
                owner = make_owner("x")
                if owner.split(":")[1] != str(os.getpid()):
                    code = 4
                if owner.split(":")[3][:16] == parent_owner.split(":")[3][:16]:
                    code = 5
                own = store.lock(name + "-child", ttl=5)
                if not own.acquire(wait=5):
                    code = 6
                info = store.lock_info(name + "-child")
                if info is None or info.owner != own.owner:
                    code = 7  # a reply read from a socket the parent uses
                own.release()
            except BaseException:
                code = 8
            os._exit(code)
        assert _reap_or_kill(pid) == 0
        assert lock.owned()
        lock.release()


def test_a_block_may_leave_on_another_thread_than_it_entered(backend_url: str, name: str) -> None:
    """Web frameworks run a sync dependency's enter and exit as two calls of a thread pool."""
    from concurrent.futures import ThreadPoolExecutor

    with (
        corral.connect(backend_url) as store,
        ThreadPoolExecutor(1) as one,
        ThreadPoolExecutor(1) as two,
    ):
        lock = store.lock(name, ttl=30, wait=5)
        for round_no in range(4):
            enter, leave = (one, two) if round_no % 2 == 0 else (two, one)
            held = enter.submit(lock.__enter__).result(30)
            assert store.lock_info(name) is not None
            leave.submit(lock.__exit__, None, None, None).result(30)
            assert store.lock_info(name) is None, f"round {round_no}: still held"
            assert not held.held
        assert lock._entered == {}  # nothing kept per block once it left
