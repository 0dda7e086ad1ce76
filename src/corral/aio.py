"""corral for asyncio: the same names as `corral`, awaitable."""

from corral._async.lock import AsyncLock
from corral._async.store import AsyncStore, connect

__all__ = ["AsyncLock", "AsyncStore", "connect"]
