# Generated from src/corral/_async/lock.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""The distributed lock handle, written once over every backend's primitives.

**Who owns an acquisition.** The handle does, not a thread-local or a context
variable: it can be released from another thread or task than the one that
acquired it, as a `threading.Lock` can. A handle shared by several threads or
tasks (a module-level `store.lock("x")`) excludes them as a `threading.Lock` /
`asyncio.Lock` would: the second waits for the first to release (or gives up
after its `wait`), and never enters beside it. `reentrant=True` lets the one
thread or task that holds it enter again, as an `RLock` does; a loss found
while re-entered is raised, never papered over with a fresh acquisition.

Timing decisions come from `corral.core.lockflow`; this module only performs
what they ask for, and keeps the handle's state consistent whatever is
interrupted where: see `acquire` for cancellation, `release` for clean-up.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from corral._sync import _compat
from corral._sync._compat import (
    Gate,
    call_maybe_async,
    current_task,
    current_task_label,
    finish_anyway,
    shield,
    start_job,
    undo_if_interrupted,
)
from corral._sync.backends.base import Waiter
from corral._sync.renewer import renewer
from corral.core import forks
from corral.core.forks import ProcessLock
from corral.core.lockflow import (
    STARVE_AFTER,
    RenewalSchedule,
    WaitPlan,
    make_owner,
    outcome_error,
)
from corral.core.primitives import Attempt, LockInfo, Outcome
from corral.core.validate import check_non_negative, check_ttl, check_wait
from corral.errors import (
    BackendError,
    BackendUnavailable,
    LockError,
    LockLost,
    LockTimeout,
)

if TYPE_CHECKING:
    from corral._sync.store import Store
    from corral.core.stats import Metrics

__all__ = ["Acquisition", "Lock"]

log = logging.getLogger("corral.lock")


def add_note(exc: BaseException, note: str) -> None:
    """`BaseException.add_note` where it exists (3.11+), its attribute where not."""
    notes = getattr(exc, "__notes__", None)
    if notes is None:
        notes = []
        try:
            exc.__notes__ = notes  # type: ignore[attr-defined]
        except AttributeError:
            return
    notes.append(note)


def describe_holder(info: LockInfo) -> str:
    if info.owner is None:
        return (
            f"it is kept closed, with no owner, for {info.ttl:.1f} s more (release(hold_for=...))"
        )
    return f"held by {info.owner} (token {info.token}, {info.ttl:.1f} s left)"


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


_UNSET: Final = _Unset()

# How long a queued waiter keeps its place without refreshing it: a waiter that
# dies is skipped after this long, and live waiters refresh well before.
FAIR_QUEUE_TTL = 3.0
# How long to wait for replicas to acknowledge an acquisition (replicas=N).
REPLICA_TIMEOUT = 1.0


@dataclass(slots=True, eq=False)
class _Held:
    """One acquisition, as this handle knows it."""

    owner: str
    token: int
    pid: int
    holder: object
    """The thread or task that acquired it: the only one that may re-enter."""
    schedule: RenewalSchedule
    granted_at: float
    count: int = 1
    lost: LockError | None = None
    hold_for: float = 0.0
    """The longest `hold_for` asked of any release, applied by the last one."""
    released: bool = False
    """Set first thing by `release`: a renewal answering afterwards means nothing."""
    extending: _compat.Lock = field(default_factory=_compat.Lock)
    """One extend at a time (the user's or a renewal), so the schedule follows the server."""


