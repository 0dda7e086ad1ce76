"""redis+cluster://: every key under corral's default prefix, on every master."""

from __future__ import annotations

from typing import Any

import redis.cluster

from tests.footprint import register


# As on one Redis server: a held lock keeps its lock key and its token key.
@register("redis-cluster", per_held=2, constant=0)
def count(store: Any, url: str) -> int:
    host, _, port = url.partition("://")[2].split(",")[0].partition(":")
    client = redis.cluster.RedisCluster(host=host, port=int(port))
    try:
        return sum(
            1
            for node in client.get_primaries()
            for _ in client.scan_iter(match="corral:*", count=1000, target_nodes=node)
        )
    finally:
        client.close()
