"""How much state a backend keeps on its server, for the bounded-state tests.

Each backend's module here registers a counter: the number of entries (keys,
rows, items) corral keeps on the server under the store's namespace. The tests
compare counts before and after using many names once, so entries other tests
left behind do not matter.
"""

from __future__ import annotations

import importlib
import pkgutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Footprint", "footprint_for", "register"]


@dataclass(frozen=True)
class Footprint:
    count_entries: Callable[[Any, str], int]
    """(store, url) -> entries corral keeps on the server, held or not."""
    url: str
    per_held: int
    """How many entries one held lock may keep."""
    constant: int
    """How many more entries may stay, whatever the number of names used."""

    def count(self, store: Any) -> int:
        return self.count_entries(store, self.url)

    @staticmethod
    def fresh_prefix() -> str:
        return f"bounded-{uuid.uuid4().hex[:8]}"


_COUNTERS: dict[str, tuple[Callable[[Any, str], int], int, int]] = {}


def register(
    *backends: str, per_held: int, constant: int
) -> Callable[[Callable[[Any, str], int]], Callable[[Any, str], int]]:
    def decorate(func: Callable[[Any, str], int]) -> Callable[[Any, str], int]:
        for backend in backends:
            _COUNTERS[backend] = (func, per_held, constant)
        return func

    return decorate


def footprint_for(backend_name: str, url: str) -> Footprint:
    if not _COUNTERS:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
    func, per_held, constant = _COUNTERS[backend_name]
    return Footprint(func, url, per_held, constant)
