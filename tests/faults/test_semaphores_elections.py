"""Real faults for semaphores and elections: processes that race, die and stop.

Like tests/faults/test_faults.py, written once for every backend whose locks
cross processes; the semaphore tests also need the backend to keep semaphores.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import corral
from corral.core.election import lock_name
from tests.conftest import capabilities
from tests.faults.test_faults import FLAVOURS, Holder, holders, store

__all__ = ["holders", "store"]  # the fixtures, shared with the lock's fault tests

pytestmark = pytest.mark.capability("cross_process")


def most_inside(records: list[dict[str, float]]) -> int:
    """The largest number of [start, end] intervals that overlap at one instant."""
    events = sorted(
        [(r["start"], 1) for r in records] + [(r["end"], -1) for r in records],
        key=lambda event: (event[0], event[1]),  # an exit before an entry at the same instant
    )
    inside = most = 0
    for _, change in events:
        inside += change
        most = max(most, inside)
    return most


@pytest.mark.capability("semaphores")
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_eight_processes_never_more_than_three_inside(
    backend_url: str, name: str, holders: list[Holder], flavour: str
) -> None:
    cycles = 6
    workers = [
        Holder(
            backend_url,
            name,
            "worker",
            "--limit",
            "3",
            "--cycles",
            str(cycles),
            "--hold",
            "0.05",
            "--ttl",
            "30",
            "--flavour",
            flavour,
        )
        for _ in range(8)
    ]
    holders.extend(workers)
    records = []
    for worker in workers:
        out, _ = worker.proc.communicate(timeout=180)
        assert worker.proc.returncode == 0, out
        records.extend(json.loads(line) for line in out.splitlines())
    assert len(records) == 8 * cycles  # everyone got in, every time
    assert most_inside(records) <= 3
    tokens = [r["token"] for r in records]
    assert len(set(tokens)) == len(tokens)


@pytest.mark.capability("semaphores")
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_killed_holder_frees_its_slot_after_its_ttl_not_before(
    backend_name: str,
    backend_url: str,
    store: corral.Store,
    name: str,
    holders: list[Holder],
    flavour: str,
) -> None:
    holder = Holder(backend_url, name, "hold", "--limit", "2", "--ttl", "4", "--flavour", flavour)
    holders.append(holder)
    token = holder.line()["token"]
    os.kill(holder.proc.pid, signal.SIGKILL)
    holder.proc.wait()
    other = store.semaphore(name, 2, ttl=30)
    assert other.acquire()  # the second slot was free all along
    late = store.semaphore(name, 2, ttl=30)
    assert not late.acquire(), "a SIGKILLed holder's slot was free before its TTL"
    time.sleep(1.0)
    info = store.semaphore_info(name)
    assert info is not None and token in [h.token for h in info.holders], "freed too soon"
    assert late.acquire(wait=4 + capabilities(backend_name).ttl_slack + 5)
    assert late.token is not None and late.token > token
    late.release()
    other.release()


@pytest.mark.capability("semaphores")
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_stopped_holder_past_its_ttl_finds_its_slot_taken(
    backend_url: str, store: corral.Store, name: str, holders: list[Holder], flavour: str
) -> None:
    holder = Holder(backend_url, name, "stdin", "--limit", "2", "--ttl", "1", "--flavour", flavour)
    holders.append(holder)
    old_token = holder.line()["token"]
    os.kill(holder.proc.pid, signal.SIGSTOP)
    slots = [store.semaphore(name, 2, ttl=30) for _ in range(2)]
    for slot in slots:
        assert slot.acquire(wait=15)  # one of them only once the stopped holder's TTL ran out
        assert slot.token is not None and slot.token > old_token
    os.kill(holder.proc.pid, signal.SIGCONT)
    holder.send("go\n")
    assert holder.line() == {"extend": "LockLost", "release": "LockLost"}
    for slot in slots:
        assert slot.owned()  # the stale holder freed nothing
        slot.release()


def assert_one_leader(candidates: dict[str, Holder], leader: str) -> None:
    """Every live candidate names the same leader, and only that one says it leads."""
    for candidate in candidates.values():
        candidate.send("who\n")
    for identity, candidate in candidates.items():
        assert candidate.line() == {"leader": leader, "me": identity == leader}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_killed_leader_is_replaced_within_its_ttl(
    backend_name: str,
    backend_url: str,
    store: corral.Store,
    name: str,
    holders: list[Holder],
    flavour: str,
) -> None:
    ttl = 2.0
    candidates = {
        identity: Holder(
            backend_url,
            name,
            "campaign",
            "--identity",
            identity,
            "--ttl",
            str(ttl),
            "--flavour",
            flavour,
        )
        for identity in ("a", "b", "c")
    }
    holders.extend(candidates.values())
    election = store.election(name)
    first_leader = election.leader()
    if first_leader is None:  # the candidates are still starting
        assert election.wait_for_change(timeout=60)
        first_leader = election.leader()
    assert first_leader in candidates
    first = candidates[first_leader].line()
    assert first["elected"] == first_leader
    assert_one_leader(candidates, first_leader)
    killed_at = time.monotonic()
    os.kill(candidates[first_leader].proc.pid, signal.SIGKILL)
    candidates[first_leader].proc.wait()
    rest = {i: c for i, c in candidates.items() if i != first_leader}
    deadline = time.monotonic() + ttl + 10
    second_leader = election.leader()
    while second_leader in (None, first_leader) and time.monotonic() < deadline:
        # First nobody leads (the dead leader's TTL ran out), then a follower does.
        election.wait_for_change(timeout=max(0.0, deadline - time.monotonic()))
        second_leader = election.leader()
    assert second_leader in rest
    second = rest[second_leader].line()
    assert second["elected"] == second_leader
    assert second["term"] > first["term"]
    # A leader that dies is replaced within its TTL plus the backend's slack; the margin
    # covers renewals made just before the kill, scheduling and one wake-up.
    slack = capabilities(backend_name).ttl_slack
    assert second["at"] - killed_at <= ttl + slack + 2.0
    assert_one_leader(rest, second_leader)
    info = store.lock_info(lock_name(name))
    assert info is not None and info.token == second["term"]
