"""The Python examples in the README and docs/ run as written, and pass `mypy --strict`.

Each document's examples run in order in one namespace, against a real SQLite store
in a temporary folder whatever URL they name (a test must never touch a server the
user runs), with small stand-ins for the application's own functions
(`build_report`, `db`, ...). An example that raises, or that mypy rejects, fails.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.aio

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

# What the examples may use without defining it: the application's own code.
PRELUDE = """
from __future__ import annotations

import corral
import corral.aio


def build_report(fencing_token: int) -> None: ...


async def build_report_async(fencing_token: int) -> None: ...


def compact_one_batch(fencing_token: int) -> bool:
    raise NotImplementedError


def schedule_jobs(term: int) -> None: ...


async def schedule_jobs_async(term: int) -> None: ...


class Database:
    def user_initialised(self, user_id: int) -> bool:
        raise NotImplementedError

    def initialise_user(self, user_id: int, fencing_token: int) -> None: ...

    def count_contacts(self) -> int:
        raise NotImplementedError


def count_contacts() -> int:
    raise NotImplementedError


db: Database
store: corral.Store
"""


def examples(document: Path) -> list[str]:
    return [textwrap.dedent(block) for block in BLOCK.findall(document.read_text())]


DOCUMENTED = [doc for doc in DOCUMENTS if examples(doc)]


class Database:
    def __init__(self) -> None:
        self.done: dict[int, int] = {}

    def user_initialised(self, user_id: int) -> bool:
        return user_id in self.done

    def initialise_user(self, user_id: int, fencing_token: int) -> None:
        assert isinstance(fencing_token, int)
        self.done[user_id] = fencing_token

    def count_contacts(self) -> int:
        return 42


@pytest.fixture
def namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    url = f"sqlite:///{tmp_path / 'examples.db'}"
    real_connect, real_aio_connect = corral.connect, corral.aio.connect
    opened: list[Any] = []

    def connect(_url: str | None = None, **_options: Any) -> corral.Store:
        opened.append(real_connect(url))
        return opened[-1]  # type: ignore[no-any-return]

    def aio_connect(_url: str | None = None, **_options: Any) -> corral.aio.AsyncStore:
        return real_aio_connect(url)

    monkeypatch.setattr(corral, "connect", connect)
    monkeypatch.setattr(corral.aio, "connect", aio_connect)
    try:
        import prometheus_client

        monkeypatch.setattr(prometheus_client, "start_http_server", lambda *a, **k: None)
    except ImportError:
        pass
    batches = iter(range(3))
    reports: list[int] = []

    async def build_report_async(fencing_token: int) -> None:
        reports.append(fencing_token)

    async def build_report_async_term(term: int) -> None:
        reports.append(term)

    names: dict[str, Any] = {
        "corral": corral,
        "build_report": lambda fencing_token: reports.append(fencing_token),
        "build_report_async": build_report_async,
        "compact_one_batch": lambda fencing_token: next(batches, None) is not None,
        "schedule_jobs": lambda term: reports.append(term),
        "schedule_jobs_async": build_report_async_term,
        "db": Database(),
        "count_contacts": lambda: 42,
        "store": connect(),
        "reports": reports,
    }
    yield names
    for store in opened:
        store.close()


@pytest.mark.parametrize("document", DOCUMENTED, ids=lambda p: p.name)
def test_examples_run(document: Path, namespace: dict[str, Any]) -> None:
    for index, code in enumerate(examples(document)):
        namespace.pop("main", None)
        try:
            exec(compile(code, f"{document.name} example {index + 1}", "exec"), namespace)
            main = namespace.get("main")
            if main is not None and asyncio.iscoroutinefunction(main):
                asyncio.run(main())
        except Exception as exc:
            pytest.fail(f"{document.name} example {index + 1} raised {exc!r}:\n{code}")
    if "build_report(" in "".join(examples(document)):
        assert namespace["reports"], "the report example never built the report"


def test_examples_pass_mypy_strict(tmp_path: Path) -> None:
    from mypy import api

    files = []
    for document in DOCUMENTED:
        for index, code in enumerate(examples(document)):
            stem = re.sub(r"\W", "_", document.stem.lower())
            path = tmp_path / f"{stem}_{index + 1}.py"
            path.write_text(PRELUDE + "\n\n" + code)
            files.append(str(path))
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / ".mypy"), *files]
    )
    assert status == 0, out + err
