"""Leader election: one leader at a time, named so that anyone can ask who leads.

An election is an auto-renewed lock (`corral._async.lock`) whose owner id
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

from corral._async._compat import call_maybe_async
from corral._async.lock import AsyncLock, add_note, log
from corral.core.election import election_owner, identity_of, lock_name
from corral.core.lockflow import MIN_WAIT, NOTIFIED_RECHECK
from corral.core.primitives import LockInfo
from corral.core.validate import check_wait
from corral.errors import BackendError, LockError

if TYPE_CHECKING:
    from corral._async.store import AsyncStore

__all__ = ["AsyncElection"]


class _LeadershipLock(AsyncLock):
    """The lock behind an election: its owner ids carry the campaigner's identity."""

    kind = "election"

    def __init__(
        self,
        store: AsyncStore,
        name: str,
        ttl: float,
        identity: str,
        on_lost: Callable[[AsyncLock], Any],
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
        return election_owner(self.identity, super()._new_owner())


class AsyncElection:
    """One campaigner in the election `name`; created by `AsyncStore.election()`.

    docs/elections.md describes it. A handle campaigns for one leadership at a
    time; several campaigners in one process each make their own handle.
    """

    def __init__(
        self,
        store: AsyncStore,
        name: str,
        ttl: float,
        identity: str,
        *,
        on_lost: Callable[[AsyncElection], Any] | None,
    ) -> None:
        self.name = name
        self.identity = identity
        self.on_lost = on_lost
        self._store = store
        self._lock = _LeadershipLock(store, name, ttl, identity, self._lock_lost)

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

    async def campaign(self, wait: float | None = None) -> bool:
        """Become the leader, waiting up to `wait` seconds (None: as long as it takes).

        True once this handle leads (at once if it already does). A leadership
        lost earlier is set aside first: campaigning again is how a lost leader
        runs for a new term.
        """
        seconds = check_wait(wait)
        if self.is_leader:
            return True
        self._lock.set_aside_lost()
        return await self._lock.acquire(seconds)

    async def resign(self) -> None:
        """Stop leading now; a waiting campaigner is elected at once. Nothing if not leading.

        Raises `LockLost`/`LockExpired` if the leadership had been lost meanwhile
        (work done since may have overlapped with another leader's).
        """
        if self._lock.token is None:
            return
        await self._lock.release()

    async def check(self) -> None:
        """Raise `LockLost`/`LockExpired` unless this handle still leads, as the server sees it."""
        await self._lock.check()

    async def leader(self) -> str | None:
        """The identity of the current leader (any process's), or None when nobody leads."""
        info = await self._store.backend.inspect(self._lock.name)
        return None if info is None else identity_of(info.owner)

    async def leadership(self) -> LockInfo | None:
        """The current leadership as the store sees it: owner id, term (token), seconds left."""
        return await self._store.backend.inspect(self._lock.name)

    async def wait_for_change(self, timeout: float | None = None) -> bool:
        """Wait until the leadership changes; True when it did, False when `timeout` ran out.

        A change is another leader, a new term of the same one, or nobody
        leading any more. The release of a resigning or stopping leader wakes
        the wait where the backend pushes releases; a leader that died is seen
        when its TTL runs out (the store's clock decides that, not ours).
        """
        seconds = check_wait(timeout)
        clock = self._store.clock
        deadline = None if seconds is None else clock.now() + seconds
        before = await self.leadership()
        waiter = self._store.backend.waiter(self._lock.name)
        async with waiter:
            while True:
                now_info = await self.leadership()
                if _changed(before, now_info):
                    return True
                now = clock.now()
                if deadline is not None and now >= deadline:
                    return False
                pause = NOTIFIED_RECHECK
                if now_info is not None:
                    pause = min(pause, max(now_info.ttl, MIN_WAIT))
                if deadline is not None:
                    pause = min(pause, deadline - now)
                await waiter.wait(pause)

    async def _lock_lost(self, lock: AsyncLock) -> None:
        if self.on_lost is not None:
            await call_maybe_async(self.on_lost, self)

    async def __aenter__(self) -> AsyncElection:
        """Campaign for as long as it takes, then lead inside the block."""
        await self.campaign()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.resign()
        except (LockError, BackendError) as resign_error:
            if exc is None:
                raise
            add_note(exc, f"corral: also, on leaving the block: {resign_error}")
            log.warning("%s (while handling %r)", resign_error, exc)


def _changed(before: LockInfo | None, after: LockInfo | None) -> bool:
    if before is None or after is None:
        return (before is None) != (after is None)
    return (before.owner, before.token) != (after.owner, after.token)
