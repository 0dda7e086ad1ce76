"""corral's Redis lock beside its peers, on one throwaway redis-server, in one run.

    python -m bench.locks                 # full run (about two minutes)
    python -m bench.locks --quick         # a smoke run (seconds)

Two experiments:

1. Uncontended cycle (acquire + release of a free lock), interleaved in rounds
   so that machine noise hits every library alike. Reported as cycles/s and as a
   ratio to the floor: raw redis-py `SET NX PX` plus an `EVALSHA`
   compare-and-delete, the two round trips any correct lock needs.
2. Eight processes contending for one key, each holding it for 1 ms:
   acquisitions/s, handoff (release to next acquisition) p50/p99, wait p99/max,
   and fairness (fewest / most acquisitions per worker).

A ratio means more than an absolute time here: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.scratch import scratch

CAD = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


# -- the contenders: each returns (acquire, release) for one lock name ---------


def raw_floor(url: str, name: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    client = redis.Redis.from_url(url)
    script = client.register_script(CAD)
    token = uuid.uuid4().hex

    def acquire() -> bool:
        return bool(client.set(name, token, nx=True, px=30000))

    def release() -> None:
        script(keys=[name], args=[token])

    return acquire, release


def raw_polling_floor(url: str, name: str) -> tuple[Callable[..., bool], Callable[[], None]]:
    """The simplest correct lock under contention: SET NX PX, retried every millisecond."""
    client = redis.Redis.from_url(url)
    script = client.register_script(CAD)
    token = uuid.uuid4().hex

    def acquire(wait: float | None = 0.0) -> bool:
        deadline = None if wait is None else time.monotonic() + wait
        while not client.set(name, token, nx=True, px=30000):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
        return True

    def release() -> None:
        script(keys=[name], args=[token])

    return acquire, release


def corral_lock(url: str, name: str, fair: bool = False) -> tuple[Callable[..., bool], Any]:
    import corral

    store = corral.connect(url)
    lock = store.lock(name, ttl=30, fair=fair)

    def acquire(wait: float | None = 0.0) -> bool:
        return lock.acquire(wait=wait)

    return acquire, lock.release


def corral_fair(url: str, name: str) -> tuple[Callable[..., bool], Any]:
    return corral_lock(url, name, fair=True)


def redis_py_lock(url: str, name: str) -> tuple[Callable[..., bool], Any]:
    client = redis.Redis.from_url(url)
    lock = client.lock(name, timeout=30)

    def acquire(wait: float | None = 0.0) -> bool:
        if wait == 0:
            return bool(lock.acquire(blocking=False))
        return bool(lock.acquire(blocking=True, blocking_timeout=wait))

    return acquire, lock.release


def python_redis_lock(url: str, name: str) -> tuple[Callable[..., bool], Any]:
    import redis_lock

    client = redis.Redis.from_url(url)
    lock = redis_lock.Lock(client, name, expire=30)

    def acquire(wait: float | None = 0.0) -> bool:
        if wait == 0:
            return bool(lock.acquire(blocking=False))
        return bool(lock.acquire(blocking=True, timeout=wait))

    return acquire, lock.release


def pottery_redlock(url: str, name: str) -> tuple[Callable[..., bool], Any]:
    from pottery import Redlock

    client = redis.Redis.from_url(url)
    lock = Redlock(key=name, masters={client}, auto_release_time=30)

    def acquire(wait: float | None = 0.0) -> bool:
        if wait == 0:
            return bool(lock.acquire(blocking=False))
        return bool(lock.acquire(blocking=True, timeout=-1 if wait is None else wait))

    return acquire, lock.release


UNCONTENDED = {
    "raw SET NX PX + EVALSHA (floor)": raw_floor,
    "corral": corral_lock,
    "redis-py Lock": redis_py_lock,
    "python-redis-lock": python_redis_lock,
    "pottery Redlock": pottery_redlock,
}

CONTENDED = {
    "raw SET NX PX, polling every 1 ms (floor)": raw_polling_floor,
    "corral": corral_lock,
    "corral fair=True": corral_fair,
    "redis-py Lock": redis_py_lock,
    "python-redis-lock": python_redis_lock,
    "pottery Redlock": pottery_redlock,
}


def cycle_rate(factory: Callable[..., Any], url: str, cycles: int) -> float:
    acquire, release = factory(url, f"bench-{uuid.uuid4().hex}")
    for _ in range(50):  # warm up connections and script caches
        assert acquire()
        release()
    began = time.perf_counter()
    for _ in range(cycles):
        acquire()
        release()
    return cycles / (time.perf_counter() - began)


def uncontended(url: str, rounds: int, cycles: int) -> dict[str, float]:
    rates: dict[str, list[float]] = {label: [] for label in UNCONTENDED}
    for round_no in range(rounds):
        order = list(UNCONTENDED.items())
        if round_no % 2:
            order.reverse()
        for label, factory in order:
            rates[label].append(cycle_rate(factory, url, cycles))
        print(f"  uncontended round {round_no + 1}/{rounds}", file=sys.stderr, flush=True)
    return {label: statistics.median(values) for label, values in rates.items()}


def contend_worker(
    label: str, url: str, name: str, start_at: float, stop_at: float, hold: float, out: Any
) -> None:
    acquire, release = CONTENDED[label](url, name)
    events = []
    while time.time() < start_at:
        time.sleep(0.001)
    while time.time() < stop_at:
        asked = time.monotonic()
        if not acquire(wait=30):
            continue
        got = time.monotonic()
        time.sleep(hold)
        released = time.monotonic()
        release()
        events.append((asked, got, released))
    out.put(json.dumps(events))


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def contended(url: str, label: str, workers: int, seconds: float, hold: float) -> dict[str, float]:
    name = f"bench-{uuid.uuid4().hex}"
    queue: mp.Queue[str] = mp.Queue()
    start_at = time.time() + 1.0
    procs = [
        mp.Process(
            target=contend_worker,
            args=(label, url, name, start_at, start_at + seconds, hold, queue),
        )
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    per_worker = [json.loads(queue.get(timeout=seconds + 120)) for _ in procs]
    for proc in procs:
        proc.join()
    every = sorted((e for events in per_worker for e in events), key=lambda e: e[1])
    handoffs = [b[1] - a[2] for a, b in itertools.pairwise(every)]
    waits = [got - asked for asked, got, _ in every]
    counts = [len(events) for events in per_worker]
    return {
        "acq/s": len(every) / seconds,
        "handoff p50 ms": percentile(handoffs, 50) * 1000,
        "handoff p99 ms": percentile(handoffs, 99) * 1000,
        "wait p99 ms": percentile(waits, 99) * 1000,
        "wait max ms": max(waits) * 1000 if waits else float("nan"),
        "fairness": (min(counts) / max(counts)) if counts and max(counts) else 0.0,
        "min/max": f"{min(counts)}/{max(counts)}",  # type: ignore[dict-item]
    }


def pin(server_pid: int | None, client_core: int) -> None:
    """Put the server on core 0 and this client on `client_core` (0: share it, 1: apart)."""
    if server_pid is not None:
        os.sched_setaffinity(server_pid, {0})
    os.sched_setaffinity(0, {client_core})


def uncontended_table(rates: dict[str, float], title: str) -> list[str]:
    floor = rates["raw SET NX PX + EVALSHA (floor)"]
    lines = [title, "", "| library | cycles/s | x floor |", "|---|---:|---:|"]
    for label, rate in rates.items():
        lines.append(f"| {label} | {rate:,.0f} | {rate / floor:.2f} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not for numbers")
    parser.add_argument("--url", help="use this Redis instead of starting a throwaway one")
    parser.add_argument("--output", type=Path, help="also write the markdown tables here")
    args = parser.parse_args()
    rounds, cycles, seconds = (2, 300, 2.0) if args.quick else (7, 3000, 8.0)

    server = None
    url = args.url
    if url is None:
        from corral.testing.servers import start_redis

        server = start_redis(scratch("redis"))
        url = server.url
    everywhere = os.sched_getaffinity(0)
    try:
        info = redis.Redis.from_url(url).info("server")
        print(f"redis-server {info['redis_version']} at {url}", file=sys.stderr)
        lines: list[str] = []
        placements = [("client and server on one core", 0), ("client and server apart", 1)]
        if server is None or len(everywhere) < 2:
            placements = [("unpinned", -1)]
        for placement, core in placements:
            if core >= 0:
                pin(server.pid if server is not None else None, core)
            rates = uncontended(url, rounds, cycles)
            lines += uncontended_table(
                rates,
                f"### Uncontended acquire + release, {placement} ({rounds} interleaved rounds "
                f"of {cycles} cycles, median)",
            )
            lines.append("")
        os.sched_setaffinity(0, everywhere)
        if server is not None:
            os.sched_setaffinity(server.pid, everywhere)
        lines += [
            f"### 8 processes contending for one key, holding 1 ms ({seconds:.0f} s each)",
            "",
            "| library | acq/s | x floor | handoff p50 ms | handoff p99 ms | wait p99 ms "
            "| wait max ms | fairness (min/max) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        floor = None
        for label in CONTENDED:
            print(f"  contended: {label}", file=sys.stderr, flush=True)
            r = contended(url, label, 8, seconds, 0.001)
            floor = floor or r["acq/s"]
            lines.append(
                f"| {label} | {r['acq/s']:,.0f} | {r['acq/s'] / floor:.2f} "
                f"| {r['handoff p50 ms']:.2f} | {r['handoff p99 ms']:.2f} "
                f"| {r['wait p99 ms']:.1f} | {r['wait max ms']:.1f} "
                f"| {r['fairness']:.2f} ({r['min/max']}) |"
            )
        table = "\n".join(lines)
        print(table)
        if args.output:
            args.output.write_text(table + "\n")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
