"""What only the SQLite backend promises: pushed wake-ups between processes, its file's state.

The contract suite already runs every lock behaviour on SQLite; these tests
look at the file (rows, tables, the migration from an older layout), at the
wake-up datagrams (another process's release wakes a waiter; a dead or stuck
process never blocks a release; a dropped datagram still wakes everyone; fork)
and at what `corral status` leaves behind (nothing). Semaphores get the same
look: their own wake-ups (never confused with a lock of the same name), their
rows collected, processes contending on one file never above the limit. Cache entries: reads
that never take the write lock, a claim tried in the one write transaction that reads the
entry again, keys apart from lock names, expiry to the fraction of a second, dead entries
(and an earlier boot's) collected by later writes. Each test uses its own
file, so counting rows means something. Releases that must come from another
process run in a child Python, and every wait has a generous deadline: a
waiter that is never woken fails the test after it, instead of passing slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.aio
from corral._async import lock as async_lock
from corral._sync.backends.sqlite import REGISTRATION_TTL, SQLiteBackend
from corral.backends.sqlite_sql import MachineClock, stored_name
from corral.backends.sqlite_wake import Doorbell, Ringer, wake_up_payload
from corral.core import lockflow
from corral.core.envelope import encode, make_codec, mark_stale
from corral.core.primitives import Claim, Outcome

pytestmark = pytest.mark.backend("sqlite")

DEADLINE = 30.0
JSON = make_codec("json", None)

# The same primitive calls, made by another process: JSON on stdin (so any str,
# NUL and lone surrogates included, survives the trip), one line of JSON back.
OTHER_PROCESS = """
import json, sys
import corral
url, calls = json.loads(sys.stdin.read())
results = []
with corral.connect(url) as store:
    for method, args, *keywords in calls:
        result = getattr(store.backend, method)(*args, **(keywords[0] if keywords else {}))
        result = getattr(result, "acquired", result)  # an Attempt
        results.append(getattr(result, "value", result))  # an Outcome
