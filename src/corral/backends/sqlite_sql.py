"""The SQLite lock store shared by both flavours: URL, clock, schema, statements, transactions.

Everything here blocks. The asyncio backend calls it through `run_sync` (a
worker thread) and the generated blocking backend calls it directly, so the
SQL and the transactions exist once. The connection (one per store and
process, fork-safe, reads that create nothing) is `sqlite_connection`'s; the
wake-up datagrams are `sqlite_wake`'s.

**Atomicity.** Every primitive that changes anything is one short transaction
opened with `BEGIN IMMEDIATE`, which takes the database's single write lock
before the first read. The check ("is there a live row?") and the write
("take it") therefore happen under one lock that every process on the machine
honours: check-and-set without a race, however many processes share the file.
WAL mode lets `inspect` read without waiting for writers, and with
`synchronous=NORMAL` a commit costs no fsync. The price: a power cut or kernel
crash (not a process crash) may lose the last commits. Every lock expires at
the reboot anyway (see the clock, below), but the last fencing tokens may then
be handed out a second time.

**Fencing tokens and bounded state.** Tokens come from one counter for the
whole store (the single row of the `sequence` table), incremented in the
transaction that grants a lock: every token is larger than every earlier one
of any name, so a name needs no row of its own once its lock is gone. A
release deletes the lock's row. Rows that expire instead (a crashed holder's,
`hold_for`'s) are found by a sweep: every granted acquisition looks at the
next `SWEEP` rows of the locks table in key order (where the last one
stopped, kept in the counter's row it writes anyway) and deletes the expired
ones, so the whole table is swept every (rows / SWEEP) acquisitions and
expired rows stay a fraction of the live ones. An index on expiry would find
them directly, but keeping it costs every acquire-and-release cycle a fifth
more; the queue and the wake-up registrations, which only waiters write,
have one: places of waiters that died and registrations of processes that
died are deleted `COLLECT` at a time by every granted acquisition and every
registration. Nothing accumulates, and no command has to purge the file.
After a reboot every row is of an earlier boot: the first acquisition
deletes them all (see "The clock" for rows whose boot is unknown).

**Names.** Any `str` is a name. A name that is valid UTF-8 without NUL is
stored as TEXT (readable with the sqlite3 shell); any other (a lone
surrogate, a NUL, on which SQLite's text functions are undefined) is stored
as the BLOB of its UTF-8 bytes with surrogates passed through. SQLite never
finds a TEXT equal to a BLOB, so the two kinds cannot collide.

**Every attempt respects a live fair queue.** An attempt that does not queue
(`queue_ttl` None) still finds the name's queue in the same read that checks
the holder (one index probe, empty in the common case); if the queue has
places, it drops the expired ones and yields to a live head that is someone
else. A waiter that died stalls the queue only until its place expires.

**Semaphores.** A semaphore's slots are rows of their own table
(`sem_slots`, one row per slot: owner, token, the limit it was taken with,
expiry), with a queue and wake-up registrations shaped as the lock's, so a
lock and a semaphore may share a name. Each primitive is one `BEGIN
IMMEDIATE` transaction, as for locks: an attempt counts the name's live
slots, refuses a disagreeing limit (the oldest live slot's is the
semaphore's), and inserts the slot with the next token of the store's one
counter, so tokens increase across slots, semaphores and locks alike. A
fair attempt (or one that waited long) keeps a place in the queue and takes
a slot only while fewer live places are ahead of it than slots are free;
an attempt without a place counts every live place as ahead. A release
deletes its row (`hold_for` keeps it, ownerless, until it expires); rows
that expire instead, dead waiters' places and dead processes' registrations
are found through an index on expiry and deleted `COLLECT` at a time by
every granted slot and every registration for semaphores. A file made by an
earlier version gains these tables with its next write; a read of one that
lacks them (`corral status`) answers "no slot taken" and creates nothing.

**Cache entries.** An entry is a row of the `cache` table: its key (stored
as a lock name is, see "Names"), its bytes, and the machine-clock reading
and boot after which it is gone, like a lock row's. A namespace's generation
is a row of `cache_gens`, which never expires. The two tables are apart from
the lock and semaphore ones, so a key never meets a lock name, nor a
namespace's generation a key. Reads are the hot path and take no write lock:
`cache_fetch` is one SELECT (one per 500 keys, in one read transaction)
that returns the generation and every live entry in one row, so processes
read in parallel, and while another process writes. `cache_read` with a
claim reads the same way; only when the entry is due for a recompute (the
rule of `envelope.claim_due`) does it open a `BEGIN IMMEDIATE` transaction,
read again there, and, if the entry is still due, try the lock with the
very statements of `try_acquire`: the read and the claim are one atomic
step, and the claim is a lock like any other (its token from the one
counter). `cache_store` writes all its items in one transaction (`keep` is
seconds by the machine clock, kept to the microsecond: nothing rounds);
`cache_invalidate` reads the header in its transaction, and, when it is a
corral header, writes `mark_stale`'s header over it, the rest of the bytes
as they were, else deletes the row; `cache_clear` adds one to the
generation's row in its transaction. Expired entries read as missing at
once, and every write of entries deletes up to (its entries + `COLLECT`)
dead ones through an index on (boot, expiry): this boot's expired ones and
any of an earlier boot (which no read sees any more), so a reboot empties
the cache over the next writes, never in one long transaction. Since every
row comes from such a write, dead rows never pile up; a file nobody writes
keeps what it has, and `clear` leaves the entries of older generations to
expire (they are misses for everyone meanwhile).

**Migration.** Stores made before the token counter kept one row per name in
a `fences` table. Opening one for writing starts the counter above every
token in `fences` and `locks` (so no token goes backwards), empties `fences`,
and leaves a trigger on it that makes any acquisition by an older version of
corral fail with a message saying to upgrade, rather than hand out tokens
from a table nobody reads any more. Its releases and extensions still work.
A new file gets the empty `fences` table and its trigger too: an older
corral finds every table it knows and creates none, so it can never start a
`fences` table of its own and count a name's tokens again from 1.

**The clock.** A TTL is enforced by "the server's clock", and here the server
is this machine, so every process must read the same clock, and it must not
jump when NTP steps the wall clock. On Linux that is `CLOCK_BOOTTIME`: shared
by every process, monotonic, and counting time spent suspended, so a lock
still expires across a laptop's sleep. Its readings restart near zero at each
boot, so each row also stores the kernel's boot id: a row written in an
earlier boot is expired, whatever its reading says (otherwise an old reading
would look hours in the future). Elsewhere `time.time()` stands in: shared by
all processes and comparable across boots, but it moves when the wall clock
is set.

**A boot id that cannot be read** (a sandbox that hides `/proc`) is unknown,
stored as '', and never judged to be another boot: only a row and a process
that both know their boot ids, and differ, make a row one of an earlier boot.
A row written by a process that cannot read the id is judged by its reading
alone, by everyone, and a process that cannot read it judges every row by
its reading alone and never deletes rows for their boot. Processes that can
and cannot read the id therefore never disagree about a row of this boot, so
never both hold a lock. What remains: a row that a process without the id
wrote in an earlier boot looks live to everyone until the clock passes its
reading, which after a reboot can take as long as the earlier boot lasted
(`corral release NAME --force` deletes it), and a process without the id
sees the earlier boot's other rows as live until a process with the id
acquires a lock and so deletes them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from corral.backends.sqlite_connection import Busy, Closed, Connection, is_busy
from corral.backends.sqlite_wake import Ringer, wake_up_payload
from corral.core.envelope import HEADER_SIZE, claim_due, mark_stale
from corral.core.options import Option, merge_options
from corral.core.primitives import Attempt, CacheRead, Claim, LockInfo, Outcome, SemaphoreInfo
from corral.core.validate import check_timeout
from corral.errors import BackendError, BackendUnavailable, ConfigError

__all__ = [
    "DEFAULT_TABLE_PREFIX",
    "DEFAULT_TIMEOUT",
    "URL_OPTIONS",
    "MachineClock",
    "SQLiteLocks",
    "SQLiteOptions",
    "parse_url",
    "stored_name",
]

log = logging.getLogger("corral.sqlite")

T = TypeVar("T")

DEFAULT_TIMEOUT = 5.0
DEFAULT_TABLE_PREFIX = "corral_"
_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
# Rows of the locks table one granted acquisition looks at for expired ones (see
# "bounded state"): the table is swept whole every (rows / SWEEP) acquisitions.
SWEEP = 32
# Expired queue places and registrations one granted acquisition or registration deletes:
# more than one can leave behind, so expired rows never pile up.
COLLECT = 8
# Keys one statement of a cache fetch reads (each is a column of its one result row).
FETCH_BATCH = 500

URL_OPTIONS = (
    Option(
        "timeout",
        "5",
        "seconds a call may wait for the file's write lock (another process is writing) "
        "before `BackendUnavailable`",
        "2",
    ),
    Option(
        "table_prefix",
        "corral_",
        "prefix of corral's table names, so independent sets of locks can share one file "
        "(letters, digits, underscores)",
        "app_",
    ),
)


# -- the URL ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SQLiteOptions:
    path: str
    """Absolute, so a later `chdir` cannot move the store."""
    timeout: float = DEFAULT_TIMEOUT
    table_prefix: str = DEFAULT_TABLE_PREFIX


def parse_url(url: str, options: Mapping[str, object]) -> SQLiteOptions:
    """`sqlite:///relative.db` or `sqlite:////absolute.db`, options from keywords or the query.

    Query options (`?timeout=10`) exist so `CORRAL_URL` and `--url` can carry them.
    Nothing here touches the filesystem beyond looking: a bad URL or option is a
    ConfigError before any file or directory is created.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "sqlite":
        raise ConfigError(f"{url}: not an sqlite:// URL")
    rest, _, query = rest.partition("?")
    if "memory:" in rest or "mode=memory" in query:
        raise ConfigError(
            f"{url}: an in-memory SQLite database is private to one connection, so no other "
            "process could see its locks; use memory:// for locks inside one process"
        )
    given, _ = merge_options(url, query, options, URL_OPTIONS, backend="sqlite")
    if rest in ("", "/"):
        raise ConfigError(
            f"{url}: the path of the database file is empty; "
            "write sqlite:///locks.db or sqlite:////var/lib/app/locks.db"
        )
    if not rest.startswith("/"):
        raise ConfigError(
            f"{url}: expected sqlite:///relative/path.db or sqlite:////absolute/path.db "
            "(three slashes, then the path; SQLite has no host)"
        )
    absolute = os.path.abspath(rest[1:])
    if os.path.isdir(absolute):
        raise ConfigError(f"{url}: {absolute} is a directory; name a file inside it")
    seconds = check_timeout(given.get("timeout", DEFAULT_TIMEOUT), url)
    prefix = given.get("table_prefix", DEFAULT_TABLE_PREFIX)
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ConfigError(
            f"{url}: table_prefix must be letters, digits and underscores (not starting "
            f"with a digit, at most 64), got {prefix!r}"
        )
    return SQLiteOptions(absolute, seconds, prefix)


