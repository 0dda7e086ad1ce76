"""`corral cache` and `corral lab stampede`, run as real processes over an SQLite file.

As in test_cli.py, the commands run as `python -m corral` with CORRAL_URL set to a
file of the test's own; what a program sees is checked through the library on
the same file. Failures only a broken server can cause are provoked in-process,
by making the backend's primitive raise. The experiment's arithmetic is tested
on its own functions, with made-up computations whose right answer is known.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from corral._sync.backends.sqlite import SQLiteBackend
from corral.cli.lab import ProgressBar
from corral.cli.main import main
from corral.errors import BackendUnavailable, ConfigError
from corral.lab import stampede
from corral.lab.stampede import Computation, Config, Read, Samples

TIMEOUT = 60.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/corral.db"


@pytest.fixture
def env(tmp_path: Path, url: str) -> dict[str, str]:
    """CORRAL_URL set, so no test can touch the user's default store."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    environ["CORRAL_URL"] = url
    environ["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return environ


@pytest.fixture
def default_env(env: dict[str, str]) -> dict[str, str]:
    """No CORRAL_URL: the embedded default, in a cache directory under the test's."""
    return {k: v for k, v in env.items() if k != "CORRAL_URL"}


Corral = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def corral_cmd(env: dict[str, str], tmp_path: Path) -> Corral:
    def invoke(
        *args: str, environ: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "corral", *args],
            env=env if environ is None else environ,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    return invoke


@pytest.fixture
def cache(url: str) -> Iterator[corral.Cache]:
    """The namespace "default" as a program sees it, on the commands' file."""
    with corral.connect(url) as store:
        yield store.cache()


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, url: str) -> Iterator[Callable[..., int]]:
    """`main()` in this process (so a backend primitive can be made to fail); the
    logging it sets up for the command line is undone afterwards."""
    monkeypatch.setenv("CORRAL_URL", url)
    logger = logging.getLogger("corral")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield lambda *args: main(list(args))
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


# -- corral cache -------------------------------------------------------------------


def test_set_then_get_prints_the_value_as_json(corral_cmd: Corral, cache: corral.Cache) -> None:
    stored = corral_cmd("cache", "set", "greeting", "hello")
    assert stored.returncode == 0, stored.stderr
    assert "'greeting'" in stored.stdout and "sqlite://" in stored.stdout
    got = corral_cmd("cache", "get", "greeting")
    assert got.returncode == 0, got.stderr
    assert got.stdout == '"hello"\n'
    # A program reads what the command wrote, and the other way round.
    assert cache.get("greeting") == "hello"
    cache.set("user:1", {"name": "Ada", "roles": [1, 2]})
    assert json.loads(corral_cmd("cache", "get", "user:1").stdout) == {
        "name": "Ada",
        "roles": [1, 2],
    }


def test_set_json_parses_the_value_and_plain_set_keeps_a_string(
    corral_cmd: Corral, cache: corral.Cache
) -> None:
    assert corral_cmd("cache", "set", "n", "42", "--json").returncode == 0
    assert corral_cmd("cache", "set", "s", "42").returncode == 0
    assert cache.get("n") == 42
    assert cache.get("s") == "42"
    assert corral_cmd("cache", "set", "o", '{"a": [1, null]}', "--json").returncode == 0
    assert cache.get("o") == {"a": [1, None]}


def test_the_embedded_default_is_used_without_a_url(
    corral_cmd: Corral, default_env: dict[str, str], tmp_path: Path
) -> None:
    stored = corral_cmd("cache", "set", "k", "[1]", "--json", environ=default_env)
    assert stored.returncode == 0, stored.stderr
    assert str(tmp_path / "cache" / "corral") in stored.stdout
    got = corral_cmd("cache", "get", "k", environ=default_env)
    assert got.returncode == 0 and got.stdout == "[1]\n"
    assert corral_cmd("cache", "get", "k").returncode == 1  # CORRAL_URL's file is another


