"""URL schemes to backend modules, and the parsing every backend shares.

Backend modules are imported only when their scheme is used, so `pip install
corral` works without redis-py, psycopg and the rest; a missing extra gives a
ConfigError that says which extra to install.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from corral.errors import ConfigError

__all__ = [
    "BACKENDS",
    "POOLED",
    "BackendSpec",
    "check_userinfo",
    "default_url",
    "pool_hosts",
    "redact",
    "resolve",
]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    module: str
    """Module under `corral._async.backends` / `corral._sync.backends`."""
    cls: str
    """Class name in the async flavour (the sync one drops the `Async` prefix)."""
    extra: str | None
    """The pip extra that brings the client library, if any."""
    clients: tuple[str, ...] = ()
    """Top-level modules of that client library: their absence means the extra is missing."""


BACKENDS: dict[str, BackendSpec] = {
    "memory": BackendSpec("memory", "AsyncMemoryBackend", None),
    "sqlite": BackendSpec("sqlite", "AsyncSQLiteBackend", None),
    "redis": BackendSpec("redis", "AsyncRedisBackend", "redis", ("redis",)),
    "rediss": BackendSpec("redis", "AsyncRedisBackend", "redis", ("redis",)),
    "memcached": BackendSpec("memcached", "AsyncMemcachedBackend", None),
    "etcd": BackendSpec("etcd", "AsyncEtcdBackend", "etcd", ("httpx",)),
    "etcds": BackendSpec("etcd", "AsyncEtcdBackend", "etcd", ("httpx",)),
    "postgresql": BackendSpec("postgres", "AsyncPostgresBackend", "postgres", ("psycopg",)),
    "postgres": BackendSpec("postgres", "AsyncPostgresBackend", "postgres", ("psycopg",)),
    "redis+redlock": BackendSpec("redlock", "AsyncRedlockBackend", "redis", ("redis",)),
    "rediss+redlock": BackendSpec("redlock", "AsyncRedlockBackend", "redis", ("redis",)),
    "redis+cluster": BackendSpec("redis_cluster", "AsyncRedisClusterBackend", "redis", ("redis",)),
    "rediss+cluster": BackendSpec("redis_cluster", "AsyncRedisClusterBackend", "redis", ("redis",)),
}

# Schemes whose URL may list several servers (`memcached://a:11211,b:11211`): a pool of
# one-server backends, placed by a ring (`corral._async.backends.pool`).
POOLED = ("memcached", "redis", "rediss")
POOL = BackendSpec("pool", "AsyncPoolBackend", None)

# Schemes named in the docs that this version does not offer yet.
PLANNED: dict[str, str] = {}


def default_url() -> str:
    """`CORRAL_URL`, else an SQLite file in the user's cache directory (XDG)."""
    env = os.environ.get("CORRAL_URL")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return f"sqlite:///{Path(base).absolute() / 'corral' / 'corral.db'}"


def resolve(url: str) -> BackendSpec:
    if not isinstance(url, str):
        raise TypeError(f"url must be str, not {type(url).__name__}")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in BACKENDS:
        spec = BACKENDS[scheme]
        if scheme in POOLED and pool_hosts(url):
            return BackendSpec(POOL.module, POOL.cls, spec.extra, spec.clients)
        return spec
    if scheme in PLANNED:
        raise ConfigError(
            f"{redact(url)}: the {PLANNED[scheme]} backend is not available in this "
            "version of corral yet; use one of: " + ", ".join(f"{n}://" for n in BACKENDS)
        )
    known = ", ".join(f"{name}://" for name in BACKENDS)
    raise ConfigError(f"{redact(url)}: unknown or missing URL scheme; expected one of {known}")


def pool_hosts(url: str) -> list[str]:
    """The servers of a URL that lists several (`scheme://[user@]a:1,b:2/...`), else []."""
    rest = url.partition("://")[2]
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    hosts = netloc.rpartition("@")[2]
    return hosts.split(",") if "," in hosts else []


def redact(url: str) -> str:
    """The URL with any password replaced, fit for logs, reprs and error messages.

    Works on multi-host URLs (`etcd://user:pw@h1:1,h2:2`) too, which urllib
    refuses to parse as a whole.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    # A password may hold a "/", "?" or "#" that was not percent-encoded, so only the
    # last "@" surely ends the user info. When an "@" follows one of those characters
    # it is ambiguous (a password, or an "@" in a path or query): hide it all, since
    # showing too little beats showing a password.
    userinfo, at, after = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{after}"
    before_query, question, query = rest.partition("?")
    query = re.sub(r"(?i)((?:ssl)?password=)[^&]*", r"\1***", query)
    # A pool's gutter is a URL of its own, percent-encoded in the query when given as a
    # keyword: its password is hidden the same way.
    query = re.sub(
        r"(?i)(gutter=)([^&]*)",
        lambda m: m.group(1) + quote(redact(unquote(m.group(2))), safe=":/,*"),
        query,
    )
    return f"{scheme}://{before_query}{question}{query}"


def check_userinfo(url: str, shown: str) -> None:
    """Refuse a URL whose user info holds an unencoded "/", "?" or "#".

    Such a password ends the host part early for every URL parser: the client
    would connect somewhere else and show the password's tail as a host, a path
    or an option. Says so without quoting any part of it.
    """
    rest = url.partition("://")[2]
    first = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    if first >= 0 and "@" in rest[first:]:
        raise ConfigError(
            f"{shown}: an '@' comes after the host part: if it belongs to a user name or "
            "password, percent-encode the reserved characters in them ('@' as %40, '/' as "
            "%2F, '?' as %3F, '#' as %23, ':' in a user name as %3A)"
        )
