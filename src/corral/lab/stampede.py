"""The cache stampede, measured: many clients read one expiring key whose computation is slow.

N clients (threads spread over a few processes) each read the same key again
and again, each through its **own** store and cache object, so nothing inside
one process (corral's per-process single flight) hides what happens between
them, as with N web servers sharing one cache. The key's computation sleeps
`compute` seconds and its value is fresh for `ttl` seconds. Each mode is run
for `seconds` on a key of its own:

- ``naive``: `cache.get`, and on a miss compute, then `cache.set`: what most
  code does; every client that misses during the computation computes too.
- ``lock``: `get_or_compute` with corral's defaults: on a miss one client
  computes holding the recompute lock, the others wait for its release.
- ``stale``: `stale_ttl`: one client recomputes, the others get the stale
  value at once.
- ``xfetch``: `early_recompute="xfetch"`: one client recomputes a little
  before expiry, with a probability rising as it nears.
- ``background``: `background=True` with `stale_ttl`: the recompute runs in a
  background thread, so no read waits for it.

Every computation and every read is recorded with its time, in every process,
and sent back to the parent: the counts are exact. Computations are grouped
into **expiries** by the value they replaced (see `expiries`): a computation
belongs to the expiry of the last value that was stored before its read was
sent. The naive cache shows a burst of computations per expiry; each corral
mode shows one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

import corral
from corral.errors import ConfigError

__all__ = [
    "MODES",
    "MODE_NAMES",
    "NAMESPACE",
    "Computation",
    "Config",
    "ExperimentFailed",
    "Expiry",
    "Mode",
    "ModeResult",
    "Read",
    "Samples",
    "cache_options",
    "check",
    "describe",
    "expiries",
    "percentile",
    "plot",
    "run",
    "run_mode",
    "summarize",
    "table",
    "watch_writes",
    "worker_main",
]

NAMESPACE = "corral-lab"
# The clients of every process start reading together, this long after the word is given.
START_DELAY = 0.1
# How long a client process may take to start and connect, or to send its results.
PROCESS_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    label: str
    """What the table and the plot call it."""
    what: str
    """One line: what its clients do."""
    read_through: bool
    """True: clients call `get_or_compute`; False: `get`, then compute and `set`."""


MODES = (
    Mode("naive", "naive get/set", "get; on a miss compute, then set (no corral policy)", False),
    Mode("lock", "corral default", "on a miss one computes, the others wait for it", True),
    Mode("stale", "stale_ttl", "one recomputes, the others get the stale value", True),
    Mode("xfetch", "xfetch", "one recomputes before expiry (each counts as an expiry)", True),
    Mode("background", "background", "stale_ttl, recomputed off the read's path", True),
)
MODE_NAMES = tuple(mode.name for mode in MODES)
_BY_NAME = {mode.name: mode for mode in MODES}


def cache_options(mode: str, ttl: float) -> dict[str, Any]:
    """The `store.cache(...)` options of a mode, beside `ttl`."""
    # Long enough that a stale value is always there to be served while one recomputes.
    stale = 10 * ttl
    options: dict[str, dict[str, Any]] = {
        "naive": {},
        "lock": {},
        "stale": {"stale_ttl": stale},
        "xfetch": {"early_recompute": "xfetch"},
        "background": {"stale_ttl": stale, "background": True},
    }
    return options[mode]


@dataclass(frozen=True, slots=True)
class Config:
    """One run of the experiment; every value is checked here (`ConfigError`)."""

    url: str
    clients: int = 32
    processes: int = 4
    compute: float = 0.05
    """Seconds one computation of the key takes."""
    ttl: float = 1.0
    """Seconds a computed value stays fresh."""
    seconds: float = 5.0
    """Seconds each mode runs."""
    pause: float = 0.01
    """Seconds each client waits between two reads."""
    modes: tuple[str, ...] = MODE_NAMES

    def __post_init__(self) -> None:
        for name in ("clients", "processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.processes > self.clients:
            raise ConfigError(
                f"processes={self.processes} is more than clients={self.clients}: every "
                "process runs at least one client"
            )
        for name, positive in (("compute", False), ("ttl", True), ("seconds", True)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}")
            if positive and value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value!r}")
        if not math.isfinite(self.pause) or self.pause < 0:
            raise ConfigError(f"pause must be a finite number of seconds >= 0, got {self.pause!r}")
        if not self.modes:
            raise ConfigError(f"give at least one mode: {', '.join(MODE_NAMES)}")
        unknown = [mode for mode in self.modes if mode not in _BY_NAME]
        if unknown:
            raise ConfigError(f"unknown mode {unknown[0]!r}; the modes are {', '.join(MODE_NAMES)}")
        if len(set(self.modes)) != len(self.modes):
            raise ConfigError(f"a mode is given twice in {','.join(self.modes)}")

    def spread(self) -> list[int]:
        """How many clients each process runs: as even as can be."""
        share, extra = divmod(self.clients, self.processes)
        return [share + (1 if index < extra else 0) for index in range(self.processes)]


class Read(NamedTuple):
    at: float
    """When the read was sent, in seconds since the mode began."""
    latency: float
    """Seconds until it returned a value (computing it, for who computed)."""


class Computation(NamedTuple):
    """One computation of the key, in seconds since the mode began."""

    seen: float
    """When the read that ran it was sent (a background recompute: when it started)."""
    start: float
    end: float
    stored: float
    """When its value had been written, visible to every client (see `watch_writes`)."""


@dataclass(slots=True)
class Samples:
    """What the clients recorded in one mode; merged across processes."""

    reads: list[Read] = field(default_factory=list)
    computations: list[Computation] = field(default_factory=list)

    def extend(self, other: Samples) -> None:
        self.reads.extend(other.reads)
        self.computations.extend(other.computations)

    def to_json(self) -> dict[str, Any]:
        return {
            "reads": [[round(value, 6) for value in read] for read in self.reads],
            "computations": [[round(value, 6) for value in c] for c in self.computations],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Samples:
        return cls(
            [Read(*read) for read in data["reads"]],
            [Computation(*c) for c in data["computations"]],
        )


class Expiry(NamedTuple):
    at: float
    """When its first computation started."""
    computations: tuple[Computation, ...]


def expiries(computations: Iterable[Computation]) -> list[Expiry]:
    """The computations grouped by the value they replaced, in time order.

    A computation replaces the last value stored before its read was sent
    (none, for the first ones): computations whose reads were sent while the
    same value was the latest stored one answer the same expiry. So the naive
    cache's clients that all miss before the first of them stores count as
    one expiry with many computations, and corral's one computation per
    expiry (it starts once the previous one is stored) counts as one. A client
    that decided to compute from a read sent before another's value was stored
    (a duplicate, whenever it runs) counts in that other's expiry, so it shows.
    """
    ordered = sorted(computations, key=lambda c: (c.start, c.seen))
    stored = sorted(c.stored for c in ordered)
    groups: dict[int, list[Computation]] = {}
    for computation in ordered:
        groups.setdefault(bisect_right(stored, computation.seen), []).append(computation)
    return [Expiry(group[0].start, tuple(group)) for _, group in sorted(groups.items())]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile `q` (0 < q <= 100) of `values`; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One mode's numbers, as the table prints them, with the samples the plot draws."""

    mode: Mode
    samples: Samples
    expiries: list[Expiry]
    reads: int
    computes: int
    per_expiry: float
    """Computations per expiry: computes / expiries."""
    most: int
    """The most computations any one expiry had."""
    p50: float
    p99: float
    max: float
    """Read latencies, in milliseconds."""