def test_set_ttl_and_namespace(corral_cmd: Corral, url: str) -> None:
    result = corral_cmd("cache", "set", "k", "v", "--ttl", "60", "--namespace", "users")
    assert result.returncode == 0, result.stderr
    assert "'users'" in result.stdout and "60.0 s" in result.stdout
    shown = json.loads(corral_cmd("cache", "get", "k", "--namespace", "users", "--json").stdout)
    assert shown["value"] == "v" and shown["namespace"] == "users"
    assert 0 < shown["fresh_for"] <= 60
    with corral.connect(url) as store:
        assert store.cache("users").get("k") == "v"
        assert store.cache().get("k") is None  # another namespace
    missing = corral_cmd("cache", "get", "k")
    assert missing.returncode == 1


def test_get_missing_exits_1_naming_key_namespace_and_server(corral_cmd: Corral, url: str) -> None:
    result = corral_cmd("cache", "get", "nope", "--namespace", "ns")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "'nope'" in result.stderr and "'ns'" in result.stderr
    assert url.removeprefix("sqlite:///") in result.stderr
    assert "not found" in result.stderr


def test_get_json_says_freshness_and_generation(corral_cmd: Corral, cache: corral.Cache) -> None:
    cache.set("k", [1, 2], ttl=100)
    shown = json.loads(corral_cmd("cache", "get", "k", "--json").stdout)
    assert shown["key"] == "k" and shown["value"] == [1, 2]
    assert shown["fresh"] is True and 0 < shown["fresh_for"] <= 100
    assert shown["generation"] == 0 and shown["server"].startswith("sqlite://")
    # clear() hides the entry from the command as from a program; a new one has the
    # namespace's new generation.
    cache.clear()
    assert corral_cmd("cache", "get", "k").returncode == 1
    cache.set("k", "again")
    shown = json.loads(corral_cmd("cache", "get", "k", "--json").stdout)
    assert shown["value"] == "again" and shown["generation"] == 1


def test_get_a_stale_value_only_with_stale(corral_cmd: Corral, url: str) -> None:
    with corral.connect(url) as store:
        keeping = store.cache(stale_ttl=600)
        keeping.set("k", "old")
        assert keeping.invalidate("k")  # stale now, kept 600 s for stale readers
    refused = corral_cmd("cache", "get", "k")
    assert refused.returncode == 1
    assert "stale" in refused.stderr and "--stale" in refused.stderr
    served = corral_cmd("cache", "get", "k", "--stale")
    assert served.returncode == 0 and served.stdout == '"old"\n'
    shown = json.loads(corral_cmd("cache", "get", "k", "--stale", "--json").stdout)
    assert shown["fresh"] is False and shown["fresh_for"] <= 0


def test_get_says_so_for_a_value_it_cannot_read(corral_cmd: Corral, url: str) -> None:
    """A signed pickle needs the writer's hmac_key, which the command does not hold."""
    with corral.connect(url) as store:
        store.cache(serializer="pickle", hmac_key=b"secret").set("k", {1, 2})
    result = corral_cmd("cache", "get", "k")
    assert result.returncode == 1
    assert "'k'" in result.stderr and "cannot read" in result.stderr
    assert "codec 'p'" in result.stderr


def test_delete_exits_1_when_nothing_was_there(corral_cmd: Corral, cache: corral.Cache) -> None:
    cache.set("k", "v")
    deleted = corral_cmd("cache", "delete", "k")
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted" in deleted.stdout
    assert cache.get("k") is None
    again = corral_cmd("cache", "delete", "k")
    assert again.returncode == 1
    assert "'k'" in again.stderr and "nothing to delete" in again.stderr


def test_stats_shows_generation_and_entries(corral_cmd: Corral, url: str) -> None:
    with corral.connect(url) as store:
        users = store.cache("users")
        users.set_many({"a": 1, "b": 2})
        store.cache("other").set("c", 3)
        shown = json.loads(corral_cmd("cache", "stats", "--namespace", "users", "--json").stdout)
        assert shown == {
            "namespace": "users",
            "server": store.server,
            "generation": 0,
            "entries": 2,
        }
        users.clear()
    text = corral_cmd("cache", "stats", "--namespace", "users")
    assert text.returncode == 0, text.stderr
    assert "'users'" in text.stdout and "generation 1" in text.stdout


