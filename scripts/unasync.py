"""Generate corral's blocking flavour from its asyncio flavour, or check that it is current.

    python scripts/unasync.py          # rewrite src/corral/_sync and tests/_sync
    python scripts/unasync.py --check  # exit 1 if any generated file is stale or stray

The async code is the one source; names are chosen so the mapping is
mechanical (AsyncLock -> Lock, aclose -> close, corral._async -> corral._sync).
Whole files are compared, so a changed tail is caught too. Generated files are
formatted with ruff so they are linted like the rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (source dir, generated dir, files kept hand-written in both)
TREES = [
    (ROOT / "src/corral/_async", ROOT / "src/corral/_sync", {"__init__.py", "_compat.py"}),
    (ROOT / "tests/_async", ROOT / "tests/_sync", {"__init__.py", "concurrency.py"}),
]

SUBSTITUTIONS: list[tuple[str, str]] = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\baiter_(\w+)", r"iter_\1"),  # httpx: response.aiter_lines() -> iter_lines()
    (r"\bcorral\._async\b", "corral._sync"),
    (r"\btests\._async\b", "tests._sync"),
    (r"\bredis\.asyncio\b", "redis"),
    (r"\bcorral\.aio\b", "corral"),
    (r"\bpytest_asyncio\.fixture\b", "pytest.fixture"),
    (r"\baclose\b", "close"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\basync_(\w+)", r"\1"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bAbstractAsyncContextManager\b", "AbstractContextManager"),
    (r"\bAwaitable\[([^\[\]]+)\]", r"\1"),  # Callable[[float], Awaitable[X]] -> ...[X]
]

HEADER = (
    "# Generated from {source} by scripts/unasync.py: do not edit.\n"
    "# Edit the asyncio flavour and run `python scripts/unasync.py`.\n"
)


def unasync_text(text: str) -> str:
    for pattern, replacement in SUBSTITUTIONS:
        text = re.sub(pattern, replacement, text)
    return text


def ruff_command() -> list[str]:
    """ruff from this interpreter, else the project's .venv, else PATH: the check must not
    depend on which python runs it."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    for candidate in (ROOT / ".venv/bin/ruff", shutil.which("ruff")):
        if candidate and Path(candidate).exists():
            return [str(candidate)]
    raise SystemExit(
        "scripts/unasync.py formats generated code with ruff, which is not installed here: "
        "run ./scripts/test once (it installs corral[dev] into .venv), or pip install ruff"
    )


def ruff(args: list[str], text: str, filename: str) -> str:
    result = subprocess.run(
        [*ruff_command(), *args, "--stdin-filename", filename, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if result.returncode not in (0, 1) or not result.stdout:
        raise SystemExit(f"ruff failed on {filename}:\n{result.stderr}")
    return result.stdout


def generate(source: Path, target: Path) -> str:
    rel = source.relative_to(ROOT).as_posix()
    text = HEADER.format(source=rel) + unasync_text(source.read_text())
    filename = str(target.relative_to(ROOT))
    fixes = "I,F401,UP,RUF022,SIM117"
    text = ruff(["check", "--fix", "--select", fixes, "--exit-zero"], text, filename)
    return ruff(["format"], text, filename)


def expected() -> dict[Path, str]:
    out: dict[Path, str] = {}
    for src_dir, dst_dir, hand_written in TREES:
        if not src_dir.exists():
            continue
        for source in sorted(src_dir.rglob("*.py")):
            rel = source.relative_to(src_dir)
            if rel.as_posix() in hand_written:
                continue
            out[dst_dir / rel] = generate(source, dst_dir / rel)
    return out


def stray(wanted: dict[Path, str]) -> list[Path]:
    found = []
    for _src_dir, dst_dir, hand_written in TREES:
        if not dst_dir.exists():
            continue
        for path in dst_dir.rglob("*.py"):
            if path.relative_to(dst_dir).as_posix() in hand_written:
                continue
            if path not in wanted:
                found.append(path)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated files are stale")
    args = parser.parse_args()
    wanted = expected()
    extra = stray(wanted)
    if args.check:
        stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)}")
        for path in extra:
            print(f"stray (no async source): {path.relative_to(ROOT)}")
        if stale or extra:
            print("run: python scripts/unasync.py")
            return 1
        print(f"{len(wanted)} generated files are current")
        return 0
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    for path in extra:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
