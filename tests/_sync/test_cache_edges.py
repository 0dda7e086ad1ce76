# Generated from tests/_async/test_cache_edges.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Edge cases of `store.cache()` found in review: each test states a promise of SPEC's
"Cache" section or docs/cache.md and a scenario (a reply that arrives late, a second
handle, a failing source, a slow leader) in which the driver breaks it.

Real servers throughout; only the timing of a reply, or a server error, is injected.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from corral import Store
from corral._sync._compat import Event
from corral.core.envelope import encode, make_codec
from corral.core.placement import recompute_lock_name
from corral.errors import BackendUnavailable, LockTimeout
from tests._sync.computations import Counter, Gated, until
from tests._sync.concurrency import sleep, start

pytestmark = pytest.mark.capability("cache")


@dataclass
class Late:
    """A call whose answer is held back (see `answer_late`)."""

    applied: Event = field(default_factory=Event)
    """Set once the server has applied the call (its answer is held back from here)."""
    deliver: Event = field(default_factory=Event)
    """Set by the test to let the answer reach the client."""


def answer_late(
    monkeypatch: pytest.MonkeyPatch, store: Store, primitive: str, seconds: float = 30.0
) -> Late:
    """The next call of `primitive` is applied on the server at once, but its answer
    reaches the client `seconds` later, or once the test sets `deliver` (a slow
    network, a stalled event loop)."""
    real = getattr(store.backend, primitive)
    pending = [True]
    late = Late()

    def answered_late(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if pending:
            pending.clear()
            late.applied.set()
            late.deliver.wait(seconds)
        return result

    monkeypatch.setattr(store.backend, primitive, answered_late)
    return late


def unresponsive_server(monkeypatch: pytest.MonkeyPatch, store: Store) -> list[str]:
    """Every cache primitive now fails as an unresponsive server does, after its timeout.

    Returns the list of primitives called since: each one is a full timeout waited, so
    its length says how many timeouts a call cost, without measuring time.
    """
    asked: list[str] = []
    for primitive in ("cache_read", "cache_fetch", "cache_store"):

        def unresponsive(*args: Any, primitive: str = primitive, **kwargs: Any) -> Any:
            asked.append(primitive)
            raise BackendUnavailable(f"{store.server}: no answer within the timeout (test)")

        monkeypatch.setattr(store.backend, primitive, unresponsive)
    return asked


# -- values and entries ---------------------------------------------------------------


def test_a_failed_refresh_with_error_ttl_keeps_the_fresh_value(store: Store, name: str) -> None:
    """A refresher round whose computation fails must not take away the value the
    refresher exists to keep: readers should go on getting it (it is even fresh)."""
    cache = store.cache(name, ttl=30, error_ttl=30)
    cache.set("k", "good")
    cache.refresh("k", Counter(fail=True))
    assert cache.get("k", default="gone") == "good"
    assert cache.get_or_compute("k", Counter("recomputed")) == "good"


def test_a_failed_computation_after_the_wait_does_not_wipe_the_winners_value(
    store: Store, other_store: Store, name: str
) -> None:
    """One process computes and stores a value; another gave up waiting (lock_wait),
    computed itself, and failed later. Its error marker must not replace the value
    the first one stored (with error_ttl)."""
    winner = other_store.cache(name, ttl=30, error_ttl=30)
    loser = store.cache(name, ttl=30, error_ttl=30, lock_wait=0.2)
    gate = Event()

    def held_until_the_loser_failed() -> str:
        gate.wait(30)
        return "good"

    good = start(winner.get_or_compute, "k", held_until_the_loser_failed)
    lock = recompute_lock_name(winner.stored_key("k"))
    while store.lock_info(lock) is None:  # the winner computes from here on
        sleep(0.01)
    try:
        with pytest.raises(RuntimeError):
            loser.get_or_compute("k", Counter(fail=True, delay=0.2))
    finally:
        gate.set()
    assert good.result() == "good"
    assert winner.get("k", default="gone") == "good"
    assert store.cache(name).get_or_compute("k", Counter("again")) == "good"


def test_a_set_after_clear_is_kept_even_if_an_older_read_answers_late(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read sent before `clear()` whose answer arrives after it must not make this
    process write its next `set` under the generation the clear retired."""
    cache = store.cache(name)
    cache.set("old", 1)
    late = answer_late(monkeypatch, store, "cache_fetch")
    reader = start(cache.get, "old")
    try:
        assert late.applied.wait(30)  # read by the server, not answered yet
        cache.clear()
    finally:
        late.deliver.set()
    assert reader.result() == 1  # read before the clear: serving it is fine
    cache.set("new", 2)
    assert cache.get("new", default="lost") == 2


def test_a_read_answered_after_delete_does_not_refill_the_near_cache(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs: the near cache sees this process's own delete. A read that was on the wire
    when `delete()` ran must not put the deleted value back for `local_ttl` seconds."""
    store.cache(name).set("k", "old")
    cache = store.cache(name, local_ttl=30)
    late = answer_late(monkeypatch, store, "cache_fetch")
    reader = start(cache.get, "k")
    try:
        assert late.applied.wait(30)  # read by the server, not answered yet
        assert cache.delete("k") is True
    finally:
        late.deliver.set()
    reader.result()
    assert cache.get("k", default="deleted") == "deleted"


def test_a_read_answered_after_clear_does_not_refill_the_near_cache(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.cache(name).set("k", "old")
    cache = store.cache(name, local_ttl=30)
    late = answer_late(monkeypatch, store, "cache_read")
    reader = start(cache.get_or_compute, "k", Counter("computed"))
    try:
        assert late.applied.wait(30)  # read by the server, not answered yet
        cache.clear()
    finally:
        late.deliver.set()
    reader.result()
    assert cache.get("k", default="cleared") == "cleared"


def test_two_handles_on_one_namespace_see_each_others_deletes(store: Store, name: str) -> None:
    """Two modules of one process each call store.cache("users", local_ttl=...): a delete
    through one must reach the other's near cache (docs: this process's own delete)."""
    one = store.cache(name, local_ttl=30)
    two = store.cache(name, local_ttl=30)
    one.set("k", "old")
    assert two.get("k") == "old"
    one.delete("k")
    assert two.get("k", default="deleted") == "deleted"


# -- waiting --------------------------------------------------------------------------


def test_an_undecodable_fresh_entry_is_a_miss_not_a_wait(store: Store, name: str) -> None:
    """docs: an entry that cannot be decoded is a miss and is replaced by the next
    computation. After rotating hmac_key every pickled entry is such an entry, still
    fresh by its header: the server then claims nothing, and the caller waits
    lock_wait for a release nobody will send (then raises, with on_timeout='raise')."""
    old = store.cache(name, serializer="pickle", hmac_key=b"old key")
    old.set("k", {"v": 1})
    rotated = store.cache(
        name, serializer="pickle", hmac_key=b"new key", lock_wait=0.5, on_timeout="raise"
    )
    assert rotated.get_or_compute("k", Counter("recomputed")) == "recomputed"


def test_an_entry_of_a_codec_not_read_here_is_a_miss_not_a_wait(store: Store, name: str) -> None:
    """The same with a rolling change of serializer (msgpack writers, json readers)."""
    cache = store.cache(name, lock_wait=0.5, on_timeout="raise")
    packed = encode(
        "packed",
        make_codec("msgpack", None),
        cache.stored_key("k"),
        fresh_until=9e9,
        delta=0,
        generation=0,
    )
    store.backend.cache_store([(cache.stored_key("k"), packed, 60.0)])
    assert cache.get_or_compute("k", Counter("json")) == "json"


def test_callers_sharing_a_computation_wait_at_most_lock_wait(store: Store, name: str) -> None:
    """SPEC 4: the others wait for the release up to lock_wait, then raise
    (on_timeout='raise'). A caller of another handle waits for the release; a caller
    of the same handle joins the in-process computation, for lock_wait as well. The
    computation is held until both have raised: a caller that waited for it would
    hang the test (and fail it at the suite's timeout)."""
    cache = store.cache(name, lock_wait=0.3, on_timeout="raise")
    compute = Gated("slow")
    slow = start(cache.get_or_compute, "k", compute)
    try:
        assert compute.entered.wait(30)
        with pytest.raises(LockTimeout):  # another handle: as promised
            store.cache(name, lock_wait=0.3, on_timeout="raise").get_or_compute(
                "k", Counter("other")
            )
        with pytest.raises(LockTimeout):  # the same handle: joins it, as long as promised
            cache.get_or_compute("k", Counter("mine"))
    finally:
        compute.release.set()
    assert slow.result() == "slow"


def test_a_computation_that_reads_its_own_key_does_not_hang(store: Store, name: str) -> None:
    """compute() calling get_or_compute on the same key (a helper shared by both, a
    decorated function calling itself): without singleflight the inner call would wait
    lock_wait and compute through; with it, it waits for itself forever."""
    cache = store.cache(name, lock_wait=0.5)

    def compute() -> Any:
        return cache.get_or_compute("k", Counter("inner"))

    job = start(cache.get_or_compute, "k", compute)
    try:
        job.result(timeout=5)
    except TimeoutError:
        pytest.fail("get_or_compute waits for itself (no error, no lock_wait bound)")
    except Exception:
        pass  # a clear error is an acceptable answer
    finally:
        flight: Any
        for flight in list(cache._flights._running.values()):
            if hasattr(flight, "cancel"):
                flight.cancel()  # asyncio: free the stuck task
            else:
                flight.done.set()  # threads: free the stuck thread


# -- failures of the server -----------------------------------------------------------


def test_an_early_recompute_whose_lock_attempt_fails_serves_the_value(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC: with the server unreachable get_or_compute computes through, never raises.
    XFetch's lock attempt (a round trip after the read) failing must not turn a fresh
    value in hand into a BackendUnavailable."""
    cache = store.cache(name, ttl=30, early_recompute="xfetch", beta=1e6)
    assert cache.get_or_compute("k", Counter(delay=0.05)) == 1

    def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable(f"{store.server} is down (test)")

    monkeypatch.setattr(store.backend, "try_acquire", down)
    assert cache.get_or_compute("k", Counter(delay=0.05)) in (1, 2)


def test_a_lock_timeout_is_raised_even_if_the_holder_cannot_be_looked_up(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """on_timeout='raise' promises LockTimeout; looking up the holder for its message
    is extra, and its failure must not replace the promised error."""
    cache = store.cache(name, lock_wait=0.3, on_timeout="raise")
    compute = Gated("slow")
    slow = start(store.cache(name).get_or_compute, "k", compute)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable(f"{store.server} is down (test)")

    try:
        assert compute.entered.wait(30)
        monkeypatch.setattr(store.backend, "inspect", down)
        with pytest.raises(LockTimeout):
            cache.get_or_compute("k", Counter("mine"))
    finally:
        compute.release.set()
    assert slow.result() == "slow"


def test_a_call_waits_on_an_unresponsive_server_at_most_one_timeout(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC: with the server unreachable, get_or_compute computes through, "none waiting
    past the socket timeout". A server that stopped answering (paused, partitioned)
    costs a full timeout per round trip; after the read has timed out, get_or_compute
    still waits another timeout to store the value it computed."""
    cache = store.cache(name)
    asked = unresponsive_server(monkeypatch, store)
    assert cache.get_or_compute("k", Counter("through")) == "through"
    assert len(asked) == 1, f"waited {len(asked)} timeouts: {asked}"


# -- the refresher, the decorator -----------------------------------------------------


def test_refreshers_in_two_processes_compute_once_per_round(
    store: Store, other_store: Store, name: str
) -> None:
    """docs: "in each round one process computes, the others skip". Two processes whose
    refreshers are not in phase both compute every round: N processes, N computations
    per period, the stampede the refresher is meant to remove."""
    compute = Counter()
    first = store.cache(name, ttl=10).refresher("k", compute, every=0.4)
    second = other_store.cache(name, ttl=10).refresher("k", compute, every=0.4)
    began = time.monotonic()
    first.start()
    sleep(0.2)
    second.start()
    sleep(1.5)
    first.stop()
    second.stop()
    # About 1.7 s of 0.4 s rounds (more if this process was paused): 5 rounds; one
    # computation each (+1 for the phase).
    rounds = math.ceil((time.monotonic() - began) / 0.4)
    assert compute.calls <= rounds + 1, f"{compute.calls} computations in {rounds} rounds"


def test_the_decorator_fills_a_template_from_keyword_arguments(store: Store, name: str) -> None:
    """A template naming a parameter that arrives through **kwargs passes the check at
    decoration (the function takes any keyword), then fails with KeyError at call."""
    cache = store.cache(name)

    @cache.cached(key="user:{user_id}")
    def load(**options: Any) -> Any:
        return options["user_id"]

    assert load(user_id=7) == 7
    assert load.cache_key(user_id=7) == "user:7"  # type: ignore[attr-defined]


# -- stats ------------------------------------------------------------------------------


def test_a_stale_value_served_while_a_background_recompute_runs_is_counted(
    store: Store, name: str
) -> None:
    """docs/metrics.md: stale_served counts stale values returned while another caller
    recomputes. With background=True the caller that schedules the recompute returns
    the stale value, and nothing counts it."""
    cache = store.cache(name, ttl=0.3, stale_ttl=30, background=True)
    cache.set("k", "old")
    sleep(0.5)
    assert cache.get_or_compute("k", Counter("new")) == "old"
    assert cache.stats()["stale_served"] == 1


def test_a_fresh_value_returned_during_a_background_early_recompute_is_a_hit(
    store: Store, name: str
) -> None:
    cache = store.cache(name, ttl=30, early_recompute="xfetch", beta=1e6, background=True)
    assert cache.get_or_compute("k", Counter(delay=0.05)) == 1
    before = cache.stats()["hits"]
    assert cache.get_or_compute("k", Counter(delay=0.05)) == 1  # fresh, returned
    assert cache.stats()["early_recomputes"] == 1
    assert cache.stats()["hits"] == before + 1


def test_every_caller_served_a_fresh_value_counts_as_a_hit(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/metrics.md: hits counts fresh values returned. Callers that share one read
    in this process (singleflight) each get the value; only the leader is counted, so
    a hot key's hit ratio reads far lower than what callers saw."""
    cache = store.cache(name)
    cache.set("k", "v")
    answer_late(monkeypatch, store, "cache_read", 0.3)
    jobs = [start(cache.get_or_compute, "k", Counter("x")) for _ in range(5)]
    assert [job.result() for job in jobs] == ["v"] * 5
    assert cache.stats()["hits"] == 5


# -- found in a second review -------------------------------------------------------------


def _recomputing(store: Store, name: str, **options: Any) -> tuple[Any, Gated, Any]:
    """A handle whose entry went stale and is being recomputed right now, until the
    test sets the computation's `release`."""
    cache = store.cache(name, ttl=0.2, stale_ttl=30, **options)
    cache.set("k", "old")
    sleep(0.4)
    compute = Gated("new")
    job = start(cache.get_or_compute, "k", compute)
    assert compute.entered.wait(30)
    return cache, compute, job


# The callers below share the recompute's flight, and give up on it after lock_wait while
# it is still held: each then looks at the value on offer once more, and computes itself.


def test_a_value_on_offer_is_not_served_after_delete(store: Store, name: str) -> None:
    cache, compute, job = _recomputing(store, name, lock_wait=0.3)
    try:
        cache.delete("k")
        assert cache.get_or_compute("k", Counter("after", delay=0.0)) != "old"
    finally:
        compute.release.set()
        job.result()


def test_a_value_on_offer_is_not_served_after_clear(store: Store, name: str) -> None:
    cache, compute, job = _recomputing(store, name, lock_wait=0.3)
    try:
        cache.clear()
        assert cache.get_or_compute("k", Counter("after", delay=0.0)) != "old"
    finally:
        compute.release.set()
        job.result()


def test_a_value_on_offer_is_stale_only_for_handles_that_accept_stale(
    store: Store, name: str
) -> None:
    cache, compute, job = _recomputing(store, name)
    try:
        assert cache.get_or_compute("k", Counter("x")) == "old"  # stale_ttl=30
        strict = store.cache(name, ttl=0.2, lock_wait=0.3)  # stale_ttl=0: not served "old"
        assert strict.get_or_compute("k", Counter("strict")) in ("new", "strict")
    finally:
        compute.release.set()
        job.result()


class LookupCounter(dict[Any, Any]):
    """The running calls of a cache's `Flights`, counting who looked for the shared
    computation: once a caller has looked, it leads that computation or joins it."""

    def __init__(self, running: dict[Any, Any]) -> None:
        super().__init__(running)
        self.lookups = 0

    def get(self, slot: Any, default: Any = None) -> Any:
        if "'through'" in repr(slot):
            self.lookups += 1
        return super().get(slot, default)


def test_callers_giving_up_on_a_shared_computation_compute_once(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = store.cache(name, lock_wait=0.2)
    running = LookupCounter(cache._flights._running)
    monkeypatch.setattr(cache._flights, "_running", running)
    slow = Gated("slow")
    leader = start(cache.get_or_compute, "k", slow)
    through = Gated("through")
    try:
        assert slow.entered.wait(30)
        jobs = [start(cache.get_or_compute, "k", through) for _ in range(6)]
        # The computation they share is still running once all six have given up on the
        # leader's: each of them joins it (none comes too late and computes again).
        until(lambda: running.lookups >= 6, "all six give up waiting and look for it")
        through.release.set()
        results = [job.result() for job in jobs]
    finally:
        slow.release.set()
        through.release.set()
    assert leader.result() == "slow"
    assert through.calls == 1 and results == ["through"] * 6


def test_a_hinted_key_waits_on_an_unresponsive_server_at_most_one_timeout(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = store.cache(name)
    assert cache.get_or_compute("k", Counter("v")) == "v"  # now hinted fresh
    asked = unresponsive_server(monkeypatch, store)
    assert cache.get_or_compute("k", Counter("through")) == "through"
    assert len(asked) == 1, f"waited {len(asked)} timeouts: {asked}"


def test_a_set_after_another_handles_clear_is_kept(store: Store, name: str) -> None:
    first, second = store.cache(name), store.cache(name)
    first.set("k", "before")  # first has seen the generation now
    second.clear()
    first.set("k", "after")
    assert second.get("k") == "after"


def test_each_handle_gets_its_own_local_ttl(store: Store, name: str) -> None:
    long_lived = store.cache(name, local_ttl=60)
    short_lived = store.cache(name, local_ttl=0.2)
    long_lived.set("k", "v1")
    store.backend.cache_delete(long_lived.stored_key("k"))  # behind both near caches
    sleep(0.4)
    assert short_lived.get("k") is None  # its near copy is too old for it
    assert long_lived.get("k") == "v1"
