"""Key placement: the same answer everywhere, and libmemcached's answer for ketama.

Placement is a promise to every process sharing a pool: a key must be found
where another client (or another corral version) put it. So beyond the
algorithms' properties these tests pin placements, and check ketama key by
key against libmemcached itself, through pylibmc, without a server:
`pylibmc.Client.hash(key)` is libmemcached's `memcached_generate_hash`, the
index of the server a key goes to (the slow test below confirms that on real
memcached processes).
"""

from __future__ import annotations

import importlib
import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from corral import Ring
from corral.aio import Ring as AsyncRing
from corral.core.ring import HASHINGS, ketama_name, ketama_points
from corral.errors import ConfigError

FIVE = [f"10.0.0.{i}:11211" for i in range(1, 6)]


def make_keys(count: int, seed: int = 7) -> list[str]:
    """Keys as applications write them, and odd ones: long, non-ASCII, punctuation.

    No spaces or control characters, which memcached refuses as keys (the slow
    test stores these keys on real servers).
    """
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + ":_-./|#é日本🙂"
    keys = [f"user:{i}:profile" for i in range(count // 2)]
    while len(keys) < count:
        keys.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 120))))
    return keys


def require(module: str) -> Any:
    """The module, or a skip (a failure in CI: the comparison must not vanish quietly)."""
    from tests.conftest import server_missing

    try:
        return importlib.import_module(module)
    except ImportError:
        server_missing(f"{module} is not installed (pip install {module})")
        raise


# -- the same answer everywhere ---------------------------------------------------------

# Placements users' data already depends on: changing any of them moves keys in every
# deployed pool, so it must be a deliberate, announced change. Indices into FIVE.
PINNED_KEYS = ["user:1", "user:2", "session:abc", "日本", "\ud800", "", "x" * 200, "a b"]
PINNED = {
    ("ketama", None): [1, 3, 2, 3, 1, 1, 0, 0],
    ("rendezvous", None): [2, 1, 2, 0, 0, 1, 1, 2],
    ("maglev", None): [4, 1, 4, 4, 0, 1, 0, 0],
    ("modulo", None): [2, 1, 1, 1, 0, 0, 2, 4],
    ("ketama", (1, 2, 3, 4, 5)): [1, 3, 2, 3, 1, 1, 0, 4],
    ("rendezvous", (1, 2, 3, 4, 5)): [2, 1, 2, 4, 0, 1, 3, 4],
    ("maglev", (1, 2, 3, 4, 5)): [4, 4, 4, 4, 4, 1, 4, 0],
    ("modulo", (1, 2, 3, 4, 5)): [4, 1, 1, 4, 4, 0, 1, 4],
}


@pytest.mark.parametrize(("hashing", "weights"), list(PINNED))
def test_placement_is_pinned(hashing: str, weights: tuple[int, ...] | None) -> None:
    ring = Ring(FIVE, hashing, weights)
    assert [FIVE.index(ring.locate(key)) for key in PINNED_KEYS] == PINNED[hashing, weights]


@pytest.mark.parametrize("hashing", HASHINGS)
def test_two_rings_of_the_same_servers_agree(hashing: str) -> None:
    """Nothing depends on the process: no `hash()`, no randomness, no order of building."""
    first, second = Ring(FIVE, hashing), Ring(tuple(FIVE), hashing)
    keys = make_keys(2000)
    assert [first.locate(k) for k in keys] == [second.locate(k) for k in keys]
    assert all(first.locate(k) in FIVE for k in keys)


def test_the_server_comes_back_as_given() -> None:
    servers = ["Cache-A.example:11211", "[::1]:11212", "10.0.0.9:22122"]
    ring = Ring(servers, weights={"[::1]:11212": 3})
    assert set(map(ring.locate, make_keys(500))) == set(servers)
    assert ring.servers == tuple(servers) and ring.hashing == "ketama"
    assert dict(ring.weights) == {servers[0]: 1, servers[1]: 3, servers[2]: 1}
    assert AsyncRing is Ring and len(ring) == 3 and "[::1]:11212" in ring


