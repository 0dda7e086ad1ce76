"""`corral cache get|set|delete|stats|where`: look at and change a cache's entries from the shell.

For whoever is on call ("what does the cache hold for user:42?", "drop it") and
for scripts. `get` prints the value as JSON on stdout and nothing else, so it
pipes into `jq`; every other message is one line on stderr. A missing entry is
exit status 1, as grep's "nothing found", not an error of the command.

`get` reads the entry with the backend's own read (one round trip, the
namespace's generation in the same answer), so it can say how long the value
stays fresh without counting a hit or a miss anywhere; `set` and `delete` go
through the cache itself, exactly as a program's writes do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

import corral
from corral.cli._common import (
    COMMON_STATUSES,
    EX_CONFIG,
    EX_UNAVAILABLE,
    CliError,
    add_url_argument,
    choose_store,
    open_store,
    seconds,
)
from corral.core.envelope import Codec, Entry, decode, make_codec
from corral.core.ring import HASHINGS, Ring
from corral.errors import BackendError, ConfigError, SerializationError

__all__ = ["EX_MISSING", "NAME", "add_parser"]

NAME = "cache"

# grep's "nothing found": the entry is not there, or (get) not fresh without --stale.
EX_MISSING = 1

EPILOG = f"""\
exit status:
  0    done (get: the value was printed)
  1    get: no such entry (or only a stale one, without --stale); delete: nothing was there
{COMMON_STATUSES}

Keys live in a namespace (--namespace, default "default"), as with
store.cache(namespace): the key KEY of namespace NS is the entry a program reads
with corral.connect(URL).cache(NS).get(KEY).
"""


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="read, write, delete a cache entry; show a namespace's stats",
        description="Read, write and delete the entries of a corral cache, and show what the\n"
        "server can say about a namespace.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.set_defaults(handler=_usage(parser))
    verbs = parser.add_subparsers(title="commands", metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--namespace",
        metavar="NS",
        default="default",
        help="the cache's namespace, as in store.cache(NS) (default: default)",
    )
    add_url_argument(common)

    def verb(name: str, help: str, description: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = verbs.add_parser(
            name,
            parents=[common],
            help=help,
            description=description,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
        return sub

    get = verb(
        "get",
        "print an entry's value as JSON",
        "Print the value of KEY as JSON on stdout; exit 1 when there is no fresh value\n"
        "(with --stale, a stale value is printed too).",
    )
    get.add_argument("key", metavar="KEY")
    get.add_argument("--stale", action="store_true", help="print a stale value too")
    get.add_argument(
        "--json",
        action="store_true",
        help='print one object: {"key", "namespace", "server", "value", "fresh", '
        '"fresh_for" (seconds, negative once stale), "generation"}',
    )
    get.set_defaults(handler=cache_get)

    put = verb(
        "set",
        "store a value",
        "Store VALUE under KEY, fresh for --ttl seconds. VALUE is stored as a string;\n"
        "with --json it is parsed as JSON first (a number, a list, an object...).",
    )
    put.add_argument("key", metavar="KEY")
    put.add_argument("value", metavar="VALUE")
    put.add_argument(
        "--ttl",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds the value stays fresh (default: 300)",
    )
    put.add_argument("--json", action="store_true", help="parse VALUE as JSON")
    put.set_defaults(handler=cache_set)

    delete = verb(
        "delete",
        "remove an entry",
        "Remove KEY (fresh or stale) for every client; exit 1 when nothing was there.",
    )
    delete.add_argument("key", metavar="KEY")
    delete.set_defaults(handler=cache_delete)

    stats = verb(
        "stats",
        "show what the server can say about a namespace",
        "Show the namespace's generation (bumped by every cache.clear(), which hides every\n"
        "older entry at once) and how many entries the server holds under the namespace,\n"
        "where it can count them (not memcached): fresh and stale ones, and those written\n"
        "before the last clear() until they expire.",
    )
    stats.add_argument(
        "--json",
        action="store_true",
        help='print one object: {"namespace", "server", "generation", "entries" (null '
        "where the server cannot count)}",
    )
    stats.set_defaults(handler=cache_stats)

    where = verb(
        "where",
        "print the server that holds an entry",
        "Print the server that holds KEY: the store's own answer, or with --servers the\n"
        "answer of a ring of those servers, without connecting to anything. The key\n"
        "placed is the key as stored (NS:KEY), or the shard key given with --shard-key.",
    )
    where.add_argument("key", metavar="KEY")
    where.add_argument(
        "--shard-key",
        metavar="S",
        default=None,
        help="the entry is placed by this shard key (shard_key= in the program)",
    )
    where.add_argument(
        "--servers",
        metavar="H:P,H:P",
        default=None,
        help="answer for a pool of these servers, in this order, without connecting",
    )
    where.add_argument(
        "--hashing",
        choices=HASHINGS,
        default=None,
        help="with --servers: how the pool places keys (default: ketama)",
    )
    where.add_argument(
        "--weights",
        metavar="W,W",
        default=None,
        help="with --servers: one weight per server, in the same order (default: all 1)",
    )
    where.add_argument(
        "--json",
        action="store_true",
        help='print one object: {"key", "namespace", "stored", "placed_by", "server", '
        '"servers" (the ring\'s, or the store\'s), "hashing" (null for a store)}',
    )
    where.set_defaults(handler=cache_where)


def _usage(parser: argparse.ArgumentParser) -> Any:
    def handler(args: argparse.Namespace) -> int:
        parser.print_help()
        return EX_CONFIG

    return handler


def _open(args: argparse.Namespace) -> tuple[corral.Store, corral.Cache]:
    """The store and the namespace's cache; the store is closed if the cache is refused."""
    store = open_store(choose_store(args.url))
    try:
        cache = store.cache(args.namespace)
    except ConfigError as exc:
        store.close()
        where = f"cache namespace {args.namespace!r} on {store.server}"
        raise CliError(f"{where}: {exc}", EX_CONFIG) from exc
    except BaseException:
        store.close()
        raise
    return store, cache


