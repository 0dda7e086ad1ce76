"""What the etcd backend shares across flavours: the URL, key names, request bodies, answers.

Everything here is plain data in and plain data out, with no I/O: the asyncio
backend and the generated blocking one send the same JSON to etcd's v3 gRPC
gateway (the HTTP/JSON face every etcd member serves since 3.3, under `/v3/`
since 3.4) and read the same answers. The gateway speaks protobuf's JSON
mapping: keys and values are base64, 64-bit integers travel as strings,
fields equal to their zero value (0, false, empty) are left out, and errors
come back as `{"error", "code", "message"}` with the gRPC status code.

**Keys.** Lock `name` lives under its own prefix, `<prefix>/lock/<name>/`, with
`/` and `%` in the name percent-escaped so that no lock's prefix is a prefix
of another's (`a/` would otherwise cover `a/b/`). Under it: `holder`, the lock
itself (its create revision is the fencing token), and `queue/<owner>`, one key
per waiter of a fair lock. One watch on the lock's prefix therefore hears
every release, expiry and queue departure of that lock and nothing else.
etcd keys are bytes, so any `str` is a name: it is encoded as UTF-8 with lone
surrogates kept (`surrogatepass`, which is one-to-one), and a name longer than
`NAME_BYTES` is cut and followed by `%#` and the SHA-256 of the whole name
(`%#` never occurs in an escaped name, so a cut name is never another name).

**Semaphores** live under `<prefix>/sem/<name>/`, apart from the lock of the same
name. Slot `i` of a semaphore of `limit` slots is the key `slot/<limit>/<i>`
(`0 <= i < limit`), on the lease of the acquisition that holds it, with the same
value as a lock's `holder`; its create revision is that acquisition's token. The
limit is in the key so that etcd, which cannot count keys in a transaction, can
still check the semaphore's identity: an acquisition compares the ranges of
every other limit's slots as empty. No key outlives the slots: when the last one
goes, so does the limit. Fair and starved waiters queue under `queue/<owner>`, as
for locks.

**Cache entries** live under `<prefix>/cache/`: the entry under `e/<key>`, its due
stamp under `d/<key>`, a namespace's generation under `g/<gen_key>` (see
`cache_keys`). Keys there are the UTF-8 of the `str`, uncut: nothing follows a key,
so the mapping is one-to-one and a key prefix is a range.

**Every write can be sent twice.** A member may apply a request and then lose
its answer (a timeout, a dropped connection), and the call asks another member.
So every write either is idempotent or lets the caller recognise its own
earlier success: leases are granted with an ID the client chose (a second grant
answers "lease already exists"), the acquisition transactions read the holder
when they fail (its owner and lease say whether it is this very attempt), and
the moves of `extend` and `hold_for` read it too (the key already on the new
lease).

**Why `holder` carries a JSON value.** `{"owner": ..., "ttl": ...}`: the owner
for compare-by-owner and `lock_info`, `null` while `release(hold_for=...)`
keeps it closed; the TTL the holder asked for, because etcd leases count whole
seconds with a minimum, so the lease alone cannot say that a lock was taken
for 0.3 s (see `lease_seconds`).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import math
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from corral.backends import registry
from corral.core.envelope import decode_header
from corral.core.options import Option, merge_options
from corral.core.validate import check_timeout
from corral.errors import ConfigError

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_PREFIX",
    "DEFAULT_TIMEOUT",
    "TXN_BYTES",
    "TXN_OPS",
    "URL_OPTIONS",
    "CacheKeys",
    "CacheReading",
    "Endpoints",
    "EtcdOptions",
    "Failure",
    "Holder",
    "LockKeys",
    "SemaphoreKeys",
    "ServerError",
    "SlotView",
    "Tries",
    "Trouble",
    "Try",
    "acquire_txn",
    "b64",
    "batches",
    "cache_count_request",
    "cache_delete_txn",
    "cache_fetch_txn",
    "cache_keys",
    "cache_read_txn",
    "cache_store_ops",
    "cache_swap_txn",
    "classify",
    "decode_answer",
    "deleted",
    "due_bounds",
    "due_stamp",
    "encode",
    "fair_first_txn",
    "fair_take_txn",
    "generation_bump_txn",
    "generation_key",
    "holder_value",
    "lease_seconds",
    "lock_keys",
    "maybe_applied",
    "move_txn",
    "new_lease_id",
    "parse_cache_read",
    "parse_generation",
    "parse_holder",
    "parse_slots",
    "parse_url",
    "prefix_end",
    "put_revision",
    "range_request",
    "sem_acquire_txn",
    "sem_pass_txn",
    "sem_queue_txn",
    "sem_take_txn",
    "sem_view_txn",
    "semaphore_keys",
    "server_error",
    "txn_ranges",
    "txn_revision",
    "txn_succeeded",
    "unb64",
    "watch_create",
]

DEFAULT_PORT = 2379
DEFAULT_PREFIX = "corral"
DEFAULT_TIMEOUT = 5.0

_TLS_OPTIONS = ("ca_file", "cert_file", "key_file")

URL_OPTIONS = (
    Option(
        "prefix",
        f"`{DEFAULT_PREFIX}`",
        "every key corral writes starts with `<prefix>/`: give each application its own",
        "app",
    ),
    Option(
        "timeout",
        f"{DEFAULT_TIMEOUT:g}",
        "seconds a call may take, over every member it asks, before BackendUnavailable",
        "2.5",
    ),
    Option(
        "ca_file",
        "the system's CAs",
        "PEM file of the CAs that sign the members' certificates (`etcds://` only)",
    ),
    Option(
        "cert_file",
        "none",
        "PEM client certificate, for members started with `--client-cert-auth` (`etcds://`)",
    ),
    Option("key_file", "none", "the private key of `cert_file` (`etcds://`)"),
)


# -- the URL ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EtcdOptions:
    endpoints: tuple[str, ...]
    """Base URLs of the members, `http://h:p` or `https://h:p`, in the order given."""
    hosts: tuple[str, ...]
    """`h:p` of each member, for messages."""
    server: str
    """The URL as shown in messages: every member, the user, never the password."""
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    prefix: str = DEFAULT_PREFIX
    timeout: float = DEFAULT_TIMEOUT
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.endpoints[0].startswith("https://")


def redact(url: str) -> str:
    """The URL with its password hidden (host lists included)."""
    return registry.redact(url)


def _host(text: str, url: str) -> tuple[str, int]:
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError(f"{redact(url)}: cannot read the host {text!r}")
        port_text = rest[1:]
    else:
        host, _, port_text = text.partition(":")
        if ":" in port_text:
            raise ConfigError(
                f"{redact(url)}: write an IPv6 address in brackets, as [{text}]:{DEFAULT_PORT}"
            )
    if not host:
        raise ConfigError(f"{redact(url)}: a member has an empty host name ({text!r})")
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{redact(url)}: {port_text!r} is not a port number")
    return host, int(port_text)


def parse_url(url: str, options: Mapping[str, object]) -> EtcdOptions:
    """`etcd://[user:password@]h1[:2379][,h2[:2379]...][?option=value...]`, or `etcds://` for TLS.

    Options come as keywords or in the query string (so `CORRAL_URL` and
    `--url` can carry them); the same option twice is an error.
    """
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("etcd", "etcds"):
        raise ConfigError(f"{redact(url)}: not an etcd:// or etcds:// URL")
    registry.check_userinfo(url, redact(url))
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if path:
        raise ConfigError(
            f"{redact(url)}: an etcd URL has no path (got /{path}); choose a key prefix "
            "with prefix= instead"
        )
    userinfo, at, host_list = netloc.rpartition("@")
    username = password = None
    if at:
        user_text, colon, password_text = userinfo.partition(":")
        username = unquote(user_text) or None
        password = unquote(password_text) if colon else None
        if username is None:
            raise ConfigError(f"{redact(url)}: a password needs a user name (user:password@)")
    if not host_list:
        raise ConfigError(f"{redact(url)}: name at least one member, as etcd://host:2379")
    members = [_host(part.strip(), url) for part in host_list.split(",")]
    given, _ = merge_options(redact(url), query, options, URL_OPTIONS, backend="etcd")
    tls: dict[str, str] = {}
    for key in _TLS_OPTIONS:
        file = given.get(key)
        if file is None:
            continue
        if not isinstance(file, str) or not file:
            raise ConfigError(f"{redact(url)}: {key} must be a file name, got {file!r}")
        tls[key] = file
    if tls and scheme != "etcds":
        raise ConfigError(f"{redact(url)}: {', '.join(sorted(tls))} need(s) an etcds:// URL (TLS)")
    if ("cert_file" in tls) != ("key_file" in tls):
        raise ConfigError(f"{redact(url)}: a client certificate needs both cert_file and key_file")
    prefix = given.get("prefix", DEFAULT_PREFIX)
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError(f"{redact(url)}: prefix must be a non-empty str, got {prefix!r}")
    http = "https" if scheme == "etcds" else "http"
    hosts = tuple(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in members)
    shown_user = ""
    if username is not None:
        shown_user = quote(username, safe="") + (":***" if password is not None else "") + "@"
    return EtcdOptions(
        endpoints=tuple(f"{http}://{host}" for host in hosts),
        hosts=hosts,
        server=f"{scheme}://{shown_user}{','.join(hosts)}",
        username=username,
        password=password,
        prefix=prefix.rstrip("/") or prefix,
        timeout=check_timeout(given.get("timeout", DEFAULT_TIMEOUT), redact(url)),
        ca_file=tls.get("ca_file"),
        cert_file=tls.get("cert_file"),
        key_file=tls.get("key_file"),
    )


# -- the members ------------------------------------------------------------------


class Endpoints:
    """Which member to ask first, shared by every call of one backend.

    Calls start at the member that answered last; a member that fails (refused,
    timed out, has no leader) passes the turn to the next one. Failures are
    also counted per member, so a watch stream on a member that has since
    failed a call is known to be untrustworthy (a paused member's stream is
    simply silent).
    """

    def __init__(self, urls: Sequence[str], hosts: Sequence[str]) -> None:
        self.urls = tuple(urls)
        self.hosts = tuple(hosts)
        self._mutex = threading.Lock()
        self._current = 0
        self._failures = [0] * len(self.urls)

    def __len__(self) -> int:
        return len(self.urls)

    def order(self) -> list[int]:
        """Every member once, the current one first."""
        with self._mutex:
            first = self._current
        return [(first + step) % len(self.urls) for step in range(len(self.urls))]

    def succeeded(self, index: int) -> None:
        with self._mutex:
            self._current = index

    def failed(self, index: int) -> None:
        with self._mutex:
            self._failures[index] += 1
            if self._current == index:
                self._current = (index + 1) % len(self.urls)

    def failures(self, index: int) -> int:
        with self._mutex:
            return self._failures[index]


class Failure(enum.Enum):
    """How a member failed one try, which decides what to try next."""

    DOWN = "down"
    """Refused or dropped the connection: nothing listens there now."""
    SLOW = "slow"
    """Did not answer within its share of the time: frozen, cut off, or overloaded."""
    BUSY = "busy"
    """Answered that it cannot serve now (no leader, shutting down): it may soon."""


# Pause before asking the members again when each of them answered fast but could not
# serve (an election is under way), so a round of tries is not repeated in a tight loop.
ROUND_PAUSE = 0.1


@dataclass(frozen=True, slots=True)
class Try:
    index: int
    """The member to ask."""
    within: float
    """How long it may take to answer."""
    pause: float
    """Seconds to wait before asking it."""


class Tries:
    """The members one call asks, in turn, and how long each may take: no I/O here.

    Each try gets at most an equal share of the call's timeout (`timeout / members`),
    so one member that does not answer cannot use up the call, and the call never
    runs past its deadline. Rounds over the members repeat while time is left,
    members that were slow in this call last, unless every member of a round was
    down (then there is nobody to wait for). A round in which every member answered
    but could not serve is followed by a short pause: a leader is being elected.
    """

    def __init__(
        self,
        endpoints: Endpoints,
        timeout: float,
        deadline: float,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._endpoints = endpoints
        self._share = timeout / len(endpoints)
        self._deadline = deadline
        self._now = now
        self._queue = endpoints.order()
        self._round: list[Failure] = []
        self._slow: set[int] = set()
        self.problems: list[str] = []

    def next(self) -> Try | None:
        """The next member to ask, or None: give up (report `problems`)."""
        pause = 0.0
        if not self._queue:
            if all(failure is Failure.DOWN for failure in self._round):
                return None
            if Failure.SLOW not in self._round:
                pause = ROUND_PAUSE
            order = self._endpoints.order()
            self._queue = [i for i in order if i not in self._slow]
            self._queue += [i for i in order if i in self._slow]
            self._round = []
        remaining = self._deadline - self._now() - pause
        if remaining <= 0:
            return None
        return Try(self._queue.pop(0), min(remaining, self._share), pause)

    def again(self, index: int) -> None:
        """Ask `index` again next (after renewing an expired auth token)."""
        self._queue.insert(0, index)

    def failed(self, index: int, failure: Failure, problem: str) -> None:
        self._round.append(failure)
        self.problems.append(f"{self._endpoints.hosts[index]}{problem}")
        if failure is Failure.SLOW:
            self._slow.add(index)
        self._endpoints.failed(index)


# -- leases -------------------------------------------------------------------------


def new_lease_id() -> int:
    """A lease ID chosen by the client, so that a grant sent twice is recognised.

    etcd takes the ID a grant names (refusing one that exists), and its own IDs
    are its member ID and a counter: 62 random bits collide with neither in
    practice, and a collision is only an answer "lease already exists" to a
    first try, on which the caller picks another ID.
    """
    return secrets.randbits(62) | 1 << 62


def lease_seconds(ttl: float) -> int:
    """The lease TTL to ask for: whole seconds, rounded up, at least 1.

    etcd raises it further to its minimum (1.5 election timeouts rounded up: 2 s
    with the default 1 s election timeout) and says so in the grant's answer.
    The lease is the bound the server enforces if the holder dies; while the
    holder lives, its backend ends a lease that outlasts the lock's own TTL
    itself, at that TTL, so a 0.3 s lock is free after 0.3 s.
    """
    return max(1, math.ceil(round(ttl, 6)))


# -- keys -------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object) -> bytes:
    return base64.b64decode(str(text)) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with `prefix` (etcd's range end)."""
    data = bytearray(prefix)
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return b"\0"  # every key


