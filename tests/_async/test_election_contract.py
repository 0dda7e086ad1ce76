"""The election contract: one leader at a time, named, on every backend, in both flavours.

An election is an auto-renewed lock (the lock contract covers renewal, loss and
cancellation); these tests pin what is the election's own: the identity every
process reads, terms, resigning as a hand-over, followers waiting for a change.
"""

from __future__ import annotations

import os
import socket

import pytest

from corral.aio import AsyncElection, AsyncStore
from corral.errors import ConfigError, LockExpired
from tests._async.concurrency import sleep, start
from tests._async.delayed import wait_until


async def test_one_leader_named_everywhere(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    first = store.election(name, ttl=10, identity="scheduler-a")
    second = other_store.election(name, ttl=10, identity="scheduler-b")
    assert not first.is_leader and first.term is None
    assert await first.leader() is None
    assert await first.campaign(wait=0)
    assert first.is_leader and isinstance(first.term, int)
    assert not await second.campaign(wait=0)
    assert not await second.campaign(wait=0.2)
    assert not second.is_leader and second.term is None
    assert await first.leader() == "scheduler-a"
    assert await second.leader() == "scheduler-a"
    info = await second.leadership()
    assert info is not None and info.token == first.term and 0 < info.ttl <= 10
    assert await first.campaign(wait=0)  # already leading: nothing changes
    await first.resign()
    assert not first.is_leader and first.term is None
    assert await second.leader() is None


async def test_resign_hands_over_to_a_waiting_campaigner(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    leader = store.election(name, ttl=30, identity="old")
    assert await leader.campaign()
    term = leader.term
    follower = other_store.election(name, ttl=30, identity="new")
    job = start(follower.campaign, None)
    await sleep(0.3)
    assert not job.done()
    await leader.resign()
    # Far sooner than the 30 s TTL: the resignation itself elects the follower.
    assert await job.result(timeout=10)
    assert follower.is_leader and follower.term is not None and term is not None
    assert follower.term > term
    assert await leader.leader() == "new"
    await follower.resign()


async def test_terms_strictly_increase(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    terms: list[int] = []
    for index in range(4):
        election = (store if index % 2 else other_store).election(name, ttl=10)
        assert await election.campaign(wait=0)
        assert election.term is not None
        terms.append(election.term)
        await election.resign()
    assert terms == sorted(terms) and len(set(terms)) == 4


async def test_default_identity_and_any_identity_round_trips(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    plain = store.election(name, ttl=10)
    assert plain.identity == f"{socket.gethostname()}:{os.getpid()}"
    assert await plain.campaign(wait=0)
    assert await other_store.election(name).leader() == plain.identity
    await plain.resign()
    odd = "node@eu-west:7/ü %40\tx"
    election = store.election(name, ttl=10, identity=odd)
    assert await election.campaign(wait=0)
    assert await other_store.election(name).leader() == odd
    await election.resign()


async def test_followers_wait_for_a_change(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    leader = store.election(name, ttl=30, identity="a")
    follower = other_store.election(name, ttl=30, identity="b")
    assert await leader.campaign()
    assert not await follower.wait_for_change(timeout=0.3)
    job = start(follower.wait_for_change, 20)
    await sleep(0.3)
    assert not job.done()
    await leader.resign()
    assert await job.result()
    # Nobody leads now; the next change is someone being elected.
    job = start(follower.wait_for_change, 20)
    await sleep(0.2)
    assert await leader.campaign()
    assert await job.result()
    await leader.resign()


async def test_a_lost_leadership_is_reported_and_a_new_term_can_follow(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    lost: list[AsyncElection] = []
    # Renewed every 0.6 s, so a renewal has 1.2 s to be answered: more than a pause of the
    # process lasts.
    election = store.election(name, ttl=1.8, identity="a", on_lost=lost.append)
    assert await election.campaign()
    first_term = election.term
    await sleep(2.6)  # outlives its TTL only through renewals
    assert election.is_leader and election.term == first_term
    assert await other_store.force_release_election(name)
    await wait_until(lambda: bool(lost))
    assert lost == [election]
    assert not election.is_leader
    with pytest.raises(LockExpired, match=name):
        await election.check()
    assert await election.campaign(wait=5)
    assert election.term is not None and first_term is not None
    assert election.term > first_term
    await election.resign()


async def test_context_manager(store: AsyncStore, other_store: AsyncStore, name: str) -> None:
    async with store.election(name, ttl=10, identity="block") as election:
        assert election.is_leader
        assert await other_store.election(name).leader() == "block"
    assert not election.is_leader
    assert await other_store.election(name).leader() is None


async def test_an_election_and_a_lock_may_share_a_name(store: AsyncStore, name: str) -> None:
    lock = store.lock(name, ttl=10)
    assert await lock.acquire()
    election = store.election(name, ttl=10)
    assert await election.campaign(wait=0)
    await election.resign()
    assert await lock.owned()
    await lock.release()


async def test_resign_without_leading_does_nothing(store: AsyncStore, name: str) -> None:
    election = store.election(name, ttl=10)
    await election.resign()
    assert await election.leader() is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"ttl": 0}, ConfigError),
        ({"ttl": -1}, ConfigError),
        ({"identity": ""}, ConfigError),
        ({"identity": 7}, TypeError),
        ({"on_lost": 3}, ConfigError),
    ],
)
async def test_bad_election_options(
    store: AsyncStore, name: str, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        store.election(name, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.election(123)  # type: ignore[arg-type]
    election = store.election(name)
    with pytest.raises(ConfigError):
        await election.campaign(wait=-1)
    assert await election.leader() is None


async def test_a_change_since_the_last_look_is_reported_at_once(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    first = store.election(name, ttl=30, identity="a")
    follower = other_store.election(name, ttl=30, identity="f")
    assert await first.campaign()
    assert await follower.leader() == "a"
    seen = await follower.leadership()
    await first.resign()
    second = store.election(name, ttl=30, identity="b")
    assert await second.campaign()
    # The change happened before the wait began: it is reported, not waited past.
    assert await follower.wait_for_change(timeout=5)
    assert await follower.leader() == "b"
    assert not await follower.wait_for_change(timeout=0.2)
    assert await follower.wait_for_change(timeout=0, since=seen)
    await second.resign()


async def test_a_shared_handle_leads_for_one_block_at_a_time(store: AsyncStore, name: str) -> None:
    election = store.election(name, ttl=30, identity="shared")
    inside: list[str] = []
    most = 0

    async def block(label: str) -> None:
        nonlocal most
        async with election:
            inside.append(label)
            most = max(most, len(inside))
            await sleep(0.2)
            inside.remove(label)

    jobs = [start(block, label) for label in ("one", "two", "three")]
    for job in jobs:
        await job.result()
    assert most == 1
    assert await election.leader() is None


async def test_leaving_a_block_whose_leadership_was_lost_raises(
    store: AsyncStore, other_store: AsyncStore, name: str
) -> None:
    with pytest.raises(LockExpired, match="election"):
        async with store.election(name, ttl=30):
            assert await other_store.force_release_election(name)
