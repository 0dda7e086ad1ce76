"""Cache edge cases that exist in one flavour only: interruptions landing anywhere in a
thread (Ctrl-C, KeyboardInterrupt), and coroutine functions handed to the blocking API."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import pytest

import corral

pytestmark = pytest.mark.capability("cache")


class Interrupt(BaseException):
    """What Ctrl-C raises in the thread it lands in: not an `Exception`."""


def test_an_interrupt_of_the_leader_is_not_raised_in_the_threads_sharing_its_flight(
    backend_url: str, name: str
) -> None:
    """Ctrl-C in the thread computing a key (the main thread, usually) is that thread's
    affair. Threads that joined its flight must get a value (or compute themselves),
    not the leader's KeyboardInterrupt raised inside them: in asyncio a caller's
    cancellation leaves the computation running for the others."""
    with corral.connect(backend_url) as store:
        cache = store.cache(name)
        entered = threading.Event()

        def interrupted() -> Any:
            entered.set()
            time.sleep(0.5)
            raise Interrupt

        outcome: dict[str, Any] = {}

        def follower() -> None:
            entered.wait(5)
            time.sleep(0.1)
            try:
                outcome["value"] = cache.get_or_compute("k", lambda: "follower's")
            except BaseException as exc:  # what reaches the follower is the test
                outcome["error"] = exc

        thread = threading.Thread(target=follower, daemon=True)
        thread.start()
        with pytest.raises(Interrupt):
            cache.get_or_compute("k", interrupted)
        thread.join(10)
        assert "error" not in outcome, f"the follower thread got {outcome['error']!r}"
        assert outcome["value"] == "follower's"


def test_an_interrupt_between_the_claiming_read_and_adopting_the_claim_frees_the_lock(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read claims the recompute lock on the server; decoding the entry (a large
    stale value: json.loads of megabytes) then runs before the claim is adopted. Ctrl-C
    landing there leaves the lock held by an owner nobody knows, so every other process
    waits lock_wait (5 s) on a miss until its TTL (10 s) frees it."""
    with corral.connect(backend_url) as store:
        cache = store.cache(name)
        real = cache._decode
        calls = [0]

        def decode_interrupted(*args: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                raise Interrupt
            return real(*args)

        monkeypatch.setattr(cache, "_decode", decode_interrupted)
        with pytest.raises(Interrupt):
            cache.get_or_compute("k", lambda: "v")
        assert store.lock_info("\x00cache:" + cache.stored_key("k")) is None


def test_the_blocking_decorator_refuses_a_coroutine_function(backend_url: str, name: str) -> None:
    """docs: `cached` takes sync functions on corral.connect. A coroutine function is
    accepted, and each call then fails only after computing: a coroutine object that
    is never awaited, then a SerializationError (json cannot encode a coroutine)."""
    with corral.connect(backend_url) as store:
        cache = store.cache(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "never awaited"
            with pytest.raises(TypeError):

                @cache.cached(key="user:{user_id}")
                async def load(user_id: int) -> int:
                    return user_id