class Lock:
    """A named lock with a TTL, a fencing token and an owner, shared through a store.

    Created by `Store.lock()`; docs/locks.md describes it.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        ttl: float,
        *,
        wait: float | None,
        auto_renew: bool,
        reentrant: bool,
        on_lost: Callable[[Lock], Any] | None,
        fair: bool,
        replicas: int,
    ) -> None:
        self._store = store
        self._backend = store.backend
        self._stats = self._metrics(store)
        self.name = name
        self.shown_name = name
        """The name messages show (an election's lock has a prefixed name of its own)."""
        self.ttl = ttl
        self.wait = wait
        self.auto_renew = auto_renew
        self.reentrant = reentrant
        self.on_lost = on_lost
        self.fair = fair
        self.replicas = replicas
        self._held: _Held | None = None
        # Guards `_held` against two threads releasing at once; never held across I/O.
        self._state = ProcessLock()
        self._gate = Gate()
        self._gate_pid = forks.pid()
        # The acquisitions `with` blocks entered, per thread or task (see __exit__).
        self._entered: dict[object, list[_Held]] = {}

    kind = "lock"
    """What the handle is called in messages."""
    joins_queue = True
    """Whether a waiter joins the queue after waiting `STARVE_AFTER` (the starvation guard).

    Not for waits that are meant to last as long as a holder holds (an election's
    campaigners): a queued waiter polls often on backends that cannot push.
    """

    def _metrics(self, store: Store) -> Metrics:
        return store.metrics.locks

    # -- the backend primitives this handle uses (a semaphore uses its slot ones) --

    def _server_attempt(self, owner: str, queue_ttl: float | None) -> Attempt:
        return self._backend.try_acquire(
            self.name,
            owner,
            self.ttl,
            queue_ttl=queue_ttl,
            replicas=self.replicas,
            replica_timeout=REPLICA_TIMEOUT,
        )

    def _server_release(self, owner: str, hold_for: float = 0.0) -> Outcome:
        return self._backend.release(self.name, owner, hold_for)

    def _server_extend(self, owner: str, ttl: float) -> Outcome:
        return self._backend.extend(self.name, owner, ttl)

    def _server_standing(self, owner: str) -> Outcome:
        """OK while `owner` holds it; else EXPIRED (free now) or LOST (another holds it)."""
        info = self._backend.inspect(self.name)
        if info is None:
            return Outcome.EXPIRED
        return Outcome.OK if info.owner == owner else Outcome.LOST

    def _server_busy(self) -> bool:
        return self._backend.inspect(self.name) is not None

    def _server_leave_queue(self, owner: str) -> None:
        self._backend.leave_queue(self.name, owner)

    def _server_waiter(self) -> Waiter:
        return self._backend.waiter(self.name)

    def _new_owner(self) -> str:
        """A fresh owner id for one acquisition: unique, and readable by whoever inspects it."""
        return make_owner(current_task_label())

    def __repr__(self) -> str:
        state = "held" if self.held else "not held"
        where = self._backend.server
        return f"<{type(self).__name__} {self.shown_name!r} ttl={self.ttl} {state} on {where}>"

    # -- what the handle knows without asking the server -------------------------

    @property
    def held(self) -> bool:
        """This handle believes it holds the lock (acquired here, not released, not known lost)."""
        held = self._mine()
        return held is not None and self._alive(held)

    @property
    def token(self) -> int | None:
        """The fencing token of the current acquisition: pass it to downstream storage."""
        held = self._mine()
        return None if held is None else held.token

    @property
    def owner(self) -> str | None:
        """The owner id of the current acquisition (host:pid:thread-or-task:random)."""
        held = self._mine()
        return None if held is None else held.owner

    @property
    def lost(self) -> LockError | None:
        """Why the current acquisition was found lost (renewal, extend, check), else None.

        Lets an `on_lost` callback say what happened without a round trip.
        """
        held = self._mine()
        return None if held is None else held.lost

    def clock_now(self) -> float:
        return self._store.clock.now()

    def _mine(self) -> _Held | None:
        held = self._held
        if held is None or held.pid != forks.pid():
            return None  # after fork, the child does not own its parent's locks
        return held

    def _alive(self, held: _Held) -> bool:
        """Not known lost, and the lease surely still runs (renewed or not)."""
        return held.lost is None and self.clock_now() < held.schedule.valid_until

    def _gate_here(self) -> Gate:
        # A forked child starts with the gate open: the parent's holder is not there.
        if self._gate_pid != forks.pid():
            with self._state:
                if self._gate_pid != forks.pid():
                    self._gate = Gate()
                    self._gate_pid = forks.pid()
        return self._gate

    # -- acquire ----------------------------------------------------------------

    def acquire(self, wait: float | _Unset | None = _UNSET, *, fail_fast: bool = False) -> bool:
        """Take the lock, waiting up to `wait` seconds (None: forever; 0: one attempt)."""
        seconds = self.wait if isinstance(wait, _Unset) else check_wait(wait)
        me = current_task()
        held = self._mine()
        if held is not None and held.holder is me:
            return self._reenter(held)
        started = self.clock_now()
        gate = self._gate_here()
        if not gate.acquire(seconds):
            self._stats.add("timeouts")
            return False
        try:
            if seconds is not None:
                seconds = max(0.0, seconds - (self.clock_now() - started))
            granted = self._acquire_on_server(me, seconds, fail_fast, started)
        except BaseException:
            gate.release()
            raise
        if not granted:
            gate.release()
            self._stats.add("timeouts")
        return granted

    def adopt(self, owner: str, attempt: Attempt, *, sent_at: float) -> bool:
        """Make an acquisition already made on the server (by a combined primitive, such as
        a cache read that claims the recompute lock) this handle's, as `acquire()` would.

        `owner` is the id the attempt was made with (from `new_owner()`), `sent_at`
        the clock reading when it was sent. Returns False, taking the acquisition
        back, when this handle is busy with another acquisition.
        """
        if not attempt.acquired:
            return False
        gate = self._gate_here()
        if self._mine() is not None or not gate.acquire(0):
            self._take_back(owner)
            return False
        try:
            return self._took(
                owner, current_task(), attempt, started=sent_at, sent_at=sent_at, contended=False
            )
        except BaseException:
            gate.release()
            raise

    def new_owner(self) -> str:
        """An owner id for an attempt made outside `acquire()` (see `adopt`)."""
        return self._new_owner()

    def take_back(self, owner: str) -> None:
        """Release an acquisition made with `owner` that nobody adopted (best effort)."""
        self._take_back(owner)

    def _reenter(self, held: _Held) -> bool:
        """The thread or task that holds the lock acquires it again."""
        if not self._alive(held):
            # Never replace a lost acquisition with a new one behind the caller's back:
            # another owner may have held the lock in between.
            error = held.lost or self._why_lost(held)
            self._lose(held, error, notify=False)
            self._forget(held)
            raise error
        if not self.reentrant:
            raise LockError(
                f"{self.kind} {self.shown_name!r}: this thread or task already holds it through "
                "this handle, so waiting for it would wait forever; pass reentrant=True to "
                "let the holder enter again (other threads and tasks still wait their turn)"
            )
        held.count += 1
        return True

    def _acquire_on_server(
        self, me: object, seconds: float | None, fail_fast: bool, started: float
    ) -> bool:
        owner = self._new_owner()
        queue_ttl = FAIR_QUEUE_TTL if self.fair else None
        sent_at = first_sent = self.clock_now()
        attempt = self._attempt(owner, queue_ttl)
        if attempt.acquired:
            return self._took(owner, me, attempt, started=started, sent_at=sent_at, contended=False)
        if seconds == 0:
            self._leave_queue(owner, queued=self.fair)
            return False
        queues = self._backend.capabilities.fair
        plan = WaitPlan(
            now=first_sent,  # the wait includes the first attempt's round trip
            wait=seconds,
            fail_fast=fail_fast,
            notifies=self._backend.capabilities.notifies,
            refresh_every=FAIR_QUEUE_TTL / 3 if self.fair else None,
            # Without fair=True, a waiter joins the queue once it has waited too long.
            queue_after=None if self.fair or not queues or not self.joins_queue else STARVE_AFTER,
        )
        granted: Attempt | None = None
        try:
            waiter = self._server_waiter()
            if self.fair:
                waiter.for_owner(owner)
            with waiter:
                # Subscribed before this attempt: a release from now on wakes us. A
                # waiter that cannot miss a release since the first attempt (its wake-ups
                # wait to be taken) goes straight to waiting.
                skip = not waiter.attempt_on_entering
                while True:
                    if skip:
                        skip = False
                    else:
                        sent_at = self.clock_now()
                        attempt = self._attempt(owner, queue_ttl)
                        if attempt.acquired:
                            granted = attempt
                            break
                    now = self.clock_now()
                    if plan.should_queue(now):
                        queue_ttl = FAIR_QUEUE_TTL
                        plan.queue(refresh_every=FAIR_QUEUE_TTL / 3)
                        waiter.for_owner(owner)
                        continue  # join the queue now, not after another wait
                    delay = plan.next_wait(now, attempt)
                    if delay is None:
                        break
                    waiter.wait(delay)
        except BackendError:
            if granted is not None:
                # Granted, then leaving the subscription failed: the lock is ours all
                # the same; the subscription's server trouble is not the caller's.
                return self._took(
                    owner, me, granted, started=started, sent_at=sent_at, contended=True
                )
            raise  # leaving the queue would wait on the failed server again; the place expires
        except BaseException:
            # Cancelled (or interrupted) after the grant, while leaving the subscription:
            # the caller will never know it holds the lock, so take it back.
            if granted is not None:
                self._take_back(owner)
            else:
                self._leave_queue(owner, queued=queue_ttl is not None)
            raise
        if granted is not None:
            return self._took(owner, me, granted, started=started, sent_at=sent_at, contended=True)
        self._leave_queue(owner, queued=queue_ttl is not None)
        return False

    def _attempt(self, owner: str, queue_ttl: float | None) -> Attempt:
        def attempt() -> Attempt:
            return self._server_attempt(owner, queue_ttl)

        def undo(result: Attempt | None) -> None:
            # Interrupted before the answer: the server may have granted it. Once the
            # attempt is over (never before: a take-back that overtakes the attempt
            # would find nothing), release what it took, so no lock is held by an owner
            # nobody knows. The owner id is unique to this attempt: nothing else is freed.
            if result is None or result.acquired:
                self._take_back(owner)
            # A refused attempt of a queued waiter (re)took its place after the caller
            # left the queue: leave it again, or it would hold back the waiters behind
            # it until the place expires.
            if queue_ttl is not None and (result is None or not result.acquired):
                self._leave_queue(owner, queued=True)

        # A BackendError from the attempt itself is raised with nothing undone: the
        # server may have granted it before the answer was lost, but taking it back
        # would mean a second wait on a server that just failed. Its TTL frees it.
        return undo_if_interrupted(attempt, undo)

    def _take_back(self, owner: str) -> None:
        try:
            shield(self._server_release(owner))
        except BaseException:
            log.debug(
                "could not take back an acquisition of %s %r",
                self.kind,
                self.shown_name,
                exc_info=True,
            )

    def _leave_queue(self, owner: str, *, queued: bool) -> None:
        if not queued:
            return
        try:
            self._server_leave_queue(owner)
        except BaseException:
            log.debug(
                "could not leave the queue of %s %r", self.kind, self.shown_name, exc_info=True
            )

    def _took(
        self,
        owner: str,
        me: object,
        attempt: Attempt,
        *,
        started: float,
        sent_at: float,
        contended: bool,
    ) -> bool:
        """Make the grant the handle's; if anything interrupts that, take the grant back."""
        try:
            return self._record_grant(
                owner, me, attempt, started=started, sent_at=sent_at, contended=contended
            )
        except BaseException:
            # Interrupted (Ctrl-C in the blocking flavour) between the server's grant and
            # acquire() returning: the caller sees no acquisition, so there must be none.
            with self._state:
                held = self._held
                if held is not None and held.owner == owner:
                    held.released = True
                    self._held = None
            if self.auto_renew:
                renewer().unregister(self)
            self._take_back(owner)
            raise

    def _record_grant(
        self,
        owner: str,
        me: object,
        attempt: Attempt,
        *,
        started: float,
        sent_at: float,
        contended: bool,
    ) -> bool:
        assert attempt.token is not None
        now = self.clock_now()
        held = _Held(
            owner=owner,
            token=attempt.token,
            pid=forks.pid(),
            holder=me,
            # Timed from before the request that won was sent: it can only under-estimate
            # the server's expiry.
            schedule=RenewalSchedule(self.ttl, sent_at, valid_for=attempt.valid_for),
            granted_at=now,
        )
        if self.replicas and (attempt.replicas_acked or 0) < self.replicas:
            shield(self._server_release(owner))
            raise BackendUnavailable(
                f"{self.kind} {self.shown_name!r} on {self._backend.server}: only "
                f"{attempt.replicas_acked or 0} of {self.replicas} replicas acknowledged "
                f"the acquisition within {REPLICA_TIMEOUT} s; released it (check "
                "replication, or lower replicas=)"
            )
        self._held = held
        self._stats.record(
            ("acquisitions", "contended") if contended else ("acquisitions",),
            "wait_seconds",
            now - started,
        )
        if self.auto_renew:
            renewer().register(self)
        return True

    def set_aside_lost(self) -> None:
        """Drop this task's acquisition that is over (known lost, or its lease surely ran out).

        For callers that start afresh on purpose (an election campaigning for a
        new term); `acquire()` itself refuses to paper over a loss. A loss not
        reported yet is reported first (`on_lost`), and whatever the server may
        still keep under the old owner id (a renewal that landed late) is taken
        back, so it cannot block the new acquisition.
        """
        held = self._mine()
        if held is None or held.holder is not current_task() or self._alive(held):
            return
        if held.lost is None:
            self._lose(held, self._why_lost(held))
        self._forget(held)
        self._take_back(held.owner)

    # -- release, extend, check -------------------------------------------------

    def _require(self, action: str) -> _Held:
        held = self._mine()
        if held is None:
            raise LockError(
                f"cannot {action} {self.kind} {self.shown_name!r}: this handle does not hold it"
            )
        return held

    def _forget(self, held: _Held) -> bool:
        """Drop `held` from the handle (once) and open the gate; False if already dropped."""
        with self._state:
            if self._held is not held:
                return False
            held.released = True
            self._held = None
        if self.auto_renew:
            renewer().unregister(self)
        self._gate.release()
        return True

    def release(self, hold_for: float = 0.0) -> None:
        """Free the lock if this handle still owns it (atomic compare-and-delete).

        `hold_for=S` keeps it closed, ownerless, for S more seconds: a job that
        must run at most once per S releases with hold_for=S. On a reentrant
        handle entered several times, it applies when the last release frees it.
        """
        hold = check_non_negative(hold_for, "hold_for")
        self._release(self._require("release"), hold)

    def _release(self, held: _Held, hold: float) -> None:
        if self.reentrant and held.holder is not current_task():
            raise LockError(
                f"cannot release {self.kind} {self.shown_name!r}: another thread or task holds "
                "it through this reentrant handle; the one that acquired it releases it"
            )
        held.hold_for = max(held.hold_for, hold)
        if held.count > 1 and held.lost is None:
            held.count -= 1
            return
        # Forget first: a release that is cancelled or fails must not leave the
        # handle believing it holds; the server's TTL frees the lock anyway.
        if not self._forget(held):
            raise LockError(
                f"cannot release {self.kind} {self.shown_name!r}: it was released already"
            )
        self._stats.record((), "hold_seconds", self.clock_now() - held.granted_at)

        def release() -> Outcome:
            return self._server_release(held.owner, held.hold_for)

        # Finished even if the caller is cancelled meanwhile: a release half-sent is
        # worse than one that completes a moment after its caller left.
        outcome = finish_anyway(release)
        error = self._error(outcome, "release")
        if error is not None:
            if held.lost is None:
                self._stats.add("losses")
            raise error
        if held.lost is not None:
            # The server still had it (a renewal answered after the lease surely ran
            # out), but the loss was reported: work done since may not have been
            # exclusive. The release, like check() and extend(), says so.
            raise held.lost

    def extend(self, ttl: float | None = None) -> None:
        """Reset the TTL (to `ttl`, else the lock's own) if this handle still owns it.

        With `auto_renew`, later renewals use the new TTL and come every third of it.
        """
        seconds = self.ttl if ttl is None else check_ttl(ttl)
        self._extend(self._require("extend"), seconds)

    def _extend(self, held: _Held, seconds: float) -> None:
        if held.lost is not None:
            raise held.lost
        with held.extending:
            sent_at = self.clock_now()
            outcome = self._server_extend(held.owner, seconds)
            if outcome is Outcome.OK:
                held.schedule.renewed(sent_at, seconds)
        if outcome is Outcome.OK:
            if self.auto_renew:
                renewer().wake()  # the next renewal may now be due sooner
            return
        error = self._error(outcome, "extend")
        assert error is not None
        self._lose(held, error, notify=False)
        raise error

    def check(self) -> None:
        """Raise `LockLost`/`LockExpired` if this handle no longer owns the lock on the server."""
        self._check(self._require("check"))

    def _check(self, held: _Held) -> None:
        if held.lost is not None:
            raise held.lost
        error = self._error(self._server_standing(held.owner), "keep")
        if error is not None:
            self._lose(held, error, notify=False)
            raise error

    def owned(self) -> bool:
        """Whether this handle owns the lock right now, as the server sees it."""
        held = self._mine()
        return held is not None and self._owns(held)

    def _owns(self, held: _Held) -> bool:
        if held.lost is not None or held.released:
            return False
        return self._server_standing(held.owner) is Outcome.OK

    def locked(self) -> bool:
        """Whether anyone holds the lock (or keeps it closed with hold_for) right now."""
        return self._server_busy()

    def _why_lost(self, held: _Held) -> LockError:
        """Expired or taken over? A lease that surely ran out is one or the other: ask."""
        outcome = self._server_standing(held.owner)
        error = self._error(Outcome.EXPIRED if outcome is Outcome.OK else outcome, "keep")
        assert error is not None
        return error

    def _error(self, outcome: Outcome, action: str) -> LockError | None:
        return outcome_error(
            outcome,
            self.shown_name,
            self._backend.server,
            action,
            auto_renew=self.auto_renew,
            kind=self.kind,
        )

    # -- renewal (scheduled by the renewal worker, each renewal its own job) -------

    def renewal_plan(self) -> tuple[float, float] | None:
        """(when the next renewal is due, when the lease surely ends), or None when over."""
        held = self._mine()
        if held is None or held.lost is not None or held.released or not self.auto_renew:
            return None
        return held.schedule.due, held.schedule.valid_until

    def renew_once(self) -> None:
        """Extend once, as the schedule asked; retry later on a network error."""
        held = self._mine()
        if held is None or held.lost is not None or held.released:
            return
        try:
            with held.extending:
                ttl = held.schedule.ttl
                sent_at = self.clock_now()
                outcome = self._server_extend(held.owner, ttl)
                if outcome is Outcome.OK and not held.released and held.lost is None:
                    held.schedule.renewed(sent_at, ttl)
        except Exception as exc:
            if held.released or held.lost is not None:
                return
            self._stats.add("renewal_failures")
            if not isinstance(exc, BackendError):
                # Not the network: a bug somewhere. Retried like a network error (with
                # backoff, while the lease lasts), never in a tight loop.
                log.exception("renewing %s %r failed unexpectedly", self.kind, self.shown_name)
            if held.schedule.failed(self.clock_now()):
                log.warning(
                    "renewing %s %r on %s failed (%s); retrying while its TTL lasts",
                    self.kind,
                    self.shown_name,
                    self._backend.server,
                    exc,
                )
                return
            self._lose(
                held,
                LockLost(
                    f"{self.kind} {self.shown_name!r} on {self._backend.server}: could not renew "
                    f"it before its TTL ran out ({exc}); assume another process may hold it now"
                ),
            )
            return
        if held.released or held.lost is not None:
            return  # released (or given up) while the renewal was in flight: nothing to report
        if outcome is Outcome.OK:
            self._stats.add("renewals")
            return
        error = self._error(outcome, "renew")
        assert error is not None
        self._lose(held, error)

    def lease_ran_out(self) -> None:
        """The renewal in flight did not answer before the lease surely ended: it is lost."""
        held = self._mine()
        if held is None or held.lost is not None or held.released:
            return
        self._lose(
            held,
            LockLost(
                f"{self.kind} {self.shown_name!r} on {self._backend.server}: the server did "
                f"not answer the renewal before the {self.kind}'s TTL ran out; assume "
                "another process may hold it now"
            ),
        )

    def _lose(self, held: _Held, error: LockError, *, notify: bool = True) -> None:
        """Record the loss once; with `notify`, tell `on_lost` in a job of its own.

        The callback never runs on the renewal worker: a slow one would delay
        every other lock's renewal.
        """
        with self._state:
            if held.lost is not None or held.released:
                return
            held.lost = error
        self._stats.add("losses")
        if self.auto_renew:
            renewer().unregister(self)
        if not notify:
            return
        if self.on_lost is None:
            log.warning("%s", error)
            return
        log.info("%s", error)
        start_job(self._call_on_lost)

    def _call_on_lost(self) -> None:
        assert self.on_lost is not None
        try:
            call_maybe_async(self.on_lost, self)
        except Exception:
            log.exception("on_lost callback of %s %r raised", self.kind, self.shown_name)

    # -- context manager --------------------------------------------------------

    def __enter__(self) -> Acquisition:
        if not self.acquire():
            raise self._timeout_error()
        held = self._mine()
        assert held is not None
        # Remember which acquisition this block entered, per thread or task: when a
        # handle is shared, another thread's acquisition may be current when this
        # block leaves, and that one is not this block's to release.
        with self._state:
            self._entered.setdefault(current_task(), []).append(held)
        return Acquisition(self, held)

    def _block_leaving(self) -> _Held | None:
        """The acquisition the block now leaving entered (called under `_state`).

        Usually this task's last entry. A block may also leave on another thread
        than it entered (a web framework running a dependency's enter and exit in
        two calls of its thread pool): then it is the entry, of any task, whose
        acquisition is the current one.
        """
        me = current_task()
        stack = self._entered.get(me)
        if stack:
            held = stack.pop()
            if not stack:
                del self._entered[me]
            return held
        current = self._held
        for task, entries in self._entered.items():
            if current is not None and current in entries:
                entries.remove(current)
                if not entries:
                    del self._entered[task]
                return current
        return None  # this block's acquisition is over already: nothing to release

    def _timeout_error(self) -> LockTimeout:
        """What the caller of `with store.lock(...)` needs when it timed out: who holds it."""
        try:
            state, info = self._busy_state()
        except BackendError:
            state, info = "the server could not say who holds it", None
        where = f"{self.kind} {self.shown_name!r} on {self._backend.server}"
        waited = f"was not acquired within {self.wait:g} s" if self.wait else "is busy"
        hint = ""
        if self._backend.capabilities.cross_process:
            hint = (
                f"; see `corral status {shlex.quote(self.shown_name)} "
                f"--url {shlex.quote(self._store.url)}`"
            )
        return LockTimeout(
            f"{where} {waited}: {state}{hint}",
            owner=None if info is None else info.owner,
            token=None if info is None else info.token,
            ttl=None if info is None else info.ttl,
            server=self._backend.server,
        )

    def _busy_state(self) -> tuple[str, LockInfo | None]:
        """Who keeps it busy, in words, and the holder a `LockTimeout` describes."""
        info = self._backend.inspect(self.name)
        if info is None:
            return "nobody holds it now (it was freed as the wait ran out); retry", None
        return describe_holder(info), info

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._state:
            held = self._block_leaving()
        if held is None or held is not self._mine():
            # Released inside the block (held.release()), never this block's, or the
            # parent's, in a child forked inside the block.
            return
        try:
            self._release(held, 0.0)
        except (LockError, BackendError) as release_error:
            if exc is None:
                raise
            # Never mask the exception already in flight: attach the lock's fate to it.
            add_note(exc, f"corral: also, on leaving the block: {release_error}")
            log.warning("%s (while handling %r)", release_error, exc)


class Acquisition:
    """What `with store.lock(...) as held:` gives: the acquisition this block entered.

    Inside the block the lock is held, so `token` is an `int` and `owner` a
    `str`, not optional as on the handle. Its methods act on this acquisition
    only, even when another thread or task shares the handle and holds it by
    the time they are called.
    """

    __slots__ = ("_held", "lock")

    def __init__(self, lock: Lock, held: _Held) -> None:
        self.lock = lock
        self._held = held

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.lock!r} token={self.token}>"

    @property
    def name(self) -> str:
        return self.lock.name

    @property
    def token(self) -> int:
        return self._held.token

    @property
    def owner(self) -> str:
        return self._held.owner

    @property
    def held(self) -> bool:
        """Still this handle's acquisition, not known lost, its lease surely running."""
        return self.lock._held is self._held and self.lock._alive(self._held)

    @property
    def lost(self) -> LockError | None:
        return self._held.lost

    def _current(self, action: str) -> _Held:
        if self.lock._mine() is not self._held:
            raise LockError(
                f"cannot {action} {self.lock.kind} {self.lock.shown_name!r}: "
                "this acquisition was released"
            )
        return self._held

    def extend(self, ttl: float | None = None) -> None:
        seconds = self.lock.ttl if ttl is None else check_ttl(ttl)
        self.lock._extend(self._current("extend"), seconds)

    def check(self) -> None:
        self.lock._check(self._current("check"))

    def owned(self) -> bool:
        return self.lock._owns(self._held)

    def release(self, hold_for: float = 0.0) -> None:
        hold = check_non_negative(hold_for, "hold_for")
        self.lock._release(self._current("release"), hold)
