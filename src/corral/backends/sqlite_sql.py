"""The SQLite lock store shared by both flavours: URL, clock, schema, statements, transactions.

Everything here blocks. The asyncio backend calls it through `run_sync` (a
worker thread) and the generated blocking backend calls it directly, so the
SQL and the transactions exist once.

**Atomicity.** Every primitive that changes anything is one short transaction
opened with `BEGIN IMMEDIATE`, which takes the database's single write lock
before the first read. The check ("is there a live row?") and the write
("take it") therefore happen under one lock that every process on the machine
honours: check-and-set without a race, however many processes share the file.
WAL mode lets `inspect` read without waiting for writers, and with
`synchronous=NORMAL` a commit costs no fsync. The price: a power cut or kernel
crash (not a process crash) may lose the last commits. Every lock expires at
the reboot anyway (see the clock, below), but the last fencing tokens may then
be handed out a second time. Tokens never reset otherwise, so the fences table
keeps one small row per lock name ever used.

**One connection per store and process, lent to one thread at a time.** Every
primitive but `inspect` needs the file's one write lock, so more connections in
one process buy no parallelism: they would only meet again at the file lock,
where SQLite's busy handler polls with sleeps of 1 to 100 ms. Waiting for the
connection on a thread lock instead hands it over the moment it is free. A
per-thread connection would also leave one connection behind in every worker
thread `asyncio.to_thread` ever used, and `aclose()` could not close them from
its own thread. The wait for the connection counts against `timeout`, as does
SQLite's busy wait, so a call never blocks much past it.

**fork.** SQLite forbids using a connection in a child process, and the
child's copy of SQLite's per-file lock bookkeeping must not describe
connections that are open in the parent either. So before `fork` each store
waits (up to `timeout`) for its connection to be idle and closes it; parent
and child each open a fresh one on next use. A connection still busy after
that wait is abandoned, never closed, in the child, and a pid check catches
any fork that bypassed the hooks.

**The clock.** A TTL is enforced by "the server's clock", and here the server
is this machine, so every process must read the same clock, and it must not
jump when NTP steps the wall clock. On Linux that is `CLOCK_BOOTTIME`: shared
by every process, monotonic, and counting time spent suspended, so a lock
still expires across a laptop's sleep. Its readings restart near zero at each
boot, so each row also stores the kernel's boot id: a row written in an
earlier boot is expired, whatever its reading says (otherwise an old reading
would look hours in the future). Elsewhere `time.time()` stands in: shared by
all processes and comparable across boots, but it moves when the wall clock
is set.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qsl

from corral.core.primitives import Attempt, LockInfo, Outcome
from corral.core.validate import check_timeout
from corral.errors import BackendError, BackendUnavailable, ConfigError

__all__ = [
    "DEFAULT_TABLE_PREFIX",
    "DEFAULT_TIMEOUT",
    "MachineClock",
    "SQLiteLocks",
    "SQLiteOptions",
    "parse_url",
]

log = logging.getLogger("corral.sqlite")

T = TypeVar("T")

DEFAULT_TIMEOUT = 5.0
DEFAULT_TABLE_PREFIX = "corral_"
_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


# -- the URL ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SQLiteOptions:
    path: str
    """Absolute, so a later `chdir` cannot move the store."""
    timeout: float = DEFAULT_TIMEOUT
    table_prefix: str = DEFAULT_TABLE_PREFIX


def parse_url(url: str, options: Mapping[str, object]) -> SQLiteOptions:
    """`sqlite:///relative.db` or `sqlite:////absolute.db`, options from keywords or the query.

    Query options (`?timeout=10`) exist so `CORRAL_URL` and `--url` can carry them.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "sqlite":
        raise ConfigError(f"{url}: not an sqlite:// URL")
    rest, _, query = rest.partition("?")
    given: dict[str, object] = dict(options)
    if query:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError as exc:
            raise ConfigError(f"{url}: cannot parse the options after '?' ({exc})") from exc
        for key, value in pairs:
            if key in given:
                raise ConfigError(f"{url}: option {key!r} is given twice")
            given[key] = value
    if "memory:" in rest or "mode=memory" in query:
        raise ConfigError(
            f"{url}: an in-memory SQLite database is private to one connection, so no other "
            "process could see its locks; use memory:// for locks inside one process"
        )
    if rest in ("", "/"):
        raise ConfigError(
            f"{url}: the path of the database file is empty; "
            "write sqlite:///locks.db or sqlite:////var/lib/app/locks.db"
        )
    if not rest.startswith("/"):
        raise ConfigError(
            f"{url}: expected sqlite:///relative/path.db or sqlite:////absolute/path.db "
            "(three slashes, then the path; SQLite has no host)"
        )
    absolute = os.path.abspath(rest[1:])
    if os.path.isdir(absolute):
        raise ConfigError(f"{url}: {absolute} is a directory; name a file inside it")

    seconds = check_timeout(given.pop("timeout", DEFAULT_TIMEOUT), url)
    prefix = given.pop("table_prefix", DEFAULT_TABLE_PREFIX)
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ConfigError(
            f"{url}: table_prefix must be letters, digits and underscores (not starting "
            f"with a digit, at most 64), got {prefix!r}"
        )
    if given:
        raise ConfigError(
            f"{url}: unknown option(s) {', '.join(sorted(given))}; "
            "sqlite:// takes timeout and table_prefix"
        )
    return SQLiteOptions(absolute, seconds, prefix)