def stored_name(name: str) -> str | bytes:
    """The key a lock name is stored under (see "Names" in the module docstring)."""
    if name.isascii():
        if "\x00" not in name:
            return name
    elif "\x00" not in name:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            pass
        else:
            return name
    return name.encode("utf-8", "surrogatepass")


# -- the clock --------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _boot_id() -> str:
    # Constant for the life of a process: nothing survives a reboot.
    try:
        with open(_BOOT_ID_FILE, encoding="ascii") as file:
            return file.read().strip()
    except (OSError, ValueError) as exc:
        # Unknown (""): see "A boot id that cannot be read" for why that is safe.
        log.warning(
            "cannot read %s (%s); after a reboot, locks this process took or sees may "
            "look held until the clock passes their old readings",
            _BOOT_ID_FILE,
            exc,
        )
        return ""


class MachineClock:
    """Seconds on a clock every process on this machine shares, and which boot they belong to.

    See the module docstring for why `CLOCK_BOOTTIME` and the boot id; `boot_id`
    is "" when it cannot be read.
    """

    def __init__(self) -> None:
        clock_id: int | None = getattr(time, "CLOCK_BOOTTIME", None)
        if clock_id is None:
            self._read: Callable[[], float] = time.time
            # Wall-clock readings compare across boots: every row is of one "boot".
            self.boot_id = "wall-clock"
        else:
            self._read = functools.partial(time.clock_gettime, clock_id)
            self.boot_id = _boot_id()

    def now(self) -> float:
        return self._read()


# -- the schema and the statements ------------------------------------------------


