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

from corral.errors import ConfigError

__all__ = ["BACKENDS", "BackendSpec", "default_url", "redact", "resolve"]


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
}

PLANNED = {
    "redis+cluster": "Redis Cluster",
    "redis+redlock": "Redlock over independent Redis masters",
}


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
        return BACKENDS[scheme]
    if scheme in PLANNED:
        raise ConfigError(
            f"{redact(url)}: the {PLANNED[scheme]} backend is not available in this "
            "version of corral yet; use one of: " + ", ".join(f"{n}://" for n in BACKENDS)
        )
    known = ", ".join(f"{name}://" for name in BACKENDS)
    raise ConfigError(f"{redact(url)}: unknown or missing URL scheme; expected one of {known}")


def redact(url: str) -> str:
    """The URL with any password replaced, fit for logs, reprs and error messages.

    Works on multi-host URLs (`etcd://user:pw@h1:1,h2:2`) too, which urllib
    refuses to parse as a whole.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    # The user info ends at the last "@" before the query: a password may hold a "/"
    # that was not percent-encoded, so the first "/" does not end it.
    before_query, question, query = rest.partition("?")
    userinfo, at, after = before_query.rpartition("@")
    if at and ":" in userinfo:
        before_query = f"{userinfo.split(':', 1)[0]}:***@{after}"
    query = re.sub(r"(?i)((?:ssl)?password=)[^&]*", r"\1***", query)
    return f"{scheme}://{before_query}{question}{query}"
