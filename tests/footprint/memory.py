"""memory://: the backend's own tables, read in the process that holds them."""

from __future__ import annotations

from typing import Any

from tests.footprint import register


@register("memory", per_held=1, constant=0)
def count(store: Any, url: str) -> int:
    backend = store.backend
    return sum(len(table) for table in vars(backend).values() if isinstance(table, dict))
