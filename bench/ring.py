"""corral's key placement (`corral.Ring`) beside its peers: speed, balance, keys moved.

    python -m bench.ring                  # full run (a few minutes)
    python -m bench.ring --quick          # a smoke run, not for numbers
    python -m bench.ring --output FILE    # also write the markdown table to FILE

No server: placement is pure computation. For each placement:

1. Lookup: microseconds per key (5 and 50 servers), `map` over 20,000
   distinct keys, interleaved in rounds so machine noise hits every
   contender alike; the median round. Building the ring is timed once.
2. Balance: the busiest server's keys over the mean (1.000 is perfect), over
   1,000,000 keys ("key:0", "key:1", ...) on 5 and on 50 servers.
3. Moved: the fraction of keys that change server when one of 5 servers is
   removed, averaged over the five choices (0.200 is the minimum: the removed
   server's keys).

Peers: libmemcached's weighted ketama in C (pylibmc's `Client.hash`, which
corral's ketama matches key for key), uhashring's ketama (libketama: it
hashes "host:port" even on port 11211, so its placement differs) and
pymemcache's rendezvous client (pure-Python murmur3, so it gets fewer keys:
the count is in the table). A peer that is not installed is left out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral import Ring
from corral.core.ring import HASHINGS

Locate = Callable[[str], str]
# Builds a lookup over these servers: one placement, by one library.
Builder = Callable[[Sequence[str]], Locate]


@dataclass
class Contender:
    name: str
    build: Builder
    # Keys for balance and moved: a pure-Python peer would take many minutes on 1,000,000.
    keys_divisor: int = 1


def corral_builder(hashing: str) -> Builder:
    def build(servers: Sequence[str]) -> Locate:
        return Ring(servers, hashing).locate

    return build


def pylibmc_build(servers: Sequence[str]) -> Locate:
    import pylibmc

    client: Any = pylibmc.Client(list(servers), behaviors={"ketama_weighted": True})
    index = client.hash
    names = list(servers)
    return lambda key: names[index(key)]


def uhashring_build(servers: Sequence[str]) -> Locate:
    from uhashring import HashRing

    ring: Any = HashRing(nodes=list(servers), hash_fn="ketama")
    locate: Locate = ring.get_node
    return locate


def pymemcache_build(servers: Sequence[str]) -> Locate:
    from pymemcache.client.rendezvous import RendezvousHash

    locate: Locate = RendezvousHash(nodes=list(servers)).get_node
    return locate


def contenders() -> list[Contender]:
    chosen = [Contender(f"corral {h}", corral_builder(h)) for h in HASHINGS]
    peers = [
        ("libmemcached ketama (pylibmc, C)", "pylibmc", pylibmc_build, 1),
        ("uhashring ketama", "uhashring", uhashring_build, 1),
        ("pymemcache rendezvous", "pymemcache", pymemcache_build, 10),
    ]
    for name, module, build, divisor in peers:
        try:
            __import__(module)
        except ImportError:
            print(f"  {module} is not installed: {name} left out", file=sys.stderr)
            continue
        chosen.append(Contender(name, build, divisor))
    return chosen


def servers(count: int) -> list[str]:
    # Port 11211, the common case, where libmemcached and libketama hash differently.
    return [f"10.0.{i // 250}.{i % 250 + 1}:11211" for i in range(count)]


def lookup_us(locates: dict[str, Locate], keys: list[str], rounds: int) -> dict[str, float]:
    timings: dict[str, list[float]] = {name: [] for name in locates}
    names = list(locates)
    for round_no in range(rounds):
        for name in names if round_no % 2 == 0 else reversed(names):
            locate = locates[name]
            started = time.perf_counter()
            deque(map(locate, keys), maxlen=0)
            timings[name].append((time.perf_counter() - started) / len(keys) * 1e6)
    return {name: statistics.median(values) for name, values in timings.items()}


def balance(locate: Locate, keys: list[str], count: int) -> float:
    counts = Counter(map(locate, keys))
    return max(counts.values()) / (len(keys) / count)


def moved(build: Builder, pool: list[str], keys: list[str]) -> float:
    before = list(map(build(pool), keys))
    fractions = []
    for gone in pool:
        after = map(build([s for s in pool if s != gone]), keys)
        fractions.append(sum(a != b for a, b in zip(before, after, strict=True)) / len(keys))
    return statistics.fmean(fractions)


def build_ms(build: Builder, pool: list[str]) -> float:
    started = time.perf_counter()
    build(pool)
    return (time.perf_counter() - started) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not for numbers")
    parser.add_argument("--output", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    total_keys, rounds, lookup_keys = (50_000, 3, 5_000) if args.quick else (1_000_000, 7, 20_000)
    keys = [f"key:{i}" for i in range(total_keys)]
    five, fifty = servers(5), servers(50)
    chosen = contenders()

    rows: dict[str, dict[str, str]] = {c.name: {} for c in chosen}
    for pool, label in [(five, "5"), (fifty, "50")]:
        locates = {c.name: c.build(pool) for c in chosen}
        for name, us in lookup_us(locates, keys[:lookup_keys], rounds).items():
            rows[name][f"lookup {label}"] = f"{us:.2f}"
        print(f"  lookup timed on {label} servers", file=sys.stderr, flush=True)
    for c in chosen:
        sample = keys[: total_keys // c.keys_divisor]
        row = rows[c.name]
        row["build 5"] = f"{build_ms(c.build, five):.1f}"
        row["build 50"] = f"{build_ms(c.build, fifty):.1f}"
        row["balance 5"] = f"{balance(c.build(five), sample, 5):.3f}"
        row["balance 50"] = f"{balance(c.build(fifty), sample, 50):.3f}"
        row["moved"] = f"{moved(c.build, five, sample):.4f}"
        row["keys"] = f"{len(sample):,}"
        print(f"  {c.name} measured", file=sys.stderr, flush=True)

    columns = [
        ("lookup 5", "lookup µs, 5 servers"),
        ("lookup 50", "lookup µs, 50 servers"),
        ("build 5", "build ms, 5"),
        ("build 50", "build ms, 50"),
        ("balance 5", "max/mean, 5"),
        ("balance 50", "max/mean, 50"),
        ("moved", "moved, 1 of 5 removed (ideal 0.200)"),
        ("keys", "keys"),
    ]
    lines = [
        f"### Key placement ({'quick run' if args.quick else 'full run'}: lookup median of "
        f"{rounds} interleaved rounds of {lookup_keys:,} keys)",
        "",
        "| placement | " + " | ".join(title for _, title in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(row[key] for key, _ in columns) + " |")
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
