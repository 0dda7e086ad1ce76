"""memcached's keys, values and meta protocol, with no I/O: shared by both flavours.

Nothing here reads or writes a socket. The connections, their pool and the
round trips live in `corral._async.backends.memcached_conn` (asyncio) and its
generated blocking twin `corral._sync.backends.memcached_conn`; the steps of
locks, semaphores and cache entries in `memcached_locks`,
`memcached_slots` and `memcached_cache` beside it. What both flavours
must agree on byte for byte (keys, TTL rounding, values, the framing of
replies, the queue's encoding, the URL and its options) exists here once.

**Why not pymemcache.** Its API has `gets`/`cas` but no compare-and-delete.
`Client.raw_command` can send meta commands, but it reads a reply up to a fixed
end token, so it cannot read one that carries a data block: `mg <key> v c t`
answers `VA <len> c.. t..`, then the value; raw_command returns the first line
and drops (or, when it arrives later, leaves on the socket for the next
command) the value. Without it, reading a lock takes two commands (`gets`,
then a TTL probe) that do not describe one instant; nor can it pipeline two
commands in one round trip. Its `PooledClient` raises when full instead of
waiting, does not notice `fork`, and applies `timeout` to each socket call, so
a two-step operation can take twice as long, and it blocks, so the asyncio
flavour could only call it from a thread. What it would have given us is the
socket and TLS set-up, which the standard library (and asyncio) do in a few
lines, so corral speaks the meta protocol itself.

**TTLs in whole seconds.** memcached keeps time in whole seconds, on a clock
that ticks once a second; an item given `T<n>` vanishes at the n-th tick, so
between n-1 and n seconds later, and slightly sooner when the tick drifts
across a second boundary (about every 40 minutes the counter jumps by 2). So a
lock is stored with `T<ceil(ttl) + 2>`: it lives at least its ttl, never less
(the guarantee the lock logic's renewals rely on), and at most ceil(ttl) + 2 s
(so a crashed holder's lock outstays its ttl by less than 3 s). Sub-second TTLs
are therefore not honoured precisely on memcached. A waiter's place in a
queue is kept the same way: at least `queue_ttl`, at most ceil(queue_ttl) + 2 s
after its last refresh. `inspect` reports the remaining TTL minus that margin
(what is left of the lease the holder was granted); a failed attempt reports
the full remaining TTL as `holder_ttl`, so a waiter never polls in a tight loop
for the margin. memcached reads a TTL above 30 days as a Unix time, so longer
ones are sent as one, computed on this client's clock; nothing can last past
2038-01-19 (memcached's Unix times are 32-bit).

**Keys.** Per lock name: `<prefix>:lock:<name>` (the lock) and
`<prefix>:queue:<name>` (its waiting queue) when the name is printable ASCII
without spaces and the key fits memcached's 250 bytes; any other name (long,
spaces, control characters, NUL, non-ASCII, lone surrogates) becomes
`<prefix>:lock#<readable part>#<32 hex digits of sha256(name)>`, so every `str`
is a valid name, deterministically, and the two forms never collide (":" and
"#" after the kind). Per waiter: `<prefix>:place:<32 hex digits of
sha256(lock key, owner)>`. Per server: `<prefix>:fence`, the fencing counter. Per semaphore name:
`<prefix>:sem:<name>` (its limit), `<prefix>:semqueue:<name>` and a slot key
`<prefix>:slot:<name>#<i>` for each i < limit, hashed the same way, so a
semaphore never shares a key with the lock of the same name. Per cache entry:
`<prefix>:cache:<key>`, and per cache namespace `<prefix>:gen:<gen key>` (its
generation counter), hashed the same way, so no cache key is ever a lock's.
Values are `<token>:<owner>` (`<token>:` while closed by `hold_for`; empty for
the placeholder a free lock's probe leaves), as in the Redis backend; a slot's
are `<token>:<limit>:<owner>`.

**TLS and authentication.** memcached >= 1.6 built with TLS serves it with
`-Z -o ssl_chain_cert=...,ssl_key=...`; pass `tls=True` (system CAs),
`tls_ca_file=`, `tls_certfile=`/`tls_keyfile=` (client certificates, for
`ssl_verify_mode`) or a ready `tls_context=ssl.SSLContext`. SASL exists only in
the binary protocol, which has no meta commands, so it is not supported; the
text protocol's own authentication (`-Y <file>`, memcached >= 1.5.15) is: put
`user:password@` in the URL. The password goes to the server and nowhere else:
the options' repr, the server's name in messages and every error leave it out.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import ssl
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from corral.backends.registry import redact
from corral.core.options import Option, merge_options
from corral.core.validate import check_timeout
from corral.errors import ConfigError

__all__ = [
    "CHECK_CHUNK",
    "DEFAULT_PORT",
    "DEFAULT_PREFIX",
    "DEFAULT_TIMEOUT",
    "MAX_KEY_BYTES",
    "MIN_VERSION",
    "OPTIONS",
    "PLACEHOLDER_TTL",
    "TTL_MARGIN",
    "CasDisabled",
    "ConnectionClosed",
    "LockKeys",
    "MemcachedOptions",
    "Place",
    "PoolExhausted",
    "ProtocolError",
    "QueueState",
    "Reply",
    "ReplyParser",
    "SemaphoreKeys",
    "ServerRefused",
    "StoreClosed",
    "TooOld",
    "cache_key",
    "check_prefix",
    "check_version",
    "decode_slot",
    "decode_value",
    "encode_slot",
    "encode_value",
    "entry_ttl",
    "fence_key",
    "fork_aware",
    "generation_key",
    "holder_ttl",
    "join_requests",
    "joined",
    "lease_left",
    "lock_keys",
    "parse_url",
    "place_id",
    "place_key",
    "request",
    "semaphore_keys",
    "server_ttl",
    "shown_url",
]

DEFAULT_PORT = 11211
DEFAULT_PREFIX = "corral"
DEFAULT_TIMEOUT = 5.0
MAX_KEY_BYTES = 250
"""memcached refuses longer keys."""
MAX_PREFIX_CHARS = 100
READABLE_CHARS = 64
"""How much of a hashed name stays readable in its key."""
TTL_MARGIN = 2
"""Whole seconds added to every TTL sent, so memcached's tick never ends a lock early."""
MAX_RELATIVE_TTL = 30 * 24 * 3600
"""memcached reads a larger TTL as a Unix time."""
MAX_UNIX_TTL = 2**31 - 1
"""memcached wraps later Unix times around (and then expires the item at once)."""
MIN_VERSION = (1, 6, 10)
"""The meta protocol's final syntax (`ms <key> <datalen>`, `HD`) and a working `md C<cas>`."""
_MAX_LINE = 8192
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_PLAIN = re.compile(r"[\x21-\x7e]*")
_UNSAFE = re.compile(r"[^\x21-\x7e]")
_VERSION = re.compile(rb"(\d+)\.(\d+)\.(\d+)")


