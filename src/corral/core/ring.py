"""Which server holds a key: the placement every multi-server store shares.

A `Ring` is pure: built once from a server list (and weights), it answers
`locate(key)` with arithmetic and a table lookup, never a connection, so
`corral cache where KEY` and the tests ask it exactly what a store would.
Four placements are offered, because each answers a different need:

``"ketama"`` (the default) is consistent hashing placed *exactly* as
libmemcached places keys in `MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED` mode with its
default MD5 hash (pylibmc with ``{"ketama_weighted": True}``; twemproxy's ketama
too), so corral can share a memcached pool with those clients and each key is
on the server they expect. The rule, checked key by key against pylibmc
(`tests/core/test_ring.py`):

- a server of weight `w` among `n` servers of total weight `W` gets
  ``floor(w / W * 160 / 4 * n) * 4`` points, computed in single-precision
  floats step by step (``(float)w / (float)W``, then ``* 160``, ``/ 4``,
  ``* (float)n``) as libmemcached's C does; exact arithmetic would differ
  for some weights;
- its points come four per MD5 digest of ``"host-i"`` for ``i = 0, 1, ...``,
  or ``"host:port-i"`` when the port is not 11211 (libmemcached's rule for
  the default port; libketama and uhashring always hash ``"host:port"``, so
  they disagree on pools on port 11211). An IPv6 host is hashed without its
  brackets. Each digest is read as four little-endian 32-bit integers;
- the points are sorted by value; equal values keep the order in which they
  were made (server order, then point order), as the merge sort behind
  glibc's `qsort` leaves them;
- a key's hash is the first four bytes of its MD5 digest, little-endian; the
  key goes to the first point at or after that hash, wrapping to the first
  point past the last.

``"rendezvous"`` (highest random weight) scores every server for each key and
takes the best: removing a server moves exactly that server's keys, and
`locate_n` is the top `n` scores, so a replica set is what the same ring
minus its first choices would pick. A score is a 64-bit BLAKE2b of
``server + "\\n" + key``; with weights it becomes ``-w / ln(u)``, with `u`
that hash scaled into (0, 1), which hands each server a share proportional
to its weight. It costs one hash per server per key.

``"maglev"`` is Google's Maglev lookup table (Eisenbud et al., NSDI 2016): a
prime-sized table (65,537 slots, or the first prime above 100 slots per
server for more than 655 servers) that the servers fill in turns, each
taking the next free slot of its own permutation (an offset and a skip drawn
from its name's hash). A lookup is one hash and one index, whatever the
number of servers, and the load is even to within a slot; a removal moves
the removed server's keys and only a few others. Weights give heavier
servers more turns: each round every server earns its weight and takes a
slot for each full measure of the heaviest weight earned.

``"modulo"`` is ``crc32(key) % n``, kept to show what consistent hashing
saves: removing one server of `n` moves about ``1 - 1/n`` of the keys.
Weights repeat a server (weights 2 and 1 mean the buckets ``[a, a, b]``).

Hashes come from the standard library only, chosen per job: MD5 where
libmemcached's placement must be reproduced bit for bit; BLAKE2b cut to 8
bytes where quality matters (a 64-bit hash makes the maglev index and the
rendezvous scores uniform for any key set, and it is the fastest good hash
`hashlib` has); CRC-32 for modulo, whose point is to be the naive baseline
that python-memcached-style clients use. Keys are hashed as UTF-8, with
lone surrogates passed through (as the store encodes them), so any `str` has
a place.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import re
import struct
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate
from operator import itemgetter
from types import MappingProxyType

from corral.errors import ConfigError

__all__ = ["HASHINGS", "Ring"]

HASHINGS = ("ketama", "rendezvous", "maglev", "modulo")

# libmemcached's `uint32_t` weight: a larger one could not be given to the other clients.
_MAX_WEIGHT = 2**32 - 1

_FORMS = "'host:port', 'ipv4:port' or '[ipv6]:port', with a port from 1 to 65535"
_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?", re.ASCII)
_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)

_U32 = struct.Struct("<I").unpack_from
_FOUR_U32 = struct.Struct("<4I").unpack
_U64 = struct.Struct("<Q").unpack_from
_TWO_U64 = struct.Struct("<2Q").unpack
_F32 = struct.Struct("<f")

# libmemcached's MEMCACHED_DEFAULT_PORT and MEMCACHED_POINTS_PER_SERVER_KETAMA.
_KETAMA_DEFAULT_PORT = 11211
_KETAMA_POINTS = 160

_MAGLEV_SIZE = 65537
_MAGLEV_SLOTS_PER_SERVER = 100

# Empty hash states, copied for each key: a fresh object costs more to build (keyword
# parsing) than a copy. MD5 is for placement, not security: FIPS builds refuse it
# unless told so.
_BLAKE8 = hashlib.blake2b(digest_size=8)
_MD5 = hashlib.md5(usedforsecurity=False)


def _md5(data: bytes) -> bytes:
    state = _MD5.copy()
    state.update(data)
    return state.digest()


class Ring:
    """Where each key lives among `servers`, by one of the `HASHINGS`.

    Immutable: `without()` returns another ring (routing around a down
    server), so a router can swap rings atomically while other threads keep
    locating with the old one.
    """

    __slots__ = ("_find", "_hashing", "_prefer", "_servers", "_weights", "_without")

    def __init__(
        self,
        servers: Sequence[str],
        hashing: str = "ketama",
        weights: Mapping[str, int] | Sequence[int] | None = None,
    ) -> None:
        self._servers = _check_servers(servers)
        if not isinstance(hashing, str) or hashing not in HASHINGS:
            raise ConfigError(
                f"hashing must be one of {', '.join(map(repr, HASHINGS))}, not {hashing!r}"
            )
        self._hashing = hashing
        weight_list = _check_weights(weights, self._servers)
        self._weights = MappingProxyType(dict(zip(self._servers, weight_list, strict=True)))
        placement = _PLACEMENTS[hashing](self._servers, weight_list)
        self._find: Callable[[bytes], str] = placement.find
        self._prefer: Callable[[bytes, int], list[str]] = placement.prefer
        self._without: dict[str, Ring] = {}

    @property
    def servers(self) -> tuple[str, ...]:
        return self._servers

    @property
    def hashing(self) -> str:
        return self._hashing

    @property
    def weights(self) -> Mapping[str, int]:
        """Every server's weight, 1 where none was given (libmemcached's default)."""
        return self._weights

    def __len__(self) -> int:
        return len(self._servers)

    def __contains__(self, server: object) -> bool:
        return server in self._weights

    def __repr__(self) -> str:
        weights = set(self._weights.values())
        shown = "" if weights == {1} else f", weights={dict(self._weights)!r}"
        return f"Ring({list(self._servers)!r}, hashing={self._hashing!r}{shown})"

    def locate(self, key: str) -> str:
        """The server that holds `key`, exactly as it was given."""
        if not isinstance(key, str):
            raise TypeError(f"key must be str, not {type(key).__name__}")
        try:
            data = key.encode()
        except UnicodeEncodeError:
            data = key.encode("utf-8", "surrogatepass")
        return self._find(data)

    def locate_n(self, key: str, n: int) -> list[str]:
        """`n` distinct servers for `key`, best first: where its replicas go.

        The first is `locate(key)`. The rest follow each hashing's own notion
        of "next": ketama walks the continuum clockwise skipping servers
        already chosen (with equal weights, what `without()` of the earlier
        choices would pick); rendezvous takes the next best scores (always
        what `without()` would pick); maglev walks the table forward from the
        key's slot skipping servers already chosen (a neighbouring slot's
        owner is as good as random, so replicas spread evenly); modulo takes
        the key modulo the servers not yet chosen (what `without()` would
        pick). A server that owns no point or slot at all (a weight tiny
        beside the others) comes last, in list order.
        """
        if not isinstance(key, str):
            raise TypeError(f"key must be str, not {type(key).__name__}")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ConfigError(f"the number of servers must be an int, not {n!r}")
        if not 1 <= n <= len(self._servers):
            raise ConfigError(
                f"cannot place key {key!r} on {n} distinct servers: the ring has "
                f"{len(self._servers)} ({', '.join(self._servers)})"
            )
        try:
            data = key.encode()
        except UnicodeEncodeError:
            data = key.encode("utf-8", "surrogatepass")
        return self._prefer(data, n)

    def without(self, server: str) -> Ring:
        """The same ring minus `server`: where keys go while it is down.

        Rings are immutable, so the answer is kept: a router that marks the
        same server down again does not rebuild a maglev table (tens of
        milliseconds) each time.
        """
        ring = self._without.get(server)
        if ring is not None:
            return ring
        if server not in self._weights:
            raise ConfigError(f"server {server!r} is not in the ring ({', '.join(self._servers)})")
        if len(self._servers) == 1:
            raise ConfigError(f"cannot remove {server!r}, the ring's only server")
        rest = [s for s in self._servers if s != server]
        ring = Ring(rest, self._hashing, [self._weights[s] for s in rest])
        self._without[server] = ring
        return ring


# -- input checks -----------------------------------------------------------------------


def _check_servers(servers: object) -> tuple[str, ...]:
    if isinstance(servers, (str, bytes)) or not isinstance(servers, Iterable):
        raise ConfigError(f"servers must be a list of {_FORMS} strings, not {servers!r}")
    checked: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    for entry in servers:
        host, port = _split_server(entry)
        # Two spellings of one server would split its keys between two "servers".
        identity = (_canonical_host(host), port)
        if identity in seen:
            if seen[identity] == entry:
                raise ConfigError(f"server {entry!r} is listed twice")
            raise ConfigError(f"servers {seen[identity]!r} and {entry!r} are the same server")
        seen[identity] = entry
        checked.append(entry)
    if not checked:
        raise ConfigError(f"a ring needs at least one server ({_FORMS})")
    return tuple(checked)


def _split_server(entry: object) -> tuple[str, int]:
    """`(host, port)` of a "host:port" entry; the host of "[::1]:11211" is "::1"."""
    bad = ConfigError(f"server {entry!r} is not one of the accepted forms: {_FORMS}")
    if not isinstance(entry, str):
        raise bad
    host, sep, port_text = entry.rpartition(":")
    if not sep or not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
        raise bad
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad from None
    elif not _HOSTNAME.fullmatch(host):
        # Also refuses an unbracketed IPv6 address: its last group would pass for a port.
        raise bad
    return host, int(port_text)


def _canonical_host(host: str) -> str:
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower()


def _check_weights(
    weights: Mapping[str, int] | Sequence[int] | None, servers: tuple[str, ...]
) -> list[int]:
    if weights is None:
        return [1] * len(servers)
    if isinstance(weights, Mapping):
        unknown = [s for s in weights if s not in servers]
        if unknown:
            raise ConfigError(
                f"weights name {unknown[0]!r}, which is not among the servers "
                f"({', '.join(servers)})"
            )
        values = [weights.get(s, 1) for s in servers]
    elif isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError(
            f"weights must be a mapping server -> int or a list of ints, not {weights!r}"
        )
    else:
        values = list(weights)
        if len(values) != len(servers):
            raise ConfigError(
                f"{len(values)} weights for {len(servers)} servers: give one per server"
            )
    for server, weight in zip(servers, values, strict=True):
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int)
            or not 1 <= weight <= _MAX_WEIGHT
        ):
            raise ConfigError(
                f"the weight of server {server!r} must be an int from 1 to {_MAX_WEIGHT}, "
                f"not {weight!r}"
            )
    return values


# -- placements ---------------------------------------------------------------------------
#
# Each takes the key's UTF-8 bytes: `Ring` checks and encodes once, in one place.


def _f32(value: float) -> float:
    """`value` rounded to a C `float`, as libmemcached computes point counts."""
    rounded: float = _F32.unpack(_F32.pack(value))[0]
    return rounded


def ketama_points(weight: int, total_weight: int, servers: int) -> int:
    """libmemcached's number of continuum points for one weighted server.

    Every step is rounded to single precision, as C does with `float`
    operands (each product or quotient of two floats is exact in a double,
    so rounding it once gives C's answer). The final ``+ 1e-10`` is added in
    double precision and then rounded back, as in the C expression.
    """
    share = _f32(_f32(float(weight)) / _f32(float(total_weight)))
    quarter = _f32(_f32(_f32(share * _KETAMA_POINTS) / 4) * _f32(float(servers)))
    return math.floor(_f32(quarter + 0.0000000001)) * 4


def ketama_name(server: str) -> str:
    """The string a server's points are hashed from, before its "-i" suffix."""
    host, port = _split_server(server)
    return host if port == _KETAMA_DEFAULT_PORT else f"{host}:{port}"


class _Ketama:
    def __init__(self, servers: tuple[str, ...], weights: list[int]) -> None:
        total = sum(weights)
        points: list[tuple[int, int]] = []
        for index, (server, weight) in enumerate(zip(servers, weights, strict=True)):
            name = ketama_name(server)
            for i in range(ketama_points(weight, total, len(servers)) // 4):
                for value in _FOUR_U32(_md5(f"{name}-{i}".encode())):
                    points.append((value, index))
        # Python's sort is stable, like the merge sort glibc's qsort uses: on a tie the
        # point made first (the earlier server) comes first, and wins the arc before it.
        points.sort(key=itemgetter(0))
        self._values = [value for value, _ in points]
        owners = [servers[index] for _, index in points]
        # One more owner past the end, the first: a hash past the last point wraps to it
        # without a test in `find`.
        self._owners = (*owners, owners[0])
        self._servers = servers

    def find(self, key: bytes) -> str:
        state = _MD5.copy()
        state.update(key)
        return self._owners[bisect_left(self._values, _U32(state.digest())[0])]

    def prefer(self, key: bytes, n: int) -> list[str]:
        owners = self._owners
        count = len(self._values)
        start = bisect_left(self._values, _U32(_md5(key))[0])
        chosen: list[str] = []
        for step in range(count):
            server = owners[(start + step) % count]
            if server not in chosen:
                chosen.append(server)
                if len(chosen) == n:
                    return chosen
        return _complete(chosen, self._servers, n)


class _Rendezvous:
    def __init__(self, servers: tuple[str, ...], weights: list[int]) -> None:
        self._servers = servers
        # The server's name and a separator no name contains, hashed once; each key
        # continues a copy of that state.
        self._prefixes = []
        for server in servers:
            state = _BLAKE8.copy()
            state.update(server.encode() + b"\n")
            self._prefixes.append(state)
        self._weighted = len(set(weights)) > 1
        self._weights = [float(w) for w in weights]

    def _scores(self, key: bytes) -> Sequence[float]:
        hashes = []
        for prefix in self._prefixes:
            state = prefix.copy()
            state.update(key)
            hashes.append(_U64(state.digest())[0])
        if not self._weighted:
            # -1 / ln(u) grows with u: with equal weights the raw hash ranks the same.
            return hashes
        # The top 53 bits and a half: a double in (0, 1), never 0 or 1, whose log is < 0.
        return [
            -weight / math.log(((h >> 11) + 0.5) / 9007199254740992.0)
            for weight, h in zip(self._weights, hashes, strict=True)
        ]

    def find(self, key: bytes) -> str:
        scores = self._scores(key)
        return self._servers[scores.index(max(scores))]

    def prefer(self, key: bytes, n: int) -> list[str]:
        scores = self._scores(key)
        # Stable: an (all but impossible) tie goes to the server listed first, as in find.
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        return [self._servers[i] for i in order[:n]]


def maglev_size(servers: int) -> int:
    """65,537 slots, or the first prime above 100 slots per server beyond 655 servers.

    Maglev's paper asks for a table much larger than the server count (at
    least 100 times) so that shares differ by at most 1%; 65,537 is a prime
    that keeps that for up to 655 servers in half a megabyte.
    """
    size = max(_MAGLEV_SIZE, _MAGLEV_SLOTS_PER_SERVER * servers)
    while not _is_prime(size):
        size += 1
    return size


def _is_prime(number: int) -> bool:
    if number < 2:
        return False
    return all(number % d for d in range(2, math.isqrt(number) + 1))


class _Maglev:
    def __init__(self, servers: tuple[str, ...], weights: list[int]) -> None:
        size = maglev_size(len(servers))
        positions: list[int] = []
        skips: list[int] = []
        for server in servers:
            first, second = _TWO_U64(hashlib.blake2b(server.encode(), digest_size=16).digest())
            positions.append(first % size)
            skips.append(second % (size - 1) + 1)
        owner = [-1] * size
        heaviest = max(weights)
        credit = [0] * len(servers)
        filled = 0
        everyone = range(len(servers))
        while filled < size:
            for i in everyone:
                # A server earns its weight each round and takes a turn for each full
                # `heaviest` earned: the heaviest every round, one of half its weight
                # every other round.
                credit[i] += weights[i]
                if credit[i] < heaviest:
                    continue
                credit[i] -= heaviest
                # Its next preference (offset + j * skip, mod size) that is still free;
                # `size` is prime, so the walk visits every slot before repeating.
                position, skip = positions[i], skips[i]
                while owner[position] >= 0:
                    position += skip
                    if position >= size:
                        position -= size
                owner[position] = i
                position += skip
                positions[i] = position - size if position >= size else position
                filled += 1
                if filled == size:
                    break
        self._table = tuple(servers[i] for i in owner)
        self._size = size
        self._servers = servers

    def find(self, key: bytes) -> str:
        state = _BLAKE8.copy()
        state.update(key)
        slot: int = _U64(state.digest())[0] % self._size
        return self._table[slot]

    def prefer(self, key: bytes, n: int) -> list[str]:
        state = _BLAKE8.copy()
        state.update(key)
        table, size = self._table, self._size
        start = _U64(state.digest())[0] % size
        chosen: list[str] = []
        for step in range(size):
            server = table[(start + step) % size]
            if server not in chosen:
                chosen.append(server)
                if len(chosen) == n:
                    return chosen
        return _complete(chosen, self._servers, n)


class _Modulo:
    def __init__(self, servers: tuple[str, ...], weights: list[int]) -> None:
        self._servers = servers
        self._weights = weights
        buckets = _buckets(weights)
        self._plain = buckets[-1] == len(servers)
        self._ends = buckets

    def find(self, key: bytes) -> str:
        if self._plain:
            return self._servers[zlib.crc32(key) % len(self._servers)]
        return self._servers[bisect_right(self._ends, zlib.crc32(key) % self._ends[-1])]

    def prefer(self, key: bytes, n: int) -> list[str]:
        crc = zlib.crc32(key)
        servers = list(self._servers)
        weights = list(self._weights)
        chosen: list[str] = []
        while len(chosen) < n:
            ends = _buckets(weights)
            index = bisect_right(ends, crc % ends[-1])
            chosen.append(servers.pop(index))
            weights.pop(index)
        return chosen


def _buckets(weights: list[int]) -> list[int]:
    """Where each server's run of buckets ends, when each is repeated `weight` times.

    Bucket b belongs to the first server whose end exceeds b: the buckets of
    "repeat each server", without building them. Weights are divided by their
    greatest common divisor first, so weights 2, 2, 2 place keys as no weights.
    """
    divisor = math.gcd(*weights)
    return list(accumulate(weight // divisor for weight in weights))


def _complete(chosen: list[str], servers: tuple[str, ...], n: int) -> list[str]:
    for server in servers:
        if len(chosen) == n:
            break
        if server not in chosen:
            chosen.append(server)
    return chosen


_Placement = _Ketama | _Rendezvous | _Maglev | _Modulo

_PLACEMENTS: dict[str, Callable[[tuple[str, ...], list[int]], _Placement]] = {
    "ketama": _Ketama,
    "rendezvous": _Rendezvous,
    "maglev": _Maglev,
    "modulo": _Modulo,
}
