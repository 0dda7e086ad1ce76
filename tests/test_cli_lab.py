"""`corral lab hashing` and `corral lab coldstart`: the physics they show, and their output.

The experiments' numbers are checked against what must hold whatever the
keys (a consistent ring moves exactly the leaving server's keys; modulo moves
about 1 - 1/N), with tolerances from the number of keys; the commands run as
`python -m corral`, and the live run against real memcached servers.
"""

from __future__ import annotations

import io
import math
import os
import socket
import subprocess
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import Ring
from corral.cli.lab import ProgressBar
from corral.errors import ConfigError
from corral.lab import coldstart, hashing
from corral.testing import servers

TIMEOUT = 120.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KEYS = 20_000


def corral_cmd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    environ["CORRAL_URL"] = f"sqlite:///{tmp_path}/corral.db"
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def sigmas(p: float, n: int, k: float = 5.0) -> float:
    """k standard deviations of a fraction p measured on n keys: the binomial noise."""
    return k * math.sqrt(p * (1 - p) / n)


# -- corral lab hashing ------------------------------------------------------------------


@pytest.fixture(scope="module")
def results() -> hashing.Results:
    return hashing.run(hashing.Config(keys=KEYS))


def moved(results: hashing.Results, before: int, after: int) -> dict[str, float]:
    (move,) = [m for m in results.moves if (m.before, m.after) == (before, after)]
    return move.moved


def test_modulo_moves_most_keys_and_consistent_rings_only_the_leaving_servers(
    results: hashing.Results,
) -> None:
    for n in hashing.COLUMNS:
        got = moved(results, n, n - 1)
        # crc32 % n: a key stays only when its hash mod n equals its hash mod n-1.
        assert abs(got["modulo"] - (1 - 1 / n)) < sigmas(1 - 1 / n, KEYS), (n, got)
        # Rendezvous and maglev share keys evenly: 1/N, give or take the binomial noise
        # (maglev also moves a few slots beside the leaving server's).
        assert abs(got["rendezvous"] - 1 / n) < sigmas(1 / n, KEYS), (n, got)
        assert abs(got["maglev"] - 1 / n) < sigmas(1 / n, KEYS) + 0.01, (n, got)
        # Ketama's arcs are uneven (160 points per server): its share, not 1/N exactly.
        assert abs(got["ketama"] - 1 / n) < 0.06, (n, got)
    five = moved(results, 5, 4)
    assert five["modulo"] > 0.75 and max(five[h] for h in ("ketama", "rendezvous", "maglev")) < 0.25


def test_a_consistent_ring_moves_exactly_the_keys_of_the_server_that_left(
    results: hashing.Results,
) -> None:
    """Not a statistic: with ketama and rendezvous a key moves iff it was on that server."""
    keys = hashing.make_keys(KEYS)
    names = hashing.server_names(5)
    for name in ("ketama", "rendezvous"):
        ring = Ring(names, name)
        share = sum(ring.locate(key) == names[-1] for key in keys) / KEYS
        assert moved(results, 5, 4)[name] == share, name


def test_growing_and_shrinking_by_multiples_is_measured_beside_the_least_possible(
    results: hashing.Results,
) -> None:
    assert hashing.ideal(2, 4) == 0.5
    assert hashing.ideal(9, 3) == pytest.approx(2 / 3)
    assert hashing.ideal(5, 4) == pytest.approx(1 / 5)
    for before, after in hashing.GROWTH:
        least = hashing.ideal(before, after)
        for name, fraction in moved(results, before, after).items():
            # Nobody beats the least by more than the noise (ketama: its uneven arcs).
            slack = 0.06 if name == "ketama" else sigmas(least, KEYS) + 0.01
            assert fraction > least - slack, (before, after, name, fraction)
    # By multiples modulo is at its best: a key mod 4 that is below 2 keeps its mod 2.
    assert abs(moved(results, 2, 4)["modulo"] - 0.5) < sigmas(0.5, KEYS)


def test_balance_is_never_below_one_and_ketama_is_the_least_even(
    results: hashing.Results,
) -> None:
    for balance in results.balances:
        for name in hashing.ORDER:
            assert balance.ratio[name] >= 1.0
            assert balance.chance[balance.keys[name]] >= 1.0
        assert balance.ratio["ketama"] > balance.ratio["maglev"]
    assert all(cost > 0 for costs in results.lookup.values() for cost in costs.values())


