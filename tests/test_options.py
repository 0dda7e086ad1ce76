"""Connection options: the same rules on every backend, and the docs table matches the code.

Every option a backend declares is accepted in the URL's query and as a keyword,
is checked by `connect()` before anything is sent, and an unknown one is a
ConfigError that names the accepted ones.
"""

from __future__ import annotations

import importlib

import pytest

import corral
from corral.backends.registry import BACKENDS
from corral.core.options import Option
from corral.errors import ConfigError
from tests.conftest import SCHEMES


def declared_options(backend_name: str) -> tuple[Option, ...]:
    spec = BACKENDS[SCHEMES[backend_name]]
    module = importlib.import_module(f"corral._async.backends.{spec.module}")
    options: tuple[Option, ...] = getattr(module, spec.cls).url_options
    return options


def with_query(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


NETWORKED = ("sqlite", "redis", "memcached", "etcd", "etcd-cluster", "postgres", "redlock")


@pytest.mark.backend(*NETWORKED)
def test_every_backend_with_a_server_declares_a_timeout(backend_name: str) -> None:
    assert "timeout" in {option.name for option in declared_options(backend_name)}


def test_an_unknown_option_names_the_accepted_ones(backend_name: str, backend_url: str) -> None:
    accepted = [option.name for option in declared_options(backend_name)]
    for attempt in (
        lambda: corral.connect(with_query(backend_url, "bogus=1")),
        lambda: corral.connect(backend_url, bogus=1),
    ):
        with pytest.raises(ConfigError, match="bogus") as caught:
            attempt()
        for name in accepted:
            assert name in str(caught.value)


def test_every_declared_option_is_accepted_both_ways(
    backend_name: str, backend_url: str, name: str
) -> None:
    for option in declared_options(backend_name):
        if option.example is None:
            continue
        if option.query:
            with corral.connect(with_query(backend_url, f"{option.name}={option.example}")) as s:
                assert s.lock_info(name) is None
        with corral.connect(backend_url, **{option.name: option.example}) as store:
            assert store.lock_info(name) is None


def test_an_option_given_twice_is_an_error(backend_name: str, backend_url: str) -> None:
    for option in declared_options(backend_name):
        if option.example is None or not option.query:
            continue
        with pytest.raises(ConfigError, match=option.name):
            corral.connect(
                with_query(backend_url, f"{option.name}={option.example}"),
                **{option.name: option.example},
            )


@pytest.mark.backend(*NETWORKED)
@pytest.mark.parametrize("value", ["-1", "0", "soon", "nan", "inf"])
def test_a_bad_timeout_is_refused_at_connect(backend_url: str, value: str) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        corral.connect(with_query(backend_url, f"timeout={value}"))
