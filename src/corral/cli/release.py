"""`corral release NAME --force`: free a lock whoever holds it, for operators.

Taking a lock away from a running holder breaks the exclusivity it relies on,
so it must be asked for explicitly (`--force`). The holder's `corral run`
notices at its next renewal and stops its command. The semaphore and the
election of the same name are freed too, whichever exist: an operator who
frees NAME means whatever keeps NAME's commands from running.
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
    describe_leader,
    describe_semaphore,
    open_store,
)

__all__ = ["NAME", "add_parser", "release"]

NAME = "release"

EPILOG = f"""\
exit status:
  0    what was held was freed (or nothing was held)
{COMMON_STATUSES}
  (2 also when --force is missing)

It frees the lock NAME, every slot of the semaphore NAME and the leadership of
the election NAME, whichever are held, and says which. A `corral run` (or
`corral elect`) holding one of them finds out at its next renewal (every
ttl/3), stops its command (SIGTERM, then SIGKILL) and exits 70 (`corral elect
--rejoin` campaigns again instead).
"""


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="free a lock, semaphore or leadership whoever holds it (needs --force)",
        description="Free the lock NAME (and the semaphore and the election NAME) whoever\n"
        "holds them. The holders lose them: their `corral run` or `corral elect` stops its\n"
        "command.",
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
    name: str = args.name
    with open_store(target) as store:
        # Read first, to say what was freed; the holders may change in between,
        # which the wording allows for.
        server = store.server
        info = store.lock_info(name)
        freed = store.force_release(name)
        slots = store.semaphore_info(name) if store.capabilities.semaphores else None
        slots_freed = store.force_release_semaphore(name) if slots is not None else 0
        leadership = store.election(name).leadership()
        led = leadership is not None and store.force_release_election(name)
    if freed:
        was = "acquired just before, holder unknown" if info is None else describe_info(info)
        print(f"lock {name!r} on {server}: freed; it was {was}")
    if slots_freed:
        assert slots is not None
        print(
            f"semaphore {name!r} on {server}: freed {slots_freed} slot(s); it had "
            f"{describe_semaphore(slots, len(slots.holders))}"
        )
    if led:
        assert leadership is not None
        print(
            f"election {name!r} on {server}: freed the leadership; it was: "
            f"{describe_leader(leadership)}"
        )
    if not (freed or slots_freed or led):
        print(
            f"lock {name!r} on {server}: not held; nothing to free (nor was a slot of a "
            "semaphore, or the leadership of an election, of that name)"
        )
    return 0
