"""`corral lab stampede|hashing|coldstart`: the experiments behind corral's claims.

This module only parses options, shows progress and prints; each experiment is
a module of `corral.lab`, importable and tested without the command line.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from corral.cli._common import (
    COMMON_STATUSES,
    EX_CONFIG,
    EX_UNAVAILABLE,
    CliError,
    add_url_argument,
    choose_store,
    say,
)
from corral.errors import ConfigError
from corral.lab import coldstart, hashing, stampede

__all__ = ["NAME", "ProgressBar", "add_parser"]

NAME = "lab"

EPILOG = f"""\
exit status:
  0    the experiment ran and its table was printed (and the plot drawn, if it could be)
  1    a client process failed
{COMMON_STATUSES}
"""

STAMPEDE_EPILOG = f"""\
modes (--modes, all by default, in this order):
{chr(10).join(f"  {mode.name:<11} {mode.what}" for mode in stampede.MODES)}

Each client reads through a store and cache object of its own, so nothing inside
one process hides the stampede: as N web servers sharing one cache. Every
computation is recorded and counted, in every process. An expiry is the set of
computations that replaced the same value: the naive cache computes once per
client that misses before the first of them has stored; corral's modes once.

The plot needs matplotlib: pip install 'corral[lab]'. Without it the table is
printed all the same.

{EPILOG}"""


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="run an experiment: the cache stampede, key placement, a deploy's cold cache",
        description="Experiments that show what corral is for, on your own store.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.set_defaults(handler=_usage(parser))
    experiments = parser.add_subparsers(title="experiments", metavar="EXPERIMENT")
    run: argparse.ArgumentParser = experiments.add_parser(
        "stampede",
        help="N clients read one expiring key: a naive cache beside corral's modes",
        description="N clients read one key again and again while its value expires every\n"
        "--ttl seconds and takes --compute seconds to compute. Prints, per mode, the\n"
        "computations per expiry and the read latencies, and plots them over time.",
        epilog=STAMPEDE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_url_argument(run)
    defaults = stampede.Config(url="memory://")
    run.add_argument(
        "--clients",
        type=int,
        default=defaults.clients,
        metavar="N",
        help=f"clients reading the key (default: {defaults.clients})",
    )
    run.add_argument(
        "--processes",
        type=int,
        default=defaults.processes,
        metavar="N",
        help=f"processes the clients are spread over (default: {defaults.processes}; 1 for "
        "memory://)",
    )
    run.add_argument(
        "--compute",
        type=float,
        default=defaults.compute,
        metavar="S",
        help=f"seconds one computation of the value takes (default: {defaults.compute:g})",
    )
    run.add_argument(
        "--ttl",
        type=float,
        default=defaults.ttl,
        metavar="S",
        help=f"seconds a computed value stays fresh (default: {defaults.ttl:g})",
    )
    run.add_argument(
        "--seconds",
        type=float,
        default=defaults.seconds,
        metavar="S",
        help=f"seconds each mode runs (default: {defaults.seconds:g})",
    )
    run.add_argument(
        "--pause",
        type=float,
        default=defaults.pause,
        metavar="S",
        help=f"seconds each client waits between two reads (default: {defaults.pause:g})",
    )
    run.add_argument(
        "--modes",
        default=",".join(stampede.MODE_NAMES),
        metavar="M,M",
        help=f"the modes to run, comma-separated (default: {','.join(stampede.MODE_NAMES)})",
    )
    _add_plot(run, "stampede.png")
    run.set_defaults(handler=lab_stampede)
    _add_hashing(experiments)
    _add_coldstart(experiments)


def _add_plot(parser: argparse.ArgumentParser, default: str) -> None:
    drawing = parser.add_mutually_exclusive_group()
    drawing.add_argument(
        "--plot",
        default=default,
        metavar="FILE",
        help=f"where to draw the PNG (default: {default} in the current directory)",
    )
    drawing.add_argument("--no-plot", action="store_true", help="print the table only")


HASHING_EPILOG = f"""\
Offline (no --url): the same keys are placed by corral.Ring with each hashing on
rings of 1 to 10 servers, and the keys whose server changes are counted when one
server leaves (N -> N-1), when the pool doubles (2 -> 4) and when it shrinks to a
third (9 -> 3), beside the least any placement can move. Then the balance (most
keys on one server over the mean, 5 and 50 servers) and the cost of one
Ring.locate. Every placement is the ring's own, checked against Ring.locate.

