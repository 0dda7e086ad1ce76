"""Write the backend guarantees tables in docs/ from the capabilities the backends declare.

    python scripts/gen_docs.py          # rewrite the tables in place
    python scripts/gen_docs.py --check  # exit 1 if a table is stale

The tables sit between `<!-- capabilities:NAME:start -->` and
`<!-- capabilities:NAME:end -->` markers, so the prose around them is edited
by hand and the facts come from code.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from corral.backends.registry import BACKENDS  # noqa: E402
from corral.core.capabilities import Capabilities  # noqa: E402

DOCS = [ROOT / "docs/locks.md"]


def declared() -> list[Capabilities]:
    seen: dict[str, Capabilities] = {}
    for spec in BACKENDS.values():
        module = importlib.import_module(f"corral._async.backends.{spec.module}")
        caps: Capabilities = getattr(module, spec.cls).capabilities
        seen.setdefault(caps.scheme, caps)
    return list(seen.values())


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def flags_table(backends: list[Capabilities]) -> str:
    rows = [
        "| backend | wake-ups | across processes | across hosts | linearizable "
        "| `fair=True` | `replicas=N` | TTL enforced by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in backends:
        wake = "pushed by the release" if c.notifies else "polling, capped jittered backoff"
        rows.append(
            f"| `{c.scheme}://` | {wake} | {yes(c.cross_process)} | {yes(c.cross_host)} "
            f"| {yes(c.linearizable)} | {yes(c.fair)} | {yes(c.replicas)} | {c.ttl_clock} |"
        )
    return "\n".join(rows)


def failures_table(backends: list[Capabilities]) -> str:
    rows = [
        "| backend | a holder crashes | the server restarts | a network partition "
        "| memory pressure |",
        "|---|---|---|---|---|",
    ]
    for c in backends:
        rows.append(
            f"| `{c.scheme}://` | {c.on_client_crash} | {c.on_server_restart} "
            f"| {c.on_partition} | {c.on_memory_pressure} |"
        )
    return "\n".join(rows)


TABLES = {"flags": flags_table, "failures": failures_table}


def render(text: str, backends: list[Capabilities]) -> str:
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
