"""corral's stampede-proof cache beside its peers on one Redis, in one run.

    python -m bench.cache                    # full run (about 4 minutes)
    python -m bench.cache --quick            # a smoke run, not for numbers
    python -m bench.cache --output FILE      # also write the markdown tables to FILE

One throwaway redis-server serves every experiment:

1. The stampede. Clients read one key whose value takes 50 ms to compute and
   is fresh for 1 s, each pausing 10 ms between reads, for 5 s per
   configuration: 50 threads in one process, 8 processes x 6 threads, and 50
   asyncio tasks in one process. Every client has its own cache object and
   connection pool, so corral's in-process singleflight (one computation per
   key per process) hides nothing; one row per family shares one cache per
   process to show what singleflight adds. Every configuration runs in fresh
   processes on a fresh key, so its first expiry is a cold start.
   Each computation's start and end are taken on the system-wide monotonic
   clock, and each reader notes when it first saw each computed value.
   Computations are grouped into expiries: one joins the current group when it
   starts before the group's computations have all ended, or before any reader
   has seen one of the group's values (that is, before the group's value was
   stored, as far as anyone can tell), or less than half a TTL after that: a
   computation that starts while the value just stored is that young repeats
   it (computations queued behind a lock that do not read again run one after
   the other, never overlapping). No legitimate recomputation starts that soon:
   at expiry it is a TTL later, and XFetch's head start is a few times the
   50 ms computation. Reported: computations per expiry, reads, and read
   latency p50 / p99 / max.
2. The cost of a hit, interleaved in rounds so that noise hits every contender
   alike: a near-cache hit (`local_ttl`) beside a `cachetools.TTLCache` lookup,
   and a remote hit (`get`, `get_or_compute` on a fresh entry) beside raw
   redis-py `GET` + `json.loads` of the same value.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from queue import Empty
from typing import Any

from bench.backends import publish, throwaway
from bench.locks import percentile

# A value of about 600 bytes as JSON, like a small row set.
PAYLOAD: dict[str, Any] = {
    "name": "contacts of account 4711",
    "count": 1234,
    "updated": "2026-11-23T02:35:43Z",
    "tags": ["customer", "eu", "priority", "newsletter"],
    "scores": [round(i * 1.37, 2) for i in range(60)],
}
NAMESPACE = "bench"
BETA = 1.0


@dataclass(frozen=True)
class Plan:
    clients: int = 50  # threads in one process, and asyncio tasks
    procs: int = 8
    threads: int = 6  # per process
    seconds: float = 5.0  # per configuration
    ttl: float = 1.0
    stale: float = 10.0  # stale_ttl, and how much longer a soft-expiring entry is kept
    compute: float = 0.05
    think: float = 0.01  # each client's pause between reads
    hit_rounds: int = 7
    near_calls: int = 100_000
    remote_calls: int = 2_000
    corral_url: str | None = None  # corral on another store than the peers' Redis


FULL = Plan()
QUICK = Plan(
    clients=8,
    procs=2,
    threads=2,
    seconds=1.2,
    ttl=0.5,
    compute=0.02,  # XFetch's head start stays well under half the TTL
    hit_rounds=2,
    near_calls=10_000,
    remote_calls=200,
)


# -- the contenders --------------------------------------------------------------
#
# Each factory makes one client: a `read(key, compute)` that returns the cached
# value of `key`, computing it with `compute` when the library decides to, and a
# `close()`. Sync factories take a plain compute, async ones a coroutine function.

Read = Callable[[str, Callable[[], Any]], Any]
Client = tuple[Read, Callable[[], Any]]


def naive(url: str, plan: Plan) -> Client:
    """GET; on a miss compute, then SET with a PX expiry. Everyone who misses computes."""
    import redis

    client = redis.Redis.from_url(url)
    px = round(plan.ttl * 1000)

    def read(key: str, compute: Callable[[], Any]) -> Any:
        data = client.get(key)
        if data is not None:
            return json.loads(data)
        value = compute()
        client.set(key, json.dumps(value), px=px)
        return value

    return read, client.close


def xfetch_decides(entry: dict[str, Any]) -> bool:
    """XFetch (Vattani et al.): recompute early, with a probability rising towards expiry."""
    draw = -entry["delta"] * BETA * math.log(1.0 - random.random())
    return time.time() + draw >= entry["expiry"]


def xfetch_alone(url: str, plan: Plan) -> Client:
    """The naive cache plus XFetch's early recompute; no lock."""
    import redis

    client = redis.Redis.from_url(url)
    px = round(plan.ttl * 1000)

    def read(key: str, compute: Callable[[], Any]) -> Any:
        data = client.get(key)
        if data is not None:
            entry = json.loads(data)
            if not xfetch_decides(entry):
                return entry["value"]
        began = time.time()
        value = compute()
        delta = time.time() - began
        entry = {"value": value, "delta": delta, "expiry": time.time() + plan.ttl}
        client.set(key, json.dumps(entry), px=px)
        return value

    return read, client.close


