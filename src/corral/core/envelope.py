"""The bytes a cache entry is stored as: a fixed-width ASCII header, then the value.

Why fixed width and ASCII: the servers themselves read the header. A Redis
script, an SQL statement or an etcd comparison decides in the same round trip
as the read whether the entry is due for a recompute (and then tries the
recompute lock), and `invalidate` rewrites the freshness field in place,
atomically, without decoding the value. So every field sits at a known offset
and parses as a decimal number in Lua (`tonumber(string.sub(...))`) and SQL
(`CAST(substr(...) AS REAL)`) alike.

Layout (0-based offsets, lengths in bytes)::

    0   2  b"c1"            magic and format version
    2  17  fresh_until      %017.6f, wall-clock seconds: fresh before this
    19 17  retry_until      %017.6f, no recompute before this (a remembered error), else 0
    36 12  delta            %012.6f, seconds the computation took (XFetch's delta)
    48 16  generation       %016d, the namespace generation the entry was written under
    64  1  codec            j json, m msgpack, p pickle signed with HMAC-SHA256, n no value
    65  1  b"\\n"
    66  -  payload          the encoded value (for p: 32 bytes of MAC, then the pickle)

Anything else (another magic, a short header, a bad MAC, a codec this process
was not configured for) decodes as "no entry": a cache read never crashes on
what another writer left.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import pickle
from dataclasses import dataclass
from typing import Any, Final

from corral.errors import ConfigError, SerializationError

__all__ = [
    "CODECS",
    "HEADER_SIZE",
    "Codec",
    "Entry",
    "EntryHeader",
    "claim_due",
    "decode",
    "decode_header",
    "encode",
    "make_codec",
    "mark_stale",
    "remember_error",
    "with_generation",
]

MAGIC: Final = b"c1"
HEADER_SIZE: Final = 66
FRESH_AT: Final = slice(2, 19)
RETRY_AT: Final = slice(19, 36)
DELTA_AT: Final = slice(36, 48)
GENERATION_AT: Final = slice(48, 64)
CODEC_AT: Final = 64
NO_VALUE: Final = "n"
MAC_SIZE: Final = 32
_MAX_TIME = 9_999_999_999.999999
_MAX_DELTA = 99_999.999999
_MAX_GENERATION = 10**16 - 1


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """What the header says, without the value: enough for the cache policy."""

    fresh_until: float
    retry_until: float
    delta: float
    generation: int
    codec: str

    @property
    def has_value(self) -> bool:
        return self.codec != NO_VALUE


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded entry: its header and the value (None may be the value itself)."""

    header: EntryHeader
    value: Any

    @property
    def has_value(self) -> bool:
        return self.header.has_value


class Codec:
    """Turns values into bytes and back; one letter in the header says which codec wrote them."""

    letter: str = "?"
    name: str = "?"

    def dumps(self, value: Any, key: str) -> bytes:
        raise NotImplementedError

    def loads(self, data: bytes, key: str) -> Any:
        raise NotImplementedError


class JsonCodec(Codec):
    letter = "j"
    name = "json"

    def dumps(self, value: Any, key: str) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"cache key {key!r}: the json serializer cannot encode a "
                f"{type(value).__name__} ({exc}); return JSON types from compute, or pick "
                "serializer='msgpack' or 'pickle' (with hmac_key)"
            ) from exc

    def loads(self, data: bytes, key: str) -> Any:
        return json.loads(data)


class MsgpackCodec(Codec):
    letter = "m"
    name = "msgpack"

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError as exc:
            raise ConfigError(
                "serializer='msgpack' needs the msgpack extra: pip install 'corral[msgpack]'"
            ) from exc
        self._msgpack = msgpack

    def dumps(self, value: Any, key: str) -> bytes:
        try:
            packed: bytes = self._msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(
                f"cache key {key!r}: msgpack cannot encode a {type(value).__name__} ({exc})"
            ) from exc
        return packed

    def loads(self, data: bytes, key: str) -> Any:
        return self._msgpack.unpackb(data, raw=False)


class SignedPickleCodec(Codec):
    """Pickle, only ever read back when an HMAC made with the user's key vouches for it.

    Unpickling runs code chosen by whoever wrote the bytes; in a shared cache
    that is anyone who can reach the server. The MAC covers the entry's key as
    well, so a signed entry copied under another key is refused too.
    """

    letter = "p"
    name = "pickle"

    def __init__(self, hmac_key: bytes) -> None:
        self._key = hmac_key

    def _mac(self, data: bytes, key: str) -> bytes:
        message = b"corral-cache\x00" + key.encode("utf-8", "surrogatepass") + b"\x00" + data
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def dumps(self, value: Any, key: str) -> bytes:
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SerializationError(
                f"cache key {key!r}: pickle cannot encode a {type(value).__name__} ({exc})"
            ) from exc
        return self._mac(data, key) + data

    def loads(self, data: bytes, key: str) -> Any:
        mac, body = data[:MAC_SIZE], data[MAC_SIZE:]
        if len(mac) != MAC_SIZE or not hmac.compare_digest(mac, self._mac(body, key)):
            raise ValueError("the entry's signature does not match (unsigned, or another key)")
        return pickle.loads(body)


CODECS: Final = ("json", "msgpack", "pickle")


