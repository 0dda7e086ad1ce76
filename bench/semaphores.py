"""corral's semaphore on every backend: 8 processes on a semaphore of 3, in one run.

    python -m bench.semaphores                       # every backend
    python -m bench.semaphores --backends redis --quick

Each process takes a slot (waiting as long as it takes), holds it about 1 ms,
releases it, and again, for a fixed time. Reported: acquisitions per second,
wait p99 and max, fairness (fewest/most acquisitions per process), and the
most holders seen inside at one instant (it must never exceed 3). On Redis the
classic counting-semaphore recipe (one Lua script over a sorted set, polled
every 1 ms, no tokens, no queue) runs beside it as the floor.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.backends import BACKENDS, publish, throwaway
from bench.locks import percentile

LIMIT = 3
WORKERS = 8
HOLD = 0.001

# The recipe most Redis counting semaphores use: drop expired holders, then add this one
# if fewer than `limit` remain. Atomic, but a waiter can only poll.
RAW_ACQUIRE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[4])
    return 1
end
return 0
"""


def corral_slot(url: str, name: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    import corral

    store = corral.connect(url)
    slot = store.semaphore(name, LIMIT, ttl=30)
    return (lambda: slot.acquire(wait=30)), slot.release


def raw_redis_slot(url: str, name: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    import redis

    client = redis.Redis.from_url(url)
    script = client.register_script(RAW_ACQUIRE)
    me = uuid.uuid4().hex

    def acquire() -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if script(keys=[name], args=[time.time(), LIMIT, 30, me]):
                return True
            time.sleep(0.001)
        return False

    def release() -> None:
        client.zrem(name, me)

    return acquire, release


KINDS: dict[str, Callable[[str, str], tuple[Callable[[], bool], Callable[[], None]]]] = {
    "corral": corral_slot,
    "raw Lua sorted-set recipe, polling every 1 ms (floor)": raw_redis_slot,
}


def worker(kind: str, url: str, name: str, start_at: float, stop_at: float, out: Any) -> None:
    acquire, release = KINDS[kind](url, name)
    events = []
    while time.time() < start_at:
        time.sleep(0.001)
    while time.time() < stop_at:
        asked = time.monotonic()
        if not acquire():
            continue
        got = time.monotonic()
        time.sleep(HOLD)
        released = time.monotonic()
        release()
        events.append((asked, got, released))
    out.put(json.dumps(events))


def most_inside(events: list[tuple[float, float, float]]) -> int:
    changes = sorted([(got, 1) for _, got, _ in events] + [(rel, -1) for _, _, rel in events])
    inside = most = 0
    for _, change in changes:
        inside += change
        most = max(most, inside)
    return most


def contended(kind: str, url: str, seconds: float) -> dict[str, Any]:
    name = f"bench-{uuid.uuid4().hex}"
    queue: mp.Queue[str] = mp.Queue()
    start_at = time.time() + 1.0
    procs = [
        mp.Process(target=worker, args=(kind, url, name, start_at, start_at + seconds, queue))
        for _ in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    per_worker = [json.loads(queue.get(timeout=seconds + 120)) for _ in procs]
    for proc in procs:
        proc.join()
    every = [(e[0], e[1], e[2]) for events in per_worker for e in events]
    waits = [got - asked for asked, got, _ in every]
    counts = [len(events) for events in per_worker]
    return {
        "acq/s": len(every) / seconds,
        "wait p99 ms": percentile(waits, 99) * 1000,
        "wait max ms": max(waits) * 1000 if waits else float("nan"),
        "fairness": f"{min(counts)}/{max(counts)}",
        "most inside": most_inside(every),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="a smoke run, not for numbers")
    parser.add_argument("--output", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    seconds = 2.0 if args.quick else 6.0
    lines = [
        f"### {WORKERS} processes on a semaphore of {LIMIT}, holding {HOLD * 1000:g} ms "
        f"({seconds:g} s each)",
        "",
        "| backend | implementation | acq/s | wait p99 ms | wait max ms "
        "| fairness (fewest/most) | most inside |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for backend in chosen:
        with throwaway(backend) as url:
            kinds = list(KINDS) if backend == "redis" else ["corral"]
            for kind in kinds:
                row = contended(kind, url, seconds)
                print(f"  {backend} {kind}: {row}", file=sys.stderr, flush=True)
                lines.append(
                    f"| {backend} | {kind} | {row['acq/s']:,.0f} | {row['wait p99 ms']:.1f} "
                    f"| {row['wait max ms']:.1f} | {row['fairness']} | {row['most inside']} |"
                )
    publish(lines, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
