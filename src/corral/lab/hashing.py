"""How many keys move when a cache server leaves, by hashing: `corral lab hashing`.

The experiment behind "losing one of five cache servers with ``crc32 % n``
moves 80% of the keys": place the same keys (1,000,000 by default) on rings of
2 to 10 servers with each of `corral.Ring`'s hashings, and count the keys whose
server changes

- when one server of N leaves (N -> N-1), where the least any placement can
  move is the leaving server's share, 1/N;
- when the pool doubles (2 -> 4) or shrinks to a third (9 -> 3), where the
  least is ``1 - min(a, b) / max(a, b)``: the servers that stay can keep only
  their fair share of the new ring.

It also measures the balance (the most keys any server holds over the mean,
with 5 and 50 servers) and what one `Ring.locate` costs.

Every placement is the ring's own: the tables are read from the `Ring`
objects, and each key is hashed once (its bytes go through MD5, BLAKE2b and
CRC-32 once, not once per ring), then looked up in every ring's table. Each
ring's bulk answer is checked against `Ring.locate` on a sample of keys, so a
change in `corral.Ring` fails the experiment rather than skewing it.
Rendezvous hashes each key once per server, so with 50 servers its balance is
measured on fewer keys (`RENDEZVOUS_BALANCE_KEYS`), and the table says so.

`live` does it on real servers: it writes keys where the ring places them,
takes a server out of the ring and reads every key where the smaller ring
looks for it; the misses are the keys that moved.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import struct
import time
import uuid
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import corral
from corral.core import ring as ring_module
from corral.core.ring import HASHINGS, Ring
from corral.errors import ConfigError

__all__ = [
    "BALANCE_SERVERS",
    "COLUMNS",
    "GROWTH",
    "NAMESPACE",
    "ORDER",
    "RENDEZVOUS_BALANCE_KEYS",
    "Balance",
    "Config",
    "ExperimentFailed",
    "LiveResult",
    "Move",
    "Results",
    "describe",
    "ideal",
    "live",
    "live_table",
    "make_keys",
    "plot",
    "run",
    "server_names",
    "split_url",
    "table",
]

NAMESPACE = "corral-lab"
ORDER = ("modulo", "ketama", "rendezvous", "maglev")
"""The hashings in the order the table shows them: the naive one first."""
assert sorted(ORDER) == sorted(HASHINGS)
COLUMNS = tuple(range(2, 11))
"""N for the moves N -> N-1."""
GROWTH = ((2, 4), (9, 3))
"""The other changes measured: the pool doubles, the pool shrinks to a third."""
BALANCE_SERVERS = (5, 50)
RENDEZVOUS_BALANCE_KEYS = 200_000
"""Keys rendezvous places on 50 servers for the balance (50 hashes per key)."""
LOOKUP_SAMPLE = 5_000
"""Keys `Ring.locate` is timed on, per hashing and ring size."""
CHECK_SAMPLE = 2_000
"""Keys each ring's bulk answer is compared with `Ring.locate` on."""

_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_CHUNK = 20_000


class ExperimentFailed(Exception):
    """The run could not be done as asked; the message says which server or ring, and why."""


@dataclass(frozen=True, slots=True)
class Config:
    """One run; every value is checked here (`ConfigError`)."""

    keys: int = 1_000_000
    hashings: tuple[str, ...] = ORDER

    def __post_init__(self) -> None:
        if isinstance(self.keys, bool) or not isinstance(self.keys, int) or self.keys < 1000:
            raise ConfigError(f"keys must be an integer >= 1000, got {self.keys!r}")
        check_hashings(self.hashings)


def check_hashings(hashings: Sequence[str]) -> None:
    if not hashings:
        raise ConfigError(f"give at least one hashing: {', '.join(ORDER)}")
    unknown = [h for h in hashings if h not in ORDER]
    if unknown:
        raise ConfigError(f"unknown hashing {unknown[0]!r}; the hashings are {', '.join(ORDER)}")
    if len(set(hashings)) != len(hashings):
        raise ConfigError(f"a hashing is given twice in {','.join(hashings)}")


def ideal(before: int, after: int) -> float:
    """The least fraction of keys any placement must move from `before` to `after` servers.

    The servers in both rings can keep at most their fair share of the larger one.
    """
    return 1 - min(before, after) / max(before, after)


