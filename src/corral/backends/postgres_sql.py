"""The PostgreSQL lock store shared by both flavours: URL, names, schema, statements.

Nothing here sends a statement: `corral._async.backends.postgres` (and its
generated blocking twin) does.

**The tables.** A lock is a row in `<schema>.<prefix>locks`: the name's key
(see "Names"), owner, fencing token and `expires_at`, a `timestamptz` set
from the server's clock. A row whose `expires_at` has passed is free. A
release deletes its row; `release(hold_for=S)` keeps it, ownerless, until S
seconds from now. Fair waiters queue in `<prefix>queue` (see "The queue").

**The queue.** A fair waiter's place is a row of `<prefix>queue`, ordered by
a `bigserial` arrival number, that expires unless its waiter refreshes it
(each attempt with `queue_ttl` does). Every attempt, fair or not, respects
that queue: a free lock with a live place in its queue goes to the earliest
place's owner, and nobody else. A place that expired counts for nothing, its
owner's included: a waiter that was paused past its queue TTL and comes back
queues again at the back, with a new arrival number, behind those who kept
their places. So a waiter that died holds the queue up until its place
expires, and then until the next waiter tries again: nothing announces an
expiry, so that is up to a second later (waiters re-check at least once a
second), or at once if a release wakes them first. Attempts judge the queue
by what was committed when they got the name's turn (see "Fencing tokens"),
so a place queued while one waited for it counts too.

**State per name is bounded.** What a release does not delete (the row of a
holder that crashed or let its TTL run out, a `hold_for` closure once it ends,
the place of a fair waiter that died) is swept by later acquisitions, of any
name: a store's first acquisition, and every `SWEEP_EVERY`th after that, also
deletes up to `SWEEP_BATCH` expired rows from each table, oldest first, found
through an index on `expires_at`. The sweep skips rows another statement has
locked (`SKIP LOCKED`) and runs after the acquisition's own work in its
statement, which is the last of its transaction, so it never waits, and never
holds rows while something else is waited for (no deadlock). An acquisition
adds at most one row, and sweeps remove expired rows faster than acquisitions
add them, so the tables hold about one row per held lock however many names
were ever used, with no purge job. Only a database where nobody acquires
anything any more keeps the expired rows of its last acquisitions until the
next one.

**Names.** Every `str` is a lock name. A name is its own key when it is text
PostgreSQL can store (no NUL, no lone surrogate; ASCII only in a database
whose encoding is neither UTF8 nor SQL_ASCII), of at most `MAX_KEY_BYTES`
bytes in UTF-8, and without `#sha256:` in it; any other name is stored as its
first `READABLE_CHARS` characters (made storable), `#sha256:` and the SHA-256
of the whole name. Only the hashed form contains the marker, so a name stored
as itself never meets a hashed one; and a long key stays far below a btree
row's limit (about 2.7 kB) and a NOTIFY payload's (8000 bytes). The lock's
row, its queue, its advisory lock (below) and the NOTIFY payload all use that
one key, so `lock_info`, `force_release` and waiters agree on it.

**Creating them.** The tables are created on first use, unless they exist
already. `CREATE TABLE IF NOT EXISTS` alone is not safe when two sessions run
it at once: both may find the table missing and one then fails on the unique
index of `pg_type` (or `pg_class`). So the creation runs in one transaction
that first takes `pg_advisory_xact_lock` on a fixed key: creators queue, and
each sees what the previous one committed, and sends only the statements
whose object is still missing: `CREATE INDEX IF NOT EXISTS` locks its table
even when the index exists, and a creator holding that lock while it creates
the next object would deadlock with the statements of stores already using
both tables (creators that queued behind the first, or a store of a newer
version adding the semaphores' tables next to the locks' while they are in
use). To create the tables ahead of time
instead (a deploy step, or a role that may not run DDL), run the text of
`migration_sql()`; corral then finds them and sends no DDL.

**The clock.** Every expiry is computed and judged by `clock_timestamp()`, the
server's clock at the moment the expression is evaluated, never by a client's
clock. Not `now()`: that is the start of the transaction, frozen for its
length, so an acquisition that first waited for the name's turn or for a row
lock would judge expiry, and start a new TTL, by a time already past. Only the
sweeps use `now()`, which an index can search with: a row expired before the
transaction began is expired now too.

**Fencing tokens.** Tokens come from one sequence, `nextval` of which never
returns the same value twice and is never rolled back, so tokens strictly
increase across every name, forever, restarts included. Within one name they
must also increase in the order the lock is granted, which the sequence alone
does not ensure once released rows are deleted: a session could draw a token,
stall before its row is inserted, and insert it after a newer holder (with a
larger token) had come and gone. So an acquisition first takes a
transaction-level advisory lock on a 64-bit hash of the table and the key
(`Statements.gate_key`), the name's turn, and draws its token only then:
acquisitions of one name take turns, each drawing after the previous one
committed, and the advisory lock ends with the transaction (nothing stays held
between calls). Names whose hashes collide merely take turns too. Releases,
extensions and sweeps draw no token and take no advisory lock. (The advisory
locks share the database's 64-bit key space with the application's own: a
session holding one on a key that equals one of these hashes would make that
name's acquisitions time out. Random 64-bit keys never meet in practice.) A
sequence logs its advance to the WAL ahead of use, and a commit flushes that
record with it, so after a crash it resumes above every token of a committed
acquisition; only with `synchronous_commit = off` (or `fsync = off`) can a
crash forget the last acquisitions and hand their tokens out again. The
sequence must keep the default `CACHE 1`: a per-session cache would hand out
tokens out of order.

**The turn, then the attempt.** The turn is a statement of its own
(`take_turn`), followed by the acquiring statement in the same transaction,
both sent in one round trip (psycopg's pipeline mode, whose closing Sync
commits them). Not one statement: in READ COMMITTED a statement judges by the
snapshot taken when it started, and waiting for the turn does not renew it, so
it would not see what the acquisitions before it committed meanwhile (a place
queued, a holder's row): it could take the lock past a live waiter, or be
refused by a holder it cannot see, and report none. The second statement
starts once the turn is had, and sees all of that.

**Wake-ups.** A release sends `pg_notify` in the statement that frees the row,
so the notification is delivered exactly when that change commits, never for
a release that rolled back. All locks of one table prefix share one channel
per database, `<prefix>released` (schemas sharing a prefix share it too, at
the cost of a few needless wake-ups), with the lock's key as payload. Every
listening store hears every release of its table prefix, which costs a few
bytes each and spares a LISTEN round trip per waiter. The server keeps
notifications until every listener has read them, so a process frozen while
it LISTENs (SIGSTOP, a debugger) makes the queue grow; only after 8 GB of it
would releases start failing, and terminating that session ends it.

**Semaphores.** A semaphore's slot is a row of `<prefix>sem_slots`: the
name's key (as for locks, see "Names"), the token, the owner (NULL while
`release(hold_for=S)` keeps the slot closed), `expires_at` and the limit it
was taken with; its fair waiters queue in `<prefix>sem_waiters`, as those
of a lock do in `<prefix>queue`. A lock and a semaphore of one name share
nothing but the key. An attempt takes the semaphore's turn, a transaction
advisory lock in the two-int key space (`pg_advisory_xact_lock(int, int)`,
which PostgreSQL keeps apart from the one-bigint keys of the locks' turns),
then, in one statement of the same transaction sent in the same round trip
(the reason it is two statements is the locks': only a statement that starts
once the turn is had sees what the attempt before it committed), counts the
live slots at one instant, compares the holders' limit, counts the live
waiters queued ahead (up to the limit), and inserts a slot with a token from
the locks' sequence only when all of that allows it. Attempts on one name
thus take turns, so the count cannot go stale before the insert and tokens
increase per name in the order the slots are granted. The same statement
deletes the name's expired slots (and expired places), and one acquisition
in `SWEEP_EVERY`, lock or semaphore, sweeps all four tables. An extension,
and a release with `hold_for`, move a slot's expiry and run in the turn too:
otherwise an attempt whose snapshot predates an extension committed just as
the old expiry passed would count that slot free and grant one too many. A
plain release and a forced one only delete live slots, which an attempt at
worst still counts, and wake the waiters with `pg_notify` on the channel
`<prefix>sem_freed`, which the one LISTEN connection hears along with the
locks' channel.

**Cache entries.** An entry is a row of `<prefix>cache_entries`: its key, the
stored bytes (`corral.core.envelope`) and `expires_at`, from the server's
clock like every expiry here (`keep` seconds from now, to the microsecond: no
rounding); a row past it is gone for every reader. A namespace's generation is
a row of `<prefix>cache_generations`, bumped by one upsert, never expiring (a
generation must never go back; there is one row per namespace ever cleared).
Keys are `bytea`, a key's UTF-8 (`surrogatepass`), so any `str` is a key (NUL
and lone surrogates included) and no database encoding matters. A key longer
than `MAX_KEY_BYTES` is stored as its first `CACHE_READABLE_BYTES` bytes, the
byte 0xFF, which UTF-8 never contains, so no key stored as itself is ever one
stored hashed, and the SHA-256 of the whole key (`cache_key`); a key's first
bytes stay its first bytes either way, so the entries under a prefix (up to
`CACHE_READABLE_BYTES` long) are one range of the primary key. The tables are
their own key space: no lock, semaphore or other table prefix shares them.

Each primitive is one statement (a read with a claim: one round trip, below).
A fetch reads every key and the generation at one snapshot. A store is one
`INSERT … SELECT FROM unnest(…) ON CONFLICT (key) DO UPDATE`, its keys sorted,
so two stores lock the rows they share in the same order and never deadlock;
a `keep <= 0` in it empties the entry and expires it (only where a row was
there), which readers see as deleted and the sweeps below delete. Invalidate
is one `UPDATE` that rewrites `fresh_until` in place with `overlay` (the bytes
are corral's, checked as `claim_due` does), or deletes what is not corral's.
Clear is one upsert that adds one, returning the new generation.

*Expired entries are swept by writes*: every store also deletes up to as
many expired rows as it writes, plus `SWEEP_BATCH`, oldest first through the
index on `expires_at`, after its own writes (`SKIP LOCKED`, never waiting
while holding them), so the table never holds more expired rows than about
the last writes left, however many keys were ever used; reads stay reads.

*A read with a claim* reads the entry and the generation and, only when the
entry is due, tries the claim's lock, in one round trip and one transaction:
two statements, as a lock's attempt is. The first reads and decides, exactly
as `corral.core.envelope.claim_due` does (missing, another generation,
bytes that are not a corral entry, or `max(fresh_until, retry_until) <=
due_before`: the header's fields parsed from their fixed offsets); only when
the entry is due does it take the lock's turn, and then it sets a flag local
to the transaction (`corral.claim`). The second is the lock's own attempt
(`acquire`, built from the same parts: the same token sequence, queue rule and
sweeps) gated on that flag and on the entry still being due as it reads it
again, at its own snapshot, taken once the turn is had. A read that is not
due costs no turn, no token and no write: concurrent readers of a fresh entry
never wait for each other. The answer is the read that decided: the first
statement's when it was not due, else the second's, with its attempt.

**Passwords.** The password (from the URL's user info or its query, like
`sslpassword` and libpq's other secrets) is taken out of the URL before libpq
parses the rest, so no libpq message about a malformed URL can quote it; it
goes into the connection string only, which nothing prints (`PostgresOptions`
leaves it out of its repr). A URL whose user info holds an unencoded `/`, `?`
or `#` is refused, as where its password ends would be a guess
(`registry.check_userinfo`).

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

from corral.backends.registry import check_userinfo, redact
from corral.core.envelope import (
    CODEC_AT,
    DELTA_AT,
    FRESH_AT,
    GENERATION_AT,
    HEADER_SIZE,
    MAGIC,
    RETRY_AT,
)
from corral.core.options import Option, merge_options
from corral.core.validate import check_timeout
from corral.errors import ConfigError

__all__ = [
    "CACHE_READABLE_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_SCHEMA",
    "DEFAULT_TABLE_PREFIX",
    "DEFAULT_TIMEOUT",
    "MAX_KEEP",
    "MAX_KEY_BYTES",
    "OPTIONS",
    "SWEEP_BATCH",
    "SWEEP_EVERY",
    "PostgresOptions",
    "Statements",
    "Watchdog",
    "cache_key",
    "cache_key_range",
    "entry_is_due",
    "entry_is_ours",
    "lock_key",
    "migration_sql",
    "parse_url",
    "readable",
    "shutdown_socket",
    "watchdog",
]

DEFAULT_TIMEOUT = 5.0
DEFAULT_SCHEMA = "public"
DEFAULT_TABLE_PREFIX = "corral_"
DEFAULT_MAX_CONNECTIONS = 10
MAX_KEY_BYTES = 1024
"""Longer names (in UTF-8) are stored hashed (see "Names" in the module docstring)."""
READABLE_CHARS = 64
"""How much of a hashed name stays readable in its key, for operators."""
HASH_MARK = "#sha256:"
SWEEP_EVERY = 8
"""A store's acquisitions that sweep expired rows: its first, then one in this many."""
SWEEP_BATCH = 32
"""The most expired rows one sweeping acquisition deletes from each table."""
CACHE_READABLE_BYTES = MAX_KEY_BYTES - 33
"""How much of a hashed cache key stays as it is: a hashed key is as long as the longest
key stored as itself (see "Cache entries" in the module docstring)."""
CACHE_HASH_MARK = b"\xff"
MAX_KEEP = 1e11
"""The longest `keep` (about 3,000 years): more would overflow PostgreSQL's intervals."""
# The key of the transaction-level advisory lock that serialises schema creation.
SCHEMA_LOCK_KEY = 0x636F7272616C  # b"corral"

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_SCHEMA = 63
# The longest derived name is "<prefix>sem_waiters_arrival_seq": 23 more bytes, within 63.
_MAX_PREFIX = 40
# What a key may not contain: NUL and lone surrogates (UTF-8 cannot carry them).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NON_ASCII = re.compile("[^\x01-\x7f]")
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
    check_userinfo(url, shown)
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
    # Keys are str, sent as UTF-8 whatever the URL asks (see "Names").
    params["client_encoding"] = "UTF8"
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
    """The URL for messages: no password, in the user info or in the query (libpq has
    more secrets than `password`, such as `sslpassword`)."""
    return _SECRET_QUERY.sub(r"\1***", redact(url))


