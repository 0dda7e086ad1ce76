"""`corral status NAME`: who holds a lock, for scripts and for whoever is on call.

It exits 0 whether the lock is held or not: "held" is an answer, not a
failure, and scripts read it from the output (`--json`) instead.
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
    open_store,
)

__all__ = ["NAME", "add_parser", "status"]

NAME = "status"

EPILOG = f"""\
exit status:
  0    the answer was printed, whether the lock is held or not
{COMMON_STATUSES}

--json prints one object: {{"name", "held", "owner", "token", "ttl", "server"}}.
"held" is true while the lock cannot be acquired; "owner" is null (and "held"
true) while a holder's release --hold-for keeps it closed. "ttl" is the
seconds left.
"""


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="show who holds a lock, its fencing token and seconds left",
        description="Show whether a lock is held, by which owner, its fencing token and\n"
        "how many seconds it has left.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("name", metavar="NAME", help="the lock's name")
    add_url_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=status)


def status(args: argparse.Namespace) -> int:
    with open_store(choose_store(args.url)) as store:
        info = store.lock_info(args.name)
        server = store.server
    if args.json:
        print(
            json.dumps(
                {
                    "name": args.name,
                    "held": info is not None,
                    "owner": None if info is None else info.owner,
                    "token": None if info is None else info.token,
                    "ttl": None if info is None else round(info.ttl, 3),
                    "server": server,
                }
            )
        )
    elif info is None:
        print(f"lock {args.name!r} on {server}: not held")
    else:
        print(f"lock {args.name!r} on {server}: {describe_info(info)}")
    return 0