def server_names(count: int) -> list[str]:
    """The servers of the experiment's rings: memcached's port, as a real pool has.

    Every ring is a prefix of the same list, so the ring of N-1 servers is
    exactly `Ring(N servers).without(the last)`.
    """
    return [f"10.0.{n // 250}.{n % 250 + 1}:11211" for n in range(count)]


def make_keys(count: int) -> list[str]:
    return [f"user:{n}" for n in range(count)]


@dataclass(frozen=True, slots=True)
class Move:
    before: int
    after: int
    moved: dict[str, float]
    """Per hashing: the fraction of keys whose server changed."""

    @property
    def ideal(self) -> float:
        return ideal(self.before, self.after)


@dataclass(frozen=True, slots=True)
class Balance:
    servers: int
    keys: dict[str, int]
    """Per hashing: how many keys were placed."""
    ratio: dict[str, float]
    """Per hashing: the most keys on one server over the mean."""
    chance: dict[int, float]
    """For each key count above: the expected max/mean of a uniformly random placement."""


@dataclass(frozen=True, slots=True)
class Results:
    config: Config
    moves: list[Move]
    balances: list[Balance]
    lookup: dict[int, dict[str, float]]
    """Per ring size, per hashing: microseconds per `Ring.locate`, on this machine."""
    seconds: float
    """How long the run took."""


# -- placing many keys at once, with the ring's own tables --------------------------------


class _Hashed:
    """Each key's bytes and hashes, computed once for every ring."""

    def __init__(self, keys: list[str], tick: Callable[[float], None]) -> None:
        self.keys = keys
        self.data: list[bytes] = []
        self.md5 = array("I")
        self.blake = array("Q")
        self.crc = array("I")
        md5 = hashlib.md5(usedforsecurity=False)
        blake = hashlib.blake2b(digest_size=8)
        for start in range(0, len(keys), _CHUNK):
            for key in keys[start : start + _CHUNK]:
                data = key.encode()
                self.data.append(data)
                state = md5.copy()
                state.update(data)
                self.md5.append(_U32(state.digest())[0])
                mixed = blake.copy()
                mixed.update(data)
                self.blake.append(_U64(mixed.digest())[0])
                self.crc.append(zlib.crc32(data))
            tick(min(1.0, (start + _CHUNK) / len(keys)))


def _placement(ring: Ring) -> Any:
    """The placement object behind `ring.locate`: its tables are what the bulk lookups read."""
    return getattr(ring._find, "__self__", None)


def _bulk(ring: Ring, hashed: _Hashed, count: int) -> array[int]:
    """The index (in `ring.servers`) of each of the first `count` keys' server."""
    index = {server: n for n, server in enumerate(ring.servers)}
    placement = _placement(ring)
    if isinstance(placement, ring_module._Ketama):
        owners = [index[s] for s in placement._owners]
        values = placement._values
        return array("B", [owners[bisect_left(values, h)] for h in hashed.md5[:count]])
    if isinstance(placement, ring_module._Maglev):
        table = [index[s] for s in placement._table]
        size = placement._size
        return array("B", [table[h % size] for h in hashed.blake[:count]])
    if isinstance(placement, ring_module._Modulo) and placement._plain:
        n = len(ring)
        return array("B", [c % n for c in hashed.crc[:count]])
    if isinstance(placement, ring_module._Rendezvous) and not placement._weighted:
        return _rendezvous(placement._prefixes, hashed.data[:count])[-1]
    # Anything else (a Ring whose insides changed): its own answer, key by key.
    locate = ring.locate
    return array("B", [index[locate(key)] for key in hashed.keys[:count]])


def _rendezvous(prefixes: Sequence[Any], keys: Sequence[bytes]) -> list[array[int]]:
    """For n = 1..len(prefixes): each key's server among the first n servers.

    A key goes to the server with the highest score, the first listed on a tie
    (as `Ring.locate`): the best of the first n+1 is the best of the first n
    unless server n+1 scores strictly higher. So one pass scores each key once
    per server and answers every prefix ring.
    """
    rings: list[array[int]] = [array("B") for _ in prefixes]
    appends = [placed.append for placed in rings]
    for key in keys:
        best = -1
        winner = 0
        for n, prefix in enumerate(prefixes):
            state = prefix.copy()
            state.update(key)
            score = _U64(state.digest())[0]
            if score > best:
                best, winner = score, n
            appends[n](winner)
    return rings


