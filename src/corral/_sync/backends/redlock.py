# Generated from src/corral/_async/backends/redlock.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""`redis+redlock://h1:p1,h2:p2,h3:p3`: locks held by a majority of independent Redis masters.

Each master is an ordinary single-Redis backend (`corral._sync.backends.redis`)
with its own scripts, keys and connections; this backend asks all of them at
once and decides by quorum (`corral.core.quorum`, free of I/O):

- an attempt goes to every master side by side, each allowed at most a third
  of the TTL (or the socket `timeout`, if shorter); the lock is granted when a
  majority granted it and time is left of its validity, the TTL less the time
  spent and a drift allowance (1 % of the TTL + 2 ms). Otherwise it is released
  on every master that granted it, and owed to every master that did not answer
  (a stopped master runs the request when it resumes: it is sent the release
  once it answers again, until the TTL is over), and the attempt reports
  "not acquired", or `BackendUnavailable` when fewer than a majority answered.
  An attempt interrupted half-way (cancelled, Ctrl-C) is undone the same way;
- the fencing token is the largest of the granting masters' own tokens, written
  back to them (`redis_scripts.REDLOCK_FENCE`) before the attempt returns, so
  that a majority's counters are at least that token; the next acquisition's
  majority shares a master with this one and so gets a larger token, however
  the majorities differ;
- release, extend, inspect and force-release go to every master, and wait for
  a silent master only while its answer could still change the verdict;
  extend holds when a majority applied it within the validity, release also
  when the silent masters could have completed a majority (`quorum`);
- each attempt writes the owner to the masters with a suffix of its own
  (`ATTEMPT_MARK`), and the backend remembers which attempt won: a release of a
  failed attempt that reaches a slow master late can then delete only that
  attempt's grant, never the next attempt's (the lock logic reuses one owner id
  for every attempt of one `acquire`).

Waiters poll, with the lock logic's capped backoff, and are woken at once by
releases made in this process. Semaphores are refused: a quorum of slots per
master does not bound the holders to the limit. Cache entries need no quorum
(losing one costs a computation, never exclusion), so each lives on one master,
placed and failed over by a pool over the same masters; their recompute lock is
a quorum lock like any other. docs/sharding.md says what Redlock can and cannot
promise.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from redis.exceptions import TimeoutError as RedisTimeoutError

from corral._sync._compat import Job, gather_within, sleep, start_job
from corral._sync.backends.base import Backend
from corral._sync.backends.pool import PoolBackend
from corral._sync.backends.redis import RedisBackend
from corral.backends import redis_scripts as scripts
from corral.backends.registry import check_userinfo, redact
from corral.core import forks, quorum
from corral.core.capabilities import Capabilities
from corral.core.clock import Clock
from corral.core.forks import ProcessLock
from corral.core.options import merge_options
from corral.core.primitives import Attempt, LockInfo, Outcome
from corral.core.validate import check_timeout
from corral.errors import BackendError, BackendUnavailable, ConfigError

__all__ = ["RedlockBackend"]

DEFAULT_TIMEOUT = 5.0
# Fewer masters tolerate no failure at all: one master is redis://, two need both.
MIN_MASTERS = 3
_SCHEMES = {"redis+redlock": "redis", "rediss+redlock": "rediss"}
# Between an owner id and the number of its attempt, on the masters.
ATTEMPT_MARK = "#attempt-"
# Seconds a master that let a request time out is skipped (counted as silent at once):
# a stopped or black-holed master would otherwise hold a call of every primitive until
# its socket timeout (a thread each, in the blocking flavour).
QUIET = 1.0


class _Skipped(TimeoutError):
    """A master skipped because it timed out a moment ago."""


def _owner_of(stored: str | None) -> str | None:
    """The lock's owner id, without the attempt number the masters keep with it."""
    if stored is None:
        return None
    owner, mark, _ = stored.rpartition(ATTEMPT_MARK)
    return owner if mark else stored


