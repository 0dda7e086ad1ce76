"""Tests for the throwaway servers every backend test is built on.

If these helpers leak a process, reuse a port or report "ready" too early,
backend tests fail in ways that look like corral bugs, so they are checked
against the same real binaries here.  A missing binary is a skip on a
developer machine but a failure in CI, where a silently skipped backend would
ship untested.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from corral.testing import servers
from corral.testing.servers import (
    EtcdServer,
    ProcessInfo,
    ServerProcess,
    ServerStartError,
    ServerUnavailable,
    free_port,
    require_binary,
    start_etcd,
    start_etcd_cluster,
    start_memcached,
    start_postgres,
    start_redis,
)

T = TypeVar("T")


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def _started(factory: Callable[[], T]) -> T:
    try:
        return factory()
    except ServerUnavailable as exc:
        if _ci():
            pytest.fail(f"CI is set, so a missing server is an error: {exc}", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture
def launch() -> Iterator[Callable[[Callable[[], Any]], Any]]:
    """Start servers through this so they are stopped even when a test fails."""
    started: list[Any] = []

    def _launch(factory: Callable[[], Any]) -> Any:
        server = _started(factory)
        started.append(server)
        return server

    yield _launch
    for server in reversed(started):
        server.stop()


def _alive(pid: int) -> bool:
    """True if ``pid`` runs; a zombie nobody has reaped yet counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _group_alive(pgid: int) -> bool:
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _assert_gone(server: ServerProcess, pid: int) -> None:
    assert not server.is_running
    assert not _alive(pid), f"pid {pid} still runs after stop()"
    assert not _group_alive(pid), f"helpers of pid {pid} survived stop()"


