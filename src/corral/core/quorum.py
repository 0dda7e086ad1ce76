"""Quorum decisions for locks over independent masters (`redis+redlock://`), free of I/O.

A lock over N independent masters is held when a majority of them granted it,
and only for as long as the slowest answer leaves: each master started its TTL
when it received the request, which is after the client sent it, so the client
may count on the TTL from the moment it sent the first request, less the time
the round trip took and less an allowance for the masters' clocks running at
slightly different rates (`drift`). Any two majorities share a master; that is
what makes two holders at once impossible while the masters keep their data
and their clocks, and what keeps fencing tokens increasing when successive
majorities differ (see `decide_acquire`).

The backend performs the requests; these functions take what each master
answered (None where it did not answer: an error or a timeout) and the time
spent, and say what it means. `tests/core/test_quorum.py` drives them directly.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from corral.core.primitives import Attempt, LockInfo, Outcome

__all__ = [
    "DRIFT_FACTOR",
    "DRIFT_FIXED",
    "MASTER_TIMEOUT_SHARE",
    "Acquisition",
    "decide_acquire",
    "decide_change",
    "decide_inspect",
    "decide_release",
    "drift",
    "majority",
    "master_timeout",
    "validity",
]

DRIFT_FACTOR = 0.01
"""The share of the TTL allowed for the masters' clocks running at different rates."""
DRIFT_FIXED = 0.002
"""Seconds added to the drift allowance: the masters' timers are not exact either."""
MASTER_TIMEOUT_SHARE = 1 / 3
"""At most this share of the TTL is spent waiting for any one master's answer to an
attempt, so a slow or silent master cannot eat the validity of a grant."""


def majority(masters: int) -> int:
    """How many of `masters` make a quorum: more than half."""
    if masters < 1:
        raise ValueError(f"a quorum needs at least one master, not {masters}")
    return masters // 2 + 1


def drift(ttl: float) -> float:
    """The clock-drift allowance for a lock of `ttl` seconds: 1 % of it plus 2 ms."""
    return ttl * DRIFT_FACTOR + DRIFT_FIXED


def validity(ttl: float, elapsed: float) -> float:
    """Seconds a grant is still good for, `elapsed` seconds after its first request was sent.

    Negative or zero when the requests took so long that the lock may already
    have run out on some master.
    """
    return ttl - elapsed - drift(ttl)


def master_timeout(ttl: float, timeout: float) -> float:
    """How long an attempt waits for one master: the socket `timeout`, at most a third of TTL."""
    return min(timeout, ttl * MASTER_TIMEOUT_SHARE)


@dataclass(frozen=True, slots=True)
class Acquisition:
    """What a round of attempts on every master means.

    `reachable` is False when fewer than a majority answered: nothing can be
    decided (the caller reports the masters unavailable). `granted` is True
    when a majority granted it with validity left. `token` is the largest of
    the granting masters' tokens: the acquisition's fencing token, which the
    caller writes back to the granting masters (see `decide_acquire`).
    `holder_ttl` estimates, when not granted, how long until a majority could
    be free (None when unknown).
    """

    reachable: bool
    granted: bool
    grants: int
    token: int | None
    validity: float
    holder_ttl: float | None


def decide_acquire(replies: Sequence[Attempt | None], ttl: float, elapsed: float) -> Acquisition:
    """Decide a round of attempts, one reply per master (None: no answer in time).

    Granted iff a majority granted and `validity(ttl, elapsed) > 0`. The token
    is the largest granting master's token T. Each master's next token exceeds
    its own counter, so once the caller raises the counter to at least T on a
    majority before returning, the next acquisition, whose majority shares at
    least one master with this one, gets a token above T, even when the two
    majorities differ.
    """
    needed = majority(len(replies))
    answered = [reply for reply in replies if reply is not None]
    granting = [reply for reply in answered if reply.acquired]
    tokens = [reply.token for reply in granting if reply.token is not None]
    token = max(tokens) if tokens else None
    left = validity(ttl, elapsed)
    granted = len(granting) >= needed and left > 0 and token is not None
    holder_ttl: float | None = None
    if not granted:
        # A majority is free once `short` more masters are: the ones refused now whose
        # holders end soonest (a grant of this round is released, so it counts as free).
        short = needed - len(granting)
        known = sorted(
            reply.holder_ttl
            for reply in answered
            if not reply.acquired and reply.holder_ttl is not None
        )
        if short > 0 and len(known) >= short:
            holder_ttl = known[short - 1]
    return Acquisition(
        reachable=len(answered) >= needed,
        granted=granted,
        grants=len(granting),
        token=token,
        validity=left,
        holder_ttl=holder_ttl,
    )


