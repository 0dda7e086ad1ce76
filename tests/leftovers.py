"""The test run leaves nothing behind: no process, no temporary directory.

Fault tests SIGSTOP and SIGKILL servers and lock holders, the CLI tests start
commands that start commands, and any test can fail or time out half-way, so
fixtures that clean up after themselves are necessary but not a proof.  This
plugin (loaded by tests/conftest.py) makes the run account for everything it
starts:

- Every process the run starts carries the run's id in ``PYTEST_CORRAL_RUNS``
  (inherited through the environment; a nested run adds its own id), and the
  pytest process is a child subreaper (Linux), so a process whose parent dies
  is adopted by pytest rather than by init and stays its descendant.  The
  run's processes are pytest's descendants, those carrying its id or working
  in its temporary directory (PostgreSQL overwrites its helpers' environment),
  and their descendants.
- Temporary files and directories go under one directory of the run
  (``TMPDIR`` and `tempfile.tempdir` point there); pytest's own ``tmp_path``
  directories stay where pytest keeps them.
- When the session ends, after every fixture is torn down, whatever is left
  of the run (processes, servers never stopped, temporary entries) is
  reported as a failed test naming each (pid, state, command line, the test
  it started in), then killed and removed.  A clean, passing run also
  removes its ``tmp_path`` directories (a failing one keeps them, named in
  the output, for inspection; ``--basetemp`` keeps them always).
- A guardian process outlives a pytest killed outright (SIGKILL, the OOM
  killer, pytest-timeout's ``thread`` method, which calls ``os._exit``):
  when pytest's end of a pipe closes, it kills the run's processes, stopped
  ones included, and removes the run's temporary directory.

``python tests/leftovers.py guard RUN_ID DIR`` is the guardian itself.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import dataclasses
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Iterable
from pathlib import Path

import pytest

from corral.testing import servers
from corral.testing.servers import ProcessInfo

#: Space-separated ids of the runs a process belongs to (a nested run adds its own).
#: Not ``CORRAL_*``: tests hand commands an environment without those.
RUN_VARIABLE = "PYTEST_CORRAL_RUNS"
#: The name of the failed test that reports what a run left behind.
TEST_NAME = "the run leaves nothing behind"
#: How long processes killed by the last teardowns get to disappear before they
#: count as left behind (a SIGKILLed process is gone in milliseconds).
GRACE = 5.0
_PR_SET_CHILD_SUBREAPER = 36


@dataclasses.dataclass
class Run:
    """One pytest session's bookkeeping."""

    id: str
    pid: int
    tmp: Path
    guardian: subprocess.Popen[bytes] | None
    guardian_pipe: int | None
    subreaper: bool
    saved_environ: dict[str, str | None]
    saved_tempdir: str | None
    #: (clock ticks after boot, nodeid) of every test's start, for attribution.
    test_starts: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    basetemp: Path | None = None
    checked: bool = False


RUN = pytest.StashKey[Run]()


# --------------------------------------------------------------------------- what belongs to a run


def carries_run(pid: int, run_id: str) -> bool:
    """Whether the environment ``pid`` started with names run ``run_id``.

    PostgreSQL's helpers overwrite their environment with their process
    title, so they are found as descendants instead.
    """
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    prefix = RUN_VARIABLE.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return run_id.encode() in entry[len(prefix) :].split()
    return False


def _cwd_under(pid: int, dirs: Iterable[Path]) -> bool:
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    return any(cwd == d or d in cwd.parents for d in dirs)


def run_processes(
    run_id: str,
    *,
    ancestors: Iterable[int] = (),
    dirs: Iterable[Path] = (),
    exclude: Iterable[int] = (),
) -> list[ProcessInfo]:
    """Live processes of run ``run_id``, parents before children.

    That is: descendants of ``ancestors`` (the pytest process, a subreaper),
    processes whose environment names the run or whose working directory is
    under ``dirs``, and the descendants of those.  Zombies are not counted:
    they hold nothing and vanish when their parent reaps or exits.
    """
    table = servers.list_processes()
    excluded = set(exclude) | set(ancestors)
    dirs = [Path(d) for d in dirs]
    marked = [
        pid
        for pid in table
        if pid not in excluded and (carries_run(pid, run_id) or _cwd_under(pid, dirs))
    ]
    found = {p.pid: p for p in servers.descendants([*ancestors, *marked], table)}
    for pid in marked:
        found.setdefault(pid, table[pid])
    return [p for p in found.values() if p.running and p.pid not in excluded]