print(json.dumps(results))
"""

ODD_NAMES = ["plain", "nul\x00byte", "lone \ud800 surrogate", "z" * 10_000]


def in_other_process(url: str, *calls: tuple[Any, ...]) -> list[Any]:
    """Run backend primitives in a child Python; returns what each returned."""
    done = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS],
        input=json.dumps([url, calls]),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=True,
    )
    results: list[Any] = json.loads(done.stdout)
    return results


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "locks.db"


@pytest.fixture
def url(db_path: Path) -> str:
    return f"sqlite:///{db_path}"


@pytest.fixture
def store(url: str) -> Iterator[corral.Store]:
    with corral.connect(url) as opened:
        yield opened


def query(path: Path, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(sql, params).fetchall()
        conn.commit()
        return rows


def fresh() -> str:
    return f"n-{uuid.uuid4().hex[:10]}"


# -- wake-ups ---------------------------------------------------------------------------


@pytest.mark.parametrize("odd", ODD_NAMES, ids=lambda n: repr(n)[:16])
@pytest.mark.parametrize("how", ["release", "force_release"])
def test_a_release_in_another_process_wakes_the_waiter(
    store: corral.Store, url: str, odd: str, how: str
) -> None:
    backend = store.backend
    name = f"{fresh()}-{odd}"
    assert backend.try_acquire(name, "holder", 60).acquired
    with backend.waiter(name) as waiter:
        assert not backend.try_acquire(name, "waiter", 60).acquired
        args = [name, "holder"] if how == "release" else [name]
        assert in_other_process(url, (how, args)) == ["ok" if how == "release" else True]
        # Only a datagram can wake it: the release was not made in this process.
        assert waiter.wait(DEADLINE)
    assert backend.try_acquire(name, "waiter", 60).acquired


def test_a_fair_lock_wakes_only_the_head_of_its_queue(store: corral.Store, url: str) -> None:
    backend = store.backend
    name, marker = fresh(), fresh()
    assert backend.try_acquire(name, "holder", 60).acquired
    assert backend.try_acquire(marker, "holder", 60).acquired
    first = backend.waiter(name).for_owner("first")
    second = backend.waiter(name).for_owner("second")
    with first, second, backend.waiter(marker) as marker_waiter:
        assert not backend.try_acquire(name, "first", 60, queue_ttl=30).acquired
        assert not backend.try_acquire(name, "second", 60, queue_ttl=30).acquired
        # Two releases from one socket arrive in order: once the marker's wake-up is
        # seen, the listener is done with the one for `name`.
        in_other_process(url, ("release", [name, "holder"]), ("release", [marker, "holder"]))
        assert marker_waiter.wait(DEADLINE)
        assert first.wait(0)
        assert not second.wait(0)
        assert backend.try_acquire(name, "first", 60, queue_ttl=30).acquired
        # The head gives way without taking it: now the second is woken.
        in_other_process(url, ("release", [name, "first"]))
        assert second.wait(DEADLINE)


def test_a_head_that_gives_up_wakes_the_next_one(store: corral.Store, url: str) -> None:
    backend = store.backend
    name = fresh()
    assert backend.try_acquire(name, "holder", 60).acquired
    with backend.waiter(name).for_owner("second") as second:
        assert not in_other_process(url, ("try_acquire", [name, "first", 60], {"queue_ttl": 30}))[0]
        assert not backend.try_acquire(name, "second", 60, queue_ttl=30).acquired
        backend.force_release(name)  # wakes this process's waiters through the local bus
        assert second.wait(DEADLINE)
        assert not backend.try_acquire(name, "second", 60, queue_ttl=30).acquired
        in_other_process(url, ("leave_queue", [name, "first"]))
        assert second.wait(DEADLINE)
        assert backend.try_acquire(name, "second", 60, queue_ttl=30).acquired


async def test_the_asyncio_waiter_is_woken_by_another_process(url: str) -> None:
    async with corral.aio.connect(url) as store:
        backend = store.backend
        name = fresh()
        assert (await backend.try_acquire(name, "holder", 60)).acquired
        async with backend.waiter(name) as waiter:
            assert not (await backend.try_acquire(name, "waiter", 60)).acquired
            await asyncio.to_thread(in_other_process, url, ("release", [name, "holder"]))
            assert await waiter.wait(DEADLINE)


def test_dead_and_stuck_processes_never_block_a_release(
    store: corral.Store, db_path: Path, tmp_path: Path
) -> None:
    """A registration whose socket is gone is deleted; one whose process never reads
    (stopped: its queue fills) only drops datagrams. No release waits or fails."""
    backend = store.backend
    name = fresh()
    assert backend.try_acquire(name, "holder", 60).acquired
    backend.release(name, "holder")  # the file and its tables exist from here on
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stuck.bind(str(tmp_path / "stuck.sock"))
    gone = str(tmp_path / "gone.sock").encode()
    clock = MachineClock()
    until = clock.now() + 600
    for address in (gone, str(tmp_path / "stuck.sock").encode()):
        query(
            db_path,
            "INSERT INTO corral_waiters (name, address, expires_at, boot) VALUES (?, ?, ?, ?)",
            (name, address, until, clock.boot_id),
        )
    outcomes = []

    def cycles() -> None:
        for _ in range(40):
            assert backend.try_acquire(name, "holder", 60).acquired
            outcomes.append(backend.release(name, "holder"))

    worker = threading.Thread(target=cycles)
    worker.start()
    worker.join(DEADLINE)
    assert not worker.is_alive() and outcomes == [Outcome.OK] * 40
    addresses = {row[0] for row in query(db_path, "SELECT address FROM corral_waiters")}
    assert addresses == {str(tmp_path / "stuck.sock").encode()}
    stuck.close()


def test_a_dropped_datagram_wakes_every_waiter(store: corral.Store, url: str) -> None:
    """While the listener cannot read, its queue fills and datagrams are dropped; the next
    read sees a full queue and wakes everyone, so no waiter misses a release unseen."""
    backend = store.backend
    name, other = fresh(), fresh()
    assert backend.try_acquire(name, "holder", 60).acquired
    with backend.waiter(name) as waiter:
        feed = backend._feed
        assert feed is not None and feed._bell is not None
        ringer = Ringer()
        unrelated = wake_up_payload(other, None)
        with feed._mutex:  # the listener blocks before handing anything out
            for _ in range(feed._bell.overflow_at + 10):
                ringer.ring([feed._bell.address], unrelated)
        # Nothing was released for `name`: only the overflow rule can wake it.
        assert waiter.wait(DEADLINE)
        ringer.close()


def test_the_doorbell_reports_a_possibly_dropped_datagram() -> None:
    bell, ringer = Doorbell(), Ringer()
    try:
        payload = wake_up_payload("x", None)
        for _ in range(bell.overflow_at - 1):
            ringer.ring([bell.address], payload)
        assert bell.drain() == ([payload] * (bell.overflow_at - 1), False)
        for _ in range(bell.overflow_at + 5):
            ringer.ring([bell.address], payload)
        got, overflowed = bell.drain()
        assert overflowed and len(got) >= bell.overflow_at
    finally:
        bell.close()
        ringer.close()


def test_receivers_that_never_read_cannot_silence_those_that_do() -> None:
    """Datagrams waiting at a receiver count against the socket that sent them, so enough
    receivers that never read (stopped processes) fill the sender's buffer, after which
    every send from it fails, also to receivers that read, and nothing tells them. The
    ringer then sends from a fresh socket."""
    ringer = Ringer()
    payload = wake_up_payload("x", None)
    probe, healthy = Doorbell(), Doorbell()
    stuck: list[Doorbell] = []
    try:
        ringer.ring([probe.address], payload)
        full = ringer._socket
        assert full is not None and probe.drain() == ([payload], False)
        # Fill receivers' queues from the ringer's socket until it cannot send even to
        # a receiver whose queue is empty: its own buffer is full.
        while True:
            assert len(stuck) < 400, "the send buffer never filled (net.core.wmem_default?)"
            bell = Doorbell()
            stuck.append(bell)
            for _ in range(bell.overflow_at + 2):
                with contextlib.suppress(BlockingIOError):
                    full.sendto(payload, bell.address)
            try:
                full.sendto(payload, probe.address)
            except BlockingIOError:
                break
            probe.drain()
        assert ringer.ring([healthy.address], payload) == []
        assert healthy.drain() == ([payload], False)
        # The fresh socket carries on; a stuck receiver's full queue only drops datagrams.
        assert ringer.ring([stuck[0].address, healthy.address], payload) == []
        assert healthy.drain() == ([payload], False)
    finally:
        for bell in [probe, healthy, *stuck]:
            bell.close()
        ringer.close()


def test_a_release_still_wakes_a_waiter_after_stuck_processes_filled_its_socket(
    store: corral.Store, db_path: Path
) -> None:
    """The same through the backend: registrations of processes that never read (as a
    stopped process leaves them) take every datagram until their queues are full, and
    a waiter in another process is still woken by the next release."""
    releaser = store.backend
    name = fresh()
    stuck = [Doorbell() for _ in range(100)]
    waiting = SQLiteBackend(str(db_path))  # another store: its own socket, its own bus
    try:
        for bell in stuck:
            releaser._db.register([name], bell.address, 600)
        for _ in range(stuck[0].overflow_at + 2):
            assert releaser.try_acquire(name, "holder", 60).acquired
            assert releaser.release(name, "holder") is Outcome.OK
        assert releaser.try_acquire(name, "holder", 60).acquired
        with waiting.waiter(name) as waiter:
            assert not waiting.try_acquire(name, "waiter", 60).acquired
            assert releaser.release(name, "holder") is Outcome.OK
            assert waiter.wait(DEADLINE)
    finally:
        waiting.close()
        for bell in stuck:
            bell.close()


def test_a_lapsed_registration_is_renewed_and_its_waiters_re_attempt(
    store: corral.Store, url: str, db_path: Path
) -> None:
    """A process stopped past its registration's expiry may have missed releases: the
    listener registers again and wakes the waiters, so they re-attempt at once."""
    backend = store.backend
    name = fresh()
    assert backend.try_acquire(name, "holder", 60).acquired
    with backend.waiter(name) as waiter:
        feed = backend._feed
        assert feed is not None
        # What a long stop looks like from here: the row expired and was collected.
        query(db_path, "DELETE FROM corral_waiters")
        with feed._mutex:
            for entry in feed._names.values():
                entry.registered_until = MachineClock().now() - 1
        assert waiter.wait(DEADLINE)
        assert query(db_path, "SELECT count(*) FROM corral_waiters") == [(1,)]
        in_other_process(url, ("release", [name, "holder"]))
        assert waiter.wait(DEADLINE)


def test_a_registration_is_reused_while_fresh(store: corral.Store, db_path: Path) -> None:
    backend = store.backend
    name = fresh()
    assert backend.try_acquire(name, "holder", 60).acquired
    with backend.waiter(name):
        (expires_at,) = query(db_path, "SELECT expires_at FROM corral_waiters")[0]
    with backend.waiter(name):
        assert query(db_path, "SELECT expires_at FROM corral_waiters") == [(expires_at,)]
    assert expires_at - MachineClock().now() <= REGISTRATION_TTL


def test_a_forked_child_makes_its_own_socket(store: corral.Store, url: str) -> None:
    backend = store.backend
    name, childs = fresh(), fresh()
    assert backend.try_acquire(name, "holder", 60).acquired
    assert backend.try_acquire(childs, "holder", 60).acquired
    with backend.waiter(name) as waiter:
        feed = backend._feed
        assert feed is not None and feed._bell is not None
        parents_address = feed._bell.address
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                with backend.waiter(childs) as child_waiter:
                    child_feed = backend._feed
                    assert child_feed is not None and child_feed._bell is not None
                    if child_feed._bell.address == parents_address:
                        code = 3
                    os.write(ready_w, b"x")
                    if not child_waiter.wait(DEADLINE):
                        code = 4
                store.close()
            except BaseException:
                code = 5
            os._exit(code)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"x"
        os.close(ready_r)
        assert backend.release(childs, "holder") is Outcome.OK
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The child neither read nor closed the parent's socket.
        in_other_process(url, ("release", [name, "holder"]))
        assert waiter.wait(DEADLINE)


# -- the file: names, bounded state, reboots, migration -----------------------------------


def test_names_that_are_not_plain_text_are_stored_as_blobs(
    store: corral.Store, db_path: Path
) -> None:
    names = {f"{fresh()}-{odd}": odd for odd in ODD_NAMES}
    for name in names:
        assert store.lock(name, ttl=60).acquire()
    kinds = dict(query(db_path, "SELECT name, typeof(name) FROM corral_locks"))
    for name in names:
        key = stored_name(name)
        assert kinds[key] == ("text" if isinstance(key, str) else "blob")
    assert [kinds[stored_name(n)] for n in names] == ["text", "blob", "blob", "text"]
    assert len({stored_name(n) for n in ["a", "a\x00", "\ud800", "\udcff", b"a".decode()]}) == 4


def test_expired_queue_places_and_registrations_are_collected(
    store: corral.Store, db_path: Path
) -> None:
    backend = store.backend
    db = backend._db
    names = [fresh() for _ in range(40)]
    # Granted acquisitions and registrations collect what has expired: they come first,
    # and the 0.2 s places only after, by refused attempts, which collect nothing. So
    # all 80 rows are there to count, however long this process is paused meanwhile.
    for name in names:
        assert backend.try_acquire(name, "holder", 60).acquired
    db.register(names, b"\0corral-dead-process", 0.2)
    for name in names:
        assert not backend.try_acquire(name, "dies", 60, queue_ttl=0.2).acquired
    assert query(db_path, "SELECT count(*) FROM corral_queue") == [(40,)]
    assert query(db_path, "SELECT count(*) FROM corral_waiters") == [(40,)]
    time.sleep(0.5)
    # Released once the registrations expired: no datagram to a dead process makes
    # the releaser delete them; only the collection below may.
    for name in names:
        assert backend.release(name, "holder") is Outcome.OK
    for _ in range(10):
        name = fresh()
        assert backend.try_acquire(name, "traffic", 60).acquired
        backend.release(name, "traffic")
    assert query(db_path, "SELECT count(*) FROM corral_queue") == [(0,)]
    assert query(db_path, "SELECT count(*) FROM corral_waiters") == [(0,)]


def test_expired_locks_are_swept_whatever_their_names(store: corral.Store, db_path: Path) -> None:
    backend = store.backend
    held = [f"held-{i:03d}" for i in range(100)]
    expiring = [f"{prefix}-{i:03d}" for i in range(100) for prefix in ("a", "m", "\ud800")]
    for name in held:
        assert backend.try_acquire(name, "holder", 60).acquired
    for name in expiring:
        assert backend.try_acquire(name, "crashed", 60).acquired
    # Each holder cuts its TTL short, then crashes. Only after every acquisition: one
    # that found rows expired already (this process paused) would sweep them early and
    # shift where the sweep stands, and 13 acquisitions might no longer reach them all.
    for name in expiring:
        assert backend.extend(name, "crashed", 0.2) is Outcome.OK
    time.sleep(0.5)
    # The table holds 400 rows; SWEEP=32 rows per acquisition sweep it whole in 13.
    for _ in range(13):
        name = fresh()
        assert backend.try_acquire(name, "traffic", 60).acquired
        backend.release(name, "traffic")
    left = {row[0] for row in query(db_path, "SELECT name FROM corral_locks")}
    assert left == set(held)


def test_an_expired_lock_named_by_the_empty_string_is_swept(
    store: corral.Store, db_path: Path
) -> None:
    """The lock API refuses "", but the sweep must not depend on that: it starts from
    the first name, not after it."""
    backend = store.backend
    assert backend.try_acquire("", "crashed", 60).acquired
    assert backend.try_acquire("\x00", "crashed", 60).acquired  # the first BLOB name
    # Cut short only now: the second acquisition must not find "" expired and sweep it.
    for name in ("", "\x00"):
        assert backend.extend(name, "crashed", 0.2) is Outcome.OK
    time.sleep(0.5)
    for _ in range(2):
        name = fresh()
        assert backend.try_acquire(name, "traffic", 60).acquired
        backend.release(name, "traffic")
    assert query(db_path, "SELECT count(*) FROM corral_locks") == [(0,)]


class OtherBoot(MachineClock):
    """This machine's clock, but as if written in an earlier boot."""

    def __init__(self) -> None:
        super().__init__()
        self.boot_id = f"earlier-{uuid.uuid4().hex}"


