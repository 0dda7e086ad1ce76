"""The stored entry format and its codecs: bytes in, bytes out, no server."""

from __future__ import annotations

import pickle

import pytest

from corral.core import envelope
from corral.core.envelope import (
    claim_due,
    decode,
    decode_header,
    encode,
    make_codec,
    mark_stale,
    remember_error,
)
from corral.errors import ConfigError, SerializationError

JSON = make_codec("json", None)
CODECS = {"j": JSON}


def test_round_trip_and_header_fields_at_fixed_offsets() -> None:
    data = encode({"a": [1, 2]}, JSON, "ns:k", fresh_until=1764000000.25, delta=0.05, generation=7)
    assert data[:2] == b"c1" and len(data) > envelope.HEADER_SIZE
    assert data[2:19] == b"1764000000.250000"
    assert data[19:36] == b"0000000000.000000"
    assert data[36:48] == b"00000.050000"
    assert data[48:64] == b"0000000000000007"
    assert data[64:66] == b"j\n"
    entry = decode(data, CODECS, "ns:k")
    assert entry.value == {"a": [1, 2]} and entry.header.generation == 7


def test_none_is_a_value() -> None:
    entry = decode(encode(None, JSON, "k", fresh_until=1, delta=0, generation=0), CODECS, "k")
    assert entry.has_value and entry.value is None


@pytest.mark.parametrize(
    "bad",
    [b"", b"garbage", b"c1" + b"x" * 70, b"c2" + b"0" * 64, pickle.dumps({"a": 1})],
    ids=["empty", "garbage", "bad-fields", "other-version", "bare-pickle"],
)
def test_foreign_bytes_do_not_decode(bad: bytes) -> None:
    assert decode_header(bad) is None
    with pytest.raises(ValueError):
        decode(bad, CODECS, "k")


def test_a_corrupt_payload_does_not_decode() -> None:
    data = encode([1], JSON, "k", fresh_until=1, delta=0, generation=0)
    with pytest.raises(ValueError):
        decode(data[:-1] + b"{", CODECS, "k")


def test_json_refuses_what_it_cannot_encode() -> None:
    with pytest.raises(SerializationError, match="'k'"):
        encode({1, 2}, JSON, "k", fresh_until=1, delta=0, generation=0)
    with pytest.raises(SerializationError):
        encode(float("nan"), JSON, "k", fresh_until=1, delta=0, generation=0)


def test_msgpack_round_trips_bytes() -> None:
    codec = make_codec("msgpack", None)
    data = encode({"b": b"\x00\xff"}, codec, "k", fresh_until=1, delta=0, generation=0)
    assert decode(data, {"m": codec}, "k").value == {"b": b"\x00\xff"}
    with pytest.raises(ValueError):
        decode(data, CODECS, "k")  # a JSON-only cache does not read msgpack


def test_pickle_needs_a_key_and_refuses_unsigned_or_foreign_entries() -> None:
    with pytest.raises(ConfigError, match="hmac_key"):
        make_codec("pickle", None)
    signed = make_codec("pickle", b"secret")
    data = encode({1, 2}, signed, "k", fresh_until=1, delta=0, generation=0)
    assert decode(data, {"p": signed}, "k").value == {1, 2}
    other_key = make_codec("pickle", b"another secret")
    with pytest.raises(ValueError, match="signature"):
        decode(data, {"p": other_key}, "k")
    with pytest.raises(ValueError, match="signature"):
        decode(data, {"p": signed}, "k2")  # copied under another key
    forged = data[: envelope.HEADER_SIZE] + b"\x00" * 32 + pickle.dumps("evil")
    with pytest.raises(ValueError, match="signature"):
        decode(forged, {"p": signed}, "k")


def test_unknown_serializer() -> None:
    with pytest.raises(ConfigError, match="unknown serializer"):
        make_codec("yaml", None)


def test_mark_stale_changes_only_fresh_until() -> None:
    data = encode("v", JSON, "k", fresh_until=1764000000.5, delta=0.2, generation=3)
    stale = mark_stale(data)
    assert stale is not None and stale[2:19] == b"0000000000.000000"
    assert stale[:2] == data[:2] and stale[19:] == data[19:]
    assert mark_stale(b"not ours") is None


def test_remember_error_keeps_the_previous_value() -> None:
    data = encode("v", JSON, "k", fresh_until=100.0, delta=0.2, generation=3)
    marker = remember_error(data, retry_until=500.0, generation=3, delta=0.0)
    entry = decode(marker, CODECS, "k")
    assert entry.value == "v" and entry.header.retry_until == 500.0
    assert entry.header.fresh_until == 100.0
    bare = decode(remember_error(None, retry_until=500.0, generation=3, delta=0), CODECS, "k")
    assert not bare.has_value and bare.header.retry_until == 500.0
    # A previous entry of another generation is not kept.
    other = decode(remember_error(data, retry_until=5.0, generation=4, delta=0), CODECS, "k")
    assert not other.has_value


def test_claim_due_rule() -> None:
    fresh = encode("v", JSON, "k", fresh_until=100.0, delta=0, generation=2)
    assert not claim_due(fresh, 2, 99.0)
    assert claim_due(fresh, 2, 100.0)
    assert claim_due(fresh, 3, 99.0)  # another generation
    assert claim_due(None, 0, 0.0)
    assert claim_due(b"foreign", 0, 0.0)
    held_back = remember_error(fresh, retry_until=200.0, generation=2, delta=0)
    assert not claim_due(held_back, 2, 150.0)
    assert claim_due(held_back, 2, 200.0)


def test_fields_are_clamped_not_overflowed() -> None:
    data = encode(
        "v", JSON, "k", fresh_until=float("inf"), delta=1e9, generation=10**20, retry_until=-5
    )
    header = decode_header(data)
    assert header is not None and len(data[: envelope.HEADER_SIZE]) == envelope.HEADER_SIZE
    assert header.fresh_until == pytest.approx(9_999_999_999.999999)
    assert header.retry_until == 0.0