def _eventually(check: Callable[[], T], timeout: float = 15.0) -> T:
    """Retry ``check`` until it stops raising; for leader elections and replication."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _redis_client(server: servers.RedisServer, **kwargs: Any) -> redis.Redis:
    # No retries: the tests below want the first failure, not the fourth.
    return redis.Redis(host=server.host, port=server.port, retry=Retry(NoBackoff(), 0), **kwargs)


# --------------------------------------------------------------------------- helpers


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_avoids_standard_ports() -> None:
    assert {free_port() for _ in range(20)}.isdisjoint({6379, 5432, 11211, 2379, 2380})


def test_require_binary_finds_executables() -> None:
    assert os.access(require_binary("sh"), os.X_OK)


def test_require_binary_names_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(servers, "_EXTRA_BIN_DIRS", ())
    monkeypatch.setattr(servers, "_postgres_bindirs", lambda: ())
    with pytest.raises(ServerUnavailable, match="apt-get install -y etcd-server"):
        require_binary("etcd")
    with pytest.raises(ServerUnavailable, match="apt-get install -y postgresql"):
        require_binary("initdb")
    with pytest.raises(ServerUnavailable, match="corral-no-such-binary"):
        require_binary("corral-no-such-binary")


# --------------------------------------------------------------------------- process trees


def _states(procs: list[ProcessInfo]) -> dict[int, str]:
    now = {p.pid: servers.process_info(p.pid) for p in procs}
    return {pid: info.state for pid, info in now.items() if info is not None}


def _assert_all_gone(procs: list[ProcessInfo], what: str) -> None:
    left = [
        f"{p.pid} {servers.process_info(p.pid)} {servers.command_line(p.pid)}"
        for p in procs
        if servers.is_current(p)
    ]
    assert not left, f"{what} left: {left}"


def _tree_of_size(pid: int, size: int) -> list[ProcessInfo]:
    def grown() -> list[ProcessInfo]:
        tree = servers.process_tree(pid)
        assert len(tree) == size, tree
        return tree

    return _eventually(grown)


@pytest.fixture
def forking_shell() -> Iterator[subprocess.Popen[bytes]]:
    """A shell with a child and a grandchild, all sleeping."""
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sh -c 'sleep 300 & wait' & wait"])
    # Remembered now: once a test kills the shell, its children are no
    # longer found through it.
    tree = _tree_of_size(proc.pid, 4)
    yield proc
    servers.kill_processes(tree)
    proc.wait()


def test_freeze_tree_stops_every_descendant_until_continued(
    forking_shell: subprocess.Popen[bytes],
) -> None:
    tree = servers.process_tree(forking_shell.pid)
    frozen = servers.freeze_tree(forking_shell.pid)
    assert {p.key for p in frozen} == {p.key for p in tree}
    assert set(_states(tree).values()) == {"T"}
    servers.continue_processes(frozen)

    def running() -> None:
        assert "T" not in _states(tree).values()

    _eventually(running)


def test_kill_processes_ends_stopped_processes_too(
    forking_shell: subprocess.Popen[bytes],
) -> None:
    tree = servers.process_tree(forking_shell.pid)
    servers.freeze_tree(forking_shell.pid)
    assert servers.kill_processes(tree) == []
    _assert_all_gone(tree, "kill_processes")


def test_signal_process_spares_a_process_that_reused_the_pid(
    forking_shell: subprocess.Popen[bytes],
) -> None:
    shell = servers.process_info(forking_shell.pid)
    assert shell is not None and shell.running
    impostor = ProcessInfo(pid=shell.pid, ppid=shell.ppid, state="S", start=shell.start - 1)
    assert not servers.signal_process(impostor, signal.SIGKILL)
    assert not servers.is_current(impostor)
    assert servers.is_current(shell)
    assert servers.signal_process(shell, signal.SIGKILL)
    forking_shell.wait()
    assert not servers.is_current(shell)


# --------------------------------------------------------------------------- Redis


def test_redis_answers_and_stop_ends_the_process(tmp_path: Path) -> None:
    server = _started(lambda: start_redis(tmp_path))
    try:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.port not in (6379, 0)
        client = _redis_client(server)
        assert client.ping()
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert server.workdir.parent == tmp_path
        assert server.log_path.is_file()
        client.close()
    finally:
        pid = server.pid
        server.stop()
    _assert_gone(server, pid)
    server.stop()  # idempotent


def test_redis_restart_keeps_the_port(launch: Callable[..., Any], tmp_path: Path) -> None:
    server = launch(lambda: start_redis(tmp_path))
    port, first_pid = server.port, server.pid
    server.kill()
    assert not _alive(first_pid)
    server.restart()
    assert server.port == port
    assert server.pid != first_pid
    assert _redis_client(server).ping()
    server.restart()  # from running, too
    assert _redis_client(server).ping()


def test_redis_pause_makes_it_hang_until_resume(launch: Callable[..., Any], tmp_path: Path) -> None:
    server = launch(lambda: start_redis(tmp_path))
    client = _redis_client(server, socket_timeout=0.5)
    assert client.ping()
    server.pause()
    try:
        with pytest.raises(redis.TimeoutError):
            client.ping()
    finally:
        server.resume()
    assert _redis_client(server).ping()


def test_stopping_a_paused_server_works(tmp_path: Path) -> None:
    server = _started(lambda: start_redis(tmp_path))
    pid = server.pid
    server.pause()
    server.stop()
    _assert_gone(server, pid)
    # It acted on the stop signal, so it was continued: not SIGKILLed after the timeout.
    assert server.popen is not None and server.popen.returncode == 0


def test_redis_password_refuses_unauthenticated_clients(
    launch: Callable[..., Any], tmp_path: Path
) -> None:
    server = launch(lambda: start_redis(tmp_path, password="s3cret/with:odd@chars"))
    with pytest.raises(redis.AuthenticationError):
        _redis_client(server).ping()
    assert server.url == (f"redis://:s3cret%2Fwith%3Aodd%40chars@127.0.0.1:{server.port}/0")
    assert redis.Redis.from_url(server.url).ping()
    assert _redis_client(server, password=server.password).ping()
    acl = _redis_client(server, username=server.username, password=server.password)
    assert acl.acl_whoami() == "corral"


def test_redis_tls_verifies_with_the_generated_ca(
    launch: Callable[..., Any], tmp_path: Path
) -> None:
    server = launch(lambda: start_redis(tmp_path, tls=True))
    assert server.url == f"rediss://127.0.0.1:{server.port}/0"
    assert server.ca_file is not None and server.ca_file.is_file()
    assert server.cert_file is not None and server.cert_file.is_file()
    assert server.key_file is not None and server.key_file.is_file()
    client = _redis_client(server, ssl=True, ssl_ca_certs=str(server.ca_file))
    assert client.ping()
    assert redis.Redis.from_url(server.url, ssl_ca_certs=str(server.ca_file)).ping()
    with pytest.raises(redis.ConnectionError):
        _redis_client(server, socket_timeout=2).ping()  # plain text on the TLS port
    with pytest.raises(redis.ConnectionError):
        _redis_client(server, ssl=True, socket_timeout=2).ping()  # system CAs do not know it


def test_redis_replica_follows_its_master(launch: Callable[..., Any], tmp_path: Path) -> None:
    master = launch(lambda: start_redis(tmp_path))
    replica = launch(lambda: start_redis(tmp_path, replica_of=master))
    assert replica.workdir != master.workdir
    info = _redis_client(replica).info("replication")
    assert info["role"] == "slave"
    assert info["master_link_status"] == "up"
    assert info["master_port"] == master.port
    _redis_client(master).set("replicated", "yes")

    def replicated() -> None:
        assert _redis_client(replica).get("replicated") == b"yes"

    _eventually(replicated, timeout=5)


def test_redis_replica_of_a_password_master(launch: Callable[..., Any], tmp_path: Path) -> None:
    master = launch(lambda: start_redis(tmp_path, password="pw"))
    replica = launch(lambda: start_redis(tmp_path, replica_of=master))
    assert _redis_client(replica).info("replication")["master_link_status"] == "up"


def test_start_error_carries_the_server_log(tmp_path: Path) -> None:
    server = _started(lambda: start_redis(tmp_path))
    try:
        server.stop()
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", server.port))
            squatter.listen()
            with pytest.raises(ServerStartError) as info:
                server.start()
        assert info.value.port_in_use
        assert "already in use" in str(info.value)
        assert str(server.log_path) in str(info.value)
        assert not server.is_running
        server.start()  # the port is free again
        assert _redis_client(server).ping()
    finally:
        server.stop()


def test_port_taken_before_the_server_binds_is_retried(
    launch: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulates a parallel test run grabbing the port between free_port() and bind().
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        real_free_port = servers.free_port
        monkeypatch.setattr(servers, "free_port", lambda: next(ports, None) or real_free_port())
        server = launch(lambda: start_redis(tmp_path))
        assert server.port != taken
        assert _redis_client(server).ping()
        assert "already in use" in server.log_path.read_text()


# --------------------------------------------------------------------------- memcached


def test_memcached_answers_and_stops(tmp_path: Path) -> None:
    server = _started(lambda: start_memcached(tmp_path, memory_mb=16))
    try:
        assert server.url == f"memcached://127.0.0.1:{server.port}"
        with socket.create_connection((server.host, server.port), timeout=2) as sock:
            talk = sock.makefile("rwb")
            talk.write(b"set k 0 0 1\r\nv\r\nget k\r\nstats\r\n")
            talk.flush()
            assert talk.readline() == b"STORED\r\n"
            assert talk.readline().startswith(b"VALUE k 0 1")
            assert talk.readline() == b"v\r\n"
            assert talk.readline() == b"END\r\n"
            stats = {}
            while (line := talk.readline()) != b"END\r\n":
                _, key, value = line.decode().split()
                stats[key] = value
            assert stats["limit_maxbytes"] == str(16 * 1024 * 1024)
    finally:
        pid = server.pid
        server.stop()
    _assert_gone(server, pid)


# --------------------------------------------------------------------------- etcd


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _etcd_put(member: EtcdServer, key: str, value: str) -> None:
    with httpx.Client(base_url=member.client_url, timeout=3, trust_env=False) as http:
        response = http.post("/v3/kv/put", json={"key": _b64(key), "value": _b64(value)})
        response.raise_for_status()
        assert "header" in response.json()


def _etcd_get(member: EtcdServer, key: str) -> str | None:
    with httpx.Client(base_url=member.client_url, timeout=3, trust_env=False) as http:
        response = http.post("/v3/kv/range", json={"key": _b64(key)})
        response.raise_for_status()
        kvs = response.json().get("kvs", [])
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


def test_etcd_answers_health_and_kv(tmp_path: Path) -> None:
    server = _started(lambda: start_etcd(tmp_path))
    try:
        assert server.url == f"etcd://127.0.0.1:{server.port}"
        assert server.peer_port not in (server.port, 2379, 2380)
        health = httpx.get(f"{server.client_url}/health", timeout=3, trust_env=False)
        assert health.json()["health"] == "true"
        _etcd_put(server, "corral/test", "hello")
        assert _etcd_get(server, "corral/test") == "hello"
        assert _etcd_get(server, "corral/missing") is None
    finally:
        pid = server.pid
        server.stop()
    _assert_gone(server, pid)


def test_etcd_cluster_survives_losing_a_member(tmp_path: Path) -> None:
    cluster = _started(lambda: start_etcd_cluster(tmp_path, size=3))
    try:
        assert len(cluster.members) == 3
        ports = [m.port for m in cluster.members]
        assert len(set(ports)) == 3
        assert cluster.url == "etcd://" + ",".join(f"127.0.0.1:{p}" for p in ports)
        assert len({m.name for m in cluster.members}) == 3
        first, second, third = cluster.members
        _etcd_put(first, "before", "1")
        pid = first.pid
        first.stop()
        _assert_gone(first, pid)
        # The stopped member may have been the leader: allow for an election.
        _eventually(lambda: _etcd_put(second, "after", "2"))
        assert _eventually(lambda: _etcd_get(third, "after")) == "2"
        assert _etcd_get(third, "before") == "1"
        assert second.is_running and third.is_running
    finally:
        pids = [m.pid for m in cluster.members]
        cluster.stop()
    for member, pid in zip(cluster.members, pids, strict=True):
        _assert_gone(member, pid)


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_answers_and_keeps_data_across_restart(tmp_path: Path) -> None:
    server = _started(lambda: start_postgres(tmp_path))
    try:
        assert server.url == f"postgresql://corral@127.0.0.1:{server.port}/corral"
        assert server.port != 5432
        with psycopg.connect(server.url, connect_timeout=5, autocommit=True) as conn:
            row = conn.execute("select current_user, current_database(), 1").fetchone()
            assert row == ("corral", "corral", 1)
            encoding = conn.execute("show server_encoding").fetchone()
            assert encoding == ("UTF8",)
            conn.execute("create table kept (v int)")
            conn.execute("insert into kept values (42)")
        # A client still connected must not block the stop (fast shutdown).
        idle = psycopg.connect(server.url, connect_timeout=5)
        old_pid = server.pid
        server.restart()
        assert not _group_alive(old_pid)
        idle.close()
        with psycopg.connect(server.url, connect_timeout=5) as conn:
            assert conn.execute("select v from kept").fetchone() == (42,)
    finally:
        pid = server.pid
        server.stop()
    _assert_gone(server, pid)


def test_postgres_recovers_after_kill(launch: Callable[..., Any], tmp_path: Path) -> None:
    server = launch(lambda: start_postgres(tmp_path))
    pid = server.pid
    server.kill()
    assert not _group_alive(pid), "backends outlived a killed postmaster"
    server.restart()
    with psycopg.connect(server.url, connect_timeout=5) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_postgres_in_a_deeply_nested_workdir(launch: Callable[..., Any], tmp_path: Path) -> None:
    # Unix socket paths are limited to 107 bytes; a long tmp_path must not
    # stop PostgreSQL from starting.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    server = launch(lambda: start_postgres(deep))
    assert len(str(server.socket_dir / f".s.PGSQL.{server.port}")) < 108
    with psycopg.connect(server.url, connect_timeout=5) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


@pytest.fixture
def busy_postgres(
    launch: Callable[..., Any], tmp_path: Path
) -> Iterator[tuple[servers.PostgresServer, list[psycopg.Connection[Any]]]]:
    """A PostgreSQL with two client connections, so it has backends too."""
    server = launch(lambda: start_postgres(tmp_path))
    clients = [psycopg.connect(server.url, connect_timeout=5, autocommit=True) for _ in range(2)]
    for client in clients:
        assert client.execute("select 1").fetchone() == (1,)
    yield server, clients
    for client in clients:
        client.close()


BusyPostgres = tuple[servers.PostgresServer, list["psycopg.Connection[Any]"]]


def test_pause_stops_every_postgres_process_and_resume_continues_them(
    busy_postgres: BusyPostgres,
) -> None:
    server, clients = busy_postgres
    tree = servers.process_tree(server.pid)
    assert len(tree) >= 4, "expected the postmaster, its helpers and two backends"
    server.pause()
    assert set(_states(tree).values()) == {"T"}, "a PostgreSQL process kept running"
    server.resume()

    def running() -> None:
        assert "T" not in _states(tree).values()

    _eventually(running)
    for client in clients:
        assert client.execute("select 2").fetchone() == (2,)


def test_stopping_a_paused_postgres_leaves_none_of_its_processes(
    busy_postgres: BusyPostgres,
) -> None:
    # The fault tests pause a server mid-wait and then stop it: the backends
    # stayed stopped, orphaned, for ever.
    server, _ = busy_postgres
    tree = servers.process_tree(server.pid)
    server.pause()
    server.stop()
    _assert_all_gone(tree, "stopping a paused PostgreSQL")
    assert not server.is_running
    # A clean fast shutdown, not the SIGKILL that follows the stop timeout.
    assert server.popen is not None and server.popen.returncode == 0


def test_killing_a_paused_postgres_leaves_none_of_its_processes(
    busy_postgres: BusyPostgres,
) -> None:
    server, _ = busy_postgres
    tree = servers.process_tree(server.pid)
    server.pause()
    server.kill()
    _assert_all_gone(tree, "killing a paused PostgreSQL")
    server.restart()  # nothing of the old server holds its shared memory
    with psycopg.connect(server.url, connect_timeout=5) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_stop_finds_helpers_of_a_postmaster_killed_behind_its_back(
    busy_postgres: BusyPostgres,
) -> None:
    # A test may SIGKILL the server by pid while it is paused: its stopped
    # helpers are adopted elsewhere, out of the server's tree, and only the
    # list pause() kept still leads to them.
    server, _ = busy_postgres
    tree = servers.process_tree(server.pid)
    server.pause()
    os.kill(server.pid, signal.SIGKILL)
    server.stop()
    _assert_all_gone(tree, "stopping a PostgreSQL whose postmaster was killed while paused")


def test_stop_continues_processes_a_test_stopped_by_hand(
    busy_postgres: BusyPostgres,
) -> None:
    server, _ = busy_postgres
    tree = servers.process_tree(server.pid)
    for proc in tree:  # as tests/test_postgres_backend.py's freeze() does
        os.kill(proc.pid, signal.SIGSTOP)
    server.stop()
    _assert_all_gone(tree, "stopping a PostgreSQL frozen by hand")


# --------------------------------------------------------------------------- cleanup


def _run_child(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    src = Path(servers.__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    script = textwrap.dedent(
        """
        import os, signal, sys
        from pathlib import Path
        from corral.testing.servers import ServerUnavailable, start_redis
        try:
            server = start_redis(Path(sys.argv[1]))
        except ServerUnavailable as exc:
            print("unavailable", exc, flush=True)
            sys.exit(0)
        print(server.pid, flush=True)
        """
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def _child_server_pid(result: subprocess.CompletedProcess[str]) -> int:
    first = result.stdout.split("\n", 1)[0]
    if first.startswith("unavailable"):
        if _ci():
            pytest.fail(first, pytrace=False)
        pytest.skip(first)
    assert first.isdigit(), result.stdout + result.stderr
    return int(first)


def test_crashed_test_run_leaves_no_server_behind(tmp_path: Path) -> None:
    result = _run_child(tmp_path, "raise RuntimeError('test run crashed')")
    pid = _child_server_pid(result)
    assert "test run crashed" in result.stderr
    assert not _alive(pid)


@pytest.mark.skipif(servers._setpriv() is None, reason="setpriv --pdeathsig unavailable")
def test_killed_test_run_leaves_no_server_behind(tmp_path: Path) -> None:
    result = _run_child(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    pid = _child_server_pid(result)
    assert result.returncode == -signal.SIGKILL

    def gone() -> None:
        assert not _alive(pid)

    _eventually(gone, timeout=10)


# --------------------------------------------------------------------------- the end-of-run check
#
# tests/leftovers.py fails the run if anything of it is left once every fixture
# is torn down.  Each test below runs pytest with that plugin on a test file of
# its own, in a separate process, and looks at what is left after it.

REPO = Path(__file__).resolve().parents[1]

# What every inner test file starts with: helpers to hand facts to the outer test.
INNER_PRELUDE = """
import json, os, signal, subprocess, sys, tempfile, time
from pathlib import Path
import psycopg
import pytest
from corral.testing import servers

