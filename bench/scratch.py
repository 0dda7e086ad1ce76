"""Where the benchmarks' throwaway servers keep their files: gone when the run ends."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_ROOT: Path | None = None


def scratch(label: str) -> Path:
    """A fresh directory for one server, under one directory removed at exit.

    Every server is stopped (the benchmarks' `finally` blocks) before the
    interpreter exits, so nothing still writes there when it is removed.
    """
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="corral-bench-"))
        atexit.register(shutil.rmtree, _ROOT, True)
    return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=_ROOT))
