"""memory://: the backend's own tables, read in the process that holds them."""

from __future__ import annotations

from typing import Any

from tests.footprint import register


# Each held lock is one entry (plus, in the expiry heap, one or two pending expiries);
# the heap is rebuilt once it holds 64 superseded expiries more than twice the live ones.
@register("memory", per_held=3, constant=64)
def count(store: Any, url: str) -> int:
    backend = store.backend
    return len(backend._locks) + len(backend._queues) + len(backend._expiries)