def test_stats_says_unknown_where_the_server_cannot_count(
    in_process: Callable[..., int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(SQLiteBackend, "cache_count", lambda self, prefix: None)
    assert in_process("cache", "stats") == 0
    assert "entries stored: unknown" in capsys.readouterr().out
    assert in_process("cache", "stats", "--json") == 0
    assert json.loads(capsys.readouterr().out)["entries"] is None


def test_a_failing_server_exits_69_naming_the_key_and_server(
    in_process: Callable[..., int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(self: SQLiteBackend, *args: object) -> None:
        raise BackendUnavailable(f"{self.server}: the file is gone")

    def fail_naming(self: SQLiteBackend, stored: str) -> None:
        raise BackendUnavailable(f"cache entry {stored!r} on {self.server}: could not read it")

    monkeypatch.setattr(SQLiteBackend, "cache_fetch", fail)
    monkeypatch.setattr(SQLiteBackend, "cache_delete", fail)
    for verb in ("get", "delete"):
        assert in_process("cache", verb, "k") == 69
        err = capsys.readouterr().err
        assert "'k'" in err and "sqlite://" in err and "the file is gone" in err
    # A cache drops a write the server refused; the command says so.
    assert in_process("cache", "set", "k", "v") == 69
    err = capsys.readouterr().err
    assert "'k'" in err and "sqlite://" in err and "nothing was stored" in err
    # A backend's message that names the entry and the server already is not repeated.
    monkeypatch.setattr(
        SQLiteBackend,
        "cache_fetch",
        lambda self, keys, gen: fail_naming(self, keys[0]),
    )
    assert in_process("cache", "get", "k") == 69
    err = capsys.readouterr().err
    assert err.count("sqlite://") == 1 and "'default:k'" in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["get", "k", "--namespace", "a:b"], "without ':'"),
        (["set", "k", "v", "--namespace", ""], "non-empty"),
        (["set", "k", "{bad", "--json"], "not JSON"),
        (["set", "k", "NaN", "--json"], "cannot encode"),
        (["set", "k", "v", "--ttl", "0"], "ttl must be > 0"),
        (["set", "k", "v", "--ttl", "soon"], "invalid float value"),
        (["stats", "--namespace", "x:y"], "without ':'"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    corral_cmd: Corral, args: list[str], expected: str
) -> None:
    result = corral_cmd("cache", *args)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_cache_without_a_verb_shows_usage(corral_cmd: Corral) -> None:
    result = corral_cmd("cache")
    assert result.returncode == 2
    assert "get" in result.stdout and "stats" in result.stdout


def test_memory_store_is_refused(corral_cmd: Corral) -> None:
    result = corral_cmd("cache", "get", "k", "--url", "memory://")
    assert result.returncode == 2
    assert "memory://" in result.stderr


# -- the stampede experiment's arithmetic ---------------------------------------------


def test_expiries_group_computations_by_the_value_they_replaced() -> None:
    # A naive cache: three clients miss before the first stores (one expiry, three
    # computations); one client misses after the next expiry.
    naive = [
        Computation(seen=0.00, start=0.01, end=0.06, stored=0.07),
        Computation(seen=0.02, start=0.03, end=0.08, stored=0.09),
        Computation(seen=0.05, start=0.06, end=0.11, stored=0.12),
        Computation(seen=1.10, start=1.10, end=1.15, stored=1.16),
    ]
    found = stampede.expiries(naive)
    assert [len(expiry.computations) for expiry in found] == [3, 1]
    assert [expiry.at for expiry in found] == [0.01, 1.10]
    # One after another, each starting once the previous one stored: one each.
    serial = [Computation(t, t, t + 0.05, t + 0.05) for t in (0.0, 1.05, 2.1, 2.4)]
    assert [len(e.computations) for e in stampede.expiries(reversed(serial))] == [1, 1, 1, 1]
    # Two that overlap (a lock that failed) answer the same expiry.
    overlapping = [Computation(0.0, 0.0, 0.05, 0.05), Computation(0.04, 0.04, 0.09, 0.09)]
    assert [len(e.computations) for e in stampede.expiries(overlapping)] == [2]
    assert stampede.expiries([]) == []


def test_summarize_and_table_print_the_right_numbers() -> None:
    samples = Samples(
        reads=[Read(at / 10, latency / 1000) for at, latency in enumerate([1, 2, 3, 4, 50])],
        computations=[
            Computation(0.0, 0.0, 0.05, 0.06),
            Computation(0.01, 0.01, 0.06, 0.07),
            Computation(1.2, 1.2, 1.25, 1.26),
        ],
    )
    result = stampede.summarize("naive", samples)
    assert (result.reads, result.computes, len(result.expiries)) == (5, 3, 2)
    assert result.per_expiry == 1.5 and result.most == 2
    assert (result.p50, result.p99, result.max) == pytest.approx((3.0, 50.0, 50.0))
    row = stampede.table([result]).splitlines()[1].split()
    assert row == ["naive", "2", "3", "1.50", "2", "5", "3.00", "50.00", "50.00"]


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert stampede.percentile(values, 50) == 50
    assert stampede.percentile(values, 99) == 99
    assert stampede.percentile(values, 100) == 100
    assert stampede.percentile([7.0], 99) == 7.0
    assert stampede.percentile([], 50) != stampede.percentile([], 50)  # nan


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"clients": 0}, "clients"),
        ({"clients": 2, "processes": 3}, "more than clients"),
        ({"ttl": 0}, "ttl must be > 0"),
        ({"seconds": float("inf")}, "seconds"),
        ({"compute": -1}, "compute"),
        ({"modes": ("naive", "fast")}, "unknown mode 'fast'"),
        ({"modes": ()}, "at least one mode"),
    ],
)
def test_config_is_checked(changes: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        Config(url="memory://", **changes)  # type: ignore[arg-type]


def test_config_spreads_clients_over_processes() -> None:
    assert Config(url="memory://", clients=7, processes=3).spread() == [3, 2, 2]


@pytest.mark.parametrize("mode", ["naive", "lock", "background"])
def test_run_mode_records_every_computation(mode: str) -> None:
    """What the clients record is what the caches did: their own counters agree."""
    with stampede.watch_writes(corral.connect("memory://")) as store:
        caches = [
            store.cache(stampede.NAMESPACE, 0.3, **stampede.cache_options(mode, 0.3))
            for _ in range(4)
        ]
        samples = stampede.run_mode(
            caches, mode, "k", begin=time.time(), seconds=1.0, compute=0.02, pause=0.005
        )
        # The store counts for every cache of the namespace together.
        counted = store.cache(stampede.NAMESPACE).stats()
    computed = counted["misses" if mode == "naive" else "computes"]
    assert len(samples.computations) == computed > 0
    assert len(samples.reads) > len(samples.computations)
    for c in samples.computations:
        assert c.seen <= c.start < c.end < c.stored  # the write was seen
    if mode != "naive":
        assert all(len(e.computations) == 1 for e in stampede.expiries(samples.computations))


def test_memory_store_runs_in_one_process_only() -> None:
    with pytest.raises(ConfigError, match="--processes 1"):
        stampede.run(Config(url="memory://", clients=4, processes=2, seconds=0.2))


def test_progress_bar_redraws_in_place_at_a_terminal_only() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    log = io.StringIO()
    bar = ProgressBar(["naive", "lock"], 2.0, log)
    for index, mode in enumerate(["naive", "lock"]):
        for step in range(50):
            bar(index, mode, step / 50)
    bar.close()
    assert log.getvalue().count("\n") == 2  # one line per mode, no redraws
    terminal = Terminal()
    bar = ProgressBar(["naive"], 2.0, terminal)
    bar(0, "naive", 0.5)
    bar.close()
    assert "\r" in terminal.getvalue() and "\n" not in terminal.getvalue()
    assert terminal.getvalue().endswith("\r")


# -- corral lab stampede ----------------------------------------------------------------


def test_lab_stampede_naive_stampedes_and_corral_computes_once_per_expiry(
    corral_cmd: Corral, default_env: dict[str, str], tmp_path: Path
) -> None:
    """On the embedded default, as the demo runs it."""
    plot = tmp_path / "out" / "stampede.png"
    result = corral_cmd(
        "lab",
        "stampede",
        "--clients",
        "6",
        "--processes",
        "2",
        "--ttl",
        "0.5",
        "--seconds",
        "2",
        "--plot",
        str(plot),
        environ=default_env,
    )
    assert result.returncode == 0, result.stderr
    assert str(tmp_path / "cache" / "corral") in result.stdout.splitlines()[0]
    # mode, expiries, computes, per expiry, most in one, reads, latencies...
    rows: dict[str, list[str]] = {}
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("mode "))
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        rows[line.split()[0]] = line.split()[1:]
    assert list(rows) == list(stampede.MODE_NAMES)
    naive = rows.pop("naive")
    assert int(naive[3]) > 1, result.stdout  # some expiry was computed by several clients
    for name, (expiries, computes, per_expiry, most, reads, *_) in rows.items():
        assert (per_expiry, most) == ("1.00", "1"), (name, result.stdout)
        assert computes == expiries and int(reads) > int(computes)
    # Progress on a stderr that is not a terminal: one line per mode.
    assert result.stderr.count("lab stampede: mode") == len(stampede.MODE_NAMES)
    assert plot.read_bytes()[:8] == PNG_MAGIC
    assert str(plot) in result.stdout