def test_rows_of_an_earlier_boot_are_deleted_by_the_first_acquisition(
    db_path: Path,
) -> None:
    before = SQLiteBackend(str(db_path), machine_clock=OtherBoot())
    names = [fresh() for _ in range(20)]
    tokens = []
    for name in names:
        attempt = before.try_acquire(name, "holder", 600)
        tokens.append(attempt.token)
        assert not before.try_acquire(name, "waiter", 600, queue_ttl=600).acquired
    before._db.register(names, b"\0corral-earlier", 600)
    before.close()
    with corral.connect(f"sqlite:///{db_path}") as store:
        lock = store.lock(names[0], ttl=60)
        assert lock.acquire()  # held "600 s" by a holder of an earlier boot: free now
        assert lock.token is not None and lock.token > max(t for t in tokens if t is not None)
        for table in ("queue", "waiters"):
            assert query(db_path, f"SELECT count(*) FROM corral_{table}") == [(0,)]
        assert query(db_path, "SELECT count(*) FROM corral_locks") == [(1,)]


class UnknownBoot(MachineClock):
    """This machine's clock, read by a process that cannot read the boot id (sandboxed)."""

    def __init__(self) -> None:
        super().__init__()
        self.boot_id = ""


@pytest.fixture
def known_and_blind(db_path: Path) -> Iterator[tuple[SQLiteBackend, SQLiteBackend]]:
    """Two processes on one file: one reads the boot id, the other cannot."""
    known = SQLiteBackend(str(db_path))
    blind = SQLiteBackend(str(db_path), machine_clock=UnknownBoot())
    assert known._db.clock.boot_id  # this machine has one
    yield known, blind
    known.close()
    blind.close()


def test_processes_that_cannot_read_the_boot_id_agree_on_who_holds_what(
    known_and_blind: tuple[SQLiteBackend, SQLiteBackend],
) -> None:
    known, blind = known_and_blind
    assert known.try_acquire("k", "known", 60).acquired
    assert blind.try_acquire("b", "blind", 60).acquired
    for backend in (known, blind):
        assert not backend.try_acquire("k", "other", 60).acquired
        assert not backend.try_acquire("b", "other", 60).acquired
        assert [(i.owner if i else None) for i in map(backend.inspect, "kb")] == ["known", "blind"]
    # Acquisitions by either side leave the other side's rows alone.
    for backend in (blind, known, blind):
        name = fresh()
        assert backend.try_acquire(name, "traffic", 60).acquired
        assert backend.release(name, "traffic") is Outcome.OK
    assert known.inspect("b") is not None and blind.inspect("k") is not None
    # A queue place counts for both.
    assert not blind.try_acquire("k", "queued", 60, queue_ttl=30).acquired
    assert known.release("k", "known") is Outcome.OK
    assert not known.try_acquire("k", "newcomer", 60).acquired
    assert blind.try_acquire("k", "queued", 60, queue_ttl=30).acquired
    assert known.extend("k", "known", 60) is Outcome.LOST  # not EXPIRED: a live holder
    assert blind.extend("b", "blind", 60) is Outcome.OK


def test_only_a_process_that_reads_the_boot_id_forgets_an_earlier_boot(
    db_path: Path, known_and_blind: tuple[SQLiteBackend, SQLiteBackend]
) -> None:
    known, blind = known_and_blind
    before = SQLiteBackend(str(db_path), machine_clock=OtherBoot())
    assert before.try_acquire("old", "holder", 600).acquired
    before.close()
    name = fresh()
    assert known.try_acquire(name, "known", 60).acquired
    assert known.inspect("old") is None
    (boot,) = query(db_path, "SELECT boot FROM corral_sequence")[0]
    assert boot == known._db.clock.boot_id
    # A blind acquisition leaves the file's boot as it is, so nothing is forgotten twice.
    assert blind.try_acquire(fresh(), "blind", 60).acquired
    assert query(db_path, "SELECT boot FROM corral_sequence") == [(boot,)]
    assert known.inspect(name) is not None
    # What remains: a blind process cannot tell an earlier boot's row from a live one.
    before = SQLiteBackend(str(db_path), machine_clock=OtherBoot())
    assert before.try_acquire("older", "holder", 600).acquired
    before.close()
    assert not blind.try_acquire("older", "blind", 60).acquired
    assert known.try_acquire("older", "known", 60).acquired