def test_a_bulk_placement_that_disagrees_with_the_ring_fails_the_run() -> None:
    keys = hashing.make_keys(3000)
    ring = Ring(hashing.server_names(3), "ketama")
    right = array("B", [ring.servers.index(ring.locate(key)) for key in keys])
    hashing._check(ring, right, keys)
    wrong = array("B", [(n + 1) % 3 for n in right])
    with pytest.raises(hashing.ExperimentFailed, match=r"Ring\.locate"):
        hashing._check(ring, wrong, keys)


def test_lab_hashing_prints_the_tables_and_draws_a_png(tmp_path: Path) -> None:
    plot = tmp_path / "out" / "hashing.png"
    result = corral_cmd(
        tmp_path,
        "lab",
        "hashing",
        "--keys",
        "5000",
        "--hashings",
        "modulo,ketama",
        "--plot",
        str(plot),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("servers  ideal"))
    assert header.split() == ["servers", "ideal", "modulo", "ketama"]
    row = next(line for line in lines if line.startswith("5 -> 4 "))
    ideal, modulo, ketama = (float(cell) for cell in row.split()[3:])
    assert ideal == 0.2 and modulo > 0.7 and ketama < 0.3
    for needed in ("2 -> 4 ", "9 -> 3 ", "balance (", "lookup ("):
        assert any(line.startswith(needed) for line in lines), needed
    assert plot.read_bytes()[:8] == PNG_MAGIC
    # Not a terminal: one progress line per step.
    assert result.stderr.count("lab hashing: step") == len(
        hashing.steps(hashing.Config(keys=5000, hashings=("modulo", "ketama")))
    )