class _Statements:
    """The SQL, with the table prefix filled in (checked to be a plain identifier)."""

    def __init__(self, prefix: str, *, boot_known: bool) -> None:
        locks, queue, waiters = f"{prefix}locks", f"{prefix}queue", f"{prefix}waiters"
        sequence, fences = f"{prefix}sequence", f"{prefix}fences"
        # Semaphores have tables of their own: a lock and a semaphore may share a name.
        slots, sem_queue = f"{prefix}sem_slots", f"{prefix}sem_queue"
        sem_waiters = f"{prefix}sem_waiters"
        # Cache entries and namespace generations: keys apart from every lock name.
        cache, generations = f"{prefix}cache", f"{prefix}cache_gens"
        self.sequence = sequence
        self.fences_guard = f"{prefix}fences_retired"
        # `expires_at` is a MachineClock reading, meaningful only in the boot `boot`;
        # see "The clock" for rows and processes whose boot is unknown ('').
        if boot_known:
            live = "boot IN (:boot, '') AND expires_at > :now"
            dead = "(boot NOT IN (:boot, '') OR expires_at <= :now)"
            # Dead rows found through the (boot, expires_at) indexes, one equality per
            # boot (cheaper than an IN list, for which SQLite builds a table each time);
            # an earlier boot's rows are deleted all at once (`forget_earlier_boots`).
            boots: tuple[str, ...] = (":boot", "''")
        else:
            live, dead = "expires_at > :now", "expires_at <= :now"
            # No index narrows this down: a scan of the expiry indexes, only in the
            # processes that cannot read the boot id.
            boots = ()

        def expired(table: str) -> str:
            """Whether `table` (queue or waiters) has a row for `collect` to delete."""
            if not boots:
                return f"EXISTS (SELECT 1 FROM {table} WHERE {dead})"
            return " OR ".join(
                f"EXISTS (SELECT 1 FROM {table} WHERE boot = {boot} AND expires_at <= :now)"
                for boot in boots
            )

        # The dead rows `collect` deletes, once `expired` found some: not the hot path.
        collectable = f"boot IN ({', '.join(boots)}) AND expires_at <= :now" if boots else dead
        self.schema_objects = (
            locks,
            queue,
            f"{queue}_order",
            f"{queue}_expiry",
            waiters,
            f"{waiters}_expiry",
            sequence,
            fences,
            self.fences_guard,
            slots,
            f"{slots}_expiry",
            sem_queue,
            f"{sem_queue}_order",
            f"{sem_queue}_expiry",
            sem_waiters,
            f"{sem_waiters}_expiry",
            cache,
            f"{cache}_expiry",
            generations,
        )
        self.schema = (
            # `name` is declared TEXT, but a name that is not plain text is a BLOB
            # (see "Names"); a TEXT column stores a BLOB as it is.
            f"CREATE TABLE IF NOT EXISTS {locks} ("
            " name TEXT PRIMARY KEY,"
            " owner TEXT,"  # NULL while closed by release(hold_for=...)
            " token INTEGER NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL"
            ") WITHOUT ROWID",
            f"CREATE TABLE IF NOT EXISTS {queue} ("
            " name TEXT NOT NULL,"
            " owner TEXT NOT NULL,"
            " seq INTEGER NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL,"
            " PRIMARY KEY (name, owner)"
            ") WITHOUT ROWID",
            f"CREATE INDEX IF NOT EXISTS {queue}_order ON {queue} (name, seq)",
            f"CREATE INDEX IF NOT EXISTS {queue}_expiry ON {queue} (boot, expires_at)",
            # Which process (a socket address) wants to hear the releases of a name.
            f"CREATE TABLE IF NOT EXISTS {waiters} ("
            " name TEXT NOT NULL,"
            " address BLOB NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL,"
            " PRIMARY KEY (name, address)"
            ") WITHOUT ROWID",
            f"CREATE INDEX IF NOT EXISTS {waiters}_expiry ON {waiters} (boot, expires_at)",
            # The store's token counter; `boot` is the boot whose rows are the only ones
            # left with a known boot id (an earlier boot's are all deleted when it
            # changes; a process without a boot id leaves it as it is), and `sweep`
            # the name after which the next sweep of the locks table starts.
            f"CREATE TABLE IF NOT EXISTS {sequence} ("
            " id INTEGER PRIMARY KEY CHECK (id = 0),"
            " last INTEGER NOT NULL,"
            " boot TEXT NOT NULL,"
            " sweep NOT NULL"
            ")",
            f"INSERT OR IGNORE INTO {sequence} (id, last, boot, sweep)"
            f" SELECT 0, COALESCE(MAX(token), 0), '', '' FROM {locks}",
            # The per-name token table of older versions (see "Migration"): always
            # present, so an older corral never creates it, and always empty, guarded
            # so that an older corral's acquisition fails instead of drawing a token.
            f"CREATE TABLE IF NOT EXISTS {fences} ("
            " name TEXT PRIMARY KEY,"
            " token INTEGER NOT NULL"
            ") WITHOUT ROWID",
            f"CREATE TRIGGER IF NOT EXISTS {self.fences_guard} BEFORE INSERT ON {fences}"
            " BEGIN SELECT RAISE(ABORT, 'this corral database was upgraded by a newer"
            " version of corral, which counts fencing tokens elsewhere: upgrade corral"
            " in this program to acquire locks here'); END",
            # Tokens an older corral drew before the guard existed: the counter starts
            # above them. A no-op once `fences` is empty.
            f"UPDATE {sequence} SET last = MAX(last,"
            f" (SELECT COALESCE(MAX(token), 0) FROM {fences}))",
            f"DELETE FROM {fences}",
            # A semaphore's slots, one row each (see "Semaphores"); `slot_limit` is the
            # limit the holder took it with. Its queue and wake-up registrations are
            # shaped as the lock's.
            f"CREATE TABLE IF NOT EXISTS {slots} ("
            " name TEXT NOT NULL,"
            " token INTEGER NOT NULL,"
            " owner TEXT,"  # NULL while kept closed by release(hold_for=...)
            " slot_limit INTEGER NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL,"
            " PRIMARY KEY (name, token)"
            ") WITHOUT ROWID",
            f"CREATE INDEX IF NOT EXISTS {slots}_expiry ON {slots} (boot, expires_at)",
            f"CREATE TABLE IF NOT EXISTS {sem_queue} ("
            " name TEXT NOT NULL,"
            " owner TEXT NOT NULL,"
            " seq INTEGER NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL,"
            " PRIMARY KEY (name, owner)"
            ") WITHOUT ROWID",
            f"CREATE INDEX IF NOT EXISTS {sem_queue}_order ON {sem_queue} (name, seq)",
            f"CREATE INDEX IF NOT EXISTS {sem_queue}_expiry ON {sem_queue} (boot, expires_at)",
            f"CREATE TABLE IF NOT EXISTS {sem_waiters} ("
            " name TEXT NOT NULL,"
            " address BLOB NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL,"
            " PRIMARY KEY (name, address)"
            ") WITHOUT ROWID",
            f"CREATE INDEX IF NOT EXISTS {sem_waiters}_expiry ON {sem_waiters} (boot, expires_at)",
            # Cache entries (see "Cache entries"): a rowid table, since values are often
            # larger than SQLite keeps inline in a WITHOUT ROWID one. `key` is TEXT or
            # BLOB as lock names are; `expires_at` and `boot` as in every other table.
            f"CREATE TABLE IF NOT EXISTS {cache} ("
            " key TEXT NOT NULL PRIMARY KEY,"
            " data BLOB NOT NULL,"
            " expires_at REAL NOT NULL,"
            " boot TEXT NOT NULL"
            ")",
            f"CREATE INDEX IF NOT EXISTS {cache}_expiry ON {cache} (boot, expires_at)",
            # A namespace's generation, bumped by `clear`; never expires (0 when absent).
            f"CREATE TABLE IF NOT EXISTS {generations} ("
            " key TEXT NOT NULL PRIMARY KEY,"
            " generation INTEGER NOT NULL"
            ") WITHOUT ROWID",
        )

        self.live_lock = (
            f"SELECT owner, token, expires_at FROM {locks} WHERE name = :name AND {live}"
        )
        # One read decides the common case: the holder, whether the name has a queue,
        # the next token, whether rows of an earlier boot are still around, where the
        # sweep goes on, and whether a queue place or registration has expired (each
        # EXISTS is one probe of an index).
        self.probe = (
            f"SELECT (SELECT expires_at FROM {locks} WHERE name = :name AND {live}),"
            f" EXISTS (SELECT 1 FROM {queue} WHERE name = :name),"
            f" last, boot, sweep,"
            f" {expired(queue)} OR {expired(waiters)}"
            f" FROM {sequence} WHERE id = 0"
        )
        self.next_token = (
            f"UPDATE {sequence} SET last = :token, boot = :file_boot, sweep = :sweep WHERE id = 0"
        )
        # The next SWEEP rows of the locks table in key order: how many, the last, how
        # many expired. They come after the cursor `:sweep`, or from the very first
        # name, '' included, when the cursor is '' (TEXT names sort before BLOB ones,
        # and '' first of all).
        after = "name >= :sweep AND (name > :sweep OR :sweep = '')"
        swept = f"SELECT name FROM {locks} WHERE {after} ORDER BY name LIMIT {SWEEP}"
        self.sweep = (
            f"SELECT count(*), max(name), COALESCE(sum({dead}), 0)"
            f" FROM (SELECT name, boot, expires_at FROM {locks} WHERE {after}"
            f" ORDER BY name LIMIT {SWEEP})"
        )
        self.sweep_expired = f"DELETE FROM {locks} WHERE name IN ({swept}) AND {dead}"
        self.set_lock = (
            f"INSERT OR REPLACE INTO {locks} (name, owner, token, expires_at, boot)"
            " VALUES (:name, :owner, :token, :expires_at, :boot)"
        )
        self.delete_mine = f"DELETE FROM {locks} WHERE name = :name AND owner = :owner AND {live}"
        self.close_mine = (
            f"UPDATE {locks} SET owner = NULL, expires_at = :expires_at"
            f" WHERE name = :name AND owner = :owner AND {live}"
        )
        self.extend_mine = (
            f"UPDATE {locks} SET expires_at = :expires_at"
            f" WHERE name = :name AND owner = :owner AND {live}"
        )
        self.delete_live = f"DELETE FROM {locks} WHERE name = :name AND {live}"
        self.purge_queue = f"DELETE FROM {queue} WHERE name = :name AND {dead}"
        self.refresh_place = (
            f"UPDATE {queue} SET expires_at = :expires_at WHERE name = :name AND owner = :owner"
        )
        # A newcomer queues behind everyone present; a refresh (above) keeps its place.
        self.join_queue = (
            f"INSERT INTO {queue} (name, owner, seq, expires_at, boot)"
            " SELECT :name, :owner, COALESCE(MAX(seq), 0) + 1, :expires_at, :boot"
            f" FROM {queue} WHERE name = :name"
        )
        self.queue_head = (
            f"SELECT owner FROM {queue} WHERE name = :name AND {live} ORDER BY seq LIMIT 1"
        )
        self.leave_queue = f"DELETE FROM {queue} WHERE name = :name AND owner = :owner"
        self.listeners = f"SELECT address FROM {waiters} WHERE name = :name AND {live}"
        self.register = (
            f"INSERT OR REPLACE INTO {waiters} (name, address, expires_at, boot)"
            " VALUES (:name, :address, :expires_at, :boot)"
        )
        self.forget_listener = f"DELETE FROM {waiters} WHERE name = :name AND address = :address"
        self.collect = tuple(
            f"DELETE FROM {table} WHERE ({key}) IN"
            f" (SELECT {key} FROM {table} WHERE {collectable} LIMIT {COLLECT})"
            for table, key in (
                (queue, "name, owner"),
                (waiters, "name, address"),
            )
        )
        # Only a process that knows this boot may judge another boot's rows dead.
        self.forget_earlier_boots = tuple(
            f"DELETE FROM {table} WHERE boot NOT IN (:boot, '')"
            for table in (locks, queue, waiters, slots, sem_queue, sem_waiters)
            if boot_known
        )

        # -- semaphores (see "Semaphores") --
        mine = "name = :name AND owner = :owner"
        # One read decides an attempt: how many slots are live, the soonest to free, the
        # limit they were taken with (the oldest's; all agree), the counter, the file's
        # boot, and whether a slot, queue place or registration has expired anywhere.
        self.sem_probe = (
            f"SELECT s.taken, s.soonest, s.slot_limit, last, boot,"
            f" {expired(slots)} OR {expired(sem_queue)} OR {expired(sem_waiters)}"
            f" FROM {sequence},"
            f" (SELECT count(*) AS taken, min(expires_at) AS soonest,"
            f" (SELECT slot_limit FROM {slots} WHERE name = :name AND {live}"
            f" ORDER BY token LIMIT 1) AS slot_limit"
            f" FROM {slots} WHERE name = :name AND {live}) AS s"
            " WHERE id = 0"
        )
        # What is left of a name once a slot is gone: how many are live, and their limit.
        self.sem_standing = (
            f"SELECT count(*), min(slot_limit) FROM {slots} WHERE name = :name AND {live}"
        )
        self.sem_next_token = f"UPDATE {sequence} SET last = :token, boot = :file_boot WHERE id = 0"
        self.sem_take = (
            f"INSERT INTO {slots} (name, token, owner, slot_limit, expires_at, boot)"
            " VALUES (:name, :token, :owner, :limit, :expires_at, :boot)"
        )
        self.sem_delete_mine = f"DELETE FROM {slots} WHERE {mine} AND {live}"
        self.sem_close_mine = (
            f"UPDATE {slots} SET owner = NULL, expires_at = :expires_at WHERE {mine} AND {live}"
        )
        self.sem_extend_mine = (
            f"UPDATE {slots} SET expires_at = :expires_at WHERE {mine} AND {live}"
        )
        self.sem_holders = (
            f"SELECT owner, token, expires_at, slot_limit FROM {slots}"
            f" WHERE name = :name AND {live} ORDER BY token"
        )
        self.sem_delete_all = f"DELETE FROM {slots} WHERE name = :name"
        self.sem_purge_queue = f"DELETE FROM {sem_queue} WHERE name = :name AND {dead}"
        self.sem_refresh_place = f"UPDATE {sem_queue} SET expires_at = :expires_at WHERE {mine}"
        self.sem_join_queue = (
            f"INSERT INTO {sem_queue} (name, owner, seq, expires_at, boot)"
            " SELECT :name, :owner, COALESCE(MAX(seq), 0) + 1, :expires_at, :boot"
            f" FROM {sem_queue} WHERE name = :name"
        )
        self.sem_queued = f"SELECT EXISTS (SELECT 1 FROM {sem_queue} WHERE name = :name)"
        # Live places ahead of the owner's, or every live place when it has none.
        self.sem_ahead = (
            f"SELECT count(*) FROM {sem_queue} WHERE name = :name AND {live}"
            f" AND seq < COALESCE((SELECT seq FROM {sem_queue} WHERE {mine}), 1 << 62)"
        )
        self.sem_leave_queue = f"DELETE FROM {sem_queue} WHERE {mine}"
        self.sem_listeners = f"SELECT address FROM {sem_waiters} WHERE name = :name AND {live}"
        self.sem_register = (
            f"INSERT OR REPLACE INTO {sem_waiters} (name, address, expires_at, boot)"
            " VALUES (:name, :address, :expires_at, :boot)"
        )
        self.sem_forget_listener = (
            f"DELETE FROM {sem_waiters} WHERE name = :name AND address = :address"
        )
        self.sem_collect = tuple(
            f"DELETE FROM {table} WHERE ({key}) IN"
            f" (SELECT {key} FROM {table} WHERE {collectable} LIMIT {COLLECT})"
            for table, key in (
                (slots, "name, token"),
                (sem_queue, "name, owner"),
                (sem_waiters, "name, address"),
            )
        )

        # -- cache entries (see "Cache entries") --
        self.cache_table = cache
        self._cache_live = live
        self._generations = generations
        self._fetch_sql: dict[int, str] = {}
        self.cache_put = (
            f"INSERT OR REPLACE INTO {cache} (key, data, expires_at, boot)"
            " VALUES (:key, :data, :expires_at, :boot)"
        )
        self.cache_drop = f"DELETE FROM {cache} WHERE key = :key"
        self.cache_drop_live = f"DELETE FROM {cache} WHERE key = :key AND {live}"
        # The header alone, as bytes whatever a foreign writer stored.
        self.cache_header = (
            f"SELECT substr(CAST(data AS BLOB), 1, {HEADER_SIZE}) FROM {cache}"
            f" WHERE key = :key AND {live}"
        )
        # A new header (`mark_stale`'s, of the one just read), the rest of the bytes as
        # they were. `||` makes TEXT of its BLOBs, byte for byte; the CAST undoes that.
        self.cache_restale = (
            f"UPDATE {cache} SET"
            f" data = CAST(:header || substr(CAST(data AS BLOB), {HEADER_SIZE + 1}) AS BLOB),"
            " expires_at = :expires_at WHERE key = :key"
        )
        self.generation_start = (
            f"INSERT OR IGNORE INTO {generations} (key, generation) VALUES (:key, 0)"
        )
        self.generation_bump = (
            f"UPDATE {generations} SET generation = generation + 1 WHERE key = :key"
        )
        self.generation_read = f"SELECT generation FROM {generations} WHERE key = :key"
        self.cache_count_all = f"SELECT count(*) FROM {cache} WHERE {live}"
        # Keys that start with a prefix are a range of the key index: of the TEXT keys
        # (when the prefix is text) and of the BLOB keys (see `key_ranges`). The unary
        # `+` keeps SQLite from scanning every live entry by the expiry index instead.
        live_by_key = live.replace("boot IN", "+boot IN").replace("expires_at", "+expires_at")
        self.cache_count_range = (
            f"SELECT (SELECT count(*) FROM {cache} WHERE key >= :text"
            f" AND key < CAST(:text_end AS TEXT) AND {live_by_key}),"
            f" (SELECT count(*) FROM {cache} WHERE key >= :blob AND key < :blob_end"
            f" AND {live_by_key})"
        )
        # Up to :limit dead entries, each range one probe of the expiry index: this
        # boot's expired ones, those of processes without a boot id, every entry of
        # another boot.
        if boot_known:
            ranges: tuple[str, ...] = (
                "boot = :boot AND expires_at <= :now",
                "boot = '' AND expires_at <= :now",
                "boot > '' AND boot < :boot",
                "boot > :boot",
            )
        else:
            ranges = ("expires_at <= :now",)
        dead_entries = " UNION ALL ".join(
            f"SELECT * FROM (SELECT rowid AS id FROM {cache} WHERE {where} LIMIT :limit)"
            for where in ranges
        )
        self.cache_collect = (
            f"DELETE FROM {cache} WHERE rowid IN (SELECT id FROM ({dead_entries}) LIMIT :limit)"
        )

    def cache_fetch(self, count: int) -> str:
        """One row: the generation of `:gen_key`, then the live bytes of `:k0`... (or NULL)."""
        statement = self._fetch_sql.get(count)
        if statement is None:
            entries = "".join(
                f", (SELECT CAST(data AS BLOB) FROM {self.cache_table}"
                f" WHERE key = :k{index} AND {self._cache_live})"
                for index in range(count)
            )
            statement = self._fetch_sql[count] = (
                f"SELECT COALESCE((SELECT generation FROM {self._generations}"
                f" WHERE key = :gen_key), 0){entries}"
            )
        return statement