@pytest.mark.parametrize("hashing", HASHINGS)
def test_any_str_has_a_place_even_a_lone_surrogate(hashing: str) -> None:
    ring = Ring(FIVE, hashing)
    for key in ["", "\ud800", "a\udcffb", "\x00"]:
        assert ring.locate(key) == ring.locate_n(key, 3)[0]


# -- replicas and removals ----------------------------------------------------------------


@pytest.mark.parametrize("hashing", HASHINGS)
@pytest.mark.parametrize("weights", [None, [1, 2, 3, 4, 5]], ids=["equal", "weighted"])
def test_locate_n_gives_distinct_servers_first_the_primary(
    hashing: str, weights: list[int] | None
) -> None:
    ring = Ring(FIVE, hashing, weights)
    for key in make_keys(300):
        for n in range(1, 6):
            chosen = ring.locate_n(key, n)
            assert len(chosen) == n == len(set(chosen))
            assert chosen[0] == ring.locate(key)
            # Asking for more extends the list rather than reshuffling it.
            assert ring.locate_n(key, 5)[:n] == chosen


@pytest.mark.parametrize(
    ("hashing", "weights"),
    [("rendezvous", None), ("rendezvous", [1, 2, 3, 4, 5]), ("modulo", None),
     ("modulo", [1, 2, 3, 4, 5]), ("ketama", None)],
)  # fmt: skip
def test_the_next_replica_is_where_the_key_goes_without_the_first(
    hashing: str, weights: list[int] | None
) -> None:
    """A replica is already where a key falls back to when its server is marked down."""
    ring = Ring(FIVE, hashing, weights)
    for key in make_keys(500):
        first, second, third = ring.locate_n(key, 3)
        assert ring.without(first).locate(key) == second
        assert ring.without(first).without(second).locate(key) == third


def test_replicas_spread_evenly() -> None:
    """The keys of one server must not all put their second copy on the same neighbour."""
    for hashing in HASHINGS:
        ring = Ring(FIVE, hashing)
        seconds = Counter(
            ring.locate_n(k, 2)[1] for k in make_keys(20000) if ring.locate(k) == FIVE[0]
        )
        assert len(seconds) == 4, hashing
        assert max(seconds.values()) < 2 * min(seconds.values()), (hashing, seconds)


@pytest.mark.parametrize("hashing", ["ketama", "rendezvous", "maglev"])
@pytest.mark.parametrize("weights", [None, [1, 2, 3, 4, 5]], ids=["equal", "weighted"])
def test_removing_a_server_moves_only_its_keys(hashing: str, weights: list[int] | None) -> None:
    """Maglev may move a few others (its table is refilled), ketama and rendezvous none."""
    ring = Ring(FIVE, hashing, weights)
    smaller = ring.without(FIVE[2])
    keys = make_keys(20000)
    others_moved = sum(
        1 for k in keys if ring.locate(k) != FIVE[2] and smaller.locate(k) != ring.locate(k)
    )
    if hashing == "maglev":
        assert others_moved / len(keys) < 0.01
    elif hashing == "rendezvous" or weights is None:
        assert others_moved == 0
    else:
        # Weighted ketama gives every remaining server a new share of 160 x n points,
        # as libmemcached does, so a few keys move between them too.
        assert others_moved / len(keys) < 0.1
    assert FIVE[2] not in smaller and smaller.weights == {
        s: w for s, w in ring.weights.items() if s != FIVE[2]
    }


def test_modulo_moves_most_keys() -> None:
    """The point of keeping it: what consistent hashing saves."""
    ring = Ring(FIVE, "modulo")
    smaller = ring.without(FIVE[4])
    keys = make_keys(10000)
    moved = sum(ring.locate(k) != smaller.locate(k) for k in keys) / len(keys)
    assert 0.75 < moved < 0.85