# -- keys -------------------------------------------------------------------------


class LockKeys(NamedTuple):
    """Everything one lock name keeps on the server (besides its waiters' places)."""

    lock: str
    """`<token>:<owner>` with the lock's TTL; `<token>:` while closed by `hold_for`; empty
    while free and recently probed (a placeholder that lives under 3 s)."""
    queue: str
    """The waiting queue: place ids in arrival order; lives as long as its waiters refresh."""
    route: str
    """What a router hashes to choose the server: every key of a lock lives on one server."""


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError(f"prefix must be a non-empty str, got {prefix!r}")
    if not _PLAIN.fullmatch(prefix) or len(prefix) > MAX_PREFIX_CHARS:
        raise ConfigError(
            f"prefix must be at most {MAX_PREFIX_CHARS} printable ASCII characters without "
            f"spaces (it starts every memcached key), got {prefix!r}"
        )
    return prefix


def _digest(*parts: str) -> str:
    """32 hex digits of sha256 over `parts`, each length-prefixed so no two splits collide."""
    hasher = hashlib.sha256()
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        hasher.update(b"%d:" % len(raw))
        hasher.update(raw)
    return hasher.hexdigest()[:32]


def _key(prefix: str, kind: str, name: str) -> str:
    plain = f"{prefix}:{kind}:{name}"
    if _PLAIN.fullmatch(name) and len(plain) <= MAX_KEY_BYTES:  # ASCII: chars are bytes
        return plain
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    head = f"{prefix}:{kind}#"
    room = min(READABLE_CHARS, MAX_KEY_BYTES - len(head) - 1 - len(digest))
    return f"{head}{_UNSAFE.sub('_', name[:room])}#{digest}"


