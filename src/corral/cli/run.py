"""`corral run NAME -- CMD`: hold a lock (or a slot of a semaphore) for as long as a command runs.

The lock is renewed while the command runs and released when it exits. If it
is lost anyway, the command is stopped too (see `_lease`, which supervises the
command; this module only says which lease it runs under). With `--limit N`
the lease is one of the N slots of the semaphore NAME instead: a lock and a
semaphore are different things on the server even under one name, so
`--limit 1` stays the exclusive lock rather than a semaphore of one slot.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

import corral
from corral.cli._common import (
    COMMON_STATUSES,
    EX_CONFIG,
    EX_LOCK_LOST,
    EX_TEMPFAIL,
    CliError,
    Target,
    add_url_argument,
    choose_store,
    describe_info,
    describe_semaphore,
    one_line,
    open_store,
    say,
)
from corral.cli._lease import (
    Interrupted,
    Lease,
    SignalHandlers,
    Supervisor,
    add_grace_argument,
    add_ttl_argument,
    add_wait_argument,
    give_back,
    take,
)
from corral.core.validate import MAX_LIMIT, check_non_negative, check_ttl, check_wait
from corral.errors import ConfigError, CorralError

__all__ = ["NAME", "TAKES_COMMAND", "add_parser", "run"]

NAME = "run"
TAKES_COMMAND = True

EPILOG = f"""\
exit status:
  N    the command's own exit status (a command killed by signal N: 128+N)
{COMMON_STATUSES}
       (2 also for a bad --limit, and for memory:// URLs)
  70   the lock (or slot) was lost while the command ran (force-released, or its
       TTL ran out while corral was stopped or cut off): the command's process
       group got SIGTERM, then SIGKILL after --grace seconds
  75   the lock was not acquired within --wait: another process holds it (with
       --limit N: N processes hold a slot each) (-E/--conflict-exit-code N
       chooses another status)
  126  the command could not be executed
  127  the command was not found
  128+N  corral got signal N before the command started

The command runs in a process group (and session) of its own, which gets every
signal: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to corral are
passed on to the whole group (a Ctrl-C at the terminal reaches corral, which
passes it on once), and Ctrl-Z stops the group with corral. If corral dies
(SIGKILL, out of memory), the group is killed. Processes the command leaves
running in its group when it exits get SIGTERM (SIGKILL after --grace) before
the lock is released.

The command sees CORRAL_LOCK_NAME and CORRAL_LOCK_TOKEN (the fencing token, an
integer that grows with every acquisition: pass it to storage that can refuse
stale writers; with --limit, the token of its slot). The lock is released when
the command exits (kept closed for --hold-for seconds more if given).

--limit N (N > 1) takes one of the N slots of the semaphore NAME instead of the
lock NAME: up to N such commands run at once. Every corral using the name must
give the same N. A semaphore and a lock of one name are distinct, so
--limit 1 is the plain lock.
"""


def _exit_status(text: str) -> int:
    status = int(text)
    if not 0 <= status <= 255:
        raise argparse.ArgumentTypeError(f"an exit status is 0 to 255, not {status}")
    return status


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="run a command while holding a lock",
        usage="corral run NAME [options] -- CMD [ARG...]",
        description="Run CMD while holding the lock NAME: at most one such command runs at\n"
        "a time across every process and machine that uses the same server.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("name", metavar="NAME", help="the lock's name")
    add_url_argument(parser)
    add_ttl_argument(parser, 30.0, "lock")
    add_wait_argument(parser, 0.0, "lock")
    parser.add_argument(
        "--hold-for",
        type=float,
        default=0.0,
        metavar="S",
        help="after CMD exits, keep the lock closed S more seconds: at most one run per S",
    )
    add_grace_argument(parser, "lost lock")
    parser.add_argument(
        "--limit",
        type=int,
        default=1,
        metavar="N",
        help="hold one of the N slots of the semaphore NAME instead of the lock NAME: up "
        "to N such commands at once (default: 1, the lock)",
    )
    parser.add_argument(
        "-E",
        "--conflict-exit-code",
        type=_exit_status,
        default=EX_TEMPFAIL,
        metavar="N",
        help=f"exit status when the lock is busy (not acquired within --wait) "
        f"(default: {EX_TEMPFAIL}, as flock(1)'s -E)",
    )
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="say nothing when the lock is busy (errors are still printed): for cron, "
        "which mails any output",
    )
    talk.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say on stderr which store is used, and the lock and fencing token acquired",
    )
    parser.set_defaults(handler=run, takes_command=True)


class _LockLease(Lease):
    """The lock NAME, or with `limit` > 1 one slot of the semaphore NAME: the handles
    share their API, so only their making and their description differ."""

    def __init__(
        self, store: corral.Store, name: str, limit: int, ttl: float, wait: float | None
    ) -> None:
        what = f"lock {name!r}" if limit == 1 else f"a slot of semaphore {name!r} (limit {limit})"
        super().__init__(store, what)
        self.name = name
        self.limit = limit
        self.handle: corral.Lock
        if limit == 1:
            self.handle = store.lock(name, ttl, wait=wait, auto_renew=True, on_lost=self.lost)
        else:
            self.handle = store.semaphore(
                name, limit, ttl, wait=wait, auto_renew=True, on_lost=self.lost
            )
        # The handle forgets a lost acquisition once a release has reported the loss;
        # the message about the loss, written by another thread, still names its token.
        self._granted: int | None = None

    @property
    def token(self) -> int | None:
        current = self.handle.token
        return current if current is not None else self._granted

    def acquire(self) -> bool:
        granted = self.handle.acquire()
        if granted:
            self._granted = self.handle.token
        return granted

    def release(self, hold_for: float = 0.0) -> None:
        self.handle.release(hold_for=hold_for)

    def holder(self) -> str:
        if self.limit == 1:
            info = self.store.lock_info(self.name)
            if info is None:
                return "it was busy but is free now; try again"
            return describe_info(info)
        slots = self.store.semaphore_info(self.name)
        if slots is None or slots.free:
            return "it was busy but a slot is free now; try again"
        return f"the semaphore has {describe_semaphore(slots)}"

    def why_lost(self) -> str:
        if self.limit == 1:
            info = self.store.lock_info(self.name)
            now = None if info is None else f"it is now {describe_info(info)}"
        else:
            slots = self.store.semaphore_info(self.name)
            now = None if slots is None else f"the semaphore now has {describe_semaphore(slots)}"
        if now is None:
            return self.gone()
        return f"it was force-released or its TTL ran out before it could be renewed, and {now}"

    def environment(self) -> dict[str, str]:
        return {"CORRAL_LOCK_NAME": self.name, "CORRAL_LOCK_TOKEN": str(self.token)}


def _not_acquired(lease: _LockLease, target: Target, wait: float | None) -> str:
    waited = "at once (--wait 0)" if wait == 0 else f"within {wait or float('inf'):g} s"
    try:
        holder = lease.holder()
    except CorralError as exc:
        holder = f"holder unknown ({one_line(str(exc))})"
    return (
        f"{lease.what} on {target.shown} not acquired {waited}: {holder}; "
        f"see {target.command('status', lease.name)}"
    )


def run(args: argparse.Namespace) -> int:
    ttl = check_ttl(args.ttl, "--ttl")
    wait = check_wait(args.wait, "--wait")
    hold_for = check_non_negative(args.hold_for, "--hold-for")
    grace = check_non_negative(args.grace, "--grace")
    if not 1 <= args.limit <= MAX_LIMIT:
        raise ConfigError(f"--limit must be an integer from 1 to {MAX_LIMIT}, got {args.limit}")
    command: list[str] | None = args.command
    if not command:
        raise CliError(
            "nothing to run: give the command after --, as in "
            f"`corral run {args.name} -- CMD [ARG...]`",
            EX_CONFIG,
        )
    target = choose_store(args.url)
    with open_store(target) as store:
        if args.verbose:
            say(f"store {target.describe()}")
        lease = _LockLease(store, args.name, args.limit, ttl, wait)
        handlers = SignalHandlers()
        supervisor = Supervisor(
            lease, grace, handlers, after_loss=f"exiting with status {EX_LOCK_LOST}"
        )
        try:
            if not take(supervisor):
                if not args.quiet:
                    say(_not_acquired(lease, target, wait))
                return int(args.conflict_exit_code)
            if args.verbose:
                say(
                    f"acquired {lease.what} on {store.server}: fencing token {lease.token}, "
                    f"owner {lease.handle.owner}, ttl {ttl:g} s renewed every {ttl / 3:.3g} s; "
                    f"running {shlex.join(command)}"
                )
            status = supervisor.run(command, {**os.environ, **lease.environment()})
            return give_back(supervisor, status, hold_for, ttl, verbose=args.verbose)
        except Interrupted as exc:
            return 128 + exc.signum
        finally:
            handlers.restore()