def test_without_is_kept() -> None:
    ring = Ring(FIVE, "maglev")
    assert ring.without(FIVE[0]) is ring.without(FIVE[0])


@pytest.mark.parametrize("hashing", HASHINGS)
def test_weights_set_each_servers_share(hashing: str) -> None:
    servers, weights = FIVE[:4], [1, 2, 3, 4]
    ring = Ring(servers, hashing, weights)
    keys = make_keys(40000)
    counts = Counter(map(ring.locate, keys))
    # Ketama's 160 points per server leave its shares a few percent off (libmemcached's
    # too); the others are as even as the key sample.
    tolerance = 0.2 if hashing == "ketama" else 0.05
    for server, weight in zip(servers, weights, strict=True):
        share = counts[server] / len(keys) / (weight / sum(weights))
        assert abs(share - 1) < tolerance, (server, share)


@pytest.mark.parametrize("hashing", HASHINGS)
def test_equal_weights_are_no_weights(hashing: str) -> None:
    keys = make_keys(2000)
    plain, scaled = Ring(FIVE, hashing), Ring(FIVE, hashing, [7] * 5)
    assert [plain.locate(k) for k in keys] == [scaled.locate(k) for k in keys]


def test_maglev_is_even_across_many_servers() -> None:
    servers = [f"cache{i}:11211" for i in range(50)]
    ring = Ring(servers, "maglev")
    counts = Counter(ring._find.__self__._table)  # type: ignore[attr-defined]
    assert max(counts.values()) - min(counts.values()) <= 1


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    ["cache", "cache:", "cache:0", "cache:65536", "cache:-1", "cache:\uff11\uff12", "::1:11211",
     "[::1]", "[nothost]:11211", "[::1:11211", "ca che:11211", "-cache:11211",
     "host:11211:2", "", "memcached://a:11211"],
)  # fmt: skip
def test_a_bad_server_is_named_with_the_accepted_forms(entry: str) -> None:
    with pytest.raises(ConfigError, match=r"'\[ipv6\]:port'") as caught:
        Ring(["good:11211", entry])
    assert repr(entry) in str(caught.value)


def test_good_server_forms() -> None:
    Ring(["a:1", "a-b.c_d:65535", "10.0.0.1:11211", "[::1]:11211", "[fe80::1%eth0]:11211"])


@pytest.mark.parametrize(
    "servers",
    [["a:11211", "a:11211"], ["a:11211", "A:11211"], ["[::1]:1", "[0::1]:1"]],
)
def test_one_server_twice_is_refused(servers: list[str]) -> None:
    with pytest.raises(ConfigError, match=re.escape(repr(servers[1]))):
        Ring(servers)


@pytest.mark.parametrize("servers", [[], "a:11211,b:11211", [b"a:11211"], ["a:11211", 11211], 3])
def test_servers_must_be_a_list_of_strings(servers: Any) -> None:
    with pytest.raises(ConfigError, match="host:port"):
        Ring(servers)


@pytest.mark.parametrize(
    ("weights", "match"),
    [({"nope:1": 2}, "'nope:1'"), ([1, 2], "2 weights for 3"), ([1, 0, 1], "'b:1'"),
     ([1, -2, 1], "'b:1'"), ([1, True, 1], "'b:1'"), ([1, 1.5, 1], "'b:1'"),
     ([1, 2**32, 1], "'b:1'"), ("abc", "mapping"), ({"a:1": "2"}, "'a:1'")],
)  # fmt: skip
def test_bad_weights(weights: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Ring(["a:1", "b:1", "c:1"], weights=weights)


def test_bad_hashing() -> None:
    with pytest.raises(ConfigError, match="'ketama', 'rendezvous', 'maglev', 'modulo'"):
        Ring(FIVE, "consistent")


@pytest.mark.parametrize("hashing", HASHINGS)
def test_a_key_must_be_str(hashing: str) -> None:
    ring = Ring(FIVE, hashing)
    for key in [b"user:1", 1, None]:
        with pytest.raises(TypeError, match="str"):
            ring.locate(key)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="str"):
            ring.locate_n(key, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, -1, 6, True, 2.0])