def dogpile(url: str, plan: Plan, soft: bool) -> Client:
    """dogpile.cache's Redis backend, its lock a redis-py Lock (`distributed_lock=True`).

    Hard: the entry is gone from Redis after the TTL (`redis_expiration_time`,
    whole seconds), so callers find nothing and wait for the lock. Soft: the
    region's `expiration_time` makes the entry due after the TTL while Redis
    keeps it `stale` seconds longer; dogpile then lets the caller that gets the
    lock without waiting regenerate, and serves everyone else the old value.
    """
    from dogpile.cache import make_region

    arguments: dict[str, Any] = {
        "url": url,
        "distributed_lock": True,
        "thread_local_lock": False,
        "lock_timeout": 10,
    }
    if soft:
        arguments["redis_expiration_time"] = math.ceil(plan.ttl + plan.stale)
        region = make_region().configure(
            "dogpile.cache.redis", expiration_time=plan.ttl, arguments=arguments
        )
    else:
        arguments["redis_expiration_time"] = math.ceil(plan.ttl)
        region = make_region().configure("dogpile.cache.redis", arguments=arguments)

    def read(key: str, compute: Callable[[], Any]) -> Any:
        return region.get_or_create(key, compute)

    def close() -> None:
        region.backend.writer_client.close()

    return read, close


def corral_sync(url: str, plan: Plan, **options: Any) -> Client:
    import corral

    store = corral.connect(plan.corral_url or url)
    cache = store.cache(NAMESPACE, ttl=plan.ttl, **options)
    return cache.get_or_compute, store.close


AsyncRead = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]
AsyncClient = tuple[AsyncRead, Callable[[], Awaitable[Any]]]


async def naive_aio(url: str, plan: Plan) -> AsyncClient:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url)
    px = round(plan.ttl * 1000)

    async def read(key: str, compute: Callable[[], Awaitable[Any]]) -> Any:
        data = await client.get(key)
        if data is not None:
            return json.loads(data)
        value = await compute()
        await client.set(key, json.dumps(value), px=px)
        return value

    return read, client.aclose


async def corral_aio(url: str, plan: Plan, **options: Any) -> AsyncClient:
    import corral.aio

    store = corral.aio.connect(plan.corral_url or url)
    cache = store.cache(NAMESPACE, ttl=plan.ttl, **options)
    return cache.get_or_compute, store.aclose


def _per_key(decorate: Callable[[Callable[..., Any], str], Any]) -> AsyncRead:
    """A read for decorator-style caches: one decorated function per key, made on first use."""
    made: dict[str, Any] = {}
    computes: dict[str, Callable[[], Awaitable[Any]]] = {}

    async def read(key: str, compute: Callable[[], Awaitable[Any]]) -> Any:
        computes[key] = compute
        if key not in made:

            async def function() -> Any:
                return await computes[key]()

            made[key] = decorate(function, key)
        return await made[key]()

    return read


