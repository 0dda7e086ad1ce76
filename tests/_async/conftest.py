"""Stores for the contract suite in this flavour."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from corral.aio import AsyncStore, connect
from tests.conftest import capabilities
from tests.footprint import Footprint, footprint_for


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[AsyncStore]:
    async with connect(backend_url) as opened:
        yield opened


@pytest.fixture
async def other_store(
    backend_name: str, backend_url: str, store: AsyncStore
) -> AsyncIterator[AsyncStore]:
    """A second client of the same locks: its own connection where the backend shares across
    processes, the same store where it lives in one process."""
    if not capabilities(backend_name).cross_process:
        yield store
        return
    async with connect(backend_url) as opened:
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