def _take_password(rest: str, shown: str) -> tuple[str, str | None]:
    """`rest` (the URL after `://`) without the password of its user info, and that password.

    The user info ends at the `@` before the first `/`, `?` or `#`, the only
    one there may be once `check_userinfo` passed. An `@` in a user name or
    password must be written `%40`: with two there, which one ends the user
    info is a guess, and a wrong guess would put a piece of the password
    where messages quote the URL.
    """
    region = re.split("[/?#]", rest, maxsplit=1)[0]
    at = region.find("@")
    if at < 0:
        return rest, None
    if region.count("@") > 1:
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


# -- names, identifiers and statements ------------------------------------------------


def lock_key(name: str, *, ascii_only: bool = False) -> str:
    """The key that stands for lock `name` in the tables and NOTIFY payloads.

    The name itself where PostgreSQL can store it as it is, else a readable
    part and a hash (see "Names" in the module docstring). `ascii_only` is
    for a database whose encoding cannot hold every character.
    """
    if HASH_MARK not in name and not _UNSTORABLE.search(name):
        if ascii_only:
            if len(name) <= MAX_KEY_BYTES and not _NON_ASCII.search(name):
                return name
        elif len(name) <= MAX_KEY_BYTES // 4 or len(name.encode()) <= MAX_KEY_BYTES:
            return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    shown = (_NON_ASCII if ascii_only else _UNSTORABLE).sub("?", name[:READABLE_CHARS])
    return f"{shown}{HASH_MARK}{digest}"


