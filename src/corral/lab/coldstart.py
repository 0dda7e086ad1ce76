"""A deploy empties the cache: `corral lab coldstart`, with and without TTL jitter.

Right after a deploy (or a cache flush) every user comes back to an empty
cache: each user's first visit misses on each of their keys and fills them,
all within the first minutes. With a fixed TTL those entries then expire
together, one TTL later, and the users' next visits miss together again: the
deploy's spike comes back every TTL. Jitter gives each entry a TTL drawn in
``[ttl * (1 - j), ttl * (1 + j)]``, which spreads each wave of refills; by key
(`jitter_by="key"`) each key keeps its own factor, so its refills drift
further apart from the others' at every TTL.

The model, in simulated time (nothing sleeps; the same `seed` gives the same
numbers):

- `users` users arrive after the deploy at exponentially distributed times
  of mean `arrival` seconds: most at once (their sessions were open), the
  rest over the next minutes;
- each user owns `keys` keys and visits again and again, at exponentially
  distributed gaps of mean `revisit` seconds; a visit reads all the user's
  keys, and each key whose entry has expired (or was never filled) is a
  miss, filled again at once for its TTL;
- every mode replays the same arrivals and visits; only the TTLs differ,
  each drawn with `corral.core.cachepolicy.jitter_factor`, the function the
  cache itself uses.
"""

from __future__ import annotations

import math
import os
import random
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from corral.core.cachepolicy import jitter_factor
from corral.errors import ConfigError

__all__ = [
    "MODES",
    "MODE_NAMES",
    "Config",
    "Mode",
    "ModeResult",
    "describe",
    "plot",
    "run",
    "table",
]


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    jitter_by: str | None
    """None: a fixed TTL; else the cache's `jitter_by`."""

    def label(self, jitter: float) -> str:
        if self.jitter_by is None:
            return "fixed TTL"
        return f"jitter ±{jitter:.0%}, {'random' if self.jitter_by == 'random' else 'by key'}"

    def what(self, jitter: float) -> str:
        if self.jitter_by is None:
            return "every entry lives exactly ttl"
        if self.jitter_by == "random":
            return f"cache(jitter={jitter:g}): each write draws its TTL factor anew"
        return f'cache(jitter={jitter:g}, jitter_by="key"): each key keeps its own factor'


MODES = (Mode("fixed", None), Mode("random", "random"), Mode("key", "key"))
MODE_NAMES = tuple(mode.name for mode in MODES)