def test_lab_stampede_without_matplotlib_prints_the_table_and_says_how(
    corral_cmd: Corral, env: dict[str, str], tmp_path: Path
) -> None:
    hidden = tmp_path / "no-matplotlib"
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('no matplotlib here', name='matplotlib')\n"
    )
    paths = [str(hidden), *filter(None, [env.get("PYTHONPATH")])]
    result = corral_cmd(
        "lab",
        "stampede",
        "--url",
        "memory://",
        "--processes",
        "1",
        "--clients",
        "2",
        "--seconds",
        "0.3",
        "--modes",
        "naive,lock",
        environ={**env, "PYTHONPATH": os.pathsep.join(paths)},
    )
    assert result.returncode == 0, result.stderr
    assert "naive" in result.stdout and "lock" in result.stdout
    assert "corral[lab]" in result.stderr
    assert not (tmp_path / "stampede.png").exists()


# -- corral cache where -----------------------------------------------------------------


def test_where_with_servers_answers_as_the_ring_without_connecting(
    in_process: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    pool = ["a:11211", "b:11211", "c:11211"]
    # Ports nothing listens on: the answer is the ring's, no connection is tried.
    assert in_process("cache", "where", "user:42", "--servers", ",".join(pool)) == 0
    shown = capsys.readouterr().out
    assert shown.rstrip().endswith(": " + corral.Ring(pool).locate("default:user:42"))
    assert "ketama ring of 3 servers" in shown

    def where(*args: str) -> dict[str, object]:
        assert in_process("cache", "where", *args, "--json") == 0
        answer: dict[str, object] = json.loads(capsys.readouterr().out)
        return answer

    weighted = corral.Ring(pool, "rendezvous", [3, 1, 1])
    keys = [f"k{n}" for n in range(40)]
    servers = {
        key: where(key, "--namespace", "users", "--servers", ",".join(pool), "--hashing",
                   "rendezvous", "--weights", "3,1,1")["server"]
        for key in keys
    }  # fmt: skip
    assert servers == {key: weighted.locate(f"users:{key}") for key in keys}
    assert len(set(servers.values())) > 1  # the keys spread: the answer depends on the key
    sharded = where("user:42", "--servers", ",".join(pool), "--shard-key", "tenant-7")
    assert sharded["server"] == corral.Ring(pool).locate("tenant-7")
    assert sharded["placed_by"] == "tenant-7" and sharded["stored"] == "default:user:42"
    assert sharded["hashing"] == "ketama" and sharded["servers"] == pool


def test_where_asks_the_store_and_refuses_contradictory_options(
    in_process: Callable[..., int], capsys: pytest.CaptureFixture[str], url: str
) -> None:
    assert in_process("cache", "where", "user:42", "--json") == 0
    answer = json.loads(capsys.readouterr().out)
    with corral.connect(url) as store:
        assert answer["server"] == store.server == store.backend.locate("default:user:42")
        assert answer["servers"] == [store.server]
    assert answer["hashing"] is None
    for args in (
        ["--servers", "a:11211", "--url", url],
        ["--hashing", "maglev"],
        ["--servers", "a:11211,a:11211"],
        ["--servers", "a:11211,b:11211", "--weights", "2,x"],
        ["--servers", "a:11211", "--namespace", "bad:ns"],
    ):
        assert in_process("cache", "where", "k", *args) == 2, args
        assert "corral: " in capsys.readouterr().err