class LockKeys(NamedTuple):
    """The keys of one lock name."""

    scope: bytes
    """Every key of this lock starts with it; one watch covers them all."""
    holder: bytes
    """The lock: exists while held (or closed by hold_for), attached to a lease."""
    queue: bytes
    """Prefix of the fair waiters' keys, ordered by create revision."""

    def queue_key(self, owner: str) -> bytes:
        return self.queue + encode(owner)


# Names whose escaped form is longer than this are cut and hashed, so that no request
# carries a huge key several times (etcd refuses requests over 1.5 MiB by default).
NAME_BYTES = 200
_NAME_HEAD = 96


def encode(text: str) -> bytes:
    """Any `str` as bytes, one-to-one: UTF-8, with lone surrogates kept as such."""
    return text.encode("utf-8", "surrogatepass")


def _escape(name: str) -> bytes:
    escaped = encode(name.replace("%", "%25").replace("/", "%2F"))
    if len(escaped) <= NAME_BYTES:
        return escaped
    return escaped[:_NAME_HEAD] + b"%#" + hashlib.sha256(encode(name)).hexdigest().encode()


def lock_keys(prefix: str, name: str) -> LockKeys:
    scope = encode(f"{prefix}/lock/") + _escape(name) + b"/"
    return LockKeys(scope=scope, holder=scope + b"holder", queue=scope + b"queue/")


