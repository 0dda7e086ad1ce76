"""corral: distributed locks and stampede-proof caching over the servers you already run."""

import logging

from corral._sync.cache import Cache, Refresher
from corral._sync.election import Election
from corral._sync.lock import Acquisition, Lock
from corral._sync.semaphore import Semaphore
from corral._sync.store import Store, connect
from corral.core.capabilities import Capabilities
from corral.core.primitives import LockInfo, SemaphoreInfo
from corral.core.ring import Ring
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

# A library says what happened through logging and lets the application decide where
# it goes: without this, Python's last-resort handler prints warnings on stderr.
logging.getLogger("corral").addHandler(logging.NullHandler())

__all__ = [
    "Acquisition",
    "BackendError",
    "BackendUnavailable",
    "Cache",
    "Capabilities",
    "ConfigError",
    "CorralError",
    "Election",
    "Lock",
    "LockError",
    "LockExpired",
    "LockInfo",
    "LockLost",
    "LockTimeout",
    "Refresher",
    "Ring",
    "Semaphore",
    "SemaphoreInfo",
    "SerializationError",
    "SourceUnavailable",
    "Store",
    "__version__",
    "connect",
]