def summarize(mode: str, samples: Samples) -> ModeResult:
    found = expiries(samples.computations)
    latencies = [read.latency * 1000 for read in samples.reads]
    computes = len(samples.computations)
    return ModeResult(
        mode=_BY_NAME[mode],
        samples=samples,
        expiries=found,
        reads=len(samples.reads),
        computes=computes,
        per_expiry=computes / len(found) if found else 0.0,
        most=max((len(expiry.computations) for expiry in found), default=0),
        p50=percentile(latencies, 50),
        p99=percentile(latencies, 99),
        max=max(latencies, default=math.nan),
    )


def describe(config: Config) -> str:
    """The setup in one line, for the table's and the plot's title."""
    clients = f"{config.clients} client{'s' if config.clients > 1 else ''}"
    where = f"{config.processes} process{'es' if config.processes > 1 else ''}"
    return (
        f"{clients} in {where} read one key: computation {config.compute * 1000:g} ms, "
        f"ttl {config.ttl:g} s, {config.seconds:g} s per mode"
    )


def table(results: Sequence[ModeResult]) -> str:
    """The results as a plain-text table, one row per mode, then what each mode does."""
    header = (
        "mode",
        "expiries",
        "computes",
        "per expiry",
        "most in one",
        "reads",
        "p50 ms",
        "p99 ms",
        "max ms",
    )
    rows = [
        (
            result.mode.name,
            str(len(result.expiries)),
            str(result.computes),
            f"{result.per_expiry:.2f}",
            str(result.most),
            str(result.reads),
            f"{result.p50:.2f}",
            f"{result.p99:.2f}",
            f"{result.max:.2f}",
        )
        for result in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    legend = [f"  {result.mode.name}: {result.mode.what}" for result in results]
    return "\n".join([line(header), *(line(row) for row in rows), "", *legend])


# -- the clients ---------------------------------------------------------------------


class ExperimentFailed(Exception):
    """A client or a client process failed; the message says which and why."""


# The computation this thread ran whose value it has not stored yet: a record
# [seen, start, end, stored] in wall-clock seconds, completed by `watch_writes`.
_this_thread = threading.local()


def watch_writes(store: corral.Store) -> corral.Store:
    """Make `store` note when each computation's value is written (see `run_mode`).

    The cache computes, then writes the value with the backend's `cache_store`,
    in the same thread; the value is visible to every client by the time that
    returns, so that moment is the computation's `stored`.
    """
    backend = store.backend
    write = backend.cache_store

    def cache_store(items: Sequence[tuple[str, bytes, float]]) -> None:
        write(items)
        record = getattr(_this_thread, "unstored", None)
        if record is not None:
            record[3] = time.time()
            _this_thread.unstored = None

    backend.cache_store = cache_store  # type: ignore[method-assign]
    return store


def run_mode(
    caches: Sequence[corral.Cache],
    mode: str,
    key: str,
    *,
    begin: float,
    seconds: float,
    compute: float,
    pause: float,
) -> Samples:
    """One client thread per cache reads `key` from `begin` (wall clock) for `seconds`.

    Returns when every client stopped and every computation it started (in the
    background too) has stored its value, with the times in seconds since `begin`.
    A computation's `stored` is when its value was written if the caches' stores
    went through `watch_writes`, else (a lower bound) when it ended.
    """
    kind = _BY_NAME[mode]
    stop = begin + seconds
    records: list[list[float]] = []
    errors: list[BaseException] = []
    guard = threading.Lock()
    in_flight = 0

    def work() -> dict[str, float]:
        nonlocal in_flight
        with guard:
            in_flight += 1
        start = time.time()
        try:
            time.sleep(compute)
        finally:
            end = time.time()
            with guard:
                in_flight -= 1
        # Run by a client's call, its read was sent when the client sent it; run in
        # the background (no client's thread), it was decided just before it started.
        sent = getattr(_this_thread, "sent", None)
        record = [start if sent is None else sent, start, end, end]
        with guard:
            records.append(record)
        _this_thread.unstored = record
        return {"computed_at": round(start - begin, 6)}

    def client(cache: corral.Cache, reads: list[Read]) -> None:
        try:
            _sleep_until(begin)
            while (sent_at := time.time()) < stop:
                ticks = time.perf_counter()
                _this_thread.sent, _this_thread.unstored = sent_at, None
                if kind.read_through:
                    cache.get_or_compute(key, work)
                elif cache.get(key, _MISSING) is _MISSING:
                    cache.set(key, work())
                reads.append(Read(sent_at - begin, time.perf_counter() - ticks))
                if pause:
                    time.sleep(pause)
        except BaseException as exc:
            with guard:
                errors.append(exc)

    per_client: list[list[Read]] = [[] for _ in caches]
    threads = [
        threading.Thread(
            target=client, args=(cache, reads), name=f"corral-lab-client-{n}", daemon=True
        )
        for n, (cache, reads) in enumerate(zip(caches, per_client, strict=True))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise ExperimentFailed(f"a client failed in mode {mode}: {errors[0]!r}") from errors[0]
    # Background recomputes started by the last reads: wait until they have stored.
    settled = stop + 2 * compute + 0.2
    give_up = settled + 10 + compute
    while (now := time.time()) < give_up:
        with guard:
            busy = in_flight
        if not busy and now >= settled:
            break
        time.sleep(0.01)
    with guard:
        computations = [Computation(*(value - begin for value in r)) for r in records]
    return Samples([read for reads in per_client for read in reads], computations)


_MISSING: Any = object()


def _sleep_until(moment: float) -> None:
    while (left := moment - time.time()) > 0:
        time.sleep(left)


def _open_caches(stores: Sequence[corral.Store], mode: str, ttl: float) -> list[corral.Cache]:
    return [store.cache(NAMESPACE, ttl, **cache_options(mode, ttl)) for store in stores]


def worker_main(source: IO[str] | None = None, sink: IO[str] | None = None) -> None:
    """A client process: reads its setup, then runs each mode when the parent says go.

    One JSON object per line each way. The parent sends the setup, then
    `{"go": BEGIN}` per mode; this sends `{"ready": true}` before each mode and
    `{"samples": ...}` after it, or `{"error": "..."}` and stops.
    """
    source = sys.stdin if source is None else source
    sink = sys.stdout if sink is None else sink

    def send(message: dict[str, Any]) -> None:
        sink.write(json.dumps(message) + "\n")
        sink.flush()

    setup = json.loads(source.readline())
    stores: list[corral.Store] = []
    try:
        stores = [watch_writes(corral.connect(setup["url"])) for _ in range(setup["clients"])]
        for mode in setup["modes"]:
            caches = _open_caches(stores, mode, setup["ttl"])
            send({"ready": True})
            line = source.readline()
            if not line:
                return  # the parent is gone
            samples = run_mode(
                caches,
                mode,
                setup["keys"][mode],
                begin=json.loads(line)["go"],
                seconds=setup["seconds"],
                compute=setup["compute"],
                pause=setup["pause"],
            )
            send({"samples": samples.to_json()})
    except Exception as exc:
        send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        for store in stores:
            store.close()


class _Clients:
    """Runs the clients of one mode at a time, somewhere; the parent waits for them."""

    def prepare(self) -> None:
        """Wait until every client is connected and ready for the next mode."""
        raise NotImplementedError

    def go(self, begin: float) -> None:
        raise NotImplementedError

    def collect(self, timeout: float, tick: Callable[[], None]) -> Samples:
        """The mode's samples from every client, calling `tick` often meanwhile."""
        raise NotImplementedError

    def close(self, *, abort: bool = False) -> None:
        """Stop the clients: once they are done, or at once with `abort`."""
        raise NotImplementedError


# A client process. The parent stops it (closing its stdin, or killing it): a Ctrl-C
# at the terminal, which reaches the whole process group, is the parent's to handle.
_WORKER = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "from corral.lab.stampede import worker_main; worker_main()"
)


class _Processes(_Clients):
    """Client processes, each running its share of the clients in threads."""

    def __init__(self, config: Config, keys: dict[str, str]) -> None:
        self._messages: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self._pending: list[deque[dict[str, Any] | None]] = [deque() for _ in config.spread()]
        self._procs: list[subprocess.Popen[str]] = []
        env = dict(os.environ)
        # The children import the same corral as this process, installed or not.
        here = str(Path(corral.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
        setup = {
            "url": config.url,
            "ttl": config.ttl,
            "seconds": config.seconds,
            "compute": config.compute,
            "pause": config.pause,
            "modes": list(config.modes),
            "keys": keys,
        }
        try:
            for index, clients in enumerate(config.spread()):
                proc = subprocess.Popen(
                    [sys.executable, "-c", _WORKER],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                    text=True,
                )
                self._procs.append(proc)
                self._send(proc, {**setup, "clients": clients})
                threading.Thread(
                    target=self._listen, args=(index, proc), daemon=True, name="corral-lab-reader"
                ).start()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _send(proc: subprocess.Popen[str], message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()

    def _listen(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._messages.put((index, json.loads(line)))
        self._messages.put((index, None))

    def _gather(self, what: str, timeout: float, tick: Callable[[], None]) -> list[Any]:
        """The next message of each process, which must be `what` (or an error)."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(self._procs):
            tick()
            if time.monotonic() > deadline:
                raise ExperimentFailed(f"a client process sent no {what} within {timeout:.0f} s")
            try:
                index, message = self._messages.get(timeout=0.1)
            except queue.Empty:
                continue
            # A fast process may send its next message before a slow one sent this one.
            self._pending[index].append(message)
            for index, pending in enumerate(self._pending):
                if index in got or not pending:
                    continue
                message = pending.popleft()
                if message is None:
                    status = self._procs[index].wait()
                    raise ExperimentFailed(f"client process {index + 1} exited ({status}) early")
                if "error" in message:
                    raise ExperimentFailed(f"client process {index + 1}: {message['error']}")
                got[index] = message[what]
        return [got[index] for index in range(len(self._procs))]

    def prepare(self) -> None:
        self._gather("ready", PROCESS_TIMEOUT, lambda: None)

    def go(self, begin: float) -> None:
        for proc in self._procs:
            self._send(proc, {"go": begin})

    def collect(self, timeout: float, tick: Callable[[], None]) -> Samples:
        merged = Samples()
        for data in self._gather("samples", timeout, tick):
            merged.extend(Samples.from_json(data))
        return merged

    def close(self, *, abort: bool = False) -> None:
        for proc in self._procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=0 if abort else 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


class _Threads(_Clients):
    """Every client in this process, on one store: for stores that live in a process.

    Each client still has its own cache object, so none shares another's
    in-process single flight.
    """

    def __init__(self, config: Config, keys: dict[str, str]) -> None:
        self._config = config
        self._keys = keys
        self._modes = iter(config.modes)
        self._store = watch_writes(corral.connect(config.url))
        self._mode = ""
        self._caches: list[corral.Cache] = []
        self._result: list[Samples | BaseException] = []
        self._thread: threading.Thread | None = None

    def prepare(self) -> None:
        self._mode = next(self._modes)
        self._caches = _open_caches(
            [self._store] * self._config.clients, self._mode, self._config.ttl
        )

    def go(self, begin: float) -> None:
        config = self._config

        def target() -> None:
            try:
                self._result.append(
                    run_mode(
                        self._caches,
                        self._mode,
                        self._keys[self._mode],
                        begin=begin,
                        seconds=config.seconds,
                        compute=config.compute,
                        pause=config.pause,
                    )
                )
            except BaseException as exc:
                self._result.append(exc)

        self._result = []
        self._thread = threading.Thread(target=target, name="corral-lab-clients", daemon=True)
        self._thread.start()

    def collect(self, timeout: float, tick: Callable[[], None]) -> Samples:
        assert self._thread is not None
        deadline = time.monotonic() + timeout
        while self._thread.is_alive():
            tick()
            if time.monotonic() > deadline:
                raise ExperimentFailed(f"the clients did not finish within {timeout:.0f} s")
            self._thread.join(0.1)
        (outcome,) = self._result
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self, *, abort: bool = False) -> None:
        # An aborted mode's client threads (daemons) are left to end with the process.
        self._store.close()


def check(config: Config) -> bool:
    """Whether the store can hold the experiment's cache (`ConfigError` if not); True when
    its clients run in processes of their own, False when in threads of this one."""
    with corral.connect(config.url) as store:
        store.cache(NAMESPACE)
        shared = store.capabilities.cross_process
    if not shared and config.processes > 1:
        raise ConfigError(
            f"{store.server} keeps its entries inside one process: run the clients in one "
            "process (--processes 1), or use a store that processes share (sqlite:///PATH, "
            "redis://...)"
        )
    return shared


Progress = Callable[[int, str, float], None]
"""Called often while a mode runs: the mode's index, its name, the fraction of it done."""


def run(config: Config, progress: Progress | None = None) -> list[ModeResult]:
    """Run every mode of `config` in turn; the results in the same order."""
    shared = check(config)
    tag = uuid.uuid4().hex[:8]
    keys = {mode: f"stampede-{tag}-{mode}" for mode in config.modes}
    clients: _Clients = _Processes(config, keys) if shared else _Threads(config, keys)
    results = []
    try:
        for index, mode in enumerate(config.modes):
            clients.prepare()
            begin = time.time() + START_DELAY
            clients.go(begin)

            def tick(index: int = index, mode: str = mode, begin: float = begin) -> None:
                if progress is not None:
                    done = (time.time() - begin) / config.seconds
                    progress(index, mode, min(1.0, max(0.0, done)))

            timeout = START_DELAY + config.seconds + 2 * config.compute + PROCESS_TIMEOUT
            samples = clients.collect(timeout, tick)
            results.append(summarize(mode, samples))
    except BaseException:
        clients.close(abort=True)
        raise
    clients.close()
    return results


# -- the plot ---------------------------------------------------------------------


def plot(results: Sequence[ModeResult], config: Config, path: str | os.PathLike[str]) -> None:
    """Draw one row per mode: read latency over time, and each computation over time.

    Needs matplotlib (`pip install 'corral[lab]'`); raises ImportError without it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = len(results)
    figure = Figure(figsize=(12, 1.0 + 2.3 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 2, sharex=True, sharey="col", squeeze=False, width_ratios=(3, 2))
    most = max((result.most for result in results), default=1)
    fastest = min(
        (read.latency * 1000 for result in results for read in result.samples.reads),
        default=0.01,
    )
    for row, result in enumerate(results):
        latency, computing = axes[row]
        reads = result.samples.reads
        for expiry in result.expiries:
            latency.axvline(expiry.at, color="0.85", linewidth=0.8, zorder=0)
            computing.axvline(expiry.at, color="0.85", linewidth=0.8, zorder=0)
        latency.scatter(
            [read.at for read in reads],
            [max(read.latency * 1000, 0.001) for read in reads],
            s=5,
            alpha=0.35,
            linewidths=0,
            color="tab:blue",
            rasterized=True,
        )
        latency.set_yscale("log")
        latency.set_ylim(max(0.001, fastest * 0.7), None)
        latency.set_ylabel("read latency, ms")
        latency.set_title(f"{result.mode.label}: {result.mode.what}", loc="left", fontsize="medium")
        xs = [c.start for expiry in result.expiries for c in expiry.computations]
        ys = [n for expiry in result.expiries for n in range(1, len(expiry.computations) + 1)]
        computing.scatter(xs, ys, s=14, marker="s", color="tab:red")
        computing.set_ylim(0, most + 1)
        computing.set_ylabel("computations\nper expiry")
        computing.set_title(
            f"{result.computes} computations in {len(result.expiries)} expiries: "
            f"{result.per_expiry:.2f} per expiry",
            loc="left",
            fontsize="medium",
        )
    for ax in axes[-1]:
        ax.set_xlabel("seconds since the mode began")
    figure.suptitle(f"{describe(config)} (grey lines: expiries)")
    figure.savefig(path, dpi=100)