def lock_keys(prefix: str, name: str) -> LockKeys:
    """The keys of lock `name`: `corral:lock:report`, or a hashed form for any other name."""
    lock = _key(prefix, "lock", name)
    return LockKeys(lock=lock, queue=_key(prefix, "queue", name), route=lock)


class SemaphoreKeys(NamedTuple):
    """Everything one semaphore name keeps on the server (besides its waiters' places)."""

    name: str
    prefix: str
    header: str
    """The limit the current holders took their slots with (its digits), kept at least as
    long as any slot: the semaphore's identity, and how readers know which slots to read."""
    queue: str
    """The waiting queue, as a lock's: place ids in arrival order."""
    route: str
    """What a router hashes to choose the server: every key of a semaphore lives on one."""

    def slot(self, index: int) -> str:
        """Slot `index` (0 <= index < limit): `<token>:<limit>:<owner>` while taken."""
        return _key(self.prefix, "slot", f"{self.name}#{index}")


def semaphore_keys(prefix: str, name: str) -> SemaphoreKeys:
    """The keys of semaphore `name`, apart from any lock's: `corral:sem:pool`, `corral:slot:pool#0`.

    A slot key names the semaphore and the index, split at the last "#", so no two
    (name, index) pairs share a key; names that cannot be keys are hashed as for locks.
    """
    header = _key(prefix, "sem", name)
    return SemaphoreKeys(name, prefix, header, _key(prefix, "semqueue", name), header)


def place_id(lock_key: str, owner: str) -> str:
    """The id under which `owner` waits in the queue of the lock stored at `lock_key`."""
    return _digest(lock_key, owner)


def place_key(prefix: str, place: str) -> str:
    """The key whose TTL keeps a waiter's place alive while the waiter refreshes it."""
    return f"{prefix}:place:{place}"


def fence_key(prefix: str) -> str:
    """The fencing counter: one per server and prefix, for every lock name."""
    return f"{prefix}:fence"


def cache_key(prefix: str, key: str) -> str:
    """Where cache entry `key` lives: `corral:cache:users:1`, or hashed as a lock name is."""
    return _key(prefix, "cache", key)


def generation_key(prefix: str, gen_key: str) -> str:
    """Where a cache namespace's generation counter lives: `corral:gen:<gen_key>`, or hashed."""
    return _key(prefix, "gen", gen_key)


# -- TTLs and values --------------------------------------------------------------


def server_ttl(seconds: float, what: str = "ttl") -> int:
    """The `T` token that keeps an item at least `seconds`: relative, else a Unix time.

    memcached reads a TTL above 30 days as a Unix time; for those, corral sends
    one computed on this client's clock (one second more, for its rounding), so a
    server clock ahead of ours ends such a lock early by the difference.
    """
    whole = math.ceil(round(seconds, 6)) + TTL_MARGIN
    if whole <= MAX_RELATIVE_TTL:
        return whole
    at = int(time.time()) + whole + 1
    if at > MAX_UNIX_TTL:
        raise ConfigError(
            f"{what} of {seconds!r} s would end after 2038-01-19, which memcached cannot express"
        )
    return at


