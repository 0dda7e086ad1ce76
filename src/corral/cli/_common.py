"""What every subcommand shares: exit statuses, the --url option, messages on stderr.

Scripts and cron wrappers branch on corral's exit status, so the statuses are
fixed here once and documented in every command's --help. Messages go to
stderr as one line each, because stdout belongs to the command being run (or
to whoever parses `status --json`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass

import corral
from corral.backends.registry import default_url, redact
from corral.core.election import identity_of
from corral.core.primitives import LockInfo, SemaphoreInfo
from corral.errors import BackendError, ConfigError, CorralError, LockExpired, LockLost

__all__ = [
    "EX_CANNOT_EXECUTE",
    "EX_CONFIG",
    "EX_INTERRUPTED",
    "EX_LOCK_LOST",
    "EX_NOT_FOUND",
    "EX_TEMPFAIL",
    "EX_UNAVAILABLE",
    "CliError",
    "Target",
    "add_url_argument",
    "choose_store",
    "describe_info",
    "describe_leader",
    "describe_semaphore",
    "one_line",
    "open_store",
    "say",
    "seconds",
    "status_for",
]

# argparse already exits 2 on bad usage; bad values and configuration join it.
EX_CONFIG = 2
# sysexits.h: the service (here, the lock backend) is unavailable.
EX_UNAVAILABLE = 69
# sysexits.h EX_SOFTWARE: the lock was lost under a running command.
EX_LOCK_LOST = 70
# sysexits.h EX_TEMPFAIL: try again later; what cron wrappers retry on.
EX_TEMPFAIL = 75
# What shells return for a command that cannot be executed / is not found.
EX_CANNOT_EXECUTE = 126
EX_NOT_FOUND = 127
# A process ended by signal N exits 128+N in shells; SIGINT is 2.
EX_INTERRUPTED = 130

COMMON_STATUSES = """\
  2    bad arguments or configuration (bad URL, --ttl <= 0, ...)
  69   the backend is unavailable (server down, unreachable, or answered with an error)"""


class CliError(Exception):
    """A failure the user can act on: reported as one line, without a traceback."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def status_for(error: CorralError) -> int:
    """Which exit status a corral error maps to, so scripts can tell retry from fix."""
    if isinstance(error, ConfigError):
        return EX_CONFIG
    if isinstance(error, BackendError):
        return EX_UNAVAILABLE
    if isinstance(error, (LockLost, LockExpired)):
        return EX_LOCK_LOST
    return 1


def add_url_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        metavar="URL",
        default=None,
        help="the lock server (default: $CORRAL_URL, else an SQLite file in the user's cache)",
    )


def one_line(text: str) -> str:
    """Collapse a message to one line: on-call readers grep logs line by line."""
    return " ".join(text.split())


def say(message: str) -> None:
    print(f"corral: {one_line(message)}", file=sys.stderr, flush=True)


def seconds(value: float) -> str:
    return f"{value:.1f} s"


def describe_info(info: LockInfo) -> str:
    """Who keeps a lock closed and for how long, in the words every command uses."""
    if info.owner is None:
        return (
            f"nobody holds it, but its last holder released it with hold_for, which keeps "
            f"it closed {seconds(info.ttl)} more (fencing token {info.token})"
        )
    return f"held by {info.owner}, fencing token {info.token}, {seconds(info.ttl)} left"


def describe_leader(info: LockInfo) -> str:
    """Who leads an election (its lock's holder) and for how long, in the same words."""
    return f"{identity_of(info.owner)} leads (term {info.token}, {seconds(info.ttl)} left)"


def describe_semaphore(info: SemaphoreInfo, shown: int = 10) -> str:
    """A semaphore's slots and their holders (the first `shown` of them), in the same words."""
    holders = "; ".join(describe_info(holder) for holder in info.holders[:shown])
    if len(info.holders) > shown:
        holders += f"; and {len(info.holders) - shown} more"
    taken = f"{len(info.holders)} of its {info.limit} slots taken"
    return f"{taken}: {holders}" if holders else taken


@dataclass(frozen=True, slots=True)
class Target:
    """The store a command uses and where its URL came from, for hints and --verbose."""

    url: str
    source: str
    """"--url", "CORRAL_URL" or "default" (the embedded SQLite file)."""

    @property
    def shown(self) -> str:
        """The URL as messages show it: without its password."""
        return redact(self.url)

    def describe(self) -> str:
        if self.source == "default":
            return (
                f"{self.shown} (the embedded default: it excludes only the processes of "
                "this user on this machine; give --url or set CORRAL_URL to a shared "
                "server to exclude other machines)"
            )
        return f"{self.shown} (from {self.source})"

    def command(self, verb: str, name: str, *options: str) -> str:
        """The corral command that acts on the same lock in the same store, quoted for a
        shell, as a message suggests it."""
        words = ["corral", verb, shlex.quote(name), *options]
        if self.source != "default":
            words += ["--url", shlex.quote(self.shown)]
        command = f"`{' '.join(words)}`"
        if self.shown != self.url:
            command += " (with the URL's password in place of ***)"
        return command


def choose_store(url: str | None) -> Target:
    """--url, else CORRAL_URL, else the embedded default: as `corral.connect` chooses."""
    if url is not None:
        return Target(url, "--url")
    if os.environ.get("CORRAL_URL"):
        return Target(default_url(), "CORRAL_URL")
    return Target(default_url(), "default")


def open_store(target: Target) -> corral.Store:
    """Connect, refusing stores that every corral process would see empty.

    Each `corral` command is a process of its own, so a store that lives inside one
    process (memory://) would let every `corral run` in, and show nothing to
    `corral status`: refused rather than silently excluding nothing.
    """
    store = corral.connect(target.url)
    if not store.capabilities.cross_process:
        store.close()
        origin = "" if target.source == "--url" else f" (from {target.source})"
        raise CliError(
            f"{target.shown}{origin} keeps its locks inside one process, and every corral "
            "command is a process of its own: it would exclude nothing and show nothing. "
            "Use sqlite:///PATH for the processes of one machine, or a server every "
            "machine reaches (redis://HOST:6379/0, postgresql://..., etcd://...)",
            EX_CONFIG,
        )
    return store
