"""corral's lock on every backend, each on a throwaway server started here, in one run.

    python -m bench.backends                    # every backend
    python -m bench.backends --backends redis,postgres --quick

The same harness as bench/locks.py: an uncontended acquire + release cycle
(median of interleaved rounds), and eight processes contending for one key,
holding it 1 ms, with and without fair=True (where the backend supports it).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.locks import contended, corral_lock, cycle_rate
from bench.scratch import scratch

BACKENDS = ["sqlite", "redis", "memcached", "etcd", "postgres"]


def start(backend: str, workdir: Path) -> tuple[str, Any]:
    from corral.testing import servers

    if backend == "sqlite":
        return f"sqlite:///{workdir / 'bench.db'}", None
    starters = {
        "redis": servers.start_redis,
        "memcached": servers.start_memcached,
        "etcd": servers.start_etcd,
        "postgres": servers.start_postgres,
    }
    server = starters[backend](workdir)
    return server.url, server


@contextlib.contextmanager
def throwaway(backend: str) -> Iterator[str]:
    """The URL of a fresh server of `backend`, stopped once the block is over."""
    url, server = start(backend, scratch(backend))
    try:
        yield url
    finally:
        if server is not None:
            server.stop()


def publish(lines: list[str], output: Path | None) -> None:
    """Print the markdown tables, and write them to `output` when given."""
    text = "\n".join(lines)
    print(text)
    if output:
        output.write_text(text + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="a smoke run, not for numbers")
    parser.add_argument("--output", type=Path, help="also write the markdown tables here")
    args = parser.parse_args()
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    rounds, cycles, seconds = (2, 200, 2.0) if args.quick else (5, 1500, 6.0)

    import corral

    started: dict[str, tuple[str, Any]] = {}
    try:
        for backend in chosen:
            started[backend] = start(backend, scratch(backend))
        rates: dict[str, list[float]] = {b: [] for b in chosen}
        for round_no in range(rounds):
            for backend in chosen if round_no % 2 == 0 else reversed(chosen):
                rates[backend].append(cycle_rate(corral_lock, started[backend][0], cycles))
            print(f"  uncontended round {round_no + 1}/{rounds}", file=sys.stderr, flush=True)
        lines = [
            f"### Uncontended acquire + release, per backend ({rounds} interleaved rounds of "
            f"{cycles} cycles, median)",
            "",
            "| backend | cycles/s | us/cycle |",
            "|---|---:|---:|",
        ]
        for backend in chosen:
            rate = statistics.median(rates[backend])
            lines.append(f"| {backend} | {rate:,.0f} | {1e6 / rate:,.0f} |")
        lines += [
            "",
            f"### 8 processes contending for one key, holding 1 ms ({seconds:.0f} s each)",
            "",
            "| backend | mode | acq/s | handoff p50 ms | handoff p99 ms | wait p99 ms "
            "| wait max ms | fairness (min/max) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for backend in chosen:
            url = started[backend][0]
            modes = ["corral"]
            with corral.connect(url) as store:
                if store.capabilities.fair:
                    modes.append("corral fair=True")
            for mode in modes:
                print(f"  contended: {backend} {mode}", file=sys.stderr, flush=True)
                r = contended(url, mode, 8, seconds, 0.001)
                label = "fair=True" if "fair" in mode else "default"
                lines.append(
                    f"| {backend} | {label} | {r['acq/s']:,.0f} | {r['handoff p50 ms']:.2f} "
                    f"| {r['handoff p99 ms']:.2f} | {r['wait p99 ms']:.1f} "
                    f"| {r['wait max ms']:.1f} | {r['fairness']:.2f} ({r['min/max']}) |"
                )
        table = "\n".join(lines)
        print(table)
        if args.output:
            args.output.write_text(table + "\n")
    finally:
        for _url, server in started.values():
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