def test_locate_n_needs_a_count_the_ring_can_meet(n: Any) -> None:
    with pytest.raises(ConfigError):
        Ring(FIVE).locate_n("k", n)


def test_without_needs_a_server_of_the_ring_and_leaves_one() -> None:
    with pytest.raises(ConfigError, match="'x:1' is not in the ring"):
        Ring(FIVE).without("x:1")
    with pytest.raises(ConfigError, match="only server"):
        Ring(["a:1"]).without("a:1")


# -- ketama is libmemcached's ---------------------------------------------------------------

# Weights for which single-precision arithmetic gives some servers 4 points fewer than
# exact arithmetic would (4w * 110 / 110 rounds to just under 4w): libmemcached's count.
FLOAT_WEIGHTS = [4, 12, 4, 20, 2, 10, 9, 15, 10, 16, 8]

# Two servers whose continuums share one point (2622159953): the arc before it goes to
# the server listed first, because glibc's qsort (a merge sort) keeps equal points in
# the order they were made. A glibc whose qsort is not stable (2.37 and 2.38 used
# introsort) could decide otherwise; 2.39 restored the merge sort.
TIED = ["alpha:11211", "b12726:11211"]

LIBMEMCACHED_CASES: dict[str, tuple[list[str], list[int] | None]] = {
    "five-on-11211": (FIVE, None),
    "one-host-five-ports": ([f"127.0.0.1:{p}" for p in range(21201, 21206)], None),
    "mixed-ports-names-ipv6": (
        ["cache-a.example:11211", "cache-b.example:22122", "[::1]:11211", "[fe80::2]:11300",
         "10.1.2.3:11212", "10.1.2.4:11211"],
        None,
    ),
    "weighted": (
        ["10.0.0.1:11211", "10.0.0.2:11212", "cache-c:11211", "[2001:db8::1]:11213"],
        [1, 2, 5, 3],
    ),
    "weighted-many": ([f"shard{i}.example:{11211 + i % 3}" for i in range(17)],
                      [1 + (i * 7) % 13 for i in range(17)]),
    "single-precision-counts": ([f"10.1.0.{i}:11211" for i in range(11)], FLOAT_WEIGHTS),
    "tied-points": (TIED, None),
    "tied-points-reversed": (TIED[::-1], None),
    "one-server": (["only:11211"], None),
}  # fmt: skip


def libmemcached_placement(
    pylibmc: Any, servers: Sequence[str], weights: Sequence[int] | None, keys: list[str]
) -> list[str]:
    """Where libmemcached's weighted ketama puts each key, asked of pylibmc without a server."""
    specs = [
        server if weights is None else f"{server}:{weight}"
        for server, weight in zip(servers, weights or [1] * len(servers), strict=True)
    ]
    client = pylibmc.Client(specs, behaviors={"ketama_weighted": True})
    assert client.behaviors["hash"] == "md5"
    return [servers[client.hash(key)] for key in keys]


@pytest.mark.parametrize("case", list(LIBMEMCACHED_CASES))
def test_ketama_places_every_key_where_libmemcached_does(case: str) -> None:
    pylibmc = require("pylibmc")
    servers, weights = LIBMEMCACHED_CASES[case]
    keys = make_keys(5000)
    ring = Ring(servers, "ketama", weights)
    assert [ring.locate(k) for k in keys] == libmemcached_placement(pylibmc, servers, weights, keys)
    # And with each server gone, as libmemcached rebuilds its continuum without it.
    for gone in servers if len(servers) > 1 else []:
        rest = [s for s in servers if s != gone]
        rest_weights = None if weights is None else [ring.weights[s] for s in rest]
        assert [ring.without(gone).locate(k) for k in keys] == libmemcached_placement(
            pylibmc, rest, rest_weights, keys
        ), gone


