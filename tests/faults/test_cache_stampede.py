"""The stampede, for real: 2 processes x 20 clients on one expiring key, every backend.

Each client has its own connection, so only the server keeps the clients from
computing together. The computations' own records (start and end on the
shared monotonic clock) say whether any expiry was computed twice: two
computations never overlap, and without XFetch none starts before the value
the previous one stored had expired.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.test_faults import FLAVOURS

pytestmark = [pytest.mark.capability("cache", "cross_process"), pytest.mark.slow]

PROCESSES, CLIENTS = 2, 20
# (seconds, ttl, compute): XFetch's head start grows with the read rate (by delta times
# the log of reads per delta), so its TTL is many computations long, as in real use.
TIMING = {
    "lock": (2.5, 0.5, 0.05),
    "stale": (2.5, 0.5, 0.05),
    "xfetch": (3.5, 1.0, 0.02),
    "background": (2.5, 0.5, 0.05),
}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("mode", ["lock", "stale", "xfetch", "background"])
def test_one_computation_per_expiry(
    backend_url: str, name: str, tmp_path: Path, mode: str, flavour: str
) -> None:
    log = tmp_path / "computations"
    seconds, ttl, compute = TIMING[mode]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.faults.cache_client",
                backend_url,
                name,
                mode,
                str(log),
                "--clients",
                str(CLIENTS),
                "--seconds",
                str(seconds),
                "--ttl",
                str(ttl),
                "--compute",
                str(compute),
                "--flavour",
                flavour,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    clients = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        clients.extend(json.loads(out.splitlines()[-1]))
    assert len(clients) == PROCESSES * CLIENTS
    errors = [error for client in clients for error in client["errors"]]
    assert errors == []
    assert all(client["reads"] > 0 for client in clients)
    runs = sorted(
        tuple(float(part) for part in line.split()) for line in log.read_text().splitlines()
    )
    # The key expired during the run (more than once: a loaded machine reads slowly),
    # and was computed each time...
    assert len(runs) >= 2, runs
    for (start, end), (next_start, _) in itertools.pairwise(runs):
        # ... by one client at a time (a lost exclusion overlaps two computations) ...
        assert next_start >= end, f"two computations overlap: {runs}"
        if mode != "xfetch":
            # ... and never again before the value just stored had expired. (The value
            # is stored a moment after `end`, so its expiry is after end + TTL.)
            assert next_start >= end + ttl - 0.02, f"computed twice for one expiry: {runs}"
        else:
            # XFetch recomputes before expiry, the earlier the more reads there are
            # (by delta * ln(reads per delta)), but never again right after a value
            # was stored: a reader that saw the old value and fired late finds the new
            # one when it takes the lock, and does not compute.
            # A computation that took long (a loaded machine stalls the first one) makes
            # XFetch fire early in earnest: its head start grows with the delta measured.
            if end - start <= 2 * compute:
                assert next_start >= end + 0.1 * ttl, f"computed twice for one expiry: {runs}"