def cache_key(key: str) -> bytes:
    """The `bytea` that stands for cache key (or generation key) `key` in the cache tables.

    Its UTF-8 where that is at most `MAX_KEY_BYTES` long, else its first
    `CACHE_READABLE_BYTES` bytes, 0xFF and its SHA-256 (see "Cache entries" in
    the module docstring).
    """
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_KEY_BYTES:
        return raw
    return raw[:CACHE_READABLE_BYTES] + CACHE_HASH_MARK + hashlib.sha256(raw).digest()


def cache_key_range(prefix: str) -> tuple[bytes, bytes | None] | None:
    """The `[low, high)` range of stored keys whose key starts with `prefix` (`high` None:
    no upper bound), or None when the prefix is longer than hashed keys keep readable."""
    low = prefix.encode("utf-8", "surrogatepass")
    if len(low) > CACHE_READABLE_BYTES:
        return None
    if not low:
        return low, None
    # UTF-8 has no 0xFF byte, so the last byte can always go up by one.
    return low, low[:-1] + bytes([low[-1] + 1])


# What Python's float() and int() read in a header field (`corral.core.envelope`), as
# PostgreSQL regular expressions: surrounding whitespace, a sign, digits with a point,
# an exponent (of at most three digits: every PostgreSQL casts that to numeric). What
# float() reads besides (inf, nan, underscores, longer exponents) no writer of corral's
# ever puts there; here it is "not corral's", which a claim finds due.
_FLOAT_FIELD = "^[[:space:]]*[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?0*[0-9]{1,3})?[[:space:]]*$"
_INT_FIELD = "^[[:space:]]*[-+]?[0-9]+[[:space:]]*$"


def _field(data: str, at: slice) -> str:
    """The text of one header field of the `bytea` expression `data`; other bytes than
    printable ASCII come out as escapes (`\\nnn`), which no field pattern matches."""
    return f"encode(substr({data}, {at.start + 1}, {at.stop - at.start}), 'escape')"


def entry_is_ours(data: str) -> str:
    """SQL: whether the `bytea` expression `data` (not NULL) is a corral entry of this
    format, as `corral.core.envelope.decode_header` decides. Never raises: every part
    reads bytes that may be missing or anything at all."""
    return (
        f"(length({data}) >= {HEADER_SIZE}"
        f" AND substr({data}, 1, {len(MAGIC)}) = '{MAGIC.decode()}'::bytea"
        f" AND substr({data}, {HEADER_SIZE}, 1) = decode('0a', 'hex')"
        f" AND substr({data}, {CODEC_AT + 1}, 1) < decode('80', 'hex')"
        f" AND {_field(data, FRESH_AT)} ~ '{_FLOAT_FIELD}'"
        f" AND {_field(data, RETRY_AT)} ~ '{_FLOAT_FIELD}'"
        f" AND {_field(data, DELTA_AT)} ~ '{_FLOAT_FIELD}'"
        f" AND {_field(data, GENERATION_AT)} ~ '{_INT_FIELD}')"
    )


