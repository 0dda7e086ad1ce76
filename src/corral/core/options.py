"""Connection options: declared once per backend, read from the URL's query or keywords.

Every option a backend takes can be given either way (`redis://h/0?timeout=2`
or `connect(url, timeout=2)`), so `CORRAL_URL` and `--url` carry them too.
`connect()` validates them all before anything is sent, and names the accepted
ones when it meets an unknown one. The declarations also write the options
table in docs/connect.md (`scripts/gen_docs.py`), so the docs cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from corral.errors import ConfigError

__all__ = ["Option", "merge_options"]


@dataclass(frozen=True, slots=True)
class Option:
    """One option a backend accepts."""

    name: str
    default: str
    """The default, as the docs show it."""
    meaning: str
    example: str | None = None
    """A valid value as URL query text, used by the tests (None: no simple one, e.g. a file)."""
    query: bool = True
    """Whether the URL's query may carry it (False for objects such as an `ssl.SSLContext`)."""


def merge_options(
    shown_url: str,
    query: str,
    keywords: Mapping[str, object],
    accepted: Iterable[Option],
    *,
    backend: str,
    passthrough: bool = False,
) -> tuple[dict[str, object], list[tuple[str, str]]]:
    """The options given in `query` and as `keywords`, checked against `accepted`.

    Returns corral's options (query values as text, keyword values as given)
    and, with `passthrough`, the query pairs that are not corral's (libpq
    parameters such as `sslmode`) in their order. An option given both ways,
    or one nobody accepts, is a ConfigError naming the accepted options.
    `shown_url` must already be redacted: it goes into messages.
    """
    options = {option.name: option for option in accepted}
    names = ", ".join(sorted(options))

    def unknown(which: list[str]) -> ConfigError:
        listed = ", ".join(sorted(which))
        return ConfigError(
            f"{shown_url}: unknown option(s) {listed}; the {backend} backend takes {names}"
        )

    given: dict[str, object] = {}
    bad = [key for key in keywords if key not in options]
    if bad:
        raise unknown(bad)
    given.update(keywords)
    rest: list[tuple[str, str]] = []
    if query:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            # Not the parser's message: it quotes the bad field, which may be part of a
            # password that was not percent-encoded.
            raise ConfigError(
                f"{shown_url}: cannot parse the options after '?': expected name=value pairs "
                "joined by '&', with '&', '=', '%', '#' and '+' in values percent-encoded"
            ) from None
        bad = []
        for key, value in pairs:
            option = options.get(key)
            if option is None or not option.query:
                if passthrough and option is None:
                    rest.append((key, value))
                else:
                    bad.append(key)
            elif key in given:
                raise ConfigError(f"{shown_url}: option {key!r} is given twice")
            else:
                given[key] = value
        if bad:
            raise unknown(bad)
    return given, rest
