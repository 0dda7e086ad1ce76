"""The read-through cache's decisions, with no I/O: serve, recompute, wait or fail.

The cache driver (`corral._async.cache`) reads an entry, hands it here with
the time and what the read's claim on the recompute lock answered, and
performs what comes back. Every rule of SPEC's "Cache" section lives in this
file, where a fake clock and a chosen random draw test each branch exactly:

- fresh: return it; with XFetch, a caller recomputes early with a probability
  that rises towards expiry, without waiting for the lock;
- stale (past fresh, within `stale_ttl`): whoever wins the lock recomputes (or
  schedules it in the background), everyone else is served the stale value;
- missing: whoever wins the lock computes; the others wait for its release and
  read again, and when the wait runs out compute themselves or raise;
- a remembered error (`error_ttl`): serve the stale value, else fail fast;
- the computation raises: serve the stale value if there is one.
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass

from corral.core.envelope import Entry
from corral.errors import ConfigError

__all__ = [
    "Action",
    "CacheOptions",
    "Decision",
    "after_compute_error",
    "after_wait_timeout",
    "decide",
    "jitter_factor",
    "server_keep",
    "xfetch_due",
]

ON_TIMEOUT = ("compute", "raise")
JITTER_BY = ("random", "key")
EARLY = (None, "xfetch")
# The server keeps even an entry that is due at once a moment, so a stale reader
# and the one recomputing see the same bytes.
MIN_KEEP = 1.0


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """A cache's settings, validated once (SPEC's `store.cache(...)` arguments)."""

    ttl: float = 300.0
    stale_ttl: float = 0.0
    jitter: float = 0.0
    jitter_by: str = "random"
    lock_wait: float = 5.0
    on_timeout: str = "compute"
    early_recompute: str | None = None
    beta: float = 1.0
    background: bool = False
    error_ttl: float = 0.0
    local_ttl: float = 0.0

    def __post_init__(self) -> None:
        check_seconds("ttl", self.ttl, positive=True)
        check_seconds("stale_ttl", self.stale_ttl)
        check_seconds("lock_wait", self.lock_wait)
        check_seconds("error_ttl", self.error_ttl)
        check_seconds("local_ttl", self.local_ttl)
        check_seconds("jitter", self.jitter)
        if self.jitter > 1:
            raise ConfigError(
                f"jitter must be between 0 and 1 (a fraction of ttl), got {self.jitter!r}"
            )
        check_seconds("beta", self.beta)
        if self.jitter_by not in JITTER_BY:
            raise ConfigError(f"jitter_by must be 'random' or 'key', got {self.jitter_by!r}")
        if self.on_timeout not in ON_TIMEOUT:
            raise ConfigError(f"on_timeout must be 'compute' or 'raise', got {self.on_timeout!r}")
        if self.early_recompute not in EARLY:
            raise ConfigError(
                f"early_recompute must be None or 'xfetch', got {self.early_recompute!r}"
            )


def check_seconds(what: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ConfigError(f"{what} must be finite, got {value!r}")
    if positive and seconds <= 0:
        raise ConfigError(f"{what} must be > 0, got {value!r}")
    if seconds < 0:
        raise ConfigError(f"{what} must be >= 0, got {value!r}")
    return seconds


class Action(enum.Enum):
    RETURN = "return"
    """Return the entry's value (fresh, or stale and servable)."""
    RECOMPUTE = "recompute"
    """This caller holds the recompute lock: compute, store, release, return the new value."""
    RECOMPUTE_IN_BACKGROUND = "background"
    """This caller holds the lock: hand it to a background recompute, return the value now."""
    TRY_EARLY = "try-early"
    """XFetch fired on a fresh entry: try the lock without waiting; if busy, return the value."""
    TRY_LOCK = "try-lock"
    """Nothing usable, and the read made no claim (the server judged an entry fresh that
    this process cannot decode): try the lock without waiting; if busy, wait."""
    WAIT = "wait"
    """Another caller computes: wait for its release (up to lock_wait), then read again."""
    RELEASE_AND_RETURN = "release-and-return"
    """The claim was won but nothing needs computing (a remembered error): release, return."""
    FAIL = "fail"
    """A remembered error and no value to serve: raise SourceUnavailable."""


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    stale: bool = False
    """The value returned (or kept while recomputing) is past its freshness."""
    early: bool = False
    """The recompute is an early one (XFetch), the value is still fresh."""


