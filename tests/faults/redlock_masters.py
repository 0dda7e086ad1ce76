"""A plain client on one Redlock master, for the fault tests that look inside it."""

from __future__ import annotations

import redis

from corral.testing import servers


def client(master: servers.RedisMaster) -> redis.Redis:
    """A plain redis-py client on one master, to look at or change what it holds."""
    return redis.Redis(host=master.host, port=master.port, decode_responses=True)