def decide_change(
    outcomes: Sequence[Outcome | None], *, elapsed: float = 0.0, ttl: float | None = None
) -> Outcome | None:
    """What a release or extend on every master means; None when fewer than a majority answered.

    OK when a majority applied it (for an extend, `ttl`, also with validity
    left after `elapsed` seconds). Otherwise LOST when another owner may hold
    a majority (the masters that answered LOST, with those that did not
    answer, could make one), else EXPIRED: nobody holds it by a majority.
    """
    needed = majority(len(outcomes))
    answered = [outcome for outcome in outcomes if outcome is not None]
    if len(answered) < needed:
        return None
    applied = sum(outcome is Outcome.OK for outcome in answered)
    in_time = ttl is None or validity(ttl, elapsed) > 0
    if applied >= needed and in_time:
        return Outcome.OK
    lost = sum(outcome is Outcome.LOST for outcome in answered)
    silent = len(outcomes) - len(answered)
    if lost > 0 and lost + silent >= needed:
        return Outcome.LOST
    return Outcome.EXPIRED


def decide_release(
    outcomes: Sequence[Outcome | None], held_on: Collection[int] | None = None
) -> Outcome | None:
    """What a release on every master means; None when fewer than a majority answered.

    OK as `decide_change` says, and also when the masters that did not answer
    could have made a majority with those that released: a lock granted by
    exactly a majority keeps a master that has since died (and will come back
    with it, its data being kept), so its owner still held it until now, and
    nobody else could have taken it meanwhile. Only a silent master that may
    hold the grant counts for that: one of `held_on` (the indexes of the
    masters that granted it or had not answered yet; None: any). A master
    that never granted it, silent now, says nothing of whether the owner kept
    its majority (while another owner answering elsewhere says it may not have).
    """
    outcome = decide_change(outcomes)
    if outcome is None or outcome is Outcome.OK:
        return outcome
    applied = sum(found is Outcome.OK for found in outcomes)
    silent = sum(
        found is None and (held_on is None or index in held_on)
        for index, found in enumerate(outcomes)
    )
    if applied > 0 and applied + silent >= majority(len(outcomes)):
        return Outcome.OK
    return outcome


def decide_inspect(name: str, found: Sequence[LockInfo | None], masters: int) -> LockInfo | None:
    """Who holds the lock by a majority, from what the masters that answered hold (None: free).

    The holder is the owner (None for a lock closed by `hold_for`) found on a
    majority of all `masters`; its TTL is the time until fewer than a majority
    still hold it. Its token is the one a majority of the masters holds: the
    acquisition's, which it wrote back to a majority; else the smallest found
    (a master whose grant came too late to be counted has a token of its own,
    which the write-back made larger than the acquisition's).
    None when no owner holds a majority.
    """
    needed = majority(masters)
    by_owner: dict[str | None, list[LockInfo]] = {}
    for info in found:
        if info is not None:
            by_owner.setdefault(info.owner, []).append(info)
    for owner, infos in by_owner.items():
        if len(infos) >= needed:
            ttls = sorted((info.ttl for info in infos), reverse=True)
            tokens = [info.token for info in infos]
            agreed = [token for token in tokens if tokens.count(token) >= needed]
            return LockInfo(name, owner, min(agreed or tokens), ttls[needed - 1])
    return None