# -- the clock --------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _boot_id() -> str:
    # Constant for the life of a process: nothing survives a reboot.
    try:
        with open(_BOOT_ID_FILE, encoding="ascii") as file:
            return file.read().strip()
    except OSError:
        # Without /proc every process here reads "" alike, so they still agree; only
        # rows from an earlier boot may then look live until their readings pass.
        log.warning("cannot read %s; locks may outlive a reboot", _BOOT_ID_FILE)
        return ""


class MachineClock:
    """Seconds on a clock every process on this machine shares, and which boot they belong to.

    See the module docstring for why `CLOCK_BOOTTIME` and the boot id.
    """

    def __init__(self) -> None:
        clock_id: int | None = getattr(time, "CLOCK_BOOTTIME", None)
        if clock_id is None:
            self._read: Callable[[], float] = time.time
            # Wall-clock readings compare across boots: every row is of one "boot".
            self.boot_id = "wall-clock"
        else:
            self._read = functools.partial(time.clock_gettime, clock_id)
            self.boot_id = _boot_id()

    def now(self) -> float:
        return self._read()


# -- the schema and the statements ------------------------------------------------


class _Statements:
    """The SQL, with the table prefix filled in (checked to be a plain identifier)."""

    def __init__(self, prefix: str) -> None:
        locks, fences, queue = f"{prefix}locks", f"{prefix}fences", f"{prefix}queue"
        # `expires_at` is a MachineClock reading, meaningful only in the boot `boot`.
        live = "boot = :boot AND expires_at > :now"
        self.schema_objects = (locks, fences, queue, f"{queue}_order")
        self.schema = (
            f"CREATE TABLE IF NOT EXISTS {locks} ("
            " name TEXT PRIMARY KEY,"
            " owner TEXT,"  # NULL while closed by release(hold_for=...)
            " token INTEGER NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL"
            ") WITHOUT ROWID",
            # Apart from the locks so a token survives its lock's row: never reset.
            f"CREATE TABLE IF NOT EXISTS {fences} ("
            " name TEXT PRIMARY KEY,"
            " token INTEGER NOT NULL"
            ") WITHOUT ROWID",
            f"CREATE TABLE IF NOT EXISTS {queue} ("
            " name TEXT NOT NULL,"
            " owner TEXT NOT NULL,"
            " seq INTEGER NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL,"
            " PRIMARY KEY (name, owner)"
            ") WITHOUT ROWID",
            f"CREATE INDEX IF NOT EXISTS {queue}_order ON {queue} (name, seq)",
        )
        self.live_lock = (
            f"SELECT owner, token, expires_at FROM {locks} WHERE name = :name AND {live}"
        )
        # One read for the decision and the next token.
        self.probe = (
            f"SELECT (SELECT expires_at FROM {locks} WHERE name = :name AND {live}),"
            f" (SELECT token FROM {fences} WHERE name = :name)"
        )
        self.set_fence = f"INSERT OR REPLACE INTO {fences} (name, token) VALUES (:name, :token)"
        self.set_lock = (
            f"INSERT OR REPLACE INTO {locks} (name, owner, token, expires_at, boot)"
            " VALUES (:name, :owner, :token, :expires_at, :boot)"
        )
        self.delete_mine = f"DELETE FROM {locks} WHERE name = :name AND owner = :owner AND {live}"
        self.close_mine = (
            f"UPDATE {locks} SET owner = NULL, expires_at = :expires_at"
            f" WHERE name = :name AND owner = :owner AND {live}"
        )
        self.extend_mine = (
            f"UPDATE {locks} SET expires_at = :expires_at"
            f" WHERE name = :name AND owner = :owner AND {live}"
        )
        self.delete_live = f"DELETE FROM {locks} WHERE name = :name AND {live}"
        self.purge_queue = (
            f"DELETE FROM {queue} WHERE name = :name AND (boot != :boot OR expires_at <= :now)"
        )
        self.refresh_place = (
            f"UPDATE {queue} SET expires_at = :expires_at WHERE name = :name AND owner = :owner"
        )
        # A newcomer queues behind everyone present; a refresh (above) keeps its place.
        self.join_queue = (
            f"INSERT INTO {queue} (name, owner, seq, expires_at, boot)"
            " SELECT :name, :owner, COALESCE(MAX(seq), 0) + 1, :expires_at, :boot"
            f" FROM {queue} WHERE name = :name"
        )
        self.queue_head = (
            f"SELECT owner FROM {queue} WHERE name = :name AND {live} ORDER BY seq LIMIT 1"
        )
        self.leave_queue = f"DELETE FROM {queue} WHERE name = :name AND owner = :owner"


