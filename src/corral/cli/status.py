"""`corral status NAME`: who holds a lock, a semaphore's slots or an election's leadership.

For scripts and for whoever is on call. It exits 0 whether anything is held or
not: "held" is an answer, not a failure, and scripts read it from the output
(`--json`) instead. It only reads: it creates nothing, on the server or on disk.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from corral.cli._common import (
    COMMON_STATUSES,
    add_url_argument,
    choose_store,
    describe_info,
    describe_leader,
    describe_semaphore,
    open_store,
)
from corral.core.election import identity_of
from corral.core.primitives import LockInfo

__all__ = ["NAME", "add_parser", "status"]

NAME = "status"

EPILOG = f"""\
exit status:
  0    the answer was printed, whether anything is held or not
{COMMON_STATUSES}

A name can have a lock (`corral run`), a semaphore (`corral run --limit N`) and
an election (`corral elect`): they are distinct on the server, and status shows
each of them that is held now.

--json prints one object: {{"name", "held", "owner", "token", "ttl", "server",
"semaphore", "election"}}. "held", "owner", "token" and "ttl" are the lock's:
"held" is true while the lock cannot be acquired; "owner" is null (and "held"
true) while a holder's release --hold-for keeps it closed; "ttl" is the seconds
left. "semaphore" is null when no slot is taken, else {{"limit", "free",
"holders": [{{"owner", "token", "ttl"}}, ...]}}. "election" is null when nobody
leads, else {{"leader" (the identity), "owner", "term", "ttl"}}.
"""


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="show who holds a lock, a semaphore's slots or an election's leadership",
        description="Show whether the lock NAME is held, by which owner, its fencing token\n"
        "and how many seconds it has left; and likewise the holders of the semaphore NAME\n"
        "and the leader of the election NAME, where they exist.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("name", metavar="NAME", help="the lock's, semaphore's or election's name")
    add_url_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=status)


def _holder(info: LockInfo) -> dict[str, object]:
    return {"owner": info.owner, "token": info.token, "ttl": round(info.ttl, 3)}


def status(args: argparse.Namespace) -> int:
    name: str = args.name
    with open_store(choose_store(args.url)) as store:
        # Reads only: none of these creates anything on the server or on disk.
        info = store.lock_info(name)
        slots = store.semaphore_info(name) if store.capabilities.semaphores else None
        leadership = store.election(name).leadership()
        server = store.server
    if args.json:
        print(
            json.dumps(
                {
                    "name": name,
                    "held": info is not None,
                    "owner": None if info is None else info.owner,
                    "token": None if info is None else info.token,
                    "ttl": None if info is None else round(info.ttl, 3),
                    "server": server,
                    "semaphore": None
                    if slots is None
                    else {
                        "limit": slots.limit,
                        "free": slots.free,
                        "holders": [_holder(holder) for holder in slots.holders],
                    },
                    "election": None
                    if leadership is None
                    else {
                        "leader": identity_of(leadership.owner),
                        "owner": leadership.owner,
                        "term": leadership.token,
                        "ttl": round(leadership.ttl, 3),
                    },
                }
            )
        )
        return 0
    if info is None and slots is None and leadership is None:
        print(
            f"lock {name!r} on {server}: not held (nor is a slot of a semaphore, or the "
            "leadership of an election, of that name)"
        )
        return 0
    if info is not None:
        print(f"lock {name!r} on {server}: {describe_info(info)}")
    if slots is not None:
        print(f"semaphore {name!r} on {server}: {describe_semaphore(slots, len(slots.holders))}")
    if leadership is not None:
        print(f"election {name!r} on {server}: {describe_leader(leadership)}")
    return 0