def key_ranges(prefix: str) -> dict[str, object]:
    """The bounds of the stored keys that start with `prefix` (for `cache_count_range`).

    A key is stored as TEXT or as a BLOB of its UTF-8 bytes (see "Names"); either
    way the stored bytes of a key start with those of `prefix` exactly when the key
    starts with `prefix`, and SQLite orders both kinds by their bytes. So the keys
    are those from the prefix's bytes up to the same bytes with the last one
    incremented (UTF-8 never has a byte 0xFF to carry), among the TEXT keys (only
    when the prefix can itself be one) and among the BLOB keys.
    """
    raw = prefix.encode("utf-8", "surrogatepass")
    end = raw[:-1] + bytes([raw[-1] + 1])
    text = stored_name(prefix)
    as_text = isinstance(text, str)
    return {
        "text": text if as_text else None,
        "text_end": end if as_text else None,
        "blob": raw,
        "blob_end": end,
    }


# -- the primitives ---------------------------------------------------------------


class _NoCounter(Exception):
    """The token counter's row is missing: the file was edited by hand."""


@dataclass(frozen=True, slots=True)
class _WakeUps:
    """Who to wake once the transaction has committed."""

    name: str
    key: str | bytes
    addresses: list[bytes]
    head: str | None
    semaphore: bool = False


