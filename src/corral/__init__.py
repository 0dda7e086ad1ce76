"""corral: distributed locks and stampede-proof caching over the servers you already run."""

from corral._sync.lock import Lock
from corral._sync.store import Store, connect
from corral.core.capabilities import Capabilities
from corral.core.primitives import LockInfo
from corral.errors import (
    BackendError,
    BackendUnavailable,
    ConfigError,
    CorralError,
    LockError,
    LockExpired,
    LockLost,
    LockTimeout,
    SerializationError,
    SourceUnavailable,
)

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "Capabilities",
    "ConfigError",
    "CorralError",
    "Lock",
    "LockError",
    "LockExpired",
    "LockInfo",
    "LockLost",
    "LockTimeout",
    "SerializationError",
    "SourceUnavailable",
    "Store",
    "__version__",
    "connect",
]