def note(**facts):
    with open(os.environ["INNER_NOTES"], "a") as f:
        f.write(json.dumps(facts) + "\\n")

def note_processes(procs):
    note(processes=[[p.pid, p.start] for p in procs])
"""


def _require(binary: str) -> None:
    _started(lambda: require_binary(binary))


class InnerRun:
    """pytest with tests/leftovers.py on one test file, in a process of its own."""

    def __init__(self, tmp_path: Path, *sources: str) -> None:
        self.dir = tmp_path / "inner"
        self.dir.mkdir()
        (self.dir / "pytest.ini").write_text(
            "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
        )
        (self.dir / "test_inner.py").write_text(
            "".join(textwrap.dedent(source) for source in (INNER_PRELUDE, *sources))
        )
        self.notes_path = tmp_path / "notes.jsonl"
        self.temproot = tmp_path / "temproot"  # where the inner pytest keeps tmp_path
        self.temproot.mkdir()
        env = dict(os.environ, INNER_NOTES=str(self.notes_path))
        env["PYTEST_DEBUG_TEMPROOT"] = str(self.temproot)
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "pytest", "-q", "-W", "ignore::DeprecationWarning"),
                *("-p", "tests.leftovers", "-p", "no:cacheprovider", str(self.dir)),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output = ""

    def finish(self, timeout: float = 180) -> int:
        try:
            self.output, _ = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        return self.proc.returncode

    def notes(self) -> list[dict[str, Any]]:
        if not self.notes_path.exists():
            return []
        return [json.loads(line) for line in self.notes_path.read_text().splitlines()]

    def noted_processes(self) -> list[ProcessInfo]:
        procs = [
            ProcessInfo(pid=pid, ppid=0, state="?", start=start)
            for note in self.notes()
            for pid, start in note.get("processes", [])
        ]
        assert procs, f"the inner run noted no process:\n{self.output}"
        return procs

    def wait_for_note(self, key: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for note in self.notes():
                if key in note:
                    return note
            assert self.proc.poll() is None, f"the inner run ended early:\n{self.finish()}"
            time.sleep(0.05)
        raise AssertionError(f"the inner run noted no {key!r} within {timeout} s")


@pytest.fixture
def inner(tmp_path: Path) -> Iterator[Callable[..., InnerRun]]:
    runs: list[InnerRun] = []

    def start(*sources: str) -> InnerRun:
        run = InnerRun(tmp_path, *sources)
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.communicate()


def test_the_end_of_run_check_fails_the_run_and_names_what_was_left(
    inner: Callable[..., InnerRun],
) -> None:
    _require("redis-server")
    run = inner(
        """
        def test_passes():
            pass

        def test_leaves_things_behind(tmp_path):
            sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(301)"])
            # A grandchild whose parent is gone: adopted, not lost.
            subprocess.run(["sh", "-c", "sleep 302 & echo $! > orphan"], cwd=tmp_path, check=True)
            orphan = servers.process_info(int((tmp_path / "orphan").read_text()))
            server = servers.start_redis(tmp_path, password="hunter2")
            server.pause()  # and never resumed nor stopped
            note_processes([servers.process_info(sleeper.pid), orphan, *server._paused])
            note(tempdir=tempfile.mkdtemp(), password=server.password)
        """
    )
    assert run.finish() == pytest.ExitCode.TESTS_FAILED, run.output
    assert "1 failed, 2 passed" in run.output
    assert "FAILED tests/leftovers.py::the run leaves nothing behind" in run.output
    procs = run.noted_processes()
    for proc in procs:
        assert f"pid {proc.pid} " in run.output, run.output
    assert "time.sleep(301)" in run.output and "sleep 302" in run.output
    assert "redis-server" in run.output and "state T" in run.output
    assert "RedisServer" in run.output and "was never stopped" in run.output
    # "started during A or B" when both tests started within one clock tick.
    assert re.search(r"started during [^)]*test_inner.py::test_leaves_things_behind", run.output)
    notes = {k: v for note in run.notes() for k, v in note.items()}
    assert notes["tempdir"] in run.output
    assert notes["password"] not in run.output
    _assert_all_gone(procs, "the end-of-run check")
    assert not Path(notes["tempdir"]).exists()


def test_a_clean_run_passes_and_removes_its_temporary_directories(
    inner: Callable[..., InnerRun],
) -> None:
    _require("redis-server")
    run = inner(
        """
        @pytest.fixture
        def redis_server(tmp_path):
            server = servers.start_redis(tmp_path)
            yield server
            server.stop()

        def test_uses_a_server(redis_server, tmp_path):
            note_processes(servers.process_tree(redis_server.pid))
            note(tmpdir=os.environ["TMPDIR"], tmp_path=str(tmp_path))
            (tmp_path / "data").write_text("kept while the test runs")
            with tempfile.TemporaryDirectory() as scratch:
                Path(scratch, "f").write_text("removed by the test itself")
        """
    )
    assert run.finish() == pytest.ExitCode.OK, run.output
    assert "left once every fixture was torn down" not in run.output, run.output
    _assert_all_gone(run.noted_processes(), "a clean run")
    notes = {k: v for note in run.notes() for k, v in note.items()}
    assert not Path(notes["tmpdir"]).exists()
    assert not Path(notes["tmp_path"]).exists()
    assert Path(notes["tmpdir"]).name.startswith("corral-run-")


POSTGRES_FIXTURE = """
@pytest.fixture
def postgres(tmp_path):
    server = servers.start_postgres(tmp_path)
    yield server
    server.stop()