# -- connections ------------------------------------------------------------------


class _Closed(Exception):
    """The store was closed; mapped to a BackendError naming the lock."""


class _Busy(Exception):
    """This process's connection stayed in use past the timeout."""


class _Connection:
    """This process's one connection to the file, lent to one thread at a time (see module doc)."""

    def __init__(self, path: str, timeout: float, statements: _Statements) -> None:
        self.path = path
        self.timeout = timeout
        self._statements = statements
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._busy_ms = 0
        self._schema_ready = False
        self._closed = False
        self._held_for_fork = False
        _OPEN.add(self)

    @contextlib.contextmanager
    def lend(self) -> Iterator[sqlite3.Connection]:
        """The connection, for one transaction; waiting for it counts against `timeout`."""
        if self._pid != os.getpid():
            self._after_fork_in_child()  # a fork the hooks did not see
        started = time.monotonic()
        if not self._mutex.acquire(timeout=self.timeout):
            raise _Busy
        try:
            if self._closed:
                raise _Closed
            conn = self._conn
            if conn is None:
                conn = self._conn = self._open()
            # SQLite's own busy wait gets what is left of the timeout.
            left_ms = max(1, int((self.timeout - (time.monotonic() - started)) * 1000))
            if abs(left_ms - self._busy_ms) > 5:
                conn.execute(f"PRAGMA busy_timeout = {left_ms}")
                self._busy_ms = left_ms
            try:
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

    def _open(self) -> sqlite3.Connection:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        # check_same_thread=False: lent to one thread at a time, under the mutex.
        conn = sqlite3.connect(
            self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        self._busy_ms = int(self.timeout * 1000)
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: sqlite3.Connection) -> None:
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
        conn.execute("PRAGMA synchronous = NORMAL")
        if not self._schema_ready and not self._schema_exists(conn):
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in self._statements.schema:
                    conn.execute(statement)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._schema_ready = True

    def _schema_exists(self, conn: sqlite3.Connection) -> bool:
        # A read, so a store that only inspects needs no write lock to start.
        found = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name IN (?, ?, ?, ?)",
            self._statements.schema_objects,
        ).fetchone()[0]
        return bool(found == len(self._statements.schema_objects))

    def _set_wal(self, conn: sqlite3.Connection) -> object:
        # Switching modes needs the file to itself and may fail without calling the
        # busy handler while other processes open it too, so retry until the timeout.
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
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


_OPEN: weakref.WeakSet[_Connection] = weakref.WeakSet()
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


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


# -- the primitives ---------------------------------------------------------------


