"""How an election rides on a lock, with no I/O: its lock's name and its leader's identity.

An election is an auto-renewed lock whose holder others can name. The
identity the leader gave travels inside the lock's owner id, so any process
that can see the lock's holder (every backend's `inspect`) can say who leads,
and no backend needs a primitive of its own for it.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import quote, unquote

__all__ = ["ELECTION_PREFIX", "default_identity", "election_owner", "identity_of", "lock_name"]

# Elections live beside locks in each backend's lock namespace, under a prefix no
# lock name given by hand is likely to start with, so a lock and an election may
# share a name without meeting.
ELECTION_PREFIX = "\x00election:"

# Separates the quoted identity from the lock's own owner id (which names the
# process, thread and attempt): quoting leaves no "@" in the identity part.
_SEPARATOR = "@"


def lock_name(name: str) -> str:
    """The lock that decides the election `name`."""
    return ELECTION_PREFIX + name


def default_identity() -> str:
    """host:pid, what a leader is called when it gives no identity."""
    return f"{socket.gethostname()}:{os.getpid()}"


def election_owner(identity: str, owner: str) -> str:
    """The lock owner id of a campaign: the identity, quoted, then the unique owner id."""
    return f"{quote(identity, safe='')}{_SEPARATOR}{owner}"


def identity_of(owner: str | None) -> str | None:
    """The identity a leader gave, from its lock's owner id (None for no leader)."""
    if owner is None:
        return None
    quoted, found, _ = owner.partition(_SEPARATOR)
    return unquote(quoted) if found else owner
