# Generated from src/corral/_async/election.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Leader election: one leader at a time, named so that anyone can ask who leads.

An election is an auto-renewed lock (`corral._sync.lock`) whose owner id
carries the identity the campaigner gave (`corral.core.election`): the same
waiting, renewal, loss and cancellation rules, on every backend, with no
primitive of its own. The lock's fencing token is the leadership's `term`.
Followers wait for the leadership to change through the lock's waiter, so a
resignation reaches them as soon as the backend pushes the release.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from corral._sync._compat import call_maybe_async, current_task
from corral._sync.lock import Lock
from corral.core.election import default_identity, election_owner, identity_of, lock_name
from corral.core.lockflow import MIN_WAIT, NOTIFIED_RECHECK
from corral.core.primitives import LockInfo
from corral.core.validate import check_wait
from corral.errors import LockError

if TYPE_CHECKING:
    from corral._sync.store import Store

__all__ = ["Election"]


class _Unseen:
    def __repr__(self) -> str:
        return "<not seen yet>"


_UNSEEN = _Unseen()


class _LeadershipLock(Lock):
    """The lock behind an election: its owner ids carry the campaigner's identity."""

    kind = "election"
    # Campaigners wait as long as a leader leads: they must not poll as queued waiters
    # do, and the order in which they are elected does not matter.
    joins_queue = False

    def __init__(
        self,
        store: Store,
        name: str,
        ttl: float,
        identity: str | None,
        on_lost: Callable[[Lock], Any],
    ) -> None:
        super().__init__(
            store,
            lock_name(name),
            ttl,
            wait=None,
            auto_renew=True,
            reentrant=False,
            on_lost=on_lost,
            fair=False,
            replicas=0,
        )
        self.shown_name = name
        self.identity = identity

    def _new_owner(self) -> str:
        # host:pid when no identity was given, taken now: a forked child is another process.
        return election_owner(self.identity or default_identity(), super()._new_owner())


class Election:
    """One campaigner in the election `name`; created by `Store.election()`.

    docs/elections.md describes it. A handle shared by several threads or
    tasks leads for one of them at a time, as a lock handle is held by one:
    the others' `campaign()` (or `with`) waits for it to resign.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        ttl: float,
        identity: str | None,
        *,
        on_lost: Callable[[Election], Any] | None,
    ) -> None:
        self.name = name
        self.on_lost = on_lost
        self._store = store
        self._lock = _LeadershipLock(store, name, ttl, identity, self._lock_lost)
        # The leadership this handle last reported (leader(), leadership(),
        # wait_for_change()): what wait_for_change() compares with by default.
        self._seen: LockInfo | _Unseen | None = _UNSEEN

    @property
    def identity(self) -> str:
        """What `leader()` answers while this handle leads (default: host:pid, now)."""
        return self._lock.identity or default_identity()

    def __repr__(self) -> str:
        state = f"leading (term {self.term})" if self.is_leader else "not leading"
        return (
            f"<{type(self).__name__} {self.name!r} identity={self.identity!r} {state} "
            f"on {self._store.server}>"
        )

    @property
    def ttl(self) -> float:
        return self._lock.ttl

    @property
    def is_leader(self) -> bool:
        """This handle leads: elected, not resigned, not known lost, its lease surely running."""
        return self._lock.held

    @property
    def term(self) -> int | None:
        """The fencing token of this handle's leadership (strictly increasing), else None."""
        return self._lock.token if self.is_leader else None

    @property
    def lost(self) -> LockError | None:
        """Why the leadership was found lost, else None."""
        return self._lock.lost

    def campaign(self, wait: float | None = None) -> bool:
        """Become the leader, waiting up to `wait` seconds (None: as long as it takes).

        True once this handle leads for the calling thread or task (at once if it
        already does). A leadership of this caller's that lapsed is reported
        (`on_lost`) and set aside first: campaigning again is how a lost leader
        runs for a new term. Another thread or task of the same handle waits
        until the leader resigns, as it would for a shared lock handle.
        """
        seconds = check_wait(wait)
        held = self._lock._mine()
        if held is not None and held.holder is current_task():
            if self.is_leader:
                return True
            self._lock.set_aside_lost()
        return self._lock.acquire(seconds)

    def resign(self) -> None:
        """Stop leading now; a waiting campaigner is elected at once. Nothing if not leading.

        Raises `LockLost`/`LockExpired` if the leadership had been lost meanwhile
        (work done since may have overlapped with another leader's).
        """
        if self._lock.token is None:
            return
        self._lock.release()

    def check(self) -> None:
        """Raise `LockLost`/`LockExpired` unless this handle still leads, as the server sees it."""
        self._lock.check()

    def leader(self) -> str | None:
        """The identity of the current leader (any process's), or None when nobody leads."""
        info = self.leadership()
        return None if info is None else identity_of(info.owner)

    def leadership(self) -> LockInfo | None:
        """The current leadership as the store sees it: owner id, term (token), seconds left."""
        info = self._store.backend.inspect(self._lock.name)
        self._seen = info
        return info

    def wait_for_change(
        self, timeout: float | None = None, *, since: LockInfo | _Unseen | None = _UNSEEN
    ) -> bool:
        """Wait until the leadership changes; True when it did, False when `timeout` ran out.

        A change is another leader, a new term of the same one, or nobody
        leading any more, compared with `since` when given, else with what
        this handle last reported (`leader()`, `leadership()` or the previous
        wait), else with the leadership when called. A change that happened
        since then is reported at once, so a follower that asks `leader()` and
        then waits misses nothing. A term that began and ended between two
        looks is reported too (a release was heard meanwhile). The release of a
        resigning leader wakes the wait where the backend pushes releases to
        this waiter; otherwise, and for a leader that died, the wait looks
        again at least every second and when the leader's TTL runs out.
        """
        seconds = check_wait(timeout)
        clock = self._store.clock
        deadline = None if seconds is None else clock.now() + seconds
        before = self._seen if isinstance(since, _Unseen) else since
        waiter = self._store.backend.waiter(self._lock.name)
        heard = False
        with waiter:
            if isinstance(before, _Unseen):
                before = self.leadership()
            while True:
                now_info = self.leadership()
                if _changed(before, now_info) or (heard and before is None and now_info is None):
                    return True
                now = clock.now()
                if deadline is not None and now >= deadline:
                    return False
                pause = NOTIFIED_RECHECK
                if now_info is not None:
                    pause = min(pause, max(now_info.ttl, MIN_WAIT))
                if deadline is not None:
                    pause = min(pause, deadline - now)
                heard = waiter.wait(pause) or heard

    def _lock_lost(self, lock: Lock) -> None:
        if self.on_lost is not None:
            call_maybe_async(self.on_lost, self)

    def __enter__(self) -> Election:
        """Campaign for as long as it takes, then lead inside the block."""
        self._lock.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Resign; raise `LockLost`/`LockExpired` if the leadership was lost in the block."""
        self._lock.__exit__(exc_type, exc, tb)


def _changed(before: LockInfo | None, after: LockInfo | None) -> bool:
    if before is None or after is None:
        return (before is None) != (after is None)
    return (before.owner, before.token) != (after.owner, after.token)
