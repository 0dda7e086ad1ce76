"""No message, repr, traceback or log line ever carries a password, on any backend.

Each URL below has a password and is wrong in some way (malformed, a server
that is not there). Whatever corral raises, prints or logs about it is checked
whole: the exception's text, its chained causes as a traceback shows them, the
store's repr, and every log record.
"""

from __future__ import annotations

import logging
import traceback

import pytest

import corral
import corral.aio
from corral.errors import CorralError

SECRET = "s3cretPW"

# A closed loopback port: nothing listens there.
CLOSED = "127.0.0.1:9"

MALFORMED = [
    f"redis://app:{SECRET}@[::1/0",
    f"redis://app:{SECRET}@127.0.0.1:notaport/0",
    f"redis://app:{SECRET}@{CLOSED}/notadb",
    f"redis://{CLOSED}/0?password={SECRET}&bogus=1",
    # Unencoded reserved characters end the host part early for every URL parser.
    "redis://app:s3cr/etPW@127.0.0.1:9/0",
    "redis://app:s3cr?etPW@127.0.0.1:9/0",
    "redis://app:s3cr?x=etPW@127.0.0.1:9/0",
    "rediss://app:s3cr#etPW@127.0.0.1:9/0",
    "etcd://app:s3cr/etPW@127.0.0.1:9",
    "etcd://app:s3cr?etPW@127.0.0.1:9",
    "memcached://app:s3cr/etPW@127.0.0.1:9",
    f"rediss://app:{SECRET}@[::1/0",
    f"memcached://app:{SECRET}@[::1",
    f"memcached://app:{SECRET}@127.0.0.1:notaport",
    f"memcached://app:{SECRET}@{CLOSED}?bogus=1",
    f"etcd://app:{SECRET}@[::1",
    f"etcd://app:{SECRET}@127.0.0.1:notaport",
    f"etcd://app:{SECRET}@{CLOSED},[::1",
    f"etcd://app:{SECRET}@{CLOSED}?bogus=1",
    f"postgresql://app:{SECRET}@[::1/db",
    f"postgresql://app:{SECRET}@127.0.0.1:notaport/db",
    f"postgresql://app:{SECRET}@{CLOSED}/db?bogus=1",
    f"postgresql://app@{CLOSED}/db?password={SECRET}&sslmode=nonsense",
    f"redis+redlock://app:{SECRET}@{CLOSED},127.0.0.1:notaport,127.0.0.2:9/0",
    f"redis+redlock://app:{SECRET}@{CLOSED},127.0.0.2:9/0",
    f"redis+redlock://app:{SECRET}@{CLOSED},{CLOSED},127.0.0.2:9/0",
    "redis+redlock://app:s3cr/etPW@127.0.0.1:9,127.0.0.2:9,127.0.0.3:9/0",
]

UNREACHABLE = [
    f"redis://app:{SECRET}@{CLOSED}/0",
    f"redis://{CLOSED}/0?password={SECRET}",
    f"memcached://app:{SECRET}@{CLOSED}",
    f"etcd://app:{SECRET}@{CLOSED}",
    f"postgresql://app:{SECRET}@{CLOSED}/db",
    f"postgresql://app@{CLOSED}/db?password={SECRET}",
    f"redis+redlock://app:{SECRET}@{CLOSED},127.0.0.2:9,127.0.0.3:9/0",
    f"redis+redlock://{CLOSED},127.0.0.2:9,127.0.0.3:9/0?password={SECRET}",
]


def everything_shown(exc: BaseException) -> str:
    """What a user could see of `exc`: its traceback with every chained exception."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + repr(exc)


def assert_secret_absent(text: str) -> None:
    assert SECRET not in text, text
    for part in ("s3cr", "etPW"):  # either half of a password split by a bad character
        assert part not in text, text


@pytest.mark.parametrize("url", MALFORMED)
def test_malformed_urls_never_show_the_password(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(CorralError) as caught, corral.connect(url, timeout=1) as store:
        store.lock("x").acquire()
    assert_secret_absent(everything_shown(caught.value))
    assert_secret_absent(caplog.text)


@pytest.mark.parametrize("url", UNREACHABLE)
def test_unreachable_servers_never_show_the_password(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with corral.connect(url, timeout=1) as store:
        assert_secret_absent(repr(store))
        assert_secret_absent(store.server)
        assert_secret_absent(repr(store.backend))
        lock = store.lock("x", ttl=5)
        assert_secret_absent(repr(lock))
        with pytest.raises(CorralError) as caught:
            lock.acquire()
        assert_secret_absent(everything_shown(caught.value))
    assert_secret_absent(caplog.text)


@pytest.mark.parametrize("url", UNREACHABLE)
async def test_unreachable_servers_never_show_the_password_async(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with corral.aio.connect(url, timeout=1) as store:
        assert_secret_absent(repr(store))
        assert_secret_absent(repr(store.backend))
        with pytest.raises(CorralError) as caught:
            await store.lock("x", ttl=5).acquire()
        assert_secret_absent(everything_shown(caught.value))
    assert_secret_absent(caplog.text)