def pause_with_a_backend(server):
    client = psycopg.connect(server.url, connect_timeout=5)
    server.pause()
    note_processes(server._paused)
    return client
"""


def test_a_test_timing_out_while_postgres_is_paused_leaves_no_process(
    inner: Callable[..., InnerRun],
) -> None:
    _require("postgres")
    run = inner(
        POSTGRES_FIXTURE,
        """
        @pytest.mark.timeout(5, func_only=True)
        def test_pauses_postgres_then_hangs(postgres):
            client = pause_with_a_backend(postgres)
            time.sleep(600)
        """,
    )
    assert run.finish() == pytest.ExitCode.TESTS_FAILED, run.output
    assert "Timeout" in run.output
    assert "left once every fixture was torn down" not in run.output, run.output
    procs = run.noted_processes()
    assert len(procs) >= 4, "expected the postmaster, its helpers and a backend"
    _assert_all_gone(procs, "a test that timed out with PostgreSQL paused")


def test_ctrl_c_while_postgres_is_paused_leaves_no_process(
    inner: Callable[..., InnerRun],
) -> None:
    _require("postgres")
    run = inner(
        POSTGRES_FIXTURE,
        """
        def test_pauses_postgres_then_hangs(postgres):
            client = pause_with_a_backend(postgres)
            time.sleep(600)
        """,
    )
    run.wait_for_note("processes")
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == pytest.ExitCode.INTERRUPTED, run.output
    assert "KeyboardInterrupt" in run.output
    assert "left once every fixture was torn down" not in run.output, run.output
    _assert_all_gone(run.noted_processes(), "a run interrupted with PostgreSQL paused")


def test_a_killed_run_leaves_no_process_behind(inner: Callable[..., InnerRun]) -> None:
    # SIGKILL (or the OOM killer, or pytest-timeout's thread method) skips every
    # teardown; the run's guardian cleans up, stopped PostgreSQL helpers included.
    _require("postgres")
    run = inner(
        POSTGRES_FIXTURE,
        """
        def test_pauses_postgres_then_dies(postgres):
            client = pause_with_a_backend(postgres)
            holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(303)"])
            note_processes([servers.process_info(holder.pid)])
            note(tmpdir=os.environ["TMPDIR"])
            os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    assert run.finish() == -signal.SIGKILL, run.output
    procs = run.noted_processes()
    assert len(procs) >= 5, "expected PostgreSQL's processes and the holder"
    tmpdir = Path(next(n["tmpdir"] for n in run.notes() if "tmpdir" in n))

    def cleaned_up() -> None:
        _assert_all_gone(procs, "a run killed with PostgreSQL paused")
        assert not tmpdir.exists(), f"{tmpdir} was kept"

    _eventually(cleaned_up, timeout=30)
