"""Clients of one expiring cache key in one process, for the multi-process stampede test.

    python -m tests.faults.cache_client URL NAMESPACE MODE LOG [--clients N] [--seconds S]
                                        [--ttl S] [--compute S] [--flavour sync|async]

Each client (a thread, or a task with `--flavour async`) opens its own store,
so nothing in this process collapses the clients' calls into one: every
exclusion seen is the server's. They read the key "hot" through
`get_or_compute` until the time is up. Every computation appends one line
`start end` (the shared monotonic clock) to LOG with a single O_APPEND write,
so the processes' records interleave whole. At the end one JSON line says how
many reads each client made and which errors, if any, it met.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from typing import Any

import corral
import corral.aio

MODES: dict[str, dict[str, Any]] = {
    "lock": {},
    "stale": {"stale_ttl": 30.0},
    "xfetch": {"early_recompute": "xfetch"},
    "background": {"stale_ttl": 30.0, "background": True},
}


def record(log: str, start: float) -> None:
    line = f"{start:.6f} {time.monotonic():.6f}\n".encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def run_sync(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.seconds

    def compute() -> float:
        start = time.monotonic()
        time.sleep(args.compute)
        record(args.log, start)
        return start

    def client() -> None:
        reads, errors = 0, []
        with corral.connect(args.url) as store:
            cache = store.cache(args.namespace, ttl=args.ttl, lock_wait=10, **MODES[args.mode])
            # Every client reads for `seconds` from its first read, however late a loaded
            # machine let it connect: the run must span several expiries.
            until = deadline
            while reads == 0 or time.monotonic() < until:
                try:
                    cache.get_or_compute("hot", compute)
                    reads += 1
                    if reads == 1:
                        until = max(deadline, time.monotonic() + args.seconds * 0.8)
                except Exception as exc:
                    errors.append(repr(exc))
                    break
        results.append({"reads": reads, "errors": errors})

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


async def run_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    deadline = time.monotonic() + args.seconds

    async def compute() -> float:
        start = time.monotonic()
        await asyncio.sleep(args.compute)
        await asyncio.to_thread(record, args.log, start)
        return start

    async def client() -> dict[str, Any]:
        reads, errors = 0, []
        async with corral.aio.connect(args.url) as store:
            cache = store.cache(args.namespace, ttl=args.ttl, lock_wait=10, **MODES[args.mode])
            # Every client reads for `seconds` from its first read, however late a loaded
            # machine let it connect: the run must span several expiries.
            until = deadline
            while reads == 0 or time.monotonic() < until:
                try:
                    await cache.get_or_compute("hot", compute)
                    reads += 1
                    if reads == 1:
                        until = max(deadline, time.monotonic() + args.seconds * 0.8)
                except Exception as exc:
                    errors.append(repr(exc))
                    break
                await asyncio.sleep(0)
        return {"reads": reads, "errors": errors}

    return list(await asyncio.gather(*(client() for _ in range(args.clients))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("log")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--ttl", type=float, default=0.5)
    parser.add_argument("--compute", type=float, default=0.05)
    parser.add_argument("--flavour", choices=("sync", "async"), default="sync")
    args = parser.parse_args()
    results = run_sync(args) if args.flavour == "sync" else asyncio.run(run_async(args))
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