def entry_ttl(keep: float) -> int:
    """The `T` token that keeps a cache entry at least `keep` seconds (`keep` > 0).

    As `server_ttl`, with one difference: an entry meant to outlive what memcached
    can express (past 2038, or forever) is sent `T0`, which memcached keeps until
    it is deleted or evicted, instead of being refused.
    """
    if not math.isfinite(keep):
        return 0
    whole = math.ceil(round(keep, 6)) + TTL_MARGIN
    if whole <= MAX_RELATIVE_TTL:
        return whole
    at = int(time.time()) + whole + 1
    return at if at <= MAX_UNIX_TTL else 0


def lease_left(reported: int) -> float:
    """What `inspect` shows: the remaining TTL minus the margin, i.e. what is left of the lease."""
    if reported < 0:
        return math.inf
    return float(max(reported - TTL_MARGIN, 0))


def encode_value(token: int, owner: str | None) -> bytes:
    tail = b"" if owner is None else owner.encode("utf-8", "surrogatepass")
    return b"%d:%s" % (token, tail)


def decode_value(raw: bytes) -> tuple[int, str | None] | None:
    """`(token, owner)` (owner None while closed by `hold_for`), or None for a foreign value."""
    token, sep, owner = raw.partition(b":")
    if not sep or not token.isdigit():
        return None
    try:
        text = owner.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return int(token), text or None


def encode_slot(token: int, limit: int, owner: str | None) -> bytes:
    """A taken slot: `<token>:<limit>:<owner>`, the owner empty while closed by `hold_for`."""
    tail = b"" if owner is None else owner.encode("utf-8", "surrogatepass")
    return b"%d:%d:%s" % (token, limit, tail)


def decode_slot(raw: bytes) -> tuple[int, int, str | None] | None:
    """`(token, limit, owner)` of a taken slot, or None for a foreign value."""
    token, sep, rest = raw.partition(b":")
    limit, sep2, owner = rest.partition(b":")
    if not (sep and sep2 and token.isdigit() and limit.isdigit()):
        return None
    try:
        text = owner.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return int(token), int(limit), text or None


# -- the protocol, with no I/O ----------------------------------------------------


class ProtocolError(Exception):
    """The server's bytes do not parse as memcached replies."""


class ServerRefused(Exception):
    """ERROR, CLIENT_ERROR or SERVER_ERROR: the server refused a command."""

    def __init__(self, line: bytes) -> None:
        super().__init__(line.decode("ascii", "replace"))
        self.line = line


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply: its code (`HD`, `VA`, `EN`, `NS`, `EX`, `NF`, ...), its tokens and value."""

    code: bytes
    tokens: tuple[bytes, ...] = ()
    value: bytes | None = None

    def flag(self, letter: str) -> bytes | None:
        """The argument of a returned flag (`c123` -> b"123"), or None when absent."""
        mark = letter.encode("ascii")
        for token in self.tokens:
            if token[:1] == mark:
                return token[1:]
        return None

    def number(self, letter: str) -> int:
        """A returned flag's numeric argument; ProtocolError if it is missing or not a number."""
        raw = self.flag(letter)
        if raw is not None:
            with contextlib.suppress(ValueError):
                return int(raw)
        raise ProtocolError(f"{self!r} lacks a numeric {letter!r} flag")


def request(command: str, key: str, *flags: str, data: bytes | None = None) -> bytes:
    """One meta command line (and its data block): `request("mg", key, "v", "c")`."""
    parts = [command, key]
    if data is not None:
        parts.append(str(len(data)))
    parts.extend(flags)
    line = " ".join(parts).encode("ascii") + b"\r\n"
    return line if data is None else line + data + b"\r\n"


