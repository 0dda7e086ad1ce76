"""`corral release NAME --force`: free a lock whoever holds it, for operators.

Taking a lock away from a running holder breaks the exclusivity it relies on,
so it must be asked for explicitly (`--force`). The holder's `corral run`
notices at its next renewal and stops its command.
"""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli._common import (
    COMMON_STATUSES,
    EX_CONFIG,
    CliError,
    add_url_argument,
    choose_store,
    describe_info,
    open_store,
)

__all__ = ["NAME", "add_parser", "release"]

NAME = "release"

EPILOG = f"""\
exit status:
  0    the lock was freed, or was not held
{COMMON_STATUSES}
  (2 also when --force is missing)

A `corral run` holding the lock finds out at its next renewal (every ttl/3),
stops its command (SIGTERM, then SIGKILL) and exits 70.
"""


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="free a lock whoever holds it (needs --force)",
        description="Free a lock whoever holds it. The holder loses it: its `corral run`\n"
        "stops its command.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("name", metavar="NAME", help="the lock's name")
    add_url_argument(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="required: confirms taking the lock away from its holder",
    )
    parser.set_defaults(handler=release)


def release(args: argparse.Namespace) -> int:
    target = choose_store(args.url)
    if not args.force:
        raise CliError(
            f"refusing to release lock {args.name!r} without --force: it may be held by "
            "another process, whose work then loses its exclusivity (its `corral run` "
            f"stops its command); run {target.command('release', args.name, '--force')} "
            "to do it anyway",
            EX_CONFIG,
        )
    with open_store(target) as store:
        # Read first, to say what was freed; the holder may change in between,
        # which the wording allows for.
        info = store.lock_info(args.name)
        freed = store.force_release(args.name)
        server = store.server
    if not freed:
        print(f"lock {args.name!r} on {server}: not held; nothing to free")
    elif info is None:
        print(f"lock {args.name!r} on {server}: freed (acquired just before, holder unknown)")
    else:
        print(f"lock {args.name!r} on {server}: freed; it was {describe_info(info)}")
    return 0