def _redact(command: str) -> str:
    """Throwaway servers' passwords stay out of reports all the same."""
    command = re.sub(r"(--requirepass|--masterauth)(\s+|=)\S+", r"\1\2***", command)
    command = re.sub(r"(^|\s)>\S+", r"\1>***", command)  # a Redis ACL password
    return re.sub(r"(://[^/\s:@]*):[^@\s/]*@", r"\1:***@", command)


def _boot_ticks() -> int:
    """Now, in the unit of /proc/<pid>/stat's start time."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _started_during(run: Run, proc: ProcessInfo) -> str:
    index = bisect.bisect_right(run.test_starts, (proc.start, "\uffff")) - 1
    if index < 0:
        return "session setup"
    tick, nodeid = run.test_starts[index]
    if tick == proc.start and index > 0:
        # Both started within one clock tick (10 ms): either may be the one.
        return f"{run.test_starts[index - 1][1]} or {nodeid}"
    return nodeid


def _describe(run: Run, proc: ProcessInfo) -> str:
    return (
        f"pid {proc.pid} (state {proc.state}, parent {proc.ppid}, "
        f"started during {_started_during(run, proc)}): "
        f"{_redact(servers.command_line(proc.pid))[:300]}"
    )


def _sweep(
    run_id: str, *, ancestors: Iterable[int], dirs: Iterable[Path], exclude: Iterable[int]
) -> list[ProcessInfo]:
    """Kill every live process of the run (stopped ones too); return survivors."""
    left: list[ProcessInfo] = []
    for _ in range(5):  # each pass also catches what the previous one's victims forked
        left = run_processes(run_id, ancestors=ancestors, dirs=dirs, exclude=exclude)
        if not left:
            break
        servers.kill_processes(left, timeout=2.0)
    return left


def _reap_adopted_zombies() -> None:
    # As a subreaper pytest adopts orphans, and when they exit they stay as
    # its zombies until it waits for them; no test is left to want them.
    for proc in servers.list_processes().values():
        if proc.ppid == os.getpid() and not proc.running:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)


def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _stop_being_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


# --------------------------------------------------------------------------- the plugin


def _start_guardian(run_id: str, tmp: Path) -> tuple[subprocess.Popen[bytes] | None, int | None]:
    read_end, write_end = os.pipe()  # not inherited by anything pytest starts later
    env = {k: v for k, v in os.environ.items() if k != RUN_VARIABLE}
    try:
        guardian = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "guard", run_id, str(tmp)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            env=env,
            cwd="/",
            # Its own session: a Ctrl-C at the terminal must not take it down
            # with the run it is there to clean up after.
            start_new_session=True,
        )
    except OSError:
        os.close(write_end)
        return None, None
    finally:
        os.close(read_end)
    return guardian, write_end


def pytest_configure(config: pytest.Config) -> None:
    if not Path("/proc/self/stat").exists():
        return  # nothing to check with, and nothing of the kind to clean up
    run_id = secrets.token_hex(6)
    system_tmp = tempfile.gettempdir()
    tmp = Path(tempfile.mkdtemp(prefix=f"corral-run-{run_id}-", dir=system_tmp))
    if os.geteuid() == 0:
        # PostgreSQL runs as `postgres` and keeps its data directory in here.
        tmp.chmod(0o711)
    names = (RUN_VARIABLE, "TMPDIR", "PYTEST_DEBUG_TEMPROOT")
    saved = {name: os.environ.get(name) for name in names}
    previous = os.environ.get(RUN_VARIABLE, "").split()
    os.environ[RUN_VARIABLE] = " ".join([*previous, run_id])
    # pytest's own tmp_path directories stay where they would have been, so
    # pytest keeps rotating them; everything else goes to the run's directory.
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system_tmp)
    os.environ["TMPDIR"] = str(tmp)
    saved_tempdir = tempfile.tempdir
    tempfile.tempdir = str(tmp)
    guardian, pipe = _start_guardian(run_id, tmp)
    config.stash[RUN] = Run(
        id=run_id,
        pid=os.getpid(),
        tmp=tmp,
        guardian=guardian,
        guardian_pipe=pipe,
        subreaper=_become_subreaper(),
        saved_environ=saved,
        saved_tempdir=saved_tempdir,
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    run = item.config.stash.get(RUN, None)
    if run is not None:
        run.test_starts.append((_boot_ticks(), item.nodeid))
    return (yield)


@pytest.fixture(scope="session", autouse=True)
def _remember_basetemp(request: pytest.FixtureRequest) -> None:
    run = request.config.stash.get(RUN, None)
    if run is not None and request.config.getoption("basetemp") is None:
        run.basetemp = request.getfixturevalue("tmp_path_factory").getbasetemp()


# trylast: the innermost wrapper, so this runs once pytest's own finish (which
# tears the session fixtures down) is done, and before the terminal summary,
# which then shows the failure.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, object, object]:
    result = yield
    run = session.config.stash.get(RUN, None)
    if run is not None and not run.checked:
        run.checked = True
        problems = _check(run)
        if problems:
            _report(session, problems)
            if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        _remove_basetemp(session, run, clean=not problems)
    return result


def _exclude(run: Run) -> list[int]:
    return [run.guardian.pid] if run.guardian is not None else []


def _check(run: Run) -> list[str]:
    """What the run left behind, named; and then killed and removed."""
    ancestors = [run.pid] if run.subreaper else []
    # Give processes the last teardowns killed a moment to be gone.
    deadline = time.monotonic() + GRACE
    while True:
        left = run_processes(run.id, ancestors=ancestors, dirs=[run.tmp], exclude=_exclude(run))
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    problems = [_describe(run, p) for p in left]
    problems += [f"{server!r} was never stopped" for server in servers.stop_all()]
    survivors = _sweep(run.id, ancestors=ancestors, dirs=[run.tmp], exclude=_exclude(run))
    problems += [f"could not kill {_describe(run, p)}" for p in survivors]
    _reap_adopted_zombies()
    with contextlib.suppress(OSError):
        problems += [f"{path} (in the run's TMPDIR)" for path in sorted(run.tmp.iterdir())]
    shutil.rmtree(run.tmp, ignore_errors=True)
    return problems


def _report(session: pytest.Session, problems: list[str]) -> None:
    text = "\n".join(
        [
            f"{len(problems)} thing(s) of this run were left once every fixture was torn down:",
            *(f"  {problem}" for problem in problems),
            "They have been killed and removed now; a test or fixture that starts a process,",
            "a server or a temporary directory must stop or remove it, also when it fails",
            "(continue a process it stopped; use tmp_path for files). See docs/testing.md.",
        ]
    )
    # Named after this file, relative to the rootdir as node ids are, so the
    # summary line reads like any failed test's.
    here = Path(__file__).resolve()
    try:
        path = here.relative_to(session.config.rootpath).as_posix()
    except ValueError:
        path = str(here)
    nodeid = f"{path}::{TEST_NAME}"
    location = (path, 0, TEST_NAME)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()  # after the last test's progress, not on its line
    session.config.hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
    report = pytest.TestReport(nodeid, location, {}, "failed", text, "call")
    session.config.hook.pytest_runtest_logreport(report=report)


def _remove_basetemp(session: pytest.Session, run: Run, *, clean: bool) -> None:
    if run.basetemp is None or not run.basetemp.exists():
        return
    if clean and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        shutil.rmtree(run.basetemp, ignore_errors=True)
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"temporary directories kept for inspection: {run.basetemp}")


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(RUN, None)
    if run is None:
        return
    if not run.checked:
        # The session never finished (a second Ctrl-C, an error in a hook):
        # no report, but still nothing left behind.
        servers.stop_all()
        ancestors = [run.pid] if run.subreaper else []
        _sweep(run.id, ancestors=ancestors, dirs=[run.tmp], exclude=_exclude(run))
        shutil.rmtree(run.tmp, ignore_errors=True)
    if run.guardian_pipe is not None:
        os.close(run.guardian_pipe)  # the guardian finds nothing and exits
        run.guardian_pipe = None
    if run.guardian is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.guardian.wait(timeout=10)
    if run.subreaper:
        _stop_being_subreaper()
    for name, value in run.saved_environ.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = run.saved_tempdir
    del config.stash[RUN]


# --------------------------------------------------------------------------- the guardian


def guard(run_id: str, tmp: Path) -> None:
    """Wait until the run's pytest is gone, however it went; then kill what it left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()  # EOF: every holder of the pipe's other end has exited
    _sweep(run_id, ancestors=(), dirs=[tmp], exclude=[os.getpid()])
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "guard":
        sys.exit(f"usage: {sys.argv[0]} guard RUN_ID DIR")
    guard(sys.argv[2], Path(sys.argv[3]))