def _with_port(host: str, shown: str) -> str:
    """`host:port`, with Redis's port when none is given; IPv6 addresses in brackets."""
    address, colon, port = host.rpartition(":")
    if not colon or (host.startswith("[") and not address.endswith("]")) or "]" in port:
        return f"{host}:6379"  # no port given (an IPv6 address has colons of its own)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{shown}: {host!r} has no valid port; expected host:port")
    return host


def _reason(error: BaseException) -> str:
    """Why one master did not answer, in a few words (never a password: none is in them)."""
    if isinstance(error, TimeoutError):
        return str(error)
    cause = error.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(error)


class _Attempt:
    """One attempt's requests to the masters, and who gives back a grant nobody awaits.

    Each master's request ends granted, refused, or failed (an error or timeout:
    the master may still run it, later). Once the attempt is abandoned (refused by
    the quorum, or its caller interrupted), whatever ends later is given back by the
    call that saw it end, after it: a release sent beside a request still on its
    way could reach the master first, find nothing, and leave the grant behind.
    """

    def __init__(self, backend: RedlockBackend, name: str, stored: str, ttl: float) -> None:
        self._backend = backend
        self._name = name
        self._stored = stored
        self._ttl = ttl
        self._mutex = ProcessLock()
        self._abandoned = False
        self._granted: list[RedisBackend] = []
        self._failed: list[RedisBackend] = []
        # Masters that answered "held by another", even after the attempt was decided:
        # they never held this grant, which a release must know (see `refusers`).
        self._refused: list[RedisBackend] = []

    def on(self, master: RedisBackend) -> Attempt:
        try:
            result = master.try_acquire(self._name, self._stored, self._ttl)
        except BaseException:
            # No answer (a timeout, a lost connection, a cancellation): it may yet run.
            if self._ended(master, self._failed):
                self._backend._owe(master, self._name, self._stored, self._ttl)
            raise
        if result.acquired and self._ended(master, self._granted):
            timeout = quorum.master_timeout(self._ttl, self._backend._timeout)
            self._backend._release_on(self._name, self._stored, [master], timeout, self._ttl)
        if not result.acquired:
            with self._mutex:
                self._refused.append(master)
        return result

    def refusers(self) -> frozenset[int]:
        """The indexes of the masters that refused this attempt, so far."""
        with self._mutex:
            return frozenset(self._backend._masters.index(master) for master in self._refused)

    def _ended(self, master: RedisBackend, into: list[RedisBackend] | None) -> bool:
        """Note how `master`'s request ended; True when the attempt was abandoned before."""
        with self._mutex:
            if not self._abandoned and into is not None:
                into.append(master)
            return self._abandoned

    def abandon(self) -> tuple[list[RedisBackend], list[RedisBackend]]:
        """Mark the attempt abandoned: the masters that granted it, and those whose request
        failed (and may yet run), until now; the ones still answering give back their own."""
        with self._mutex:
            self._abandoned = True
            return list(self._granted), list(self._failed)


