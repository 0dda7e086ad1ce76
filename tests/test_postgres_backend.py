"""What only the PostgreSQL backend promises: its schema, its pool, its wake-ups, its faults.

The contract suite already runs every lock behaviour (and every cache
primitive) on PostgreSQL; these tests look at the server itself (tables, keys,
sessions, transactions, roles, TLS, the claim rule in SQL, what one round trip
holds) and at the faults only a database has (a restart keeps the locks, a
killed LISTEN session, a whole server frozen, a statement that stalls after
drawing its token, Ctrl-C while a statement is in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import queue
import random
import re
import secrets
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import corral
import corral.aio
from corral._sync import lock as sync_lock
from corral._sync.backends.base import Backend
from corral._sync.backends.postgres import PostgresBackend, PostgresWaiter, ReleaseFeed
from corral._sync.store import Store
from corral.backends.postgres_sql import (
    CACHE_READABLE_BYTES,
    MAX_KEY_BYTES,
    READABLE_CHARS,
    SWEEP_EVERY,
    Statements,
    cache_key,
    cache_key_range,
    entry_is_due,
    entry_is_ours,
    lock_key,
    migration_sql,
    parse_url,
)
from corral.core import lockflow
from corral.core.envelope import (
    FRESH_AT,
    RETRY_AT,
    claim_due,
    decode_header,
    encode,
    header_bytes,
    make_codec,
)
from corral.core.primitives import Attempt, Claim, Outcome
from corral.errors import BackendError, BackendUnavailable, ConfigError
from corral.testing import servers
from tests.conftest import start_server

pytestmark = pytest.mark.backend("postgres")


def fresh(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}_"


def query(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def with_query(url: str, extra: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def rows_of(url: str, store: Any) -> list[tuple[Any, ...]]:
    """Every (key, owner) row of the store's lock table, and every (key, owner) place."""
    statements = store.backend._sql
    return query(url, f"SELECT name, owner FROM {statements.locks} ORDER BY name") + query(
        url, f"SELECT name, owner FROM {statements.queue} ORDER BY name"
    )


def everything_shown(exc: BaseException) -> str:
    """What a user could see of `exc`: its traceback with every chained exception."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + repr(exc)


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.02)


# -- the schema ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["prefix", "schema"])
def test_tables_are_created_once_under_concurrent_first_use(backend_url: str, where: str) -> None:
    options = {"table_prefix": fresh()} if where == "prefix" else {"schema": fresh("s")[:-1]}
    stores = [corral.connect(backend_url, **options) for _ in range(8)]
    start = threading.Barrier(len(stores))
    errors: list[BaseException] = []
    tokens: list[int] = []

    def first_use(index: int, store: corral.Store) -> None:
        try:
            start.wait()
            lock = store.lock(f"first-{index}", ttl=10)
            assert lock.acquire()
            assert lock.token is not None
            tokens.append(lock.token)
            lock.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=first_use, args=(i, store)) for i, store in enumerate(stores)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for store in stores:
        store.close()
    assert errors == []
    assert len(set(tokens)) == len(stores)


def test_migration_sql_lets_a_role_without_ddl_rights_use_locks(backend_url: str) -> None:
    role = f"limited_{uuid.uuid4().hex[:8]}"
    prefix = fresh()
    query(backend_url, f'CREATE ROLE "{role}" LOGIN')
    query(backend_url, migration_sql(table_prefix=prefix, grant_to=role))
    as_role = backend_url.replace("://corral@", f"://{role}@")
    # The role may not create tables in public (PostgreSQL 15 and later), only use them.
    with corral.connect(as_role, table_prefix=prefix) as store:
        lock = store.lock("report", ttl=10, fair=True)
        assert lock.acquire()
        assert not store.lock("report", ttl=10, fair=True).acquire(wait=0.1)
        lock.release()
    with (
        corral.connect(as_role, table_prefix=fresh()) as store,
        pytest.raises(BackendError, match="migration_sql"),
    ):
        store.lock("report", ttl=10).acquire()


def test_migration_sql_is_idempotent_and_checks_identifiers(backend_url: str) -> None:
    prefix = fresh()
    query(backend_url, migration_sql(table_prefix=prefix))
    query(backend_url, migration_sql(table_prefix=prefix))
    with corral.connect(backend_url, table_prefix=prefix) as store:
        lock = store.lock("x", ttl=5)
        assert lock.acquire()
        lock.release()
    for bad in ("x; DROP TABLE y", "1abc", "", "a" * 41):
        with pytest.raises(ConfigError):
            migration_sql(table_prefix=bad)


# -- sessions, transactions, the pool -------------------------------------------------


def test_a_held_lock_keeps_no_transaction_or_session_lock_open(backend_url: str, name: str) -> None:
    app = f"corral-{uuid.uuid4().hex[:8]}"
    with corral.connect(with_query(backend_url, f"application_name={app}")) as store:
        lock = store.lock(name, ttl=30)
        assert lock.acquire()
        waiter = store.lock(name, ttl=30)
        assert not waiter.acquire(wait=0.3)  # opens the LISTEN session too
        sessions = query(
            backend_url,
            "SELECT pid, state, backend_xid FROM pg_stat_activity WHERE application_name = %s",
            [app],
        )
        assert sessions, "no session of the store found"
        for _, state, xid in sessions:
            assert state == "idle" and xid is None, sessions
        held = query(
            backend_url,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY(%s)",
            [[pid for pid, _, _ in sessions]],
        )
        assert held == [(0,)]
        lock.release()


async def test_many_tasks_share_a_small_pool(backend_url: str, name: str) -> None:
    app = f"corral-{uuid.uuid4().hex[:8]}"
    url = with_query(backend_url, f"application_name={app}")
    peak = 0

    async def cycles(index: int) -> None:
        nonlocal peak
        lock = store.lock(f"{name}-{index % 5}", ttl=10)
        for _ in range(5):
            assert await lock.acquire(wait=30)
            rows = await asyncio.to_thread(
                query,
                backend_url,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [app],
            )
            peak = max(peak, rows[0][0])
            await lock.release()

    async with corral.aio.connect(url, max_connections=2) as store:
        await asyncio.gather(*(cycles(i) for i in range(20)))
    # Two pooled connections and the one LISTEN connection, however many tasks.
    assert 1 <= peak <= 3


def test_url_options_credentials_and_server() -> None:
    options = parse_url(
        "postgresql://app:s3cret@db.example:6543/locks?sslmode=require&timeout=2"
        "&table_prefix=x_&schema=coord&pool_size=4",
        {},
    )
    assert options.server == "postgresql://app@db.example:6543/locks"
    assert (options.timeout, options.schema, options.table_prefix) == (2.0, "coord", "x_")
    assert options.max_connections == 4
    assert "sslmode=require" in options.conninfo and "s3cret" in options.conninfo
    assert "s3cret" not in repr(options)
    multi = parse_url("postgres://h1:5432,h2:5433/db?target_session_attrs=read-write", {})
    assert multi.server == "postgres://h1:5432,h2:5433/db"
    # Keys are sent as UTF-8 whatever the URL says (they may hold any character).
    assert (
        conninfo_to_dict(parse_url("postgresql://h/db?client_encoding=LATIN1", {}).conninfo)[
            "client_encoding"
        ]
        == "UTF8"
    )
    with pytest.raises(ConfigError, match="colour"):
        corral.connect("postgresql://u:s3cret@h/db", colour="blue")
    with pytest.raises(ConfigError, match="not both"):
        corral.connect("postgresql://h/db", max_connections=2, pool_size=3)
    with pytest.raises(ConfigError) as caught:
        corral.connect("postgresql://u:s3cret@h/db?bogus=1")
    assert "s3cret" not in str(caught.value)
    for bad in ({"timeout": 0}, {"schema": "a-b"}, {"max_connections": 0}):
        with pytest.raises(ConfigError):
            corral.connect("postgresql://h/db", **bad)


def test_errors_name_the_server_and_never_the_password() -> None:
    url = "postgresql://app:s3cret@127.0.0.1:1/db"
    with corral.connect(url, timeout=1) as store:
        assert "s3cret" not in repr(store) and "s3cret" not in store.server
        began = time.monotonic()
        with pytest.raises(BackendUnavailable) as caught:
            store.lock("report", ttl=5).acquire()
        assert time.monotonic() - began < 5
    message = str(caught.value)
    assert "127.0.0.1:1" in message and "report" in message and "s3cret" not in message


def test_passwords_reach_libpq_and_nothing_else() -> None:
    """The password is taken out of the URL before libpq reads it (so no libpq message can
    quote it), decoded as libpq would, and given to libpq apart; the query's wins."""
    cases = {
        "postgresql://app:p%40ss%2Fw%3Ard%25@h/db": "p@ss/w:rd%",
        "postgresql://app:first@h/db?password=second": "second",
        "postgresql://app@h/db?password=s3cret&sslmode=require": "s3cret",
        "postgresql://app:pa%3Fss%23w%2Frd@h/db": "pa?ss#w/rd",
    }
    for url, password in cases.items():
        options = parse_url(url, {})
        assert conninfo_to_dict(options.conninfo)["password"] == password
        assert password not in repr(options) and password not in options.server
    secret = parse_url("postgresql://h/db?sslpassword=k3yPW&sslmode=require", {})
    assert conninfo_to_dict(secret.conninfo)["sslpassword"] == "k3yPW"
    for bad, why in [
        ("postgresql://app:p@ss@h/db", "%40"),  # which @ ends the password is a guess
        ("postgresql://app:s3cret%zz@h/db", "%25"),
        ("postgresql://app:s3cret%00@h/db", "%00"),
        ("postgresql://app:s3cret@[::1/db", "valid"),
        ("postgresql://h/db?sslpassword=s3cret&bogus=1", "bogus"),
    ]:
        with pytest.raises(ConfigError, match=why) as caught:
            parse_url(bad, {})
        assert "s3cret" not in str(caught.value) and "ss@" not in str(caught.value)