async def cashews_client(url: str, plan: Plan, strategy: str) -> AsyncClient:
    """cashews on Redis: `@cache.early`, or `@cache(lock=True)`, or `@cache` over `@cache.locked`.

    `early` keeps the entry `ttl + stale` seconds and recomputes it in the
    background (one caller, by a SET NX lock) once it is older than `ttl`.
    `lock=True` runs every call, hits too, under cashews' lock (the cache
    decorator inside it); `@cache.locked` under `@cache` (the README's other
    way) locks only the computation, and does not look at the cache again once
    it has the lock.
    """
    from cashews import Cache

    cache = Cache()
    cache.setup(url)

    def decorate(function: Callable[..., Any], key: str) -> Any:
        if strategy == "early":
            return cache.early(ttl=plan.ttl + plan.stale, early_ttl=plan.ttl, key=key)(function)
        if strategy == "lock":
            return cache(ttl=plan.ttl, key=key, lock=True)(function)
        locked = cache.locked(ttl=10, key=key)(function)
        return cache(ttl=plan.ttl, key=key)(locked)

    return _per_key(decorate), cache.close


async def aiocache_client(url: str, plan: Plan) -> AsyncClient:
    """aiocache's `cached_stampede`: the cached decorator, a miss computed under its RedLock."""
    from urllib.parse import urlsplit

    from aiocache import Cache, cached_stampede
    from aiocache.serializers import JsonSerializer

    where = urlsplit(url)
    caches: list[Any] = []

    def decorate(function: Callable[..., Any], key: str) -> Any:
        decorated = cached_stampede(
            lease=2,
            ttl=plan.ttl,
            key=key,
            cache=Cache.REDIS,
            endpoint=where.hostname,
            port=where.port,
            serializer=JsonSerializer(),
        )(function)
        caches.append(decorated.cache)
        return decorated

    async def close() -> None:
        for cache in caches:
            await cache.close()

    return _per_key(decorate), close


@dataclass(frozen=True)
class Contender:
    label: str
    factory: Callable[..., Any]
    options: tuple[tuple[str, Any], ...] = ()
    shared: bool = False  # one client per process, shared by its threads or tasks
    corral: bool = False
    mode: str = ""  # which corral target applies: default, stale, xfetch

    def make(self, url: str, plan: Plan) -> Any:
        options = {k: (plan.stale if v == "STALE" else v) for k, v in self.options}
        return self.factory(url, plan, **options)


STALE = (("stale_ttl", "STALE"),)

SYNC = [
    Contender("naive: GET, on a miss compute + SET PX", naive),
    Contender("XFetch alone (naive + early recompute, no lock)", xfetch_alone),
    Contender("dogpile.cache, distributed lock, hard expiry", dogpile, (("soft", False),)),
    Contender(
        "dogpile.cache, distributed lock, soft expiry (serves stale)",
        dogpile,
        (("soft", True),),
    ),
    Contender("corral, default (lock on miss)", corral_sync, corral=True, mode="default"),
    Contender("corral, stale_ttl=10", corral_sync, STALE, corral=True, mode="stale"),
    Contender(
        'corral, early_recompute="xfetch"',
        corral_sync,
        (("early_recompute", "xfetch"),),
        corral=True,
        mode="xfetch",
    ),
    Contender(
        "corral, stale_ttl=10, background=True",
        corral_sync,
        (*STALE, ("background", True)),
        corral=True,
        mode="stale",
    ),
    Contender(
        "corral, default, one shared cache per process",
        corral_sync,
        shared=True,
        corral=True,
        mode="default",
    ),
]

ASYNC = [
    Contender("naive: GET, on a miss compute + SET PX", naive_aio),
    Contender("corral, default (lock on miss)", corral_aio, corral=True, mode="default"),
    Contender("corral, stale_ttl=10", corral_aio, STALE, corral=True, mode="stale"),
    Contender(
        'corral, early_recompute="xfetch"',
        corral_aio,
        (("early_recompute", "xfetch"),),
        corral=True,
        mode="xfetch",
    ),
    Contender(
        "corral, stale_ttl=10, background=True",
        corral_aio,
        (*STALE, ("background", True)),
        corral=True,
        mode="stale",
    ),
    Contender(
        "corral, default, one shared cache per process",
        corral_aio,
        shared=True,
        corral=True,
        mode="default",
    ),
    Contender(
        "cashews @cache.early(ttl=11, early_ttl=1)", cashews_client, (("strategy", "early"),)
    ),
    Contender("cashews @cache(ttl=1, lock=True)", cashews_client, (("strategy", "lock"),)),
    Contender(
        "cashews @cache(ttl=1) over @cache.locked", cashews_client, (("strategy", "locked"),)
    ),
    Contender("aiocache @cached_stampede(ttl=1, lease=2)", aiocache_client),
]

