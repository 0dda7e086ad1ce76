"""A lock holder in its own process, for fault tests that kill, stop and race it.

    python -m tests.faults.holder URL NAME MODE [--ttl S] [--flavour sync|async] [--cycles N]
                                                [--limit N] [--hold S] [--identity ID]

Modes: `hold` acquires, prints its token and sleeps until killed; `stdin`
acquires, prints its token, waits for a line on stdin, then reports what
extend() and release() raised; `worker` runs acquire/hold/release cycles and
prints one JSON line per cycle (start, end, token) on the shared monotonic clock.
With `--limit N` the handle is a slot of a semaphore of N instead of a lock.

`campaign` runs for election NAME as `--identity`: it prints {"elected": ...}
with its term when it leads, and answers each line on stdin, while it campaigns
and while it leads, with who it sees leading ({"leader": ..., "me": is_leader}).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time

import corral
import corral.aio

_EMITTING = threading.Lock()


def emit(**fields: object) -> None:
    """One JSON line, written whole even when two threads emit at once."""
    with _EMITTING:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def outcome(call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except corral.CorralError as exc:
        return type(exc).__name__
    return "ok"


def run_sync(args: argparse.Namespace) -> None:
    store = corral.connect(args.url)
    if args.mode == "campaign":
        campaign_sync(store, args)
        return
    lock: corral.Lock = (
        store.lock(args.name, ttl=args.ttl)
        if args.limit is None
        else store.semaphore(args.name, args.limit, ttl=args.ttl)
    )
    if args.mode == "worker":
        rng = random.Random()
        for _ in range(args.cycles):
            assert lock.acquire(wait=120), "could not acquire within 120 s"
            start = time.monotonic()
            time.sleep(rng.uniform(0, args.hold))
            end = time.monotonic()
            emit(start=start, end=end, token=lock.token)
            lock.release()
        return
    assert lock.acquire(wait=30), "could not acquire"
    emit(token=lock.token, owner=lock.owner)
    if args.mode == "hold":
        time.sleep(3600)
    sys.stdin.readline()
    emit(extend=outcome(lock.extend), release=outcome(lock.release))


def campaign_sync(store: corral.Store, args: argparse.Namespace) -> None:
    election = store.election(args.name, ttl=args.ttl, identity=args.identity)

    def answer() -> None:  # who leads, asked while this process campaigns or leads
        for _ in sys.stdin:
            emit(leader=election.leader(), me=election.is_leader)

    threading.Thread(target=answer, daemon=True).start()
    assert election.campaign(wait=None)
    emit(elected=args.identity, term=election.term, at=time.monotonic())
    time.sleep(3600)


async def campaign_async(store: corral.aio.AsyncStore, args: argparse.Namespace) -> None:
    election = store.election(args.name, ttl=args.ttl, identity=args.identity)

    async def answer() -> None:
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            emit(leader=await election.leader(), me=election.is_leader)

    answering = asyncio.ensure_future(answer())
    assert await election.campaign(wait=None)
    emit(elected=args.identity, term=election.term, at=time.monotonic())
    await answering


async def run_async(args: argparse.Namespace) -> None:
    store = corral.aio.connect(args.url)
    if args.mode == "campaign":
        await campaign_async(store, args)
        return
    lock: corral.aio.AsyncLock = (
        store.lock(args.name, ttl=args.ttl)
        if args.limit is None
        else store.semaphore(args.name, args.limit, ttl=args.ttl)
    )
    if args.mode == "worker":
        rng = random.Random()
        for _ in range(args.cycles):
            assert await lock.acquire(wait=120), "could not acquire within 120 s"
            start = time.monotonic()
            await asyncio.sleep(rng.uniform(0, args.hold))
            end = time.monotonic()
            emit(start=start, end=end, token=lock.token)
            await lock.release()
        await store.aclose()
        return
    assert await lock.acquire(wait=30), "could not acquire"
    emit(token=lock.token, owner=lock.owner)
    if args.mode == "hold":
        await asyncio.sleep(3600)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    results = {}
    for action in ("extend", "release"):
        try:
            await getattr(lock, action)()
            results[action] = "ok"
        except corral.CorralError as exc:
            results[action] = type(exc).__name__
    emit(**results)
    await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("mode", choices=["hold", "stdin", "worker", "campaign"])
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--flavour", choices=["sync", "async"], default="sync")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--hold", type=float, default=0.004, help="longest hold of a worker")
    parser.add_argument("--identity", default="candidate")
    args = parser.parse_args()
    if args.flavour == "sync":
        run_sync(args)
    else:
        asyncio.run(run_async(args))


if __name__ == "__main__":
    main()