class SemaphoreKeys(NamedTuple):
    """The keys of one semaphore name."""

    scope: bytes
    """Every key of this semaphore starts with it; one watch covers them all."""
    slots: bytes
    """Prefix of every slot key, of whatever limit."""
    queue: bytes
    """Prefix of the queued waiters' keys, ordered by create revision."""

    def queue_key(self, owner: str) -> bytes:
        return self.queue + encode(owner)

    def of_limit(self, limit: int) -> bytes:
        """Prefix of the slots of a semaphore of `limit` (no limit's prefix covers another's)."""
        return self.slots + b"%d/" % limit

    def slot(self, limit: int, index: int) -> bytes:
        return self.of_limit(limit) + b"%d" % index

    def parse_slot(self, key: bytes) -> tuple[int, int]:
        """(limit, index) of a slot key; ValueError when it is not one corral writes."""
        if not key.startswith(self.slots):
            raise ValueError("not a slot key")
        limit, index = (int(part) for part in key[len(self.slots) :].split(b"/"))
        if not 0 <= index < limit:
            raise ValueError("slot index out of range")
        return limit, index


def semaphore_keys(prefix: str, name: str) -> SemaphoreKeys:
    scope = encode(f"{prefix}/sem/") + _escape(name) + b"/"
    return SemaphoreKeys(scope=scope, slots=scope + b"slot/", queue=scope + b"queue/")


# -- values -----------------------------------------------------------------------


