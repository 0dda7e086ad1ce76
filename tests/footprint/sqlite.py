"""sqlite://: every row in corral's tables of the store's file, read with a connection of our own.

per_held=1: a held lock is one row of the locks table, a held semaphore slot one
row of the slots table (fair queues empty as waiters are served, and wake-up
registrations belong to waiters, not to holders).
constant=1: the token counter's one row, created with the file's first
acquisition; nothing else is kept per store.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import Any

from corral.backends.sqlite_sql import DEFAULT_TABLE_PREFIX, parse_url
from tests.footprint import register

TABLES = (
    "locks",
    "queue",
    "waiters",
    "sequence",
    "fences",
    "sem_slots",
    "sem_queue",
    "sem_waiters",
)


@register("sqlite", per_held=1, constant=1)
def count(store: Any, url: str) -> int:
    options = parse_url(url, {})
    prefix = options.table_prefix or DEFAULT_TABLE_PREFIX
    if not os.path.exists(options.path):
        return 0  # nothing was ever written
    with contextlib.closing(sqlite3.connect(f"file:{options.path}?mode=ro", uri=True)) as conn:
        present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        return sum(
            conn.execute(f"SELECT count(*) FROM {prefix}{table}").fetchone()[0]
            for table in TABLES
            if f"{prefix}{table}" in present
        )
