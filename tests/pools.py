"""What the pool tests share: starting servers the way the contract fixtures do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.testing import servers
from tests.conftest import server_missing


def started(start: Any, workdir: Path) -> Any:
    """`start(workdir)`, a missing server failing in CI and skipping elsewhere."""
    try:
        return start(workdir)
    except servers.ServerUnavailable as exc:
        server_missing(str(exc))
        raise