def holder_value(owner: str | None, ttl: float) -> bytes:
    # json.dumps escapes every non-ASCII character, lone surrogates included.
    return json.dumps({"owner": owner, "ttl": ttl}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Holder:
    """What the `holder` key says, with the metadata etcd keeps for it."""

    owner: str | None
    ttl: float
    token: int
    """The key's create revision: the fencing token."""
    lease: int
    mod_revision: int
    key: bytes = b""
    """The key it was read from (a lock's `holder`, or one semaphore slot)."""


def parse_holder(kv: Mapping[str, Any]) -> Holder:
    """Raises ValueError when the key holds something corral did not write."""
    data = json.loads(unb64(kv.get("value")))
    if not isinstance(data, dict) or "owner" not in data:
        raise ValueError("not a corral lock value")
    owner, ttl = data["owner"], data.get("ttl")
    if owner is not None and not isinstance(owner, str):
        raise ValueError("owner is not a string")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise ValueError("ttl is not a positive number")
    return Holder(
        owner=owner,
        ttl=float(ttl),
        token=int(kv.get("create_revision", 0)),
        lease=int(kv.get("lease", 0)),
        mod_revision=int(kv.get("mod_revision", 0)),
        key=unb64(kv.get("key")),
    )


# -- requests -------------------------------------------------------------------------


def _compare(key: bytes, target: str, value: int, result: str = "EQUAL") -> dict[str, Any]:
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "LEASE": "lease"}[target]
    return {"key": b64(key), "target": target, "result": result, field: str(value)}


def _put(key: bytes, value: bytes, lease: int, *, prev_kv: bool = False) -> dict[str, Any]:
    put: dict[str, Any] = {"key": b64(key), "value": b64(value), "lease": str(lease)}
    if prev_kv:
        put["prev_kv"] = True
    return {"request_put": put}