def entry_is_due(data: str, generation: str, due_before: str) -> str:
    """SQL: `corral.core.envelope.claim_due(data, generation, due_before)`.

    Missing, not corral's, of another generation, or neither fresh nor held
    back at `due_before`. The fields are compared as float() reads them: the
    later of the two, parsed as numeric, becomes the nearest float8 (what
    float() returns), or an infinity past float8's range, so the comparison
    with `due_before` (a float8) is Python's own.
    """
    until = f"GREATEST({_field(data, FRESH_AT)}::numeric, {_field(data, RETRY_AT)}::numeric)"
    return (
        f"(CASE WHEN {data} IS NULL THEN true WHEN NOT {entry_is_ours(data)} THEN true"
        f" ELSE (SELECT h.generation <> {generation} OR CASE"
        " WHEN h.until > 1e308 THEN 'Infinity'::float8"
        " WHEN h.until < -1e308 THEN '-Infinity'::float8"
        " WHEN abs(h.until) < 1e-300 THEN 0::float8"
        f" ELSE h.until::float8 END <= {due_before}::float8"
        f" FROM (SELECT {_field(data, GENERATION_AT)}::numeric AS generation,"
        f" {until} AS until) AS h) END)"
    )


def quote_ident(name: str) -> str:
    """A quoted SQL identifier: case kept exactly as given."""
    return '"' + name.replace('"', '""') + '"'


