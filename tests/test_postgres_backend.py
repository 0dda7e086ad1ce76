"""What only the PostgreSQL backend promises: its schema, its pool, its wake-ups, its faults.

The contract suite already runs every lock behaviour on PostgreSQL; these
tests look at the server itself (tables, sessions, transactions, roles) and
at the faults only a database has (a restart keeps the locks, a killed LISTEN
session, a whole server frozen).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import corral
import corral.aio
from corral.backends.postgres_sql import migration_sql, parse_url
from corral.errors import BackendError, BackendUnavailable, ConfigError
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
        "postgresql://app:pa?ss@h/db": "pa?ss",  # as libpq reads it: up to the first @
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


def test_libpq_parameters_pass_and_unknown_ones_are_named() -> None:
    options = parse_url("postgresql://h/db?sslmode=verify-full&sslrootcert=/ca.pem", {})
    params = conninfo_to_dict(options.conninfo)
    assert (params["sslmode"], params["sslrootcert"]) == ("verify-full", "/ca.pem")
    with pytest.raises(ConfigError) as caught:
        corral.connect("postgresql://h/db?sslmod=require")
    message = str(caught.value)
    for named in ("sslmod", "timeout", "schema", "table_prefix", "max_connections", "libpq"):
        assert named in message


# -- wake-ups -------------------------------------------------------------------------


@pytest.mark.parametrize("length", [20, 20_000])
def test_a_release_elsewhere_wakes_the_waiter_at_once(backend_url: str, length: int) -> None:
    name = (uuid.uuid4().hex * (length // 32 + 1))[:length]
    with corral.connect(backend_url) as holder_store, corral.connect(backend_url) as waiter_store:
        for free in ("release", "force_release"):
            holder = holder_store.lock(name, ttl=30)
            assert holder.acquire()
            woke: list[float] = []

            def wait(store: corral.Store = waiter_store, woke: list[float] = woke) -> None:
                lock = store.lock(name, ttl=30)
                assert lock.acquire(wait=20)
                woke.append(time.monotonic())
                lock.release()

            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(0.3)
            freed_at = time.monotonic()
            if free == "release":
                holder.release()
            else:
                assert holder_store.force_release(name)
            thread.join(30)
            # Well under the one-second re-check: the NOTIFY woke it.
            assert woke and woke[0] - freed_at < 0.5, (free, woke)


def test_a_killed_listen_session_is_replaced(backend_url: str, name: str) -> None:
    app = f"corral-{uuid.uuid4().hex[:8]}"
    url = with_query(backend_url, f"application_name={app}")
    with corral.connect(backend_url) as holder_store, corral.connect(url) as waiter_store:
        for _ in range(2):
            holder = holder_store.lock(name, ttl=30)
            assert holder.acquire()
            result: list[bool] = []
            thread = threading.Thread(
                target=lambda result=result: result.append(
                    waiter_store.lock(name, ttl=30).acquire(wait=20)
                )
            )
            thread.start()
            time.sleep(0.5)
            killed = query(
                backend_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND query LIKE 'LISTEN%%'",
                [app],
            )
            assert killed == [(True,)]
            time.sleep(0.5)  # the waiter re-listens on a new session
            freed_at = time.monotonic()
            holder.release()
            thread.join(30)
            assert result == [True]
            assert time.monotonic() - freed_at < 1.5
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
        assert elapsed < timeout + 1.5

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
