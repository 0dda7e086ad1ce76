# Generated from tests/_async/conftest.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Stores for the contract suite in this flavour."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from corral import Store, connect
from tests.conftest import capabilities
from tests.footprint import Footprint, footprint_for


@pytest.fixture
def store(backend_url: str) -> Iterator[Store]:
    with connect(backend_url) as opened:
        yield opened


@pytest.fixture
def other_store(backend_name: str, backend_url: str, store: Store) -> Iterator[Store]:
    """A second client of the same locks: its own connection where the backend shares across
    processes, the same store where it lives in one process."""
    if not capabilities(backend_name).cross_process:
        yield store
        return
    with connect(backend_url) as opened:
        yield opened


@pytest.fixture
def lapse(backend_name: str) -> Callable[[float], float]:
    """Seconds to sleep until a lock of `ttl` has surely expired on this backend."""
    slack = capabilities(backend_name).ttl_slack
    return lambda ttl: ttl + slack + 0.2


@pytest.fixture
def footprint(backend_name: str, backend_url: str) -> Footprint:
    """Counts the entries corral keeps on this backend's server."""
    return footprint_for(backend_name, backend_url)