class Statements:
    """Every statement of the backend, with the schema and table prefix filled in.

    Parameters: `name` is always the lock's key (`lock_key`), never the name
    as given; `gate` is `gate_key(key)`.
    """

    def __init__(self, schema: str = DEFAULT_SCHEMA, table_prefix: str = DEFAULT_TABLE_PREFIX):
        s = quote_ident(schema)
        locks = f"{s}.{quote_ident(table_prefix + 'locks')}"
        queue = f"{s}.{quote_ident(table_prefix + 'queue')}"
        tokens = f"{s}.{quote_ident(table_prefix + 'tokens')}"
        locks_expiry = quote_ident(table_prefix + "locks_expiry")
        queue_expiry = quote_ident(table_prefix + "queue_expiry")
        # Semaphores (module docstring, "Semaphores"). No new name ends with an older one
        # or the other way round, so no table prefix's objects are another prefix's.
        slots = f"{s}.{quote_ident(table_prefix + 'sem_slots')}"
        waiters = f"{s}.{quote_ident(table_prefix + 'sem_waiters')}"
        slots_expiry = quote_ident(table_prefix + "sem_slots_expiry")
        waiters_expiry = quote_ident(table_prefix + "sem_waiters_expiry")
        # Cache entries (module docstring, "Cache entries"); the same holds of these names.
        entries = f"{s}.{quote_ident(table_prefix + 'cache_entries')}"
        generations = f"{s}.{quote_ident(table_prefix + 'cache_generations')}"
        entries_expiry = quote_ident(table_prefix + "cache_entries_expiry")
        self.schema = schema
        self.locks, self.queue, self.tokens = locks, queue, tokens
        self.slots, self.waiters = slots, waiters
        self.entries, self.generations = entries, generations
        self.channel = table_prefix + "released"
        self.sem_channel = table_prefix + "sem_freed"
        self.tables = (locks, queue, tokens, slots, waiters, entries, generations)
        self._gate_salt = f"{schema}.{table_prefix}\0".encode()
        # Keys never contain NUL, so no lock's salted key is a semaphore's.
        self._sem_gate_salt = f"{schema}.{table_prefix}\0semaphore\0".encode()
        self.create_schema = f"CREATE SCHEMA IF NOT EXISTS {s}"
        self.ddl = (
            # CACHE 1 (the default) matters: see the module docstring.
            f"CREATE SEQUENCE IF NOT EXISTS {tokens} CACHE 1 NO CYCLE",
            f"CREATE TABLE IF NOT EXISTS {locks} (\n"
            '    name text COLLATE "C" PRIMARY KEY,\n'
            "    owner text,\n"  # NULL while closed by release(hold_for=...)
            "    token bigint NOT NULL,\n"
            "    expires_at timestamptz NOT NULL\n"  # free once past; then swept
            ")",
            # The sweeps find expired rows through these (module docstring).
            f"CREATE INDEX IF NOT EXISTS {locks_expiry} ON {locks} (expires_at)",
            f"CREATE TABLE IF NOT EXISTS {queue} (\n"
            '    name text COLLATE "C" NOT NULL,\n'
            '    owner text COLLATE "C" NOT NULL,\n'
            "    arrival bigserial NOT NULL,\n"
            "    expires_at timestamptz NOT NULL,\n"
            "    PRIMARY KEY (name, owner)\n"
            ")",
            f"CREATE INDEX IF NOT EXISTS {quote_ident(table_prefix + 'queue_arrival')}"
            f" ON {queue} (name, arrival)",
            f"CREATE INDEX IF NOT EXISTS {queue_expiry} ON {queue} (expires_at)",
            f"CREATE TABLE IF NOT EXISTS {slots} (\n"
            '    name text COLLATE "C" NOT NULL,\n'
            "    token bigint NOT NULL,\n"
            "    owner text,\n"  # NULL while closed by release(hold_for=...)
            "    expires_at timestamptz NOT NULL,\n"  # free once past; then deleted
            "    slot_limit bigint NOT NULL,\n"  # the limit it was taken with
            "    PRIMARY KEY (name, token)\n"
            ")",
            f"CREATE INDEX IF NOT EXISTS {slots_expiry} ON {slots} (expires_at)",
            f"CREATE TABLE IF NOT EXISTS {waiters} (\n"
            '    name text COLLATE "C" NOT NULL,\n'
            '    owner text COLLATE "C" NOT NULL,\n'
            "    arrival bigserial NOT NULL,\n"
            "    expires_at timestamptz NOT NULL,\n"
            "    PRIMARY KEY (name, owner)\n"
            ")",
            f"CREATE INDEX IF NOT EXISTS {quote_ident(table_prefix + 'sem_waiters_arrival')}"
            f" ON {waiters} (name, arrival)",
            f"CREATE INDEX IF NOT EXISTS {waiters_expiry} ON {waiters} (expires_at)",
            f"CREATE TABLE IF NOT EXISTS {entries} (\n"
            "    key bytea PRIMARY KEY,\n"  # cache_key(key)
            "    data bytea NOT NULL,\n"
            "    expires_at timestamptz NOT NULL\n"  # gone once past; then swept
            ")",
            f"CREATE INDEX IF NOT EXISTS {entries_expiry} ON {entries} (expires_at)",
            f"CREATE TABLE IF NOT EXISTS {generations} (\n"
            "    key bytea PRIMARY KEY,\n"  # cache_key(gen_key)
            "    generation bigint NOT NULL\n"
            ")",
        )
        # Every object there (the DDL is skipped when all exist: no DDL rights needed),
        # and whether the database can store any text (module docstring, "Names").
        self.ready = (
            "SELECT to_regnamespace(%(schema)s) IS NOT NULL,"
            " to_regclass(%(locks)s) IS NOT NULL AND to_regclass(%(queue)s) IS NOT NULL"
            " AND to_regclass(%(tokens)s) IS NOT NULL"
            " AND to_regclass(%(locks_expiry)s) IS NOT NULL"
            " AND to_regclass(%(queue_expiry)s) IS NOT NULL"
            " AND to_regclass(%(slots)s) IS NOT NULL AND to_regclass(%(waiters)s) IS NOT NULL"
            " AND to_regclass(%(slots_expiry)s) IS NOT NULL"
            " AND to_regclass(%(waiters_expiry)s) IS NOT NULL"
            " AND to_regclass(%(entries)s) IS NOT NULL"
            " AND to_regclass(%(entries_expiry)s) IS NOT NULL"
            " AND to_regclass(%(generations)s) IS NOT NULL,"
            " current_setting('server_encoding') IN ('UTF8', 'SQL_ASCII')"
        )
        self.ready_params = {
            "schema": s,
            "locks": locks,
            "queue": queue,
            "tokens": tokens,
            "locks_expiry": f"{s}.{locks_expiry}",
            "queue_expiry": f"{s}.{queue_expiry}",
            "slots": slots,
            "waiters": waiters,
            "slots_expiry": f"{s}.{slots_expiry}",
            "waiters_expiry": f"{s}.{waiters_expiry}",
            "entries": entries,
            "entries_expiry": f"{s}.{entries_expiry}",
            "generations": generations,
        }
        self.schema_lock = "SELECT pg_advisory_xact_lock(%(key)s)"
        # The object each statement of `ddl` creates, and which of them exist, asked
        # once the schema lock is had: from the catalog tables themselves, as of now.
        # (`to_regclass` may answer from the session's cache, which a wait for an
        # advisory lock does not refresh, and say "missing" about tables committed
        # meanwhile.)
        self.ddl_objects = tuple(
            table_prefix + suffix
            for suffix in (
                "tokens",
                "locks",
                "locks_expiry",
                "queue",
                "queue_arrival",
                "queue_expiry",
                "sem_slots",
                "sem_slots_expiry",
                "sem_waiters",
                "sem_waiters_arrival",
                "sem_waiters_expiry",
                "cache_entries",
                "cache_entries_expiry",
                "cache_generations",
            )
        )
        assert len(self.ddl_objects) == len(self.ddl)
        self.created = (
            "SELECT c.relname FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %(schema)s AND c.relname = ANY(%(objects)s)"
        )
        self.created_params = {"schema": schema, "objects": list(self.ddl_objects)}
        # Both channels on the one LISTEN connection, in one round trip (no parameters:
        # the simple query protocol, which takes several statements).
        self.listen = f"LISTEN {quote_ident(self.channel)}; LISTEN {quote_ident(self.sem_channel)}"

        ttl = "clock_timestamp() + %(ttl)s * interval '1 second'"
        live_place = "expires_at > clock_timestamp()"
        # The name's turn (module docstring, "Fencing tokens"), in a statement of its
        # own that `acquire` follows in the same transaction: only a statement that
        # starts once the turn is taken sees everything committed before it.
        self.take_turn = "SELECT pg_advisory_xact_lock(%(gate)s)"
        # Whether a live place queued ahead of this owner: the earliest live place
        # that is not this owner's, and earlier than this owner's own live place if it
        # has one. A place of its own that expired counts for nothing (module
        # docstring, "The queue").
        ahead = (
            f"mine AS ("
            f" SELECT arrival FROM {queue} WHERE name = %(name)s AND owner = %(owner)s"
            f" AND {live_place}"
            f"), ahead AS ("
            f" SELECT FROM {queue} WHERE name = %(name)s AND owner <> %(owner)s"
            f" AND {live_place}"
            f" AND arrival < COALESCE((SELECT arrival FROM mine), 9223372036854775807)"
            f" LIMIT 1"
            f")"
        )

        # Take the lock if nobody is ahead: insert its row, or take over an expired one.
        # `also` is one more condition (a cache read's claim: "Cache entries").
        def acquiring(also: str = "") -> str:
            return (
                f"acquired AS ("
                f" INSERT INTO {locks} AS l (name, owner, token, expires_at)"
                f" SELECT %(name)s, %(owner)s, nextval('{tokens}'), {ttl}"
                f" WHERE NOT EXISTS (SELECT FROM ahead){also}"
                f" ON CONFLICT (name) DO UPDATE"
                f" SET owner = excluded.owner, token = excluded.token, expires_at = {ttl}"
                f" WHERE l.expires_at <= clock_timestamp()"
                f" RETURNING l.token"
                f")"
            )

        acquired = acquiring()
        # Parts that must come after the attempt, so that nothing they lock is held
        # while the attempt waits: they read `acquired`, which runs it first.
        after = "(SELECT count(*) FROM acquired) >= 0"
        # Fair: leave the queue if taken, else join it (or refresh the place: a live
        # one keeps its arrival number, an expired one gets a new one, at the back),
        # and purge the expired places of this name. One statement may change a row
        # only once, so every part touches rows the others do not. SKIP LOCKED: two
        # waiters purging each other's places must not wait for each other.
        fair = (
            f", left_queue AS ("
            f" DELETE FROM {queue} WHERE name = %(name)s AND owner = %(owner)s"
            f" AND EXISTS (SELECT FROM acquired)"
            f"), joined AS ("
            f" INSERT INTO {queue} AS q (name, owner, expires_at)"
            f" SELECT %(name)s, %(owner)s, clock_timestamp() + %(queue_ttl)s * interval '1 second'"
            f" WHERE NOT EXISTS (SELECT FROM acquired)"
            f" ON CONFLICT (name, owner) DO UPDATE SET expires_at = excluded.expires_at,"
            f" arrival = CASE WHEN q.{live_place} THEN q.arrival ELSE excluded.arrival END"
            f"), purged AS ("
            f" DELETE FROM {queue} WHERE (name, owner) IN ("
            f" SELECT name, owner FROM {queue} WHERE {after} AND name = %(name)s"
            f" AND owner <> %(owner)s AND NOT {live_place} FOR UPDATE SKIP LOCKED)"
            f")"
        )

        # The sweep (module docstring): expired rows of other names, oldest first.
        # The ids are collected (and locked) once, and the deletion by id is skipped
        # when there are none, so a sweep with nothing to do costs one index probe.
        def sweep(table: str, tag: str, when: str = after) -> str:
            return (
                f", doomed_{tag} AS (SELECT ARRAY("
                f"SELECT ctid FROM {table} WHERE {when} AND expires_at < now()"
                f" AND name <> %(name)s ORDER BY expires_at LIMIT {SWEEP_BATCH}"
                f" FOR UPDATE SKIP LOCKED) AS ids"
                f"), swept_{tag} AS ("
                f" DELETE FROM {table} WHERE ctid = ANY ((SELECT ids FROM doomed_{tag})::tid[])"
                f" AND cardinality((SELECT ids FROM doomed_{tag})) > 0"
                f")"
            )

        # Every table, whichever kind of acquisition sweeps: names used once by locks
        # only, or by semaphores only, are all left with nothing.
        def sweeping(when: str = after) -> str:
            return (
                sweep(locks, "rows", when)
                + sweep(queue, "places", when)
                + sweep(slots, "slots", when)
                + sweep(waiters, "waiters", when)
            )

        sweeps = sweeping()
        # Granted: the token. Refused: the holder's seconds left, or no row at all
        # when the lock is free but someone is queued ahead.
        answer = (
            " SELECT true, token, NULL::float8 FROM acquired"
            " UNION ALL"
            " SELECT false, NULL, extract(epoch FROM expires_at - clock_timestamp())::float8"
            f" FROM {locks} WHERE name = %(name)s AND expires_at > clock_timestamp()"
            " AND NOT EXISTS (SELECT FROM acquired)"
        )
        head = f"WITH {ahead}, {acquired}"
        # Indexed by (fair, sweep); each runs right after `take_turn`, in its transaction.
        self.acquire = {
            (False, False): head + answer,
            (False, True): head + sweeps + answer,
            (True, False): head + fair + answer,
            (True, True): head + fair + sweeps + answer,
        }

        live = "name = %(name)s AND expires_at > clock_timestamp()"
        mine = f"{live} AND owner = %(owner)s"
        # Compare-and-change by owner, and in the same statement whether a live row
        # remains (someone else's: LOST) or none does (EXPIRED). The main query sees
        # the rows as they were before the change, which matters only when none was.
        verdict = (
            f" SELECT (SELECT count(*) FROM changed), EXISTS (SELECT FROM {locks} WHERE {live})"
        )
        # The notification is part of the change, delivered only if it commits.
        self.release = (
            f"WITH changed AS ("
            f" DELETE FROM {locks} WHERE {mine}"
            f" RETURNING pg_notify(%(channel)s, %(name)s)"
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
            f" DELETE FROM {locks} WHERE {live}"
            f" RETURNING pg_notify(%(channel)s, %(name)s)"
            f") SELECT count(*) FROM changed"
        )
        # Leave the queue; if the leaver was its live head, the next waiter may go now.
        self.leave_queue = (
            f"WITH gone AS ("
            f" DELETE FROM {queue} WHERE name = %(name)s AND owner = %(owner)s"
            f" RETURNING arrival"
            f") SELECT pg_notify(%(channel)s, %(name)s) IS NULL FROM gone"
            f" WHERE NOT EXISTS (SELECT FROM {queue} q WHERE q.name = %(name)s"
            f" AND q.owner <> %(owner)s AND q.{live_place} AND q.arrival < gone.arrival)"
        )

        # -- semaphores (module docstring, "Semaphores") --
        # The semaphore's turn: the two-int advisory lock, a key space of its own that
        # no lock's turn (and no one-bigint advisory lock) can ever share.
        self.sem_take_turn = "SELECT pg_advisory_xact_lock(%(high)s, %(low)s)"
        # One instant for the whole attempt: the slots counted live, the one taken
        # and the places judged all by the same clock.
        at = "(SELECT now FROM clock)"
        sem_ttl = f"{at} + %(ttl)s * interval '1 second'"
        # The waiters queued ahead, counted up to the limit (more would change nothing).
        # A place of its own that expired counts for nothing, as for locks.
        sem_head = (
            f"WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now"
            f"), state AS MATERIALIZED ("
            f" SELECT count(*) AS taken, min(slot_limit) AS held_limit,"
            f" min(expires_at) AS soonest"
            f" FROM {slots} WHERE name = %(name)s AND expires_at > {at}"
            f"), mine AS ("
            f" SELECT arrival FROM {waiters} WHERE name = %(name)s AND owner = %(owner)s"
            f" AND expires_at > {at}"
            f"), ahead AS MATERIALIZED ("
            f" SELECT count(*) AS waiting FROM (SELECT FROM {waiters}"
            f" WHERE name = %(name)s AND owner <> %(owner)s AND expires_at > {at}"
            f" AND arrival < COALESCE((SELECT arrival FROM mine), 9223372036854775807)"
            f" LIMIT %(limit)s) AS places"
            # The decision, in the order the contract gives: a holder's other limit, no
            # slot free, fewer free slots than waiters ahead; else a slot for this owner.
            f"), verdict AS MATERIALIZED ("
            f" SELECT CASE WHEN held_limit <> %(limit)s THEN 'limit'"
            f" WHEN taken >= %(limit)s THEN 'full'"
            f" WHEN (SELECT waiting FROM ahead) >= %(limit)s - taken THEN 'queued'"
            f" ELSE 'granted' END AS outcome FROM state"
            f"), acquired AS ("
            f" INSERT INTO {slots} (name, token, owner, expires_at, slot_limit)"
            f" SELECT %(name)s, nextval('{tokens}'), %(owner)s, {sem_ttl}, %(limit)s"
            f" FROM verdict WHERE outcome = 'granted'"
            f" RETURNING token"
            # This name's expired slots, after the attempt (see `after`), skipping those
            # another statement has locked: the rows of one name stay about `limit`.
            f"), expired AS ("
            f" DELETE FROM {slots} WHERE (name, token) IN ("
            f" SELECT name, token FROM {slots} WHERE {after} AND name = %(name)s"
            f" AND expires_at <= {at} FOR UPDATE SKIP LOCKED)"
            f")"
        )
        # Fair (or a waiter past the starvation guard): as for locks, leave the queue if
        # granted, else join it or refresh the place (not when refused for its limit),
        # and purge this name's expired places.
        sem_fair = (
            f", left_queue AS ("
            f" DELETE FROM {waiters} WHERE name = %(name)s AND owner = %(owner)s"
            f" AND EXISTS (SELECT FROM acquired)"
            f"), joined AS ("
            f" INSERT INTO {waiters} AS q (name, owner, expires_at)"
            f" SELECT %(name)s, %(owner)s, {at} + %(queue_ttl)s * interval '1 second'"
            f" FROM verdict WHERE outcome IN ('full', 'queued')"
            f" ON CONFLICT (name, owner) DO UPDATE SET expires_at = excluded.expires_at,"
            f" arrival = CASE WHEN q.expires_at > {at} THEN q.arrival ELSE excluded.arrival END"
            f"), purged AS ("
            f" DELETE FROM {waiters} WHERE (name, owner) IN ("
            f" SELECT name, owner FROM {waiters} WHERE {after} AND name = %(name)s"
            f" AND owner <> %(owner)s AND expires_at <= {at} FOR UPDATE SKIP LOCKED)"
            f")"
        )
        # The outcome, the token, the holders' limit, and the seconds until the soonest
        # slot frees.
        sem_answer = (
            " SELECT outcome, (SELECT token FROM acquired), held_limit,"
            f" extract(epoch FROM soonest - {at})::float8 FROM verdict, state"
        )
        # Indexed by (fair, sweep); each runs right after `sem_take_turn`, in its
        # transaction.
        self.sem_acquire = {
            (False, False): sem_head + sem_answer,
            (False, True): sem_head + sweeps + sem_answer,
            (True, False): sem_head + sem_fair + sem_answer,
            (True, True): sem_head + sem_fair + sweeps + sem_answer,
        }
        slot_live = "name = %(name)s AND expires_at > clock_timestamp()"
        slot_mine = f"{slot_live} AND owner = %(owner)s"
        # Changed or not, and whether every slot is taken now (LOST) or not (EXPIRED);
        # the main query sees the rows as they were before the change, which matters
        # only when nothing changed.
        sem_verdict = (
            " SELECT (SELECT count(*) FROM changed),"
            f" COALESCE((SELECT count(*) >= min(slot_limit) FROM {slots} WHERE {slot_live}),"
            " false)"
        )
        self.sem_release = (
            f"WITH changed AS ("
            f" DELETE FROM {slots} WHERE {slot_mine}"
            f" RETURNING pg_notify(%(channel)s, %(name)s)"
            f")" + sem_verdict
        )
        # These two run in the semaphore's turn: see the module docstring.
        self.sem_close = (
            f"WITH changed AS ("
            f" UPDATE {slots} SET owner = NULL,"
            f" expires_at = clock_timestamp() + %(hold)s * interval '1 second'"
            f" WHERE {slot_mine} RETURNING token"
            f")" + sem_verdict
        )
        self.sem_extend = (
            f"WITH changed AS ("
            f" UPDATE {slots} SET expires_at = clock_timestamp() + %(ttl)s * interval '1 second'"
            f" WHERE {slot_mine} RETURNING token"
            f")" + sem_verdict
        )
        self.sem_inspect = (
            f"SELECT slot_limit, owner, token, extract(epoch FROM expires_at - now_)::float8"
            f" FROM {slots}, clock_timestamp() AS now_"
            f" WHERE name = %(name)s AND expires_at > now_ ORDER BY token"
        )
        self.sem_force_release = (
            f"WITH changed AS ("
            f" DELETE FROM {slots} WHERE {slot_live}"
            f" RETURNING pg_notify(%(channel)s, %(name)s)"
            f") SELECT count(*) FROM changed"
        )
        # A waiter behind the leaver may now be among those the free slots let in.
        self.sem_leave_queue = (
            f"WITH gone AS ("
            f" DELETE FROM {waiters} WHERE name = %(name)s AND owner = %(owner)s"
            f" RETURNING pg_notify(%(channel)s, %(name)s)"
            f") SELECT count(*) FROM gone"
        )

        # -- cache entries (module docstring, "Cache entries") --
        # Parameters: `key` is `cache_key(key)`, `gen_key` is `cache_key(gen_key)`.
        entry_live = "expires_at > clock_timestamp()"
        # The namespace's generation (0 when never bumped) and the key's live entry, if
        # any: always exactly one row.
        generation = (
            f"(SELECT COALESCE((SELECT generation FROM {generations}"
            f" WHERE key = %(gen_key)s), 0) AS generation) AS g"
        )
        read_one = (
            f" FROM {generation} LEFT JOIN {entries} AS e ON e.key = %(key)s AND e.{entry_live}"
        )
        due = entry_is_due("e.data", "g.generation", "%(due_before)s")
        # Every key's live entry (by its place in `keys`, those found) and the
        # generation: one row at least, the generation's, with no entry.
        self.cache_fetch = (
            f"SELECT k.ord, e.data, g.generation FROM {generation}"
            f" LEFT JOIN (unnest(%(keys)s::bytea[]) WITH ORDINALITY AS k(key, ord)"
            f" JOIN {entries} AS e ON e.key = k.key AND e.{entry_live}) ON true"
        )
        # A read with a claim, first statement: the read, whether it is due, and only if
        # so the claim's lock's turn (`gate`) and the flag the second statement reads.
        # Both last until the transaction ends, with the round trip.
        claim_flag = "current_setting('corral.claim', true) = 'due'"
        self.cache_claim_read = (
            f"WITH r AS MATERIALIZED (SELECT e.data, g.generation, {due} AS due{read_one})"
            " SELECT data, generation, due,"
            " CASE WHEN due THEN pg_advisory_xact_lock(%(gate)s)::text END,"
            " CASE WHEN due THEN set_config('corral.claim', 'due', true) END"
            " FROM r"
        )
        # Second statement: the lock's own attempt (`acquire`, without a queue place),
        # tried only when the first took the turn and the entry, read again at this
        # statement's snapshot, is still due; no row when the first found it not due.
        # The attempt's answer as `acquire` gives it: no lock row when a waiter is
        # queued ahead.
        claim = (
            f"WITH claim AS MATERIALIZED ("
            f"SELECT e.data, g.generation, {due} AS due{read_one} WHERE {claim_flag}"
            f"), {ahead}, {acquiring(' AND (SELECT due FROM claim)')}"
        )
        claim_answer = (
            " SELECT c.data, c.generation, c.due, a.granted, a.token, a.seconds"
            f" FROM claim AS c LEFT JOIN ({answer}) AS a(granted, token, seconds) ON c.due"
        )
        # Indexed by sweep; a claim that is not due sweeps nothing.
        self.cache_claim_attempt = {
            False: claim + claim_answer,
            True: claim + sweeping(f"{after} AND (SELECT due FROM claim)") + claim_answer,
        }
        # Store: the items sorted by key (module docstring: no deadlock), `keep <= 0`
        # written as an emptied, expired entry only where one was there; then, after the
        # writes, the sweep of up to `sweep` expired entries of other keys.
        self.cache_store = (
            f"WITH written AS ("
            f" INSERT INTO {entries} AS e (key, data, expires_at)"
            f" SELECT k.key, CASE WHEN k.keep > 0 THEN k.data ELSE ''::bytea END,"
            f" CASE WHEN k.keep > 0 THEN clock_timestamp() + k.keep * interval '1 second'"
            f" ELSE '-infinity' END"
            f" FROM unnest(%(keys)s::bytea[], %(datas)s::bytea[], %(keeps)s::float8[])"
            f" WITH ORDINALITY AS k(key, data, keep, ord)"
            f" WHERE k.keep > 0 OR EXISTS (SELECT FROM {entries} AS o WHERE o.key = k.key)"
            f" ORDER BY k.ord"
            f" ON CONFLICT (key) DO UPDATE SET data = excluded.data,"
            f" expires_at = excluded.expires_at"
            f" RETURNING 1"
            f"), doomed AS (SELECT ARRAY("
            f"SELECT ctid FROM {entries} WHERE (SELECT count(*) FROM written) >= 0"
            f" AND expires_at < now() AND key <> ALL (%(keys)s::bytea[])"
            f" ORDER BY expires_at LIMIT %(sweep)s FOR UPDATE SKIP LOCKED) AS ids"
            f"), swept AS ("
            f" DELETE FROM {entries} WHERE ctid = ANY ((SELECT ids FROM doomed)::tid[])"
            f" AND cardinality((SELECT ids FROM doomed)) > 0"
            f") SELECT count(*) FROM written"
        )
        # Whether a live entry was there; an expired one goes too.
        self.cache_delete = (
            f"WITH gone AS (DELETE FROM {entries} WHERE key = %(key)s"
            f" RETURNING {entry_live} AS live"
            f") SELECT COALESCE(bool_or(live), false) FROM gone"
        )
        # Invalidate with `keep > 0`: corral's bytes get fresh_until zeroed in place
        # (what `envelope.mark_stale` does), anything else is deleted, as memory does.
        ours = entry_is_ours("data")
        zero = (b"%017.6f" % 0.0).decode()
        self.cache_invalidate = (
            f"WITH stale AS ("
            f" UPDATE {entries} SET data = overlay(data placing '{zero}'::bytea"
            f" from {FRESH_AT.start + 1} for {FRESH_AT.stop - FRESH_AT.start}),"
            f" expires_at = clock_timestamp() + %(keep)s * interval '1 second'"
            f" WHERE key = %(key)s AND {entry_live} AND {ours} RETURNING 1"
            f"), gone AS ("
            f" DELETE FROM {entries} WHERE key = %(key)s AND {entry_live} AND NOT {ours}"
            f" RETURNING 1"
            f") SELECT EXISTS (SELECT FROM stale) OR EXISTS (SELECT FROM gone)"
        )
        self.cache_clear = (
            f"INSERT INTO {generations} AS g (key, generation) VALUES (%(gen_key)s, 1)"
            f" ON CONFLICT (key) DO UPDATE SET generation = g.generation + 1"
            f" RETURNING g.generation"
        )
        # Live entries in the key range of a prefix (`cache_key_range`); all of them
        # for the empty prefix.
        self.cache_count = (
            f"SELECT count(*) FROM {entries} WHERE key >= %(low)s AND key < %(high)s"
            f" AND {entry_live}"
        )
        self.cache_count_all = f"SELECT count(*) FROM {entries} WHERE {entry_live}"

    def gate_key(self, key: str) -> int:
        """The advisory lock key that serialises acquisitions of `key` in these tables."""
        digest = hashlib.blake2b(self._gate_salt + key.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def sem_gate(self, key: str) -> dict[str, int]:
        """The two-int advisory lock key (`high`, `low`) of semaphore `key`'s turn."""
        digest = hashlib.blake2b(self._sem_gate_salt + key.encode(), digest_size=8).digest()
        return {
            "high": int.from_bytes(digest[:4], "big", signed=True),
            "low": int.from_bytes(digest[4:], "big", signed=True),
        }


def migration_sql(
    schema: str = DEFAULT_SCHEMA,
    table_prefix: str = DEFAULT_TABLE_PREFIX,
    *,
    grant_to: str | None = None,
) -> str:
    """The DDL that creates corral's tables, to run ahead of time (idempotent).

    Run it as a role allowed to create tables; with `grant_to`, it also grants
    that role what corral needs (DML on its tables, for locks, semaphores and cache
    entries, USAGE on the sequences). corral then finds the tables and sends no DDL itself, so the
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
        sem_arrival = (
            f"{quote_ident(schema)}.{quote_ident(table_prefix + 'sem_waiters_arrival_seq')}"
        )
        parts += [
            f"GRANT USAGE ON SCHEMA {quote_ident(schema)} TO {role}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {statements.locks}, {statements.queue},"
            f" {statements.slots}, {statements.waiters}, {statements.entries},"
            f" {statements.generations} TO {role}",
            f"GRANT USAGE ON SEQUENCE {statements.tokens}, {arrival}, {sem_arrival} TO {role}",
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