class ReplyParser:
    """Bytes in, `Reply` objects out: the framing of memcached's text replies."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def pending(self) -> int:
        """Bytes received but not parsed yet."""
        return len(self._buffer)

    def next(self) -> Reply | None:
        """The next complete reply, or None until more bytes arrive.

        Raises `ServerRefused` for an error line, `ProtocolError` for garbage.
        """
        buffer = self._buffer
        end = buffer.find(b"\r\n")
        if end < 0:
            if len(buffer) > _MAX_LINE:
                raise ProtocolError("a reply line longer than 8 KiB: not a memcached server?")
            return None
        line = bytes(buffer[:end])
        tokens = line.split()
        if not tokens:
            raise ProtocolError("an empty reply line")
        code = tokens[0]
        if code in (b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR"):
            del buffer[: end + 2]
            raise ServerRefused(line)
        if code != b"VA":
            del buffer[: end + 2]
            return Reply(code, tuple(tokens[1:]))
        if len(tokens) < 2 or not tokens[1].isdigit():
            raise ProtocolError(f"a value reply without a length: {line!r}")
        size = int(tokens[1])
        start = end + 2
        total = start + size + 2
        if len(buffer) < total:
            return None
        if buffer[start + size : total] != b"\r\n":
            raise ProtocolError(f"a value of {size} bytes not followed by CRLF")
        value = bytes(buffer[start : start + size])
        del buffer[:total]
        return Reply(code, tuple(tokens[2:]), value)


# -- the waiting queue, with no I/O --------------------------------------------------


PLACEHOLDER_TTL = 3
"""Whole seconds a free lock's placeholder lives: room for the acquisition that follows its
probe (a round trip later), and soon gone when nobody acquires."""
CHECK_CHUNK = 16
"""Places checked per round trip when entries are ahead of the caller in the queue."""
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class QueueState:
    """A lock's queue as one read saw it: place ids in arrival order, its CAS and TTL."""

    entries: tuple[str, ...] = ()
    cas: int | None = None
    """None when there was no queue."""
    ttl: int = 0
    """Whole seconds it had left (memcached's `t`)."""

    @staticmethod
    def parse(value: bytes) -> tuple[str, ...] | None:
        """The place ids in a queue's value, or None if corral did not write it."""
        try:
            entries = tuple(value.decode("ascii").split(" "))
        except UnicodeDecodeError:
            return None
        if entries[-1:] != ("",) or not all(
            len(e) == 32 and _HEX.issuperset(e) for e in entries[:-1]
        ):
            return None
        return entries[:-1]

    @staticmethod
    def encode(entries: Sequence[str]) -> bytes:
        return "".join(f"{entry} " for entry in entries).encode("ascii")

    def ahead_of(self, place: str | None) -> tuple[str, ...]:
        """The entries before `place`'s first one (all of them if it has none)."""
        if place is not None and place in self.entries:
            return self.entries[: self.entries.index(place)]
        return self.entries

    def rewrite(self, key: str, kept: Sequence[str], min_ttl: int) -> bytes:
        """The compare-and-swap that leaves `kept` in the queue, no sooner gone than before."""
        if not kept:
            return request("md", key, f"C{self.cas}")
        ttl = max(self.ttl + 1, min_ttl, 1)  # +1: a tick may pass before the write lands
        return request("ms", key, f"C{self.cas}", f"T{ttl}", data=self.encode(kept))


@dataclass(frozen=True, slots=True)
class Place:
    id: str
    key: str
    ttl: int
    """The `T` that keeps it at least `queue_ttl` seconds."""


def join_requests(queue_key: str, place: Place) -> list[bytes]:
    """Append to the queue, else create it: one of the two stores, in one round trip."""
    entry = QueueState.encode([place.id])
    return [
        request("ms", queue_key, "MA", data=entry),
        request("ms", queue_key, "ME", f"T{place.ttl}", data=entry),
    ]


def joined(replies: Sequence[Reply]) -> bool:
    """Whether the append or the create of `join_requests` stored the entry."""
    return any(reply.code == b"HD" for reply in replies)


def holder_ttl(reply: Reply) -> float | None:
    """The holder's remaining TTL in whole seconds, margin included: waiters never spin on it."""
    remaining = reply.number("t")
    return float(remaining) if remaining >= 0 else None