def _range(key: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


def _queue_empty(keys: LockKeys) -> dict[str, Any]:
    # A comparison over a range holds when every key in it passes; an empty range is
    # compared as one key with all-zero fields, so "create_revision == 0" means empty.
    compare = _compare(keys.queue, "CREATE", 0)
    compare["range_end"] = b64(prefix_end(keys.queue))
    return compare


def range_request(key: bytes, *, prefix: bool = False) -> dict[str, Any]:
    """A linearizable read of one key, or of every key under it with `prefix` (the
    gateway's default; never `serializable`)."""
    if prefix:
        return {"key": b64(key), "range_end": b64(prefix_end(key))}
    return {"key": b64(key)}


def acquire_txn(keys: LockKeys, value: bytes, lease: int) -> dict[str, Any]:
    """Create `holder` on `lease` if it does not exist and nobody queues for it; else read it.

    A live queue (a fair waiter, or a waiter the lock logic moved into the queue
    after it waited too long) keeps every newcomer out; dead waiters' places go
    with their short leases, so they stall nobody for long. With nobody queued,
    the comparison over the empty queue range costs nothing more.
    """
    return {
        "compare": [_compare(keys.holder, "CREATE", 0), _queue_empty(keys)],
        "success": [_put(keys.holder, value, lease)],
        "failure": [_range(keys.holder)],
    }


def fair_first_txn(
    keys: LockKeys, owner: str, value: bytes, lease: int, queue_lease: int
) -> dict[str, Any]:
    """A fair newcomer takes the lock if it is free and nobody queues; else it queues.

    Its place is born on `queue_lease`, a short lease of its own, so a waiter that
    dies at any moment holds its place only until that lease runs out. Sent a
    second time, the put finds the place already there and keeps its create
    revision (`prev_kv` tells it), so the place stays its first arrival.
    """
    return {
        "compare": [_compare(keys.holder, "CREATE", 0), _queue_empty(keys)],
        "success": [_put(keys.holder, value, lease)],
        "failure": [
            _put(keys.queue_key(owner), encode(owner), queue_lease, prev_kv=True),
            _range(keys.holder),
        ],
    }


def fair_take_txn(
    keys: LockKeys, owner: str, value: bytes, lease: int, revision: int
) -> dict[str, Any]:
    """Take the lock if it is free and `owner`'s queue key (created at `revision`) is the oldest.

    Nobody can join ahead of an existing key (create revisions only grow), so
    "no queue key older than mine, and mine still exists" is "I am the head".
    """
    mine = keys.queue_key(owner)
    oldest = _compare(keys.queue, "CREATE", revision - 1, "GREATER")
    oldest["range_end"] = b64(prefix_end(keys.queue))
    return {
        "compare": [_compare(keys.holder, "CREATE", 0), _compare(mine, "CREATE", revision), oldest],
        "success": [
            _put(keys.holder, value, lease),
            {"request_delete_range": {"key": b64(mine)}},
        ],
        "failure": [_range(keys.holder), _range(mine)],
    }


def move_txn(key: bytes, old_lease: int, value: bytes, new_lease: int) -> dict[str, Any]:
    """Rewrite `key` (a lock's `holder`, or a semaphore slot) onto `new_lease` if it is still
    on `old_lease` (compare-by-owner).

    A put on an existing key keeps its create revision, so the token stays.
    """
    return {
        "compare": [_compare(key, "LEASE", old_lease)],
        "success": [_put(key, value, new_lease)],
        "failure": [_range(key)],
    }


def watch_create(scope: bytes) -> dict[str, Any]:
    """Watch every key of one lock (or semaphore) for deletions: release, lease expiry, a
    waiter leaving."""
    return {
        "create_request": {
            "key": b64(scope),
            "range_end": b64(prefix_end(scope)),
            "filters": ["NOPUT"],
        }
    }


def _range_compare(
    start: bytes, end: bytes, target: str, value: int, result: str = "EQUAL"
) -> dict[str, Any]:
    # Every key in [start, end) must pass; an empty range is one key with all-zero fields.
    compare = _compare(start, target, value, result)
    compare["range_end"] = b64(end)
    return compare


def _only_limit(keys: SemaphoreKeys, limit: int) -> list[dict[str, Any]]:
    """No slot of any other limit exists: the semaphore is free, or held with `limit`."""
    mine = keys.of_limit(limit)
    return [
        _range_compare(keys.slots, mine, "CREATE", 0),
        _range_compare(prefix_end(mine), prefix_end(keys.slots), "CREATE", 0),
    ]


def _slot_view(
    keys: SemaphoreKeys, owner: str, limit: int, place: int | None
) -> list[dict[str, Any]]:
    """Read what an attempt decides on: every slot, and the queue (for a queued waiter: up to
    `limit` of the waiters ahead of it, which is enough to compare with the free slots, and
    its own place)."""
    queue: dict[str, Any] = {"key": b64(keys.queue), "range_end": b64(prefix_end(keys.queue))}
    ops = [{"request_range": range_request(keys.slots, prefix=True)}]
    if place is None:
        return [*ops, {"request_range": {**queue, "count_only": True}}]
    # The revision filter prunes the keys found but not the count: count the keys.
    ahead = {**queue, "keys_only": True, "max_create_revision": str(place - 1)}
    ahead["limit"] = str(limit)
    mine = {"key": b64(keys.queue_key(owner)), "keys_only": True}
    return [*ops, {"request_range": ahead}, {"request_range": mine}]


def sem_view_txn(keys: SemaphoreKeys, owner: str, limit: int, place: int) -> dict[str, Any]:
    """A queued waiter's reading of the slots and the queue at one revision (see `SlotView`)."""
    return {"compare": [], "success": _slot_view(keys, owner, limit, place)}


def sem_acquire_txn(
    keys: SemaphoreKeys, limit: int, index: int, owner: str, value: bytes, lease: int
) -> dict[str, Any]:
    """Create slot `index` on `lease` if it is free, the semaphore has no slot of another
    limit and nobody queues; else read the slots and the queue (see `sem_pass_txn`).

    The slot was chosen from an earlier reading (or at random, with none): a choice
    gone stale fails here, and the reading the failure returns gives the next one.
    Sent a second time after the first was applied, it fails and the reading shows
    the slot with this owner on this lease: the caller's own success.
    """
    return {
        "compare": [
            _compare(keys.slot(limit, index), "CREATE", 0),
            *_only_limit(keys, limit),
            _range_compare(keys.queue, prefix_end(keys.queue), "CREATE", 0),
        ],
        "success": [_put(keys.slot(limit, index), value, lease)],
        "failure": _slot_view(keys, owner, limit, None),
    }


def sem_take_txn(
    keys: SemaphoreKeys,
    limit: int,
    index: int,
    owner: str,
    value: bytes,
    lease: int,
    place: int,
    seen: int,
) -> dict[str, Any]:
    """A queued waiter (its key created at `place`) takes slot `index` and leaves the queue,
    if no slot was taken since the reading at revision `seen` that let it in.

    That reading found fewer waiters ahead of it than free slots; since then the
    waiters ahead can only have left (nobody joins ahead of an existing key), and
    with no slot taken since, the free slots can only be more: so it still holds.
    Else read again, as `sem_view_txn` does.
    """
    return {
        "compare": [
            _compare(keys.queue_key(owner), "CREATE", place),
            _range_compare(
                keys.of_limit(limit), prefix_end(keys.of_limit(limit)), "CREATE", seen + 1, "LESS"
            ),
            _compare(keys.slot(limit, index), "CREATE", 0),
            *_only_limit(keys, limit),
        ],
        "success": [
            _put(keys.slot(limit, index), value, lease),
            {"request_delete_range": {"key": b64(keys.queue_key(owner))}},
        ],
        "failure": _slot_view(keys, owner, limit, place),
    }


def sem_pass_txn(
    keys: SemaphoreKeys, limit: int, index: int, owner: str, value: bytes, lease: int, seen: int
) -> dict[str, Any]:
    """A newcomer takes slot `index` past the queue, if nobody queued and no slot was taken
    since the reading at revision `seen`, which found fewer waiters queued than free slots.

    Every place counts as ahead of a newcomer; places can only have left since
    (a new one would have a later create revision), and the free slots can only
    be more: so the reading still holds. Else read again, as `sem_acquire_txn` does.
    """
    return {
        "compare": [
            _range_compare(keys.queue, prefix_end(keys.queue), "CREATE", seen + 1, "LESS"),
            _range_compare(
                keys.of_limit(limit), prefix_end(keys.of_limit(limit)), "CREATE", seen + 1, "LESS"
            ),
            _compare(keys.slot(limit, index), "CREATE", 0),
            *_only_limit(keys, limit),
        ],
        "success": [_put(keys.slot(limit, index), value, lease)],
        "failure": _slot_view(keys, owner, limit, None),
    }


def sem_queue_txn(keys: SemaphoreKeys, owner: str, queue_lease: int) -> dict[str, Any]:
    """Queue `owner` on its own short lease; sent again, the place keeps its first revision."""
    return {
        "compare": [],
        "success": [_put(keys.queue_key(owner), encode(owner), queue_lease, prev_kv=True)],
    }


# -- answers -------------------------------------------------------------------------


def decode_answer(body: bytes) -> dict[str, Any]:
    """The JSON object of a unary answer, or the first message of a streamed one.

    Streamed answers (lease keep-alive) come as `{"result": ...}` or
    `{"error": ...}` objects, one per line.
    """
    text = body.decode("utf-8").strip()
    if "\n" in text:
        text = text.split("\n", 1)[0]
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def txn_succeeded(answer: Mapping[str, Any]) -> bool:
    return bool(answer.get("succeeded", False))


def txn_revision(answer: Mapping[str, Any]) -> int:
    """The store revision after the transaction: the create revision of a key it created."""
    return int(answer.get("header", {}).get("revision", 0))


def put_revision(answer: Mapping[str, Any], index: int = 0) -> int:
    """The create revision of the key written by the put at `index` (made with prev_kv)."""
    responses = answer.get("responses") or []
    put = (responses[index].get("response_put") or {}) if len(responses) > index else {}
    previous = put.get("prev_kv")
    return int(previous["create_revision"]) if previous else txn_revision(answer)


def txn_ranges(answer: Mapping[str, Any]) -> list[dict[str, Any] | None]:
    """The key each `request_range` of the taken branch found (None where missing), in order."""
    found: list[dict[str, Any] | None] = []
    for response in answer.get("responses", []):
        if "response_range" in response:
            kvs = response["response_range"].get("kvs") or []
            found.append(kvs[0] if kvs else None)
    return found


def _range_responses(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r["response_range"] for r in answer.get("responses", []) if "response_range" in r]


@dataclass(frozen=True, slots=True)
class SlotView:
    """What one reading (or failed attempt) saw of a semaphore, at one revision."""

    limit: int | None
    """The limit its slots were taken with; None when no slot is taken."""
    holders: tuple[Holder, ...]
    """Every taken slot (kept closed by hold_for or not), oldest token first."""
    queued: int
    """How many waiters queue (ahead of the reader, for a queued one)."""
    place: int
    """The create revision of the reader's queue key, 0 when it has none (or was not asked)."""
    revision: int
    """The store revision it was read at."""
    taken: frozenset[int] = frozenset()
    """The indices of the taken slots."""

    def free(self, limit: int) -> list[int]:
        """The indices of the free slots of a semaphore of `limit`."""
        return [index for index in range(limit) if index not in self.taken]

    def mine(self, owner: str, lease: int) -> Holder | None:
        """The slot an earlier try of this very attempt (this owner, this lease) took."""
        for holder in self.holders:
            if holder.owner == owner and holder.lease == lease:
                return holder
        return None

    def owned_by(self, owner: str) -> Holder | None:
        for holder in self.holders:
            if holder.owner == owner:
                return holder
        return None


def parse_slots(keys: SemaphoreKeys, answer: Mapping[str, Any]) -> SlotView:
    """Read the answer of `sem_view_txn` (or a failed acquisition), or of a plain range read of
    the slots; raises ValueError when a key holds something corral did not write."""
    ranges = _range_responses(answer) if "responses" in answer else [answer]
    holders: list[Holder] = []
    taken: set[int] = set()
    limit: int | None = None
    for kv in (ranges[0].get("kvs") or []) if ranges else []:
        holder = parse_holder(kv)
        limit, index = keys.parse_slot(holder.key)
        holders.append(holder)
        taken.add(index)
    queued = 0
    if len(ranges) > 2:  # a queued waiter's reading: the keys ahead of it (at most the limit)
        queued = len(ranges[1].get("kvs") or [])
    elif len(ranges) > 1:
        queued = int(ranges[1].get("count", 0))
    mine = (ranges[2].get("kvs") or []) if len(ranges) > 2 else []
    return SlotView(
        limit=limit,
        holders=tuple(sorted(holders, key=lambda holder: holder.token)),
        queued=queued,
        place=int(mine[0].get("create_revision", 0)) if mine else 0,
        revision=txn_revision(answer),
        taken=frozenset(taken),
    )


class Trouble(enum.Enum):
    """What an error answer means for the caller."""

    LEASE_NOT_FOUND = "lease not found"
    LEASE_EXISTS = "a lease with this ID exists already"
    ELSEWHERE = "this member cannot serve now (no leader, election, overload): ask another"
    BAD_TOKEN = "the auth token expired or is unknown: authenticate again"
    CREDENTIALS = "wrong user or password"
    AUTH_REQUIRED = "the cluster requires a user"
    AUTH_DISABLED = "authentication is not enabled on the cluster"
    PERMISSION = "the user lacks a permission"
    NO_SPACE = "the database is over its space quota"
    TOO_LARGE = "the request is larger than the cluster accepts (--max-request-bytes)"
    OTHER = "other"


# gRPC status codes etcd uses.
_CANCELLED, _DEADLINE_EXCEEDED, _NOT_FOUND = 1, 4, 5
_PERMISSION_DENIED, _RESOURCE_EXHAUSTED, _FAILED_PRECONDITION = 7, 8, 9
_UNAVAILABLE, _UNAUTHENTICATED = 14, 16


@dataclass(frozen=True, slots=True)
class ServerError:
    trouble: Trouble
    message: str


def classify(code: int | None, message: str) -> Trouble:
    """What an error (gRPC status code, message) means for the caller."""
    text = message.lower()
    if code == _NOT_FOUND and "lease not found" in text:
        return Trouble.LEASE_NOT_FOUND
    if "lease already exists" in text:
        return Trouble.LEASE_EXISTS
    if code in (_CANCELLED, _UNAVAILABLE, _DEADLINE_EXCEEDED) or any(
        sign in text for sign in ("is closing", "server stopped", "no leader")
    ):
        # Cancelled: the member is shutting down ("the client connection is closing").
        return Trouble.ELSEWHERE
    if code == _UNAUTHENTICATED or "invalid auth token" in text:
        return Trouble.BAD_TOKEN if "token" in text else Trouble.CREDENTIALS
    if "authentication failed" in text:
        return Trouble.CREDENTIALS
    if "user name is empty" in text:
        return Trouble.AUTH_REQUIRED
    if code == _FAILED_PRECONDITION and "authentication is not enabled" in text:
        return Trouble.AUTH_DISABLED
    if code == _PERMISSION_DENIED:
        return Trouble.PERMISSION
    if "space exceeded" in text or (code == _RESOURCE_EXHAUSTED and "space" in text):
        return Trouble.NO_SPACE
    if "request is too large" in text or "message larger than max" in text:
        return Trouble.TOO_LARGE  # (the second from gRPC, past the limit and its overhead)
    return Trouble.OTHER


def maybe_applied(message: str) -> bool:
    """Whether a member that answered "cannot serve now" may still apply the request.

    A proposal that timed out, or met a leader change or a shutdown, may commit
    later; a request refused for want of a leader (the `hasleader` check) or of
    capacity was never proposed.
    """
    text = message.lower()
    return not any(sign in text for sign in ("no leader", "too many requests"))


def server_error(status: int, body: bytes) -> ServerError:
    """Classify a non-200 answer of the gateway (or an in-band stream error)."""
    try:
        data: Any = json.loads(body.decode("utf-8").strip().split("\n", 1)[0])
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        data = data["error"]  # a streamed error: {"error": {"grpc_code", "message", ...}}
    if isinstance(data, dict):
        code = data.get("code", data.get("grpc_code"))
        message = str(data.get("message") or data.get("error") or f"HTTP {status}")
        return ServerError(classify(code if isinstance(code, int) else None, message), message)
    snippet = body[:200].decode("utf-8", "replace").strip()
    message = f"HTTP {status}" + (f": {snippet}" if snippet else "")
    if status in (502, 503, 504):
        return ServerError(Trouble.ELSEWHERE, message)
    if status == 404:
        message += " (is this an etcd >= 3.4 client URL? the /v3 gateway answers there)"
    return ServerError(Trouble.OTHER, message)


# -- cache entries ----------------------------------------------------------------
#
# An entry is the key `<prefix>/cache/e/<key>`, its value the envelope's bytes as
# given. Beside it, `<prefix>/cache/d/<key>` holds its due stamp (`due_stamp`): what
# a transaction compares to decide, in the read's own round trip, whether the entry
# is due for a recompute, since etcd compares whole values, never a part of one.
# Both keys are written, rewritten and deleted together, in one transaction, on the
# same lease, so they also expire together. A namespace's generation is the key
# `<prefix>/cache/g/<gen_key>`, an ASCII decimal, absent until the first clear.
# Keys are the UTF-8 of the `str` (lone surrogates kept), unescaped and uncut: each
# kind has its own fixed prefix and nothing follows the key, so the mapping is
# one-to-one, and a range over `<prefix>/cache/e/<key prefix>` counts the entries
# under a key prefix exactly.

# etcd refuses a transaction with more operations than this in one branch (its
# --max-txn-ops, 128 by default) ...
TXN_OPS = 128
# ... or a request larger than --max-request-bytes (1.5 MiB by default): many keys
# or values are sent in several transactions of about this much each.
TXN_BYTES = 1 << 20
# The ceiling of a time field of the envelope (%017.6f).
_STAMP_TIME_MAX = 9_999_999_999.999999
_GENERATIONS = 10**16  # a generation has 16 digits in the envelope and in a stamp


class CacheKeys(NamedTuple):
    """The two keys of one cache entry."""

    entry: bytes
    """The entry's bytes."""
    due: bytes
    """Its due stamp, when the bytes are an envelope (absent otherwise)."""


def _cache_space(prefix: str) -> bytes:
    return encode(f"{prefix}/cache/")


def cache_keys(prefix: str, key: str) -> CacheKeys:
    space = _cache_space(prefix)
    return CacheKeys(space + b"e/" + encode(key), space + b"d/" + encode(key))


def generation_key(prefix: str, gen_key: str) -> bytes:
    return _cache_space(prefix) + b"g/" + encode(gen_key)


def _time_text(when: float) -> bytes:
    if not math.isfinite(when):
        when = _STAMP_TIME_MAX if when > 0 else 0.0
    return b"%017.6f" % min(max(when, 0.0), _STAMP_TIME_MAX)


def due_stamp(data: bytes) -> bytes | None:
    """`%016d%017.6f` of the entry's generation and max(fresh_until, retry_until), or None
    when the bytes are not an envelope (such an entry is always due: no stamp).

    Fixed width and zero-padded, so etcd's bytewise comparison of stamps is the
    numeric comparison of (generation, time), which is what `claim_due` decides on.
    """
    header = decode_header(data)
    if header is None or not 0 <= header.generation < _GENERATIONS:
        return None
    return b"%016d" % header.generation + _time_text(max(header.fresh_until, header.retry_until))


def _micro_text(micros: int) -> bytes:
    return b"%010d.%06d" % divmod(micros, 1_000_000)


def due_bounds(generation: int, due_before: float) -> tuple[bytes, bytes]:
    """(low, high): an entry is not due exactly when its stamp lies strictly between them.

    That is: written under `generation`, and fresh or held back by a remembered
    error after `due_before`, as `claim_due` compares: the stamp's time read as a
    float, above `due_before`. Stamp times are whole microseconds, so `low`
    holds the last microsecond whose float is at or before `due_before`.
    """
    if not 0 <= generation < _GENERATIONS:
        return b"\xff", b"\x00"  # no stamp lies between: always due
    prefix = b"%016d" % generation
    if not due_before >= 0:  # negative or NaN: no time is at or before it
        low = prefix + b"-"  # sorts below every digit
    elif due_before >= _STAMP_TIME_MAX:
        low = prefix + _time_text(_STAMP_TIME_MAX)
    else:
        # Floats round monotonically, so the microseconds whose float is at most
        # `due_before` run up to one last one: at or just past the exact floor.
        micros = math.floor(Decimal(due_before) * 1_000_000)
        while float(_micro_text(micros + 1)) <= due_before:
            micros += 1
        low = prefix + _micro_text(micros)
    return low, prefix + b"\xff"  # above every stamp of this generation, below the next


def _compare_value(key: bytes, result: str, value: bytes) -> dict[str, Any]:
    # On a missing key a VALUE comparison is false, whatever its result.
    return {"key": b64(key), "target": "VALUE", "result": result, "value": b64(value)}


def _delete(key: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def batches(sizes: Sequence[int], ops_each: int, reserved: int = 0) -> list[range]:
    """Split items of these byte sizes into runs that fit one transaction each: at most
    `TXN_OPS` operations (`ops_each` per item, and `reserved` more in the first run) and
    about `TXN_BYTES` bytes. An item alone is never split; at least one run, maybe empty."""
    runs: list[range] = []
    start, ops, size = 0, reserved, 0
    for index, item in enumerate(sizes):
        if index > start and (ops + ops_each > TXN_OPS or size + item > TXN_BYTES):
            runs.append(range(start, index))
            start, ops, size = index, 0, 0
        ops += ops_each
        size += item
    runs.append(range(start, len(sizes)))
    return runs


def cache_fetch_txn(entries: Sequence[bytes], generation: bytes | None) -> dict[str, Any]:
    """Read the generation (when given, first) and every entry, at one revision."""
    ops = [] if generation is None else [_range(generation)]
    return {"compare": [], "success": ops + [_range(entry) for entry in entries]}


def cache_read_txn(
    keys: CacheKeys,
    generation: bytes,
    believed: int,
    bounds: tuple[bytes, bytes],
    attempt: dict[str, Any] | None,
) -> dict[str, Any]:
    """Read an entry and its namespace's generation; if the generation key is still at mod
    revision `believed` (so its generation is the one `bounds` were made for) and the
    entry is due, run the lock's `attempt` transaction, in the same transaction.

    Not due: the entry exists and its stamp lies between `bounds`. Missing, foreign
    (no stamp), of another generation, or stale at `due_before`: due. When the
    generation moved, only the reading is done (the caller learns the generation,
    and asks again).
    """
    read = [_range(keys.entry), _range(generation)]
    low, high = bounds
    check = {
        "compare": [
            _compare(keys.entry, "CREATE", 0, "GREATER"),
            _compare_value(keys.due, "GREATER", low),
            _compare_value(keys.due, "LESS", high),
        ],
        "success": [],
        "failure": [] if attempt is None else [{"request_txn": attempt}],
    }
    return {
        "compare": [_compare(generation, "MOD", believed)],
        "success": [*read, {"request_txn": check}],
        "failure": read,
    }


def cache_store_ops(keys: CacheKeys, data: bytes | None, lease: int) -> list[dict[str, Any]]:
    """Write an entry (and its stamp, or drop a stale stamp) on `lease`; `data=None` deletes it."""
    if data is None:
        return [_delete(keys.entry), _delete(keys.due)]
    stamp = due_stamp(data)
    return [
        _put(keys.entry, data, lease),
        _delete(keys.due) if stamp is None else _put(keys.due, stamp, lease),
    ]


def cache_delete_txn(keys: CacheKeys) -> dict[str, Any]:
    return {"compare": [], "success": cache_store_ops(keys, None, 0)}


def cache_swap_txn(
    keys: CacheKeys, mod_revision: int, data: bytes | None, lease: int
) -> dict[str, Any]:
    """Replace the entry read at `mod_revision` with `data` (None: delete it) on `lease`, if
    nobody wrote it since; else read it again."""
    return {
        "compare": [_compare(keys.entry, "MOD", mod_revision)],
        "success": cache_store_ops(keys, data, lease),
        "failure": [_range(keys.entry)],
    }


def generation_bump_txn(key: bytes, mod_revision: int, generation: int) -> dict[str, Any]:
    """Set the generation read at `mod_revision` (0: absent) to `generation`, if nobody
    changed it since; else read it again."""
    return {
        "compare": [_compare(key, "MOD", mod_revision)],
        "success": [_put(key, b"%d" % generation, 0)],
        "failure": [_range(key)],
    }


def cache_count_request(prefix: str, key_prefix: str) -> dict[str, Any]:
    request = range_request(_cache_space(prefix) + b"e/" + encode(key_prefix), prefix=True)
    return {**request, "count_only": True}


def parse_generation(kv: Mapping[str, Any] | None) -> tuple[int, int]:
    """(generation, mod revision) of a generation key, (0, 0) when absent; ValueError when
    it holds something corral did not write."""
    if kv is None:
        return 0, 0
    text = unb64(kv.get("value"))
    if not text.isdigit() or len(text) > 20:
        raise ValueError("not a corral cache generation (an ASCII decimal)")
    return int(text), int(kv.get("mod_revision", 0))


def deleted(answer: Mapping[str, Any], index: int = 0) -> int:
    """How many keys the delete at `index` of a transaction removed."""
    responses = answer.get("responses") or []
    found = responses[index].get("response_delete_range") or {} if len(responses) > index else {}
    return int(found.get("deleted", 0))


@dataclass(frozen=True, slots=True)
class CacheReading:
    """What one `cache_read_txn` found and did."""

    entry: dict[str, Any] | None
    generation: dict[str, Any] | None
    current: bool
    """The generation was the one believed: dueness was decided (else only read)."""
    due: bool
    attempted: bool
    """The lock's attempt ran (the entry was due and an attempt was given)."""
    won: bool
    holder: dict[str, Any] | None
    """The lock's holder, read by an attempt that failed."""


def parse_cache_read(answer: Mapping[str, Any]) -> CacheReading:
    found = txn_ranges(answer)
    entry, generation = [*found, None, None][:2]
    current = txn_succeeded(answer)
    due = attempted = won = False
    holder = None
    if current:
        responses = answer.get("responses") or []
        check = responses[2].get("response_txn") or {} if len(responses) > 2 else {}
        due = not txn_succeeded(check)
        inner = check.get("responses") or []
        if due and inner:
            attempt = inner[0].get("response_txn") or {}
            attempted, won = True, txn_succeeded(attempt)
            if not won:
                ranges = txn_ranges(attempt)
                holder = ranges[0] if ranges else None
    return CacheReading(entry, generation, current, due, attempted, won, holder)