@dataclass(frozen=True, slots=True)
class Config:
    """One run; every value is checked here (`ConfigError`)."""

    users: int = 10_000
    keys: int = 5
    """Keys per user."""
    ttl: float = 600.0
    jitter: float = 0.05
    arrival: float = 30.0
    """Mean seconds from the deploy to a user's first visit."""
    revisit: float = 10.0
    """Mean seconds between two visits of one user."""
    periods: int = 3
    """TTLs simulated after the deploy's."""
    seed: int = 1

    def __post_init__(self) -> None:
        for name, least in (("users", 1), ("keys", 1), ("periods", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        for name in ("ttl", "arrival", "revisit"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if self.ttl < 10:
            raise ConfigError(
                f"ttl must be at least 10 s (misses are counted per second), got {self.ttl!r}"
            )
        if not isinstance(self.jitter, (int, float)) or not 0 < self.jitter < 1:
            raise ConfigError(
                f"jitter must be a fraction of ttl between 0 and 1, got {self.jitter!r}"
            )
        if self.users * (self.periods + 0.5) * self.ttl / self.revisit > 200_000_000:
            raise ConfigError(
                "that is more than 200 million visits to simulate: fewer --users or "
                "--periods, or a longer --revisit"
            )

    @property
    def seconds(self) -> int:
        """How long the simulation runs: the deploy, then `periods` TTLs and half of one."""
        return math.ceil((self.periods + 0.5) * self.ttl)

    def window(self, period: int) -> tuple[float, float]:
        """The seconds counted as period `period`: the deploy's, or around its k-th TTL."""
        if period == 0:
            return 0.0, self.ttl / 2
        return (period - 0.5) * self.ttl, (period + 0.5) * self.ttl


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: Mode
    per_second: list[int]
    """Misses in each second since the deploy."""
    peaks: list[int]
    """The most misses in one second, per period (the deploy's first)."""
    misses: int


Progress = Callable[[int, str, float], None]


def run(config: Config, progress: Progress | None = None) -> list[ModeResult]:
    """Simulate every mode on the same users and visits; results in `MODES` order."""
    end = config.seconds
    visits_rng = random.Random(config.seed)
    draws = {mode.name: random.Random(f"{config.seed}:{mode.name}") for mode in MODES}
    counts = {mode.name: [0] * end for mode in MODES}
    every = max(1, config.users // 200)
    for user in range(config.users):
        first = visits_rng.expovariate(1 / config.arrival)
        visits = []
        moment = first
        while moment < end:
            visits.append(moment)
            moment += visits_rng.expovariate(1 / config.revisit)
        if not visits:
            continue
        for index in range(config.keys):
            key = f"user:{user}:{index}"
            for mode in MODES:
                bucket = counts[mode.name]
                draw = draws[mode.name].random
                by = mode.jitter_by
                fixed: float | None = None
                if by is None:
                    fixed = 1.0
                elif by == "key":
                    # By key a key's factor never changes: the draw is not used.
                    fixed = jitter_factor(config.jitter, by, key, 0.0)
                at = visits[0]
                while True:
                    bucket[int(at)] += 1
                    factor = (
                        fixed
                        if fixed is not None
                        else jitter_factor(config.jitter, "random", key, draw())
                    )
                    expires = at + config.ttl * factor
                    # The first visit at or after the expiry misses.
                    found = bisect_left(visits, expires)
                    if found == len(visits):
                        break
                    at = visits[found]
        if progress is not None and (user % every == 0 or user == config.users - 1):
            progress(0, "simulate", (user + 1) / config.users)
    results = []
    for mode in MODES:
        per_second = counts[mode.name]
        peaks = []
        for period in range(config.periods + 1):
            start, stop = config.window(period)
            peaks.append(max(per_second[math.ceil(start) : math.ceil(stop)], default=0))
        results.append(ModeResult(mode, per_second, peaks, sum(per_second)))
    return results


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def describe(config: Config) -> str:
    return (
        f"{config.users:,} users with {config.keys} keys each arrive after a deploy "
        f"(mean {_minutes(config.arrival)}), revisit every {_minutes(config.revisit)} on "
        f"average; ttl {_minutes(config.ttl)}, seed {config.seed}"
    )


def _period_name(period: int, config: Config) -> str:
    if period == 0:
        return "deploy"
    return f"{period} x ttl"


def table(results: Sequence[ModeResult], config: Config) -> str:
    """Peak misses per second around the deploy and each TTL after it, per mode."""
    header = (
        "peak misses/s",
        *(_period_name(p, config) for p in range(config.periods + 1)),
        "misses",
    )
    rows = [
        (
            result.mode.label(config.jitter),
            *(f"{peak:,}" for peak in result.peaks),
            f"{result.misses:,}",
        )
        for result in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    windows = ", ".join(
        f"{_period_name(p, config)}: {_minutes(a)}-{_minutes(b)}"
        for p, (a, b) in ((p, config.window(p)) for p in range(config.periods + 1))
    )
    legend = [f"  {r.mode.label(config.jitter)}: {r.mode.what(config.jitter)}" for r in results]
    return "\n".join(
        [line(header), *(line(row) for row in rows), "", f"  periods: {windows}", *legend]
    )


_COLOURS = {"fixed": "tab:red", "random": "tab:blue", "key": "tab:green"}


def plot(results: Sequence[ModeResult], config: Config, path: str | os.PathLike[str]) -> None:
    """Misses per second over time, one line per mode; below, each TTL's wave up close.

    Needs matplotlib (`pip install 'corral[lab]'`); raises ImportError without it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 8), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, config.periods, height_ratios=(3, 2))
    whole = figure.add_subplot(grid[0, :])
    minutes = [second / 60 for second in range(config.seconds)]
    for result in results:
        whole.plot(
            minutes,
            result.per_second,
            color=_COLOURS[result.mode.name],
            linewidth=1,
            alpha=0.85,
            label=result.mode.label(config.jitter),
        )
    for period in range(1, config.periods + 1):
        whole.axvline(period * config.ttl / 60, color="0.6", linestyle=":", linewidth=1)
    whole.set_xlim(0, config.seconds / 60)
    whole.set_ylim(0, None)
    whole.set_xlabel("minutes since the deploy (dotted: each TTL)")
    whole.set_ylabel("cache misses per second")
    whole.set_title(describe(config), loc="left", fontsize="medium")
    whole.grid(alpha=0.3)
    whole.legend(loc="upper right")
    top = max(max(r.per_second[math.ceil(config.ttl / 2) :], default=1) for r in results)
    for period in range(1, config.periods + 1):
        ax = figure.add_subplot(grid[1, period - 1], sharey=None)
        start, stop = period * config.ttl * 0.8, period * config.ttl * 1.2
        start = max(start, (period - 0.5) * config.ttl)
        stop = min(stop, (period + 0.5) * config.ttl)
        span = range(math.ceil(start), min(math.ceil(stop), config.seconds))
        for result in results:
            ax.plot(
                [second / 60 for second in span],
                [result.per_second[second] for second in span],
                color=_COLOURS[result.mode.name],
                linewidth=1,
            )
            ax.text(
                0.02,
                0.95 - 0.1 * MODES.index(result.mode),
                f"peak {result.peaks[period]:,}/s",
                transform=ax.transAxes,
                color=_COLOURS[result.mode.name],
                verticalalignment="top",
                fontsize="small",
            )
        ax.set_ylim(0, top * 1.1)
        ax.set_title(f"around {period} x ttl ({_minutes(period * config.ttl)})", fontsize="medium")
        ax.set_xlabel("minutes")
        ax.grid(alpha=0.3)
        if period == 1:
            ax.set_ylabel("misses per second")
    figure.suptitle(
        "corral lab coldstart: the deploy's miss spike comes back every TTL, "
        "unless TTLs are jittered",
        fontweight="bold",
    )
    figure.savefig(path, dpi=100)