def test_lab_hashing_refuses_bad_arguments(tmp_path: Path) -> None:
    for args in (
        ["--keys", "10"],
        ["--hashings", "modulo,crc"],
        ["--url", "memcached://only-one:11211"],
        ["--url", "memcached://a:1,b:2", "--live-keys", "0"],
    ):
        result = corral_cmd(tmp_path, "lab", "hashing", "--no-plot", *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("corral: "), result.stderr


def test_split_url_gives_each_server_its_own_url_and_keeps_the_password_out_of_errors() -> None:
    assert hashing.split_url("memcached://a,b:11300/?timeout=1") == [
        ("a:11211", "memcached://a:11211/?timeout=1"),
        ("b:11300", "memcached://b:11300/?timeout=1"),
    ]
    assert hashing.split_url("redis://:pw@[::1]:7000,h/2") == [
        ("[::1]:7000", "redis://:pw@[::1]:7000/2"),
        ("h:6379", "redis://:pw@h:6379/2"),
    ]
    for bad in ("redis://:s3cret@a:1,a:1", "redis://:s3cret@a:1,,b:2", "etcd://:s3cret@a,b"):
        with pytest.raises(ConfigError) as caught:
            hashing.split_url(bad)
        assert "s3cret" not in str(caught.value)


@pytest.fixture
def memcacheds(tmp_path: Path) -> Iterator[list[servers.MemcachedServer]]:
    started: list[servers.MemcachedServer] = []
    try:
        for n in range(3):
            try:
                started.append(servers.start_memcached(tmp_path / f"m{n}"))
            except servers.ServerUnavailable as exc:
                from tests.conftest import server_missing

                server_missing(str(exc))
        yield started
    finally:
        for server in started:
            server.stop()


def items_held(server: servers.MemcachedServer) -> int:
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(b"stats\r\n")
        with sock.makefile("rb") as stream:
            for line in stream:
                if line.startswith(b"STAT curr_items "):
                    return int(line.split()[2])
    raise AssertionError("memcached sent no curr_items")


@pytest.mark.backend("memcached")
def test_live_on_three_memcached_servers_the_misses_are_the_keys_the_ring_moves(
    backend_name: str, memcacheds: list[servers.MemcachedServer], tmp_path: Path
) -> None:
    url = "memcached://" + ",".join(f"{s.host}:{s.port}" for s in memcacheds)
    keys = 600
    result = corral_cmd(tmp_path, "lab", "hashing", "--url", url, "--live-keys", str(keys))
    assert result.returncode == 0, result.stderr
    rows = {
        line.split()[0]: line.split()
        for line in result.stdout.splitlines()
        if line.split() and line.split()[0] in hashing.ORDER
    }
    assert list(rows) == list(hashing.ORDER)
    for name, (_, before, _arrow, after, written, misses, _m, predicted, *_) in rows.items():
        assert (before, after, written) == ("3", "2", str(keys))
        # Each key was read where the smaller ring looks: it is there iff it did not move.
        assert misses == predicted, (name, result.stdout)
    assert abs(int(rows["modulo"][5]) / keys - 2 / 3) < sigmas(2 / 3, keys)
    assert abs(int(rows["rendezvous"][5]) / keys - 1 / 3) < sigmas(1 / 3, keys)
    # The keys were deleted: what is left is at most the namespace's generation.
    assert all(items_held(server) <= 1 for server in memcacheds)
    assert not (tmp_path / "hashing.png").exists()  # live prints, it does not plot


# -- corral lab coldstart -----------------------------------------------------------------

SMALL = coldstart.Config(users=2000, seed=7)


def test_fixed_ttl_brings_the_deploy_spike_back_and_jitter_lowers_it() -> None:
    fixed, random_jitter, by_key = coldstart.run(SMALL)
    assert [r.mode.name for r in (fixed, random_jitter, by_key)] == list(coldstart.MODE_NAMES)
    # The deploy is the same for everyone: the same users fill the same keys.
    assert fixed.peaks[0] == random_jitter.peaks[0] == by_key.peaks[0]
    for period in range(1, SMALL.periods + 1):
        assert fixed.peaks[period] > random_jitter.peaks[period], period
        assert fixed.peaks[period] > by_key.peaks[period], period
    # By key the refills drift further apart at every TTL.
    assert by_key.peaks[SMALL.periods] < by_key.peaks[1]
    # Every key misses at the deploy and after each TTL but perhaps the last (whose
    # refill may come after the end): at least `periods` times.
    for result in (fixed, random_jitter, by_key):
        assert result.misses >= SMALL.users * SMALL.keys * SMALL.periods


def test_coldstart_is_deterministic_with_a_seed() -> None:
    first = coldstart.run(SMALL)
    again = coldstart.run(SMALL)
    assert [r.per_second for r in first] == [r.per_second for r in again]
    other = coldstart.run(coldstart.Config(users=2000, seed=8))
    assert [r.per_second for r in first] != [r.per_second for r in other]


def test_coldstart_refuses_bad_values() -> None:
    for bad in ({"users": 0}, {"jitter": 0}, {"jitter": 1.5}, {"ttl": -1}, {"seed": 1.5}):
        with pytest.raises(ConfigError):
            coldstart.Config(**bad)  # type: ignore[arg-type]


def test_lab_coldstart_prints_the_peaks_and_draws_a_png(tmp_path: Path) -> None:
    plot = tmp_path / "coldstart.png"
    args = ["lab", "coldstart", "--users", "1000", "--seed", "3", "--plot", str(plot)]
    result = corral_cmd(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("peak misses/s") and "deploy" in line for line in lines)
    peaks = {}
    for line in lines:
        for label in ("fixed TTL", "jitter ±5%, random", "jitter ±5%, by key"):
            if line.startswith(label):
                peaks[label] = [int(cell.replace(",", "")) for cell in line[len(label) :].split()]
    assert len(peaks) == 3
    assert peaks["fixed TTL"][1] > peaks["jitter ±5%, by key"][1]
    assert plot.read_bytes()[:8] == PNG_MAGIC
    assert corral_cmd(tmp_path, *args).stdout == result.stdout  # the same seed, the same run


@pytest.mark.backend("memcached")
def test_live_with_a_server_down_measures_nothing_and_names_it(
    backend_name: str, memcacheds: list[servers.MemcachedServer], tmp_path: Path
) -> None:
    down = memcacheds[-1]
    down.stop()
    url = "memcached://" + ",".join(f"{s.host}:{s.port}" for s in memcacheds)
    result = corral_cmd(
        tmp_path, "lab", "hashing", "--url", url, "--live-keys", "200", "--hashings", "modulo"
    )
    assert result.returncode == 69, (result.stdout, result.stderr)
    assert f"server {down.host}:{down.port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert "misses" not in result.stdout
    # What was written to the servers that answered was deleted all the same.
    assert all(items_held(server) <= 1 for server in memcacheds[:-1])


def test_progress_of_a_stage_shows_its_fraction_at_a_terminal_and_one_line_in_a_log() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    bar = ProgressBar(["simulate"], None, terminal, lab="coldstart", noun="step")
    bar(0, "simulate", 0.5)
    bar.close()
    assert "50%" in terminal.getvalue() and "\n" not in terminal.getvalue()
    log = io.StringIO()
    bar = ProgressBar(["hash keys", "modulo"], None, log, lab="hashing", noun="step")
    for index, step in enumerate(["hash keys", "modulo"]):
        for tenth in range(10):
            bar(index, step, tenth / 10)
    assert log.getvalue().splitlines() == [
        "corral: lab hashing: step hash keys (1/2)",
        "corral: lab hashing: step modulo (2/2)",
    ]
