"""This process's one connection to a store's SQLite file, lent to one thread at a time.

**One connection per store and process.** Every primitive but `inspect` needs
the file's one write lock, so more connections in one process buy no
parallelism: they would only meet again at the file lock, where SQLite's busy
handler polls with sleeps of 1 to 100 ms. Waiting for the connection on a
thread lock instead hands it over the moment it is free. A per-thread
connection would also leave one connection behind in every worker thread
`asyncio.to_thread` ever used, and `aclose()` could not close them from its
own thread. The wait for the connection counts against `timeout`, as does
SQLite's busy wait, so a call never blocks much past it.

**Reads create nothing.** A write opens (and if need be creates) the file and
its directory, switches the file to WAL and creates corral's tables. A read
(`corral status`) of a file that does not exist answers "not held" without
creating the file or its directory, and a read never changes the file's
journal mode or schema.

**fork.** SQLite forbids using a connection in a child process, and the
child's copy of SQLite's per-file lock bookkeeping must not describe
connections that are open in the parent either. So before `fork` each store
waits (up to `timeout`) for its connection to be idle and closes it; parent
and child each open a fresh one on next use. A connection still busy after
that wait is abandoned, never closed, in the child, and a pid check catches
any fork that bypassed the hooks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator

__all__ = ["Busy", "Closed", "Connection", "is_busy"]

log = logging.getLogger("corral.sqlite")


class Closed(Exception):
    """The store was closed; mapped to a BackendError naming the lock."""


class Busy(Exception):
    """This process's connection stayed in use past the timeout."""


def is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class Connection:
    """This process's one connection to the file (see the module docstring).

    `prepare` runs once per opened connection before its first write: it
    creates or migrates corral's tables, inside its own transaction.
    """

    def __init__(
        self, path: str, timeout: float, prepare: Callable[[sqlite3.Connection], None]
    ) -> None:
        self.path = path
        self.timeout = timeout
        self._prepare = prepare
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._busy_ms = 0
        self._writable = False
        """The open connection has been set up for writes (WAL, tables)."""
        self._closed = False
        self._held_for_fork = False
        _OPEN.add(self)

    @contextlib.contextmanager
    def lend(self, *, write: bool) -> Iterator[sqlite3.Connection | None]:
        """The connection, for one transaction; waiting for it counts against `timeout`.

        With `write=False` it yields None, creating nothing, when the file does
        not exist (see "Reads create nothing").
        """
        if self._pid != os.getpid():
            self._after_fork_in_child()  # a fork the hooks did not see
        started = time.monotonic()
        if not self._mutex.acquire(timeout=self.timeout):
            raise Busy
        try:
            if self._closed:
                raise Closed
            conn = self._conn
            if conn is None:
                conn = self._conn = self._open(create=write)
                if conn is None:
                    yield None
                    return
            # SQLite's own busy wait gets what is left of the timeout.
            left_ms = max(1, int((self.timeout - (time.monotonic() - started)) * 1000))
            if abs(left_ms - self._busy_ms) > 5:
                conn.execute(f"PRAGMA busy_timeout = {left_ms}")
                self._busy_ms = left_ms
            try:
                if write and not self._writable:
                    self._make_writable(conn)
                yield conn
            except BaseException:
                self._rollback()
                raise
        finally:
            self._mutex.release()

    def _rollback(self) -> None:
        conn = self._conn
        if conn is None or not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            # A connection that cannot roll back is not lent again.
            self._conn = None
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _open(self, *, create: bool) -> sqlite3.Connection | None:
        if create:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            target, uri = self.path, False
        else:
            if not os.path.exists(self.path):
                return None
            # mode=rw: should the file vanish meanwhile, fail instead of creating it.
            target, uri = f"{pathlib.Path(self.path).as_uri()}?mode=rw", True
        try:
            # check_same_thread=False: lent to one thread at a time, under the mutex.
            conn = sqlite3.connect(
                target,
                timeout=self.timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=uri,
            )
        except sqlite3.OperationalError:
            if create or os.path.exists(self.path):
                raise
            return None
        self._busy_ms = int(self.timeout * 1000)
        self._writable = False
        try:
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _make_writable(self, conn: sqlite3.Connection) -> None:
        # WAL is a property of the file: set once by whichever process is first.
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            mode = self._set_wal(conn)
            if str(mode).lower() != "wal":
                log.warning(
                    "%s stays in %s journal mode (WAL unsupported here?): locks are still "
                    "correct, readers just wait for writers",
                    self.path,
                    mode,
                )
        self._prepare(conn)
        self._writable = True

    def _set_wal(self, conn: sqlite3.Connection) -> object:
        # Switching modes needs the file to itself and may fail without calling the
        # busy handler while other processes open it too, so retry until the timeout.
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def close(self) -> None:
        acquired = self._mutex.acquire(timeout=self.timeout)
        try:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None and acquired:
                conn.close()
            # Not acquired: the thread using it will not finish for long; leave it be.
        finally:
            if acquired:
                self._mutex.release()
            _OPEN.discard(self)

    # The fork hooks (module level below) call these on every open connection.

    def _before_fork(self) -> None:
        self._held_for_fork = self._mutex.acquire(timeout=self.timeout)
        if self._held_for_fork and self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _after_fork_in_parent(self) -> None:
        if self._held_for_fork:
            self._held_for_fork = False
            self._mutex.release()

    def _after_fork_in_child(self) -> None:
        if self._conn is not None:
            # Still in use by a parent thread at the fork: SQLite forbids using or
            # closing it here, and garbage collection would close it, so keep it.
            _ABANDONED.append(self._conn)
            self._conn = None
        self._mutex = threading.Lock()
        self._held_for_fork = False
        self._pid = os.getpid()


_OPEN: weakref.WeakSet[Connection] = weakref.WeakSet()
_ABANDONED: list[sqlite3.Connection] = []


def _before_fork() -> None:
    for connection in list(_OPEN):
        connection._before_fork()


def _after_fork_in_parent() -> None:
    for connection in list(_OPEN):
        connection._after_fork_in_parent()


def _after_fork_in_child() -> None:
    for connection in list(_OPEN):
        connection._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