def make_codec(serializer: str, hmac_key: bytes | str | None) -> Codec:
    """The codec a cache was configured with; `ConfigError` for anything unusable."""
    if serializer == "json":
        return JsonCodec()
    if serializer == "msgpack":
        return MsgpackCodec()
    if serializer == "pickle":
        if not hmac_key:
            raise ConfigError(
                "serializer='pickle' needs hmac_key=...: entries are signed so that a "
                "reader never unpickles bytes it did not write (see docs/cache.md)"
            )
        if isinstance(hmac_key, str):
            hmac_key = hmac_key.encode()
        if not isinstance(hmac_key, bytes):
            raise ConfigError(f"hmac_key must be bytes or str, got {type(hmac_key).__name__}")
        return SignedPickleCodec(hmac_key)
    raise ConfigError(f"unknown serializer {serializer!r}; use one of {', '.join(CODECS)}")


def _field(value: float, width: int, ceiling: float) -> bytes:
    if not math.isfinite(value):
        value = ceiling if value > 0 else 0.0
    value = min(max(value, 0.0), ceiling)
    return b"%0*.6f" % (width, value)


def header_bytes(
    *, fresh_until: float, retry_until: float, delta: float, generation: int, codec: str
) -> bytes:
    generation = min(max(int(generation), 0), _MAX_GENERATION)
    return b"".join(
        (
            MAGIC,
            _field(fresh_until, 17, _MAX_TIME),
            _field(retry_until, 17, _MAX_TIME),
            _field(delta, 12, _MAX_DELTA),
            b"%016d" % generation,
            codec.encode("ascii"),
            b"\n",
        )
    )


def encode(
    value: Any,
    codec: Codec | None,
    key: str,
    *,
    fresh_until: float,
    delta: float,
    generation: int,
    retry_until: float = 0.0,
) -> bytes:
    """The stored bytes of an entry; `codec=None` stores no value (an error marker alone).

    Raises `SerializationError` (nothing is written then) when the value cannot be encoded.
    """
    payload = b"" if codec is None else codec.dumps(value, key)
    header = header_bytes(
        fresh_until=fresh_until,
        retry_until=retry_until,
        delta=delta,
        generation=generation,
        codec=NO_VALUE if codec is None else codec.letter,
    )
    return header + payload


def decode_header(data: bytes) -> EntryHeader | None:
    """The header of stored bytes, or None when they are not a corral entry of this format."""
    if len(data) < HEADER_SIZE or data[:2] != MAGIC or data[HEADER_SIZE - 1 : HEADER_SIZE] != b"\n":
        return None
    try:
        return EntryHeader(
            fresh_until=float(data[FRESH_AT]),
            retry_until=float(data[RETRY_AT]),
            delta=float(data[DELTA_AT]),
            generation=int(data[GENERATION_AT]),
            codec=data[CODEC_AT : CODEC_AT + 1].decode("ascii"),
        )
    except (ValueError, UnicodeDecodeError):
        return None


def decode(data: bytes, codecs: dict[str, Codec], key: str) -> Entry:
    """Decode stored bytes with the codecs this cache accepts (by header letter).

    Raises `ValueError` with the reason when the bytes are not usable; the
    cache counts that as a miss and logs it.
    """
    header = decode_header(data)
    if header is None:
        raise ValueError("not a corral cache entry of format c1 (corrupt, foreign or older)")
    if not header.has_value:
        return Entry(header, None)
    codec = codecs.get(header.codec)
    if codec is None:
        raise ValueError(f"written with codec {header.codec!r}, which this cache does not read")
    try:
        value = codec.loads(data[HEADER_SIZE:], key)
    except Exception as exc:
        raise ValueError(f"the value does not decode: {exc}") from exc
    return Entry(header, value)


def mark_stale(data: bytes) -> bytes | None:
    """The same entry with fresh_until set to 0 (what `invalidate` writes), or None if not ours.

    Backends that cannot rewrite the field on the server (compare-and-swap
    ones) use this; the others do the same splice in a script or statement.
    """
    if decode_header(data) is None:
        return None
    return data[: FRESH_AT.start] + _field(0.0, 17, _MAX_TIME) + data[FRESH_AT.stop :]


def claim_due(data: bytes | None, generation: int, due_before: float) -> bool:
    """Whether a read that found `data` should try the recompute lock (see `Claim`).

    What the servers' scripts and statements compute too: missing, written
    under another generation, not ours, or neither fresh nor held back by a
    remembered error at `due_before`.
    """
    if data is None:
        return True
    header = decode_header(data)
    if header is None or header.generation != generation:
        return True
    return max(header.fresh_until, header.retry_until) <= due_before


def remember_error(
    previous: bytes | None, *, retry_until: float, generation: int, delta: float
) -> bytes:
    """An entry that says "the computation failed; try again after retry_until".

    It keeps the previous entry's value (and freshness) when that entry is ours
    and of this generation, so stale readers are still served meanwhile.
    """
    header = decode_header(previous) if previous is not None else None
    if previous is not None and header is not None and header.generation == generation:
        return (
            header_bytes(
                fresh_until=header.fresh_until,
                retry_until=retry_until,
                delta=header.delta,
                generation=generation,
                codec=header.codec,
            )
            + previous[HEADER_SIZE:]
        )
    return header_bytes(
        fresh_until=0.0, retry_until=retry_until, delta=delta, generation=generation, codec=NO_VALUE
    )


def with_generation(data: bytes, generation: int) -> bytes:
    """The same entry written under another namespace generation (the field is fixed-width)."""
    generation = min(max(int(generation), 0), _MAX_GENERATION)
    return data[: GENERATION_AT.start] + b"%016d" % generation + data[GENERATION_AT.stop :]
