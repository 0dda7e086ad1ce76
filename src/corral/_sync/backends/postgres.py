# Generated from src/corral/_async/backends/postgres.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`postgresql://` and `postgres://`: locks as rows in one PostgreSQL table.

**A lock is a row, not a held transaction or an advisory lock.** A session
advisory lock (`pg_advisory_lock`) looks tempting, but it belongs to a
connection: it dies with it (a network blip frees the lock while its holder
keeps working, with no fencing token to catch it), it cannot have a TTL (a
holder that hangs holds it forever), and it pins a pooled connection for the
whole time the user's code runs. A transaction held open around the user's
code (`SELECT … FOR UPDATE`) has the same faults and also blocks vacuum. So
every call here commits before it returns (in autocommit; an acquisition's
two statements form one transaction that ends in the same round trip),
returns its connection to the pool at once, and a lock is a row with an
owner, a fencing token and an expiry on the server's clock; nothing stays
open on the server while the user's code runs. The SQL, the schema and why
each statement is as it is live in `corral.backends.postgres_sql`.

**One round trip per primitive.** Acquiring is one `INSERT … ON CONFLICT
(name) DO UPDATE … WHERE <expired>`, with the check that nobody is queued
ahead, that also reports the holder's seconds left when it did not take the
lock; it runs in one transaction after a statement that takes the name's
advisory lock, and both go in one round trip (pipeline mode). A fair
acquisition adds its place in the queue to that same statement, and now and
then an acquisition also sweeps expired rows (see
`corral.backends.postgres_sql`: "Fencing tokens", "The turn, then the
attempt", "State per name"). Release, extend, force-release and leaving the
queue are each one compare-and-change statement that also says what it found
and, where waiters should wake, calls `pg_notify` in it. With the connection
pool (`psycopg_pool`, up to `max_connections`) each primitive is one round
trip.

**Wake-ups by LISTEN/NOTIFY.** One dedicated connection per store and process,
outside the pool, LISTENs on the store's channel; a listener (an asyncio task
here, a daemon thread in the blocking flavour) hands each notification to the
waiters of the lock it names. The LISTEN completes before the first waiter's
`__enter__` returns, and a waiter is registered before its own returns, so a
release committed after that is heard: no lost wake-up. If that connection
fails, every waiter is woken, re-attempts, and the next wait opens a new one.

