"""The PostgreSQL lock store shared by both flavours: URL, identifiers, schema, statements.

Nothing here sends a statement: `corral._async.backends.postgres` (and its
generated blocking twin) does.

**The tables.** A lock is a row in `<schema>.<prefix>locks`: name, owner,
fencing token and `expires_at`, a `timestamptz` set from the server's clock.
A row whose `expires_at` has passed is free; nobody has to delete it. A
release marks the row free (`expires_at` = the moment of release) rather than
deleting it, so every later acquisition of the name is an UPDATE of its row
under the row's lock (see the tokens, below). Its updates are HOT updates (no
indexed column changes, and a fill factor leaves room on the page), so the
table does not bloat, but it keeps one small row per lock name ever used.
Where names are many and short-lived (one per user, per job), delete old free
rows now and then, e.g. `DELETE FROM corral_locks WHERE expires_at < now() -
interval '1 hour'`: safe as long as no corral statement can run that long,
which the server-side `statement_timeout` (the store's `timeout`) ensures.
Fair waiters queue in `<prefix>queue`, ordered by a `bigserial` arrival
number; a place expires unless its waiter refreshes it.

**Creating them.** The tables are created on first use, unless they exist
already. `CREATE TABLE IF NOT EXISTS` alone is not safe when two sessions run
it at once: both may find the table missing and one then fails on the unique
index of `pg_type` (or `pg_class`). So the creation runs in one transaction
that first takes `pg_advisory_xact_lock` on a fixed key: creators queue, and
each sees what the previous one committed. To create the tables ahead of time
instead (a deploy step, or a role that may not run DDL), run the text of
`migration_sql()`; corral then finds them and sends no DDL.

**The clock.** Every expiry is computed and judged by `clock_timestamp()`,
the server's clock at the moment the expression is evaluated, never by a
client's clock. Not `now()`: that is the start of the transaction, frozen for
its length, so a statement that first waited for a row lock (a concurrent
acquisition of the same name) would judge expiry, and start a new TTL, by a
time already past.

**Fencing tokens.** Tokens come from one sequence, `nextval` of which never
returns the same value twice and is never rolled back, so tokens strictly
increase across every name, forever, restarts included. Within one name they
increase in acquisition order because the token is drawn inside the UPDATE of
the lock's row, while holding that row's lock: the next acquirer can only draw
after this one committed. (The first acquisition of a new name draws in the
INSERT; any later one draws later. Deleting a row freed a moment ago would
break this: a session could draw a token in its INSERT, stall, and insert
after a newer holder had come and gone; hence only old free rows may go.) A
sequence logs its advance to the WAL ahead of use, and a commit flushes that
record with it, so after a crash it resumes above every token of a committed
acquisition; only with `synchronous_commit = off` (or `fsync = off`) can a
crash forget the last acquisitions and hand their tokens out again. The
sequence must keep the default `CACHE 1`: a per-session cache would hand out
tokens out of order.

**Wake-ups.** A release sends `pg_notify` in the statement that frees the row,
so the notification is delivered exactly when that change commits, never for
a release that rolled back. All locks of one table prefix share one channel
per database, `<prefix>released` (schemas sharing a prefix share it too, at
the cost of a few needless wake-ups), with the lock name as payload (hashed
when longer than `MAX_PAYLOAD` bytes, as a payload must stay under 8000).
Every listening store hears every release of its table prefix, which costs a
few bytes each and spares a LISTEN round trip per waiter. The server keeps
notifications until every listener has read them, so a process frozen while
it LISTENs (SIGSTOP, a debugger) makes the queue grow; only after 8 GB of it
would releases start failing, and terminating that session ends it.

**Passwords.** The password (from the URL's user info or its query, like
`sslpassword` and libpq's other secrets) is taken out of the URL before libpq
parses the rest, so no libpq message about a malformed URL can quote it; it
goes into the connection string only, which nothing prints (`PostgresOptions`
leaves it out of its repr).

**Timeouts.** libpq has no timeout for a statement already sent: a server
that stops answering (SIGSTOP, a hung VM, a dropped route) leaves the client
waiting on its socket forever, and a server-side `statement_timeout` cannot
help when the server is what hangs. `Watchdog` is one thread per process
that shuts the socket down under a statement that outlives its deadline, so
the waiting call fails at once with a connection error, in either flavour;
psycopg then discards the connection.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import math
import os
import re
import select
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_to_bytes, urlencode

from corral.backends.registry import redact
from corral.core.options import Option, merge_options
from corral.core.validate import check_timeout
from corral.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_SCHEMA",
    "DEFAULT_TABLE_PREFIX",
    "DEFAULT_TIMEOUT",
    "MAX_PAYLOAD",
    "OPTIONS",
    "PostgresOptions",
    "Statements",
    "Watchdog",
    "migration_sql",
    "notify_key",
    "parse_url",
    "readable",
    "shutdown_socket",
    "watchdog",
]

DEFAULT_TIMEOUT = 5.0
DEFAULT_SCHEMA = "public"
DEFAULT_TABLE_PREFIX = "corral_"
DEFAULT_MAX_CONNECTIONS = 10
# NOTIFY payloads must be shorter than 8000 bytes; longer names are hashed.
MAX_PAYLOAD = 1024
# The key of the transaction-level advisory lock that serialises schema creation.
SCHEMA_LOCK_KEY = 0x636F7272616C  # b"corral"

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_SCHEMA = 63
# The longest derived name is "<prefix>queue_arrival_seq": 17 more bytes, within 63.
_MAX_PREFIX = 40
# libpq parameters whose values are secrets: kept out of every text libpq may quote.
_SECRET_PARAMS = (
    "password",
    "sslpassword",
    "oauth_client_secret",
    "scram_client_key",
    "scram_server_key",
)
_SECRET_QUERY = re.compile(r"(?i)((?:^|[?&])(?:" + "|".join(_SECRET_PARAMS) + r")=)[^&]*")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")

OPTIONS: tuple[Option, ...] = (
    Option(
        "timeout",
        "5",
        "seconds any call may take: waiting for a pooled connection, connecting, and each "
        "statement (the server's statement_timeout, and a watchdog for a server that stops "
        "answering)",
        example="2",
    ),
    Option(
        "schema",
        "`public`",
        "the schema of corral's tables (created on first use unless it exists)",
        example="public",
    ),
    Option(
        "table_prefix",
        "`corral_`",
        "starts the names of corral's tables, sequence and NOTIFY channel: stores with "
        "different prefixes share nothing",
        example="corral_",
    ),
    Option(
        "max_connections",
        "10",
        "the most pooled connections per store and process, plus one that LISTENs while "
        "someone waits",
        example="4",
    ),
    Option("pool_size", "10", "another name for max_connections", example="4"),
)


# -- the URL ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    conninfo: str = field(repr=False)
    """libpq connection string, password included: never shown to anyone."""
    listen_conninfo: str = field(repr=False)
    """The same, with TCP keepalives (unless given) for the long-lived LISTEN connection."""
    server: str
    """Where it points, for messages: no password, no query."""
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """The password and any other secret given: scrubbed from any error text, just in case."""
    timeout: float = DEFAULT_TIMEOUT
    schema: str = DEFAULT_SCHEMA
    table_prefix: str = DEFAULT_TABLE_PREFIX
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def parse_url(url: str, options: Mapping[str, object]) -> PostgresOptions:
    """`postgresql://user:password@host:port/db?sslmode=…`, options from keywords or the query.

    libpq parameters in the query (`sslmode`, `sslrootcert`, `connect_timeout`,
    `target_session_attrs`, …) pass through to libpq; corral's own options
    (`OPTIONS`) may be given as keywords or in the query, so `CORRAL_URL` and
    `--url` can carry them. Everything is checked here, before any connection.
    """
    from psycopg import Error as PsycopgError
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    shown = _redact(url)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("postgresql", "postgres"):
        raise ConfigError(f"{shown}: not a postgresql:// URL")
    rest, password = _take_password(rest, shown)
    base, _, query = rest.partition("?")
    given, passthrough = merge_options(
        shown, query, options, OPTIONS, backend="postgres", passthrough=True
    )
    secrets: dict[str, str] = {} if password is None else {"password": password}
    kept: list[tuple[str, str]] = []
    unknown: list[str] = []
    for key, value in passthrough:
        if key in _SECRET_PARAMS:
            secrets[key] = value  # as in libpq, the query overrides the user info
        elif key in _libpq_parameters():
            kept.append((key, value))
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(
            f"{shown}: unknown option(s) {', '.join(sorted(unknown))}; the postgres backend "
            f"takes {', '.join(sorted(o.name for o in OPTIONS))}, and libpq's connection "
            "parameters (sslmode, sslrootcert, connect_timeout, …) in the URL's query"
        )
    libpq_url = f"{scheme}://{base}" + (f"?{urlencode(kept, quote_via=quote)}" if kept else "")
    try:
        # No secret is left in this text, so libpq's message may quote it.
        params = conninfo_to_dict(libpq_url)
    except PsycopgError as exc:
        raise ConfigError(f"{shown}: not a valid PostgreSQL URL ({_one_line(exc)})") from None

    timeout = check_timeout(given.pop("timeout", DEFAULT_TIMEOUT), shown)
    schema = _identifier(given.pop("schema", DEFAULT_SCHEMA), "schema", _MAX_SCHEMA, shown)
    prefix = _identifier(
        given.pop("table_prefix", DEFAULT_TABLE_PREFIX), "table_prefix", _MAX_PREFIX, shown
    )
    if "max_connections" in given and "pool_size" in given:
        raise ConfigError(f"{shown}: give max_connections or pool_size, not both")
    size = given.pop("max_connections", given.pop("pool_size", DEFAULT_MAX_CONNECTIONS))
    max_connections = _count(size, "max_connections", shown)

    params.update(secrets)
    # libpq waits forever for a connection by default; psycopg enforces this one itself.
    params.setdefault("connect_timeout", str(max(2, math.ceil(timeout))))
    params.setdefault("application_name", "corral")
    # The LISTEN connection only ever reads: keepalives notice a dead peer on it.
    listen = {"keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3"}
    try:
        conninfo = make_conninfo("", **params)
        listen_conninfo = make_conninfo("", **{**listen, **params})
    except PsycopgError:
        # Its message would quote the connection string, secrets included.
        raise ConfigError(f"{shown}: not a valid PostgreSQL URL") from None
    return PostgresOptions(
        conninfo=conninfo,
        listen_conninfo=listen_conninfo,
        server=_server(scheme.lower(), params),
        secrets=tuple(value for value in secrets.values() if value),
        timeout=timeout,
        schema=schema,
        table_prefix=prefix,
        max_connections=max_connections,
    )


def _redact(url: str) -> str:
    """The URL for messages: no password, in the user info or in the query."""
    return _SECRET_QUERY.sub(r"\1***", redact(url))


def _take_password(rest: str, shown: str) -> tuple[str, str | None]:
    """`rest` (the URL after `://`) without the password of its user info, and that password.

    The user info ends, as libpq reads it, at the first `@` before the first
    `/`. An `@` in a user name or password must be written `%40`: with two
    before the query, which one ends the user info is a guess, and a wrong
    guess would put a piece of the password where messages quote the URL.
    """
    region = rest.split("/", 1)[0]
    at = region.find("@")
    if at < 0:
        return rest, None
    if region.split("?", 1)[0].count("@") > 1:
        raise ConfigError(f"{shown}: the URL's user name or password contains '@'; write it as %40")
    user, colon, password = rest[:at].partition(":")
    remainder = f"{user}@{rest[at + 1 :]}"
    if not colon or not password:
        return remainder, None
    if _BAD_PERCENT.search(password):
        raise ConfigError(
            f"{shown}: the URL's password has a '%' that does not start a %XX escape; "
            "write % itself as %25"
        )
    raw = unquote_to_bytes(password)
    if b"\0" in raw:
        raise ConfigError(f"{shown}: the URL's password contains %00, which libpq refuses")
    try:
        return remainder, raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: the URL's password is not UTF-8 once decoded") from None


@functools.lru_cache(maxsize=1)
def _libpq_parameters() -> frozenset[str]:
    from psycopg import pq

    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _server(scheme: str, params: Mapping[str, object]) -> str:
    """`postgresql://user@host:port/db` from the parsed parameters: never a password."""
    hosts = [h for h in str(params.get("host") or "").split(",") if h]
    ports = str(params.get("port") or "").split(",")
    socket_dirs = [h for h in hosts if h.startswith("/")]
    netlocs = []
    for index, host in enumerate(h for h in hosts if not h.startswith("/")):
        port = ports[index] if index < len(ports) else ports[-1]
        name = f"[{host}]" if ":" in host else host
        netlocs.append(f"{name}:{port or 5432}")
    user = params.get("user")
    netloc = (f"{quote(str(user), safe='')}@" if user else "") + ",".join(netlocs)
    where = f"{scheme}://{netloc}/{quote(str(params.get('dbname') or ''), safe='')}"
    if socket_dirs:
        where += f"?host={','.join(socket_dirs)}"
    return where


def _count(value: object, what: str, shown: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{shown}: {what} must be an integer >= 1, got {value!r}")
    return value


def _identifier(value: object, what: str, longest: int, shown: str) -> str:
    if not isinstance(value, str) or not _IDENT_RE.fullmatch(value) or len(value) > longest:
        raise ConfigError(
            f"{shown}: {what} must be letters, digits and underscores, not starting with a "
            f"digit, at most {longest} characters; got {value!r}"
        )
    return value


# -- identifiers and statements ------------------------------------------------------


def quote_ident(name: str) -> str:
    """A quoted SQL identifier: case kept exactly as given."""
    return '"' + name.replace('"', '""') + '"'


def notify_key(name: str) -> str:
    """The NOTIFY payload for lock `name`: the name itself, or a hash of a long one."""
    raw = name.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_PAYLOAD:
        return name
    return "sha256:" + hashlib.sha256(raw).hexdigest()


class Statements:
    """Every statement of the backend, with the schema and table prefix filled in."""

    def __init__(self, schema: str = DEFAULT_SCHEMA, table_prefix: str = DEFAULT_TABLE_PREFIX):
        s = quote_ident(schema)
        locks = f"{s}.{quote_ident(table_prefix + 'locks')}"
        queue = f"{s}.{quote_ident(table_prefix + 'queue')}"
        tokens = f"{s}.{quote_ident(table_prefix + 'tokens')}"
        self.schema = schema
        self.locks, self.queue, self.tokens = locks, queue, tokens
        self.channel = table_prefix + "released"
        self.tables = (locks, queue, tokens)
        self.create_schema = f"CREATE SCHEMA IF NOT EXISTS {s}"
        self.ddl = (
            # CACHE 1 (the default) matters: see the module docstring.
            f"CREATE SEQUENCE IF NOT EXISTS {tokens} CACHE 1 NO CYCLE",
            f"CREATE TABLE IF NOT EXISTS {locks} (\n"
            '    name text COLLATE "C" PRIMARY KEY,\n'
            "    owner text,\n"  # NULL while free or closed by release(hold_for=...)
            "    token bigint NOT NULL,\n"
            "    expires_at timestamptz NOT NULL\n"  # free once past; set to "now" on release
            ") WITH (fillfactor = 80)",
            f"CREATE TABLE IF NOT EXISTS {queue} (\n"
            '    name text COLLATE "C" NOT NULL,\n'
            '    owner text COLLATE "C" NOT NULL,\n'
            "    arrival bigserial NOT NULL,\n"
            "    expires_at timestamptz NOT NULL,\n"
            "    PRIMARY KEY (name, owner)\n"
            ")",
            f"CREATE INDEX IF NOT EXISTS {quote_ident(table_prefix + 'queue_arrival')}"
            f" ON {queue} (name, arrival)",
        )
        # Every object there: the DDL is skipped when all exist (no DDL rights needed).
        self.ready = (
            "SELECT to_regnamespace(%(schema)s) IS NOT NULL,"
            " to_regclass(%(locks)s) IS NOT NULL AND to_regclass(%(queue)s) IS NOT NULL"
            " AND to_regclass(%(tokens)s) IS NOT NULL"
        )
        self.ready_params = {"schema": s, "locks": locks, "queue": queue, "tokens": tokens}
        self.schema_lock = "SELECT pg_advisory_xact_lock(%(key)s)"
        self.listen = f"LISTEN {quote_ident(self.channel)}"

        ttl = "clock_timestamp() + %(ttl)s * interval '1 second'"
        # The token is drawn in the SET, i.e. under the row's lock (module docstring).
        take = (
            f" ON CONFLICT (name) DO UPDATE"
            f" SET owner = excluded.owner, token = nextval('{tokens}'), expires_at = {ttl}"
            f" WHERE l.expires_at <= clock_timestamp()"
            f" RETURNING l.token"
        )
        # On a conflict the same statement reports the holder's seconds left.
        answer = (
            " SELECT true, token, NULL::float8 FROM acquired"
            " UNION ALL"
            " SELECT false, NULL, extract(epoch FROM expires_at - clock_timestamp())::float8"
            f" FROM {locks} WHERE name = %(name)s AND expires_at > clock_timestamp()"
            " AND NOT EXISTS (SELECT FROM acquired)"
        )
        self.acquire = (
            f"WITH acquired AS ("
            f" INSERT INTO {locks} AS l (name, owner, token, expires_at)"
            f" VALUES (%(name)s, %(owner)s, nextval('{tokens}'), {ttl})"
            f"{take})" + answer
        )
        # Fair: only the head of the live queue may take the lock. In one statement:
        # take it if nobody live arrived earlier; then leave the queue if taken, else
        # join it (or refresh the place, keeping the arrival number); and purge the
        # places of waiters that stopped refreshing. The data-modifying parts touch
        # disjoint rows, as one statement may change a row only once. The purge skips
        # places another statement has locked instead of waiting for them, so two
        # waiters purging each other's places cannot deadlock.
        live_place = "expires_at > clock_timestamp()"
        self.acquire_fair = (
            f"WITH mine AS ("
            f" SELECT arrival FROM {queue} WHERE name = %(name)s AND owner = %(owner)s"
            f"), ahead AS ("
            f" SELECT FROM {queue} WHERE name = %(name)s AND owner <> %(owner)s"
            f" AND {live_place}"
            f" AND arrival < COALESCE((SELECT arrival FROM mine), 9223372036854775807)"
            f" LIMIT 1"
            f"), acquired AS ("
            f" INSERT INTO {locks} AS l (name, owner, token, expires_at)"
            f" SELECT %(name)s, %(owner)s, nextval('{tokens}'), {ttl}"
            f" WHERE NOT EXISTS (SELECT FROM ahead)"
            f"{take}"
            f"), left_queue AS ("
            f" DELETE FROM {queue} WHERE name = %(name)s AND owner = %(owner)s"
            f" AND EXISTS (SELECT FROM acquired)"
            f"), joined AS ("
            f" INSERT INTO {queue} (name, owner, expires_at)"
            f" SELECT %(name)s, %(owner)s, clock_timestamp() + %(queue_ttl)s * interval '1 second'"
            f" WHERE NOT EXISTS (SELECT FROM acquired)"
            f" ON CONFLICT (name, owner) DO UPDATE SET expires_at = excluded.expires_at"
            f"), purged AS ("
            f" DELETE FROM {queue} WHERE (name, owner) IN ("
            f" SELECT name, owner FROM {queue} WHERE name = %(name)s AND owner <> %(owner)s"
            f" AND NOT {live_place} FOR UPDATE SKIP LOCKED)"
            f")" + answer
        )

        live = "name = %(name)s AND expires_at > clock_timestamp()"
        mine = f"{live} AND owner = %(owner)s"
        # Compare-and-change by owner, and in the same statement whether a live row
        # remains (someone else's: LOST) or none does (EXPIRED).
        verdict = (
            f" SELECT (SELECT count(*) FROM changed), EXISTS (SELECT FROM {locks} WHERE {live})"
        )
        # The notification is part of the change, delivered only if it commits.
        self.release = (
            f"WITH changed AS ("
            f" UPDATE {locks} SET owner = NULL, expires_at = clock_timestamp() WHERE {mine}"
            f" RETURNING pg_notify(%(channel)s, %(key)s)"
            f")" + verdict
        )
        self.close = (
            f"WITH changed AS ("
            f" UPDATE {locks} SET owner = NULL,"
            f" expires_at = clock_timestamp() + %(hold)s * interval '1 second' WHERE {mine}"
            f" RETURNING name"
            f")" + verdict
        )
        self.extend = (
            f"WITH changed AS ("
            f" UPDATE {locks} SET expires_at = {ttl} WHERE {mine} RETURNING name"
            f")" + verdict
        )
        self.inspect = (
            f"SELECT owner, token, extract(epoch FROM expires_at - now_)::float8"
            f" FROM {locks}, clock_timestamp() AS now_"
            f" WHERE name = %(name)s AND expires_at > now_"
        )
        self.force_release = (
            f"WITH changed AS ("
            f" UPDATE {locks} SET owner = NULL, expires_at = clock_timestamp() WHERE {live}"
            f" RETURNING pg_notify(%(channel)s, %(key)s)"
            f") SELECT count(*) FROM changed"
        )
        # Leave the queue; if the leaver was its live head, the next waiter may go now.
        self.leave_queue = (
            f"WITH gone AS ("
            f" DELETE FROM {queue} WHERE name = %(name)s AND owner = %(owner)s"
            f" RETURNING arrival"
            f") SELECT pg_notify(%(channel)s, %(key)s) IS NULL FROM gone"
            f" WHERE NOT EXISTS (SELECT FROM {queue} q WHERE q.name = %(name)s"
            f" AND q.owner <> %(owner)s AND q.{live_place} AND q.arrival < gone.arrival)"
        )


def migration_sql(
    schema: str = DEFAULT_SCHEMA,
    table_prefix: str = DEFAULT_TABLE_PREFIX,
    *,
    grant_to: str | None = None,
) -> str:
    """The DDL that creates corral's tables, to run ahead of time (idempotent).

    Run it as a role allowed to create tables; with `grant_to`, it also grants
    that role what corral needs (DML on the two tables, USAGE on the
    sequences). corral then finds the tables and sends no DDL itself, so the
    role it connects as needs no CREATE privilege.
    """
    shown = "migration_sql()"
    statements = Statements(
        _identifier(schema, "schema", _MAX_SCHEMA, shown),
        _identifier(table_prefix, "table_prefix", _MAX_PREFIX, shown),
    )
    parts = [] if schema == DEFAULT_SCHEMA else [statements.create_schema]
    parts.extend(statements.ddl)
    if grant_to is not None:
        if not isinstance(grant_to, str) or not grant_to or "\0" in grant_to:
            raise ConfigError(f"{shown}: grant_to must be a role name, got {grant_to!r}")
        role = quote_ident(grant_to)
        arrival = f"{quote_ident(schema)}.{quote_ident(table_prefix + 'queue_arrival_seq')}"
        parts += [
            f"GRANT USAGE ON SCHEMA {quote_ident(schema)} TO {role}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {statements.locks}, {statements.queue}"
            f" TO {role}",
            f"GRANT USAGE ON SEQUENCE {statements.tokens}, {arrival} TO {role}",
        ]
    return "".join(f"{part};\n" for part in parts)


# -- the watchdog --------------------------------------------------------------------


class Alarm:
    """One armed deadline; `fired` tells afterwards whether the watchdog cut the socket."""

    __slots__ = ("fired", "ticket")

    def __init__(self) -> None:
        self.ticket = -1
        self.fired = False


class Watchdog:
    """Shuts down the socket under a statement that outlives its deadline (module docstring).

    One daemon thread per process serves every connection of both flavours.
    It sleeps until the earliest deadline and is woken only when a new one
    comes earlier, which, with one timeout per store, is rare: arming and
    disarming cost a dictionary update under a lock. A socket is shut down
    only while its statement is armed, under the same lock that disarms it,
    and a connection is closed only after its statement is disarmed, so the
    descriptor is not one that was closed and reused in the meantime. (The
    one exception: psycopg closes a connection itself when an interrupted
    statement cannot be cancelled, and the statement is then disarmed at once.)
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._armed: dict[int, tuple[float, int]] = {}
        self._fired: set[int] = set()
        self._tickets = itertools.count()
        self._wake_at = math.inf
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def armed(self, fd: int, seconds: float, alarm: Alarm | None = None) -> Iterator[Alarm]:
        """Within the block, the socket `fd` is shut down once `seconds` have passed."""
        alarm = alarm or Alarm()
        alarm.fired = False
        deadline = time.monotonic() + seconds
        with self._cond:
            alarm.ticket = next(self._tickets)
            self._armed[alarm.ticket] = (deadline, fd)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="corral-postgres-watchdog", daemon=True
                )
                self._thread.start()
            elif deadline < self._wake_at:
                self._cond.notify()
        try:
            yield alarm
        finally:
            with self._cond:
                if self._armed.pop(alarm.ticket, None) is None:
                    self._fired.discard(alarm.ticket)
                    alarm.fired = True

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for ticket, (deadline, fd) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[ticket]
                        self._fired.add(ticket)
                        shutdown_socket(fd)
                if self._armed:
                    self._wake_at = min(deadline for deadline, _ in self._armed.values())
                    self._cond.wait(self._wake_at - now)
                else:
                    # Disarmed deadlines are left to pass; with nothing armed, sleep.
                    self._wake_at = math.inf
                    self._cond.wait()


