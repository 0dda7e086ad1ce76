"""What corral writes into messages and owner ids: readable, storable, never a password."""

from __future__ import annotations

import pytest

from corral.backends.registry import redact
from corral.core.lockflow import make_owner
from corral.core.options import Option, merge_options
from corral.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pa/ss@host:1/0", "redis://user:***@host:1/0"),
        ("postgresql://app:s3cret@[::1/db", "postgresql://app:***@[::1/db"),
        ("redis://h:1/0?password=s3cret&prefix=a", "redis://h:1/0?password=***&prefix=a"),
        ("postgresql://a@h/db?sslpassword=s3cret", "postgresql://a@h/db?sslpassword=***"),
        ("etcd://u:s3cret@h1:1,h2:2", "etcd://u:***@h1:1,h2:2"),
        ("redis://:s3cret@h/0", "redis://:***@h/0"),
        ("sqlite:////var/lib/a@b/locks.db", "sqlite:////var/lib/a@b/locks.db"),
        ("memory://", "memory://"),
    ],
)
def test_redact_hides_every_password(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_a_bad_query_is_refused_without_quoting_it() -> None:
    with pytest.raises(ConfigError) as caught:
        merge_options(
            "redis://h/0", "timeout=1&s3cr&et", {}, [Option("timeout", "5", "")], backend="redis"
        )
    assert "s3cr" not in str(caught.value)


@pytest.mark.parametrize("label", ["worker\x00one", "lone \ud800", "tab\there", "Поток-1"])
def test_owner_ids_hold_no_control_characters_or_lone_surrogates(label: str) -> None:
    owner = make_owner(label)
    owner.encode("utf-8")  # storable everywhere
    assert not any(ord(c) < 0x20 for c in owner)
    assert owner.count(":") >= 3