def _where(store: corral.Store, cache: corral.Cache, key: str) -> str:
    return f"cache key {key!r} in namespace {cache.namespace!r} on {store.server}"


def _readers() -> dict[str, Codec]:
    """The codecs `get` reads: JSON, and msgpack where it is installed.

    Signed pickles need the writer's hmac_key, which a shell command should not
    hold: `get` says so instead of printing them.
    """
    codecs = {"j": make_codec("json", None)}
    with contextlib.suppress(ConfigError):
        codecs["m"] = make_codec("msgpack", None)
    return codecs


def _read(store: corral.Store, cache: corral.Cache, key: str) -> tuple[Entry | None, int]:
    """The entry of `key` as the server holds it (None if missing), and the generation.

    An entry written before the namespace's last clear() is gone for readers,
    as it is for the cache itself.
    """
    stored = cache.stored_key(key)
    # The namespace's generation is kept under the namespace's own name.
    (data,), generation = store.backend.cache_fetch([stored], cache.namespace)
    if data is None:
        return None, generation
    try:
        entry = decode(data, _readers(), stored)
    except ValueError as exc:
        raise CliError(
            f"{_where(store, cache, key)}: holds an entry this command cannot read ({exc})",
            EX_MISSING,
        ) from exc
    if entry.header.generation != generation:
        return None, generation
    return entry, generation