# -- options and the URL ----------------------------------------------------------


OPTIONS: tuple[Option, ...] = (
    Option(
        "prefix",
        "`corral`",
        "starts every key corral writes, so applications can share "
        "one memcached without seeing each other's locks",
        "app",
    ),
    Option(
        "timeout",
        "5",
        "seconds one operation may take in all (waiting for a connection, "
        "connecting, TLS, every round trip) before BackendUnavailable",
        "2",
    ),
    Option(
        "max_connections",
        "no limit",
        "connections per store and process; when all are "
        "busy a caller waits for one, within `timeout`",
        "4",
    ),
    Option(
        "tls", "false", "TLS (memcached -Z), verifying the server against the system's CAs", "false"
    ),
    Option(
        "tls_ca_file", "none", "the CA bundle that signed the server's certificate (implies TLS)"
    ),
    Option(
        "tls_certfile",
        "none",
        "a client certificate, for a server that asks for one (ssl_verify_mode); implies TLS",
    ),
    Option("tls_keyfile", "none", "the client certificate's private key, if not in `tls_certfile`"),
    Option(
        "tls_context", "none", "a ready `ssl.SSLContext`, instead of the tls options", query=False
    ),
)
"""The options `connect()` takes for memcached, in the URL's query or as keywords."""


@dataclass(frozen=True, slots=True)
class MemcachedOptions:
    host: str
    port: int
    prefix: str = DEFAULT_PREFIX
    timeout: float = DEFAULT_TIMEOUT
    max_connections: int | None = None
    tls_context: ssl.SSLContext | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def server(self) -> str:
        """`memcached://[user@]host:port`, for messages: never the password."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.username}@" if self.username is not None else ""
        return f"memcached://{user}{host}:{self.port}"


def shown_url(url: str) -> str:
    """`url` fit for messages: everything between `user:` and the last `@` becomes `***`.

    Stricter than the shared `redact`, which cuts the host part at the first
    `/`: a password with an unencoded `/`, `?` or `#` must not show either.
    """
    scheme, sep, rest = url.partition("://")
    userinfo, at, after = rest.rpartition("@")
    if sep and at and ":" in userinfo:
        return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{after}"
    return redact(url)


def parse_url(url: str, options: Mapping[str, object]) -> MemcachedOptions:
    """`memcached://[user:password@]host[:port][?option=value&...]`, options also as keywords.

    Query options (`?timeout=2&tls=true`) exist so `CORRAL_URL` and `--url` can carry them.
    """
    shown = shown_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(f"{shown}: not a URL (a bracket or bad character in the host?)") from None
    if parts.scheme.lower() != "memcached":
        raise ConfigError(f"{shown}: not a memcached:// URL")
    if "@" in url.partition("://")[2] and "@" not in parts.netloc:
        # A password with an unencoded '/', '?' or '#' ends the host part early, and its
        # tail would be read as a path, an option or a port, and shown in messages.
        raise ConfigError(
            f"{shown}: '@' after the host: percent-encode '/', '?', '#' and '@' in the user "
            "name, the password or option values (%2F, %3F, %23, %40)"
        )
    if "," in parts.netloc:
        raise ConfigError(
            f"{shown}: one server's options were given a list of servers; open a pool "
            "with corral.connect(), which places each key on one of them"
        )
    if parts.path not in ("", "/") or parts.fragment:
        raise ConfigError(
            f"{shown}: memcached has no databases or paths; write memcached://host:port"
        )
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ConfigError(f"{shown}: the port must be a number from 0 to 65535") from None
    if not host:
        raise ConfigError(f"{shown}: no host; write memcached://host:port")
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    if (username is None) != (password is None) or (username is not None and not username):
        raise ConfigError(
            f"{shown}: memcached's text protocol authentication needs both a user and a "
            "password (memcached://user:password@host:port)"
        )
    if username is not None and (" " in username or "\n" in username or "\r" in username):
        raise ConfigError(f"{shown}: the user name must not contain spaces or line breaks")
    if password is not None and ("\n" in password or "\r" in password):
        raise ConfigError(f"{shown}: the password must not contain line breaks")
    in_query = {key for key, _ in parse_qsl(parts.query, keep_blank_values=True)}
    for option in OPTIONS:
        if not option.query and option.name in in_query:
            raise ConfigError(f"{shown}: {option.name} can only be passed as a keyword argument")
    given, _ = merge_options(shown, parts.query, options, OPTIONS, backend="memcached")
    try:
        return MemcachedOptions(
            host=host,
            port=port if port is not None else DEFAULT_PORT,
            prefix=check_prefix(given.get("prefix", DEFAULT_PREFIX)),
            timeout=check_timeout(given.get("timeout", DEFAULT_TIMEOUT)),
            max_connections=_max_connections(given.get("max_connections")),
            tls_context=_tls_context(given),
            username=username,
            password=password,
        )
    except ConfigError as exc:
        raise ConfigError(f"{shown}: {exc}") from None


def _max_connections(value: object) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"max_connections must be an integer >= 1 or None, got {value!r}")
    return value


def _flag(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ConfigError(f"{what} must be true or false, got {value!r}")


def _path(value: object, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} must be a file path, got {value!r}")
    return value


def _tls_context(given: Mapping[str, object]) -> ssl.SSLContext | None:
    ca_file = _path(given.get("tls_ca_file"), "tls_ca_file")
    cert_file = _path(given.get("tls_certfile"), "tls_certfile")
    key_file = _path(given.get("tls_keyfile"), "tls_keyfile")
    context = given.get("tls_context")
    files = ca_file is not None or cert_file is not None or key_file is not None
    wanted = _flag(given["tls"], "tls") if "tls" in given else None
    if context is not None:
        if not isinstance(context, ssl.SSLContext):
            raise ConfigError(f"tls_context must be an ssl.SSLContext, got {context!r}")
        if files:
            raise ConfigError(
                "tls_context already says which certificates to use; drop tls_ca_file, "
                "tls_certfile and tls_keyfile"
            )
        if wanted is False:
            raise ConfigError("tls=false contradicts tls_context")
        return context
    if wanted is False and files:
        raise ConfigError("tls=false contradicts the tls_* files given")
    if not (wanted or files):
        return None
    if key_file is not None and cert_file is None:
        raise ConfigError("tls_keyfile needs tls_certfile (the client certificate)")
    try:
        made = ssl.create_default_context(cafile=ca_file)
        if cert_file is not None:
            made.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificates ({exc})") from None
    return made


# -- what can go wrong on a connection ----------------------------------------------


class ConnectionClosed(Exception):
    """The server closed the connection."""


class StoreClosed(Exception):
    """The store was closed."""


class PoolExhausted(Exception):
    """Every connection stayed busy until the deadline."""


class TooOld(Exception):
    """The server predates the meta protocol corral needs."""


class CasDisabled(Exception):
    """The server runs with -C: every CAS reads 0, so compare-and-swap cannot work."""


def check_version(reply: Reply) -> None:
    """Refuse a memcached too old for the meta protocol; let an unparsable answer through."""
    found = _VERSION.search(b" ".join(reply.tokens)) if reply.code == b"VERSION" else None
    if found is not None and tuple(int(n) for n in found.groups()) < MIN_VERSION:
        raise TooOld(found.group(0).decode())


class _ForkAware(Protocol):
    def after_fork(self) -> None: ...


_FORK_AWARE: weakref.WeakSet[_ForkAware] = weakref.WeakSet()


def fork_aware(item: _ForkAware) -> None:
    """Call `item.after_fork()` in the child of every `fork` from now on."""
    _FORK_AWARE.add(item)


def _after_fork_in_child() -> None:
    for item in list(_FORK_AWARE):
        item.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