def test_expired_rows_of_either_kind_of_process_are_collected_by_the_other(
    db_path: Path, known_and_blind: tuple[SQLiteBackend, SQLiteBackend]
) -> None:
    for writer, collector in (known_and_blind, known_and_blind[::-1]):
        names = [fresh() for _ in range(12)]
        # The writer's own grants and registration would collect its rows that expired
        # already (were it paused): they come first, and every 0.2 s row after them, by
        # calls that collect nothing. The holders take 60 s, so that each "dies" attempt
        # finds its name held, then cut their TTL short and crash.
        for name in names:
            assert writer.try_acquire(name, "crashed", 60).acquired
        writer._db.register(names, b"\0corral-dead-process", 0.2)
        for name in names:
            assert not writer.try_acquire(name, "dies", 60, queue_ttl=0.2).acquired
            assert writer.extend(name, "crashed", 0.2) is Outcome.OK
        time.sleep(0.5)
        for _ in range(4):
            name = fresh()
            assert collector.try_acquire(name, "traffic", 60).acquired
            assert collector.release(name, "traffic") is Outcome.OK
        for table in ("locks", "queue", "waiters"):
            assert query(db_path, f"SELECT count(*) FROM corral_{table}") == [(0,)], table


OLD_SCHEMA = (
    "CREATE TABLE corral_locks (name TEXT PRIMARY KEY, owner TEXT, token INTEGER NOT NULL,"
    " expires_at REAL NOT NULL, boot TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE corral_fences (name TEXT PRIMARY KEY, token INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE corral_queue (name TEXT NOT NULL, owner TEXT NOT NULL, seq INTEGER NOT NULL,"
    " expires_at REAL NOT NULL, boot TEXT NOT NULL, PRIMARY KEY (name, owner)) WITHOUT ROWID",
    "CREATE INDEX corral_queue_order ON corral_queue (name, seq)",
)


def test_a_file_of_the_older_layout_keeps_its_locks_and_tokens(db_path: Path) -> None:
    clock = MachineClock()
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for statement in OLD_SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO corral_fences VALUES (?, ?)", [("used", 41), ("held", 7), ("old", 3)]
        )
        conn.execute(
            "INSERT INTO corral_locks VALUES ('held', 'old-owner', 7, ?, ?)",
            (clock.now() + 600, clock.boot_id),
        )
        conn.commit()
    with corral.connect(f"sqlite:///{db_path}") as store:
        info = store.lock_info("held")
        assert info is not None and (info.owner, info.token) == ("old-owner", 7)
        assert not store.lock("held", ttl=60).acquire()
        tokens = []
        for name in ("used", "old", "new"):
            lock = store.lock(name, ttl=60)
            assert lock.acquire()
            assert lock.token is not None
            tokens.append(lock.token)
            lock.release()
        assert min(tokens) > 41 and tokens == sorted(tokens)
        assert query(db_path, "SELECT count(*) FROM corral_fences") == [(0,)]
        # An older corral still running on the file cannot hand out tokens from fences...
        with pytest.raises(sqlite3.IntegrityError, match="upgrade corral"):
            query(db_path, "INSERT OR REPLACE INTO corral_fences VALUES ('used', 42)")
        # ...but its holder can still release: its statement is unchanged.
        query(
            db_path,
            "DELETE FROM corral_locks WHERE name = 'held' AND owner = 'old-owner'"
            " AND boot = ? AND expires_at > ?",
            (clock.boot_id, clock.now()),
        )
        assert store.lock_info("held") is None
        lock = store.lock("held", ttl=60)
        assert lock.acquire() and lock.token is not None and lock.token > max(tokens)


# What an older corral does on its first write to a file: it creates its tables only if one
# of these is missing, then draws each token from the name's row in `fences`.
OLDER_CORRAL_OBJECTS = ("corral_locks", "corral_fences", "corral_queue", "corral_queue_order")
OLDER_CORRAL_DRAWS_A_TOKEN = "INSERT OR REPLACE INTO corral_fences (name, token) VALUES (?, ?)"


def test_an_older_corral_cannot_acquire_in_a_file_this_version_created(
    store: corral.Store, db_path: Path
) -> None:
    tokens = []
    for _ in range(3):
        lock = store.lock("x", ttl=60)
        assert lock.acquire()
        tokens.append(lock.token)
        lock.release()
    present = {row[0] for row in query(db_path, "SELECT name FROM sqlite_master")}
    assert present.issuperset(OLDER_CORRAL_OBJECTS)  # so it would create nothing...
    # ...and its first token, 1 for a name that had 1, 2, 3, is refused with a remedy.
    with pytest.raises(sqlite3.IntegrityError, match="upgrade corral"):
        query(db_path, OLDER_CORRAL_DRAWS_A_TOKEN, ("x", 1))
    assert query(db_path, "SELECT count(*) FROM corral_fences") == [(0,)]
    lock = store.lock("x", ttl=60)
    assert lock.acquire() and lock.token is not None and lock.token > max(tokens)


def test_a_file_without_the_guard_gets_it_from_the_next_process(
    store: corral.Store, url: str, db_path: Path
) -> None:
    """A file whose `fences` table is missing (made before every file had one) gets it,
    with its guard, from the first process of this version that writes to it; a process
    that already has the file open goes on without noticing."""
    lock = store.lock("x", ttl=60)
    assert lock.acquire()
    lock.release()
    query(db_path, "DROP TABLE IF EXISTS corral_fences")  # and its trigger
    assert in_other_process(url, ("try_acquire", ["y", "owner", 60])) == [True]
    with pytest.raises(sqlite3.IntegrityError, match="upgrade corral"):
        query(db_path, OLDER_CORRAL_DRAWS_A_TOKEN, ("x", 1))
    again = store.lock("x", ttl=60)
    assert again.acquire() and again.token is not None and again.token > (lock.token or 0) + 1
    again.release()


def test_the_first_use_by_many_processes_at_once_creates_the_tables_once(url: str) -> None:
    calls = [("try_acquire", [f"first-{i}", "owner", 60]) for i in range(3)]
    with contextlib.ExitStack() as stack:
        children = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", OTHER_PROCESS],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            for _ in range(6)
        ]
        for child in children:
            assert child.stdin is not None
            child.stdin.write(json.dumps([url, calls]))
            child.stdin.close()
        results = []
        for child in children:
            assert child.stdout is not None
            results.append(json.loads(child.stdout.read()))
            assert child.wait(DEADLINE) == 0
    # Each name was granted to exactly one process.
    for index in range(3):
        assert sum(1 for got in results if got[index]) == 1


# -- reads create nothing -------------------------------------------------------------------


