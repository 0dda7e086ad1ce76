# Generated from src/corral/_async/lock.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""The distributed lock handle, written once over every backend's primitives.

The handle owns the acquisition (not the thread or task that made it), so it
can be released from another thread or task, and it never consults
thread-local storage. Timing decisions come from `corral.core.lockflow`; this
module only performs what they ask for.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from corral._sync._compat import call_maybe_async, current_task_label, shield
from corral._sync.renewer import renewer
from corral.core.lockflow import RenewalSchedule, WaitPlan, make_owner, outcome_error
from corral.core.primitives import Attempt, Outcome
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

__all__ = ["Lock"]

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


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


_UNSET: Final = _Unset()

# How long a fair waiter keeps its place in the queue without refreshing it: a
# waiter that dies is skipped after this long, and live waiters refresh well before.
FAIR_QUEUE_TTL = 3.0
# How long to wait for replicas to acknowledge an acquisition (replicas=N).
REPLICA_TIMEOUT = 1.0


@dataclass(slots=True)
class _Held:
    owner: str
    token: int
    pid: int
    count: int
    schedule: RenewalSchedule
    lost: LockError | None = None


class Lock:
    """A named lock with a TTL, a fencing token and an owner, shared through a store.

    Created by `Store.lock()`; see SPEC-level docs in docs/locks.md.
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
        self.name = name
        self.ttl = ttl
        self.wait = wait
        self.auto_renew = auto_renew
        self.reentrant = reentrant
        self.on_lost = on_lost
        self.fair = fair
        self.replicas = replicas
        self._held: _Held | None = None

    def __repr__(self) -> str:
        state = "held" if self.held else "not held"
        where = self._backend.server
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl} {state} on {where}>"

    # -- what the handle knows without asking the server -------------------------

    @property
    def held(self) -> bool:
        """This handle believes it holds the lock (acquired here, not released, not known lost)."""
        held = self._mine()
        return (
            held is not None and held.lost is None and self.clock_now() < held.schedule.valid_until
        )

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
        if held is None or held.pid != os.getpid():
            return None  # after fork, the child does not own its parent's locks
        return held

    # -- acquire ----------------------------------------------------------------

    def acquire(self, wait: float | _Unset | None = _UNSET, *, fail_fast: bool = False) -> bool:
        """Take the lock, waiting up to `wait` seconds (None: forever; 0: one attempt)."""
        seconds = self.wait if isinstance(wait, _Unset) else check_wait(wait)
        held = self._mine()
        if held is not None:
            # A lease that surely ran out (no renewal) counts as lost here.
            alive = held.lost is None and self.clock_now() < held.schedule.valid_until
            if self.reentrant and alive:
                held.count += 1
                return True
            if alive:
                raise LockError(
                    f"lock {self.name!r} is already held by this handle; "
                    "pass reentrant=True to acquire it again"
                )
            self._held = None  # a lost acquisition may be replaced by a new one
        owner = make_owner(current_task_label())
        queue_ttl = FAIR_QUEUE_TTL if self.fair else None
        started = self.clock_now()
        attempt = self._attempt(owner, queue_ttl)
        if attempt.acquired:
            return self._took(owner, attempt, started)
        if seconds == 0:
            self._leave_queue(owner)
            return False
        plan = WaitPlan(
            now=started,
            wait=seconds,
            fail_fast=fail_fast,
            notifies=self._backend.capabilities.notifies,
            refresh_every=FAIR_QUEUE_TTL / 3 if self.fair else None,
        )
        try:
            waiter = self._backend.waiter(self.name)
            if self.fair:
                waiter.for_owner(owner)
            with waiter:
                # Subscribed before this attempt: a release from now on wakes us.
                while True:
                    now = self.clock_now()
                    attempt = self._attempt(owner, queue_ttl)
                    if attempt.acquired:
                        return self._took(owner, attempt, now)
                    delay = plan.next_wait(self.clock_now(), attempt)
                    if delay is None:
                        break
                    waiter.wait(delay)
        except BackendError:
            raise  # leaving the queue would wait on the failed server again; the place expires
        except BaseException:
            self._leave_queue(owner)
            raise
        self._leave_queue(owner)
        return False

    def _attempt(self, owner: str, queue_ttl: float | None) -> Attempt:
        try:
            return self._backend.try_acquire(
                self.name,
                owner,
                self.ttl,
                queue_ttl=queue_ttl,
                replicas=self.replicas,
                replica_timeout=REPLICA_TIMEOUT,
            )
        except BackendError:
            # The server may have granted it before the answer was lost; taking it
            # back would mean a second wait on a server that just failed, doubling
            # the configured timeout. Its TTL frees it instead.
            raise
        except BaseException:
            # Cancelled after the server may have granted it: take it back, so no
            # lock is held by an owner nobody knows. The owner id is unique to this
            # attempt, so this can free nothing else.
            try:
                shield(self._backend.release(self.name, owner))
            except BaseException:
                log.debug("could not take back attempt on lock %r", self.name, exc_info=True)
            raise

    def _leave_queue(self, owner: str) -> None:
        if not self.fair:
            return
        try:
            self._backend.leave_queue(self.name, owner)
        except BaseException:
            log.debug("could not leave the queue of lock %r", self.name, exc_info=True)

    def _took(self, owner: str, attempt: Attempt, sent_at: float) -> bool:
        assert attempt.token is not None
        held = _Held(
            owner=owner,
            token=attempt.token,
            pid=os.getpid(),
            count=1,
            schedule=RenewalSchedule(self.ttl, sent_at),
        )
        if self.replicas and (attempt.replicas_acked or 0) < self.replicas:
            shield(self._backend.release(self.name, owner))
            raise BackendUnavailable(
                f"lock {self.name!r} on {self._backend.server}: only "
                f"{attempt.replicas_acked or 0} of {self.replicas} replicas acknowledged "
                f"the acquisition within {REPLICA_TIMEOUT} s; released it (check "
                "replication, or lower replicas=)"
            )
        self._held = held
        if self.auto_renew:
            renewer().register(self, held.schedule.due)
        return True

    # -- release, extend, check -------------------------------------------------

    def _require(self, action: str) -> _Held:
        held = self._mine()
        if held is None:
            raise LockError(f"cannot {action} lock {self.name!r}: this handle does not hold it")
        return held

    def release(self, hold_for: float = 0.0) -> None:
        """Free the lock if this handle still owns it (atomic compare-and-delete).

        `hold_for=S` keeps it closed, ownerless, for S more seconds: a job that
        must run at most once per S releases with hold_for=S.
        """
        hold = check_non_negative(hold_for, "hold_for")
        held = self._require("release")
        if held.count > 1 and held.lost is None:
            held.count -= 1
            return
        # Forget first: a release that is cancelled or fails must not leave the
        # handle believing it holds; the server's TTL frees the lock anyway.
        self._held = None
        if self.auto_renew:
            renewer().unregister(self)
        outcome = self._backend.release(self.name, held.owner, hold)
        error = outcome_error(outcome, self.name, self._backend.server, "release")
        if error is not None:
            raise error

    def extend(self, ttl: float | None = None) -> None:
        """Reset the TTL (to `ttl`, else the lock's own) if this handle still owns it."""
        seconds = self.ttl if ttl is None else check_ttl(ttl)
        held = self._require("extend")
        if held.lost is not None:
            raise held.lost
        sent_at = self.clock_now()
        outcome = self._backend.extend(self.name, held.owner, seconds)
        if outcome is Outcome.OK:
            held.schedule.renewed(sent_at, seconds)
            return
        error = outcome_error(outcome, self.name, self._backend.server, "extend")
        assert error is not None
        held.lost = error
        renewer().unregister(self)
        raise error

    def check(self) -> None:
        """Raise `LockLost`/`LockExpired` if this handle no longer owns the lock on the server."""
        held = self._require("check")
        if held.lost is not None:
            raise held.lost
        info = self._backend.inspect(self.name)
        if info is None or info.owner != held.owner:
            outcome = Outcome.EXPIRED if info is None else Outcome.LOST
            error = outcome_error(outcome, self.name, self._backend.server, "keep")
            assert error is not None
            held.lost = error
            renewer().unregister(self)
            raise error

    def owned(self) -> bool:
        """Whether this handle owns the lock right now, as the server sees it."""
        held = self._mine()
        if held is None or held.lost is not None:
            return False
        info = self._backend.inspect(self.name)
        return info is not None and info.owner == held.owner

    def locked(self) -> bool:
        """Whether anyone holds the lock (or keeps it closed with hold_for) right now."""
        return self._backend.inspect(self.name) is not None

    # -- renewal (called by the renewal worker) ---------------------------------

    def renew_due(self) -> float | None:
        """Extend once; return when to do it next, or None when renewal is over."""
        held = self._mine()
        if held is None or held.lost is not None or held is not self._held:
            return None
        sent_at = self.clock_now()
        try:
            outcome = self._backend.extend(self.name, held.owner, held.schedule.ttl)
        except BackendError as exc:
            if held.schedule.failed(self.clock_now()):
                log.warning(
                    "renewing lock %r on %s failed (%s); retrying while its TTL lasts",
                    self.name,
                    self._backend.server,
                    exc,
                )
                return held.schedule.due
            error: LockError = LockLost(
                f"lock {self.name!r} on {self._backend.server}: could not renew it before "
                f"its TTL ran out ({exc}); assume another process may hold it now"
            )
            self._mark_lost(held, error)
            return None
        if outcome is Outcome.OK:
            held.schedule.renewed(sent_at)
            return held.schedule.due
        found = outcome_error(outcome, self.name, self._backend.server, "renew")
        assert found is not None
        self._mark_lost(held, found)
        return None

    def _mark_lost(self, held: _Held, error: LockError) -> None:
        held.lost = error
        log.warning("%s", error)
        if self.on_lost is not None:
            try:
                call_maybe_async(self.on_lost, self)
            except Exception:
                log.exception("on_lost callback of lock %r raised", self.name)

    # -- context manager --------------------------------------------------------

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockTimeout(
                f"lock {self.name!r} on {self._backend.server} was not acquired within "
                f"{self.wait} s; another process holds it (see `corral status {self.name}`)"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._mine() is None:
            return
        try:
            self.release()
        except (LockError, BackendError) as release_error:
            if exc is None:
                raise
            # Never mask the exception already in flight: attach the lock's fate to it.
            add_note(exc, f"corral: also, on leaving the block: {release_error}")
            log.warning("%s (while handling %r)", release_error, exc)