def _check(ring: Ring, placed: array[int], keys: list[str]) -> None:
    """Compare a bulk placement with `Ring.locate` on about `CHECK_SAMPLE` keys spread
    over all of them: it must be the ring's own answer, not a copy that may drift."""
    step = max(1, len(placed) // CHECK_SAMPLE)
    for n in range(0, len(placed), step):
        expected = ring.locate(keys[n])
        if ring.servers[placed[n]] != expected:
            raise ExperimentFailed(
                f"{ring!r}: key {keys[n]!r} was placed on {ring.servers[placed[n]]} in bulk "
                f"but Ring.locate says {expected}; the experiment no longer reads the ring "
                "as it places keys"
            )


def _moved(a: array[int], b: array[int]) -> float:
    return sum(1 for x, y in zip(a, b, strict=True) if x != y) / len(a)


def _ratio(placed: array[int], servers: int) -> float:
    data = placed.tobytes()
    counts = [data.count(n) for n in range(servers)]
    return max(counts) / (len(placed) / servers)


def _chance(servers: int, keys: int, seed: int, draws: int = 200) -> float:
    """The expected max/mean of `keys` keys each on a uniformly random server.

    What chance alone gives any good hash on that many keys: the mean over
    `draws` simulated placements, each drawn server by server (a server's
    count is binomial among the keys left, taken as normal: close enough with
    20 keys per server or more, the least `Config` allows).
    """
    rng = random.Random(seed)
    total = 0
    for _ in range(draws):
        left = keys
        most = 0
        for server in range(servers - 1):
            p = 1 / (servers - server)
            count = round(rng.gauss(left * p, math.sqrt(left * p * (1 - p))))
            count = min(left, max(0, count))
            most = max(most, count)
            left -= count
        total += max(most, left)
    return total / draws / (keys / servers)


def _time_locate(ring: Ring, keys: Sequence[str]) -> float:
    """Microseconds per `ring.locate`, the best of three passes (the least disturbed)."""
    locate = ring.locate
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        for key in keys:
            locate(key)
        best = min(best, time.perf_counter() - start)
    return best / len(keys) * 1e6


Progress = Callable[[int, str, float], None]
"""Called often: the step's index, its name, the fraction of it done."""


def steps(config: Config) -> list[str]:
    """The steps `run` reports progress for, in order."""
    return ["hash keys", *config.hashings, "lookup"]


def run(config: Config, progress: Progress | None = None) -> Results:
    """Place `config.keys` keys with each hashing on every ring the tables need; measure.

    The rings of N and N-1 servers share their first N-1 servers, so "one
    leaves" is always the last listed, and every move is a comparison of two
    placements already made.
    """
    began = time.perf_counter()
    names = steps(config)

    def tick(step: int) -> Callable[[float], None]:
        def report(fraction: float) -> None:
            if progress is not None:
                progress(step, names[step], fraction)

        return report

    keys = make_keys(config.keys)
    hashed = _Hashed(keys, tick(0))
    servers = server_names(max(max(COLUMNS), *BALANCE_SERVERS))
    sizes = sorted({1, *COLUMNS, *(n for pair in GROWTH for n in pair)})
    placed: dict[str, dict[int, array[int]]] = {}
    balance_keys: dict[str, dict[int, int]] = {}
    balance_ratio: dict[str, dict[int, float]] = {}
    for step, hashing in enumerate(config.hashings, start=1):
        report = tick(step)
        work = len(sizes) + len(BALANCE_SERVERS)
        rings = {n: Ring(servers[:n], hashing) for n in sizes}
        if hashing == "rendezvous":
            # One pass answers every prefix ring at once; chunked for the progress bar.
            prefixes = _placement(rings[max(sizes)])._prefixes
            by_size: list[array[int]] = [array("B") for _ in prefixes]
            for start in range(0, config.keys, _CHUNK):
                part = _rendezvous(prefixes, hashed.data[start : start + _CHUNK])
                for whole, piece in zip(by_size, part, strict=True):
                    whole.extend(piece)
                report(min(1.0, (start + _CHUNK) / config.keys) * len(sizes) / work)
            placed[hashing] = {n: by_size[n - 1] for n in sizes}
        else:
            placed[hashing] = {}
            for done, n in enumerate(sizes, start=1):
                placed[hashing][n] = _bulk(rings[n], hashed, config.keys)
                report(done / work)
        for n in sizes:
            _check(rings[n], placed[hashing][n], keys)
        balance_keys[hashing] = {}
        balance_ratio[hashing] = {}
        for done, n in enumerate(BALANCE_SERVERS, start=len(sizes) + 1):
            count = config.keys
            if hashing == "rendezvous" and n > max(sizes):
                count = min(config.keys, RENDEZVOUS_BALANCE_KEYS)
            if n in placed[hashing]:
                layout = placed[hashing][n]
            else:
                ring = Ring(servers[:n], hashing)
                layout = _bulk(ring, hashed, count)
                _check(ring, layout, keys)
            balance_keys[hashing][n] = count
            balance_ratio[hashing][n] = _ratio(layout, n)
            report(done / work)
    moves = [
        Move(
            before,
            after,
            {h: _moved(placed[h][before], placed[h][after]) for h in config.hashings},
        )
        for before, after in [*((n, n - 1) for n in COLUMNS), *GROWTH]
    ]
    balances = []
    for n in BALANCE_SERVERS:
        counts = {h: balance_keys[h][n] for h in config.hashings}
        chance = {count: _chance(n, count, seed=n) for count in sorted(set(counts.values()))}
        ratios = {h: balance_ratio[h][n] for h in config.hashings}
        balances.append(Balance(n, counts, ratios, chance))
    lookup: dict[int, dict[str, float]] = {n: {} for n in BALANCE_SERVERS}
    report = tick(len(names) - 1)
    sample = keys[:: max(1, config.keys // LOOKUP_SAMPLE)][:LOOKUP_SAMPLE]
    jobs = [(n, h) for n in BALANCE_SERVERS for h in config.hashings]
    for done, (n, hashing) in enumerate(jobs, start=1):
        lookup[n][hashing] = _time_locate(Ring(servers[:n], hashing), sample)
        report(done / len(jobs))
    return Results(config, moves, balances, lookup, time.perf_counter() - began)


# -- what it prints -------------------------------------------------------------------


def describe(config: Config) -> str:
    return (
        f"{config.keys:,} keys on rings of 1 to {max(COLUMNS)} servers "
        f"({', '.join(config.hashings)})"
    )


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(row) for row in rows)]


def table(results: Results) -> str:
    """Three tables: the keys moved, the balance, the lookup cost."""
    hashings = results.config.hashings
    lines = [f"keys moved (fraction of {results.config.keys:,}) when the servers change:"]
    lines += _grid(
        ("servers", "ideal", *hashings),
        [
            (
                f"{move.before} -> {move.after}",
                f"{move.ideal:.3f}",
                *(f"{move.moved[h]:.3f}" for h in hashings),
            )
            for move in results.moves
        ],
    )
    lines += [
        "  ideal: the least any placement moves: the leaving server's keys (1/N), or for",
        "  a -> b the share the servers in both rings cannot keep, 1 - min(a,b)/max(a,b);",
        "  below it, the leaving server held less than its share (an uneven ring)",
        "",
        "balance (most keys on one server / mean keys per server; 1.000 is perfect):",
    ]
    rows = []
    notes = []
    for balance in results.balances:
        cells = []
        for h in hashings:
            mark = "*" if balance.keys[h] != results.config.keys else ""
            cells.append(f"{balance.ratio[h]:.3f}{mark}")
        chance = balance.chance.get(results.config.keys, 0)
        rows.append((str(balance.servers), f"{chance:.3f}" if chance else "-", *cells))
        for h in hashings:
            if balance.keys[h] != results.config.keys:
                notes.append(
                    f"  * {h} with {balance.servers} servers: on the first {balance.keys[h]:,} "
                    "keys (one hash per server per key);\n"
                    f"    a random placement of that many keys: "
                    f"{balance.chance[balance.keys[h]]:.3f}"
                )
    lines += _grid(("servers", "random", *hashings), rows)
    lines += [
        "  random: each key on a uniformly random server: what chance alone gives (expected)",
        *notes,
        "",
        "lookup (microseconds per Ring.locate, on this machine):",
    ]
    lines += _grid(
        ("servers", *hashings),
        [
            (str(n), *(f"{results.lookup[n][h]:.2f}" for h in hashings))
            for n in sorted(results.lookup)
        ],
    )
    return "\n".join(lines)


# -- the plot ---------------------------------------------------------------------

_COLOURS = {
    "modulo": "tab:red",
    "ketama": "tab:blue",
    "rendezvous": "tab:green",
    "maglev": "tab:purple",
}


def plot(results: Results, path: str | os.PathLike[str]) -> None:
    """The keys moved per ring size beside the ideal; the growth cases; balance; lookup.

    Needs matplotlib (`pip install 'corral[lab]'`); raises ImportError without it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    hashings = results.config.hashings
    figure = Figure(figsize=(13, 8.5), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, 3, height_ratios=(3, 2))
    moved = figure.add_subplot(grid[0, :2])
    growth = figure.add_subplot(grid[0, 2])
    balance = figure.add_subplot(grid[1, :2])
    lookup = figure.add_subplot(grid[1, 2])

    removals = [m for m in results.moves if m.after == m.before - 1]
    xs = [m.before for m in removals]
    moved.plot(
        xs,
        [m.ideal for m in removals],
        color="black",
        linestyle="--",
        linewidth=1.5,
        label="ideal: 1/N (the leaving server's keys)",
    )
    for h in hashings:
        moved.plot(
            xs,
            [m.moved[h] for m in removals],
            marker="o",
            color=_COLOURS[h],
            label=h,
        )
    five = next((m for m in removals if m.before == 5), None)
    if five is not None and "modulo" in hashings:
        moved.annotate(
            f"5 -> 4 with crc32 % n: {five.moved['modulo']:.0%} of the keys move",
            (5, five.moved["modulo"]),
            xytext=(6.0, 0.68),
            arrowprops={"arrowstyle": "->", "color": "0.3"},
        )
    moved.set_xticks(xs, [f"{n}->{n - 1}" for n in xs])
    moved.set_ylim(0, 1)
    moved.yaxis.set_major_formatter(_percent)
    moved.set_xlabel("servers before -> after one leaves")
    moved.set_ylabel("keys that change server")
    moved.set_title(
        f"One server of N leaves: keys moved ({results.config.keys:,} keys)", loc="left"
    )
    moved.grid(alpha=0.3)
    moved.legend(loc="lower right", bbox_to_anchor=(1.0, 0.24))

    changes = [m for m in results.moves if m.after != m.before - 1]
    width = 0.8 / len(hashings)
    for i, h in enumerate(hashings):
        growth.bar(
            [c + i * width for c in range(len(changes))],
            [m.moved[h] for m in changes],
            width,
            color=_COLOURS[h],
            label=h,
        )
    for c, m in enumerate(changes):
        growth.hlines(
            m.ideal,
            c - width / 2,
            c + (len(hashings) - 0.5) * width,
            colors="black",
            linestyles="--",
        )
    growth.set_xticks(
        [c + (len(hashings) - 1) * width / 2 for c in range(len(changes))],
        [f"{m.before} -> {m.after}" for m in changes],
    )
    growth.set_ylim(0, 1)
    growth.yaxis.set_major_formatter(_percent)
    growth.set_title("The pool doubles, or shrinks to a third\n(dashed: the least possible)")
    growth.grid(axis="y", alpha=0.3)

    groups = results.balances
    for i, h in enumerate(hashings):
        bars = balance.bar(
            [g + i * width for g in range(len(groups))],
            [b.ratio[h] - 1 for b in groups],
            width,
            bottom=1,
            color=_COLOURS[h],
            label=h,
        )
        balance.bar_label(bars, [f"{b.ratio[h]:.3f}" for b in groups], fontsize="x-small")
    for g, b in enumerate(groups):
        level = b.chance.get(results.config.keys)
        if level is not None:
            balance.hlines(
                level,
                g - width / 2,
                g + (len(hashings) - 0.5) * width,
                colors="black",
                linestyles=":",
            )
    balance.set_xticks(
        [g + (len(hashings) - 1) * width / 2 for g in range(len(groups))],
        [f"{b.servers} servers" for b in groups],
    )
    balance.set_ylabel("most keys on a server / mean")
    balance.set_title("Balance (dotted: a uniformly random placement of as many keys)", loc="left")
    top = max(max(b.ratio.values()) for b in groups)
    balance.set_ylim(1, 1 + (top - 1) * 1.25)
    balance.grid(axis="y", alpha=0.3)
    balance.legend(loc="upper left", ncol=len(hashings))

    sizes = sorted(results.lookup)
    for i, h in enumerate(hashings):
        bars = lookup.bar(
            [s + i * width for s in range(len(sizes))],
            [results.lookup[n][h] for n in sizes],
            width,
            color=_COLOURS[h],
            label=h,
        )
        lookup.bar_label(bars, [f"{results.lookup[n][h]:.2g}" for n in sizes], fontsize="x-small")
    lookup.set_yscale("log")
    slowest = max(results.lookup[n][h] for n in sizes for h in hashings)
    lookup.set_ylim(top=slowest * 2)
    lookup.set_xticks(
        [s + (len(hashings) - 1) * width / 2 for s in range(len(sizes))],
        [f"{n} servers" for n in sizes],
    )
    lookup.set_ylabel("µs per Ring.locate")
    lookup.set_title("Lookup cost (this machine)")
    lookup.grid(axis="y", alpha=0.3)
    figure.suptitle(
        "corral lab hashing: what each placement moves when the servers change",
        fontweight="bold",
    )
    figure.savefig(path, dpi=100)


def _percent(value: float, _position: float) -> str:
    return f"{value:.0%}"


# -- live, on real servers --------------------------------------------------------------

_DEFAULT_PORTS = {"memcached": 11211, "redis": 6379, "rediss": 6379}


def split_url(url: str) -> list[tuple[str, str]]:
    """`scheme://[user@]a[:port],b[:port][/path][?query]` as (ring name, URL) per server.

    Each server's URL keeps the scheme, credentials, path and query, so it is
    what `corral.connect` takes for that server alone. A server without a port
    gets its scheme's usual one (memcached 11211, redis 6379); the ring names
    it ``host:port``, as a pool's ring does.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        raise ConfigError(f"{_redacted(url)} is not a URL: give scheme://host:port,host:port")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hosts = netloc.rpartition("@")
    prefix = f"{scheme}://{userinfo}{at}"
    found: list[tuple[str, str]] = []
    for entry in hosts.split(","):
        entry = entry.strip()
        if not entry:
            raise ConfigError(f"{_redacted(url)}: an empty server in the list")
        port_given = entry.rsplit("]", 1)[-1] if entry.startswith("[") else entry
        if ":" not in port_given:
            default = _DEFAULT_PORTS.get(scheme)
            if default is None:
                raise ConfigError(
                    f"{_redacted(url)}: give the port of {entry!r} (host:port); "
                    f"{scheme}:// has no usual port this lab knows"
                )
            entry = f"{entry}:{default}"
        found.append((entry, f"{prefix}{entry}{tail}"))
    # The ring refuses malformed or repeated servers, naming them.
    Ring([name for name, _ in found])
    if len(found) < 2:
        raise ConfigError(
            f"{_redacted(url)}: give at least two servers (scheme://a:port,b:port): the lab "
            "takes one out of the ring"
        )
    return found


def _redacted(url: str) -> str:
    from corral.backends.registry import redact

    try:
        return redact(url)
    except Exception:
        # Whatever cannot be parsed is shown without anything that may be a password.
        scheme, _, rest = url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"


@dataclass(frozen=True, slots=True)
class LiveResult:
    hashing: str
    servers: int
    removed: str
    written: int
    misses: int
    """Keys not found where the smaller ring looks for them: measured."""
    predicted: int
    """Keys whose server differs between the two rings: `Ring.locate`'s answer."""

    @property
    def ideal(self) -> float:
        return ideal(self.servers, self.servers - 1)


def live(
    url: str,
    keys: int = 10_000,
    hashings: Sequence[str] = ORDER,
    progress: Progress | None = None,
) -> list[LiveResult]:
    """Per hashing: write `keys` keys where the ring puts them, take the last server out,
    read each key where the smaller ring looks for it, count the misses; delete the keys.

    Each server is a store of its own (`corral.connect` on its URL alone), so
    what is found where is the servers' answer, not a pool's.
    """
    if isinstance(keys, bool) or not isinstance(keys, int) or keys < 1:
        raise ConfigError(f"live keys must be an integer >= 1, got {keys!r}")
    check_hashings(hashings)
    targets = split_url(url)
    names = [name for name, _ in targets]
    stores: dict[str, corral.Store] = {}
    results = []
    try:
        for name, single in targets:
            try:
                stores[name] = corral.connect(single)
            except corral.BackendError as exc:
                raise ExperimentFailed(f"server {name}: {exc}") from exc
        caches = {name: store.cache(NAMESPACE) for name, store in stores.items()}
        for step, hashing in enumerate(hashings):

            def report(fraction: float, step: int = step, hashing: str = hashing) -> None:
                if progress is not None:
                    progress(step, hashing, fraction)

            results.append(_live_one(hashing, names, caches, keys, report))
    finally:
        for store in stores.values():
            store.close()
    return results


def _live_one(
    hashing: str,
    names: list[str],
    caches: dict[str, corral.Cache],
    count: int,
    report: Callable[[float], None],
) -> LiveResult:
    ring = Ring(names, hashing)
    removed = names[-1]
    smaller = ring.without(removed)
    tag = uuid.uuid4().hex[:8]
    keys = [f"hashing-{tag}-{hashing}-{n}" for n in range(count)]
    anyone = next(iter(caches.values()))
    # A pool places an entry by its key as stored, namespace included.
    before: dict[str, list[str]] = {name: [] for name in names}
    after: dict[str, list[str]] = {name: [] for name in names}
    predicted = 0
    for key in keys:
        stored = anyone.stored_key(key)
        old, new = ring.locate(stored), smaller.locate(stored)
        before[old].append(key)
        after[new].append(key)
        predicted += old != new
    found = 0
    try:
        written = 0
        for name, placed in before.items():
            for start in range(0, len(placed), 500):
                part = placed[start : start + 500]
                caches[name].set_many({key: 1 for key in part}, ttl=600)
                written += len(part)
                report(0.45 * written / count)
            # The cache drops a write the server refused (and counts it).
            _check_served(name, caches[name], "a write")
        done = 0
        for name, wanted in after.items():
            if name == removed:
                continue
            for start in range(0, len(wanted), 500):
                part = wanted[start : start + 500]
                try:
                    found += len(caches[name].get_many(part))
                except corral.CorralError as exc:
                    raise ExperimentFailed(f"server {name}: a read failed: {exc}") from exc
                done += len(part)
                report(0.45 + 0.45 * done / count)
            # The cache reads a failing server as a miss (and counts it): a miss that
            # is not a moved key would be counted as one.
            _check_served(name, caches[name], "a read")
    finally:
        deleted = 0
        for name, placed in before.items():
            for key in placed:
                # Written with a TTL: a key left behind by a failed delete expires.
                with contextlib.suppress(corral.CorralError):
                    caches[name].delete(key)
                deleted += 1
                if deleted % 500 == 0:
                    report(0.9 + 0.1 * deleted / count)
    report(1.0)
    return LiveResult(hashing, len(names), removed, count, count - found, predicted)


def _check_served(name: str, cache: corral.Cache, what: str) -> None:
    if cache.stats().get("backend_errors", 0):
        raise ExperimentFailed(
            f"server {name}: {what} failed (see the warning above), so the misses would "
            "not be the moved keys; nothing measured. Check the server and run it again"
        )


def live_table(results: Sequence[LiveResult]) -> str:
    """Measured misses beside what the ring predicts, per hashing."""
    rows = []
    for r in results:
        rows.append(
            (
                r.hashing,
                f"{r.servers} -> {r.servers - 1}",
                str(r.written),
                str(r.misses),
                f"{r.misses / r.written:.3f}",
                str(r.predicted),
                f"{r.predicted / r.written:.3f}",
                f"{r.ideal:.3f}",
            )
        )
    lines = _grid(
        (
            "hashing",
            "servers",
            "keys",
            "misses",
            "measured",
            "predicted",
            "by Ring",
            "ideal",
        ),
        rows,
    )
    removed = results[0].removed if results else ""
    lines += [
        f"  misses: keys not found where the ring without {removed} looks for them",
        "  predicted: keys whose server Ring.locate changes; a difference is entries the",
        "  servers lost meanwhile (evicted, or flushed)",
    ]
    return "\n".join(lines)