@pytest.mark.parametrize(
    "password", ["Sec1/Ret2", "Sec1?Ret2", "Sec1#Ret2", "aGVsbG8/d29ybGQ+Zm9v", "Sec1/Ret2?Mid3"]
)
@pytest.mark.parametrize("query", ["", "?sslmode=disable"])
def test_a_password_with_an_unencoded_slash_question_mark_or_hash_is_refused(
    password: str, query: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Reproduces a leak: with an unencoded '/' (base64 passwords have them), libpq read
    the password's head as host and port and its tail as the database, and every message
    and repr showed them. Such a URL is refused, quoting no part of the password, and its
    percent-encoded form works."""
    caplog.set_level(logging.DEBUG)
    pieces = re.split(r"[/?#]", password)
    url = f"postgresql://app:{password}@127.0.0.1:9/db{query}"
    for connect in (lambda: corral.connect(url, timeout=1), lambda: parse_url(url, {})):
        with pytest.raises(ConfigError, match="percent-encode") as caught:
            connect()
        shown = everything_shown(caught.value) + caplog.text
        assert not [piece for piece in pieces if piece in shown], shown
    encoded = parse_url(f"postgresql://app:{quote(password, safe='')}@127.0.0.1:9/db{query}", {})
    assert conninfo_to_dict(encoded.conninfo)["password"] == password
    assert encoded.server == "postgresql://app@127.0.0.1:9/db"
    assert not [piece for piece in pieces if piece in repr(encoded) + caplog.text]


def test_libpq_parameters_pass_and_unknown_ones_are_named() -> None:
    options = parse_url("postgresql://h/db?sslmode=verify-full&sslrootcert=/ca.pem", {})
    params = conninfo_to_dict(options.conninfo)
    assert (params["sslmode"], params["sslrootcert"]) == ("verify-full", "/ca.pem")
    with pytest.raises(ConfigError) as caught:
        corral.connect("postgresql://h/db?sslmod=require")
    message = str(caught.value)
    for named in ("sslmod", "timeout", "schema", "table_prefix", "max_connections", "libpq"):
        assert named in message


# -- names ------------------------------------------------------------------------------


def test_lock_key_keeps_plain_names_and_hashes_the_rest() -> None:
    for plain in ("report", "init-user:42", "é€😀", "x" * 1024, "é" * 512):
        assert lock_key(plain) == plain
    for odd in ("x" * 1025, "é" * 513, "nul\x00byte", "lone \ud800", secrets.token_hex(1600)):
        key = lock_key(odd)
        digest = hashlib.sha256(odd.encode("utf-8", "surrogatepass")).hexdigest()
        assert key == lock_key(odd) and key.endswith("#sha256:" + digest)
        assert key.startswith(odd[:READABLE_CHARS].replace("\x00", "?").replace("\ud800", "?"))
        assert "\x00" not in key and len(key.encode()) < 400
        # A name spelled like a hashed key is hashed itself: the two forms never meet.
        assert lock_key(key) != key
    # A database that stores only ASCII gets ASCII keys.
    assert lock_key("plain", ascii_only=True) == "plain"
    assert lock_key("é€😀", ascii_only=True).isascii()


@pytest.mark.parametrize(
    "odd", [secrets.token_hex(1600), "nul\x00byte", "x" * 5000], ids=["random", "nul", "long"]
)
def test_names_postgres_cannot_store_as_given_are_locks_too(
    backend_url: str, name: str, odd: str
) -> None:
    """Reproduces a failure: a 3.2 kB name that does not compress overflowed btree's row
    limit, and NUL is not text to PostgreSQL."""
    lock_name = name + odd
    with corral.connect(backend_url) as store, corral.connect(backend_url) as other:
        lock = store.lock(lock_name, ttl=10)
        assert lock.acquire()
        info = other.lock_info(lock_name)
        assert info is not None and (info.name, info.owner) == (lock_name, lock.owner)
        assert not other.lock(lock_name, ttl=10).acquire()
        # Operators see which lock a row is.
        key = lock_key(lock_name)
        assert [row for row in rows_of(backend_url, store) if row[0] == key] == [(key, lock.owner)]
        assert key.startswith(name)
        # The stored key used as a name is another lock.
        twin = other.lock(key, ttl=10)
        assert twin.acquire()
        twin.release()
        assert other.force_release(lock_name)
        assert store.lock_info(lock_name) is None
        assert not [row for row in rows_of(backend_url, store) if row[0] == key]


@pytest.mark.parametrize("odd", ["nul\x00byte", secrets.token_hex(1600)], ids=["nul", "long"])
def test_a_fair_queue_on_a_hashed_name(backend_url: str, name: str, odd: str) -> None:
    lock_name = name + odd
    with corral.connect(backend_url) as store, corral.connect(backend_url) as other:
        holder = store.lock(lock_name, ttl=30, fair=True)
        assert holder.acquire()
        got: list[bool] = []
        thread = threading.Thread(
            target=lambda: got.append(other.lock(lock_name, ttl=30, fair=True).acquire(wait=20))
        )
        thread.start()
        key = lock_key(lock_name)
        queue = store.backend._sql.queue
        wait_until(
            lambda: (
                query(backend_url, f"SELECT count(*) FROM {queue} WHERE name = %s", [key]) == [(1,)]
            )
        )
        holder.release()
        # The queued waiter, not a newcomer, gets the free lock.
        assert not store.lock(lock_name, ttl=30).acquire(wait=0)
        thread.join(30)
        assert got == [True]
        assert other.force_release(lock_name)


def test_a_database_that_cannot_store_every_character(backend_url: str, name: str) -> None:
    """In a LATIN1 database, names are stored as ASCII keys, and still work."""
    database = f"latin_{uuid.uuid4().hex[:8]}"
    query(
        backend_url,
        f"CREATE DATABASE {database} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'"
        " TEMPLATE template0",
    )
    url = backend_url.rsplit("/", 1)[0] + "/" + database
    try:
        with corral.connect(url) as store, corral.connect(url) as other:
            for lock_name in (f"{name}-é€😀", f"{name}-plain"):
                lock = store.lock(lock_name, ttl=10)
                assert lock.acquire()
                info = other.lock_info(lock_name)
                assert info is not None and info.owner == lock.owner
                woke: list[bool] = []
                thread = threading.Thread(
                    target=lambda n=lock_name, woke=woke: woke.append(
                        other.lock(n, ttl=10).acquire(wait=20)
                    )
                )
                thread.start()
                time.sleep(0.3)
                lock.release()
                thread.join(30)
                assert woke == [True]
                assert other.force_release(lock_name)
            keys = [row[0] for row in rows_of(url, store)]
            assert all(key.isascii() for key in keys)
    finally:
        query(backend_url, f"DROP DATABASE {database} WITH (FORCE)")


# -- the name's turn and the queue -------------------------------------------------------


def waiting_for_turn(url: str, app: str) -> int:
    """How many of the store's statements wait for a name's turn (its advisory lock)."""
    rows = query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        " AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        [app],
    )
    return int(rows[0][0])


class _WithoutPipelines(PostgresBackend):
    """As with a libpq older than 14, which cannot pipeline: BEGIN and COMMIT instead."""

    _pipelines = False


def store_for(url: str, pipelines: bool) -> Store:
    backend = PostgresBackend if pipelines else _WithoutPipelines
    return Store(backend(parse_url(url, {})))


@pytest.mark.parametrize("pipelines", [True, False], ids=["pipelined", "begin-commit"])
def test_an_attempt_that_waited_for_its_turn_respects_the_place_queued_meanwhile(
    backend_url: str, name: str, pipelines: bool
) -> None:
    """Reproduces a barge: an attempt that waited for the name's turn judged the queue by
    what was committed when it was sent, so a place queued while it waited did not count,
    and it took the free lock past that live waiter. The waiter's fair attempt is held,
    by hand, where its own statement is when that happens: it has the name's turn, found
    the holder live and queued its place, and commits once the holder has released."""
    app = f"corral-{uuid.uuid4().hex[:8]}"
    with store_for(with_query(backend_url, f"application_name={app}"), pipelines) as store:
        backend = store.backend
        statements = backend._sql
        key = lock_key(name)
        assert backend.try_acquire(name, "holder", 60).acquired
        attempts: list[Attempt] = []
        with psycopg.connect(backend_url) as waiter:  # one transaction, committed below
            waiter.execute("SELECT pg_advisory_xact_lock(%s)", [statements.gate_key(key)])
            waiter.execute(
                f"INSERT INTO {statements.queue} (name, owner, expires_at)"
                " VALUES (%s, 'waiter', clock_timestamp() + interval '60 seconds')",
                [key],
            )
            newcomer = threading.Thread(
                target=lambda: attempts.append(backend.try_acquire(name, "newcomer", 60))
            )
            newcomer.start()
            try:
                wait_until(lambda: waiting_for_turn(backend_url, app) == 1)
                assert backend.release(name, "holder") is Outcome.OK
            finally:
                waiter.commit()
                newcomer.join(30)
        # Free, but a live waiter queues for it: refused, with no holder to wait for.
        assert attempts == [Attempt(False)]
        assert store.lock_info(name) is None
        assert backend.try_acquire(name, "newcomer", 60) == Attempt(False)
        assert backend.try_acquire(name, "waiter", 60, queue_ttl=60).acquired
        assert rows_of(backend_url, store).count((key, "waiter")) == 1
        assert backend.release(name, "waiter") is Outcome.OK


@pytest.mark.parametrize("pipelines", [True, False], ids=["pipelined", "begin-commit"])
def test_an_attempt_that_waited_behind_the_winner_reports_the_winners_ttl(
    backend_url: str, name: str, pipelines: bool
) -> None:
    """Reproduces a failure: an attempt that waited for the name's turn behind the
    acquisition that took the lock did not see the new holder, and answered "free, but
    someone queues ahead" instead of the holder's seconds left, so `fail_fast` could not
    give up. The winning acquisition is held, by hand, just before its commit."""
    app = f"corral-{uuid.uuid4().hex[:8]}"
    with store_for(with_query(backend_url, f"application_name={app}"), pipelines) as store:
        backend = store.backend
        statements = backend._sql
        key = lock_key(name)
        assert store.lock_info(name) is None  # the tables exist
        attempts: list[Attempt] = []
        with psycopg.connect(backend_url) as winner:
            winner.execute("SELECT pg_advisory_xact_lock(%s)", [statements.gate_key(key)])
            winner.execute(
                f"INSERT INTO {statements.locks} (name, owner, token, expires_at)"
                f" VALUES (%s, 'winner', nextval('{statements.tokens}'),"
                " clock_timestamp() + interval '60 seconds')",
                [key],
            )
            loser = threading.Thread(
                target=lambda: attempts.append(backend.try_acquire(name, "loser", 30))
            )
            loser.start()
            try:
                wait_until(lambda: waiting_for_turn(backend_url, app) == 1)
            finally:
                winner.commit()
                loser.join(30)
        [attempt] = attempts
        assert not attempt.acquired
        assert attempt.holder_ttl is not None and 30 < attempt.holder_ttl <= 60, attempt
        assert store.force_release(name)


def test_a_waiter_whose_place_expired_queues_again_at_the_back(backend_url: str, name: str) -> None:
    """Reproduces a failure: a waiter paused past its queue TTL came back with its old
    arrival number, ahead of the waiters who queued after it, and took the lock first."""
    with corral.connect(backend_url) as store:
        backend = store.backend
        queue = backend._sql.queue
        key = lock_key(name)

        def arrival(owner: str) -> int:
            rows = query(
                backend_url,
                f"SELECT arrival FROM {queue} WHERE name = %s AND owner = %s",
                [key, owner],
            )
            return int(rows[0][0])

        assert backend.try_acquire(name, "holder", 60).acquired
        assert not backend.try_acquire(name, "paused", 60, queue_ttl=60).acquired
        assert not backend.try_acquire(name, "later", 60, queue_ttl=60).acquired
        assert arrival("paused") < arrival("later")
        # The paused waiter did not refresh its place: it ran out, as after its queue TTL.
        query(
            backend_url,
            f"UPDATE {queue} SET expires_at = clock_timestamp() - interval '1 second'"
            " WHERE name = %s AND owner = 'paused'",
            [key],
        )
        assert backend.release(name, "holder") is Outcome.OK
        # Back, it queues behind the waiter who kept its place, in every kind of attempt.
        assert backend.try_acquire(name, "paused", 60) == Attempt(False)
        assert backend.try_acquire(name, "paused", 60, queue_ttl=60) == Attempt(False)
        assert arrival("paused") > arrival("later")
        assert backend.try_acquire(name, "later", 60, queue_ttl=60).acquired
        assert backend.release(name, "later") is Outcome.OK
        assert backend.try_acquire(name, "paused", 60, queue_ttl=60).acquired
        assert backend.release(name, "paused") is Outcome.OK
        assert [row for row in rows_of(backend_url, store) if row[0] == key] == []


# -- fencing tokens and what stays on the server -----------------------------------------


def test_tokens_follow_the_grant_order_when_an_acquisition_stalls(backend_url: str) -> None:
    """A statement that stalls after drawing its token must not insert its row after a
    newer holder came and went: each name's acquisitions take turns (module docstring of
    postgres_sql, "Fencing tokens"). The stall is real: a trigger sleeps in the server."""
    prefix = fresh()
    with corral.connect(backend_url, table_prefix=prefix) as store:
        assert store.lock_info("setup") is None  # creates the tables
        locks = store.backend._sql.locks
        query(
            backend_url,
            f"CREATE FUNCTION {prefix}stall() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.owner = 'staller' THEN PERFORM pg_sleep(1); END IF;"
            " RETURN NEW; END $$",
        )
        query(
            backend_url,
            f"CREATE TRIGGER stall BEFORE INSERT ON {locks}"
            f" FOR EACH ROW EXECUTE FUNCTION {prefix}stall()",
        )
        backend = store.backend
        granted: list[tuple[str, int]] = []

        def staller() -> None:
            attempt = backend.try_acquire("x", "staller", 30)
            assert attempt.acquired and attempt.token is not None
            granted.append(("staller", attempt.token))
            backend.release("x", "staller")

        thread = threading.Thread(target=staller)
        thread.start()
        time.sleep(0.3)  # the staller sleeps in its trigger, its token drawn
        deadline = time.monotonic() + 20
        attempt = Attempt(False)
        while not attempt.acquired and time.monotonic() < deadline:
            attempt = backend.try_acquire("x", "newcomer", 30)
            time.sleep(0.01)
        assert attempt.acquired and attempt.token is not None
        granted.append(("newcomer", attempt.token))
        backend.release("x", "newcomer")  # come and gone, maybe before the staller woke
        thread.join(30)
        # Both were granted, and tokens increase in the order they were.
        assert sorted(who for who, _ in granted) == ["newcomer", "staller"]
        tokens = [token for _, token in granted]
        assert tokens == sorted(tokens), granted


def test_expired_rows_and_places_are_swept_by_later_acquisitions(backend_url: str) -> None:
    with corral.connect(backend_url, table_prefix=fresh()) as store:
        backend = store.backend
        crashed = backend.try_acquire("crashed", "o1", 0.3)  # never released
        assert crashed.acquired and crashed.token is not None
        assert backend.try_acquire("closed", "o2", 30).acquired
        backend.release("closed", "o2", hold_for=0.3)
        assert backend.try_acquire("held", "o3", 30).acquired
        assert backend.try_acquire("kept", "o4", 30).acquired
        backend.release("kept", "o4", hold_for=30)
        assert not backend.try_acquire("held", "dead-waiter", 30, queue_ttl=0.3).acquired
        assert backend.try_acquire("released", "o5", 30).acquired
        backend.release("released", "o5")
        # A release deletes its row at once.
        assert ("released", None) not in rows_of(backend_url, store)
        assert ("released", "o5") not in rows_of(backend_url, store)
        time.sleep(0.6)
        for index in range(SWEEP_EVERY):
            assert backend.try_acquire(f"other-{index}", "o6", 30).acquired
            backend.release(f"other-{index}", "o6")
        # What is live stays; what expired is gone, with no purge command.
        assert rows_of(backend_url, store) == [("held", "o3"), ("kept", None)]
        again = backend.try_acquire("crashed", "o7", 30)
        assert again.acquired and again.token is not None and again.token > crashed.token


def test_sweeping_acquisitions_never_deadlock(backend_url: str) -> None:
    """Many stores acquiring, releasing, closing and abandoning a few names at once, with
    sweeps locking each other's expired rows: no deadlock, no error, no stuck row."""
    prefix = fresh()
    names = [f"n{i}" for i in range(12)]
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def worker(seed: int) -> None:
        with corral.connect(backend_url, table_prefix=prefix, timeout=10) as store:
            backend = store.backend
            try:
                start.wait()
                for index in range(150):
                    lock_name = names[(seed * 7 + index) % len(names)]
                    owner = f"w{seed}-{index}"
                    fair = 0.2 if index % 4 == 0 else None
                    if backend.try_acquire(lock_name, owner, 0.05, queue_ttl=fair).acquired:
                        if index % 3 == 0:
                            backend.release(lock_name, owner)
                        elif index % 3 == 1:
                            backend.release(lock_name, owner, hold_for=0.02)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    time.sleep(0.3)
    with corral.connect(backend_url, table_prefix=prefix) as store:
        # What is left (abandoned rows, dead waiters' places) drains as acquisitions go on.
        left = [len(rows_of(backend_url, store))]
        for index in range(20 * SWEEP_EVERY):
            assert store.lock(f"after-{index}", ttl=30).acquire()
            store.force_release(f"after-{index}")
            if index % SWEEP_EVERY == 0:
                left.append(len(rows_of(backend_url, store)))
        assert left[-1] == 0, left


