"""What stays on each server after many names are each used once, as a queue consumer does.

    python -m bench.state                          # 100,000 names on every backend
    python -m bench.state --names 10000 --backends redis,sqlite

For each backend, on a throwaway server: count the entries corral keeps (the same
counters the bounded-state tests use), acquire and release N distinct names once
each (`init-user:{i}`), with a few left to expire as a crashed holder's would and
a few closed with `hold_for`, wait for their TTLs, then count again. Prints a
table of entries before, right after, and once the TTLs have passed.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from tests.footprint import footprint_for

import corral
from bench.backends import BACKENDS, start
from bench.scratch import scratch

TTL = 2.0


def run(backend: str, url: str, names: int) -> tuple[int, int, int, float]:
    footprint = footprint_for(backend, url)
    prefix = f"init-user-{uuid.uuid4().hex[:6]}"
    with corral.connect(url) as store:
        before = footprint.count(store)
        began = time.perf_counter()
        for index in range(names):
            lock = store.lock(f"{prefix}:{index}", ttl=TTL)
            if not lock.acquire():
                raise RuntimeError(f"{backend}: could not acquire a fresh name")
            if index % 1000 == 1:
                pass  # left to expire, as a crashed holder's lock would
            elif index % 1000 == 2:
                lock.release(hold_for=TTL / 2)
            else:
                lock.release()
            if index and index % 10000 == 0:
                print(f"  {backend}: {index:,} names", file=sys.stderr, flush=True)
        rate = names / (time.perf_counter() - began)
        right_after = footprint.count(store)
        time.sleep(TTL + footprint_slack(store) + 1)
        for index in range(50):  # backends that collect as they go need some traffic
            lock = store.lock(f"{prefix}:traffic:{index}", ttl=0.5)
            lock.acquire()
            lock.release()
        time.sleep(0.5 + footprint_slack(store) + 1)
        after = footprint.count(store)
    return before, right_after, after, rate


def footprint_slack(store: corral.Store) -> float:
    return store.capabilities.ttl_slack


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=100_000)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args()
    lines = [
        f"### {args.names:,} names each acquired once ({TTL:g} s TTL; 1 in 1,000 left to "
        "expire, 1 in 1,000 closed with hold_for)",
        "",
        "| backend | entries before | right after | after the TTLs | names/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        url, server = start(backend, scratch(backend))
        try:
            before, right_after, after, rate = run(backend, url, args.names)
        finally:
            if server is not None:
                server.stop()
        lines.append(f"| {backend} | {before:,} | {right_after:,} | {after:,} | {rate:,.0f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
