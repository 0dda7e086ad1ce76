"""corral's cache on a pool of five memcached servers, beside pymemcache's HashClient, one run.

    python -m bench.sharding              # numbers for BENCHMARKS.md
    python -m bench.sharding --quick      # a smoke run

Three questions, each on the same five throwaway memcached servers:

1. A batch: `get_many` of 100 keys spread over the five servers (one request per server,
   side by side) against the same keys read one by one, and pymemcache's `HashClient`
   (rendezvous placement) `get_many`.
2. A hot key: reads drawn so that one key takes 30% of them, the rest Zipf over 10,000
   keys; the busiest server's share of the requests with `hot_keys` off and on (counted by
   the servers themselves, `stats` `cmd_get`).
3. A server killed mid-run: eight threads reading 2,000 keys, one server SIGKILLed a third
   of the way in and started again (empty) at two thirds: calls that took longer than the
   socket timeout (the target is none), and computations while it was down, without and
   with a gutter server.
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.backends import publish
from bench.scratch import scratch

SERVERS = 5
TIMEOUT = 0.5


def cmd_get(server: Any) -> int:
    """How many keys the memcached server was asked for so far (its own count)."""
    with socket.create_connection((server.host, server.port), timeout=2.0) as sock:
        sock.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "cmd_get":
            return int(parts[2])
    raise RuntimeError(f"no cmd_get in the stats of {server.url}")


def pool_url(servers: list[Any], **query: Any) -> str:
    hosts = ",".join(f"{s.host}:{s.port}" for s in servers)
    options = "&".join(f"{k}={v}" for k, v in query.items())
    return f"memcached://{hosts}" + (f"?{options}" if options else "")


# -- 1. a batch ------------------------------------------------------------------------


def batch(servers: list[Any], rounds: int, repeats: int) -> list[str]:
    from pymemcache.client.hash import HashClient

    import corral

    keys = [f"batch-{i}" for i in range(100)]
    with corral.connect(pool_url(servers, timeout=TIMEOUT)) as store:
        cache = store.cache("bench", ttl=600)
        cache.set_many({k: k for k in keys})
        peer = HashClient([(s.host, s.port) for s in servers], timeout=TIMEOUT)
        peer.set_many({k: k.encode() for k in keys}, expire=600)

        def many() -> None:
            assert len(cache.get_many(keys)) == 100

        def one_by_one() -> None:
            for key in keys:
                assert cache.get(key) == key

        def peer_many() -> None:
            assert len(peer.get_many(keys)) == 100

        runs = {"corral get_many": many, "corral get, one by one": one_by_one}
        runs["pymemcache HashClient get_many"] = peer_many
        times: dict[str, list[float]] = {name: [] for name in runs}
        for round_no in range(rounds):
            for name, run in runs.items() if round_no % 2 == 0 else reversed(runs.items()):
                started = time.perf_counter()
                for _ in range(repeats):
                    run()
                times[name].append((time.perf_counter() - started) / repeats)
            print(f"  batch round {round_no + 1}/{rounds}", file=sys.stderr, flush=True)
        peer.close()
    base = statistics.median(times["corral get_many"])
    lines = [
        "| 100 keys over 5 memcached servers | ms per batch (median) | vs corral get_many |",
        "|---|---:|---:|",
    ]
    for name, samples in times.items():
        median = statistics.median(samples)
        lines.append(f"| {name} | {median * 1000:.2f} | {median / base:.2f} |")
    return lines


# -- 2. a hot key ----------------------------------------------------------------------


def zipf_reads(count: int, keys: int, rng: random.Random) -> list[str]:
    """`count` key names: 30% the hot key, the rest Zipf (s = 1) over `keys` others."""
    weights = [1.0 / rank for rank in range(1, keys + 1)]
    rest = rng.choices(range(keys), weights=weights, k=count)
    return ["hot" if rng.random() < 0.3 else f"key-{rank}" for rank in rest]


def hot_share(servers: list[Any], hot_keys: bool, reads: list[str], window: float) -> float:
    import corral

    with corral.connect(pool_url(servers, timeout=TIMEOUT)) as store:
        cache = store.cache(f"zipf-{hot_keys}", ttl=600, hot_keys=hot_keys)
        finder = cache._hot
        if finder is not None:
            finder.window = window  # a shorter window than the default, for a shorter run
            finder._window_end = store.clock.now() + window
        warm = time.monotonic() + window * 1.2  # one window to find the hot key
        i = 0
        while time.monotonic() < warm:
            cache.get_or_compute(reads[i % len(reads)], lambda: "v")
            i += 1
        before = [cmd_get(s) for s in servers]
        for key in reads:
            cache.get_or_compute(key, lambda: "v")
        after = [cmd_get(s) for s in servers]
        if hot_keys:
            print(f"  hot keys found: {cache.stats()['hot_keys']}", file=sys.stderr)
    counts = [b - a for a, b in zip(before, after, strict=True)]
    return max(counts) / sum(counts)


def hot(servers: list[Any], reads: int, window: float) -> list[str]:
    rng = random.Random(7)
    drawn = zipf_reads(reads, 10_000, rng)
    off = hot_share(servers, False, drawn, window)
    on = hot_share(servers, True, drawn, window)
    return [
        "| one key takes 30% of the reads (5 servers, ideal 0.20) | busiest server's share |",
        "|---|---:|",
        f"| hot_keys=False | {off:.3f} |",
        f"| hot_keys=True | {on:.3f} |",
    ]


# -- 3. a server killed mid-run --------------------------------------------------------


def killed(servers: list[Any], gutter: Any | None, seconds: float) -> tuple[int, int, int, int]:
    """(calls, calls slower than the timeout, computations while down, after its return)."""
    import corral

    query: dict[str, Any] = {"timeout": TIMEOUT, "failure_limit": 3, "retry_after": 1}
    if gutter is not None:
        query["gutter"] = gutter.url
    keys = [f"k-{i}" for i in range(2000)]
    computed = {"before": 0, "down": 0, "back": 0}
    phase = ["before"]
    slow = [0]
    calls = [0]
    mutex = threading.Lock()
    stop = threading.Event()
    victim = servers[2]

    with corral.connect(pool_url(servers, **query)) as store:
        cache = store.cache("killed", ttl=600)
        cache.set_many({k: k for k in keys})

        def compute(key: str) -> str:
            with mutex:
                computed[phase[0]] += 1
            return key

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                key = rng.choice(keys)
                started = time.perf_counter()
                cache.get_or_compute(key, lambda key=key: compute(key))  # type: ignore[misc]
                took = time.perf_counter() - started
                with mutex:
                    calls[0] += 1
                    if took > TIMEOUT:
                        slow[0] += 1

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(seconds / 3)
            victim.kill()
            with mutex:
                phase[0] = "down"
            time.sleep(seconds / 3)
            victim.start()
            with mutex:
                phase[0] = "back"
            time.sleep(seconds / 3)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            victim.start()
    return calls[0], slow[0], computed["down"], computed["back"]


def failures(servers: list[Any], gutter: Any, seconds: float) -> list[str]:
    lines = [
        f"| one of 5 servers killed, back {seconds / 3:.0f} s later (timeout {TIMEOUT} s) "
        "| calls | slower than the timeout | computed while down | computed after return |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, spare in (("next server on the ring", None), ("gutter server", gutter)):
        calls, slow, down, back = killed(servers, spare, seconds)
        lines.append(f"| {name} | {calls} | {slow} | {down} | {back} |")
        print(f"  failure run with {name} done", file=sys.stderr, flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not for numbers")
    parser.add_argument("--output", type=Path, help="also write the markdown tables here")
    args = parser.parse_args()
    rounds, repeats, reads, window, seconds = (
        (2, 20, 20_000, 1.0, 6.0) if args.quick else (7, 200, 200_000, 5.0, 15.0)
    )
    from corral.testing import servers as fixtures

    started = []
    try:
        for i in range(SERVERS + 1):
            started.append(fixtures.start_memcached(scratch(f"memcached-{i}")))
        pool, gutter = started[:SERVERS], started[SERVERS]
        lines = batch(pool, rounds, repeats)
        lines += ["", *hot(pool, reads, window)]
        lines += ["", *failures(pool, gutter, seconds)]
    finally:
        for server in started:
            server.stop()
    publish(lines, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
