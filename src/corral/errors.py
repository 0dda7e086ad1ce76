"""The error tree every corral call raises from.

One base class (`CorralError`) lets a caller catch "anything corral" without
catching programming errors. Messages always name the lock or key and the
server (without its password) and say what to do, because the person reading
them is usually on call and did not write the code.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "ConfigError",
    "CorralError",
    "LockError",
    "LockExpired",
    "LockLost",
    "LockTimeout",
    "SerializationError",
    "SourceUnavailable",
]


class CorralError(Exception):
    """Base class of every error corral raises on purpose."""


class ConfigError(CorralError, ValueError):
    """A bad URL, option or argument (ttl <= 0, limit < 1, unknown option, ...)."""


class BackendError(CorralError):
    """The server answered with something corral could not use."""


class BackendUnavailable(BackendError):
    """The server is down, unreachable or did not answer within the timeout."""


class LockError(CorralError):
    """Base class of lock-specific failures."""


class LockTimeout(LockError):
    """The lock was not acquired within the wait the caller allowed.

    What is known of the holder when the wait ran out is kept as attributes:
    `owner` (None when nobody holds it, or while `release(hold_for=...)` keeps it
    closed), `token`, `ttl` (seconds left) and `server` (where the lock lives).
    """

    def __init__(
        self,
        message: str,
        *,
        owner: str | None = None,
        token: int | None = None,
        ttl: float | None = None,
        server: str | None = None,
    ) -> None:
        super().__init__(message)
        self.owner = owner
        self.token = token
        self.ttl = ttl
        self.server = server


class LockLost(LockError):
    """The lock's TTL ran out and another owner holds it now.

    Work done under the lock since then may have overlapped with the new
    holder's; the fencing token lets downstream storage refuse stale writes.
    """


class LockExpired(LockError):
    """The lock's TTL ran out (or it was force-released) and nobody holds it now."""


class SerializationError(CorralError):
    """A value could not be encoded or decoded with the chosen serializer."""


class SourceUnavailable(CorralError):
    """A cached computation failed recently; callers fail fast until error_ttl passes."""
