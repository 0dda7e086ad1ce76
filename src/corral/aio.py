"""corral for asyncio: the same names as `corral`, awaitable."""

from corral import (
    BackendError,
    BackendUnavailable,
    Capabilities,
    ConfigError,
    CorralError,
    LockError,
    LockExpired,
    LockInfo,
    LockLost,
    LockTimeout,
    Ring,
    SemaphoreInfo,
    SerializationError,
    SourceUnavailable,
    __version__,
)
from corral._async.cache import AsyncCache, AsyncRefresher
from corral._async.election import AsyncElection
from corral._async.lock import AsyncAcquisition, AsyncLock
from corral._async.semaphore import AsyncSemaphore
from corral._async.store import AsyncStore, connect

__all__ = [
    "AsyncAcquisition",
    "AsyncCache",
    "AsyncElection",
    "AsyncLock",
    "AsyncRefresher",
    "AsyncSemaphore",
    "AsyncStore",
    "BackendError",
    "BackendUnavailable",
    "Capabilities",
    "ConfigError",
    "CorralError",
    "LockError",
    "LockExpired",
    "LockInfo",
    "LockLost",
    "LockTimeout",
    "Ring",
    "SemaphoreInfo",
    "SerializationError",
    "SourceUnavailable",
    "__version__",
    "connect",
]
