"""memory://: the backend's own tables, read in the process that holds them.

The expiry heap is an index over these tables, kept bounded on its own (see
`tests/core/test_memory_heap.py`): it is not state kept per name.
"""

from __future__ import annotations

from typing import Any

from tests.footprint import register


@register("memory", per_held=1, constant=0)
def count(store: Any, url: str) -> int:
    backend = store.backend
    return len(backend._locks) + len(backend._queues)