**Semaphores.** A slot is a row of a table of its own, and an attempt is the
same two statements in one round trip as a lock's: the semaphore's turn (an
advisory lock in a key space no lock's turn shares), then one statement that
counts the live slots, checks the holders' limit and the waiters ahead, and
inserts the slot. Releases notify on a channel of their own, which the same
LISTEN connection hears (postgres_sql: "Semaphores").

**Cache entries.** An entry is a row of a table of its own, its key the cache
key's UTF-8 as `bytea` (hashed past 1 kB), kept until an expiry on the
server's clock; a namespace's generation is a row of another. Every primitive
is one statement, and rows come back in binary (the bytes as stored, not in
hex). A read with a claim is one transaction in one round trip, as a lock's
attempt is: a statement that reads the entry and the generation and, only
when the entry is due, takes the claim's lock's turn; then the lock's own
attempt, gated on that, which reads the entry again at its snapshot
(postgres_sql: "Cache entries"). Expired entries are swept by later writes.

**Timeouts.** Every call fails with `BackendUnavailable` within about
`timeout` seconds: the pool waits that long for a connection, `connect_timeout`
bounds a new connection, the server ends a statement after
`statement_timeout`, and the watchdog in `postgres_sql` cuts the socket of a
statement the server does not answer at all (a paused or unreachable server).

**fork.** A child must not use its parent's connections, pool or listener (the
bytes of two processes would interleave on one socket), nor close them (that
would end the parent's sessions). After a fork the child leaves them alone
and opens its own on first use.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from corral._sync._compat import Event, Lock, Worker, spawn
from corral._sync.backends.base import Backend, Feed, SubscribingWaiter
from corral.backends import postgres_sql as sql
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.options import Option
from corral.core.primitives import Attempt, CacheRead, Claim, LockInfo, Outcome, SemaphoreInfo
from corral.errors import BackendError, BackendUnavailable, ConfigError

__all__ = ["PostgresBackend"]

_Connection = psycopg.Connection[TupleRow]

# How long the listener waits for notifications before it looks at its flags again.
LISTEN_POLL = 1.0


class _Closed(Exception):
    """The store was closed; mapped to a BackendError naming the lock."""


class _Process:
    """What one process owns; a forked child starts with a new one (see the module docstring)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.start_lock = Lock()
        self.pool: ConnectionPool[_Connection] | None = None
        self.feed: ReleaseFeed | None = None


class ReleaseFeed:
    """One LISTEN connection (and one listener) per backend and process, shared by every waiter.

    A feed that fails is never repaired (notifications may have been missed
    while it was down): it wakes every waiter and the backend starts a new
    one on next use.
    """

    def __init__(self, options: sql.PostgresOptions, statements: sql.Statements) -> None:
        self.pid = os.getpid()
        self._options = options
        self._sql = statements
        # Serialises starting (connect and LISTEN) and closing.
        self._start_lock = Lock()
        # Guards the tables; a thread lock in both flavours, never held across I/O.
        self._mutex = threading.Lock()
        # By (channel, key): a lock and a semaphore of one name are told apart.
        self._events: dict[tuple[str, str], set[Event]] = {}
        self._conn: _Connection | None = None
        self._fd = -1
        self._worker: Worker | None = None
        self.failure: BaseException | None = None
        self.closed = False

    @property
    def usable(self) -> bool:
        return self.failure is None and not self.closed and self.pid == os.getpid()

    def join(self, channel: str, key: str, event: Event, alarm: sql.Alarm) -> None:
        """Have `event` set on every notification for `key` on `channel`; return once LISTEN
        is in force."""
        with self._start_lock:
            self._raise_if_unusable()
            if self._conn is None:
                self._start(alarm)
        with self._mutex:
            self._raise_if_unusable()
            self._events.setdefault((channel, key), set()).add(event)

    def leave(self, channel: str, key: str, event: Event) -> None:
        """Undo one `join`."""
        with self._mutex:
            events = self._events.get((channel, key))
            if events is not None:
                events.discard(event)
                if not events:
                    del self._events[channel, key]

    def _start(self, alarm: sql.Alarm) -> None:
        try:
            conn = psycopg.Connection.connect(self._options.listen_conninfo, autocommit=True)
        except BaseException as exc:
            self._fail(exc)
            raise
        try:
            with sql.watchdog().armed(conn.fileno(), self._options.timeout, alarm):
                conn.execute(self._sql.listen)
        except BaseException as exc:
            self._fail(exc)
            with contextlib.suppress(Exception):
                conn.close()
            raise
        with self._mutex:
            self._conn = conn
            self._fd = conn.fileno()
        self._worker = spawn(self._listen, name="corral-postgres-releases")

    def _listen(self) -> None:
        conn = self._conn
        assert conn is not None
        try:
            while self.usable:
                for note in conn.notifies(timeout=LISTEN_POLL):
                    self._dispatch(note.channel, note.payload)
        except Exception as exc:
            self._fail(exc)
        finally:
            self._fail(psycopg.OperationalError("the LISTEN connection's listener stopped"))
            with self._mutex:
                self._fd = -1  # close must not touch the socket once it is closed
            if self.pid == os.getpid():
                with contextlib.suppress(Exception):
                    conn.close()

    def _dispatch(self, channel: str, key: str) -> None:
        with self._mutex:
            events = list(self._events.get((channel, key), ()))
        for event in events:
            event.set()

    def _raise_if_unusable(self) -> None:
        if self.closed:
            raise _Closed
        if self.failure is not None:
            raise psycopg.OperationalError(f"the LISTEN connection failed ({self.failure})")

    def _fail(self, exc: BaseException) -> None:
        with self._mutex:
            if self.failure is None and not self.closed:
                self.failure = exc
        self._wake_all()

    def _wake_all(self) -> None:
        """Wake every waiter: each re-attempts, and nothing hangs on a dead connection."""
        with self._mutex:
            events = [event for events in self._events.values() for event in events]
        for event in events:
            event.set()

    def close(self) -> None:
        with self._start_lock, self._mutex:
            self.closed = True
            if self._fd >= 0 and self.pid == os.getpid():
                # Ends the listener's wait at once; it then closes the connection.
                sql.shutdown_socket(self._fd)
        self._wake_all()
        worker = self._worker
        if worker is not None and self.pid == os.getpid():
            worker.join()


class PostgresWaiter(SubscribingWaiter):
    """Hears releases from every process through the backend's LISTEN connection.

    A lock's waiter listens on the locks' channel, a semaphore's on the
    semaphores' one (`semaphore=True`), each with the key of its name.
    """

    def __init__(self, backend: PostgresBackend, name: str, *, semaphore: bool = False) -> None:
        super().__init__(backend.semaphore_bus if semaphore else backend.local_bus, name)
        self._backend = backend
        self._semaphore = semaphore
        self._channel = backend._sql.sem_channel if semaphore else backend._sql.channel
        self._key = ""

    def _join(self) -> Feed:
        feed, self._key = self._backend._subscribe(
            self._name, self._channel, self._event, semaphore=self._semaphore
        )
        return feed

    def _leave(self, feed: Feed) -> None:
        assert isinstance(feed, ReleaseFeed)
        feed.leave(self._channel, self._key, self._event)


# libpq's words when a TLS connection cannot be set up as configured (a certificate not
# trusted or for another host, a server without TLS, a missing file), as opposed to a
# TLS connection that broke (SYSCALL, EOF), which is the network's or the server's doing.
_TLS_SETUP = re.compile(r"certificate|SSL error|does not support SSL|\bssl[a-z]+=", re.I)
_TLS_BROKEN = re.compile(r"SYSCALL|unexpected eof|closed unexpectedly", re.I)

_BACKENDS: weakref.WeakSet[PostgresBackend] = weakref.WeakSet()
# The parents' pools and connections a forked child must neither use nor finalise.
_ABANDONED: list[_Process] = []


class PostgresBackend(Backend):
    capabilities: ClassVar[Capabilities] = Capabilities(
        scheme="postgresql",
        notifies=True,
        cross_process=True,
        cross_host=True,
        linearizable=True,
        fair=True,
        replicas=False,
        ttl_clock="the PostgreSQL server's clock (clock_timestamp())",
        on_client_crash=(
            "the lock stays held until its TTL runs out on the server, then anyone may take "
            "it; the crash leaves no transaction or session lock behind"
        ),
        on_server_restart=(
            "locks are rows, so they survive a restart with their expiry, which keeps running "
            "on the server's clock meanwhile, and tokens never go backwards; only with "
            "synchronous_commit=off or fsync=off can a crash forget the last acquisitions and "
            "reissue their tokens"
        ),
        on_partition=(
            "one primary decides every acquisition, and a client cut off from it gets "
            "BackendUnavailable within its timeout; a failover to an asynchronously "
            "replicated standby can lose the last acquisitions (two holders, tokens reissued), "
            "so use synchronous replication where failover must keep them"
        ),
        on_memory_pressure=(
            "never evicted: locks are rows on disk; a full disk makes acquisitions fail "
            "with an error instead"
        ),
        fencing_tokens=(
            "one sequence per table prefix, for locks and semaphores (nextval, never reused "
            "or rolled back), drawn by "
            "the acquiring transaction once it holds a per-name transaction advisory lock, so "
            "each acquisition of a name draws after the previous one committed; only a crash "
            "with synchronous_commit=off or fsync=off, or a failover to an asynchronous "
            "standby, can hand out a token twice"
        ),
        state_per_name=(
            "nothing: a release deletes the lock's row; a row left to expire (a crashed "
            "holder, a hold_for closure) and a dead fair waiter's place are deleted after "
            "they expire by later acquisitions of any name (a store's first, then one in "
            f"{sql.SWEEP_EVERY}, up to {sql.SWEEP_BATCH} rows each); semaphore slots and "
            "places the same way; tokens keep increasing as they come from one sequence"
        ),
        semaphores=(
            "a row per slot in a table of their own, counted and taken in one statement "
            "in the name's turn (a transaction advisory lock)"
        ),
        cache=(
            "a row per entry in a table of their own, kept until an expiry on the server's "
            "clock and swept by later writes; a read and its claim's lock attempt are one "
            "transaction in one round trip"
        ),
    )
    # One round trip reads and claims, but not one snapshot: under READ COMMITTED the
    # claim's INSERT ... ON CONFLICT sees a release committed after the read's snapshot,
    # so a claim can be won on a read that missed the value stored just before that
    # release. The winner therefore reads once more before computing.
    claims_with_read: ClassVar[bool] = False
    url_options: ClassVar[tuple[Option, ...]] = sql.OPTIONS
    # Whether libpq can pipeline (version 14 and later), for `_together`.
    _pipelines: ClassVar[bool] = psycopg.Pipeline.is_supported()

    def __init__(self, options: sql.PostgresOptions) -> None:
        super().__init__()
        self._options = options
        self._timeout = options.timeout
        self._sql = sql.Statements(options.schema, options.table_prefix)
        self._schema_ready = False
        # Whether the database can store only ASCII keys (postgres_sql, "Names").
        self._ascii_keys = False
        # Which acquisitions sweep expired rows (postgres_sql, "State per name").
        self._acquisitions = itertools.count()
        self._closed = False
        self._mutex = threading.Lock()
        self._proc = _Process()
        _BACKENDS.add(self)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> PostgresBackend:
        """Open a backend on `url`; the clock is unused, as the server's clock decides expiry."""
        return cls(sql.parse_url(url, options))

    @property
    def server(self) -> str:
        return self._options.server

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.server}>"

    # -- connections ----------------------------------------------------------------

    def _here(self) -> _Process:
        proc = self._proc
        if proc.pid != os.getpid():  # a fork the at-fork hook did not see
            self._forget_parent()
            proc = self._proc
        return proc

    def _forget_parent(self) -> None:
        """In a forked child: leave the parent's pool and listener alone, start afresh."""
        _ABANDONED.append(self._proc)
        self._proc = _Process()
        self._mutex = threading.Lock()

    def _pool(self, alarm: sql.Alarm) -> ConnectionPool[_Connection]:
        proc = self._here()
        pool = proc.pool
        if pool is None:
            with proc.start_lock:
                pool = proc.pool
                if pool is None:
                    if self._closed:
                        raise _Closed
                    if not self._schema_ready:
                        self._prepare(alarm)
                    pool = ConnectionPool(
                        self._options.conninfo,
                        kwargs={"autocommit": True},
                        min_size=1,
                        max_size=self._options.max_connections,
                        timeout=self._timeout,
                        # Give up on a failed connection attempt soon, so the next call
                        # tries afresh instead of waiting out a long reconnection backoff.
                        reconnect_timeout=self._timeout,
                        configure=self._configure,
                        name="corral-postgres",
                        open=False,
                    )
                    pool.open(wait=False)
                    proc.pool = pool
        return pool

    def _prepare(self, alarm: sql.Alarm) -> None:
        """First use: connect directly, so a bad URL or login shows libpq's own error rather
        than a pool timeout, and create the tables unless they exist."""
        statements = self._sql
        with (
            psycopg.Connection.connect(self._options.conninfo, autocommit=True) as conn,
            sql.watchdog().armed(conn.fileno(), self._timeout, alarm),
        ):
            cursor = conn.execute(statements.ready, statements.ready_params)
            row = cursor.fetchone()
            assert row is not None
            has_schema, has_tables, any_text = row
            self._ascii_keys = not any_text
            if not has_tables:
                with conn.transaction():
                    # Serialises concurrent creators: see postgres_sql's docstring.
                    conn.execute(statements.schema_lock, {"key": sql.SCHEMA_LOCK_KEY})
                    # Only what is still missing (postgres_sql: "Creating them").
                    cursor = conn.execute(statements.created, statements.created_params)
                    present = {relname for (relname,) in cursor.fetchall()}
                    if not has_schema:
                        conn.execute(statements.create_schema)
                    for statement, made in zip(statements.ddl, statements.ddl_objects, strict=True):
                        if made not in present:
                            conn.execute(statement)
        self._schema_ready = True

    def _configure(self, conn: _Connection) -> None:
        # The server ends a statement stuck on a row lock (say, a foreign transaction
        # holding corral's rows) by itself, leaving the connection usable.
        ms = f"{max(1, round(self._timeout * 1000))}ms"
        with sql.watchdog().armed(conn.fileno(), self._timeout):
            conn.execute("SELECT set_config('statement_timeout', %s, false)", [ms])

    def _borrow(self, pool: ConnectionPool[_Connection]) -> _Connection:
        """A pooled connection, skipping those the server closed while they were idle."""
        deadline = time.monotonic() + self._timeout
        # Bounded, so a connection that always looks readable cannot loop us to the timeout.
        for _ in range(self._options.max_connections + 1):
            conn = pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))
            if not sql.readable(conn.fileno()):
                return conn
            # The server ended this idle session (a restart, an idle timeout): drop it.
            with contextlib.suppress(Exception):
                conn.close()
            pool.putconn(conn)
        return pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))

    def _key(self, name: str) -> str:
        return sql.lock_key(name, ascii_only=self._ascii_keys)

    def _fetch(
        self,
        name: str,
        action: str,
        query: str,
        params: dict[str, Any],
        *,
        turn: bool = False,
        semaphore: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run one statement on a pooled connection, with every failure mapped to corral's.

        `params` gets the lock's (or with `semaphore`, the semaphore's) key as
        `name`, once the first connection told which keys the database can
        store. With `turn`, the statement runs in the name's turn (`_together`).
        """

        def statements() -> list[tuple[str, dict[str, Any]]]:
            key = params["name"] = self._key(name)
            if not turn:
                return [(query, params)]
            if semaphore:
                take: tuple[str, dict[str, Any]] = (
                    self._sql.sem_take_turn,
                    self._sql.sem_gate(key),
                )
            else:
                take = (self._sql.take_turn, {"gate": self._sql.gate_key(key)})
            return [take, (query, params)]

        kind = "semaphore" if semaphore else "lock"
        results = self._run(
            statements,
            lambda exc, fired: self._error(exc, name, action, fired, kind=kind),
            together=turn,
        )
        return results[-1]

    def _run(
        self,
        statements: Callable[[], list[tuple[str, dict[str, Any]]]],
        fail: Callable[[BaseException, bool], BackendError],
        *,
        together: bool = False,
        binary: bool = False,
    ) -> list[list[tuple[Any, ...]]]:
        """Run `statements()` (called once the first connection told which keys the database
        can store) on a pooled connection and return each one's rows; every failure
        becomes `fail(exc, timed_out)`.

        One statement alone, or with `together` several in one transaction and one
        round trip (`_together`). `binary` has rows come back in binary (bytea as is,
        not in hex).
        """
        alarm = sql.Alarm()
        try:
            pool = self._pool(alarm)
            todo = statements()
            conn = self._borrow(pool)
            try:
                with sql.watchdog().armed(conn.fileno(), self._timeout, alarm):
                    if together:
                        return self._together(conn, todo, binary=binary)
                    cursor = conn.execute(*todo[0], binary=binary)
                    return [cursor.fetchall()]
            except BaseException:
                if together:
                    self._discard_unless_idle(conn)
                raise
            finally:
                pool.putconn(conn)
        except (psycopg.Error, OSError, _Closed) as exc:
            raise fail(exc, alarm.fired) from exc

    def _together(
        self, conn: _Connection, statements: list[tuple[str, dict[str, Any]]], *, binary: bool
    ) -> list[list[tuple[Any, ...]]]:
        """`statements` in one transaction, each one's rows (postgres_sql: "Fencing tokens").

        A lock's attempt is two: the name's turn, then the attempt, so that the
        second one's snapshot is taken once the turn is had and sees every
        acquisition and queue place committed before: one statement that waited
        for the turn would still judge by what was committed when it began. In
        pipeline mode they go in one round trip and form one implicit
        transaction, which the closing Sync commits (or rolls back, after an
        error); libpq without pipelines (before 14) gets BEGIN and COMMIT, two
        round trips more.
        """
        if self._pipelines:
            with conn.pipeline():
                cursors = [conn.execute(q, p, binary=binary) for q, p in statements]
        else:
            with conn.transaction():
                cursors = [conn.execute(q, p, binary=binary) for q, p in statements]
        return [cursor.fetchall() for cursor in cursors]

    @staticmethod
    def _discard_unless_idle(conn: _Connection) -> None:
        """Close a connection an interrupted turn left in a pipeline or a transaction.

        The pool would roll such a transaction back, with a warning in the log,
        but it cannot take a connection out of pipeline mode: closed, it is
        replaced instead.
        """
        if (
            conn.pgconn.pipeline_status != pq.PipelineStatus.OFF
            or conn.info.transaction_status != pq.TransactionStatus.IDLE
        ):
            with contextlib.suppress(Exception):
                conn.close()

    # -- errors ---------------------------------------------------------------------

    def _error(
        self,
        exc: BaseException,
        name: str,
        action: str,
        timed_out: bool = False,
        *,
        kind: str = "lock",
    ) -> BackendError:
        """The corral error for a psycopg failure: names the lock (or semaphore) and server,
        says what to do."""
        return self._failure(
            exc, f"{kind} {name!r} on {self.server}: could not {action} it", timed_out
        )

    def _failure(self, exc: BaseException, where: str, timed_out: bool) -> BackendError:
        """The corral error for a psycopg failure of the call `where` describes."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        for secret in self._options.secrets:
            text = text.replace(secret, "***")  # libpq never quotes one; just in case
        if isinstance(exc, (_Closed, PoolClosed)):
            return BackendError(f"{where}: the store is closed; open a new one")
        if timed_out or isinstance(exc, pg_errors.QueryCanceled):
            return BackendUnavailable(
                f"{where}: the server did not answer within {self._timeout:g} s; check that "
                "PostgreSQL is running, reachable and not overloaded, or raise timeout="
            )
        if isinstance(exc, PoolTimeout):
            return BackendUnavailable(
                f"{where}: no connection to the server within {self._timeout:g} s: it is "
                "down or unreachable, it refused the login (the 'psycopg.pool' log says "
                f"why), or all max_connections={self._options.max_connections} stayed busy; "
                "check the server and the URL, or raise timeout= or max_connections="
            )
        if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            return BackendError(
                f"{where}: the server is a read-only standby ({text}); point the URL at the "
                "primary, e.g. list every host and add target_session_attrs=read-write"
            )
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return BackendError(
                f"{where}: permission denied ({text}); grant the role SELECT, INSERT, UPDATE "
                "and DELETE on corral's tables and USAGE on its sequences, or have an owner "
                "create them with corral.backends.postgres_sql.migration_sql()"
            )
        if isinstance(exc, pg_errors.UndefinedTable):
            return BackendError(
                f"{where}: corral's tables are gone ({text}); recreate them with "
                "corral.backends.postgres_sql.migration_sql(), or open a new store"
            )
        if (
            isinstance(exc, psycopg.OperationalError)
            and "connection to server" in text  # libpq could not connect
            and _TLS_SETUP.search(text)
            and not _TLS_BROKEN.search(text)
        ):
            return BackendError(
                f"{where}: the TLS connection failed ({text}); check sslmode=, that "
                "sslrootcert= names the CA that signed the server's certificate, and that "
                "the URL's host is a name the certificate gives"
            )
        if isinstance(exc, (psycopg.OperationalError, OSError)):
            return BackendUnavailable(
                f"{where}: the server could not be reached, refused the connection or "
                f"dropped it ({text}); check that PostgreSQL is running and reachable from "
                "here, and the URL's user, password, database and TLS settings"
            )
        return BackendError(
            f"{where}: PostgreSQL answered with an error ({text}); check the server's log"
        )

    # -- primitives -----------------------------------------------------------------

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
        params: dict[str, Any] = {"owner": owner, "ttl": float(ttl)}
        if queue_ttl is not None:
            params["queue_ttl"] = float(queue_ttl)
        sweep = next(self._acquisitions) % sql.SWEEP_EVERY == 0
        query = self._sql.acquire[queue_ttl is not None, sweep]
        rows = self._fetch(name, "acquire", query, params, turn=True)
        if not rows:
            return Attempt(False)  # free, but a live waiter is queued ahead
        granted, token, left = rows[0]
        if granted:
            return Attempt(True, token=int(token))
        return Attempt(False, holder_ttl=max(0.0, float(left)))

    def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        params: dict[str, Any] = {"owner": owner}
        if hold_for > 0:
            query = self._sql.close
            params["hold"] = float(hold_for)
        else:
            query = self._sql.release
            params["channel"] = self._sql.channel
        rows = self._fetch(name, "release", query, params)
        outcome = self._outcome(rows)
        if outcome is Outcome.OK and hold_for <= 0:
            self.local_bus.notify(name)
        return outcome

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        params: dict[str, Any] = {"owner": owner, "ttl": float(ttl)}
        return self._outcome(self._fetch(name, "extend", self._sql.extend, params))

    @staticmethod
    def _outcome(rows: list[tuple[Any, ...]]) -> Outcome:
        changed, held = rows[0]
        if changed:
            return Outcome.OK
        return Outcome.LOST if held else Outcome.EXPIRED

    def inspect(self, name: str) -> LockInfo | None:
        rows = self._fetch(name, "inspect", self._sql.inspect, {})
        if not rows:
            return None
        owner, token, left = rows[0]
        return LockInfo(name, owner, int(token), max(0.0, float(left)))

    def force_release(self, name: str) -> bool:
        params: dict[str, Any] = {"channel": self._sql.channel}
        rows = self._fetch(name, "force-release", self._sql.force_release, params)
        released = bool(rows[0][0])
        if released:
            self.local_bus.notify(name)
        return released

    def leave_queue(self, name: str, owner: str) -> None:
        params: dict[str, Any] = {"owner": owner, "channel": self._sql.channel}
        if self._fetch(name, "leave the queue of", self._sql.leave_queue, params):
            self.local_bus.notify(name)

    # -- semaphores (postgres_sql: "Semaphores") -----------------------------------

    def sem_try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        limit: int,
        *,
        queue_ttl: float | None = None,
    ) -> Attempt:
        params: dict[str, Any] = {"owner": owner, "ttl": float(ttl), "limit": int(limit)}
        if queue_ttl is not None:
            params["queue_ttl"] = float(queue_ttl)
        sweep = next(self._acquisitions) % sql.SWEEP_EVERY == 0
        query = self._sql.sem_acquire[queue_ttl is not None, sweep]
        rows = self._fetch(name, "acquire", query, params, turn=True, semaphore=True)
        outcome, token, held_limit, left = rows[0]
        if outcome == "granted":
            return Attempt(True, token=int(token))
        if outcome == "limit":
            return Attempt(False, limit=int(held_limit))
        if outcome == "full":
            return Attempt(False, holder_ttl=max(0.0, float(left)))
        return Attempt(False)  # a slot is free, but as many live waiters are queued ahead

    def sem_release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        params: dict[str, Any] = {"owner": owner}
        if hold_for > 0:
            params["hold"] = float(hold_for)
            rows = self._fetch(
                name, "release", self._sql.sem_close, params, turn=True, semaphore=True
            )
        else:
            params["channel"] = self._sql.sem_channel
            rows = self._fetch(name, "release", self._sql.sem_release, params, semaphore=True)
        outcome = self._outcome(rows)
        if outcome is Outcome.OK and hold_for <= 0:
            self.semaphore_bus.notify(name)
        return outcome

    def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        params: dict[str, Any] = {"owner": owner, "ttl": float(ttl)}
        return self._outcome(
            self._fetch(name, "extend", self._sql.sem_extend, params, turn=True, semaphore=True)
        )

    def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        rows = self._fetch(name, "inspect", self._sql.sem_inspect, {}, semaphore=True)
        if not rows:
            return None
        holders = tuple(
            LockInfo(name, owner, int(token), max(0.0, float(left)))
            for _, owner, token, left in rows
        )
        return SemaphoreInfo(name, int(rows[0][0]), holders)

    def sem_force_release(self, name: str) -> int:
        params: dict[str, Any] = {"channel": self._sql.sem_channel}
        rows = self._fetch(
            name, "force-release", self._sql.sem_force_release, params, semaphore=True
        )
        freed = int(rows[0][0])
        if freed:
            self.semaphore_bus.notify(name)
        return freed

    def sem_leave_queue(self, name: str, owner: str) -> None:
        params: dict[str, Any] = {"owner": owner, "channel": self._sql.sem_channel}
        rows = self._fetch(
            name, "leave the queue of", self._sql.sem_leave_queue, params, semaphore=True
        )
        if rows[0][0]:
            self.semaphore_bus.notify(name)

    # -- cache entries (postgres_sql: "Cache entries") -----------------------------

    def _cache(
        self,
        subject: str,
        action: str,
        statements: Callable[[], list[tuple[str, dict[str, Any]]]],
        *,
        together: bool = False,
    ) -> list[list[tuple[Any, ...]]]:
        """Run cache statements (`_run`), in binary: entries come back as the bytes stored."""
        return self._run(
            statements,
            lambda exc, fired: self._failure(
                exc, f"{subject} on {self.server}: could not {action}", fired
            ),
            together=together,
            binary=True,
        )

    @staticmethod
    def _cache_subject(keys: Sequence[str]) -> str:
        if len(keys) == 1:
            return f"cache key {keys[0]!r}"
        return f"cache keys {keys[0]!r} and {len(keys) - 1} more"

    def cache_fetch(self, keys: Sequence[str], gen_key: str) -> tuple[list[bytes | None], int]:
        params: dict[str, Any] = {
            "keys": [sql.cache_key(key) for key in keys],
            "gen_key": sql.cache_key(gen_key),
        }
        subject = self._cache_subject(keys) if keys else f"cache generation {gen_key!r}"
        (rows,) = self._cache(
            subject,
            "read it" if len(keys) < 2 else "read them",
            lambda: [(self._sql.cache_fetch, params)],
        )
        found: list[bytes | None] = [None] * len(keys)
        for place, data, _ in rows:
            if place is not None:
                found[place - 1] = bytes(data)
        return found, int(rows[0][2])  # every row has the generation; there is one at least

    def cache_read(self, key: str, gen_key: str, claim: Claim | None = None) -> CacheRead:
        if claim is None:
            (entry,), generation = self.cache_fetch([key], gen_key)
            return CacheRead(entry, generation)
        read: dict[str, Any] = {
            "key": sql.cache_key(key),
            "gen_key": sql.cache_key(gen_key),
            "due_before": float(claim.due_before),
        }
        sweep = next(self._acquisitions) % sql.SWEEP_EVERY == 0

        def statements() -> list[tuple[str, dict[str, Any]]]:
            name = self._key(claim.lock)  # once the database told which keys it takes
            attempt = {**read, "name": name, "owner": claim.owner, "ttl": float(claim.ttl)}
            return [
                (self._sql.cache_claim_read, {**read, "gate": self._sql.gate_key(name)}),
                (self._sql.cache_claim_attempt[sweep], attempt),
            ]

        first, second = self._cache(
            f"cache key {key!r} (with a claim of lock {claim.lock!r})",
            "read it",
            statements,
            together=True,
        )
        if not second:  # not due: the first statement read it, and that was all
            data, generation, _, _, _ = first[0]
            return CacheRead(None if data is None else bytes(data), int(generation))
        data, generation, due, granted, token, seconds = second[0]
        entry = None if data is None else bytes(data)
        if not due:  # due when first read, no longer once the turn was had
            return CacheRead(entry, int(generation))
        if granted is None:
            attempt = Attempt(False)  # free, but a live waiter is queued ahead
        elif granted:
            attempt = Attempt(True, token=int(token))
        else:
            attempt = Attempt(False, holder_ttl=max(0.0, float(seconds)))
        return CacheRead(entry, int(generation), attempt)

    def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        # One write per key, the last; in key order (postgres_sql: no deadlock).
        latest: dict[bytes, tuple[bytes, float]] = {}
        for key, data, keep in items:
            keep = float(keep)
            latest[sql.cache_key(key)] = (bytes(data), min(keep, sql.MAX_KEEP) if keep > 0 else 0.0)
        if not latest:
            return
        stored = sorted(latest)
        params: dict[str, Any] = {
            "keys": stored,
            "datas": [latest[key][0] for key in stored],
            "keeps": [latest[key][1] for key in stored],
            "sweep": len(stored) + sql.SWEEP_BATCH,
        }
        self._cache(
            self._cache_subject([key for key, _, _ in items]),
            "store it" if len(items) == 1 else "store them",
            lambda: [(self._sql.cache_store, params)],
        )

    def cache_delete(self, key: str) -> bool:
        params: dict[str, Any] = {"key": sql.cache_key(key)}
        (rows,) = self._cache(
            f"cache key {key!r}", "delete it", lambda: [(self._sql.cache_delete, params)]
        )
        return bool(rows[0][0])

    def cache_invalidate(self, key: str, keep: float) -> bool:
        params: dict[str, Any] = {"key": sql.cache_key(key)}
        keep = float(keep)
        if keep > 0:
            params["keep"] = min(keep, sql.MAX_KEEP)
            query = self._sql.cache_invalidate
        else:
            query = self._sql.cache_delete
        (rows,) = self._cache(f"cache key {key!r}", "invalidate it", lambda: [(query, params)])
        return bool(rows[0][0])

    def cache_clear(self, gen_key: str) -> int:
        params: dict[str, Any] = {"gen_key": sql.cache_key(gen_key)}
        (rows,) = self._cache(
            f"cache generation {gen_key!r}", "bump it", lambda: [(self._sql.cache_clear, params)]
        )
        return int(rows[0][0])

    def cache_count(self, key_prefix: str) -> int | None:
        bounds = sql.cache_key_range(key_prefix)
        if bounds is None:
            return None  # longer than what a hashed key keeps of itself
        low, high = bounds
        if high is None:
            query, params = self._sql.cache_count_all, {}
        else:
            query, params = self._sql.cache_count, {"low": low, "high": high}
        (rows,) = self._cache(
            f"cache keys starting with {key_prefix!r}", "count them", lambda: [(query, params)]
        )
        return int(rows[0][0])

    # -- wake-ups -------------------------------------------------------------------

    def waiter(self, name: str) -> PostgresWaiter:
        return PostgresWaiter(self, name)

    def sem_waiter(self, name: str) -> PostgresWaiter:
        return PostgresWaiter(self, name, semaphore=True)

    def _current_feed(self) -> ReleaseFeed:
        proc = self._here()
        with self._mutex:
            feed = proc.feed
            if feed is None or not feed.usable:
                feed = proc.feed = ReleaseFeed(self._options, self._sql)
            return feed

    def _subscribe(
        self, name: str, channel: str, event: Event, *, semaphore: bool = False
    ) -> tuple[ReleaseFeed, str]:
        """Have `event` set on every release of `name` told on `channel`; returns the feed
        and the key heard."""
        alarm = sql.Alarm()
        try:
            if self._closed:
                raise _Closed
            self._pool(alarm)  # the first connection tells which keys the database takes
            key = self._key(name)
            feed = self._current_feed()
            feed.join(channel, key, event, alarm)
        except (psycopg.Error, OSError, _Closed) as exc:
            kind = "semaphore" if semaphore else "lock"
            raise self._error(exc, name, "wait for", alarm.fired, kind=kind) from exc
        return feed, key

    def close(self) -> None:
        self._closed = True
        proc = self._proc
        if proc.pid != os.getpid():
            return  # the parent's: never close it from a child
        with proc.start_lock:
            pool, proc.pool = proc.pool, None
        with self._mutex:
            feed, proc.feed = proc.feed, None
        if feed is not None:
            feed.close()
        if pool is not None:
            pool.close(timeout=self._timeout)


def _forget_parents() -> None:
    for backend in list(_BACKENDS):
        backend._forget_parent()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents)