def test_the_tie_and_single_precision_cases_do_test_something() -> None:
    """Guards the two cases above against silently becoming ordinary ones."""
    ring = Ring(TIED)
    values = ring._find.__self__._values  # type: ignore[attr-defined]
    assert values.count(2622159953) == 2
    assert ketama_points(4, sum(FLOAT_WEIGHTS), 11) == 60  # 4 / 110 * 160 * 11 = 64 exactly
    assert ketama_points(1, 3, 3) == 160


def test_ketama_names_a_default_port_server_by_its_host() -> None:
    assert ketama_name("cache:11211") == "cache"
    assert ketama_name("cache:11212") == "cache:11212"
    assert ketama_name("[::1]:11211") == "::1"
    assert ketama_name("[::1]:11300") == "::1:11300"


def test_ketama_agrees_with_uhashring_where_they_hash_the_same_names() -> None:
    """uhashring's ketama is libketama's: every server hashed as "host:port", 11211 too.

    libmemcached (and twemproxy, and so corral) hash a server on 11211 by its host
    alone, so the two disagree on a pool on the default port, and agree on other
    ports, or when uhashring's nodes are named as libmemcached names them. uhashring
    also computes point counts exactly rather than in single precision, and sends a
    key hashing exactly onto a point to the next one; neither shows with these
    weights and keys.
    """
    uhashring = require("uhashring")
    keys = make_keys(5000)
    other_ports = [f"10.0.0.{i}:{11300 + i}" for i in range(1, 6)]
    for servers, weights in [(other_ports, None), (other_ports, [1, 2, 3, 4, 5])]:
        ring = Ring(servers, "ketama", weights)
        nodes = {s: {"weight": w} for s, w in ring.weights.items()}
        theirs = uhashring.HashRing(nodes=nodes, hash_fn="ketama")
        assert [ring.locate(k) for k in keys] == [theirs.get_node(k) for k in keys]

    ring = Ring(FIVE, "ketama")
    as_given = uhashring.HashRing(nodes=FIVE, hash_fn="ketama")
    assert sum(ring.locate(k) != as_given.get_node(k) for k in keys) > len(keys) / 2
    by_host = uhashring.HashRing(nodes=[ketama_name(s) for s in FIVE], hash_fn="ketama")
    assert [ketama_name(ring.locate(k)) for k in keys] == [by_host.get_node(k) for k in keys]


@pytest.mark.slow
def test_pylibmc_hash_is_the_server_that_stores_the_key(tmp_path: Path) -> None:
    """The comparison above trusts `Client.hash`; here real servers say where keys went.

    Keys are set through pylibmc on three memcached processes (weighted), then
    each server is asked directly which keys it holds.
    """
    pylibmc = require("pylibmc")
    from corral.testing.servers import MemcachedServer, free_port, require_binary

    try:
        require_binary("memcached")
    except Exception as exc:
        from tests.conftest import server_missing

        server_missing(f"memcached is not installed: {exc}")
    servers: list[MemcachedServer] = []
    try:
        for i in range(3):
            workdir = tmp_path / f"m{i}"
            workdir.mkdir()
            server = MemcachedServer(workdir, free_port())
            servers.append(server)
            server.start()
        names = [f"{s.host}:{s.port}" for s in servers]
        weights = [1, 2, 3]
        keys = make_keys(1500)
        client = pylibmc.Client(
            [f"{n}:{w}" for n, w in zip(names, weights, strict=True)],
            behaviors={"ketama_weighted": True},
        )
        client.set_multi(dict.fromkeys(keys, b"1"))
        held: dict[str, str] = {}
        for name in names:
            for key in pylibmc.Client([name]).get_multi(keys):
                held[key] = name
        ring = Ring(names, "ketama", weights)
        assert held == {k: names[client.hash(k)] for k in keys}
        assert held == {k: ring.locate(k) for k in keys}
    finally:
        for server in servers:
            server.stop()
