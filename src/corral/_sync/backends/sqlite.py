# Generated from src/corral/_async/backends/sqlite.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`sqlite:///path.db`: locks shared by the processes of one machine through one file.

The embedded default: no server to run, yet every process on the machine that
opens the same file shares the locks. The SQL, the transactions, the clock and
the connection handling live in `corral.backends.sqlite_sql` (blocking, shared
by both flavours; its docstring says why each is as it is); this class runs
them off the event loop and wakes this process's waiters.

SQLite cannot push a release to other processes, so their waiters poll with
the lock logic's capped, jittered backoff; releases made in this process wake
its waiters at once through the local bus.
"""

from __future__ import annotations

from typing import Any, ClassVar

from corral._sync._compat import run_sync
from corral._sync.backends.base import Backend
from corral.backends.sqlite_sql import (
    DEFAULT_TABLE_PREFIX,
    DEFAULT_TIMEOUT,
    MachineClock,
    SQLiteLocks,
    SQLiteOptions,
    parse_url,
)
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.primitives import Attempt, LockInfo, Outcome
from corral.errors import ConfigError

__all__ = ["SQLiteBackend"]


class SQLiteBackend(Backend):
    capabilities: ClassVar[Capabilities] = Capabilities(
        scheme="sqlite",
        notifies=False,
        cross_process=True,
        # SQLite relies on the filesystem's locks, which network filesystems (NFS,
        # SMB) do not implement reliably, and WAL needs memory shared by all users.
        cross_host=False,
        linearizable=True,
        fair=True,
        replicas=False,
        ttl_clock="this machine's boot-time clock (its wall clock off Linux)",
        on_client_crash="the lock stays held until its TTL runs out, then anyone may take it",
        on_server_restart=(
            "a reboot of the machine expires every lock; fencing tokens keep increasing, "
            "unless a power cut lost their last commits"
        ),
        on_partition="not applicable: every process is on the one machine that has the file",
        on_memory_pressure="never evicted: locks live in a file on disk",
    )

    def __init__(
        self,
        path: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        machine_clock: MachineClock | None = None,
    ) -> None:
        super().__init__()
        self._db = SQLiteLocks(SQLiteOptions(path, timeout, table_prefix), machine_clock)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> SQLiteBackend:
        # `clock` is the store's, for its own deadlines; TTLs here are enforced by the
        # machine's clock, the only one every process sharing the file can read.
        parsed = parse_url(url, options)
        return cls(parsed.path, timeout=parsed.timeout, table_prefix=parsed.table_prefix)

    @property
    def server(self) -> str:
        return self._db.server

    def try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        *,
        queue_ttl: float | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> Attempt:
        if replicas:
            raise ConfigError(f"{self.server} does not support replicas=N")
        return run_sync(self._db.try_acquire, name, owner, ttl, queue_ttl)

    def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        outcome = run_sync(self._db.release, name, owner, hold_for)
        if outcome is Outcome.OK and hold_for <= 0:
            self.local_bus.notify(name)
        return outcome

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        return run_sync(self._db.extend, name, owner, ttl)

    def inspect(self, name: str) -> LockInfo | None:
        return run_sync(self._db.inspect, name)

    def force_release(self, name: str) -> bool:
        released = run_sync(self._db.force_release, name)
        if released:
            self.local_bus.notify(name)
        return released

    def leave_queue(self, name: str, owner: str) -> None:
        if run_sync(self._db.leave_queue, name, owner):
            self.local_bus.notify(name)

    def close(self) -> None:
        run_sync(self._db.close)
