"""`corral elect NAME -- CMD`: run a command only while this process leads the election NAME.

A leadership is a lease like a lock (see `_lease`, which supervises the command
the same way for `corral run`): campaigning waits for it, the library renews it,
and when it is lost the command's process group is stopped. What is particular
to an election is what happens next: with `--rejoin`, corral campaigns again
and starts the command anew once elected, instead of exiting; and a command
that exits by itself hands the leadership over at once (a resignation wakes a
waiting campaigner where the backend pushes releases).
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
    describe_leader,
    one_line,
    open_store,
    say,
)
from corral.cli._lease import (
    REPORT_TIMEOUT,
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
from corral.core.validate import check_non_negative, check_ttl, check_wait
from corral.errors import CorralError

__all__ = ["NAME", "TAKES_COMMAND", "add_parser", "elect"]

NAME = "elect"
TAKES_COMMAND = True

EPILOG = f"""\
exit status:
  N    the command's own exit status (a command killed by signal N: 128+N)
{COMMON_STATUSES}
       (2 also for memory:// URLs)
  70   the leadership was lost while the command ran (force-released, or its
       TTL ran out while corral was stopped or cut off): the command's process
       group got SIGTERM, then SIGKILL after --grace seconds (not with --rejoin)
  75   not elected within --wait (by default corral waits forever)
  126  the command could not be executed
  127  the command was not found
  128+N  corral got signal N before the command started

corral campaigns, and once elected runs the command; the leadership is renewed
every ttl/3 while it runs. When the command exits, corral resigns at once (a
waiting campaigner is elected without waiting for the TTL) and exits with the
command's status. If corral dies, the command is killed with it, and another
campaigner is elected once the TTL runs out.

When the leadership is lost while the command runs, the command's process group
gets SIGTERM (then SIGKILL after --grace) and corral exits 70. With --rejoin it
does not exit: once the whole group is gone it campaigns again (waiting as
--wait says, counted afresh) and, once elected, starts the command anew, with
the new term; a stop signal corral passed on to the command (SIGINT, SIGTERM,
SIGHUP, SIGQUIT) ends that loop, as does a command that exits by itself.

Signals are passed on to the command's process group as `corral run` does
(see `corral run --help`). The command sees CORRAL_LOCK_NAME (the election's
name), CORRAL_LEADER_TERM (the term: a fencing token that grows with every
leadership, to pass to storage that can refuse a stale leader's writes) and
CORRAL_LEADER_IDENTITY (--identity, by default host:pid).
"""


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="run a command only while leading an election",
        usage="corral elect NAME [options] -- CMD [ARG...]",
        description="Campaign in the election NAME and run CMD while this process leads:\n"
        "one leader at a time across every process and machine that uses the same server.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("name", metavar="NAME", help="the election's name")
    add_url_argument(parser)
    add_ttl_argument(parser, 10.0, "leadership")
    add_wait_argument(parser, float("inf"), "leadership")
    add_grace_argument(parser, "lost leadership")
    parser.add_argument(
        "--identity",
        metavar="ID",
        default=None,
        help="what `corral status NAME` shows as the leader while this process leads "
        "(default: host:pid)",
    )
    parser.add_argument(
        "--rejoin",
        action="store_true",
        help="after losing the leadership, stop CMD, campaign again and start CMD anew "
        "once elected, instead of exiting 70",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say on stderr which store is used, and each term won and given up",
    )
    parser.set_defaults(handler=elect, takes_command=True)


class _Leadership(Lease):
    """The leadership of the election NAME; its term is its fencing token."""

    token_name = "term"

    def __init__(
        self, store: corral.Store, name: str, ttl: float, identity: str | None, wait: float | None
    ) -> None:
        super().__init__(store, f"the leadership of election {name!r}")
        self.name = name
        self.wait = wait
        self.election = store.election(name, ttl, identity, on_lost=self.lost)
        self.term: int | None = None

    @property
    def token(self) -> int | None:
        # The election's own: a signal landing between the grant and `acquire` returning
        # must still find the leadership to give back.
        return self.term if self.term is not None else self.election.term

    def acquire(self) -> bool:
        self.term = None
        elected = self.election.campaign(self.wait)
        # None if lost already: the supervisor then starts nothing.
        self.term = self.election.term if elected else None
        return elected

    def release(self, hold_for: float = 0.0) -> None:
        self.election.resign()

    def holder(self) -> str:
        info = self.election.leadership()
        if info is None:
            return "nobody leads now (the leader just stepped down); try again"
        return describe_leader(info)

    def why_lost(self) -> str:
        info = self.election.leadership()
        if info is None:
            return self.gone()
        return (
            "it was force-released or its TTL ran out before it could be renewed, and now "
            f"{describe_leader(info)}"
        )

    def environment(self) -> dict[str, str]:
        return {
            "CORRAL_LOCK_NAME": self.name,
            "CORRAL_LEADER_TERM": str(self.term),
            "CORRAL_LEADER_IDENTITY": self.election.identity,
        }


def _not_elected(lease: _Leadership, target: Target, wait: float | None) -> str:
    waited = "at once (--wait 0)" if wait == 0 else f"within {wait or float('inf'):g} s"
    try:
        holder = lease.holder()
    except CorralError as exc:
        holder = f"leader unknown ({one_line(str(exc))})"
    return (
        f"election {lease.name!r} on {target.shown}: not elected {waited}: {holder}; "
        f"see {target.command('status', lease.name)}"
    )


def elect(args: argparse.Namespace) -> int:
    ttl = check_ttl(args.ttl, "--ttl")
    wait = check_wait(args.wait, "--wait")
    grace = check_non_negative(args.grace, "--grace")
    command: list[str] | None = args.command
    if not command:
        raise CliError(
            "nothing to run: give the command after --, as in "
            f"`corral elect {args.name} -- CMD [ARG...]`",
            EX_CONFIG,
        )
    target = choose_store(args.url)
    with open_store(target) as store:
        if args.verbose:
            say(f"store {target.describe()}")
        lease = _Leadership(store, args.name, ttl, args.identity, wait)
        after_loss = (
            "campaigning again once it is gone (--rejoin)"
            if args.rejoin
            else f"exiting with status {EX_LOCK_LOST}"
        )
        handlers = SignalHandlers()
        supervisor = Supervisor(lease, grace, handlers, after_loss)
        try:
            while True:
                if not take(supervisor):
                    say(_not_elected(lease, target, wait))
                    return EX_TEMPFAIL
                if args.verbose:
                    say(
                        f"elected in election {args.name!r} on {store.server} as "
                        f"{lease.election.identity!r}: term {lease.term}, ttl {ttl:g} s "
                        f"renewed every {ttl / 3:.3g} s; running {shlex.join(command)}"
                    )
                status = supervisor.run(command, {**os.environ, **lease.environment()})
                # Campaign again only for a leadership lost while the command ran: a
                # command that exited by itself ends corral elect, --rejoin or not.
                if not (args.rejoin and supervisor.lost_while_running):
                    return give_back(supervisor, status, 0.0, ttl, verbose=args.verbose)
                # From here a stop signal ends the loop instead of reaching a command.
                following = Supervisor(lease, grace, handlers, after_loss)
                handlers.set(following.interrupt)
                if supervisor.stop_forwarded is not None:
                    return give_back(supervisor, status, 0.0, ttl)
                lease.release_quietly()
                supervisor.reported.wait(REPORT_TIMEOUT)
                supervisor = following
        except Interrupted as exc:
            return 128 + exc.signum
        finally:
            handlers.restore()
