"""postgresql://: the rows of the store's tables (locks, their queue, semaphore slots and their
queue), read over a connection of its own.

per_held=1: a held lock (or semaphore slot) is one row. constant=0: a released lock's row is deleted
at once, and every other row (a lock left to expire, a `hold_for` closure, a dead
waiter's place) is deleted once expired by the sweeps of later acquisitions, of
any name; the test's hundred acquisitions on other names sweep several times what
its six hundred names leave behind.
"""

from __future__ import annotations

from typing import Any

from tests.footprint import register


@register("postgres", per_held=1, constant=0)
def count(store: Any, url: str) -> int:
    import psycopg  # here: the other backends' tests load this module too

    statements = store.backend._sql
    total = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for table in (statements.locks, statements.queue, statements.slots, statements.waiters):
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [table]).fetchone()
            if exists is not None and exists[0]:  # the store creates its tables on first use
                row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                assert row is not None
                total += int(row[0])
    return total
