"""The lock's decisions, with no I/O: when to try again, when to give up, when to renew.

The sync and async lock handles are thin drivers: they perform the attempt or
the renewal a plan asks for and feed the result back. Every timing rule lives
here, where a fake clock tests it exactly.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import socket

from corral.core.backoff import Backoff
from corral.core.primitives import Attempt, Outcome
from corral.errors import LockError, LockExpired, LockLost

__all__ = [
    "STARVE_AFTER",
    "RenewalSchedule",
    "WaitPlan",
    "make_owner",
    "outcome_error",
]

_HOST = socket.gethostname()

# With pushed wake-ups a waiter still re-checks now and then: a notification
# can be lost with a dropped connection, and an expiry is never announced.
NOTIFIED_RECHECK = 1.0
# A TTL reported as 0 still needs a moment to pass on the server.
MIN_WAIT = 0.0005
# Below this much lease left, a renewal retry could not land in time.
MIN_RETRY = 0.001
# The longest pause between the polls of a waiter in the queue (backends that cannot
# push a wake-up): short, since the lock waits for the queue's head.
QUEUED_POLL_CAP = 0.01
# A default (unfair) lock lets a newcomer take a free lock before the waiters,
# which is fast, until a waiter has waited this long: then it joins the lock's
# queue, and nobody may take the lock past it (Go's sync.Mutex does the same).
STARVE_AFTER = 0.1


# Characters no server should have to store in an owner id: control characters and
# lone surrogates (a thread may be given any name).
_UNSTORABLE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


# Unique per process: 64 random bits, drawn again whenever the process id changes (a
# fork, with or without Python's fork hooks). Each owner id adds a count to them,
# which is cheaper than drawing random bytes from the kernel per attempt.
_PROCESS_PART = (os.getpid(), secrets.token_hex(8), itertools.count())


def make_owner(label: str) -> str:
    """A unique, readable owner id: who holds the lock, for humans and for compare-and-delete."""
    global _PROCESS_PART
    pid, random_part, attempts = _PROCESS_PART
    if pid != os.getpid():
        pid, random_part, attempts = _PROCESS_PART = (
            os.getpid(),
            secrets.token_hex(8),
            itertools.count(),
        )
    if _UNSTORABLE.search(label):
        label = _UNSTORABLE.sub("?", label)
    return f"{_HOST}:{pid}:{label}:{random_part}{next(attempts):x}"


class WaitPlan:
    """Deadline bookkeeping for one `acquire()` call.

    After each failed attempt the driver asks `next_wait()`: None means give
    up (the wait is over, or `fail_fast` saw a holder who will outlast it);
    otherwise wait that many seconds for a wake-up, then attempt again.
    """

    def __init__(
        self,
        *,
        now: float,
        wait: float | None,
        fail_fast: bool,
        notifies: bool,
        backoff: Backoff | None = None,
        refresh_every: float | None = None,
        queue_after: float | None = None,
    ) -> None:
        self.deadline = None if wait is None else now + wait
        self.fail_fast = fail_fast
        self.notifies = notifies
        # A fair waiter is in the queue from the start: it polls briskly (see `queue`).
        queued_cap = QUEUED_POLL_CAP if refresh_every is not None else None
        self.backoff = backoff or (Backoff(cap=queued_cap) if queued_cap else Backoff())
        self.refresh_every = refresh_every
        # A wait that ends before the starvation guard would start never queues: joining a
        # queue only to leave it costs round trips, and on a slow first attempt it would
        # turn a short, unfair wait into a queued one.
        queue_at = None if queue_after is None else now + queue_after
        if queue_at is not None and self.deadline is not None and self.deadline <= queue_at:
            queue_at = None
        self.queue_at = queue_at

    def should_queue(self, now: float) -> bool:
        """True once a waiter that started outside the queue has waited long enough to join it.

        From then on it waits in the queue (refreshing its place as a fair
        waiter does), so a newcomer can no longer take the lock before it.
        """
        # Past the deadline the wait is over: joining now would only buy an attempt the
        # caller did not ask for (one that could grant the lock late), then a leave.
        if self.queue_at is None or now < self.queue_at:
            return False
        return self.deadline is None or now < self.deadline

    def queue(self, refresh_every: float) -> None:
        """The waiter joined the queue: refresh its place this often, never queue again.

        Where waiters poll, a queued one polls briskly from now on: nobody may take
        the lock before the queue's head, so the lock stays idle until the head's
        next poll finds it free.
        """
        self.queue_at = None
        self.refresh_every = refresh_every
        self.backoff = Backoff(initial=self.backoff.initial, cap=QUEUED_POLL_CAP)

    def remaining(self, now: float) -> float | None:
        return None if self.deadline is None else self.deadline - now

    def next_wait(self, now: float, attempt: Attempt) -> float | None:
        remaining = self.remaining(now)
        if remaining is not None and remaining <= 0:
            return None
        holder_ttl = attempt.holder_ttl
        if (
            self.fail_fast
            and remaining is not None
            and holder_ttl is not None
            and holder_ttl > remaining
        ):
            return None
        limits: list[float] = []
        if remaining is not None:
            limits.append(remaining)
        if holder_ttl is not None:
            # Be there the moment the holder's TTL runs out: nobody announces an expiry.
            limits.append(max(holder_ttl, MIN_WAIT))
        limits.append(NOTIFIED_RECHECK if self.notifies else self.backoff.next())
        if self.refresh_every is not None:
            limits.append(self.refresh_every)
        if self.queue_at is not None:
            limits.append(self.queue_at - now)
        return max(min(limits), 0.0)


class RenewalSchedule:
    """When an auto-renewed lock is next extended, and when to give it up as lost.

    Renewal happens every ttl/3, so two consecutive failures still leave time
    for a third try. `valid_until` is measured from *before* the extend
    request was sent, so it can only under-estimate the server's expiry.
    """

    def __init__(
        self,
        ttl: float,
        acquired_at: float,
        backoff: Backoff | None = None,
        valid_for: float | None = None,
    ) -> None:
        self.ttl = ttl
        self.interval = ttl / 3
        # A grant may be promised for less than its ttl (a quorum's drift allowance).
        self.valid_until = acquired_at + (ttl if valid_for is None else min(ttl, valid_for))
        self.due = acquired_at + self.interval
        self._backoff = backoff or Backoff(initial=min(0.05, ttl / 30), cap=max(ttl / 10, 0.001))

    def renewed(self, sent_at: float, ttl: float | None = None) -> None:
        if ttl is not None:
            self.ttl = ttl
            self.interval = ttl / 3
        self.valid_until = sent_at + self.ttl
        self.due = sent_at + self.interval
        self._backoff.reset()

    def failed(self, now: float) -> bool:
        """A transient error: schedule a retry. False when the lease has surely run out."""
        left = self.valid_until - now
        if left <= MIN_RETRY:
            return False
        self.due = now + min(self._backoff.next(), left / 2)
        return True


def outcome_error(
    outcome: Outcome,
    name: str,
    server: str,
    action: str,
    *,
    auto_renew: bool = False,
    kind: str = "lock",
) -> LockError | None:
    """The error a caller sees for a release or extend that found the lock not theirs.

    The advice depends on what the holder did: a lock that was auto-renewed was
    lost to a force-release, or to renewals that could not reach the server (or
    a process paused) for a whole TTL, not to a TTL that was too short.
    """
    if outcome is Outcome.OK:
        return None
    if auto_renew:
        advice = (
            "it was auto-renewed, so it was force-released, or this process could not "
            "renew it for a whole TTL (server unreachable, or the process was paused)"
        )
    else:
        advice = "use a longer ttl or auto_renew=True"
    if kind == "lock":
        expired, lost = "nobody holds it now", "another owner holds it now"
    elif kind == "election":
        expired, lost = "nobody leads now", "another campaigner leads now"
    else:
        expired = "a slot is free now"
        lost = "every slot is taken by other owners now"
    if outcome is Outcome.EXPIRED:
        return LockExpired(
            f"cannot {action} {kind} {name!r} on {server}: its TTL ran out or it was "
            f"force-released, and {expired}; work done since may have "
            f"overlapped with another holder ({advice})"
        )
    return LockLost(
        f"cannot {action} {kind} {name!r} on {server}: its TTL ran out and {lost}; "
        "stop the work and let the fencing token refuse stale "
        f"writes ({advice})"
    )