# -- wake-ups -------------------------------------------------------------------------


@pytest.mark.parametrize("length", [20, 20_000])
def test_a_release_elsewhere_wakes_the_waiter_at_once(
    backend_url: str, length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No timer of the waiter fires before the test gives up on it (re-check, starvation
    # guard; the holder's TTL and the wait are longer): only the NOTIFY can wake it.
    monkeypatch.setattr(lockflow, "NOTIFIED_RECHECK", 120.0)
    monkeypatch.setattr(sync_lock, "STARVE_AFTER", 120.0)
    name = (uuid.uuid4().hex * (length // 32 + 1))[:length]
    with corral.connect(backend_url) as holder_store, corral.connect(backend_url) as waiter_store:
        for free in ("release", "force_release"):
            holder = holder_store.lock(name, ttl=120)
            assert holder.acquire()
            woke: list[float] = []

            def wait(store: corral.Store = waiter_store, woke: list[float] = woke) -> None:
                lock = store.lock(name, ttl=30)
                assert lock.acquire(wait=120)
                woke.append(time.monotonic())
                lock.release()

            # Daemon: a waiter never woken fails the test, and does not hold up the run.
            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            time.sleep(0.3)
            if free == "release":
                holder.release()
            else:
                assert holder_store.force_release(name)
            thread.join(30)
            # Its wait (120 s) outlasts the join: its last attempt at the wait's end
            # cannot pass the test, only the NOTIFY can.
            assert woke, free


@pytest.mark.parametrize("odd", ["nul\x00byte", "é" * 600], ids=["nul", "long"])
def test_releases_of_a_hashed_name_notify_its_key(backend_url: str, name: str, odd: str) -> None:
    """Every notification about a lock carries the key its waiters listen for."""
    lock_name = name + odd
    key = lock_key(lock_name)
    assert key != lock_name
    with (
        corral.connect(backend_url) as store,
        psycopg.connect(backend_url, autocommit=True) as ear,
    ):
        ear.execute(f'LISTEN "{store.backend._sql.channel}"')
        backend = store.backend

        def heard() -> list[str]:
            return [note.payload for note in ear.notifies(timeout=10, stop_after=1)]

        assert backend.try_acquire(lock_name, "a", 30).acquired
        assert backend.release(lock_name, "a") is Outcome.OK
        assert heard() == [key]
        assert backend.try_acquire(lock_name, "b", 30).acquired
        assert backend.force_release(lock_name)
        assert heard() == [key]
        assert backend.try_acquire(lock_name, "c", 30).acquired
        assert not backend.try_acquire(lock_name, "d", 30, queue_ttl=10).acquired
        backend.leave_queue(lock_name, "d")  # the head left: the next may go
        assert heard() == [key]
        assert backend.release(lock_name, "c") is Outcome.OK
        assert heard() == [key]


def test_a_killed_listen_session_is_replaced(
    backend_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No timer of the waiter fires within its 30 s wait (re-check, starvation guard; the
    # holder's TTL is longer): only a NOTIFY heard on the new session can wake it before
    # the last attempt its wait ends with.
    monkeypatch.setattr(lockflow, "NOTIFIED_RECHECK", 120.0)
    monkeypatch.setattr(sync_lock, "STARVE_AFTER", 120.0)
    waits: list[ReleaseFeed | None] = []  # the feed each wait of a waiter began with
    wait = PostgresWaiter.wait

    def recorded_wait(self: PostgresWaiter, timeout: float) -> bool:
        waits.append(self._feed)
        return wait(self, timeout)

    monkeypatch.setattr(PostgresWaiter, "wait", recorded_wait)
    app = f"corral-{uuid.uuid4().hex[:8]}"
    url = with_query(backend_url, f"application_name={app}")

    def listening() -> set[int]:
        """The store's LISTEN sessions, once their LISTEN is in force."""
        rows = query(
            backend_url,
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            " AND query LIKE 'LISTEN%%' AND state = 'idle'",
            [app],
        )
        return {pid for (pid,) in rows}

    with corral.connect(backend_url) as holder_store, corral.connect(url) as waiter_store:
        for _ in range(2):
            holder = holder_store.lock(name, ttl=60)
            assert holder.acquire()
            result: list[bool] = []
            thread = threading.Thread(
                target=lambda result=result: result.append(
                    waiter_store.lock(name, ttl=30).acquire(wait=30)
                )
            )
            thread.start()
            wait_until(listening)  # the waiter LISTENs (the first time, it opens the session)
            [pid] = listening()
            dead = waiter_store.backend._proc.feed
            killed = query(backend_url, "SELECT pg_terminate_backend(%s)", [pid])
            assert killed == [(True,)]
            wait_until(lambda pid=pid: listening() - {pid})  # a new session LISTENs
            # The waiter woke, tried again and waits once more, now on the new session: a
            # release it does not see as it tries must reach it as a NOTIFY.
            wait_until(
                lambda dead=dead: bool(waits) and waits[-1] not in (None, dead) and waits[-1].usable
            )
            freed_at = time.monotonic()
            holder.release()
            thread.join(60)
            assert result == [True]
            assert time.monotonic() - freed_at < 10  # long before its wait would have ended
            assert waiter_store.force_release(name)


# -- fork ---------------------------------------------------------------------------------


def test_a_forked_child_opens_its_own_connections(backend_url: str, name: str) -> None:
    with corral.connect(backend_url) as store:
        lock = store.lock(name, ttl=10)
        assert lock.acquire()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                other = store.lock(f"{name}-child", ttl=10)
                if not other.acquire() or store.lock(name, ttl=10).acquire():
                    code = 3
                other.release()
                store.close()  # closes the child's own pool only
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's connections were neither used nor closed by the child.
        assert lock.owned()
        lock.release()
        assert store.lock_info(name) is None


# -- a server of our own: restart and freeze ---------------------------------------------


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server = start_server("postgres", tmp_path_factory.mktemp("own-postgres"))
    yield server
    server.stop()


def freeze(server: Any, sig: signal.Signals) -> None:
    """SIGSTOP/SIGCONT the postmaster and every backend: each backend is its own
    process group, so signalling the postmaster's group does not reach them."""
    pids = [server.pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == server.pid:
                pids.append(int(entry))
    for pid in pids:
        # A backend may end between the listing and the signal (the session of a
        # connection the watchdog cut ends once the server runs again).
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_a_restart_keeps_locks_their_expiry_and_tokens(own_server: Any, name: str) -> None:
    with corral.connect(own_server.url, timeout=2) as store:
        lock = store.lock(name, ttl=60)
        assert lock.acquire()
        before = store.lock_info(name)
        own_server.restart()
        # The pool's connections died with the server; the next call uses new ones.
        after = store.lock_info(name)
        assert before is not None and after is not None
        assert (after.owner, after.token) == (before.owner, before.token)
        assert after.ttl < before.ttl
        lock.extend()
        lock.release()
        again = store.lock(name, ttl=5)
        assert again.acquire()
        assert again.token is not None and lock.token is None
        assert again.token > before.token
        again.release()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_frozen_server_fails_calls_within_the_timeout(
    own_server: Any, name: str, flavour: str
) -> None:
    timeout = 1.0
    where = own_server.url.split("@")[1].split("/")[0]

    def check(error: BaseException | None, elapsed: float) -> None:
        assert isinstance(error, BackendUnavailable), error
        assert "did not answer" in str(error) and where in str(error)
        assert elapsed < 4.5  # room for a pause, short of the 5 s default timeout

    if flavour == "sync":
        with corral.connect(own_server.url, timeout=timeout) as store:
            lock = store.lock(name, ttl=30)
            assert lock.acquire()
            freeze(own_server, signal.SIGSTOP)
            began = time.monotonic()
            try:
                with pytest.raises(BackendUnavailable) as caught:
                    lock.extend()
                elapsed = time.monotonic() - began
            finally:
                freeze(own_server, signal.SIGCONT)
            check(caught.value, elapsed)
            lock.release()
        return

    async def scenario() -> None:
        async with corral.aio.connect(own_server.url, timeout=timeout) as store:
            lock = store.lock(name, ttl=30)
            assert await lock.acquire()
            freeze(own_server, signal.SIGSTOP)
            began = time.monotonic()
            try:
                with pytest.raises(BackendUnavailable) as caught:
                    await lock.extend()
                elapsed = time.monotonic() - began
            finally:
                freeze(own_server, signal.SIGCONT)
            check(caught.value, elapsed)
            await lock.release()

    asyncio.run(scenario())


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        server = servers.start_postgres(tmp_path_factory.mktemp("tls-postgres"), tls=True)
    except servers.ServerUnavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


def test_tls_with_verify_full_against_the_servers_ca(tls_server: Any, name: str) -> None:
    """Every connection of the store (pooled and LISTEN) is TLS, verified by host name."""
    app = f"corral-{uuid.uuid4().hex[:8]}"
    url = with_query(tls_server.url, f"application_name={app}")
    assert "sslmode=verify-full" in url and "sslrootcert=" in url
    with corral.connect(url) as store, corral.connect(url) as other:
        holder = store.lock(name, ttl=30)
        assert holder.acquire()
        woke: list[bool] = []
        thread = threading.Thread(
            target=lambda: woke.append(other.lock(name, ttl=30).acquire(wait=20))
        )
        thread.start()

        def sessions() -> list[tuple[Any, ...]]:
            return query(
                tls_server.url,
                "SELECT a.query, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
                " WHERE a.application_name = %s",
                [app],
            )

        wait_until(lambda: any(q.startswith("LISTEN") for q, _ in sessions()))  # it waits
        found = sessions()
        assert all(ssl for _, ssl in found), found
        holder.release()
        thread.join(30)
        assert woke == [True]
        assert store.force_release(name)


def test_tls_with_a_wrong_ca_fails_with_a_clear_error(
    tls_server: Any, tmp_path: Path, name: str
) -> None:
    wrong_ca = servers._make_tls_files(tmp_path)[0]
    url = tls_server.url.split("?")[0] + f"?sslmode=verify-full&sslrootcert={wrong_ca}"
    with corral.connect(url, timeout=3) as store, pytest.raises(BackendError) as caught:
        store.lock(name, ttl=5).acquire()
    message = str(caught.value)
    where = f"{tls_server.host}:{tls_server.port}"
    assert where in message and name in message
    assert "TLS" in message and "sslrootcert" in message and "certificate" in message


def test_tls_required_from_a_server_without_it(backend_url: str, name: str) -> None:
    with (
        corral.connect(with_query(backend_url, "sslmode=require"), timeout=3) as store,
        pytest.raises(BackendError, match="TLS") as caught,
    ):
        store.lock(name, ttl=5).acquire()
    assert backend_url.split("@")[1].split("/")[0] in str(caught.value)


def test_only_tls_set_up_wrong_is_a_tls_error() -> None:
    """A TLS connection that breaks (a restart, a dropped route) is the server being
    unavailable, to be retried; one that cannot be set up as configured is not."""
    backend = PostgresBackend(parse_url("postgresql://app@db.example/app", {}))
    where = 'connection failed: connection to server at "10.0.0.1", port 5432 failed: '
    for text, kind in [
        (where + "SSL error: certificate verify failed", BackendError),
        (where + 'server certificate for "db" does not match host name "x"', BackendError),
        (where + "server does not support SSL, but SSL was required", BackendError),
        (where + 'root certificate file "/ca.pem" does not exist', BackendError),
        (where + "SSL SYSCALL error: EOF detected", BackendUnavailable),
        (where + "Connection refused", BackendUnavailable),
        ("consuming input failed: SSL SYSCALL error: EOF detected", BackendUnavailable),
        ("consuming input failed: SSL error: unexpected eof while reading", BackendUnavailable),
        ("server closed the connection unexpectedly", BackendUnavailable),
    ]:
        error = backend._error(psycopg.OperationalError(text), "report", "acquire")
        assert type(error) is kind, (text, error)
        assert "db.example:5432" in str(error)
        assert ("sslrootcert" in str(error)) is (kind is BackendError)


# -- Ctrl-C in the blocking flavour -----------------------------------------------------------


def test_ctrl_c_while_an_attempt_is_in_flight_leaves_no_lock_held(
    backend_url: str, name: str
) -> None:
    """SIGINT lands while the acquiring statement waits in the server (here for the name's
    turn, held by another session): psycopg cancels the statement, the lock logic takes
    the attempt back, and nothing stays held, not even until the TTL."""
    app = f"corral-{uuid.uuid4().hex[:8]}"
    with corral.connect(with_query(backend_url, f"application_name={app}"), timeout=20) as store:
        assert store.lock_info(name) is None  # the pool is open
        gate = store.backend._sql.gate_key(lock_key(name))
        main = threading.main_thread().ident
        assert main == threading.get_ident()
        fired: list[bool] = []

        def interrupt_once_waiting() -> None:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                waiting = query(
                    backend_url,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                    " AND wait_event = 'advisory'",
                    [app],
                )
                if waiting == [(1,)]:
                    fired.append(True)
                    signal.pthread_kill(main, signal.SIGINT)
                    return
                time.sleep(0.02)

        with psycopg.connect(backend_url, autocommit=True) as blocker:
            blocker.execute("SELECT pg_advisory_lock(%s)", [gate])
            lock = store.lock(name, ttl=60)
            thread = threading.Thread(target=interrupt_once_waiting)
            thread.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    lock.acquire()
            finally:
                thread.join(30)
            assert fired == [True]
            blocker.execute("SELECT pg_advisory_unlock(%s)", [gate])
        assert not lock.held
        assert store.lock_info(name) is None
        # The store's connections are fine, and the lock is free for anyone at once.
        again = store.lock(name, ttl=5)
        assert again.acquire()
        again.release()


class _InterruptedAfterGrant(PostgresBackend):
    """Ctrl-C right after the server granted the lock, before the caller saw the answer."""

    def try_acquire(self, *args: Any, **kwargs: Any) -> Attempt:
        attempt = super().try_acquire(*args, **kwargs)
        if attempt.acquired:
            raise KeyboardInterrupt
        return attempt


def test_ctrl_c_after_the_grant_takes_the_lock_back(backend_url: str, name: str) -> None:
    store = Store(_InterruptedAfterGrant(parse_url(backend_url, {})))
    with store, corral.connect(backend_url) as other:
        lock = store.lock(name, ttl=60)
        with pytest.raises(KeyboardInterrupt):
            lock.acquire()
        assert not lock.held
        assert other.lock_info(name) is None
        again = other.lock(name, ttl=5)
        assert again.acquire()
        again.release()


# -- semaphores ------------------------------------------------------------------------------


def slot_rows(url: str, store: Any) -> list[tuple[Any, ...]]:
    """Every (key, owner) slot of the store's semaphore table, and every (key, owner) place."""
    statements = store.backend._sql
    return query(url, f"SELECT name, owner FROM {statements.slots} ORDER BY token") + query(
        url, f"SELECT name, owner FROM {statements.waiters} ORDER BY arrival"
    )


def test_semaphore_names_used_once_leave_nothing_behind(backend_url: str) -> None:
    """Slots released, closed with hold_for or left to expire, and dead fair waiters'
    places: each row is gone once expired, swept by later acquisitions of locks as of
    semaphores (and locks' rows by semaphores' acquisitions), and tokens still increase
    per name."""
    prefix = fresh()
    with (
        corral.connect(backend_url, table_prefix=prefix) as store,
        corral.connect(backend_url, table_prefix=prefix) as other,
    ):
        backend = store.backend
        first_tokens: dict[str, int] = {}
        # Slots are taken for 60 s, so each is still held when released or queued behind,
        # however long this process is paused; those left to expire get their TTL cut
        # short once nothing needs them any more.
        for index in range(240):
            sem_name = f"once:{index}"
            taken = [
                s.backend.sem_try_acquire(sem_name, f"o{index}-{s is store}", 60, 2)
                for s in (store, other)
            ]
            assert all(attempt.acquired for attempt in taken)
            first_tokens[sem_name] = max(a.token for a in taken if a.token is not None)
            assert backend.sem_release(sem_name, f"o{index}-True") is Outcome.OK
            if index % 3 == 0:
                assert other.backend.sem_release(sem_name, f"o{index}-False", 0.3) is Outcome.OK
            elif index % 3 == 1:  # left to expire, as a crashed holder's would
                assert other.backend.sem_extend(sem_name, f"o{index}-False", 0.4) is Outcome.OK
            else:
                assert other.backend.sem_release(sem_name, f"o{index}-False") is Outcome.OK
            if index % 20 == 0:
                # A fair waiter that dies while queued, behind a holder that crashed.
                queued = f"queued:{index}"
                assert backend.sem_try_acquire(queued, "crashed", 60, 1).acquired
                assert not backend.sem_try_acquire(queued, "dead", 30, 1, queue_ttl=0.3).acquired
                assert backend.sem_extend(queued, "crashed", 0.4) is Outcome.OK
        held = backend.sem_try_acquire("held", "keeper", 60, 3)
        assert held.acquired
        # Released slots are deleted at once; the others wait for their expiry.
        assert all(
            owner is None or not owner.endswith("True")
            for _, owner in slot_rows(backend_url, store)
        )
        time.sleep(0.8)
        for index in range(10 * SWEEP_EVERY):  # lock traffic only
            assert backend.try_acquire(f"traffic:{index}", "t", 30).acquired
            backend.release(f"traffic:{index}", "t")
        assert slot_rows(backend_url, store) == [("held", "keeper")]
        assert rows_of(backend_url, store) == []
        for sem_name in list(first_tokens)[:5]:
            again = other.backend.sem_try_acquire(sem_name, "again", 30, 2)
            assert again.acquired and again.token is not None
            assert again.token > first_tokens[sem_name]
            assert other.backend.sem_release(sem_name, "again") is Outcome.OK
        # And the other way round: locks left behind, swept by semaphore traffic.
        for index in range(100):
            assert backend.try_acquire(f"lock-once:{index}", "l", 0.3).acquired
        time.sleep(0.6)
        for index in range(10 * SWEEP_EVERY):
            assert backend.sem_try_acquire(f"sem-traffic:{index}", "s", 30, 2).acquired
            assert backend.sem_release(f"sem-traffic:{index}", "s") is Outcome.OK
        assert rows_of(backend_url, store) == []
        assert slot_rows(backend_url, store) == [("held", "keeper")]
        assert backend.sem_release("held", "keeper") is Outcome.OK
        assert slot_rows(backend_url, store) == []


@pytest.mark.parametrize("length", [20, 20_000])
def test_a_slot_freed_elsewhere_wakes_the_semaphore_waiter_at_once(
    backend_url: str, length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No timer of the waiter fires before the test gives up on it (re-check, starvation
    # guard, queue refresh; the holders' TTL and the wait are longer): only the NOTIFY
    # can wake it.
    monkeypatch.setattr(lockflow, "NOTIFIED_RECHECK", 120.0)
    monkeypatch.setattr(sync_lock, "STARVE_AFTER", 120.0)
    monkeypatch.setattr(sync_lock, "FAIR_QUEUE_TTL", 360.0)
    name = (uuid.uuid4().hex * (length // 32 + 1))[:length]
    with corral.connect(backend_url) as holder_store, corral.connect(backend_url) as waiter_store:
        for free in ("release", "force_release"):
            holders = [holder_store.semaphore(name, 2, ttl=120) for _ in range(2)]
            for holder in holders:
                assert holder.acquire()
            woke: list[float] = []

            def wait(store: corral.Store = waiter_store, woke: list[float] = woke) -> None:
                slot = store.semaphore(name, 2, ttl=30)
                assert slot.acquire(wait=120)
                woke.append(time.monotonic())
                slot.release()

            # Daemon: a waiter never woken fails the test, and does not hold up the run.
            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            time.sleep(0.3)
            if free == "release":
                holders[0].release()
            else:
                assert holder_store.force_release_semaphore(name) == 2
            thread.join(30)
            # Its wait (120 s) outlasts the join: its last attempt at the wait's end
            # cannot pass the test, only the NOTIFY can.
            assert woke, free
            holder_store.force_release_semaphore(name)


@pytest.mark.parametrize("odd", ["nul\x00byte", "é" * 600], ids=["nul", "long"])
def test_slot_releases_notify_the_semaphores_channel_with_the_key(
    backend_url: str, name: str, odd: str
) -> None:
    """A semaphore's wake-ups go on a channel of their own, never the locks' one, with
    the key its waiters listen for; a slot kept closed wakes nobody."""
    sem_name = name + odd
    key = lock_key(sem_name)
    assert key != sem_name
    with (
        corral.connect(backend_url) as store,
        psycopg.connect(backend_url, autocommit=True) as ear,
    ):
        statements = store.backend._sql
        assert statements.sem_channel != statements.channel
        ear.execute(f'LISTEN "{statements.channel}"')
        ear.execute(f'LISTEN "{statements.sem_channel}"')
        backend = store.backend

        def heard(timeout: float = 10) -> list[tuple[str, str]]:
            notes = ear.notifies(timeout=timeout, stop_after=1)
            return [(note.channel, note.payload) for note in notes]

        told = [(statements.sem_channel, key)]
        assert backend.sem_try_acquire(sem_name, "a", 30, 2).acquired
        assert backend.sem_try_acquire(sem_name, "b", 30, 2).acquired
        assert backend.sem_release(sem_name, "a") is Outcome.OK
        assert heard() == told
        assert backend.sem_release(sem_name, "b", hold_for=30) is Outcome.OK
        assert backend.sem_try_acquire(sem_name, "c", 30, 2).acquired
        assert not backend.sem_try_acquire(sem_name, "d", 30, 2, queue_ttl=10).acquired
        backend.sem_leave_queue(sem_name, "d")  # a waiter behind it may go now
        assert heard() == told  # and nothing about the closed slot came before
        assert backend.sem_force_release(sem_name) == 2
        assert heard() == told
        assert heard(timeout=0.3) == []  # one notification for the two slots
        info = backend.sem_inspect(sem_name)
        assert info is None
        assert [row for row in slot_rows(backend_url, store) if row[0] == key] == []


def test_concurrent_attempts_from_many_connections_never_exceed_the_limit(
    backend_url: str, name: str
) -> None:
    """Six stores (twelve connections) at once, on tables they create as they start: first
    use included, no attempt grants a slot past the limit, none deadlocks."""
    limit = 3
    prefix = fresh()
    stores = [corral.connect(backend_url, max_connections=2, table_prefix=prefix) for _ in range(6)]
    key = lock_key(name)
    slots_table = stores[0].backend._sql.slots
    try:
        # Nobody releases: exactly `limit` of 240 attempts (a quarter of them fair) are
        # granted.
        start = threading.Barrier(len(stores) * 2)
        granted: list[int] = []
        errors: list[BaseException] = []

        def grab(index: int, store: corral.Store) -> None:
            try:
                start.wait()
                for attempt_no in range(20):
                    owner = f"grab-{index}-{attempt_no}"
                    fair = 30.0 if attempt_no % 4 == 0 else None
                    attempt = store.backend.sem_try_acquire(name, owner, 60, limit, queue_ttl=fair)
                    if attempt.acquired:
                        assert attempt.token is not None
                        granted.append(attempt.token)
                    elif fair is not None:
                        store.backend.sem_leave_queue(name, owner)  # gives up, as acquire does
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=grab, args=(i, stores[i % len(stores)]))
            for i in range(len(stores) * 2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert len(granted) == limit and len(set(granted)) == limit
        rows = query(backend_url, f"SELECT count(*) FROM {slots_table} WHERE name = %s", [key])
        assert rows == [(limit,)]
        assert stores[0].force_release_semaphore(name) == limit
        # Those who queued and gave up left: nobody is queued ahead of what follows.
        waiters_table = stores[0].backend._sql.waiters
        assert query(backend_url, f"SELECT count(*) FROM {waiters_table}") == [(0,)]

        # Taking and releasing, some slots left to expire at once: never more than the limit.
        mutex = threading.Lock()
        inside = most = entered = 0
        start = threading.Barrier(len(stores) * 2)

        def churn(index: int, store: corral.Store) -> None:
            nonlocal inside, most, entered
            backend = store.backend
            try:
                start.wait()
                for round_no in range(40):
                    owner = f"churn-{index}-{round_no}"
                    if round_no % 5 == 4:
                        backend.sem_try_acquire(name, owner, 0.02, limit)  # a crashed holder
                        continue
                    if not backend.sem_try_acquire(name, owner, 60, limit).acquired:
                        continue
                    with mutex:
                        inside += 1
                        entered += 1
                        most = max(most, inside)
                    info = backend.sem_inspect(name)
                    assert info is not None and len(info.holders) <= limit, info
                    time.sleep(0.002)
                    with mutex:
                        inside -= 1
                    assert backend.sem_release(name, owner) is Outcome.OK
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=churn, args=(i, stores[i % len(stores)]))
            for i in range(len(stores) * 2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert entered > limit and 1 <= most <= limit, (entered, most)
    finally:
        for store in stores:
            store.force_release_semaphore(name)
            store.close()


def test_a_semaphores_turn_is_its_own_and_extensions_take_it(backend_url: str, name: str) -> None:
    """A semaphore's turn is an advisory lock in the two-int key space: a lock of the same
    name never waits for it (nor the other way round). Extensions and closures wait for
    it, so no attempt counts a slot free while its extension commits."""
    app = f"corral-{uuid.uuid4().hex[:8]}"
    with corral.connect(with_query(backend_url, f"application_name={app}")) as store:
        backend = store.backend
        statements = backend._sql
        key = lock_key(name)
        assert backend.sem_try_acquire(name, "holder", 30, 2).acquired
        with psycopg.connect(backend_url, autocommit=True) as blocker:
            blocker.execute("SELECT pg_advisory_lock(%(high)s, %(low)s)", statements.sem_gate(key))
            blocker.execute("SELECT pg_advisory_lock(%s)", [statements.gate_key(key)])
            # The semaphore's turn is held, and the lock's: the other kind is not held up.
            blocker.execute("SELECT pg_advisory_unlock(%s)", [statements.gate_key(key)])
            assert backend.try_acquire(name, "lock-holder", 30).acquired
            outcomes: list[Outcome] = []
            extender = threading.Thread(
                target=lambda: outcomes.append(backend.sem_extend(name, "holder", 60))
            )
            extender.start()
            try:
                wait_until(lambda: waiting_for_turn(backend_url, app) == 1)
                assert outcomes == []
            finally:
                blocker.execute(
                    "SELECT pg_advisory_unlock(%(high)s, %(low)s)", statements.sem_gate(key)
                )
                extender.join(30)
            assert outcomes == [Outcome.OK]
            # And a semaphore's attempt does not wait for a held lock's turn.
            blocker.execute("SELECT pg_advisory_lock(%s)", [statements.gate_key(key)])
            assert backend.sem_try_acquire(name, "second", 30, 2).acquired
            blocker.execute("SELECT pg_advisory_unlock(%s)", [statements.gate_key(key)])
        info = backend.sem_inspect(name)
        assert info is not None and [h.owner for h in info.holders] == ["holder", "second"]
        assert info.holders[0].ttl > 30
        assert backend.sem_force_release(name) == 2
        assert backend.force_release(name)


def test_ctrl_c_while_a_semaphore_attempt_is_in_flight_takes_no_slot(
    backend_url: str, name: str
) -> None:
    app = f"corral-{uuid.uuid4().hex[:8]}"
    with corral.connect(with_query(backend_url, f"application_name={app}"), timeout=20) as store:
        assert store.semaphore_info(name) is None  # the pool is open
        gate = store.backend._sql.sem_gate(lock_key(name))
        main = threading.main_thread().ident
        assert main == threading.get_ident()
        fired: list[bool] = []

        def interrupt_once_waiting() -> None:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if waiting_for_turn(backend_url, app) == 1:
                    fired.append(True)
                    signal.pthread_kill(main, signal.SIGINT)
                    return
                time.sleep(0.02)

        with psycopg.connect(backend_url, autocommit=True) as blocker:
            blocker.execute("SELECT pg_advisory_lock(%(high)s, %(low)s)", gate)
            slot = store.semaphore(name, 2, ttl=60)
            thread = threading.Thread(target=interrupt_once_waiting)
            thread.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    slot.acquire()
            finally:
                thread.join(30)
            assert fired == [True]
            blocker.execute("SELECT pg_advisory_unlock(%(high)s, %(low)s)", gate)
        assert not slot.held
        assert store.semaphore_info(name) is None
        assert [row for row in slot_rows(backend_url, store) if row[0] == lock_key(name)] == []
        again = store.semaphore(name, 1, ttl=5)
        assert again.acquire()
        again.release()


def test_semaphore_errors_name_it_and_never_the_password(
    backend_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    password = f"Pw{secrets.token_hex(6)}"
    shown: list[str] = []

    def failing(call: Any, kind: type[BaseException] = BackendError) -> BaseException:
        with pytest.raises(kind) as caught:
            call()
        shown.append(everything_shown(caught.value))
        assert name in str(caught.value) and "semaphore" in str(caught.value)
        return caught.value

    # Nobody listens there: every new code path fails to connect.
    with corral.connect(f"postgresql://app:{password}@127.0.0.1:1/db", timeout=1) as store:
        slot = store.semaphore(name, 2, ttl=10)
        failing(slot.acquire)
        failing(lambda: slot.acquire(wait=0.5))
        failing(lambda: store.semaphore_info(name))
        failing(lambda: store.force_release_semaphore(name))
        backend = store.backend
        failing(lambda: backend.sem_release(name, "o"))
        failing(lambda: backend.sem_release(name, "o", 5))
        failing(lambda: backend.sem_extend(name, "o", 5))
        failing(lambda: backend.sem_leave_queue(name, "o"))

        def wait_for_it() -> None:
            with backend.sem_waiter(name):
                pass

        failing(wait_for_it)
    # A server that takes the password (the test server trusts every login), and a
    # statement it cancels: the semaphore's turn is held elsewhere past the timeout.
    url = backend_url.replace("://corral@", f"://corral:{password}@")
    assert password in url
    with corral.connect(url, timeout=0.5) as store:
        slot = store.semaphore(name, 2, ttl=10)
        assert slot.acquire()
        gate = store.backend._sql.sem_gate(lock_key(name))
        with psycopg.connect(backend_url, autocommit=True) as blocker:
            blocker.execute("SELECT pg_advisory_lock(%(high)s, %(low)s)", gate)
            try:
                error = failing(
                    lambda: store.semaphore(name, 2, ttl=10).acquire(), BackendUnavailable
                )
                assert "did not answer" in str(error)
                failing(slot.extend, BackendUnavailable)
            finally:
                blocker.execute("SELECT pg_advisory_unlock(%(high)s, %(low)s)", gate)
        slot.release()
    assert shown and not [text for text in shown if password in text]
    assert password not in caplog.text


def test_semaphore_tables_join_the_locks_tables_of_an_older_version(
    backend_url: str, name: str
) -> None:
    """Locks' tables made before semaphores existed, in use (a transaction writes to them):
    a store adds the semaphores' tables without locking the locks' ones."""
    prefix = fresh()
    query(backend_url, migration_sql(table_prefix=prefix))
    statements = Statements("public", prefix)
    query(backend_url, f"DROP TABLE {statements.slots}, {statements.waiters}")
    with psycopg.connect(backend_url) as user:  # one open transaction, as a busy store's
        user.execute(
            f"INSERT INTO {statements.locks} (name, owner, token, expires_at)"
            " VALUES ('busy', 'someone', 1, clock_timestamp() + interval '60 seconds')"
        )
        with corral.connect(backend_url, table_prefix=prefix, timeout=2) as store:
            slot = store.semaphore(name, 2, ttl=10)
            assert slot.acquire()
            slot.release()
        user.rollback()


# -- cache entries ------------------------------------------------------------------------


def entry_rows(url: str, store: Any) -> list[tuple[bytes, bytes, bool]]:
    """Every (key, data, live) row of the store's cache entries, expired ones too."""
    rows = query(
        url,
        f"SELECT key, data, expires_at > clock_timestamp() FROM {store.backend._sql.entries}"
        " ORDER BY key",
    )
    return [(bytes(key), bytes(data), live) for key, data, live in rows]


def cached(key: str, value: object = 1, *, fresh_for: float = 30.0, generation: int = 0) -> bytes:
    return encode(
        value,
        make_codec("json", None),
        key,
        fresh_until=time.time() + fresh_for,
        delta=0.01,
        generation=generation,
    )


def test_cache_keys_are_their_utf8_hashed_only_past_the_limit() -> None:
    for plain in ("ns:report", "nul\x00byte", "lone \ud800", "é€😀", "x" * MAX_KEY_BYTES):
        assert cache_key(plain) == plain.encode("utf-8", "surrogatepass")
    long_keys = ["x" * (MAX_KEY_BYTES + 1), "é" * 513, "y" * 10_000, "y" * 9_999 + "z"]
    stored = [cache_key(key) for key in long_keys]
    assert len(set(stored)) == len(long_keys)
    for key, form in zip(long_keys, stored, strict=True):
        raw = key.encode("utf-8", "surrogatepass")
        assert form == raw[:CACHE_READABLE_BYTES] + b"\xff" + hashlib.sha256(raw).digest()
        assert len(form) <= MAX_KEY_BYTES and cache_key(key) == form
    # UTF-8 never has 0xFF: no key stored as itself is ever a hashed one.
    assert all(b"\xff" not in cache_key(chr(c)) for c in range(0x110000) if c % 97 == 0)
    # A prefix is one range of stored keys, long keys included, up to what they keep.
    assert cache_key_range("") == (b"", None)
    assert cache_key_range("ns:") == (b"ns:", b"ns;")
    assert cache_key_range("é") == ("é".encode(), b"\xc3\xaa")
    assert cache_key_range("y" * CACHE_READABLE_BYTES) is not None
    assert cache_key_range("y" * (CACHE_READABLE_BYTES + 1)) is None
    for form in stored[2:]:
        low, high = cache_key_range("y" * 500) or (b"", None)
        assert high is not None and low <= form < high


def claim_rule_cases() -> list[tuple[bytes | None, int, float]]:
    """Headers corral writes, at and around the boundaries, and bytes that only look like
    them; the fields' forms float() reads besides (inf, nan, underscores, exponents of
    four digits) are left out: the SQL takes those for "not corral's", hence due."""
    now = 1_763_860_725.123456
    cases: list[tuple[bytes | None, int, float]] = [(None, 0, now)]
    for fresh in (0.0, now - 1, now, now + 1e-6, now - 1e-6, 9_999_999_999.999999):
        for retry in (0.0, now, now + 5):
            for generation in (0, 1, 10**16 - 1):
                header = header_bytes(
                    fresh_until=fresh,
                    retry_until=retry,
                    delta=0.5,
                    generation=generation,
                    codec="j",
                )
                for due_before in (now, fresh, fresh + 1e-7, fresh - 1e-7, retry, 0.0, 1e300):
                    cases.append((header + b"[1]", generation, due_before))
                    cases.append((header, 1, due_before))
    good = header_bytes(fresh_until=now, retry_until=0.0, delta=0.5, generation=3, codec="m")
    odd_fields = [
        b" " * 14 + b"1.5",
        b"+" + b"0" * 16,
        b"1e5".rjust(17),
        b"-1e999".rjust(17),
        b"1e-999".rjust(17),
        b"1e0009".rjust(17),
        b".5".ljust(17),
        b"1.".ljust(17),
        b"\t1763860725.5\n  ",
        b"- 1".rjust(17),
        b"0x10".rjust(17),
        b"1\\0".rjust(17),
        b"\x00" * 17,
        b"\xff" + b"1" * 16,
        b"x" * 17,
        b"",
    ]
    for odd in odd_fields:
        for at in (FRESH_AT, RETRY_AT):
            field = odd.rjust(at.stop - at.start)[: at.stop - at.start]
            cases.append((good[: at.start] + field + good[at.stop :], 3, now))
            cases.append((good[: at.start] + field + good[at.stop :], 3, 2e9))
        delta = odd.strip().rjust(12)[:12]
        cases.append((good[:36] + delta + good[48:], 3, 2e9))
    for generation in (b" " * 15 + b"3", b"+000000000000003", b"x" * 16, b"-000000000000003"):
        cases.append((good[:48] + generation + good[64:], 3, 2e9))
    cases += [
        (good[:65], 3, 2e9),  # one byte short
        (b"c2" + good[2:], 3, 2e9),  # another format
        (good[:64] + b"\x80" + good[65:], 3, 2e9),  # a codec letter that is not ASCII
        (good[:65] + b"x", 3, 2e9),  # no newline
        (b"written by something else", 0, 2e9),
        (b"", 0, 2e9),
    ]
    return cases


def test_the_sql_claim_rule_is_claim_due(backend_url: str) -> None:
    """What a read with a claim decides on the server is what `claim_due` decides, and
    what invalidate takes for corral's bytes is what `decode_header` reads."""
    cases = claim_rule_cases()
    statement = (
        f"SELECT {entry_is_due('%(data)s::bytea', '%(generation)s::bigint', '%(due)s')},"
        f" COALESCE({entry_is_ours('%(data)s::bytea')}, false)"
    )
    with psycopg.connect(backend_url, autocommit=True) as conn:
        answers = [
            conn.execute(statement, {"data": data, "generation": gen, "due": due}).fetchone()
            for data, gen, due in cases
        ]
    wrong = [
        (case, answer)
        for case, answer in zip(cases, answers, strict=True)
        if answer != (claim_due(*case), case[0] is not None and decode_header(case[0]) is not None)
    ]
    assert wrong == []
    assert {answer[0] for answer in answers} == {True, False}


def test_odd_and_long_cache_keys_and_their_counts(backend_url: str, name: str) -> None:
    prefix = fresh()
    keys = [
        f"{name}:nul\x00byte",
        f"{name}:lone \ud800",
        f"{name}:" + "y" * 10_000,
        f"{name}:" + "y" * 9_999 + "z",
        f"{name}:" + "é" * 2_000,
    ]
    with corral.connect(backend_url, table_prefix=prefix) as store:
        backend = store.backend
        datas = [cached(key, i) for i, key in enumerate(keys)]
        backend.cache_store(list(zip(keys, datas, [60.0] * len(keys), strict=True)))
        found, generation = backend.cache_fetch(keys, f"{name}:" + "g" * 10_000)
        assert found == datas
        assert generation == 0
        assert backend.cache_clear(f"{name}:" + "g" * 10_000) == 1
        assert backend.cache_fetch([], f"{name}:" + "g" * 9_999 + "h")[1] == 0
        # Stored keys stay short; long ones keep their head.
        stored = [key for key, _, _ in entry_rows(backend_url, store)]
        assert sorted(stored) == sorted(cache_key(key) for key in keys)
        assert max(len(key) for key in stored) <= MAX_KEY_BYTES
        # Counts by prefix, hashed keys included; past what those keep: unknown.
        assert backend.cache_count(f"{name}:") == len(keys)
        assert backend.cache_count("") == len(keys)
        assert backend.cache_count(f"{name}:yyy") == 2
        assert backend.cache_count(f"{name}:é") == 1
        assert backend.cache_count(f"{name}:nul\x00") == 1
        assert backend.cache_count(f"{name}:" + "y" * 10_001) is None
        assert backend.cache_count("other:") == 0
        assert backend.cache_delete(keys[2]) and not backend.cache_delete(keys[2])
        assert backend.cache_fetch(keys[2:4], "g")[0][0] is None
        assert backend.cache_count(f"{name}:yyy") == 1


def test_cache_entries_expire_by_the_servers_clock_to_the_microsecond(
    backend_url: str, name: str
) -> None:
    """PostgreSQL's timestamps count microseconds: `keep` is kept as given, not rounded."""
    with corral.connect(backend_url, table_prefix=fresh()) as store:
        backend = store.backend
        entries = backend._sql.entries

        def server_clock() -> Any:
            return query(backend_url, "SELECT clock_timestamp()")[0][0]

        def expires_at() -> Any:
            return query(backend_url, f"SELECT expires_at FROM {entries}")[0][0]

        # The server's clock read before and after each call brackets its expiry, however
        # long this process is paused meanwhile; rounding would move it out by 0.25 s or
        # more. 30 s, so the entry is still there for the invalidate, whatever the pauses.
        before = server_clock()
        backend.cache_store([(name, cached(name), 30.25)])
        after = server_clock()
        assert before + timedelta(seconds=30.25) <= expires_at() <= after + timedelta(seconds=30.25)
        before = server_clock()
        assert backend.cache_invalidate(name, 0.5)
        after = server_clock()
        assert before + timedelta(seconds=0.5) <= expires_at() <= after + timedelta(seconds=0.5)
        time.sleep(0.6)
        assert backend.cache_fetch([name], "g")[0] == [None]
        # Far beyond any interval PostgreSQL has: kept (almost) forever, no error.
        backend.cache_store([(name, cached(name), float("inf"))])
        backend.cache_store([(name + "2", cached(name), 1e300)])
        assert backend.cache_invalidate(name, float("inf"))
        assert backend.cache_fetch([name, name + "2"], "g")[0] != [None, None]
        assert backend.cache_count("") == 2


def test_expired_cache_entries_are_swept_by_later_writes(backend_url: str, name: str) -> None:
    with corral.connect(backend_url, table_prefix=fresh()) as store:
        backend = store.backend
        backend.cache_store([("kept", cached("kept"), 60.0), ("dropped", cached("dropped"), 60.0)])
        # keep <= 0 in a store: gone for readers at once, its row emptied and expired.
        backend.cache_store([("dropped", cached("dropped"), 0.0), ("never-there", b"x", -1.0)])
        assert backend.cache_fetch(["dropped", "never-there"], "g")[0] == [None, None]
        assert [(key, data) for key, data, live in entry_rows(backend_url, store) if not live] == [
            (b"dropped", b"")
        ]
        assert not backend.cache_delete("dropped")
        # The last write before the count: a later one would sweep those that expired
        # already, were this process paused.
        backend.cache_store([(f"gone-{i}", cached(f"gone-{i}"), 0.2) for i in range(20)])
        assert len(entry_rows(backend_url, store)) == 21
        time.sleep(0.4)
        # Reads write nothing...
        assert backend.cache_fetch(["gone-1", "kept"], "g")[0][0] is None
        assert len(entry_rows(backend_url, store)) == 21
        # ...writes sweep up to SWEEP_BATCH expired rows more than they write.
        backend.cache_store([("new", cached("new"), 60.0)])
        assert [key for key, _, _ in entry_rows(backend_url, store)] == [b"kept", b"new"]


def test_concurrent_stores_of_shared_keys_never_deadlock(backend_url: str) -> None:
    """Stores of overlapping keys in any order, with deletes, expiring entries and sweeps
    among them: each locks its rows in key order and sweeps only after, so none waits for
    another in a cycle (PostgreSQL would end one with `deadlock detected`)."""
    prefix = fresh()
    keys = [f"k{i}" for i in range(12)]
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        with corral.connect(backend_url, table_prefix=prefix, timeout=10) as store:
            backend = store.backend
            try:
                start.wait()
                for _ in range(150):
                    chosen = rng.sample(keys, rng.randint(1, len(keys)))
                    keep = [rng.choice([60.0, 0.01, 0.0]) for _ in chosen]
                    backend.cache_store(
                        [(k, cached(k), kp) for k, kp in zip(chosen, keep, strict=True)]
                    )
                    if rng.random() < 0.3:
                        backend.cache_invalidate(rng.choice(keys), rng.choice([5.0, 0.0]))
                    if rng.random() < 0.2:
                        backend.cache_delete(rng.choice(keys))
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []


def test_invalidate_deletes_bytes_that_are_not_corrals(backend_url: str, name: str) -> None:
    with corral.connect(backend_url) as store:
        backend = store.backend
        mine, foreign = f"{name}:mine", f"{name}:foreign"
        backend.cache_store([(mine, cached(mine), 60.0), (foreign, b"c1 not a header", 60.0)])
        assert backend.cache_invalidate(mine, 30.0) and backend.cache_invalidate(foreign, 30.0)
        found, _ = backend.cache_fetch([mine, foreign], "g")
        assert found[0] is not None and found[0][2:19] == b"0000000000.000000"
        assert found[1] is None


# -- a read with a claim ------------------------------------------------------------------


class DelayingProxy:
    """A TCP proxy to `target` that delivers what clients send `delay` seconds late (in
    order), and the answers at once: every round trip costs `delay` (as it is when sent)."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target = target
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            late: queue.Queue[tuple[float, bytes]] = queue.Queue()
            for job, args in (
                (self._hold, (client, late)),
                (self._deliver, (late, server)),
                (self._forward, (server, client)),
            ):
                threading.Thread(target=job, args=args, daemon=True).start()

    @staticmethod
    def _chunks(source: socket.socket) -> Iterator[bytes]:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            yield data

    def _hold(self, source: socket.socket, late: queue.Queue[tuple[float, bytes]]) -> None:
        for data in self._chunks(source):
            late.put((time.monotonic() + self.delay, data))
        late.put((0.0, b""))  # the end

    @staticmethod
    def _deliver(late: queue.Queue[tuple[float, bytes]], to: socket.socket) -> None:
        while True:
            at, data = late.get()
            time.sleep(max(0.0, at - time.monotonic()))
            try:
                if not data:
                    to.shutdown(socket.SHUT_WR)
                    return
                to.sendall(data)
            except OSError:
                return

    def _forward(self, source: socket.socket, to: socket.socket) -> None:
        for data in self._chunks(source):
            with contextlib.suppress(OSError):
                to.sendall(data)
        with contextlib.suppress(OSError):
            to.shutdown(socket.SHUT_WR)

    def url(self, url: str) -> str:
        host_port = f"{self.target[0]}:{self.target[1]}"
        assert host_port in url
        return url.replace(host_port, f"127.0.0.1:{self.port}")

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()


def test_a_read_with_a_claim_is_one_round_trip(backend_url: str, name: str) -> None:
    """Each round trip through the proxy costs `delay`: a read that claims (and one that
    finds a fresh entry) costs one, where reading, then trying the lock, costs two."""
    # A second per round trip: one and two of them stay apart by a second, room for a
    # paused test. The warm-up (connection, tables) goes without, or it would take ~30 s.
    delay = 1.0
    params = conninfo_to_dict(backend_url)
    proxy = DelayingProxy((str(params["host"]), int(str(params["port"]))), 0.0)
    try:
        with corral.connect(proxy.url(backend_url), timeout=20) as store:
            backend = store.backend
            backend.cache_store([(f"{name}:fresh", cached(f"{name}:fresh"), 60.0)])  # warm up
            proxy.delay = delay

            def timed(call: Any) -> tuple[Any, float]:
                began = time.monotonic()
                result = call()
                return result, time.monotonic() - began

            claim = Claim(f"recompute-{name}", "me", 10.0, time.time())
            read, one = timed(lambda: backend.cache_read(f"{name}:missing", "g", claim))
            assert read.attempt is not None and read.attempt.acquired
            assert delay <= one < 2 * delay
            fresh_read, one = timed(lambda: backend.cache_read(f"{name}:fresh", "g", claim))
            assert fresh_read.entry is not None and fresh_read.attempt is None
            assert delay <= one < 2 * delay
            # The same, as a backend that cannot claim in its read: read, then try the lock.
            other = Claim(f"recompute-{name}-2", "me", 10.0, time.time())
            two_step, two = timed(
                lambda: Backend.cache_read(backend, f"{name}:missing-2", "g", other)
            )
            assert two_step.attempt is not None and two_step.attempt.acquired
            assert two >= 2 * delay  # by construction: the second is sent after the first
    finally:
        proxy.close()


def test_a_fresh_entry_is_read_without_waiting_for_the_claims_turn(
    backend_url: str, name: str
) -> None:
    """A claim takes its lock's turn only when the entry is due: readers of a fresh entry
    never queue on it, and a due one waits for it as any attempt on the lock does."""
    # The fresh read goes through a store that would wait 10 s for the turn, so a read
    # that queued on it stands out from one this process was paused in.
    with (
        corral.connect(backend_url, timeout=1) as store,
        corral.connect(backend_url, timeout=10) as patient,
    ):
        backend = store.backend
        key = f"{name}:fresh"
        backend.cache_store([(key, cached(key), 60.0)])
        assert patient.backend.cache_fetch([key], "g")[0] != [None]  # its pool is open
        lock_name = f"recompute-{name}"
        gate = backend._sql.gate_key(lock_key(lock_name))
        with psycopg.connect(backend_url, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", [gate])  # the lock's turn, held
            try:
                began = time.monotonic()
                claim = Claim(lock_name, "me", 10.0, time.time())
                read = patient.backend.cache_read(key, "g", claim)
                assert read.entry is not None and read.attempt is None
                assert time.monotonic() - began < 5  # half the wait for the turn
                with pytest.raises(BackendUnavailable) as caught:
                    backend.cache_read(
                        f"{name}:missing", "g", Claim(lock_name, "me", 10.0, time.time())
                    )
                message = str(caught.value)
                assert "did not answer" in message and f"{name}:missing" in message
                assert lock_name in message and store.server in message
            finally:
                other.execute("SELECT pg_advisory_unlock(%s)", [gate])
        # Nothing stayed held: the failed claim's transaction ended with it.
        assert store.lock_info(lock_name) is None
        read = backend.cache_read(f"{name}:missing", "g", Claim(lock_name, "me", 10.0, time.time()))
        assert read.attempt is not None and read.attempt.acquired


@pytest.mark.parametrize("pipelines", [True, False], ids=["pipelined", "begin-commit"])
def test_a_claim_is_the_locks_own_attempt(backend_url: str, name: str, pipelines: bool) -> None:
    """Same token sequence, same queue: a fair waiter queued ahead keeps the lock from a
    claim, as from any attempt; and an entry stored meanwhile is what the claim reads."""
    with store_for(backend_url, pipelines) as store:
        backend = store.backend
        lock_name, key = f"recompute-{name}", f"{name}:k"

        def claim(owner: str) -> Claim:
            return Claim(lock_name, owner, 10.0, time.time())

        held = backend.try_acquire(lock_name, "holder", 30)
        assert held.acquired and held.token is not None
        refused = backend.cache_read(key, "g", claim("reader"))
        assert refused.attempt is not None and not refused.attempt.acquired
        assert refused.attempt.holder_ttl is not None and 25 < refused.attempt.holder_ttl <= 30
        assert not backend.try_acquire(lock_name, "fair", 30, queue_ttl=10).acquired
        assert backend.release(lock_name, "holder") is Outcome.OK
        queued = backend.cache_read(key, "g", claim("reader"))
        assert queued.attempt == Attempt(False)  # free, but "fair" is ahead
        granted = backend.try_acquire(lock_name, "fair", 30, queue_ttl=10)
        assert granted.acquired and granted.token is not None and granted.token > held.token
        backend.release(lock_name, "fair")
        won = backend.cache_read(key, "g", claim("reader"))
        assert won.attempt is not None and won.attempt.acquired
        assert won.attempt.token is not None and won.attempt.token > granted.token
        info = store.lock_info(lock_name)
        assert info is not None and (info.owner, info.token) == ("reader", won.attempt.token)
        # The claim's lock is released like any lock, waking whoever waits for it.
        backend.cache_store([(key, cached(key), 60.0)])
        assert backend.release(lock_name, "reader") is Outcome.OK
        fresh_read = backend.cache_read(key, "g", claim("late"))
        assert fresh_read.entry is not None and fresh_read.attempt is None


def test_migration_sql_lets_a_role_without_ddl_rights_use_caches(
    backend_url: str, name: str
) -> None:
    role = f"limited_{uuid.uuid4().hex[:8]}"
    prefix = fresh()
    query(backend_url, f'CREATE ROLE "{role}" LOGIN')
    query(backend_url, migration_sql(table_prefix=prefix, grant_to=role))
    as_role = backend_url.replace("://corral@", f"://{role}@")
    with corral.connect(as_role, table_prefix=prefix) as store:
        backend = store.backend
        backend.cache_store([(name, cached(name), 60.0)])
        assert backend.cache_clear("g") == 1
        read = backend.cache_read(name, "g", Claim(f"lock-{name}", "me", 10.0, time.time()))
        assert read.entry is not None and read.generation == 1 and read.attempt is not None
        assert read.attempt.acquired
        assert backend.cache_invalidate(name, 10.0) and backend.cache_delete(name)
        assert backend.cache_count("") == 0


def test_cache_tables_join_the_tables_of_an_older_version(backend_url: str, name: str) -> None:
    """Tables made before caches existed, in use (a transaction writes to them): a store
    adds the cache tables without locking the others."""
    prefix = fresh()
    query(backend_url, migration_sql(table_prefix=prefix))
    statements = Statements("public", prefix)
    query(backend_url, f"DROP TABLE {statements.entries}, {statements.generations}")
    with psycopg.connect(backend_url) as user:  # one open transaction, as a busy store's
        user.execute(
            f"INSERT INTO {statements.locks} (name, owner, token, expires_at)"
            " VALUES ('busy', 'someone', 1, clock_timestamp() + interval '60 seconds')"
        )
        with corral.connect(backend_url, table_prefix=prefix, timeout=2) as store:
            store.backend.cache_store([(name, cached(name), 60.0)])
            assert store.backend.cache_fetch([name], "g")[0] != [None]
        user.rollback()


def test_cache_errors_name_the_key_and_server_and_never_the_password(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    password = f"Pw{secrets.token_hex(6)}"
    claim = Claim(f"lock-{name}", "me", 10.0, time.time())
    with corral.connect(f"postgresql://app:{password}@127.0.0.1:1/db", timeout=1) as store:
        backend = store.backend
        calls = {
            "read": lambda: backend.cache_fetch([name, "b"], "g"),
            "claim": lambda: backend.cache_read(name, "g", claim),
            "store": lambda: backend.cache_store([(name, b"x", 5.0)]),
            "delete": lambda: backend.cache_delete(name),
            "invalidate": lambda: backend.cache_invalidate(name, 5.0),
            "clear": lambda: backend.cache_clear(name),
            "count": lambda: backend.cache_count(name),
        }
        for what, call in calls.items():
            began = time.monotonic()
            with pytest.raises(BackendUnavailable) as caught:
                call()
            assert time.monotonic() - began < 5, what
            shown = everything_shown(caught.value)
            assert name in str(caught.value) and "127.0.0.1:1" in str(caught.value), what
            assert password not in shown, what
    assert password not in caplog.text


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_frozen_server_fails_cache_calls_within_the_timeout(
    own_server: Any, name: str, flavour: str
) -> None:
    timeout = 1.0
    claim = Claim(f"lock-{name}", "me", 10.0, time.time())

    def check(error: BaseException | None, elapsed: float) -> None:
        assert isinstance(error, BackendUnavailable), error
        assert "did not answer" in str(error) and name in str(error)
        assert elapsed < 4.5  # room for a pause, short of the 5 s default timeout

    if flavour == "sync":
        with corral.connect(own_server.url, timeout=timeout) as store:
            backend = store.backend
            backend.cache_store([(name, cached(name), 60.0)])
            for call in (
                lambda: backend.cache_read(f"{name}-missing", "g", claim),
                lambda: backend.cache_store([(name, cached(name), 60.0)]),
            ):
                freeze(own_server, signal.SIGSTOP)
                began = time.monotonic()
                try:
                    with pytest.raises(BackendUnavailable) as caught:
                        call()
                    elapsed = time.monotonic() - began
                finally:
                    freeze(own_server, signal.SIGCONT)
                check(caught.value, elapsed)
            assert backend.cache_fetch([name], "g")[0] != [None]
        return

    async def scenario() -> None:
        async with corral.aio.connect(own_server.url, timeout=timeout) as store:
            backend = store.backend
            await backend.cache_store([(name, cached(name), 60.0)])
            freeze(own_server, signal.SIGSTOP)
            began = time.monotonic()
            try:
                with pytest.raises(BackendUnavailable) as caught:
                    await backend.cache_read(f"{name}-missing", "g", claim)
                elapsed = time.monotonic() - began
            finally:
                freeze(own_server, signal.SIGCONT)
            check(caught.value, elapsed)
            assert (await backend.cache_fetch([name], "g"))[0] != [None]

    asyncio.run(scenario())


def test_a_restart_keeps_cache_entries_and_generations(own_server: Any, name: str) -> None:
    with corral.connect(own_server.url, timeout=2) as store:
        backend = store.backend
        data = cached(name)
        backend.cache_store([(name, data, 60.0), (f"{name}-short", data, 0.5)])
        generation = backend.cache_clear(f"gen-{name}")
        own_server.restart()
        time.sleep(0.5)
        # Rows, kept with their expiry, which ran on the server's clock meanwhile.
        assert backend.cache_fetch([name, f"{name}-short"], f"gen-{name}") == (
            [data, None],
            generation,
        )
        assert backend.cache_clear(f"gen-{name}") == generation + 1
