"""etcd://: the keys under the store's prefix, and every lease the cluster keeps.

Leases count because each costs the cluster memory and a place in its expiry
queue until it is revoked or runs out. They are not namespaced, so every lease
on the test cluster is counted: the contract test compares counts before and
after, on a cluster only this session uses.
"""

from __future__ import annotations

from typing import Any

import httpx

from corral.backends import etcd_api as api
from tests.footprint import register


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    options = api.parse_url(url, {})
    with httpx.Client(trust_env=False, timeout=10) as client:
        answer: dict[str, Any] = client.post(options.endpoints[0] + path, json=body).json()
    return answer


# A held lock (or semaphore slot) is one key on one lease. Nothing stays for a name
# once it is released and its TTL has run out (measured: exactly the held lock's key
# and lease remain). The constant allows for the listing of leases, which one member
# answers from its own state, not linearizably: a follower may not have applied the
# last revokes yet.
@register("etcd", "etcd-cluster", per_held=2, constant=2)
def count(store: Any, url: str) -> int:
    prefix = api.encode(f"{store.backend.prefix}/")
    keys = _post(
        url,
        "/v3/kv/range",
        {"key": api.b64(prefix), "range_end": api.b64(api.prefix_end(prefix)), "count_only": True},
    )
    leases = _post(url, "/v3/lease/leases", {})
    return int(keys.get("count", 0)) + len(leases.get("leases") or [])