class SQLiteLocks:
    """The lock primitives on one SQLite file, each one transaction; blocking."""

    def __init__(self, options: SQLiteOptions, clock: MachineClock | None = None) -> None:
        self.path = options.path
        self.timeout = options.timeout
        self.server = f"sqlite:///{self.path}"
        self._clock = clock or MachineClock()
        self._sql = _Statements(options.table_prefix)
        self._connection = _Connection(self.path, self.timeout, self._sql)

    def _params(self, name: str, owner: str, now: float) -> dict[str, object]:
        return {"name": name, "owner": owner, "boot": self._clock.boot_id, "now": now}

    @contextlib.contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        """SQLite's and the OS's errors as corral's, naming the lock, the file and a remedy."""
        where = f"lock {name!r} on {self.server}"
        try:
            yield
        except _Closed:
            raise BackendError(f"{where}: the store is closed; open a new one") from None
        except _Busy:
            raise BackendUnavailable(
                f"{where}: this process's connection to the file stayed busy for more than "
                f"{self.timeout:g} s (another thread is waiting on the file's lock); "
                "retry, or pass a longer timeout="
            ) from None
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise BackendUnavailable(
                    f"{where}: the database file {self.path} stayed locked for more than "
                    f"{self.timeout:g} s: another process is holding a write transaction on "
                    f"it (`fuser {self.path}` lists who has it open); retry, or pass a "
                    "longer timeout="
                ) from exc
            raise BackendUnavailable(
                f"{where}: cannot use the database file {self.path} ({exc}); check that it "
                "and its directory are writable by this user and that the disk is not full"
            ) from exc
        except OSError as exc:
            raise BackendUnavailable(
                f"{where}: cannot create {os.path.dirname(self.path)} ({exc}); "
                "choose a writable path in the URL"
            ) from exc
        except sqlite3.Error as exc:
            raise BackendError(
                f"{where}: {self.path} is not a usable corral database ({exc}); "
                "point the URL at another file, or move this one away"
            ) from exc

    def _write(self, name: str, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run `body` as one `BEGIN IMMEDIATE` transaction: the whole primitive is atomic."""
        with self._errors(name), self._connection.lend() as conn:
            conn.execute("BEGIN IMMEDIATE")
            result = body(conn)
            conn.execute("COMMIT")
            return result

    def try_acquire(self, name: str, owner: str, ttl: float, queue_ttl: float | None) -> Attempt:
        sql = self._sql

        def attempt(conn: sqlite3.Connection) -> Attempt:
            now = self._clock.now()  # read under the write lock, as in every primitive
            p = self._params(name, owner, now)
            if queue_ttl is not None:
                conn.execute(sql.purge_queue, p)
                place = {**p, "expires_at": now + queue_ttl}
                if conn.execute(sql.refresh_place, place).rowcount == 0:
                    conn.execute(sql.join_queue, place)
            expires_at, fence = conn.execute(sql.probe, p).fetchone()
            if expires_at is not None:
                return Attempt(False, holder_ttl=expires_at - now)
            if queue_ttl is not None:
                head = conn.execute(sql.queue_head, p).fetchone()
                if head is None or head[0] != owner:
                    return Attempt(False)
                conn.execute(sql.leave_queue, p)
            token = (fence or 0) + 1
            conn.execute(sql.set_fence, {"name": name, "token": token})
            conn.execute(sql.set_lock, {**p, "token": token, "expires_at": now + ttl})
            return Attempt(True, token=token)

        return self._write(name, attempt)

    def release(self, name: str, owner: str, hold_for: float) -> Outcome:
        sql = self._sql

        def release(conn: sqlite3.Connection) -> Outcome:
            now = self._clock.now()
            p = self._params(name, owner, now)
            if hold_for > 0:
                changed = conn.execute(sql.close_mine, {**p, "expires_at": now + hold_for})
            else:
                changed = conn.execute(sql.delete_mine, p)
            return Outcome.OK if changed.rowcount else self._why_not(conn, p)

        return self._write(name, release)

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        sql = self._sql

        def extend(conn: sqlite3.Connection) -> Outcome:
            now = self._clock.now()
            p = self._params(name, owner, now)
            changed = conn.execute(sql.extend_mine, {**p, "expires_at": now + ttl})
            return Outcome.OK if changed.rowcount else self._why_not(conn, p)

        return self._write(name, extend)

    def _why_not(self, conn: sqlite3.Connection, params: dict[str, object]) -> Outcome:
        # Same transaction as the failed compare: the answer cannot have changed since.
        found = conn.execute(self._sql.live_lock, params).fetchone()
        return Outcome.EXPIRED if found is None else Outcome.LOST

    def inspect(self, name: str) -> LockInfo | None:
        # A plain read: WAL gives it a consistent snapshot without the write lock.
        with self._errors(name), self._connection.lend() as conn:
            now = self._clock.now()
            row = conn.execute(self._sql.live_lock, self._params(name, "", now)).fetchone()
        if row is None:
            return None
        owner, token, expires_at = row
        return LockInfo(name, owner, token, expires_at - now)

    def force_release(self, name: str) -> bool:
        def force(conn: sqlite3.Connection) -> bool:
            p = self._params(name, "", self._clock.now())
            return conn.execute(self._sql.delete_live, p).rowcount > 0

        return self._write(name, force)

    def leave_queue(self, name: str, owner: str) -> bool:
        """Leave the queue; True when the caller was at its head (someone else may go now)."""
        sql = self._sql

        def leave(conn: sqlite3.Connection) -> bool:
            p = self._params(name, owner, self._clock.now())
            head = conn.execute(sql.queue_head, p).fetchone()
            conn.execute(sql.leave_queue, p)
            return head is not None and head[0] == owner

        return self._write(name, leave)

    def close(self) -> None:
        self._connection.close()