def test_inspecting_a_store_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "there" / "locks.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    done = subprocess.run(
        [sys.executable, "-m", "corral", "status", "report", "--url", f"sqlite:///{missing}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0 and "not held" in done.stdout, done.stderr
    with corral.connect(f"sqlite:///{missing}") as store:
        assert store.lock_info("report") is None
        assert not store.lock("report").locked()
    assert not (tmp_path / "not").exists()
    # The first write creates the directory and the file.
    with corral.connect(f"sqlite:///{missing}") as store:
        assert store.lock("report", ttl=10).acquire()
    assert missing.exists()


def test_inspecting_a_file_without_tables_leaves_it_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE other (x)")
        conn.commit()
    with corral.connect(f"sqlite:///{path}", table_prefix="app_") as store:
        assert store.lock_info("report") is None
    assert query(path, "SELECT name FROM sqlite_master") == [("other",)]
    assert query(path, "PRAGMA journal_mode") == [("delete",)]


# -- semaphores -----------------------------------------------------------------------------

SEM_TABLES = ("corral_sem_slots", "corral_sem_queue", "corral_sem_waiters")


def count_rows(path: Path, table: str) -> int:
    return int(query(path, f"SELECT count(*) FROM {table}")[0][0])


@pytest.mark.parametrize("odd", ODD_NAMES, ids=lambda n: repr(n)[:16])
@pytest.mark.parametrize("how", ["sem_release", "sem_force_release"])
def test_a_slot_freed_in_another_process_wakes_the_semaphore_waiter(
    store: corral.Store, url: str, odd: str, how: str
) -> None:
    backend = store.backend
    name = f"{fresh()}-{odd}"
    assert backend.sem_try_acquire(name, "holder", 60, 1).acquired
    with backend.sem_waiter(name) as waiter:
        assert not backend.sem_try_acquire(name, "waiter", 60, 1).acquired
        args = [name, "holder"] if how == "sem_release" else [name]
        assert in_other_process(url, (how, args)) == ["ok" if how == "sem_release" else 1]
        # Only a datagram can wake it: the slot was not freed in this process.
        assert waiter.wait(DEADLINE)
    assert backend.sem_try_acquire(name, "waiter", 60, 1).acquired


def test_a_lock_and_a_semaphore_of_one_name_wake_only_their_own_waiters(
    store: corral.Store, url: str
) -> None:
    backend = store.backend
    name = fresh()
    assert backend.try_acquire(name, "holder", 60).acquired
    assert backend.sem_try_acquire(name, "holder", 60, 1).acquired
    with backend.waiter(name) as lock_waiter, backend.sem_waiter(name) as sem_waiter:
        # Both registered, each in its own table.
        assert not backend.try_acquire(name, "waiter", 60).acquired
        assert not backend.sem_try_acquire(name, "waiter", 60, 1).acquired
        assert in_other_process(url, ("sem_release", [name, "holder"])) == ["ok"]
        assert sem_waiter.wait(DEADLINE)
        assert not lock_waiter.wait(0.3)
        assert in_other_process(url, ("release", [name, "holder"])) == ["ok"]
        assert lock_waiter.wait(DEADLINE)
        assert not sem_waiter.wait(0.3)


async def test_the_asyncio_semaphore_waiter_is_woken_by_another_process(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No timer of the waiter fires within its wait (re-check, starvation guard, queue
    # refresh; the holders' TTL is longer): only the datagram can wake it in time.
    monkeypatch.setattr(lockflow, "NOTIFIED_RECHECK", 120.0)
    monkeypatch.setattr(async_lock, "STARVE_AFTER", 120.0)
    monkeypatch.setattr(async_lock, "FAIR_QUEUE_TTL", 360.0)
    async with corral.aio.connect(url) as store:
        name = fresh()
        holder = store.semaphore(name, 2, ttl=60)
        other = store.semaphore(name, 2, ttl=60)
        assert await holder.acquire() and await other.acquire()
        assert holder.owner is not None
        waiter = store.semaphore(name, 2, ttl=60)
        # Its wait outlasts the test's bound: its last attempt at the wait's end cannot
        # pass the test, only a wake-up can.
        job = asyncio.ensure_future(waiter.acquire(wait=4 * DEADLINE))
        await asyncio.sleep(0.3)
        assert not job.done()
        await asyncio.to_thread(in_other_process, url, ("sem_release", [name, holder.owner]))
        assert await asyncio.wait_for(job, DEADLINE)
        await waiter.release()
        await other.release()


# Each child takes the semaphore of 3 `rounds` times and counts who is inside in a file
# under flock(2), so the count is exact across processes.
CONTENDER = """
import asyncio, fcntl, json, sys, time
import corral, corral.aio
url, name, counter, rounds, flavour = json.loads(sys.argv[1])

def enter(delta):
    with open(counter, "r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        inside = int(file.read() or 0) + delta
        file.seek(0)
        file.truncate()
        file.write(str(inside))
        return inside

most, tokens = 0, []
if flavour == "sync":
    with corral.connect(url) as store:
        slot = store.semaphore(name, 3, ttl=30, wait=60)
        for _ in range(rounds):
            with slot as held:
                most = max(most, enter(+1))
                tokens.append(held.token)
                time.sleep(0.01)
                enter(-1)
else:
    async def main():
        global most
        async with corral.aio.connect(url) as store:
            slot = store.semaphore(name, 3, ttl=30, wait=60)
            for _ in range(rounds):
                async with slot as held:
                    most = max(most, enter(+1))
                    tokens.append(held.token)
                    await asyncio.sleep(0.01)
                    enter(-1)
    asyncio.run(main())
print(json.dumps([most, tokens]))
"""


def test_processes_contending_never_exceed_the_limit(
    store: corral.Store, url: str, tmp_path: Path
) -> None:
    name = fresh()
    counter = tmp_path / "inside"
    counter.write_text("0")
    rounds = 12
    with contextlib.ExitStack() as stack:
        children = [
            stack.enter_context(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        CONTENDER,
                        json.dumps([url, name, str(counter), rounds, flavour]),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            for flavour in ["sync", "async"] * 3
        ]
        results = []
        for child in children:
            out, _ = child.communicate(timeout=120)
            assert child.returncode == 0
            results.append(json.loads(out))
    most = max(got[0] for got in results)
    tokens = [token for got in results for token in got[1]]
    assert 1 <= most <= 3
    assert len(tokens) == len(set(tokens)) == 6 * rounds
    assert counter.read_text() == "0"
    assert store.semaphore_info(name) is None


def test_concurrent_attempts_from_two_stores_never_exceed_the_limit(
    store: corral.Store, url: str
) -> None:
    """Many attempts at once on one file through two stores never grant a fourth slot."""
    backend = store.backend
    name = fresh()
    with corral.connect(url) as other:
        granted: list[str] = []
        mutex = threading.Lock()

        def attempt(index: int) -> None:
            via = (backend if index % 2 else other.backend).sem_try_acquire
            if via(name, f"owner-{index}", 60, 3).acquired:
                with mutex:
                    granted.append(f"owner-{index}")

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
    assert len(granted) == 3
    info = store.semaphore_info(name)
    assert info is not None and {h.owner for h in info.holders} == set(granted)


async def test_a_cancelled_attempt_takes_no_slot(url: str, db_path: Path) -> None:
    """Cancelled before, during or after its transaction, an attempt leaves no slot held
    and no place in the queue (a slot is free, so most attempts are granted at once)."""
    async with corral.aio.connect(url) as store:
        name = fresh()
        kept = store.semaphore(name, 2, ttl=60)
        assert await kept.acquire()
        for index in range(30):
            slot = store.semaphore(name, 2, ttl=60, fair=index % 2 == 0)
            job = asyncio.ensure_future(slot.acquire(wait=5))
            await asyncio.sleep(index * 0.0005)
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                if await job:
                    await slot.release()  # it finished before the cancel landed
            # A slot granted as the cancel landed is taken back once the attempt is over.
            deadline = time.monotonic() + DEADLINE
            while True:
                info = await store.semaphore_info(name)
                assert info is not None
                if [h.owner for h in info.holders] == [kept.owner]:
                    break
                assert time.monotonic() < deadline, info
                await asyncio.sleep(0.01)
        await kept.release()
        # Nobody is left in the queue to keep the free slots from anyone.
        assert count_rows(db_path, "corral_sem_queue") == 0


def test_free_slots_go_to_the_queue_first_then_to_anyone(store: corral.Store) -> None:
    backend = store.backend
    name = fresh()
    for owner in ("a", "b", "c"):
        assert backend.sem_try_acquire(name, owner, 60, 3).acquired
    assert not backend.sem_try_acquire(name, "queued", 60, 3, queue_ttl=30).acquired
    backend.sem_release(name, "a")
    backend.sem_release(name, "b")
    # Two slots free, one live place: one slot is anyone's, the other the queue's.
    assert backend.sem_try_acquire(name, "x", 60, 3).acquired
    assert not backend.sem_try_acquire(name, "y", 60, 3).acquired
    assert backend.sem_try_acquire(name, "queued", 60, 3, queue_ttl=30).acquired
    info = store.semaphore_info(name)
    assert info is not None and [h.owner for h in info.holders] == ["c", "x", "queued"]


def test_a_queued_waiter_that_gives_up_wakes_those_behind(store: corral.Store, url: str) -> None:
    backend = store.backend
    name = fresh()
    assert backend.sem_try_acquire(name, "holder", 60, 1).acquired
    with backend.sem_waiter(name).for_owner("second") as second:
        first_call = ("sem_try_acquire", [name, "first", 60, 1], {"queue_ttl": 30})
        assert in_other_process(url, first_call) == [False]
        assert not backend.sem_try_acquire(name, "second", 60, 1, queue_ttl=30).acquired
        backend.sem_release(name, "holder")  # wakes this process's waiters (local bus)
        assert second.wait(DEADLINE)
        assert not backend.sem_try_acquire(name, "second", 60, 1, queue_ttl=30).acquired
        in_other_process(url, ("sem_leave_queue", [name, "first"]))
        assert second.wait(DEADLINE)
        assert backend.sem_try_acquire(name, "second", 60, 1, queue_ttl=30).acquired


def test_semaphore_state_per_name_is_bounded(store: corral.Store, db_path: Path) -> None:
    backend = store.backend
    db = backend._db
    names = [f"{fresh()}-{ODD_NAMES[index % len(ODD_NAMES)]}" for index in range(30)]
    # Granted slots and registrations collect what has expired (were this process
    # paused, rows of the names before): they come first, and every 0.2 s row after
    # them, by calls that collect nothing. The crashed holders take 60 s, so that each
    # "dies" attempt finds its semaphore full, then cut their TTL short and crash.
    for name in names:
        assert backend.sem_try_acquire(name, "holder", 60, 2).acquired
        assert backend.sem_try_acquire(name, "crashed", 60, 2).acquired
    db.register([fresh() for _ in range(30)], b"\0corral-dead-process", 0.2, semaphore=True)
    for index, name in enumerate(names):
        assert not backend.sem_try_acquire(name, "dies", 60, 1, queue_ttl=0.2).acquired
        assert not backend.sem_try_acquire(name, "dies", 60, 2, queue_ttl=0.2).acquired
        backend.sem_release(name, "holder", hold_for=0.2 if index % 2 else 0.0)
        assert backend.sem_extend(name, "crashed", 0.2) is Outcome.OK
    assert count_rows(db_path, "corral_sem_slots") == 45
    assert count_rows(db_path, "corral_sem_queue") == 30
    assert count_rows(db_path, "corral_sem_waiters") == 30
    time.sleep(0.5)
    # COLLECT=8 rows of each table per granted slot: 45 expired slots go in 6.
    for _ in range(6):
        name = fresh()
        assert backend.sem_try_acquire(name, "traffic", 60, 1).acquired
        assert backend.sem_release(name, "traffic") is Outcome.OK
    for table in SEM_TABLES:
        assert count_rows(db_path, table) == 0, table


def test_a_name_used_once_leaves_no_semaphore_row(store: corral.Store, db_path: Path) -> None:
    for _ in range(20):
        with store.semaphore(fresh(), 3, ttl=60):
            pass
    for table in SEM_TABLES:
        assert count_rows(db_path, table) == 0, table


def test_semaphore_tokens_continue_the_lock_counter(store: corral.Store) -> None:
    lock = store.lock(fresh(), ttl=60)
    slot = store.semaphore(fresh(), 2, ttl=60)
    assert lock.acquire() and slot.acquire()
    assert lock.token is not None and slot.token is not None and slot.token > lock.token
    again = store.lock(fresh(), ttl=60)
    assert again.acquire() and again.token is not None and again.token > slot.token
    for held in (lock, slot, again):
        held.release()


def test_slots_of_an_earlier_boot_are_deleted_by_the_first_acquisition(db_path: Path) -> None:
    before = SQLiteBackend(str(db_path), machine_clock=OtherBoot())
    names = [fresh() for _ in range(10)]
    for name in names:
        assert before.sem_try_acquire(name, "holder", 3600, 1).acquired
        assert not before.sem_try_acquire(name, "waiter", 600, 1, queue_ttl=600).acquired
    before._db.register(names, b"\0corral-earlier", 600, semaphore=True)
    before.close()
    with corral.connect(f"sqlite:///{db_path}") as store:
        # Held "3600 s" with limit 1 in an earlier boot: no slot now, so a new limit holds.
        assert store.semaphore_info(names[0]) is None
        slot = store.semaphore(names[0], 5, ttl=60)
        assert slot.acquire()
        assert query(db_path, "SELECT owner FROM corral_sem_slots") == [(slot.owner,)]
        assert count_rows(db_path, "corral_sem_queue") == 0
        assert count_rows(db_path, "corral_sem_waiters") == 0
        slot.release()


def test_a_file_of_the_previous_layout_gains_the_semaphore_tables(db_path: Path) -> None:
    url = f"sqlite:///{db_path}"
    with corral.connect(url) as store:
        lock = store.lock("report", ttl=60)
        assert lock.acquire()
    # The layout before semaphores: the same file without their tables.
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        for table in SEM_TABLES:
            conn.execute(f"DROP TABLE {table}")
        conn.commit()
    schema = query(db_path, "SELECT name FROM sqlite_master ORDER BY name")
    # `corral status` and semaphore_info read without creating anything.
    with corral.connect(url) as store:
        assert store.semaphore_info("report") is None
        assert not store.semaphore("report", 2).locked()
    assert query(db_path, "SELECT name FROM sqlite_master ORDER BY name") == schema
    # The first write creates them; the lock and the counter are as they were.
    with corral.connect(url) as store:
        slot = store.semaphore("report", 2, ttl=60)
        assert slot.acquire()
        assert slot.token is not None and lock.token is not None and slot.token > lock.token
        assert store.lock_info("report") is not None
        slot.release()
    names = {row[0] for row in query(db_path, "SELECT name FROM sqlite_master")}
    assert set(SEM_TABLES) <= names


def test_inspecting_semaphores_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "there" / "locks.db"
    with corral.connect(f"sqlite:///{missing}") as store:
        assert store.semaphore_info("report") is None
        assert not store.semaphore("report", 2).locked()
    assert not (tmp_path / "not").exists()
    path = tmp_path / "empty.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE other (x)")
        conn.commit()
    with corral.connect(f"sqlite:///{path}") as store:
        assert store.semaphore_info("report") is None
    assert query(path, "SELECT name FROM sqlite_master") == [("other",)]


# -- cache entries ----------------------------------------------------------------------------

CACHE_TABLES = ("corral_cache", "corral_cache_gens")


def cache_entry(key: str, value: object = 1, *, fresh_for: float = 30.0) -> bytes:
    return encode(value, JSON, key, fresh_until=time.time() + fresh_for, delta=0.01, generation=0)


def due_claim(name: str, owner: str = "reader") -> Claim:
    return Claim(lock=f"recompute-{name}", owner=owner, ttl=30.0, due_before=time.time())


@contextlib.contextmanager
def statements(backend: Any) -> Iterator[list[str]]:
    """Every statement the backend's connection runs meanwhile (PRAGMAs left out)."""
    backend.cache_delete("open-the-connection")  # a write: creates the file, leaves nothing
    conn = backend._db._connection._conn
    assert conn is not None
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)
        seen[:] = [s for s in seen if not s.startswith("PRAGMA")]


@contextlib.contextmanager
def write_lock_held(path: Path) -> Iterator[None]:
    """Another connection holds the file's write lock (BEGIN IMMEDIATE) meanwhile."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")


def test_reads_never_take_the_write_lock(url: str, db_path: Path) -> None:
    # The reads go through a store that would wait 10 s for the write lock, so a read
    # that waited for it stands out from one this process was paused in; the writes
    # through one that gives up after 0.5 s.
    with (
        corral.connect(f"{url}?timeout=10") as patient,
        corral.connect(f"{url}?timeout=0.5") as store,
    ):
        backend, reader = store.backend, patient.backend
        key, name = f"ns:{fresh()}", fresh()
        data = cache_entry(key)
        backend.cache_store([(key, data, 60)])
        assert reader.cache_fetch([key], "g") == ([data], 0)  # its connection is open
        with write_lock_held(db_path):
            # Another process writes: every read goes on, none waits for it.
            started = time.monotonic()
            assert reader.cache_fetch([key, key + "-missing"], "g") == ([data, None], 0)
            read = reader.cache_read(key, "g", due_claim(name, "x"))
            assert read.entry == data and read.attempt is None  # fresh: nothing to claim
            assert reader.cache_count("ns:") == 1
            assert time.monotonic() - started < 5  # half the wait for the write lock
            # A write, or a read that must claim, gives up after the timeout, named.
            for call in (
                lambda: backend.cache_store([(key, data, 60)]),
                lambda: backend.cache_read(key + "-missing", "g", due_claim(name)),
            ):
                started = time.monotonic()
                with pytest.raises(corral.BackendUnavailable) as caught:
                    call()
                assert time.monotonic() - started < 0.5 * 2 + 3  # room for a paused test
                assert str(db_path) in str(caught.value) and "cache key 'ns:" in str(caught.value)


def test_only_a_due_read_opens_a_write_transaction(store: corral.Store) -> None:
    backend = store.backend
    key, name = f"ns:{fresh()}", fresh()
    backend.cache_store([(key, cache_entry(key), 60)])
    with statements(backend) as fresh_read:
        assert backend.cache_read(key, "g", due_claim(name)).attempt is None
    assert len(fresh_read) == 1 and fresh_read[0].startswith("SELECT")
    with statements(backend) as due_read:
        read = backend.cache_read(key + "-missing", "g", due_claim(name))
    assert read.attempt is not None and read.attempt.acquired
    # The claim is tried in the one write transaction that looked at the entry again.
    begins = [i for i, s in enumerate(due_read) if s.startswith("BEGIN")]
    assert [due_read[i] for i in begins] == ["BEGIN IMMEDIATE"]
    assert due_read[-1] == "COMMIT" and due_read.count("COMMIT") == 1
    assert "corral_cache" in due_read[begins[0] + 1]
    assert any("INTO corral_locks" in statement for statement in due_read[begins[0] :])


def test_an_entry_stored_between_the_read_and_the_claim_is_not_claimed(
    store: corral.Store, db_path: Path
) -> None:
    """The claim's transaction reads the entry again: a recompute stored meanwhile by
    another process makes it not due any more, and no lock is taken."""
    backend = store.backend
    key, name = f"ns:{fresh()}", fresh()
    data = cache_entry(key)
    other = SQLiteBackend(str(db_path))
    stored: list[bool] = []

    def store_just_before_the_write_lock(statement: str) -> None:
        if statement == "BEGIN IMMEDIATE" and not stored:
            other.cache_store([(key, data, 60)])
            stored.append(True)

    try:
        with statements(backend):
            conn = backend._db._connection._conn
            assert conn is not None
            conn.set_trace_callback(store_just_before_the_write_lock)
            read = backend.cache_read(key, "g", due_claim(name))
    finally:
        other.close()
    assert stored
    assert read.entry == data and read.attempt is None
    assert store.lock_info(f"recompute-{name}") is None


@pytest.mark.parametrize("odd", ODD_NAMES, ids=lambda n: repr(n)[:16])
def test_cache_keys_live_apart_from_locks_semaphores_and_generations(
    store: corral.Store, db_path: Path, odd: str
) -> None:
    backend = store.backend
    name = f"{fresh()}-{odd}"
    data = cache_entry(name)
    assert backend.try_acquire(name, "holder", 60).acquired
    assert backend.sem_try_acquire(name, "holder", 60, 1).acquired
    backend.cache_store([(name, data, 60)])
    assert backend.cache_clear(name) == 1  # the generation of a namespace named alike
    assert backend.cache_fetch([name], name) == ([data], 1)
    assert backend.cache_delete(name)
    assert backend.cache_fetch([name], name) == ([None], 1)
    assert backend.inspect(name) is not None and backend.sem_inspect(name) is not None
    key = stored_name(name)
    backend.cache_store([(name, data, 60)])
    # Stored as lock names are: TEXT when plain text, else the BLOB of its UTF-8 bytes.
    kind = "text" if isinstance(key, str) else "blob"
    assert query(db_path, "SELECT typeof(key) FROM corral_cache WHERE key = ?", (key,)) == [(kind,)]
    assert query(db_path, "SELECT typeof(key) FROM corral_cache_gens WHERE key = ?", (key,)) == [
        (kind,)
    ]


def test_a_table_prefix_keeps_caches_apart(url: str) -> None:
    with (
        corral.connect(url, table_prefix="a_") as first,
        corral.connect(url, table_prefix="b_") as second,
    ):
        data = cache_entry("k")
        first.backend.cache_store([("k", data, 60)])
        assert first.backend.cache_clear("g") == 1
        assert second.backend.cache_fetch(["k"], "g") == ([None], 0)
        assert second.backend.cache_count("") == 0
        assert first.backend.cache_fetch(["k"], "g") == ([data], 1)


def test_keep_is_kept_to_the_fraction_by_the_machine_clock(
    store: corral.Store, db_path: Path
) -> None:
    backend = store.backend
    clock = MachineClock()
    short, long = f"ns:{fresh()}", f"ns:{fresh()}"
    before = clock.now()
    # `long` must still be there for the invalidate below, however long a pause.
    backend.cache_store([(short, cache_entry(short), 0.4), (long, cache_entry(long), 30.5)])
    after = clock.now()
    rows = dict(query(db_path, "SELECT key, expires_at FROM corral_cache"))
    # Nothing rounds to whole seconds: SQLite keeps the reading as a float.
    assert before + 0.4 <= rows[short] <= after + 0.4
    assert before + 30.5 <= rows[long] <= after + 30.5
    time.sleep(0.6)
    found, _ = backend.cache_fetch([short, long], "g")
    assert found[0] is None and found[1] is not None
    assert backend.cache_invalidate(long, 0.3)
    (expires_at,) = query(db_path, "SELECT expires_at FROM corral_cache")[0]
    assert expires_at <= clock.now() + 0.3
    time.sleep(0.5)
    assert backend.cache_fetch([long], "g") == ([None], 0)


def test_expired_entries_are_collected_by_later_writes(store: corral.Store, db_path: Path) -> None:
    backend = store.backend
    live = [f"live-{i:02d}" for i in range(10)]
    expiring = [f"{prefix}-{i:03d}" for i in range(50) for prefix in ("a", "\ud800")]
    backend.cache_store([(key, cache_entry(key), 60) for key in live])
    backend.cache_store([(key, cache_entry(key), 0.2) for key in expiring])
    time.sleep(0.5)
    # Reads see them gone at once, but leave the rows: they take no write lock.
    assert backend.cache_fetch(expiring, "g")[0] == [None] * len(expiring)
    assert backend.cache_count("") == len(live)
    assert count_rows(db_path, "corral_cache") == 110
    # Each write of one entry deletes up to 1 + COLLECT = 9 dead ones: 100 go in 12.
    traffic = [f"traffic-{i:02d}" for i in range(12)]
    for key in traffic:
        backend.cache_store([(key, cache_entry(key), 60)])
    left = {row[0] for row in query(db_path, "SELECT key FROM corral_cache")}
    assert left == set(live) | set(traffic)


def test_entries_of_an_earlier_boot_are_gone_and_collected(db_path: Path) -> None:
    before = SQLiteBackend(str(db_path), machine_clock=OtherBoot())
    keys = [f"old-{i:02d}" for i in range(20)]
    before.cache_store([(key, cache_entry(key), 600) for key in keys])
    assert before.cache_clear("g") == 1
    before.close()
    with corral.connect(f"sqlite:///{db_path}") as store:
        backend = store.backend
        # Kept "600 s" by a clock reading of an earlier boot: gone now. The generation
        # is no reading: it stays.
        assert backend.cache_fetch(keys, "g") == ([None] * 20, 1)
        assert backend.cache_count("old-") == 0
        new = [f"new-{i}" for i in range(3)]
        backend.cache_store([(key, cache_entry(key), 60) for key in new])
        backend.cache_store([(key, cache_entry(key), 60) for key in new])  # 2 x (3 + 8) >= 20
        assert {row[0] for row in query(db_path, "SELECT key FROM corral_cache")} == set(new)


def test_processes_with_and_without_the_boot_id_share_entries(
    db_path: Path, known_and_blind: tuple[SQLiteBackend, SQLiteBackend]
) -> None:
    for writer, reader in (known_and_blind, known_and_blind[::-1]):
        key, name = fresh(), fresh()
        data = cache_entry(key)
        writer.cache_store([(key, data, 60), (key + "-dies", data, 0.2)])
        assert reader.cache_fetch([key], "g") == ([data], 0)
        assert reader.cache_read(key, "g", due_claim(name)).attempt is None
        time.sleep(0.4)
        reader.cache_store([(fresh(), data, 60)])  # collects the expired one
        keys = {row[0] for row in query(db_path, "SELECT key FROM corral_cache")}
        assert key in keys and key + "-dies" not in keys


PREFIXES = ["", "ns1:", "ns1", "ns1:a", "ns1:nul\x00", "ns1:lone \ud800", "é", "z" * 10_000]


def test_count_counts_the_keys_that_start_with_the_prefix(store: corral.Store) -> None:
    backend = store.backend
    keys = [f"ns1:{odd}" for odd in ODD_NAMES] + [f"ns1:a{odd}" for odd in ODD_NAMES]
    keys += ["ns1", "ns10:x", "ns2:x", "é", "éa", "é\x00", "e", "z" * 10_000 + "!"]
    keys += [f"{prefix}-\udfff" for prefix in ("ns1:", "é")]
    backend.cache_store([(key, cache_entry(key), 60) for key in keys])
    backend.cache_store([("ns1:expired", cache_entry("ns1:expired"), 0.2)])
    time.sleep(0.4)
    for prefix in PREFIXES:
        wanted = sum(1 for key in keys if key.startswith(prefix))
        assert backend.cache_count(prefix) == wanted, prefix[:20]


def test_invalidate_rewrites_only_the_header_and_deletes_what_is_not_an_entry(
    store: corral.Store, db_path: Path
) -> None:
    backend = store.backend
    key = fresh()
    data = cache_entry(key) + bytes(range(256)) * 4 + b"\x00"
    backend.cache_store([(key, data, 60), ("foreign", b"c1 but not an entry", 60)])
    assert backend.cache_invalidate(key, 30)
    assert query(db_path, "SELECT data, typeof(data) FROM corral_cache WHERE key = ?", (key,)) == [
        (mark_stale(data), "blob")
    ]
    assert backend.cache_invalidate("foreign", 30)
    assert backend.cache_fetch(["foreign"], "g") == ([None], 0)
    assert count_rows(db_path, "corral_cache") == 1


def test_a_fetch_of_many_keys_reads_one_snapshot_in_order(store: corral.Store) -> None:
    backend = store.backend
    keys = [f"k-{i:04d}" for i in range(1200)]  # three statements of 500 keys
    backend.cache_store([(key, key.encode(), 60) for key in keys[::2]])
    asked = [*reversed(keys), keys[0], keys[1]]
    with statements(backend) as seen:
        found, generation = backend.cache_fetch(asked, "g")
    assert found == [key.encode() if int(key[2:]) % 2 == 0 else None for key in asked]
    assert generation == 0
    assert seen[0] == "BEGIN" and seen[-1] == "COMMIT" and len(seen) == 5  # no write lock


def test_reading_entries_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "there" / "locks.db"
    with corral.connect(f"sqlite:///{missing}") as store:
        assert store.backend.cache_fetch(["k"], "g") == ([None], 0)
        assert store.backend.cache_count("") == 0
        read = store.backend.cache_read("k", "g")
        assert read.entry is None and read.attempt is None
    assert not (tmp_path / "not").exists()


def test_a_file_of_the_previous_layout_gains_the_cache_tables(db_path: Path) -> None:
    url = f"sqlite:///{db_path}"
    with corral.connect(url) as store:
        lock = store.lock("report", ttl=60)
        assert lock.acquire()
    # The layout before caches: the same file without their tables.
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        for table in CACHE_TABLES:
            conn.execute(f"DROP TABLE {table}")
        conn.commit()
    schema = query(db_path, "SELECT name FROM sqlite_master ORDER BY name")
    with corral.connect(url) as store:
        assert store.backend.cache_fetch(["k"], "g") == ([None], 0)
        assert store.backend.cache_count("") == 0
    assert query(db_path, "SELECT name FROM sqlite_master ORDER BY name") == schema
    # The first write creates them; the lock is as it was.
    with corral.connect(url) as store:
        store.backend.cache_store([("k", b"v", 60)])
        assert store.backend.cache_fetch(["k"], "g") == ([b"v"], 0)
        info = store.lock_info("report")
        assert info is not None and info.token == lock.token
    names = {row[0] for row in query(db_path, "SELECT name FROM sqlite_master")}
    assert set(CACHE_TABLES) <= names


def test_a_file_that_cannot_be_created_is_named(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "locks.db"
    with corral.connect(f"sqlite:///{path}") as store:
        assert store.backend.cache_fetch(["k"], "g") == ([None], 0)  # nothing to read
        for call in (
            lambda: store.backend.cache_store([("k", b"v", 60)]),
            lambda: store.backend.cache_clear("g"),
            lambda: store.backend.cache_invalidate("k", 10),
        ):
            with pytest.raises(corral.BackendUnavailable, match=str(tmp_path / "a-file")):
                call()


async def test_the_asyncio_backend_reads_and_claims_in_one_call(url: str) -> None:
    async with corral.aio.connect(url) as store:
        backend = store.backend
        assert backend.claims_with_read
        key, name = fresh(), fresh()
        read = await backend.cache_read(key, "g", due_claim(name))
        assert read.attempt is not None and read.attempt.acquired
        again = await backend.cache_read(key, "g", due_claim(name, "other"))
        assert again.attempt is not None and not again.attempt.acquired
        assert again.attempt.holder_ttl is not None and 0 < again.attempt.holder_ttl <= 30