def jitter_factor(jitter: float, jitter_by: str, routing_key: str, draw: float) -> float:
    """The TTL multiplier in [1 - jitter, 1 + jitter]: from `draw` in [0, 1), or the key.

    By key, one key always gets the same factor (so a fleet that warms the same
    keys does not expire them together, and an entry's lifetime is predictable).
    """
    if jitter <= 0:
        return 1.0
    if jitter_by == "key":
        digest = hashlib.blake2b(routing_key.encode("utf-8", "surrogatepass"), digest_size=8)
        draw = int.from_bytes(digest.digest(), "big") / 2.0**64
    return 1.0 - jitter + 2.0 * jitter * draw


def server_keep(
    fresh_until: float, now: float, stale_ttl: float, retry_until: float = 0.0
) -> float:
    """How long the server keeps an entry: until fresh_until + stale_ttl, or the error's end.

    Never below `MIN_KEEP`, so an entry written already due is still readable.
    """
    return max(max(fresh_until + stale_ttl, retry_until) - now, MIN_KEEP)


def xfetch_due(now: float, delta: float, beta: float, fresh_until: float, draw: float) -> bool:
    """XFetch (Vattani et al.): recompute when `now - delta*beta*ln(draw) >= fresh_until`.

    `draw` is uniform in (0, 1]; the expected head start is `delta * beta`, so a
    slow computation starts earlier than a fast one.
    """
    if delta <= 0 or beta <= 0:
        return now >= fresh_until
    draw = min(max(draw, 1e-300), 1.0)
    return now - delta * beta * math.log(draw) >= fresh_until


def servable_stale(entry: Entry, now: float, stale_ttl: float) -> bool:
    """A stale value may still be served: within stale_ttl of its freshness, or invalidated.

    An invalidated entry (fresh_until 0) is kept by the server exactly stale_ttl
    after the invalidation, so its presence is the test.
    """
    if not entry.has_value or stale_ttl <= 0:
        return False
    fresh_until = entry.header.fresh_until
    return fresh_until == 0.0 or now < fresh_until + stale_ttl


def decide(
    entry: Entry | None,
    *,
    now: float,
    won: bool | None,
    options: CacheOptions,
    draw: float,
) -> Decision:
    """What to do with a read.

    `entry` is the decoded entry (None when missing, undecodable or of another
    generation); `now` is the time the read's claim was judged against; `won`
    is whether that claim took the recompute lock (None: no claim was made).
    `draw` is a uniform random number in (0, 1] for XFetch.
    """
    if entry is None:
        return Decision(_missing(won))
    header = entry.header
    if header.retry_until > now:
        # The computation failed recently, and every process remembers it: serve what
        # may be served (a fresh value, or a stale one within stale_ttl), else fail fast.
        fresh = entry.has_value and now < header.fresh_until
        if fresh or servable_stale(entry, now, options.stale_ttl):
            action = Action.RELEASE_AND_RETURN if won else Action.RETURN
            return Decision(action, stale=not fresh)
        return Decision(Action.FAIL)
    if entry.has_value and now < header.fresh_until:
        if won:  # the claim was made early on purpose
            return Decision(
                Action.RECOMPUTE_IN_BACKGROUND if options.background else Action.RECOMPUTE,
                early=True,
            )
        if options.early_recompute == "xfetch" and xfetch_due(
            now, header.delta, options.beta, header.fresh_until, draw
        ):
            return Decision(Action.TRY_EARLY, early=True)
        return Decision(Action.RETURN)
    if servable_stale(entry, now, options.stale_ttl):
        if won:
            return Decision(
                Action.RECOMPUTE_IN_BACKGROUND if options.background else Action.RECOMPUTE,
                stale=True,
            )
        if won is None:
            # Judged stale here though the claim found it fresh: both used `now`, so
            # only a clock step between them gets here. Ask for the lock now.
            return Decision(Action.TRY_EARLY, stale=True)
        return Decision(Action.RETURN, stale=True)
    # Too old to serve (or nothing to serve): as good as missing.
    return Decision(_missing(won))


def _missing(won: bool | None) -> Action:
    if won is None:
        return Action.TRY_LOCK
    return Action.RECOMPUTE if won else Action.WAIT


def after_wait_timeout(stale: Entry | None, now: float, options: CacheOptions) -> Action:
    """The wait for another caller's computation ran out: serve stale, compute, or raise."""
    if stale is not None and servable_stale(stale, now, options.stale_ttl):
        return Action.RETURN
    return Action.RECOMPUTE if options.on_timeout == "compute" else Action.FAIL


def after_compute_error(stale: Entry | None, now: float, options: CacheOptions) -> Action:
    """The computation raised: serve the stale value if there is one, else let it raise."""
    if (
        stale is not None
        and stale.has_value
        and (servable_stale(stale, now, options.stale_ttl) or stale.header.fresh_until > now)
    ):
        return Action.RETURN
    return Action.FAIL
