"""redis://: every key under corral's default prefix."""

from __future__ import annotations

from typing import Any

import redis

from tests.footprint import register


# A held lock keeps its lock key and its token key. Semaphores' keys carry the same
# prefix (`corral:{name}:sem:...`), so they are counted too.
@register("redis", per_held=2, constant=0)
def count(store: Any, url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return sum(1 for _ in client.scan_iter(match="corral:*", count=1000))
    finally:
        client.close()
