"""Which servers of a pool are up: consecutive failures, down until when, one probe at a time.

Pure bookkeeping, no I/O: the pool asks before each call whether a server may
be used (`admit`) and reports how the call went (`succeeded`, `failed`,
`abandoned`). The clock is injected, so `tests/core/test_health.py` drives
every transition with a fake one.

Why these rules:

- A server is marked down only after `failure_limit` *consecutive* failures:
  one lost packet must not send a server's keys elsewhere (which costs every
  entry on it a miss, twice: when it leaves and when it returns).
- While down, no call waits on it: `admit` answers `DOWN` at once.
- After `retry_after` seconds exactly one call may probe it (`PROBE`); every
  other call still treats it as down, so a server that is still dead costs one
  timeout per `retry_after`, not one per caller. A probe that succeeds brings
  the server back; one that fails keeps it down for another `retry_after`. A
  probe that ends without a verdict (cancelled) frees the probe for the next
  call at once.
- Each transition is returned to the caller (`Change`), so it logs each once:
  when a server goes down, when a probe finds it still down (at most once per
  `retry_after`), when it comes back.

Shared by the threads (or tasks) of one pool, so every method holds a lock; no
method waits for anything else while holding it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from corral.core.forks import ProcessLock

__all__ = ["Admission", "Change", "Health"]


class Admission(enum.Enum):
    """What a caller may do with a server now."""

    UP = "up"
    """Use it."""
    PROBE = "probe"
    """It is marked down, but this caller is the one that may try it; report the outcome."""
    DOWN = "down"
    """Do not touch it."""


class Change(enum.Enum):
    """A transition worth one log line."""

    WENT_DOWN = "went down"
    STILL_DOWN = "still down"
    CAME_BACK = "came back"


@dataclass(slots=True)
class _State:
    failures: int = 0
    down_until: float | None = None
    """When a marked-down server may be probed; None while it is up."""
    probing: bool = False
    last_error: str = ""


class Health:
    """The health of each server of a pool, by its name as the ring knows it."""

    def __init__(
        self,
        servers: Iterable[str],
        *,
        failure_limit: int,
        retry_after: float,
        clock: Callable[[], float],
    ) -> None:
        if failure_limit < 1:
            raise ValueError("failure_limit must be at least 1")
        if retry_after < 0:
            raise ValueError("retry_after must not be negative")
        self.failure_limit = failure_limit
        self.retry_after = retry_after
        self._clock = clock
        self._states = {server: _State() for server in servers}
        self._mutex = ProcessLock()
        self._down = 0  # how many servers are marked down: the fast path reads only this

    @property
    def any_down(self) -> bool:
        """Whether some server is marked down (cheap: no lock)."""
        return self._down > 0

    def is_down(self, server: str) -> bool:
        """Marked down (probe pending or not): what placement skips, without taking the probe."""
        return self._states[server].down_until is not None

    def down_until(self, server: str) -> float | None:
        """When `server` may next be probed (a time of the injected clock), None while up."""
        return self._states[server].down_until

    def last_error(self, server: str) -> str:
        """The last failure seen on `server`, for messages ("" when none)."""
        return self._states[server].last_error

    def admit(self, server: str) -> Admission:
        """May a call use `server` now? `PROBE` hands this caller the one probe."""
        state = self._states[server]
        if state.down_until is None:
            return Admission.UP
        with self._mutex:
            if state.down_until is None:
                return Admission.UP
            if state.probing or self._clock() < state.down_until:
                return Admission.DOWN
            state.probing = True
            return Admission.PROBE

    def succeeded(self, server: str) -> Change | None:
        """A call on `server` got an answer: it is up, and its failures are forgotten."""
        state = self._states[server]
        if state.failures == 0 and state.down_until is None:
            return None
        with self._mutex:
            state.failures = 0
            state.probing = False
            if state.down_until is None:
                return None
            state.down_until = None
            self._down -= 1
            return Change.CAME_BACK

    def failed(self, server: str, error: str = "") -> Change | None:
        """A call on `server` could not reach it (unreachable, or no answer in time)."""
        state = self._states[server]
        with self._mutex:
            state.failures += 1
            if error:
                state.last_error = error
            now = self._clock()
            if state.down_until is not None:
                if not state.probing:
                    return None  # a call admitted before the server was marked down
                state.probing = False
                state.down_until = now + self.retry_after
                return Change.STILL_DOWN
            if state.failures < self.failure_limit:
                return None
            state.down_until = now + self.retry_after
            self._down += 1
            return Change.WENT_DOWN

    def abandoned(self, server: str) -> None:
        """A call admitted as the probe ended without a verdict (cancelled): free the probe."""
        state = self._states[server]
        with self._mutex:
            state.probing = False
