"""Backends under test, and the real servers they need.

Every contract test takes `backend_url` and so runs once per backend; a test
that needs a capability (`@pytest.mark.capability("cross_process")`) is only
generated for the backends that declare it, so nothing is silently skipped.
Servers are started once per session on free loopback ports in temporary
folders and stopped by PID at the end; `tests.leftovers` then checks that the
run left no process and no temporary directory behind.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.backends.registry import BACKENDS
from corral.core.capabilities import Capabilities

pytest_plugins = ["tests.leftovers"]

# Backends the contract suite knows, in the order they are reported, and the URL
# scheme of each (etcd runs twice: one node, and a three-member cluster).
SCHEMES = {
    "memory": "memory",
    "sqlite": "sqlite",
    "redis": "redis",
    "memcached": "memcached",
    "etcd": "etcd",
    "etcd-cluster": "etcd",
    "postgres": "postgresql",
    "redlock": "redis+redlock",
    "memcached-pool": "memcached",
    "redis-pool": "redis",
    "redis-cluster": "redis+cluster",
}
ALL_BACKENDS = list(SCHEMES)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def selected_backends(config: pytest.Config) -> list[str]:
    raw = config.getoption("--backends") or os.environ.get("CORRAL_TEST_BACKENDS", "")
    if not raw:
        return list(ALL_BACKENDS)
    wanted = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(ALL_BACKENDS))
    if unknown:
        raise pytest.UsageError(f"unknown backend(s) {unknown}; known: {ALL_BACKENDS}")
    return wanted


def capabilities(name: str) -> Capabilities:
    spec = BACKENDS[SCHEMES[name]]
    module = importlib.import_module(f"corral._async.backends.{spec.module}")
    caps: Capabilities = getattr(module, spec.cls).capabilities
    return caps


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report shows where every thread of this process was at that moment.

    A failure that only a loaded machine brings out (a background worker stuck, a
    pooled thread never started) is then readable from the report alone.
    """
    report: Any = yield
    if call.when == "call" and report.failed:
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        stacks = [
            f"--- thread {names.get(ident, '?')} ({ident})\n"
            + "".join(traceback.format_stack(frame))
            for ident, frame in sys._current_frames().items()
            if ident != threading.get_ident()
        ]
        report.sections.append(("threads at the failure", "\n".join(stacks)))
    return report  # type: ignore[no-any-return]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backends",
        default="",
        help=f"comma-separated backends to test (default: all of {','.join(ALL_BACKENDS)})",
    )
    parser.addoption(
        "--shard",
        default=os.environ.get("CORRAL_TEST_SHARD", ""),
        help="K/N: run only the K-th of N parts of the suite (scripts/test runs the N parts "
        "at once); a backend's tests stay in one part, so each part starts only its servers",
    )


# How long each backend's tests take (and the heavier modules that use no backend), in
# hundreds of seconds of one full run's `--durations=0` on 2 cores: what the parts of a
# sharded run are balanced by. Units not named here weigh 0.1.
SHARD_WEIGHTS = {
    "etcd-cluster": 5.6,
    "postgres": 5.2,
    "etcd": 5.1,
    "memcached": 5.1,
    "memcached-pool": 4.4,
    "redis-cluster": 4.3,
    "redis": 3.2,
    "redis-pool": 3.1,
    "sqlite": 2.7,
    "redlock": 2.6,
    "memory": 1.4,
    "tests/test_etcd_backend.py": 0.9,
    "tests/test_cli.py": 0.6,
    "tests/test_servers.py": 0.4,
    "tests/test_cli_cache.py": 0.4,
}


def shard_plan(units: list[str], parts: int) -> dict[str, int]:
    """Give each unit (a backend, or a module using none) to a part, heaviest first."""
    loads = [0.0] * parts
    plan = {}
    for unit in sorted(units, key=lambda u: (-SHARD_WEIGHTS.get(u, 0.1), u)):
        part = loads.index(min(loads))
        plan[unit] = part
        loads[part] += SHARD_WEIGHTS.get(unit, 0.1)
    return plan


def _shard_unit(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("backend_name") if callspec is not None else None
    if isinstance(backend, str):
        return backend
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        index, parts = (int(part) for part in spec.split("/"))
        if not 1 <= index <= parts:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"--shard must be K/N with 1 <= K <= N, got {spec!r}") from None
    plan = shard_plan(sorted({_shard_unit(item) for item in items}), parts)
    keep = [item for item in items if plan[_shard_unit(item)] == index - 1]
    dropped = [item for item in items if plan[_shard_unit(item)] != index - 1]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_name" not in metafunc.fixturenames:
        return
    names = selected_backends(metafunc.config)
    for marker in metafunc.definition.iter_markers("capability"):
        names = [n for n in names if all(getattr(capabilities(n), c) for c in marker.args)]
    for marker in metafunc.definition.iter_markers("backend"):
        names = [n for n in names if n in marker.args]
    metafunc.parametrize("backend_name", names, scope="session")


def server_missing(message: str) -> None:
    """In CI a missing server is a failure, never a skip."""
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


def start_server(backend_name: str, workdir: Path) -> Any:
    """A fresh server (or cluster) of this backend, on free ports under `workdir`."""
    from corral.testing import servers

    starters = {
        "redis": servers.start_redis,
        "memcached": servers.start_memcached,
        "etcd": servers.start_etcd,
        "etcd-cluster": servers.start_etcd_cluster,
        "postgres": servers.start_postgres,
        "redlock": servers.start_redis_masters,
        "memcached-pool": servers.start_memcached_pool,
        "redis-pool": servers.start_redis_pool,
        "redis-cluster": servers.start_redis_cluster,
    }
    try:
        return starters[backend_name](workdir)
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise


@pytest.fixture(scope="session")
def servers_by_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One server per backend for the whole session, started the first time a test needs it."""
    started: dict[str, Any] = {}

    def get(backend_name: str) -> Any:
        if backend_name not in started:
            workdir = tmp_path_factory.mktemp(backend_name)
            started[backend_name] = start_server(backend_name, workdir)
        return started[backend_name]

    yield {"get": get}
    for server in started.values():
        server.stop()


@pytest.fixture(scope="session")
def sqlite_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sqlite") / "locks.db"


@pytest.fixture(scope="session")
def backend_url(
    backend_name: str, request: pytest.FixtureRequest, servers_by_backend: dict[str, Any]
) -> str:
    if backend_name == "memory":
        return "memory://"
    if backend_name == "sqlite":
        path: Path = request.getfixturevalue("sqlite_path")
        return f"sqlite:///{path}"
    url: str = servers_by_backend["get"](backend_name).url
    return url


@pytest.fixture
def name() -> str:
    """A fresh lock name per test: tests share servers and never flush them."""
    return f"test-{uuid.uuid4().hex[:12]}"
