"""Write the backend guarantees tables in docs/ from the capabilities the backends declare.

    python scripts/gen_docs.py          # rewrite the tables in place
    python scripts/gen_docs.py --check  # exit 1 if a table is stale

The tables sit between `<!-- capabilities:NAME:start -->` and
`<!-- capabilities:NAME:end -->` markers, so the prose around them is edited
by hand and the facts come from code.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from corral.backends.registry import BACKENDS  # noqa: E402
from corral.core.capabilities import Capabilities  # noqa: E402
from corral.core.options import Option  # noqa: E402

DOCS = [
    ROOT / "docs/locks.md",
    ROOT / "docs/connect.md",
    ROOT / "docs/semaphores.md",
    ROOT / "docs/elections.md",
    ROOT / "docs/cache.md",
]


@dataclass(frozen=True)
class Declared:
    """What one backend class declares: its capabilities and its connection options."""

    capabilities: Capabilities
    options: tuple[Option, ...]
    claims_with_read: bool = False
    claims_in_the_read: bool = False

    @property
    def scheme(self) -> str:
        return self.capabilities.scheme


def declared() -> list[Declared]:
    seen: dict[str, Declared] = {}
    for spec in BACKENDS.values():
        module = importlib.import_module(f"corral._async.backends.{spec.module}")
        cls = getattr(module, spec.cls)
        base = importlib.import_module("corral._async.backends.base").AsyncBackend
        found = Declared(
            cls.capabilities,
            tuple(cls.url_options),
            bool(getattr(cls, "claims_with_read", False)),
            getattr(cls, "cache_read", None) is not getattr(base, "cache_read", None),
        )
        seen.setdefault(found.scheme, found)
    # Pools of servers: the child's guarantees, with what losing one server means.
    pool = importlib.import_module("corral._async.backends.pool")
    for scheme in ("memcached", "redis"):
        child = seen[scheme]
        caps = pool.pool_capabilities(child.capabilities)
        caps = dataclasses.replace(caps, scheme=f"{scheme}://a,b,…")
        seen[caps.scheme] = Declared(
            caps, tuple(pool.POOL_OPTIONS), child.claims_with_read, child.claims_in_the_read
        )
    return list(seen.values())


def shown(c: Capabilities) -> str:
    """How a backend is named in the tables: its scheme, or a pool's URL shape."""
    return f"`{c.scheme}`" if "://" in c.scheme else f"`{c.scheme}://`"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def flags_table(declarations: list[Declared]) -> str:
    backends = [d.capabilities for d in declarations]
    rows = [
        "| backend | wake-ups | across processes | across hosts | linearizable "
        "| `fair=True` | `replicas=N` | TTL enforced by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in backends:
        wake = "pushed by the release" if c.notifies else "polling, capped jittered backoff"
        rows.append(
            f"| {shown(c)} | {wake} | {yes(c.cross_process)} | {yes(c.cross_host)} "
            f"| {yes(c.linearizable)} | {yes(c.fair)} | {yes(c.replicas)} | {c.ttl_clock} |"
        )
    return "\n".join(rows)


def failures_table(declarations: list[Declared]) -> str:
    backends = [d.capabilities for d in declarations]
    rows = [
        "| backend | a holder crashes | the server restarts | a network partition "
        "| memory pressure |",
        "|---|---|---|---|---|",
    ]
    for c in backends:
        rows.append(
            f"| {shown(c)} | {c.on_client_crash} | {c.on_server_restart} "
            f"| {c.on_partition} | {c.on_memory_pressure} |"
        )
    return "\n".join(rows)


def tokens_table(declarations: list[Declared]) -> str:
    rows = [
        "| backend | fencing tokens come from | what stays once a name is released and expired |",
        "|---|---|---|",
    ]
    for d in declarations:
        c = d.capabilities
        rows.append(f"| {shown(c)} | {c.fencing_tokens} | {c.state_per_name} |")
    return "\n".join(rows)


def semaphores_table(declarations: list[Declared]) -> str:
    rows = [
        "| backend | semaphores | slots kept as | waiters woken by | `fair=True` |",
        "|---|---|---|---|---|",
    ]
    for d in declarations:
        c = d.capabilities
        kept = c.semaphores or "not offered"
        wake = "the release (pushed)" if c.notifies else "polling, capped jittered backoff"
        rows.append(f"| {shown(c)} | {yes(bool(c.semaphores))} | {kept} | {wake} | {yes(c.fair)} |")
    return "\n".join(rows)


def elections_table(declarations: list[Declared]) -> str:
    rows = [
        "| backend | across hosts | linearizable | a dead leader is replaced within "
        "| followers hear a resignation |",
        "|---|---|---|---|---|",
    ]
    for d in declarations:
        c = d.capabilities
        within = f"`ttl` + {c.ttl_slack:g} s" if c.ttl_slack else "`ttl`"
        heard = (
            "usually at once (pushed), within 1 s at worst" if c.notifies else "within 1 s (polled)"
        )
        rows.append(
            f"| {shown(c)} | {yes(c.cross_host)} | {yes(c.linearizable)} | {within} | {heard} |"
        )
    return "\n".join(rows)


def cache_table(declarations: list[Declared]) -> str:
    rows = [
        "| backend | cache | entries kept as | a read that finds the entry due | "
        "waiters on a miss woken by | shared across | under memory pressure |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in declarations:
        c = d.capabilities
        kept = c.cache or "not offered"
        if d.claims_with_read:
            claim = "reads and tries the recompute lock in one atomic step"
        elif d.claims_in_the_read:
            claim = (
                "reads and tries the recompute lock in one round trip; the winner reads "
                "once more before computing"
            )
        else:
            claim = (
                "reads, then tries the recompute lock (a second round trip, only when due); "
                "the winner reads once more before computing"
            )
        wake = "the release (pushed)" if c.notifies else "polling, capped jittered backoff"
        shared = "hosts" if c.cross_host else ("processes" if c.cross_process else "one process")
        rows.append(
            f"| {shown(c)} | {yes(bool(c.cache))} | {kept} | {claim if c.cache else ''} "
            f"| {wake} | {shared} | {c.on_memory_pressure} |"
        )
    return "\n".join(rows)


def options_table(declarations: list[Declared]) -> str:
    rows = ["| backend | option | default | what it does |", "|---|---|---|---|"]
    for d in declarations:
        for option in d.options:
            where = "" if option.query else " (keyword only)"
            rows.append(
                f"| {shown(d.capabilities)} | `{option.name}`{where} | {option.default} "
                f"| {option.meaning} |"
            )
    return "\n".join(rows)


TABLES = {
    "flags": flags_table,
    "failures": failures_table,
    "tokens": tokens_table,
    "options": options_table,
    "semaphores": semaphores_table,
    "elections": elections_table,
    "cache": cache_table,
}


def render(text: str, backends: list[Declared]) -> str:
    for name, build in TABLES.items():
        pattern = re.compile(
            rf"(<!-- capabilities:{name}:start -->\n).*?(<!-- capabilities:{name}:end -->)",
            re.DOTALL,
        )
        text = pattern.sub(lambda m, b=build: m.group(1) + b(backends) + "\n" + m.group(2), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    backends = declared()
    stale = []
    for doc in DOCS:
        current = doc.read_text()
        wanted = render(current, backends)
        if wanted != current:
            stale.append(doc)
            if not args.check:
                doc.write_text(wanted)
                print(f"wrote {doc.relative_to(ROOT)}")
    if args.check and stale:
        for doc in stale:
            print(f"stale: {doc.relative_to(ROOT)} (run: python scripts/gen_docs.py)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