class RedlockBackend(Backend):
    capabilities: ClassVar[Capabilities] = Capabilities(
        scheme="redis+redlock",
        notifies=False,
        cross_process=True,
        cross_host=True,
        linearizable=False,
        fair=False,
        replicas=False,
        ttl_clock=(
            "each master's clock; the client counts the validity from before its first "
            "request, less the round trip and a drift allowance of 1% of the TTL + 2 ms"
        ),
        on_client_crash=(
            "the lock stays held until its TTL runs out on a majority of the masters, then "
            "anyone may take it"
        ),
        on_server_restart=(
            "locks keep working while a majority of the masters runs; a master restarted "
            "WITHOUT its data (no AOF with appendfsync always) can grant a held lock again "
            "and break exclusion and token order: keep it down for one TTL first"
        ),
        on_partition=(
            "a side without a majority of the masters grants nothing (BackendUnavailable); "
            "a client paused or delayed past its validity can still overlap the next "
            "holder, which only fencing tokens checked by the storage can catch"
        ),
        on_memory_pressure=(
            "as for Redis, on each master: use maxmemory-policy noeviction, or an eviction "
            "on a majority can free a held lock"
        ),
        fencing_tokens=(
            "the largest of the granting masters' tokens, written back to a majority "
            "before acquire() returns, so they increase even when successive majorities "
            "differ; a master that lost its data, or masters whose clocks disagree by more "
            "than the time since the name was last acquired, can break the order"
        ),
        state_per_name=(
            "on each master as on Redis: nothing once the lock is released and its TTL has passed"
        ),
        cache=(
            "each entry on one master, placed by ketama as a pool of Redis servers places "
            "it (a master down: its entries go to the next one); the recompute lock is a "
            "quorum lock, tried after the read"
        ),
    )
    # Redis's options, given to every master; only their wording here differs.
    url_options = tuple(
        dataclasses.replace(
            option,
            meaning=option.meaning.replace("`rediss://` only", "`rediss+redlock://` only")
            if option.name != "timeout"
            else "seconds for connecting and for each reply, per master; an attempt waits "
            "for one master at most a third of the lock's TTL",
        )
        for option in RedisBackend.url_options
    )

    def __init__(
        self,
        masters: Sequence[RedisBackend],
        *,
        server: str,
        clock: Clock,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__()
        if len(masters) < MIN_MASTERS:
            raise ConfigError(
                f"{server}: Redlock needs at least {MIN_MASTERS} masters, got {len(masters)}"
            )
        self._masters = tuple(masters)
        self._server = server
        self._clock = clock
        self._timeout = timeout
        self._quorum = quorum.majority(len(masters))
        # Registered on each master's own client: the script runs through its connections.
        self._fences = [master._client.register_script(scripts.REDLOCK_FENCE) for master in masters]
        self._attempts = itertools.count(1)
        # (name, owner) -> the owner as the winning attempt wrote it on the masters, the
        # masters (by index) that may hold that grant (those that granted it and those
        # whose answer was still to come), and the attempt, whose late refusals take
        # masters out of those. An entry lives from a grant to its release; a thread
        # lock in both flavours.
        self._granted: dict[tuple[str, str], tuple[str, frozenset[int], _Attempt]] = {}
        self._granted_mutex = ProcessLock()
        # Until when (on `clock`) each master is skipped; see QUIET.
        self._quiet_until = [-math.inf] * len(self._masters)
        # Cache entries need no quorum (losing one costs a computation, not exclusion):
        # each lives on one master, placed and failed over as a pool of Redis servers
        # does it. Only the recompute lock, a lock like any other, is a quorum lock.
        self._entries = PoolBackend.over(
            {_ring_name(master.server): master for master in self._masters},
            shown=server,
            clock=clock,
        )
        # Per master, the releases owed to it ((name, stored owner) -> until when, on
        # `clock`), and the job sending them (see `_owe`).
        self._owed: list[dict[tuple[str, str], float]] = [{} for _ in self._masters]
        self._paying: list[tuple[Job, int] | None] = [None] * len(self._masters)
        self._owed_mutex = ProcessLock()
        self._closing = False

    @classmethod
    def from_url(cls, url: str, *, clock: Clock, **options: Any) -> RedlockBackend:
        """Open one Redis backend per master of `url`, each with the same options.

        `redis+redlock://[user:password@]h1:p1,h2:p2,h3:p3[/db][?options]`, or
        `rediss+redlock://` for TLS to every master.
        """
        shown = redact(url)
        check_userinfo(url, shown)
        base, _, query = url.partition("?")
        scheme, _, rest = base.partition("://")
        child_scheme = _SCHEMES.get(scheme.lower())
        if child_scheme is None:
            raise ConfigError(f"{shown}: expected a redis+redlock:// or rediss+redlock:// URL")
        given, _ = merge_options(shown, query, options, cls.url_options, backend="redlock")
        tls = sorted(key for key in given if key.startswith("ssl_"))
        if tls and child_scheme != "rediss":
            raise ConfigError(f"{shown}: {', '.join(tls)} need(s) a rediss+redlock:// URL (TLS)")
        userinfo, at, hostpart = rest.rpartition("@")
        hosts, _, db = hostpart.partition("/")
        if db and not db.isdigit():
            raise ConfigError(f"{shown}: the database must be a number, got {db!r}")
        masters = [host.strip() for host in hosts.split(",")]
        if any(not host for host in masters):
            raise ConfigError(
                f"{shown}: expected a comma-separated list of host:port, with no empty entry"
            )
        masters = [_with_port(host, shown) for host in masters]
        if len(set(masters)) != len(masters):
            raise ConfigError(f"{shown}: a master is listed twice; list each one once")
        if len(masters) < MIN_MASTERS:
            raise ConfigError(
                f"{shown}: Redlock needs at least {MIN_MASTERS} independent masters (a majority "
                f"of them must agree), got {len(masters)}; for one server use "
                f"{child_scheme}://host:port"
            )
        timeout = check_timeout(given.get("timeout", DEFAULT_TIMEOUT), shown)
        auth = f"{userinfo}@" if at else ""
        children = [
            RedisBackend.from_url(f"{child_scheme}://{auth}{host}/{db or 0}", clock=clock, **given)
            for host in masters
        ]
        user = userinfo.partition(":")[0] if at else ""
        server = f"{scheme.lower()}://{f'{user}@' if user else ''}{','.join(masters)}/{db or 0}"
        return cls(children, server=server, clock=clock, timeout=timeout)

    @property
    def server(self) -> str:
        return self._server

    @property
    def servers(self) -> tuple[str, ...]:
        """Every master: each lock name lives on all of them."""
        return tuple(master.server for master in self._masters)

    # -- asking every master ------------------------------------------------------

    def _ask(
        self,
        call: Callable[[RedisBackend], Any],
        timeout: float,
        enough: Callable[[Sequence[Any]], bool] | None = None,
    ) -> list[Any]:
        """`call` on every master side by side: each one's answer, or why it gave none
        (an exception), or None where `enough` ended the wait before it answered."""
        answers = gather_within(
            [functools.partial(self._on, master, call) for master in self._masters],
            timeout,
            enough,
        )
        self._note_silence(self._masters, answers)
        for answer in answers:
            # A server's trouble or silence is a missing vote; anything else is a bug
            # or an interruption, and is raised as it is.
            if isinstance(answer, BaseException) and not isinstance(
                answer, (BackendError, TimeoutError)
            ):
                raise answer
        return answers

    def _on(self, master: RedisBackend, call: Callable[[RedisBackend], Any]) -> Any:
        """`call(master)`, unless `master` timed out a moment ago (then `_Skipped` at once)."""
        index = self._masters.index(master)
        if self._clock.now() < self._quiet_until[index]:
            raise _Skipped(f"skipped: a request to it timed out less than {QUIET:g} s ago")
        try:
            return call(master)
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, (RedisTimeoutError, TimeoutError)):
                self._quiet_until[index] = self._clock.now() + QUIET
            raise

    def _note_silence(self, masters: Sequence[RedisBackend], answers: Sequence[Any]) -> None:
        """Skip for a while the masters whose answer did not come in time."""
        for master, answer in zip(masters, answers, strict=True):
            if isinstance(answer, TimeoutError) and not isinstance(answer, _Skipped):
                self._quiet_until[self._masters.index(master)] = self._clock.now() + QUIET

    def _settled_on(self, good: Callable[[Any], bool]) -> Callable[[Sequence[Any]], bool]:
        """An `enough` for `_ask`: stop waiting once no silent master can change the verdict.

        That is once a majority answered `good`; or so many failed that no majority
        can answer (unavailable); or a majority answered and too few of the rest are
        still silent to make `good` a majority.
        """

        def enough(answers: Sequence[Any]) -> bool:
            silent = sum(answer is None for answer in answers)
            failed = sum(isinstance(answer, BaseException) for answer in answers)
            answered = len(answers) - silent - failed
            agreed = sum(good(answer) for answer in answers if answer is not None)
            return (
                agreed >= self._quorum
                or failed > len(answers) - self._quorum
                or (answered >= self._quorum and agreed + silent < self._quorum)
            )

        return enough

    def _unavailable(
        self,
        name: str,
        action: str,
        answers: Sequence[object],
        timeout: float,
        kind: str = "lock",
    ) -> BackendUnavailable:
        failures = [
            f"{master.server}: {_reason(answer)}"
            for master, answer in zip(self._masters, answers, strict=True)
            if isinstance(answer, BaseException)
        ]
        answered = sum(
            answer is not None and not isinstance(answer, BaseException) for answer in answers
        )
        return BackendUnavailable(
            f"{kind} {name!r} on {self._server}: could not {action} it: {answered} of "
            f"{len(self._masters)} masters answered and a quorum needs {self._quorum} "
            f"({'; '.join(failures)}); check that a majority of the masters is running, "
            "reachable from here and accepts the credentials, or raise timeout= (now "
            f"{timeout:g} s per master)"
        )

    def _release_on(
        self,
        name: str,
        owner: str,
        masters: Sequence[RedisBackend],
        timeout: float,
        ttl: float,
    ) -> None:
        """Compare-and-delete on `masters`; a master that does not answer is owed it
        (`_owe`): it may hold the grant, or receive it later. Each attempt writes an
        owner of its own, so a late release deletes only what that attempt took."""
        if not masters:
            return
        answers = gather_within(
            [
                functools.partial(self._on, master, lambda m: m.release(name, owner))
                for master in masters
            ],
            timeout,
        )
        self._note_silence(masters, answers)
        for master, answer in zip(masters, answers, strict=True):
            if isinstance(answer, BaseException):
                self._owe(master, name, owner, ttl)

    # -- primitives ---------------------------------------------------------------

    def try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        *,
        queue_ttl: float | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> Attempt:
        if queue_ttl is not None or replicas:
            raise ConfigError(
                f"lock {name!r} on {self._server}: fair=True and replicas= are not supported "
                "by Redlock (each master is independent: there is no queue or replica to share)"
            )
        stored = f"{owner}{ATTEMPT_MARK}{next(self._attempts)}"
        attempt = _Attempt(self, name, stored, ttl)
        try:
            started = self._clock.now()
            per_master = quorum.master_timeout(ttl, self._timeout)
            answers = self._ask(
                attempt.on,
                per_master,
                # Decided once a majority granted, or refused or failed past recovery: a
                # silent master is not waited for (what it grants later is given back).
                self._settled_on(lambda answer: isinstance(answer, Attempt) and answer.acquired),
            )
            replies = [answer if isinstance(answer, Attempt) else None for answer in answers]
            decision = quorum.decide_acquire(replies, ttl, self._clock.now() - started)
            if decision.granted:
                assert decision.token is not None
                granting = [
                    master
                    for master, reply in zip(self._masters, replies, strict=True)
                    if reply is not None and reply.acquired
                ]
                silent = [
                    master
                    for master, reply in zip(self._masters, replies, strict=True)
                    if reply is None
                ]
                fenced, failed = self._write_back(
                    name, stored, decision.token, ttl, granting, per_master, pending=silent
                )
                left = quorum.validity(ttl, self._clock.now() - started)
                if fenced >= self._quorum and left > 0:
                    held_on = frozenset(
                        index
                        for index, (reply, answer) in enumerate(zip(replies, answers, strict=True))
                        if (reply is None and not isinstance(answer, _Skipped))
                        or (reply is not None and reply.acquired)
                    )
                    with self._granted_mutex:
                        self._granted[name, owner] = (stored, held_on, attempt)
                    # Promised for the ttl less the drift allowance, from before the
                    # first request: the handle must not count on more.
                    return Attempt(True, token=decision.token, valid_for=ttl - quorum.drift(ttl))
                self._give_up(attempt, per_master)
                # Unavailable only when the masters that failed (the attempt or its
                # write-back) leave fewer than a majority; a granting master that died
                # just now, with a majority still up, makes this a refused attempt,
                # which the waiter retries. A master not waited for has not failed.
                ends = [
                    answer if failure is None else failure
                    for answer, failure in zip(answers, failed, strict=True)
                ]
                down = sum(isinstance(end, BaseException) for end in ends)
                if len(self._masters) - down < self._quorum:
                    raise self._unavailable(name, "acquire", ends, per_master)
                return Attempt(False)
            self._give_up(attempt, per_master)
            if not decision.reachable:
                raise self._unavailable(name, "acquire", answers, per_master)
            return Attempt(False, holder_ttl=decision.holder_ttl)
        except Exception:
            raise
        except BaseException:
            # Interrupted (cancelled, or Ctrl-C while the blocking flavour's threads carry
            # the requests on): nobody will learn this attempt's owner, so nobody else
            # could release what it took. Give it all back, in the background.
            start_job(self._give_up, attempt, self._timeout)
            raise

    def _give_up(self, attempt: _Attempt, timeout: float) -> None:
        """Undo an attempt that will not be the lock: release where it was granted, and
        owe a release where its request got no answer (it may still run there)."""
        granted, failed = attempt.abandon()
        for master in failed:
            self._owe(master, attempt._name, attempt._stored, attempt._ttl)
        self._release_on(attempt._name, attempt._stored, granted, timeout, attempt._ttl)

    def _owe(self, master: RedisBackend, name: str, stored: str, ttl: float) -> None:
        """Remember to release `stored`'s grant on `master` once it answers again.

        For a request whose answer never came: a master that is stopped or cut off
        runs it whenever it resumes, so a release sent beside it could arrive
        first and free nothing, or not arrive at all. One job per master sends
        what is owed, trying again every `QUIET` seconds; a debt lapses once any
        grant it covers has surely run out.
        """
        index = self._masters.index(master)
        with self._owed_mutex:
            self._owed[index][name, stored] = self._clock.now() + ttl + quorum.drift(ttl)
            paying = self._paying[index]
            # A forked child has none of its parent's jobs: it starts its own.
            idle = paying is None or paying[0].done() or paying[1] != forks.pid()
            if idle and not self._closing:
                self._paying[index] = (start_job(self._pay, index), forks.pid())

    def _pay(self, index: int) -> None:
        """Send master `index` the releases owed to it, until none is left."""
        master, owed = self._masters[index], self._owed[index]
        while True:
            with self._owed_mutex:
                now = self._clock.now()
                for debt in [debt for debt, until in owed.items() if until <= now]:
                    del owed[debt]
                if not owed or self._closing:
                    owed.clear()
                    self._paying[index] = None
                    return
                debts = list(owed)
            for name, stored in debts:
                try:
                    master.release(name, stored)
                except BackendError:
                    break  # still silent: try again in a moment
                with self._owed_mutex:
                    owed.pop((name, stored), None)
            else:
                continue
            sleep(QUIET)

    def _stored(self, name: str, owner: str) -> str:
        """The owner as the masters hold it for `owner`'s current grant of `name`."""
        return self._grant(name, owner)[0]

    def _grant(
        self, name: str, owner: str, *, forget: bool = False
    ) -> tuple[str, frozenset[int] | None]:
        """`owner`'s current grant of `name`: the owner as the masters hold it, and the
        masters that may hold it (None: unknown).

        Unknown (no grant of it in this process) answers a form no master holds,
        so the compare-and-delete or -extend finds the lock gone, as it is for
        this owner.
        """
        with self._granted_mutex:
            if forget:
                grant = self._granted.pop((name, owner), None)
            else:
                grant = self._granted.get((name, owner))
        if grant is None:
            return f"{owner}{ATTEMPT_MARK}0", None
        stored, held_on, attempt = grant
        return stored, held_on - attempt.refusers()

    def _write_back(
        self,
        name: str,
        owner: str,
        token: int,
        ttl: float,
        granting: Sequence[RedisBackend],
        timeout: float,
        *,
        pending: Sequence[RedisBackend] = (),
    ) -> tuple[int, list[object]]:
        """Raise the granting masters' counters to `token` and stamp their lock with it.

        The masters whose answer to the attempt is still on its way (`pending`) are
        sent the same, without waiting for them: whichever of the two reaches such a
        master first, a late grant there ends up with `token` or a larger one, never
        a smaller one. Returns how many still held the lock for `owner` (and took
        the token), and, per master, why it did not answer (None where it did or
        was not asked).
        """
        index = {id(master): i for i, master in enumerate(self._masters)}

        def fence(master: RedisBackend) -> Any:
            keys = master._keys(name)
            return master._run(
                self._fences[index[id(master)]],
                name,
                "write the fencing token to",
                [keys.lock, keys.fence],
                [owner, str(token), str(max(1, math.ceil(ttl * 1000)))],
            )

        asked = [*granting, *pending]
        answers = gather_within(
            [functools.partial(self._on, master, fence) for master in asked],
            timeout,
            lambda found: all(answer is not None for answer in found[: len(granting)]),
        )
        self._note_silence(asked, answers)
        fenced = 0
        failures: list[object] = [None] * len(self._masters)
        for master, answer in zip(asked, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, (BackendError, TimeoutError)):
                    raise answer
                failures[index[id(master)]] = answer
            elif answer is not None and int(answer) == 1:
                fenced += 1
        return fenced, failures

    def release(self, name: str, owner: str, hold_for: float = 0.0) -> Outcome:
        # Forgotten whatever the outcome: a release that fails leaves the lock to its TTL,
        # and the handle never believes it still holds it.
        stored, held_on = self._grant(name, owner, forget=True)
        answers = self._ask(
            lambda master: master.release(name, stored, hold_for),
            self._timeout,
            self._settled_on(lambda answer: answer is Outcome.OK),
        )
        outcome = quorum.decide_release(
            [answer if isinstance(answer, Outcome) else None for answer in answers], held_on
        )
        if outcome is None:
            raise self._unavailable(name, "release", answers, self._timeout)
        if outcome is Outcome.OK and hold_for <= 0:
            self.local_bus.notify(name)
        return outcome

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        stored = self._stored(name, owner)
        started = self._clock.now()
        per_master = quorum.master_timeout(ttl, self._timeout)
        answers = self._ask(
            lambda master: master.extend(name, stored, ttl),
            per_master,
            self._settled_on(lambda answer: answer is Outcome.OK),
        )
        outcomes = [answer if isinstance(answer, Outcome) else None for answer in answers]
        outcome = quorum.decide_change(outcomes, elapsed=self._clock.now() - started, ttl=ttl)
        if outcome is None:
            raise self._unavailable(name, "extend", answers, per_master)
        if outcome is not Outcome.OK and Outcome.OK in outcomes:
            # Extended on too few masters, or too late to count on: the caller will treat
            # the lock as gone, so it must not linger where it was extended.
            self._release_on(
                name,
                stored,
                [
                    master
                    for master, found in zip(self._masters, outcomes, strict=True)
                    if found is Outcome.OK
                ],
                per_master,
                ttl,
            )
        return outcome

    def inspect(self, name: str) -> LockInfo | None:
        answers = self._ask(
            lambda master: self._inspect_one(master, name), self._timeout, self._known
        )
        found = [
            None if box[0] is None else dataclasses.replace(box[0], owner=_owner_of(box[0].owner))
            for box in answers
            if isinstance(box, tuple)
        ]
        if len(found) < self._quorum:
            raise self._unavailable(name, "inspect", answers, self._timeout)
        return quorum.decide_inspect(name, found, len(self._masters))

    def _inspect_one(self, master: RedisBackend, name: str) -> tuple[LockInfo | None]:
        """One master's view, boxed: a free lock answers (None,), never the None that
        `gather_within` gives a master that has not answered yet."""
        return (master.inspect(name),)

    def _known(self, answers: Sequence[Any]) -> bool:
        """An `enough` for inspect: an owner holds a majority under one token (the one its
        acquisition wrote back to a majority), or no owner can hold one any more."""
        silent = sum(answer is None for answer in answers)
        failed = sum(isinstance(answer, BaseException) for answer in answers)
        held = [
            (_owner_of(answer[0].owner), answer[0].token)
            for answer in answers
            if isinstance(answer, tuple) and answer[0] is not None
        ]
        owners = [owner for owner, _ in held]
        most = max((owners.count(owner) for owner in owners), default=0)
        answered = len(answers) - silent - failed
        return (
            max((held.count(entry) for entry in held), default=0) >= self._quorum
            or failed > len(answers) - self._quorum
            or (answered >= self._quorum and most + silent < self._quorum)
        )

    def force_release(self, name: str) -> bool:
        answers = self._ask(lambda master: master.force_release(name), self._timeout)
        freed = [answer for answer in answers if isinstance(answer, bool)]
        if len(freed) < self._quorum:
            raise self._unavailable(name, "force-release", answers, self._timeout)
        if any(freed):
            self.local_bus.notify(name)
        return any(freed)

    # -- what a quorum of masters cannot offer --------------------------------------

    def no_semaphores_error(self) -> ConfigError:
        return ConfigError(
            f"semaphores are not available on {self._server}: a quorum of per-master slots "
            "does not bound the holders to the limit (with 3 masters, holders each granted "
            "a slot on 2 of them can number 1.5 x limit); use a semaphore on a single Redis "
            "(redis://) or on etcd (etcd://), whose one server or consensus counts the slots"
        )

    # -- cache entries: each on one master, as a pool places them --------------------

    def placed(
        self, shard: str | None = None, replicas: int = 1, replica_keep: float | None = None
    ) -> Backend:
        entries = self._entries.placed(shard, replicas, replica_keep)
        if entries is self._entries:
            return self
        # The same masters, locks and buses; only where entries go differs.
        view = copy.copy(self)
        view._entries = entries  # type: ignore[assignment]
        return view

    def locate(self, key: str) -> str:
        return self._entries.locate(key)

    def cache_fetch(self, keys: Sequence[str], gen_key: str) -> tuple[list[bytes | None], int]:
        return self._entries.cache_fetch(keys, gen_key)

    def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        self._entries.cache_store(items)

    def cache_delete(self, key: str) -> bool:
        return self._entries.cache_delete(key)

    def cache_invalidate(self, key: str, keep: float) -> bool:
        return self._entries.cache_invalidate(key, keep)

    def cache_clear(self, gen_key: str) -> int:
        return self._entries.cache_clear(gen_key)

    def cache_count(self, key_prefix: str) -> int | None:
        return self._entries.cache_count(key_prefix)

    def cache_raise_generation(self, gen_key: str, at_least: int) -> int:
        return self._entries.cache_raise_generation(gen_key, at_least)

    def close(self) -> None:
        with self._owed_mutex:
            self._closing = True  # what is still owed lapses with the masters' TTLs
            for paying in self._paying:
                if paying is not None and paying[1] == forks.pid():
                    paying[0].cancel()
        errors: list[BaseException] = []
        for master in self._masters:
            try:
                master.close()
            except Exception as exc:  # close the others all the same
                errors.append(exc)
        if errors:
            raise errors[0]


def _ring_name(server: str) -> str:
    """`host:port` of a master's `redis://host:port/db`, as a ring names its servers."""
    return server.partition("://")[2].rpartition("@")[2].partition("/")[0]