Live (--url memcached://a:11211,b:11211,c:11211, or a list of Redis servers):
each server is used as a store of its own; --live-keys keys are written where the
ring puts them, the last server is taken out of the ring, and every key is read
where the smaller ring looks for it. The misses are the keys that moved, printed
beside what the ring predicts. The keys are deleted afterwards.

The plot needs matplotlib: pip install 'corral[lab]'.

{EPILOG}"""

COLDSTART_EPILOG = f"""\
Simulated, in fake time (nothing sleeps; --seed gives the same numbers again):
--users users come back after a deploy that emptied the cache, most at once,
each reading --keys keys of their own at every visit; an expired entry is a miss,
filled again at once. The same users and visits are replayed with a fixed TTL,
with random jitter (store.cache(jitter=J)) and with jitter by key
(jitter_by="key"), the TTL factors drawn by the cache's own function.

The plot needs matplotlib: pip install 'corral[lab]'.

{EPILOG}"""


def _add_hashing(experiments: Any) -> None:
    parser: argparse.ArgumentParser = experiments.add_parser(
        "hashing",
        help="keys moved when a server leaves, by hashing: modulo, ketama, rendezvous, maglev",
        description="How many keys change server when one of N cache servers leaves, with\n"
        "crc32 % n and with consistent hashing; balance and lookup cost. With --url,\n"
        "measured on your servers.",
        epilog=HASHING_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    defaults = hashing.Config()
    parser.add_argument(
        "--keys",
        type=int,
        default=defaults.keys,
        metavar="N",
        help=f"keys placed, without --url (default: {defaults.keys:,}; at least 1,000)",
    )
    parser.add_argument(
        "--hashings",
        default=",".join(hashing.ORDER),
        metavar="H,H",
        help=f"the hashings compared (default: {','.join(hashing.ORDER)})",
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        default=None,
        help="run it live on these servers: memcached://HOST:PORT,HOST:PORT,... or "
        "redis://HOST:PORT,HOST:PORT,... (at least two)",
    )
    parser.add_argument(
        "--live-keys",
        type=int,
        default=10_000,
        metavar="N",
        help="with --url: keys written per hashing (default: 10,000)",
    )
    _add_plot(parser, "hashing.png")
    parser.set_defaults(handler=lab_hashing)


def _add_coldstart(experiments: Any) -> None:
    parser: argparse.ArgumentParser = experiments.add_parser(
        "coldstart",
        help="a deploy empties the cache: miss spikes every TTL, and how jitter spreads them",
        description="Users come back to an empty cache after a deploy. With a fixed TTL their\n"
        "entries expire together one TTL later, and again: prints the peak misses per\n"
        "second around each TTL with a fixed TTL and with jitter, and plots them.",
        epilog=COLDSTART_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    defaults = coldstart.Config()
    for flag, kind, value, what in (
        ("--users", int, defaults.users, "users coming back after the deploy"),
        ("--keys", int, defaults.keys, "keys each user reads at every visit"),
        ("--ttl", float, defaults.ttl, "seconds an entry lives (without jitter)"),
        ("--jitter", float, defaults.jitter, "the jitter, a fraction of the TTL"),
        ("--arrival", float, defaults.arrival, "mean seconds from the deploy to a first visit"),
        ("--revisit", float, defaults.revisit, "mean seconds between a user's visits"),
        ("--periods", int, defaults.periods, "TTLs simulated after the deploy"),
        ("--seed", int, defaults.seed, "the random seed: the same seed, the same numbers"),
    ):
        parser.add_argument(
            flag,
            type=kind,
            default=value,
            metavar="N" if kind is int else "S",
            help=f"{what} (default: {value:g})",
        )
    _add_plot(parser, "coldstart.png")
    parser.set_defaults(handler=lab_coldstart)


def _usage(parser: argparse.ArgumentParser) -> Any:
    def handler(args: argparse.Namespace) -> int:
        parser.print_help()
        return EX_CONFIG

    return handler


class ProgressBar:
    """The experiment's progress on stderr: a bar redrawn in place at a terminal,
    else one line per step (a log or a CI run gets no stream of redraws).

    A step is a mode that runs `seconds` (the stampede), or, with `seconds`
    None, a stage whose progress is a fraction (the simulations).
    """

    WIDTH = 30
    EVERY = 0.1

    def __init__(
        self,
        modes: Sequence[str],
        seconds: float | None,
        stream: TextIO | None = None,
        *,
        lab: str = "stampede",
        noun: str = "mode",
    ):
        self._stream = sys.stderr if stream is None else stream
        self._modes = list(modes)
        self._seconds = seconds
        self._lab = lab
        self._noun = noun
        self._tty = self._stream.isatty()
        self._shown = -1
        self._drawn = 0.0
        self._width = 0

    def __call__(self, index: int, mode: str, fraction: float) -> None:
        count = len(self._modes)
        if not self._tty:
            if index != self._shown:
                self._shown = index
                took = "" if self._seconds is None else f", {self._seconds:g} s"
                print(
                    f"corral: lab {self._lab}: {self._noun} {mode} ({index + 1}/{count}){took}",
                    file=self._stream,
                    flush=True,
                )
            return
        now = time.monotonic()
        if index == self._shown and now - self._drawn < self.EVERY:
            return
        self._shown, self._drawn = index, now
        overall = (index + fraction) / count
        filled = round(overall * self.WIDTH)
        done = (
            f"{fraction:4.0%}"
            if self._seconds is None
            else f"{fraction * self._seconds:4.1f}/{self._seconds:g} s"
        )
        text = (
            f"  [{'#' * filled}{'.' * (self.WIDTH - filled)}] {overall:4.0%}  "
            f"{mode} ({index + 1}/{count}) {done}"
        )
        self._width = max(self._width, len(text))
        self._stream.write("\r" + text.ljust(self._width))
        self._stream.flush()

    def close(self) -> None:
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()


def lab_stampede(args: argparse.Namespace) -> int:
    target = choose_store(args.url)
    modes = tuple(mode.strip() for mode in args.modes.split(",") if mode.strip())
    config = stampede.Config(
        url=target.url,
        clients=args.clients,
        processes=args.processes,
        compute=args.compute,
        ttl=args.ttl,
        seconds=args.seconds,
        pause=args.pause,
        modes=modes,
    )
    stampede.check(config)
    print(f"corral lab stampede on {target.shown}: {stampede.describe(config)}", flush=True)
    bar = ProgressBar(config.modes, config.seconds)
    try:
        results = stampede.run(config, bar)
    except stampede.ExperimentFailed as exc:
        raise CliError(f"lab stampede on {target.shown}: {exc}", 1) from exc
    finally:
        bar.close()
    print()
    print(stampede.table(results))
    return _draw(args, lambda path: stampede.plot(results, config, path))


def _draw(args: argparse.Namespace, draw: Any) -> int:
    """Draw the plot unless --no-plot; without matplotlib, say how to get it."""
    if args.no_plot:
        return 0
    path = Path(args.plot)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        draw(path)
    except ImportError as exc:
        say(f"no plot: {exc.name or 'matplotlib'} is missing; pip install 'corral[lab]' to draw it")
        return 0
    except OSError as exc:
        raise CliError(f"cannot write the plot to {path}: {exc}", EX_CONFIG) from exc
    print(f"\nplot: {path.resolve()}")
    return 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(word.strip() for word in text.split(",") if word.strip())


def lab_hashing(args: argparse.Namespace) -> int:
    chosen = _names(args.hashings)
    if args.url is not None:
        return _hashing_live(args, chosen)
    config = hashing.Config(keys=args.keys, hashings=chosen)
    print(f"corral lab hashing: {hashing.describe(config)}", flush=True)
    bar = ProgressBar(hashing.steps(config), None, lab="hashing", noun="step")
    try:
        results = hashing.run(config, bar)
    except hashing.ExperimentFailed as exc:
        raise CliError(f"lab hashing: {exc}", 1) from exc
    finally:
        bar.close()
    print()
    print(hashing.table(results))
    print(f"\n{results.seconds:.1f} s")
    return _draw(args, lambda path: hashing.plot(results, path))


def _hashing_live(args: argparse.Namespace, chosen: tuple[str, ...]) -> int:
    hashing.check_hashings(chosen)
    servers = hashing.split_url(args.url)
    if isinstance(args.live_keys, bool) or args.live_keys < 1:
        raise ConfigError(f"--live-keys must be >= 1, got {args.live_keys}")
    shown = ", ".join(name for name, _ in servers)
    print(
        f"corral lab hashing, live on {len(servers)} servers ({shown}): {args.live_keys:,} "
        f"keys per hashing, then {servers[-1][0]} leaves the ring",
        flush=True,
    )
    bar = ProgressBar(chosen, None, lab="hashing", noun="hashing")
    try:
        results = hashing.live(args.url, args.live_keys, chosen, bar)
    except hashing.ExperimentFailed as exc:
        raise CliError(f"lab hashing: {exc}", EX_UNAVAILABLE) from exc
    finally:
        bar.close()
    print()
    print(hashing.live_table(results))
    return 0


def lab_coldstart(args: argparse.Namespace) -> int:
    config = coldstart.Config(
        users=args.users,
        keys=args.keys,
        ttl=args.ttl,
        jitter=args.jitter,
        arrival=args.arrival,
        revisit=args.revisit,
        periods=args.periods,
        seed=args.seed,
    )
    print(f"corral lab coldstart: {coldstart.describe(config)}", flush=True)
    bar = ProgressBar(["simulate"], None, lab="coldstart", noun="step")
    try:
        results = coldstart.run(config, bar)
    finally:
        bar.close()
    print()
    print(coldstart.table(results, config))
    return _draw(args, lambda path: coldstart.plot(results, config, path))
