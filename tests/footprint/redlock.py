"""redis+redlock://: every key under corral's default prefix, on every master."""

from __future__ import annotations

from typing import Any

import redis

from tests.footprint import register


# A held lock keeps its lock key and its token key on each of the three masters.
@register("redlock", per_held=6, constant=0)
def count(store: Any, url: str) -> int:
    total = 0
    for server in store.backend.servers:
        client = redis.Redis.from_url(server)
        try:
            total += sum(1 for _ in client.scan_iter(match="corral:*", count=1000))
        finally:
            client.close()
    return total