FAMILIES = {"sync": SYNC, "async": ASYNC}


# -- one process's clients ---------------------------------------------------------


class Recorder:
    """What one process saw: computations, read latencies, when each value was first seen."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.computes: list[tuple[float, float, str]] = []
        self.reads: list[tuple[float, float]] = []  # (began, latency)
        self.seen: dict[str, float] = {}
        self.errors: list[str] = []
        self._serial = itertools.count()
        self._mutex = threading.Lock()

    def _value(self) -> dict[str, Any]:
        return {"id": f"{os.getpid()}:{next(self._serial)}", **PAYLOAD}

    def compute(self) -> dict[str, Any]:
        began = time.monotonic()
        time.sleep(self.plan.compute)
        value = self._value()
        self.computes.append((began, time.monotonic(), value["id"]))
        return value

    async def acompute(self) -> dict[str, Any]:
        began = time.monotonic()
        await asyncio.sleep(self.plan.compute)
        value = self._value()
        self.computes.append((began, time.monotonic(), value["id"]))
        return value

    def read(self, began: float, ended: float, value: Any) -> None:
        self.reads.append((began, ended - began))
        vid = value["id"]
        if vid not in self.seen:
            with self._mutex:
                self.seen.setdefault(vid, ended)

    def failed(self, exc: BaseException) -> None:
        if len(self.errors) < 5:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        else:
            self.errors.append("")

    def result(self, stop_at: float) -> dict[str, Any]:
        return {
            "computes": [c for c in self.computes if c[0] < stop_at],
            "reads": self.reads,
            "seen": self.seen,
            "errors": self.errors,
        }


def _trivial() -> int:
    return 0


async def _atrivial() -> int:
    return 0


def drive_threads(
    contender: Contender, url: str, key: str, plan: Plan, threads: int, start: Callable[[], float]
) -> dict[str, Any]:
    recorder = Recorder(plan)
    if contender.shared:
        clients = [contender.make(url, plan)] * threads
    else:
        clients = [contender.make(url, plan) for _ in range(threads)]
    for read, _ in clients:  # connections opened, scripts loaded
        read(f"warm-{key}", _trivial)
    start_at = start()
    stop_at = start_at + plan.seconds

    def loop(read: Read) -> None:
        compute = recorder.compute
        while time.monotonic() < start_at:
            time.sleep(0.001)
        while True:
            began = time.monotonic()
            if began >= stop_at:
                return
            try:
                value = read(key, compute)
            except Exception as exc:
                recorder.failed(exc)
                time.sleep(plan.think)
                continue
            recorder.read(began, time.monotonic(), value)
            time.sleep(plan.think)

    workers = [threading.Thread(target=loop, args=(read,)) for read, _ in clients]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    time.sleep(plan.compute * 3)  # let a background computation finish
    for _, close in clients[:1] if contender.shared else clients:
        close()
    return recorder.result(stop_at)


async def drive_tasks(
    contender: Contender, url: str, key: str, plan: Plan, tasks: int, start: Callable[[], float]
) -> dict[str, Any]:
    recorder = Recorder(plan)
    if contender.shared:
        clients = [await contender.make(url, plan)] * tasks
    else:
        clients = [await contender.make(url, plan) for _ in range(tasks)]
    for read, _ in clients:
        await read(f"warm-{key}", _atrivial)
    start_at = await asyncio.get_running_loop().run_in_executor(None, start)
    stop_at = start_at + plan.seconds

    async def loop(read: AsyncRead) -> None:
        compute = recorder.acompute
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        while True:
            began = time.monotonic()
            if began >= stop_at:
                return
            try:
                value = await read(key, compute)
            except Exception as exc:
                recorder.failed(exc)
                await asyncio.sleep(plan.think)
                continue
            recorder.read(began, time.monotonic(), value)
            await asyncio.sleep(plan.think)

    await asyncio.gather(*(loop(read) for read, _ in clients))
    await asyncio.sleep(plan.compute * 3)
    for _, close in clients[:1] if contender.shared else clients:
        await close()
    return recorder.result(stop_at)


def child(
    family: str,
    index: int,
    url: str,
    key: str,
    plan_fields: dict[str, Any],
    clients: int,
    ready: Any,
    go: Any,
    start_at: Any,
    out: Any,
) -> None:
    """One process of a configuration: make its clients, say so, wait for the start, run."""
    plan = Plan(**plan_fields)
    contender = FAMILIES[family][index]

    def start() -> float:
        ready.put(os.getpid())
        go.wait()
        return float(start_at.value)

    if family == "async":
        result = asyncio.run(drive_tasks(contender, url, key, plan, clients, start))
    else:
        result = drive_threads(contender, url, key, plan, clients, start)
    out.put(json.dumps(result))


# -- a configuration, measured ------------------------------------------------------


def expiries(computes: list[list[Any]], seen: dict[str, float], ttl: float) -> list[int]:
    """How many computations each expiry had, in order (see the module's docstring)."""
    groups: list[int] = []
    ends = first_seen = -math.inf
    for began, ended, vid in sorted(computes):
        if groups and (began < ends or began < first_seen + ttl / 2):
            groups[-1] += 1
            ends = max(ends, ended)
            first_seen = min(first_seen, seen.get(vid, math.inf))
            continue
        groups.append(1)
        ends = ended
        first_seen = seen.get(vid, math.inf)
    return groups


def _get(queue: Any, processes: list[Any], timeout: float) -> Any:
    """The next message from the children, or an error as soon as one of them has died."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=0.5)
        except Empty:
            dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a client process failed (exit code {dead[0]})") from None
            if time.monotonic() > deadline:
                raise


def run_configuration(
    family: str, index: int, url: str, plan: Plan, procs: int, clients: int
) -> dict[str, Any]:
    context = mp.get_context("spawn")
    ready: Any = context.Queue()
    out: Any = context.Queue()
    go = context.Event()
    start_at = context.Value("d", 0.0)
    key = f"stampede-{uuid.uuid4().hex[:12]}"
    processes = [
        context.Process(
            target=child,
            args=(family, index, url, key, asdict(plan), clients, ready, go, start_at, out),
        )
        for _ in range(procs)
    ]
    for process in processes:
        process.start()
    try:
        for _ in processes:
            _get(ready, processes, 120)
        start_at.value = time.monotonic() + 0.2
        go.set()
        results = [json.loads(_get(out, processes, plan.seconds + 120)) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    computes = [c for r in results for c in r["computes"]]
    reads = [x for r in results for x in r["reads"]]
    latencies = [latency for _, latency in reads]
    seen: dict[str, float] = {}
    for r in results:
        for vid, at in r["seen"].items():
            seen[vid] = min(at, seen.get(vid, math.inf))
    errors = [e for r in results for e in r["errors"]]
    groups = expiries(computes, seen, plan.ttl)
    later = groups[1:]
    # Once warm: reads that began after someone had read the first computed value.
    first = min(computes)[2] if computes else None
    warm_from = seen.get(first, math.inf) if first is not None else math.inf
    warm = [latency for began, latency in reads if began >= warm_from]
    return {
        "computations": len(computes),
        "expiries": len(groups),
        "per expiry": len(computes) / len(groups) if groups else float("nan"),
        "cold start": groups[0] if groups else 0,
        "per later expiry": sum(later) / len(later) if later else float("nan"),
        "reads": len(latencies),
        "p50": percentile(latencies, 50) * 1000,
        "p99": percentile(latencies, 99) * 1000,
        "max": max(latencies) * 1000 if latencies else float("nan"),
        "warm max": max(warm) * 1000 if warm else float("nan"),
        "errors": len(errors),
        "first errors": [e for e in errors if e][:3],
    }


def stampede(url: str, plan: Plan) -> tuple[list[str], dict[str, dict[str, dict[str, Any]]]]:
    shapes = [
        ("threads", "sync", 1, plan.clients, f"{plan.clients} threads in one process"),
        (
            "processes",
            "sync",
            plan.procs,
            plan.threads,
            f"{plan.procs} processes x {plan.threads} threads",
        ),
        ("asyncio", "async", 1, plan.clients, f"{plan.clients} asyncio tasks in one process"),
    ]
    lines: list[str] = []
    measured: dict[str, dict[str, dict[str, Any]]] = {}
    for shape, family, procs, clients, title in shapes:
        lines += [
            f"### The stampede: {title} ({plan.seconds:g} s per row)",
            "",
            "| cache | computations | expiries | per expiry | at the cold start "
            "| per later expiry | reads | p50 ms | p99 ms | max ms | max once warm ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        measured[shape] = {}
        for index, contender in enumerate(FAMILIES[family]):
            row = run_configuration(family, index, url, plan, procs, clients)
            measured[shape][contender.label] = row
            print(
                f"  {shape}: {contender.label}: {row['per expiry']:.2f} per expiry, "
                f"{row['reads']} reads, p99 {row['p99']:.1f} ms, max {row['max']:.1f} ms"
                + (f", {row['errors']} errors {row['first errors']}" if row["errors"] else ""),
                file=sys.stderr,
                flush=True,
            )
            lines.append(
                f"| {contender.label} | {row['computations']} | {row['expiries']} "
                f"| {row['per expiry']:.2f} | {row['cold start']} "
                f"| {row['per later expiry']:.2f} | {row['reads']:,} | {row['p50']:.2f} "
                f"| {row['p99']:.1f} | {row['max']:.1f} | {row['warm max']:.1f} |"
            )
        lines += [
            "",
            "Every client has its own cache object and connection pool, so corral's "
            "in-process singleflight hides nothing, except in the row with one shared cache "
            "per process, which shows what it adds.",
        ]
        failed = [(label, r) for label, r in measured[shape].items() if r["errors"]]
        for label, r in failed:
            lines.append(f"\n{label}: {r['errors']} reads raised, e.g. {r['first errors'][0]}")
        lines.append("")
    return lines, measured


# -- the cost of a hit -----------------------------------------------------------------


def per_call(function: Callable[[], Any], calls: int) -> float:
    """Microseconds per call of `function`, `calls` times in a row."""
    began = time.perf_counter()
    for _ in itertools.repeat(None, calls):
        function()
    return (time.perf_counter() - began) / calls * 1e6


async def aper_call(function: Callable[[], Awaitable[Any]], calls: int) -> float:
    began = time.perf_counter()
    for _ in itertools.repeat(None, calls):
        await function()
    return (time.perf_counter() - began) / calls * 1e6


def interleave(
    contenders: dict[str, Callable[[], Any]], rounds: int, calls: int, what: str
) -> dict[str, float]:
    times: dict[str, list[float]] = {label: [] for label in contenders}
    for round_no in range(rounds):
        order = list(contenders.items())
        if round_no % 2:
            order.reverse()
        for label, function in order:
            times[label].append(per_call(function, calls))
        print(f"  {what} round {round_no + 1}/{rounds}", file=sys.stderr, flush=True)
    return {label: statistics.median(values) for label, values in times.items()}


async def ainterleave(
    contenders: dict[str, Callable[[], Awaitable[Any]]], rounds: int, calls: int, what: str
) -> dict[str, float]:
    times: dict[str, list[float]] = {label: [] for label in contenders}
    for round_no in range(rounds):
        order = list(contenders.items())
        if round_no % 2:
            order.reverse()
        for label, function in order:
            times[label].append(await aper_call(function, calls))
        print(f"  {what} round {round_no + 1}/{rounds}", file=sys.stderr, flush=True)
    return {label: statistics.median(values) for label, values in times.items()}


RAW = "raw redis-py GET + json.loads (floor)"
RAW_AIO = "raw redis.asyncio GET + json.loads (floor)"


def hit_costs(url: str, plan: Plan) -> dict[str, dict[str, float]]:
    import cachetools
    import redis

    import corral

    def compute() -> dict[str, Any]:
        return PAYLOAD

    store = corral.connect(plan.corral_url or url)
    try:
        near = store.cache("near", ttl=300, local_ttl=60)
        near.get_or_compute("k", compute)
        ttl_cache: cachetools.TTLCache[str, Any] = cachetools.TTLCache(maxsize=1024, ttl=60)
        ttl_cache["k"] = PAYLOAD
        near_costs = interleave(
            {
                "cachetools.TTLCache lookup": functools.partial(ttl_cache.__getitem__, "k"),
                "corral get (near hit)": functools.partial(near.get, "k"),
                "corral get_or_compute (near hit)": functools.partial(
                    near.get_or_compute, "k", compute
                ),
            },
            plan.hit_rounds,
            plan.near_calls,
            "near hit",
        )
        remote = store.cache("remote", ttl=3600)
        remote.set("k", PAYLOAD)
        raw = redis.Redis.from_url(url)
        raw.set("raw-k", json.dumps(PAYLOAD))
        for _ in range(200):  # connections, scripts
            remote.get_or_compute("k", compute)
            raw.get("raw-k")

        def raw_hit() -> Any:
            return json.loads(raw.get("raw-k"))  # type: ignore[arg-type]

        remote_costs = interleave(
            {
                RAW: raw_hit,
                "corral get": functools.partial(remote.get, "k"),
                "corral get_or_compute": functools.partial(remote.get_or_compute, "k", compute),
            },
            plan.hit_rounds,
            plan.remote_calls,
            "remote hit",
        )
        raw.close()
    finally:
        store.close()
    aio_costs = asyncio.run(async_hit_costs(url, plan))
    return {"near": near_costs, "remote": remote_costs, "remote aio": aio_costs}


async def async_hit_costs(url: str, plan: Plan) -> dict[str, float]:
    import redis.asyncio

    import corral.aio

    async def compute() -> dict[str, Any]:
        return PAYLOAD

    store = corral.aio.connect(plan.corral_url or url)
    raw = redis.asyncio.Redis.from_url(url)
    try:
        remote = store.cache("remote-aio", ttl=3600)
        await remote.set("k", PAYLOAD)
        await raw.set("raw-k", json.dumps(PAYLOAD))
        for _ in range(200):
            await remote.get_or_compute("k", compute)
            await raw.get("raw-k")

        async def raw_hit() -> Any:
            return json.loads(await raw.get("raw-k"))  # type: ignore[arg-type]

        return await ainterleave(
            {
                RAW_AIO: raw_hit,
                "corral.aio get": functools.partial(remote.get, "k"),
                "corral.aio get_or_compute": functools.partial(remote.get_or_compute, "k", compute),
            },
            plan.hit_rounds,
            plan.remote_calls,
            "asyncio remote hit",
        )
    finally:
        await raw.aclose()
        await store.aclose()


def hit_tables(costs: dict[str, dict[str, float]], plan: Plan) -> list[str]:
    near = costs["near"]
    floor = near["cachetools.TTLCache lookup"]
    lines = [
        f"### A near-cache hit (`local_ttl=60`), {plan.hit_rounds} interleaved rounds of "
        f"{plan.near_calls:,} calls, median",
        "",
        "| call | us per call | x TTLCache |",
        "|---|---:|---:|",
    ]
    lines += [f"| {label} | {us:.2f} | {us / floor:.2f} |" for label, us in near.items()]
    lines += [
        "",
        f"### A remote hit on a fresh entry, {plan.hit_rounds} interleaved rounds of "
        f"{plan.remote_calls:,} calls, median",
        "",
        "| call | us per call | x floor |",
        "|---|---:|---:|",
    ]
    for table, floor_label in (("remote", RAW), ("remote aio", RAW_AIO)):
        base = costs[table][floor_label]
        lines += [f"| {label} | {us:.1f} | {us / base:.2f} |" for label, us in costs[table].items()]
    lines.append("")
    return lines


# -- the targets ------------------------------------------------------------------------


def targets(
    stampedes: dict[str, dict[str, dict[str, Any]]],
    costs: dict[str, dict[str, float]],
    plan: Plan,
) -> list[str]:
    rows: list[tuple[str, str, bool]] = []
    contenders = {c.label: c for c in SYNC + ASYNC}
    naive_label = SYNC[0].label
    corral_rows = [
        (shape, label, row)
        for shape, table in stampedes.items()
        for label, row in table.items()
        if contenders[label].corral
    ]
    worst = max(corral_rows, key=lambda r: r[2]["per expiry"])
    rows.append(
        (
            "1.00 computation per expiry in every corral mode",
            f"worst {worst[2]['per expiry']:.2f} ({worst[0]}: {worst[1]})",
            all(r["per expiry"] <= 1.0 for _, _, r in corral_rows),
        )
    )
    for shape, table in stampedes.items():
        naive_p99 = table[naive_label]["p99"]
        for label, row in table.items():
            if contenders[label].mode != "stale":
                continue
            rows.append(
                (
                    f"{shape}, {label}: p99 ≤ the naive cache's p99",
                    f"{row['p99']:.1f} ms against {naive_p99:.1f} ms",
                    row["p99"] <= naive_p99,
                )
            )
            rows.append(
                (
                    f"{shape}, {label}: max ≤ 100 ms, the cold start included",
                    f"{row['max']:.1f} ms",
                    row["max"] <= 100.0,
                )
            )
            rows.append(
                (
                    f"{shape}, {label}: max ≤ 100 ms once warm",
                    f"{row['warm max']:.1f} ms",
                    row["warm max"] <= 100.0,
                )
            )
    bound = 2 * plan.compute * 1000
    for shape, table in stampedes.items():
        for label, row in table.items():
            if contenders[label].mode == "default":
                rows.append(
                    (
                        f"{shape}, {label}: cold-miss waiters' max ≤ 2x compute ({bound:g} ms)",
                        f"{row['max']:.1f} ms",
                        row["max"] <= bound,
                    )
                )
    near = costs["near"]
    for label in ("corral get (near hit)", "corral get_or_compute (near hit)"):
        rows.append(
            (
                f"{label} ≤ 3 µs",
                f"{near[label]:.2f} µs (TTLCache {near['cachetools.TTLCache lookup']:.2f} µs)",
                near[label] <= 3.0,
            )
        )
    for table, floor_label in (("remote", RAW), ("remote aio", RAW_AIO)):
        base = costs[table][floor_label]
        for label, us in costs[table].items():
            if label == floor_label:
                continue
            rows.append(
                (
                    f"{label}: remote hit ≤ 1.15x GET + json.loads",
                    f"{us / base:.2f}x ({us:.1f} µs against {base:.1f} µs)",
                    us / base <= 1.15,
                )
            )
    lines = ["### Against the targets", "", "| target | measured | |", "|---|---|---|"]
    lines += [
        f"| {what} | {measured} | {'met' if met else '**missed**'} |"
        for what, measured, met in rows
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not for numbers")
    parser.add_argument("--output", type=Path, help="also write the markdown tables here")
    parser.add_argument("--url", help="use this Redis instead of starting a throwaway one")
    parser.add_argument("--corral-url", help="run corral on this store instead of the Redis")
    args = parser.parse_args()
    plan = replace(QUICK if args.quick else FULL, corral_url=args.corral_url)
    began = time.monotonic()

    def run(url: str) -> list[str]:
        import redis

        version = redis.Redis.from_url(url).info("server")["redis_version"]
        print(f"redis-server {version} at {url}", file=sys.stderr, flush=True)
        lines, stampedes = stampede(url, plan)
        costs = hit_costs(url, plan)
        return lines + hit_tables(costs, plan) + targets(stampedes, costs, plan)

    if args.url:
        lines = run(args.url)
    else:
        with throwaway("redis") as url:
            lines = run(url)
    publish(lines, args.output)
    print(f"took {time.monotonic() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