def shutdown_socket(fd: int) -> None:
    """End every wait on the socket `fd` at once (its owner sees the connection closed)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()  # closes only the duplicate; the connection's fd stays open


_WATCHDOG: Watchdog | None = None
_WATCHDOG_MUTEX = threading.Lock()


def watchdog() -> Watchdog:
    """This process's watchdog (a forked child starts its own)."""
    global _WATCHDOG
    dog = _WATCHDOG
    if dog is None:
        with _WATCHDOG_MUTEX:
            dog = _WATCHDOG
            if dog is None:
                dog = _WATCHDOG = Watchdog()
    return dog


def _after_fork_in_child() -> None:
    # The parent's thread does not exist here, and its lock may have been held.
    global _WATCHDOG, _WATCHDOG_MUTEX
    _WATCHDOG = None
    _WATCHDOG_MUTEX = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def readable(fd: int) -> bool:
    """Whether an idle connection has something to read: the server closed it, almost surely.

    An idle autocommit connection that listens to nothing receives nothing
    unless the server ends the session (restart, `pg_terminate_backend`,
    `idle_session_timeout`), so this tells a dead pooled connection from a
    live one without a round trip.
    """
    try:
        poller = select.poll()
    except AttributeError:  # no poll() (Windows): select() handles small fds there
        ready, _, _ = select.select([fd], [], [], 0)
        return bool(ready)
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))