class SQLiteLocks:
    """The lock, semaphore and cache primitives on one SQLite file; blocking.

    Every primitive that writes is one transaction; the reads take none of the
    write lock.
    """

    def __init__(self, options: SQLiteOptions, clock: MachineClock | None = None) -> None:
        self.path = options.path
        self.timeout = options.timeout
        self.server = f"sqlite:///{self.path}"
        self.clock = clock or MachineClock()
        self._sql = _Statements(options.table_prefix, boot_known=bool(self.clock.boot_id))
        self._connection = Connection(self.path, self.timeout, self._prepare)
        self._ringer = Ringer()
        # Registrations whose socket was found gone, deleted by the next write. No lock
        # (one held by a parent thread at a fork would hang the child): an entry lost
        # to a race only leaves its registration to expire.
        self._gone: list[tuple[bool, str | bytes, bytes]] = []

    def _params(self, key: str | bytes, owner: str, now: float) -> dict[str, object]:
        return {"name": key, "owner": owner, "boot": self.clock.boot_id, "now": now}

    # -- the schema ---------------------------------------------------------------

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Create corral's tables, or migrate older ones, unless that is done already."""
        sql = self._sql
        if self._schema_current(conn):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in sql.schema:
                conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _schema_current(self, conn: sqlite3.Connection) -> bool:
        # A read, so an up-to-date file needs no write lock to start. With the guard
        # in place no older corral can have written to `fences` since.
        wanted = self._sql.schema_objects
        found = {
            row[0]
            for row in conn.execute(
                f"SELECT name FROM sqlite_master WHERE name IN ({', '.join('?' * len(wanted))})",
                wanted,
            )
        }
        return found.issuperset(wanted)

    # -- transactions and errors -------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, name: str, kind: str = "lock", more: int = 0) -> Iterator[None]:
        """SQLite's and the OS's errors as corral's, naming the lock, the file and a remedy.

        `more` says how many other names (cache keys) the call was about.
        """
        others = f" (and {more} more)" if more else ""
        where = f"{kind} {name!r}{others} on {self.server}"
        try:
            yield
        except Closed:
            raise BackendError(f"{where}: the store is closed; open a new one") from None
        except Busy:
            raise BackendUnavailable(
                f"{where}: this process's connection to the file stayed busy for more than "
                f"{self.timeout:g} s (another thread is waiting on the file's lock); "
                "retry, or pass a longer timeout="
            ) from None
        except _NoCounter:
            raise BackendError(
                f"{where}: the token counter (table {self._sql.sequence}) has no "
                "row; the file was changed by hand: restore it, or point the URL at a new file"
            ) from None
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise BackendUnavailable(
                    f"{where}: the database file {self.path} stayed locked for more than "
                    f"{self.timeout:g} s: another process is holding a write transaction on "
                    f"it (`fuser {self.path}` lists who has it open); retry, or pass a "
                    "longer timeout="
                ) from exc
            raise BackendUnavailable(
                f"{where}: cannot use the database file {self.path} ({exc}); check that it "
                "and its directory are writable by this user and that the disk is not full"
            ) from exc
        except OSError as exc:
            raise BackendUnavailable(
                f"{where}: cannot create {os.path.dirname(self.path)} ({exc}); "
                "choose a writable path in the URL"
            ) from exc
        except sqlite3.Error as exc:
            raise BackendError(
                f"{where}: {self.path} is not a usable corral database ({exc}); "
                "point the URL at another file, or move this one away"
            ) from exc

    def _write(
        self,
        name: str,
        body: Callable[[sqlite3.Connection, list[_WakeUps]], T],
        kind: str = "lock",
        more: int = 0,
    ) -> T:
        """Run `body` as one `BEGIN IMMEDIATE` transaction: the whole primitive is atomic.

        The wake-ups `body` asks for are sent after the COMMIT (a waiter woken
        earlier would find the lock still taken) and after the connection is
        handed back.
        """
        wake_ups: list[_WakeUps] = []
        with self._errors(name, kind, more), self._connection.lend(write=True) as conn:
            assert conn is not None
            conn.execute("BEGIN IMMEDIATE")
            self._forget_gone(conn)
            result = body(conn, wake_ups)
            conn.execute("COMMIT")
        for wake_up in wake_ups:
            self._ring(wake_up)
        return result

    def _wake_ups(
        self, conn: sqlite3.Connection, name: str, key: str | bytes, p: dict[str, object]
    ) -> _WakeUps | None:
        """Who waits for `name` (read in the releasing transaction), and whose turn it is."""
        addresses = [row[0] for row in conn.execute(self._sql.listeners, p)]
        if not addresses:
            return None
        head = conn.execute(self._sql.queue_head, p).fetchone()
        return _WakeUps(name, key, addresses, None if head is None else head[0])

    def _ring(self, wake_up: _WakeUps) -> None:
        payload = wake_up_payload(wake_up.name, wake_up.head, semaphore=wake_up.semaphore)
        gone = self._ringer.ring(wake_up.addresses, payload)
        if gone and len(self._gone) < 256:  # bounded; expiry cleans up the rest
            self._gone.extend([(wake_up.semaphore, wake_up.key, address) for address in gone])

    def _forget_gone(self, conn: sqlite3.Connection) -> None:
        if not self._gone:
            return
        gone, self._gone = self._gone, []
        for semaphore, statement in (
            (False, self._sql.forget_listener),
            (True, self._sql.sem_forget_listener),
        ):
            rows = [{"name": key, "address": addr} for sem, key, addr in gone if sem is semaphore]
            if rows:
                conn.executemany(statement, rows)

    def _collect(
        self, conn: sqlite3.Connection, p: dict[str, object], *, semaphore: bool = False
    ) -> None:
        for statement in self._sql.sem_collect if semaphore else self._sql.collect:
            conn.execute(statement, p)

    # -- the primitives -----------------------------------------------------------

    def try_acquire(self, name: str, owner: str, ttl: float, queue_ttl: float | None) -> Attempt:
        key = stored_name(name)

        def attempt(conn: sqlite3.Connection, _: list[_WakeUps]) -> Attempt:
            return self._attempt(conn, key, owner, ttl, queue_ttl)

        return self._write(name, attempt)

    def _attempt(
        self,
        conn: sqlite3.Connection,
        key: str | bytes,
        owner: str,
        ttl: float,
        queue_ttl: float | None,
    ) -> Attempt:
        """`try_acquire`'s body, in a write transaction the caller opened."""
        sql = self._sql
        now = self.clock.now()  # read under the write lock, as in every primitive
        p = self._params(key, owner, now)
        if queue_ttl is not None:
            conn.execute(sql.purge_queue, p)
            place = {**p, "expires_at": now + queue_ttl}
            if conn.execute(sql.refresh_place, place).rowcount == 0:
                conn.execute(sql.join_queue, place)
        row = conn.execute(sql.probe, p).fetchone()
        if row is None:
            raise _NoCounter
        expires_at, queued, last, boot, sweep, any_expired = row
        if expires_at is not None:
            return Attempt(False, holder_ttl=expires_at - now)
        if queued:
            if queue_ttl is None:
                conn.execute(sql.purge_queue, p)
            head = conn.execute(sql.queue_head, p).fetchone()
            first = None if head is None else head[0]
            # A fair attempt goes only from the head; any other yields to a live head.
            if first != owner and (queue_ttl is not None or first is not None):
                return Attempt(False)
            conn.execute(sql.leave_queue, p)
        token = last + 1
        if boot != self.clock.boot_id and self.clock.boot_id:
            for statement in sql.forget_earlier_boots:
                conn.execute(statement, p)
            boot = self.clock.boot_id
        swept = {**p, "sweep": sweep}
        seen, last_seen, expired = conn.execute(sql.sweep, swept).fetchone()
        if expired:
            conn.execute(sql.sweep_expired, swept)
        # A short batch means the end of the table: the next sweep starts over.
        swept["sweep"] = last_seen if seen == SWEEP else ""
        conn.execute(sql.next_token, {**swept, "token": token, "file_boot": boot})
        conn.execute(sql.set_lock, {**p, "token": token, "expires_at": now + ttl})
        if any_expired:
            self._collect(conn, p)
        return Attempt(True, token=token)

    def release(self, name: str, owner: str, hold_for: float) -> Outcome:
        sql = self._sql
        key = stored_name(name)

        def release(conn: sqlite3.Connection, wake_ups: list[_WakeUps]) -> Outcome:
            now = self.clock.now()
            p = self._params(key, owner, now)
            if hold_for > 0:
                changed = conn.execute(sql.close_mine, {**p, "expires_at": now + hold_for})
            else:
                changed = conn.execute(sql.delete_mine, p)
            if not changed.rowcount:
                return self._why_not(conn, p)
            if hold_for <= 0:
                self._add(wake_ups, self._wake_ups(conn, name, key, p))
            return Outcome.OK

        return self._write(name, release)

    @staticmethod
    def _add(wake_ups: list[_WakeUps], wake_up: _WakeUps | None) -> None:
        if wake_up is not None:
            wake_ups.append(wake_up)

    def extend(self, name: str, owner: str, ttl: float) -> Outcome:
        sql = self._sql
        key = stored_name(name)

        def extend(conn: sqlite3.Connection, _: list[_WakeUps]) -> Outcome:
            now = self.clock.now()
            p = self._params(key, owner, now)
            changed = conn.execute(sql.extend_mine, {**p, "expires_at": now + ttl})
            return Outcome.OK if changed.rowcount else self._why_not(conn, p)

        return self._write(name, extend)

    def _why_not(self, conn: sqlite3.Connection, params: dict[str, object]) -> Outcome:
        # Same transaction as the failed compare: the answer cannot have changed since.
        found = conn.execute(self._sql.live_lock, params).fetchone()
        return Outcome.EXPIRED if found is None else Outcome.LOST

    def inspect(self, name: str) -> LockInfo | None:
        # A plain read: WAL gives it a consistent snapshot without the write lock, and
        # it creates nothing (no file, no directory, no table).
        with self._errors(name), self._connection.lend(write=False) as conn:
            if conn is None:
                return None
            now = self.clock.now()
            try:
                row = conn.execute(
                    self._sql.live_lock, self._params(stored_name(name), "", now)
                ).fetchone()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return None  # nothing was ever acquired in this file with this prefix
                raise
        if row is None:
            return None
        owner, token, expires_at = row
        return LockInfo(name, owner, token, expires_at - now)

    def force_release(self, name: str) -> bool:
        key = stored_name(name)

        def force(conn: sqlite3.Connection, wake_ups: list[_WakeUps]) -> bool:
            p = self._params(key, "", self.clock.now())
            if conn.execute(self._sql.delete_live, p).rowcount == 0:
                return False
            self._add(wake_ups, self._wake_ups(conn, name, key, p))
            return True

        return self._write(name, force)

    def leave_queue(self, name: str, owner: str) -> bool:
        """Leave the queue; True when the caller was at its head (someone else may go now)."""
        sql = self._sql
        key = stored_name(name)

        def leave(conn: sqlite3.Connection, wake_ups: list[_WakeUps]) -> bool:
            p = self._params(key, owner, self.clock.now())
            head = conn.execute(sql.queue_head, p).fetchone()
            conn.execute(sql.leave_queue, p)
            was_head = head is not None and head[0] == owner
            if was_head:
                self._add(wake_ups, self._wake_ups(conn, name, key, p))
            return was_head

        return self._write(name, leave)

    # -- semaphores ---------------------------------------------------------------

    def sem_try_acquire(
        self, name: str, owner: str, ttl: float, limit: int, queue_ttl: float | None
    ) -> Attempt:
        sql = self._sql
        key = stored_name(name)

        def attempt(conn: sqlite3.Connection, _: list[_WakeUps]) -> Attempt:
            now = self.clock.now()
            p = self._params(key, owner, now)
            row = conn.execute(sql.sem_probe, p).fetchone()
            if row is None:
                raise _NoCounter
            taken, soonest, held_with, last, boot, any_expired = row
            if held_with is not None and held_with != limit:
                return Attempt(False, limit=held_with)
            if queue_ttl is not None:
                conn.execute(sql.sem_purge_queue, p)
                place = {**p, "expires_at": now + queue_ttl}
                if conn.execute(sql.sem_refresh_place, place).rowcount == 0:
                    conn.execute(sql.sem_join_queue, place)
            if taken >= limit:
                return Attempt(False, holder_ttl=soonest - now)
            if conn.execute(sql.sem_queued, p).fetchone()[0]:
                if queue_ttl is None:
                    conn.execute(sql.sem_purge_queue, p)
                # The free slots go to the live places first, in arrival order; an
                # attempt without a place comes after all of them.
                if conn.execute(sql.sem_ahead, p).fetchone()[0] >= limit - taken:
                    return Attempt(False)
                conn.execute(sql.sem_leave_queue, p)
            token = last + 1
            if boot != self.clock.boot_id and self.clock.boot_id:
                for statement in sql.forget_earlier_boots:
                    conn.execute(statement, p)
                boot = self.clock.boot_id
            conn.execute(sql.sem_next_token, {"token": token, "file_boot": boot})
            slot = {**p, "token": token, "limit": limit, "expires_at": now + ttl}
            conn.execute(sql.sem_take, slot)
            if any_expired:
                self._collect(conn, p, semaphore=True)
            return Attempt(True, token=token)

        return self._write(name, attempt, "semaphore")

    def sem_release(self, name: str, owner: str, hold_for: float) -> Outcome:
        sql = self._sql
        key = stored_name(name)

        def release(conn: sqlite3.Connection, wake_ups: list[_WakeUps]) -> Outcome:
            now = self.clock.now()
            p = self._params(key, owner, now)
            if hold_for > 0:
                changed = conn.execute(sql.sem_close_mine, {**p, "expires_at": now + hold_for})
            else:
                changed = conn.execute(sql.sem_delete_mine, p)
            if not changed.rowcount:
                return self._slot_gone(conn, p)
            if hold_for <= 0:
                self._add(wake_ups, self._sem_wake_ups(conn, name, key, p))
            return Outcome.OK

        return self._write(name, release, "semaphore")

    def sem_extend(self, name: str, owner: str, ttl: float) -> Outcome:
        key = stored_name(name)

        def extend(conn: sqlite3.Connection, _: list[_WakeUps]) -> Outcome:
            now = self.clock.now()
            p = self._params(key, owner, now)
            changed = conn.execute(self._sql.sem_extend_mine, {**p, "expires_at": now + ttl})
            return Outcome.OK if changed.rowcount else self._slot_gone(conn, p)

        return self._write(name, extend, "semaphore")

    def _slot_gone(self, conn: sqlite3.Connection, params: dict[str, object]) -> Outcome:
        # Same transaction as the failed compare: LOST when every slot is taken now.
        taken, limit = conn.execute(self._sql.sem_standing, params).fetchone()
        return Outcome.LOST if limit is not None and taken >= limit else Outcome.EXPIRED

    def _sem_wake_ups(
        self, conn: sqlite3.Connection, name: str, key: str | bytes, p: dict[str, object]
    ) -> _WakeUps | None:
        """Who waits for slots of `name`: all of them, since several may fit now."""
        addresses = [row[0] for row in conn.execute(self._sql.sem_listeners, p)]
        if not addresses:
            return None
        return _WakeUps(name, key, addresses, None, semaphore=True)

    def sem_inspect(self, name: str) -> SemaphoreInfo | None:
        # A plain read that creates nothing, as `inspect`.
        with self._errors(name, "semaphore"), self._connection.lend(write=False) as conn:
            if conn is None:
                return None
            now = self.clock.now()
            try:
                rows = conn.execute(
                    self._sql.sem_holders, self._params(stored_name(name), "", now)
                ).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return None  # no semaphore was ever taken in this file with this prefix
                raise
        if not rows:
            return None
        holders = tuple(
            LockInfo(name, owner, token, expires_at - now) for owner, token, expires_at, _ in rows
        )
        return SemaphoreInfo(name, rows[0][3], holders)

    def sem_force_release(self, name: str) -> int:
        key = stored_name(name)

        def force(conn: sqlite3.Connection, wake_ups: list[_WakeUps]) -> int:
            p = self._params(key, "", self.clock.now())
            taken = conn.execute(self._sql.sem_standing, p).fetchone()[0]
            conn.execute(self._sql.sem_delete_all, p)
            if taken:
                self._add(wake_ups, self._sem_wake_ups(conn, name, key, p))
            return int(taken)

        return self._write(name, force, "semaphore")

    def sem_leave_queue(self, name: str, owner: str) -> bool:
        """Leave the queue; True when a waiter behind the caller may take a slot now."""
        sql = self._sql
        key = stored_name(name)

        def leave(conn: sqlite3.Connection, wake_ups: list[_WakeUps]) -> bool:
            p = self._params(key, owner, self.clock.now())
            ahead = conn.execute(sql.sem_ahead, p).fetchone()[0]
            if conn.execute(sql.sem_leave_queue, p).rowcount == 0:
                return False
            taken, limit = conn.execute(sql.sem_standing, p).fetchone()
            # The caller was among those the free slots let in: the next one is now.
            let_in = limit is None or ahead < limit - taken
            if let_in:
                self._add(wake_ups, self._sem_wake_ups(conn, name, key, p))
            return let_in

        return self._write(name, leave, "semaphore")

    # -- cache entries ------------------------------------------------------------

    def cache_fetch(self, keys: Sequence[str], gen_key: str) -> tuple[list[bytes | None], int]:
        """The live bytes of each key and the namespace's generation: a plain read.

        No write lock (WAL readers never wait for writers), and nothing is
        created: a file or tables that do not exist yet hold no entries.
        """
        stored = [stored_name(key) for key in keys]
        first = keys[0] if keys else gen_key
        with self._errors(first, "cache key", max(0, len(keys) - 1)):
            try:
                with self._connection.lend(write=False) as conn:
                    if conn is None:
                        return [None] * len(keys), 0
                    return self._fetch(conn, stored, stored_name(gen_key), self.clock.now())
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return [None] * len(keys), 0  # no entry was ever stored here
                raise

    def _fetch(
        self,
        conn: sqlite3.Connection,
        keys: Sequence[str | bytes],
        gen_key: str | bytes,
        now: float,
    ) -> tuple[list[bytes | None], int]:
        """One statement per FETCH_BATCH keys; several in one read transaction."""
        p: dict[str, object] = {"gen_key": gen_key, "boot": self.clock.boot_id, "now": now}
        batches = [keys[i : i + FETCH_BATCH] for i in range(0, len(keys), FETCH_BATCH)] or [[]]
        several = len(batches) > 1 and not conn.in_transaction
        if several:
            conn.execute("BEGIN")  # deferred: a snapshot, not the write lock
        found: list[bytes | None] = []
        generation = 0
        for batch in batches:
            row = conn.execute(
                self._sql.cache_fetch(len(batch)),
                {**p, **{f"k{index}": key for index, key in enumerate(batch)}},
            ).fetchone()
            generation = int(row[0])
            found.extend(row[1:])
        if several:
            conn.execute("COMMIT")
        return found, generation

    def cache_read(self, key: str, gen_key: str, claim: Claim | None) -> CacheRead:
        """Read; only an entry due for a recompute takes the write lock, then reads again
        and tries the claim in that one transaction (see "Cache entries")."""
        (entry,), generation = self.cache_fetch([key], gen_key)
        if claim is None or not claim_due(entry, generation, claim.due_before):
            return CacheRead(entry, generation)
        stored, stored_gen, lock = stored_name(key), stored_name(gen_key), stored_name(claim.lock)

        def read_and_claim(conn: sqlite3.Connection, _: list[_WakeUps]) -> CacheRead:
            (entry,), generation = self._fetch(conn, [stored], stored_gen, self.clock.now())
            if not claim_due(entry, generation, claim.due_before):
                return CacheRead(entry, generation)  # written meanwhile: nothing to claim
            attempt = self._attempt(conn, lock, claim.owner, claim.ttl, None)
            return CacheRead(entry, generation, attempt)

        return self._write(key, read_and_claim, "cache key")

    def cache_store(self, items: Sequence[tuple[str, bytes, float]]) -> None:
        if not items:
            return
        sql = self._sql

        def store(conn: sqlite3.Connection, _: list[_WakeUps]) -> None:
            now = self.clock.now()
            boot = self.clock.boot_id
            # In the order given (a key may come twice), each run of writes or of
            # deletions as one executemany.
            for kept, run in itertools.groupby(items, key=lambda item: item[2] > 0):
                if kept:
                    rows = [
                        {
                            "key": stored_name(key),
                            "data": data,
                            "expires_at": now + keep,
                            "boot": boot,
                        }
                        for key, data, keep in run
                    ]
                    conn.executemany(sql.cache_put, rows)
                else:
                    conn.executemany(sql.cache_drop, [{"key": stored_name(k)} for k, _, _ in run])
            self._collect_entries(conn, now, len(items))

        self._write(items[0][0], store, "cache key", len(items) - 1)

    def _collect_entries(self, conn: sqlite3.Connection, now: float, written: int) -> None:
        """Delete dead entries: more than the write that calls this can leave behind."""
        limit = written + COLLECT
        conn.execute(
            self._sql.cache_collect, {"boot": self.clock.boot_id, "now": now, "limit": limit}
        )

    def cache_delete(self, key: str) -> bool:
        sql = self._sql
        stored = stored_name(key)

        def delete(conn: sqlite3.Connection, _: list[_WakeUps]) -> bool:
            now = self.clock.now()
            p = {"key": stored, "boot": self.clock.boot_id, "now": now}
            found = conn.execute(sql.cache_drop_live, p).rowcount > 0
            if not found:
                conn.execute(sql.cache_drop, p)  # a dead row, if any
            self._collect_entries(conn, now, 1)
            return found

        return self._write(key, delete, "cache key")

    def cache_invalidate(self, key: str, keep: float) -> bool:
        sql = self._sql
        stored = stored_name(key)

        def invalidate(conn: sqlite3.Connection, _: list[_WakeUps]) -> bool:
            now = self.clock.now()
            p = {"key": stored, "boot": self.clock.boot_id, "now": now}
            row = conn.execute(sql.cache_header, p).fetchone()
            if row is None:
                conn.execute(sql.cache_drop, p)  # a dead row, if any
                return False
            # Not ours (or keep <= 0): deleted, as `mark_stale` cannot say what is fresh.
            header = mark_stale(row[0]) if keep > 0 else None
            if header is None:
                conn.execute(sql.cache_drop, p)
            else:
                conn.execute(sql.cache_restale, {**p, "header": header, "expires_at": now + keep})
            self._collect_entries(conn, now, 1)
            return True

        return self._write(key, invalidate, "cache key")

    def cache_clear(self, gen_key: str) -> int:
        sql = self._sql
        p = {"key": stored_name(gen_key)}

        def clear(conn: sqlite3.Connection, _: list[_WakeUps]) -> int:
            conn.execute(sql.generation_start, p)
            conn.execute(sql.generation_bump, p)
            return int(conn.execute(sql.generation_read, p).fetchone()[0])

        return self._write(gen_key, clear, "cache generation")

    def cache_count(self, key_prefix: str) -> int:
        """How many live entries have keys that start with `key_prefix`; a plain read."""
        with self._errors(key_prefix, "cache keys starting with"):
            try:
                with self._connection.lend(write=False) as conn:
                    if conn is None:
                        return 0
                    p: dict[str, object] = {"boot": self.clock.boot_id, "now": self.clock.now()}
                    if not key_prefix:
                        return int(conn.execute(self._sql.cache_count_all, p).fetchone()[0])
                    p.update(key_ranges(key_prefix))
                    texts, blobs = conn.execute(self._sql.cache_count_range, p).fetchone()
                    return int(texts) + int(blobs)
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return 0
                raise

    def register(
        self, names: Sequence[str], address: bytes, ttl: float, *, semaphore: bool = False
    ) -> tuple[float, float]:
        """Have releases of `names` send a datagram to `address` for `ttl` seconds.

        With `semaphore`, the names are semaphores' (slot releases ring them).
        Returns the machine-clock reading taken in the transaction and the
        registrations' new expiry, so the caller knows whether one had lapsed.
        """
        statement = self._sql.sem_register if semaphore else self._sql.register

        def register(conn: sqlite3.Connection, _: list[_WakeUps]) -> tuple[float, float]:
            now = self.clock.now()
            expires_at = now + ttl
            rows = [
                {
                    "name": stored_name(name),
                    "address": address,
                    "expires_at": expires_at,
                    "boot": self.clock.boot_id,
                }
                for name in names
            ]
            conn.executemany(statement, rows)
            self._collect(conn, self._params("", "", now), semaphore=semaphore)
            return now, expires_at

        kind = "semaphore" if semaphore else "lock"
        return self._write(names[0] if names else "", register, kind)

    def close(self) -> None:
        self._connection.close()
        self._ringer.close()
