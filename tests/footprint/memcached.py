"""memcached://: the live items under the store's prefix, as the server lists them.

`lru_crawler metadump all` walks every item and skips expired ones (memcached
reclaims those lazily, and never serves them), so this counts what a name
really keeps: held locks, closed locks, placeholders, queues, places, the same
for semaphores (slots, their placeholders, the header that keeps a semaphore's
limit), and the one fencing counter per prefix.

per_held=1: a held lock is one item. constant=1: the fencing counter, created
by the first acquisition under a prefix. Nothing else may stay once names are
released and expired: no per-name counter, no tombstone.
"""

from __future__ import annotations

import socket
import time
from typing import Any
from urllib.parse import unquote

from corral.backends.memcached_proto import parse_url
from tests.footprint import register


@register("memcached", per_held=1, constant=1)
def count(store: Any, url: str) -> int:
    options = parse_url(url, {})
    marker = f"key={store.backend.prefix}:"
    deadline = time.monotonic() + 30
    while True:
        with socket.create_connection((options.host, options.port), timeout=30) as sock:
            sock.sendall(b"lru_crawler metadump all\r\n")
            data = b""
            while not data.endswith(b"END\r\n") and not data.startswith((b"BUSY", b"ERROR")):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        if data.endswith(b"END\r\n"):
            break
        assert time.monotonic() < deadline, f"metadump kept failing: {data[:200]!r}"
        time.sleep(0.1)  # another crawl is running
    lines = data.decode("ascii", "replace").splitlines()
    return sum(1 for line in lines if unquote(line).startswith(marker))
