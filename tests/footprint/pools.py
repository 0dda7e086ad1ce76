"""Pools of servers: the sum of what each server keeps, counted as for one server.

A lock lives on one server of the pool, so per_held is one server's; each
server may keep its own constant entries (memcached's fencing counter).
"""

from __future__ import annotations

from typing import Any

from corral.backends.registry import pool_hosts
from tests.footprint import memcached, redis, register

MEMCACHED_SERVERS = 5


def _members(url: str) -> list[str]:
    scheme, _, rest = url.partition("://")
    tail = rest[len(rest.split("/", 1)[0].split("?", 1)[0]) :]
    return [f"{scheme}://{host}{tail}" for host in pool_hosts(url)]


class _Child:
    def __init__(self, backend: Any) -> None:
        self.backend = backend


@register("memcached-pool", per_held=1, constant=MEMCACHED_SERVERS)
def count_memcached(store: Any, url: str) -> int:
    pool = store.backend
    return sum(
        memcached.count(_Child(pool.child(server)), member)
        for server, member in zip(pool.servers, _members(url), strict=True)
    )


@register("redis-pool", per_held=2, constant=0)
def count_redis(store: Any, url: str) -> int:
    return sum(redis.count(store, member) for member in _members(url))
