"""`redis+redlock://` under the faults a quorum must survive: interruptions mid-attempt,
masters that stop between the request and the answer, verdicts with a master silent.

Each test starts three masters of its own (as `test_redlock.py` does).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

import corral
from corral._sync.backends.redlock import RedlockBackend
from corral.backends import redis_scripts
from corral.core import quorum
from corral.core.clock import FakeClock
from corral.testing import servers
from tests.faults.redlock_masters import client

pytestmark = pytest.mark.backend("redlock")


def test_an_acquire_interrupted_mid_quorum_leaves_no_lock_behind(
    masters: servers.RedisMasters, name: str
) -> None:
    """Ctrl-C while the attempt waits for the masters (the blocking flavour's threads
    carry on with their requests): whatever the masters granted is given back, as the
    lock logic promises for an interrupted attempt, instead of holding the lock for
    a whole TTL under an owner nobody knows."""
    first, *stopped = masters.masters
    keys = redis_scripts.lock_keys(redis_scripts.DEFAULT_PREFIX, name)
    fired = threading.Event()

    def interrupt_once_the_first_master_granted() -> None:
        with client(first) as direct:
            deadline = time.monotonic() + 30
            while not direct.exists(keys.lock) and time.monotonic() < deadline:
                time.sleep(0.005)
        fired.set()
        os.kill(os.getpid(), signal.SIGINT)  # the main thread waits for the other two

    helper = threading.Thread(target=interrupt_once_the_first_master_granted)
    with corral.connect(masters.url, timeout=3) as store:
        # Connections to every master are open, so the attempt's requests reach the
        # stopped masters' sockets and run there once they resume.
        warm = store.lock(f"{name}-warm", ttl=5)
        assert warm.acquire()
        warm.release()
        for master in stopped:
            master.pause()
        try:
            helper.start()
            with pytest.raises(KeyboardInterrupt):
                store.lock(name, ttl=60).acquire(wait=0)
                while not fired.is_set():  # pragma: no cover - only if the signal came late
                    time.sleep(0.01)
        finally:
            helper.join()
            for master in stopped:
                master.resume()
        # The stopped masters now serve the requests they had queued, grants included;
        # the store that made them is still open to give them back.
        with corral.connect(masters.url, timeout=3) as other_store:
            other = other_store.lock(name, ttl=5)
            assert other.acquire(wait=20), "the interrupted attempt's grants hold the lock"
            other.release()


def test_masters_stopped_past_the_timeout_keep_no_grant_once_resumed(
    masters: servers.RedisMasters, name: str
) -> None:
    """An attempt that two stopped masters never answered is refused as unavailable;
    when they resume they run the request they had queued and grant it. That grant,
    a majority's, must be given back, not hold the lock for its whole TTL."""
    _, *stopped = masters.masters
    with corral.connect(masters.url, timeout=1) as store:
        warm = store.lock(f"{name}-warm", ttl=5)
        assert warm.acquire()
        warm.release()
        for master in stopped:
            master.pause()
        try:
            with pytest.raises(corral.BackendUnavailable):
                store.lock(name, ttl=60).acquire(wait=0)
        finally:
            for master in stopped:
                master.resume()
        with corral.connect(masters.url, timeout=1) as other:
            lock = other.lock(name, ttl=5)
            assert lock.acquire(wait=20), "the stopped masters' late grants hold the lock"
            lock.release()


def test_a_grant_is_not_counted_on_past_its_redlock_validity(
    masters: servers.RedisMasters, name: str
) -> None:
    """A master whose clock runs 1 % fast frees the lock 1 % early: the handle must stop
    believing it holds the lock once the drift allowance says a majority may not."""
    clock = FakeClock()
    with corral.connect(masters.url, timeout=1, clock=clock) as store:
        lock = store.lock(name, ttl=10, auto_renew=False)
        assert lock.acquire(wait=0)
        try:
            clock.advance(10 - quorum.drift(10) / 2)
            assert not lock.held, "held past the validity Redlock promised"
        finally:
            store.force_release(name)


def test_a_release_does_not_count_a_silent_master_that_never_granted_it(
    masters: servers.RedisMasters, name: str
) -> None:
    """X is granted by A and B (C refused it: someone held it there). B then forgets X's
    grant (a restart without its data) and Y takes B and C. When X releases with C
    silent, A's OK and C's silence could only make a majority if C held X's grant,
    which it never did: X lost the lock to Y, and must hear so, not that all was well."""
    _, b, c = masters.masters
    keys = redis_scripts.lock_keys(redis_scripts.DEFAULT_PREFIX, name)
    with (
        corral.connect(masters.url, timeout=1) as store,
        corral.connect(masters.url, timeout=1) as rival,
        corral.connect(f"redis://{c.host}:{c.port}/0") as only_c,
    ):
        before = only_c.lock(name, ttl=30)
        assert before.acquire()
        x = store.lock(name, ttl=60)
        assert x.acquire(wait=0)  # by A and B; C refused it
        # C's refusal may come after the grant was decided on A's and B's: the holder
        # learns it then. Freeing C before that could let X's request reach C after.
        assert isinstance(store.backend, RedlockBackend)
        assert x.owner is not None
        deadline = time.monotonic() + 10
        while 2 in (store.backend._grant(name, x.owner)[1] or {2}):
            assert time.monotonic() < deadline, "C's refusal never reached the holder"
            time.sleep(0.01)
        before.release()
        with client(b) as direct:
            assert direct.delete(keys.lock) == 1  # as a restart without its data would
        y = rival.lock(name, ttl=60)
        assert y.acquire(wait=0)  # by B and C: X still holds A
        c.pause()
        try:
            with pytest.raises(corral.LockLost):
                x.release()
        finally:
            c.resume()
        y.release()


def test_a_master_failing_before_its_write_back_with_a_majority_up_is_a_refusal(
    masters: servers.RedisMasters, name: str
) -> None:
    """A and B grant while C has not answered yet, then A fails before the token is
    written back to it: fewer than a majority holds the token, so the attempt is
    given back. Two masters of three are still up, and C was only slow: that is a
    refused attempt the waiter tries again, not `BackendUnavailable` ("0 of 3
    masters answered", as a process contending while a master was killed heard)."""
    with corral.connect(masters.url, timeout=1) as store:
        backend = store.backend
        assert isinstance(backend, RedlockBackend)
        a, _, c = backend._masters
        real_try_acquire, real_on = c.try_acquire, backend._on
        calls: list[object] = []

        def slow_c(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.5)
            return real_try_acquire(*args, **kwargs)

        def failing_a_second_time(master: Any, call: Any) -> Any:
            if master is a:
                calls.append(call)
                if len(calls) == 2:  # the write-back, after A's grant
                    raise corral.BackendUnavailable("A failed before the write-back")
            return real_on(master, call)

        c.try_acquire = slow_c  # type: ignore[method-assign]
        backend._on = failing_a_second_time  # type: ignore[method-assign]
        lock = store.lock(name, ttl=30)
        try:
            assert lock.acquire(wait=0) is False
        finally:
            del c.try_acquire, backend._on
        assert len(calls) >= 2  # the attempt, the write-back (then the give-back)
        # What A, B and C granted was given back (C's late grant by its own request):
        # the next attempt wins.
        assert lock.acquire(wait=10)
        lock.release()
