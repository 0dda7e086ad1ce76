"""Fixtures the fault tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.testing import servers
from tests.conftest import server_missing


@pytest.fixture
def masters(backend_name: str, tmp_path: Path) -> Iterator[servers.RedisMasters]:
    """Three independent masters for this test alone (it kills and restarts them)."""
    try:
        started = servers.start_redis_masters(tmp_path)
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
    try:
        yield started
    finally:
        started.stop()