def _json(value: Any, where: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CliError(f"{where}: the value cannot be shown as JSON ({exc})", EX_MISSING) from exc


def _unavailable(where: str, exc: BackendError, server: str, name: str) -> CliError:
    """The server's failure, naming the key (or namespace) and the server once."""
    text = str(exc)
    if server in text and repr(name) in text:
        return CliError(text, EX_UNAVAILABLE)  # the backend's message names both already
    return CliError(f"{where}: {text}", EX_UNAVAILABLE)


def cache_get(args: argparse.Namespace) -> int:
    key: str = args.key
    store, cache = _open(args)
    where = _where(store, cache, key)
    with store:
        try:
            entry, generation = _read(store, cache, key)
        except BackendError as exc:
            raise _unavailable(where, exc, store.server, cache.stored_key(key)) from exc
        now = store.wall_clock.now()
    if entry is None:
        raise CliError(f"{where}: not found", EX_MISSING)
    header = entry.header
    if not entry.has_value:
        retry_in = max(0.0, header.retry_until - now)
        raise CliError(
            f"{where}: holds no value, only the note that its computation failed "
            f"(retries are held back {seconds(retry_in)} more)",
            EX_MISSING,
        )
    fresh_for = header.fresh_until - now
    if fresh_for <= 0 and not args.stale:
        raise CliError(
            f"{where}: only a stale value is left, stale for {seconds(-fresh_for)} "
            "(give --stale to print it)",
            EX_MISSING,
        )
    if args.json:
        shown = {
            "key": key,
            "namespace": cache.namespace,
            "server": store.server,
            "value": entry.value,
            "fresh": fresh_for > 0,
            "fresh_for": round(fresh_for, 3),
            "generation": generation,
        }
        print(_json(shown, where))
    else:
        print(_json(entry.value, where))
    return 0


def cache_set(args: argparse.Namespace) -> int:
    key: str = args.key
    value: Any = args.value
    store, cache = _open(args)
    where = _where(store, cache, key)
    with store:
        if args.json:
            try:
                value = json.loads(args.value)
            except ValueError as exc:
                raise CliError(
                    f"{where}: VALUE is not JSON ({exc}); without --json it is stored as a string",
                    EX_CONFIG,
                ) from exc
        try:
            cache.set(key, value, ttl=args.ttl)
        except (ConfigError, SerializationError) as exc:
            raise CliError(f"{where}: {exc}", EX_CONFIG) from exc
        # A cache drops a write the server refused (programs go on without it); a
        # command asked to write must say it did not.
        if cache.stats().get("backend_errors", 0):
            raise CliError(
                f"{where}: the write failed, nothing was stored (the server failed; see "
                "the warning above)",
                EX_UNAVAILABLE,
            )
    print(f"{where}: stored, fresh for {seconds(args.ttl)}")
    return 0


def cache_delete(args: argparse.Namespace) -> int:
    key: str = args.key
    store, cache = _open(args)
    where = _where(store, cache, key)
    with store:
        try:
            found = cache.delete(key)
        except BackendError as exc:
            raise _unavailable(where, exc, store.server, cache.stored_key(key)) from exc
    if not found:
        raise CliError(f"{where}: nothing to delete", EX_MISSING)
    print(f"{where}: deleted")
    return 0


def cache_stats(args: argparse.Namespace) -> int:
    store, cache = _open(args)
    where = f"cache namespace {cache.namespace!r} on {store.server}"
    with store:
        try:
            _, generation = store.backend.cache_fetch([], cache.namespace)
            entries = store.backend.cache_count(cache.stored_key(""))
        except BackendError as exc:
            raise _unavailable(where, exc, store.server, cache.namespace) from exc
    if args.json:
        print(
            json.dumps(
                {
                    "namespace": cache.namespace,
                    "server": store.server,
                    "generation": generation,
                    "entries": entries,
                }
            )
        )
        return 0
    counted = "unknown (the server cannot count them)" if entries is None else str(entries)
    print(f"{where}: generation {generation}, entries stored: {counted}")
    return 0


def _ring(args: argparse.Namespace) -> Ring:
    servers = [word.strip() for word in args.servers.split(",")]
    weights: list[int] | None = None
    if args.weights is not None:
        try:
            weights = [int(word) for word in args.weights.split(",")]
        except ValueError:
            raise CliError(
                f"--weights {args.weights!r}: give whole numbers, one per server (3,1,1)",
                EX_CONFIG,
            ) from None
    try:
        return Ring(servers, args.hashing or "ketama", weights)
    except ConfigError as exc:
        raise CliError(f"--servers {args.servers!r}: {exc}", EX_CONFIG) from exc


def cache_where(args: argparse.Namespace) -> int:
    key: str = args.key
    shard: str | None = args.shard_key
    if args.servers is None and (args.weights is not None or args.hashing is not None):
        raise CliError(
            "--hashing and --weights describe a pool given with --servers; without "
            "--servers the store answers for itself",
            EX_CONFIG,
        )
    if args.servers is not None:
        if args.url is not None:
            raise CliError(
                "give --url (ask the store) or --servers (ask a ring of those servers), not both",
                EX_CONFIG,
            )
        ring = _ring(args)
        try:
            # The namespace is checked as the cache checks it, on a store of nothing.
            with corral.connect("memory://") as scratch:
                cache = scratch.cache(args.namespace)
                stored = cache.stored_key(key)
        except ConfigError as exc:
            raise CliError(f"cache namespace {args.namespace!r}: {exc}", EX_CONFIG) from exc
        placed_by = stored if shard is None else shard
        server = ring.locate(placed_by)
        servers = list(ring.servers)
        hashing: str | None = ring.hashing
        origin = f"a {ring.hashing} ring of {len(ring)} servers"
    else:
        store, cache = _open(args)
        with store:
            stored = cache.stored_key(key)
            placed_by = stored if shard is None else shard
            server = store.backend.locate(placed_by)
            servers = list(store.backend.servers)
        hashing = None
        origin = store.server
    if args.json:
        print(
            json.dumps(
                {
                    "key": key,
                    "namespace": args.namespace,
                    "stored": stored,
                    "placed_by": placed_by,
                    "server": server,
                    "servers": servers,
                    "hashing": hashing,
                },
                ensure_ascii=False,
            )
        )
        return 0
    by = f"placed by shard key {shard!r}" if shard is not None else f"stored as {stored!r}"
    print(f"cache key {key!r} in namespace {args.namespace!r} ({by}) on {origin}: {server}")
    return 0
