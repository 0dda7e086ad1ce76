"""Throwaway Redis, memcached, etcd and PostgreSQL servers for tests.

corral's guarantees live in server semantics (``SET NX PX`` expiry, etcd
leases and revisions, PostgreSQL advisory locks), which fakes reproduce only
approximately, so the tests run against the real binaries.  They must never
touch a server somebody already runs (a developer's Redis on 6379 holds real
data), and parallel test runs must not share state, so every server started
here gets its own free loopback port and its own directory, and is stopped by
the PID we started rather than by name, together with every process it forked
(see "process trees" below), whatever state a test left them in.

Only the standard library is used: the client libraries are optional extras
of corral, and a missing client must not make the fixtures themselves fail.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import functools
import http.client
import io
import json
import os
import platform
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

__all__ = [
    "LOCALHOST",
    "STARTUP_TIMEOUT",
    "STOP_TIMEOUT",
    "EtcdCluster",
    "EtcdServer",
    "MemcachedServer",
    "PostgresServer",
    "ProcessInfo",
    "RedisServer",
    "ServerError",
    "ServerPool",
    "ServerProcess",
    "ServerStartError",
    "ServerUnavailable",
    "command_line",
    "continue_processes",
    "descendants",
    "free_port",
    "freeze_tree",
    "is_current",
    "kill_processes",
    "list_processes",
    "process_info",
    "process_tree",
    "require_binary",
    "signal_process",
    "start_etcd",
    "start_etcd_cluster",
    "start_memcached",
    "start_memcached_pool",
    "start_postgres",
    "start_redis",
    "start_redis_masters",
    "start_redis_pool",
    "stop_all",
    "wait_gone",
]

LOCALHOST = "127.0.0.1"
#: Generous because a 2-core CI box running tests in parallel is slow, yet
#: bounded so a server that will never come up fails the test instead of
#: hanging it until the global pytest timeout hides the real cause.
STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0

# free_port() only proves the port was free a moment ago; a parallel run can
# take it before the server binds.  Retrying with a fresh port is cheaper than
# any cross-process port reservation scheme.
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 40

_S = TypeVar("_S", bound="ServerProcess")
_G = TypeVar("_G", bound="ServerGroup")

# Binary -> Debian package, so the error tells the reader what to install.
_POSTGRES_BINARIES = frozenset(
    {"postgres", "initdb", "pg_ctl", "pg_isready", "createdb", "psql", "pg_config"}
)
_DEBIAN_PACKAGES: dict[str, str] = {
    "redis-server": "redis-server",
    "redis-cli": "redis-tools",
    "memcached": "memcached",
    "etcd": "etcd-server",
    "etcdctl": "etcd-client",
    "openssl": "openssl",
    "setpriv": "util-linux",
    **dict.fromkeys(_POSTGRES_BINARIES, "postgresql"),
}
_EXTRA_BIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin")

# Go's name for the machine, for ETCD_UNSUPPORTED_ARCH (see EtcdServer._env).
_GOARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "armv6l": "arm",
    "i386": "386",
    "i686": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


class ServerError(RuntimeError):
    """Base class, so a fixture can handle both failures below in one clause."""


class ServerUnavailable(ServerError):
    """A server binary is not installed.

    Kept apart from `ServerStartError` because the two deserve different
    reactions: a missing binary on a laptop is a reason to skip, a server that
    is installed but does not start is a bug to report.
    """


class ServerStartError(ServerError):
    """A server was launched but never answered, or died while starting.

    Carries the end of the server's own log because the exit status alone
    ("exited with 1") almost never explains anything.
    """

    def __init__(self, message: str, *, log_path: Path | None = None, log_tail: str = "") -> None:
        self.log_path = log_path
        self.log_tail = log_tail
        self.port_in_use = "address already in use" in log_tail.lower()
        if log_path is not None:
            message += f"\n--- last lines of {log_path} ---\n{log_tail.rstrip()}"
        super().__init__(message)


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago.

    The kernel picks it (bind to port 0), which avoids guessing and the
    standard ports of servers the user already runs.
    """
    return _free_ports(1)[0]


def _free_ports(count: int) -> list[int]:
    # All sockets stay open until every port is chosen, so the ports are distinct.
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOCALHOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _version_key(path: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin: compare 9.6 < 10 < 15 numerically.
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))


@functools.lru_cache(maxsize=1)
def _postgres_bindirs() -> tuple[Path, ...]:
    """PostgreSQL's bin directories, most preferred first.

    Debian keeps the server binaries off PATH, under a versioned directory.
    ``pg_config`` names the version the headers belong to, which is what a
    developer expects, but on Debian it comes from libpq-dev and may point at
    a version whose server is not installed, so every candidate is checked.
    """
    dirs: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                dirs.append(Path(out))
    versioned = [Path(p) for p in Path("/usr/lib/postgresql").glob("*/bin") if p.is_dir()]
    dirs.extend(sorted(versioned, key=_version_key, reverse=True))
    return tuple(dict.fromkeys(dirs))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def require_binary(name: str) -> str:
    """Return the absolute path of the executable ``name``.

    Looks beyond PATH because Debian installs some servers in /usr/sbin and
    PostgreSQL in /usr/lib/postgresql/<version>/bin, neither of which is on a
    normal user's PATH.  PostgreSQL tools prefer those directories over PATH
    so that initdb and postgres come from the same version.

    Raises `ServerUnavailable` naming the Debian package to install.
    """
    is_postgres = name in _POSTGRES_BINARIES
    candidates: list[Path] = []
    if is_postgres:
        candidates.extend(d / name for d in _postgres_bindirs())
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    candidates.extend(Path(d) / name for d in _EXTRA_BIN_DIRS)
    if not is_postgres:
        candidates.extend(d / name for d in _postgres_bindirs())
    for candidate in candidates:
        if _executable(candidate):
            return str(candidate)
    package = _DEBIAN_PACKAGES.get(name)
    hint = (
        f"install it with `sudo apt-get install -y {package}` or run scripts/install-servers"
        if package
        else "install the package that provides it"
    )
    raise ServerUnavailable(
        f"`{name}` was not found on PATH, in {', '.join(_EXTRA_BIN_DIRS)} or in "
        f"/usr/lib/postgresql/*/bin; {hint}"
    )


def _tail(path: Path, lines: int = _LOG_TAIL_LINES, *, offset: int = 0) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            start = max(offset, size - 16384)
            fh.seek(start)
            data = fh.read()
    except OSError as exc:
        return f"(log unreadable: {exc})"
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _env_without(*prefixes: str) -> dict[str, str]:
    # Inherited settings such as ETCD_NAME or PGHOST would silently override or
    # conflict with the explicit command line, pointing a test at the wrong server.
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def _exit_status(pid: int) -> int | None:
    """Exit status of our child ``pid``, or None while it runs, without reaping it.

    Not reaping matters: while the zombie exists its PID, which is also its
    process-group id, cannot be recycled, so signalling the group afterwards
    cannot hit an unrelated process.
    """
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return -1
    if result is None:
        return None
    return int(result.si_status)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# --------------------------------------------------------------------------- process trees
#
# A server is more than the process we started: PostgreSQL forks a checkpointer,
# a WAL writer and a backend per connection, and every one of them calls
# setsid(), so neither the server's process group nor its session reaches them.
# Parenthood does, and /proc records it, so pausing, stopping and killing act on
# the whole tree of descendants.  A pid alone is no identity (pids are reused),
# so a process is remembered with its start time and signalled through a pidfd
# once that identity is checked.

_DEAD_STATES = frozenset({"Z", "X", "x"})
_STOPPED_STATES = frozenset({"T", "t"})


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """One process as /proc showed it.

    ``start`` (clock ticks after boot) tells the process apart from a later
    one that is given the same pid.
    """

    pid: int
    ppid: int
    state: str
    start: int

    @property
    def key(self) -> tuple[int, int]:
        """The process's identity: the same pid with another start is another process."""
        return (self.pid, self.start)

    @property
    def running(self) -> bool:
        """False for a zombie, which holds nothing but its exit status."""
        return self.state not in _DEAD_STATES


def process_info(pid: int) -> ProcessInfo | None:
    """What /proc says about ``pid`` now, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and ")": split after the last ")".
    fields = raw[raw.rindex(b")") + 2 :].split()
    return ProcessInfo(
        pid=pid, ppid=int(fields[1]), state=fields[0].decode(), start=int(fields[19])
    )


def list_processes() -> dict[int, ProcessInfo]:
    """Every process on the machine by pid; empty where there is no /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    found: dict[int, ProcessInfo] = {}
    for name in names:
        if name.isdigit():
            info = process_info(int(name))
            if info is not None:
                found[info.pid] = info
    return found


def descendants(
    roots: Iterable[int], table: Mapping[int, ProcessInfo] | None = None
) -> list[ProcessInfo]:
    """Children, grandchildren... of the ``roots`` (not the roots), parents first."""
    table = list_processes() if table is None else table
    children: dict[int, list[ProcessInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    queue = collections.deque(roots)
    seen = set(queue)
    found: list[ProcessInfo] = []
    while queue:
        for child in children.get(queue.popleft(), ()):
            if child.pid not in seen:
                seen.add(child.pid)
                found.append(child)
                queue.append(child.pid)
    return found


def process_tree(pid: int) -> list[ProcessInfo]:
    """``pid`` and all its descendants, parents first; empty once it is gone."""
    table = list_processes()
    root = table.get(pid)
    return [] if root is None else [root, *descendants([pid], table)]


def command_line(pid: int) -> str:
    """The command line of ``pid`` as ps shows it (``?`` once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    # PostgreSQL rewrites its argv into a title padded with NULs.
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or "?"


def is_current(proc: ProcessInfo) -> bool:
    """Whether ``proc`` still exists, as the same process, and is not a zombie."""
    now = process_info(proc.pid)
    return now is not None and now.start == proc.start and now.running


def signal_process(proc: ProcessInfo, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``proc`` if it is still that process; False if it is gone.

    The pidfd pins the process: once its start time is seen to match, the
    signal cannot reach a newcomer that took over the pid in the meantime.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    except OSError:
        pidfd = -1  # a kernel before 5.3: kill() below, with its small race
    try:
        now = process_info(proc.pid)
        if now is None or now.start != proc.start:
            return False
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(proc.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def freeze_tree(pid: int, timeout: float = STOP_TIMEOUT) -> list[ProcessInfo]:
    """SIGSTOP ``pid`` and every descendant; return them, parents first.

    Repeats until a pass finds nobody new: a process may fork between the
    listing of its children and the moment it stops, but a tree whose every
    member shows as stopped cannot grow any more.
    """
    frozen: dict[tuple[int, int], ProcessInfo] = {}
    deadline = time.monotonic() + timeout
    while True:
        new = [p for p in process_tree(pid) if p.running and p.key not in frozen]
        for proc in new:
            if signal_process(proc, signal.SIGSTOP):
                frozen[proc.key] = proc
        _wait_until_stopped(frozen.values(), deadline)
        if not new or time.monotonic() >= deadline:
            return list(frozen.values())


def _wait_until_stopped(procs: Iterable[ProcessInfo], deadline: float) -> None:
    # SIGSTOP takes effect when the target is next scheduled, not at kill().
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        pending = [
            p
            for p in pending
            if (now := process_info(p.pid)) is not None
            and now.start == p.start
            and now.state not in _STOPPED_STATES | _DEAD_STATES
        ]
        if pending:
            time.sleep(0.005)


def continue_processes(procs: Sequence[ProcessInfo]) -> None:
    """SIGCONT ``procs``, children before their parents."""
    for proc in reversed(procs):
        signal_process(proc, signal.SIGCONT)


def kill_processes(
    procs: Iterable[ProcessInfo], timeout: float = STOP_TIMEOUT
) -> list[ProcessInfo]:
    """SIGKILL ``procs`` (stopped ones too) and wait until they are gone.

    Returns those still there after ``timeout``: a process in uninterruptible
    sleep dies only when its system call returns.
    """
    procs = list(procs)
    for proc in procs:
        signal_process(proc, signal.SIGKILL)
    return wait_gone(procs, timeout)


def wait_gone(procs: Iterable[ProcessInfo], timeout: float) -> list[ProcessInfo]:
    """Wait until none of ``procs`` runs; return those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    pending = [p for p in procs if is_current(p)]
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
        pending = [p for p in pending if is_current(p)]
    return pending


def _merge(*groups: Iterable[ProcessInfo]) -> list[ProcessInfo]:
    """Union by identity, in first-seen order (parents before children stays true)."""
    merged: dict[tuple[int, int], ProcessInfo] = {}
    for group in groups:
        for proc in group:
            merged.setdefault(proc.key, proc)
    return list(merged.values())


@functools.lru_cache(maxsize=1)
def _setpriv() -> str | None:
    """setpriv, if it supports --pdeathsig (util-linux >= 2.33)."""
    path = shutil.which("setpriv") or (
        "/usr/bin/setpriv" if _executable(Path("/usr/bin/setpriv")) else None
    )
    if path is None:
        return None
    try:
        ok = (
            subprocess.run(
                [path, "--pdeathsig=TERM", "--", "true"], capture_output=True, timeout=10
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return path if ok else None


def _death_signal_prefix(sig: signal.Signals) -> list[str]:
    """Command prefix that makes the kernel signal the server when we die.

    atexit cannot run when the test process is SIGKILLed, OOM-killed or leaves
    through os._exit (pytest-timeout's thread method does that); the parent-
    death signal still fires.  setpriv execs in place, so the PID we hold is
    still the server's.  The signal is tied to the *thread* that forked, so it
    is only used from the main thread: a server started from a worker thread
    would otherwise die when that thread ends.
    """
    if threading.current_thread() is not threading.main_thread():
        return []
    setpriv = _setpriv()
    if setpriv is None:
        return []
    return [setpriv, f"--pdeathsig={sig.name}", "--"]


# Servers still running, for stop_all() and the atexit handler.  Keyed by id()
# because the objects are mutable and not hashable by value.
_LIVE: dict[int, ServerProcess] = {}
_LIVE_LOCK = threading.Lock()
# Directories created outside the caller's workdir (see PostgresServer),
# with the PID of the process that owns them.
_EXTERNAL_DIRS: list[tuple[int, Path]] = []


def stop_all(timeout: float = 5.0) -> list[ServerProcess]:
    """Stop every server this process started and has not stopped; for the end of a run.

    Paused servers are continued first, and every process a server forked is
    waited for or killed (see `ServerProcess.stop`).  Also removes the
    directories made outside callers' workdirs, so call it only when no
    server will be restarted.  Returns the servers that were still running,
    so a test run can name them: a server nobody stopped is a leak.
    """
    with _LIVE_LOCK:
        servers = [s for s in _LIVE.values() if s._owner_pid == os.getpid()]
    running = [s for s in servers if s.is_running or s._paused]
    # A process forked from the test run inherits this module's state but not
    # the children; only the process that started a server may stop it.
    for server in servers:
        with contextlib.suppress(Exception):
            server._signal_stop()
    deadline = time.monotonic() + timeout
    for server in servers:
        with contextlib.suppress(Exception):
            server._finish_stop(deadline)
    for entry in list(_EXTERNAL_DIRS):
        owner, path = entry
        if owner == os.getpid():
            shutil.rmtree(path, ignore_errors=True)
            _EXTERNAL_DIRS.remove(entry)
    return running


def _stop_all_at_exit() -> None:
    """Stop whatever a crashed or careless test run left behind."""
    with contextlib.suppress(Exception):
        stop_all()


atexit.register(_stop_all_at_exit)


def _server_dir(workdir: Path, kind: str) -> Path:
    # Several servers commonly share one tmp_path (a master and its replica,
    # etcd members); a private directory each keeps their files apart.
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir))


# --------------------------------------------------------------------------- base class


class ServerProcess:
    """One server process we started, identified by PID, never by name.

    The server runs in its own session and process group, so a Ctrl-C in the
    terminal reaches only the test run (whose atexit hook then stops servers
    in order).  `pause()`, `resume()`, `stop()` and `kill()` act on the whole
    tree of processes the server forked, found through /proc rather than the
    process group, which PostgreSQL's helpers leave.  Whatever a test did to
    the server, `stop()` leaves no process behind: it continues every process
    first (a stopped process cannot act on the stop signal) and kills what is
    still there after the timeout.
    """

    kind: ClassVar[str] = "server"
    #: The signal that makes this server shut down cleanly and promptly.
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(
        self, workdir: Path, port: int, *, startup_timeout: float = STARTUP_TIMEOUT
    ) -> None:
        self.host = LOCALHOST
        self.port = port
        self.workdir = Path(workdir)
        self.log_path = self.workdir / f"{self.kind}.log"
        self.startup_timeout = startup_timeout
        self.popen: subprocess.Popen[bytes] | None = None
        self._prepared = False
        self._log_offset = 0
        self._owner_pid = os.getpid()
        # Processes pause() stopped: resume() and stop() continue exactly these,
        # even those whose parent has died in the meantime.
        self._paused: list[ProcessInfo] = []
        # Every process of the tree seen since stop() began, waited for until gone.
        self._stopping: list[ProcessInfo] = []

    # -- hooks for subclasses ------------------------------------------------

    @property
    def url(self) -> str:
        """corral URL of this server."""
        raise NotImplementedError

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _probe(self) -> bool:
        """True once the server answers at protocol level, not just accepts TCP."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """One-time setup before the first launch (certificates, initdb)."""

    def _on_ready(self, deadline: float) -> None:
        """Work that needs a running server, after every (re)start."""

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    def _run_as(self) -> str | None:
        """OS user to run the server as, when it must not run as us."""
        return None

    def _reassign_ports(self) -> None:
        """Pick new ports after a collision; the server has not served yet."""
        self.port = free_port()

    # -- public API ----------------------------------------------------------

    @property
    def pid(self) -> int:
        """PID of the server process itself (not of a wrapper)."""
        if self.popen is None:
            raise ServerError(f"{self!r} was never started")
        return self.popen.pid

    @property
    def is_running(self) -> bool:
        popen = self.popen
        if popen is None or popen.returncode is not None:
            return False
        return _exit_status(popen.pid) is None

    def start(self) -> None:
        """Start the server (no-op while it runs) and wait until it answers."""
        if self.is_running:
            return
        self._launch()
        try:
            self._wait_ready(time.monotonic() + self.startup_timeout)
        except BaseException:
            self.kill()
            raise

    def restart(self) -> None:
        """Stop if needed, then start again on the same port and data directory.

        Same port because clients under test hold the URL and are expected to
        reconnect to it, which is the scenario restarts exist to exercise.
        """
        self.stop()
        self.start()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Shut down with `stop_signal`, SIGKILL after ``timeout`` seconds; idempotent.

        Waits until the process is gone, so the port and data directory are
        free when this returns.
        """
        self._signal_stop()
        self._finish_stop(time.monotonic() + timeout)

    def kill(self) -> None:
        """SIGKILL the server and every process it forked, simulating a crash; idempotent.

        The whole tree dies at once, as in a machine crash: a PostgreSQL
        backend left running would keep the shared memory that a restarted
        server refuses to share.  Returns once all of them are gone.
        """
        popen = self.popen
        doomed = list(self._paused)
        if popen is not None and popen.returncode is None:
            # Frozen first, so nothing forks between the listing and the kill.
            doomed = _merge(freeze_tree(popen.pid), doomed)
            _signal_group(popen.pid, signal.SIGKILL)
        kill_processes(doomed)
        self._paused = []
        self._reap()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open but nothing answers.

        This is how a GC pause or a hung VM looks to a client, as opposed to
        a dead server, which refuses connections.  Every process of the server
        stops (a PostgreSQL whose backends still ran would not be frozen), and
        the server keeps the list so that `resume()` and `stop()` continue them.
        """
        self._require_running()
        # The group first: all there is to stop where there is no /proc.
        _signal_group(self.pid, signal.SIGSTOP)
        self._paused = _merge(self._paused, freeze_tree(self.pid))

    def resume(self) -> None:
        """Undo `pause()`: continue every process it stopped."""
        self._require_running()
        self._continue_all()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """Last lines of the server's log, for assertion messages."""
        return _tail(self.log_path, lines)

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        pid = self.popen.pid if self.popen is not None else None
        return f"<{type(self).__name__} {self.host}:{self.port} pid={pid} dir={self.workdir}>"

    # -- machinery -----------------------------------------------------------

    def _require_running(self) -> None:
        if not self.is_running:
            raise ServerError(f"{self!r} is not running")

    def _launch(self) -> None:
        if self.is_running:
            raise ServerError(f"{self!r} is already running")
        if not self._prepared:
            self._prepare()
            self._prepared = True
        # A previous incarnation that died on its own: reap it, and finish off
        # helpers it left (paused ones would otherwise stay stopped for ever).
        self.stop()
        command = _death_signal_prefix(self.stop_signal) + self._command()
        user = self._run_as()
        group: int | None = None
        extra_groups: list[int] | None = None
        if user is not None:
            entry = pwd.getpwnam(user)
            group = entry.pw_gid
            extra_groups = os.getgrouplist(user, entry.pw_gid)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"--- corral: starting {shlex.join(command)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self._env(),
                start_new_session=True,
                close_fds=True,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )
        self._owner_pid = os.getpid()
        with _LIVE_LOCK:
            _LIVE[id(self)] = self

    def _start_error(self, message: str) -> ServerStartError:
        return ServerStartError(
            f"{type(self).__name__} on {self.host}:{self.port}: {message}",
            log_path=self.log_path,
            log_tail=_tail(self.log_path, offset=self._log_offset),
        )

    def _check_alive(self) -> None:
        popen = self.popen
        if popen is None:
            raise self._start_error("was never launched")
        status = popen.returncode if popen.returncode is not None else _exit_status(popen.pid)
        if status is not None:
            raise self._start_error(f"exited with status {status} while starting")

    def _wait_ready(self, deadline: float) -> None:
        _wait_all_ready([self], deadline)
        self._on_ready(deadline)

    def _leader_running(self) -> bool:
        popen = self.popen
        return popen is not None and popen.returncode is None and _exit_status(popen.pid) is None

    def _continue_all(self) -> None:
        """SIGCONT every process of the server, paused or not, and forget the pause."""
        running = self._leader_running()
        tree = process_tree(self.pid) if running else []
        continue_processes(_merge(self._paused, tree))
        if running:
            _signal_group(self.pid, signal.SIGCONT)  # where there is no /proc
        self._paused = []

    def _signal_stop(self) -> None:
        # Remember the whole tree now: once the leader exits, its children are
        # adopted by another process and /proc no longer ties them to us.
        tree = process_tree(self.pid) if self._leader_running() else []
        self._stopping = _merge(self._stopping, tree, self._paused)
        if tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, self.stop_signal)
        # A stopped process cannot act on any signal but SIGKILL until it is
        # continued: a PostgreSQL whose backends stay stopped never finishes
        # its shutdown, and backends orphaned while stopped stay so for ever.
        continue_processes(self._stopping)
        if tree:
            _signal_group(self.pid, signal.SIGCONT)  # where there is no /proc
        self._paused = []

    def _finish_stop(self, deadline: float) -> None:
        popen = self.popen
        if popen is None:
            self._forget()
            return
        while True:
            if self._leader_running():
                # Shutdown may fork (a last checkpoint); track newcomers too.
                self._stopping = _merge(self._stopping, process_tree(popen.pid))
            elif not any(is_current(p) for p in self._stopping):
                break
            if time.monotonic() >= deadline:
                doomed = self._stopping
                if self._leader_running():
                    doomed = _merge(freeze_tree(popen.pid), doomed)
                    _signal_group(popen.pid, signal.SIGKILL)
                kill_processes(doomed)
                break
            time.sleep(0.02)
        self._stopping = []
        self._reap()

    def _reap(self) -> None:
        popen = self.popen
        if popen is None or popen.returncode is not None:
            self._forget()
            return
        try:
            # Block until the leader is a zombie but keep it unreaped, so the
            # group id is still ours while stragglers are killed.
            os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass  # reaped elsewhere; the group id may be recycled, so leave it
        else:
            _signal_group(popen.pid, signal.SIGKILL)
        popen.wait()
        self._forget()

    def _forget(self) -> None:
        with _LIVE_LOCK:
            _LIVE.pop(id(self), None)


def _wait_all_ready(servers: Sequence[ServerProcess], deadline: float) -> None:
    """Poll until every server answers; fail fast if one of them dies."""
    pending = list(servers)
    delay = 0.02
    while pending:
        for server in list(pending):
            server._check_alive()
            try:
                ready = server._probe()
            except (OSError, ValueError, http.client.HTTPException):
                ready = False  # not up yet, or something else answered on the port
            if ready:
                pending.remove(server)
        if not pending:
            return
        if time.monotonic() >= deadline:
            server = pending[0]
            raise server._start_error(f"did not answer within {server.startup_timeout:g}s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _start_with_port_retries(server: _S) -> _S:
    for attempt in range(_PORT_ATTEMPTS):
        try:
            server.start()
        except ServerStartError as exc:
            if not exc.port_in_use or attempt == _PORT_ATTEMPTS - 1:
                raise
            server._reassign_ports()
        else:
            return server
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- Redis


def _make_tls_files(
    directory: Path, *, ca: tuple[Path, Path] | None = None
) -> tuple[Path, Path, Path, Path]:
    """Create a CA (unless given) and a server certificate for 127.0.0.1.

    Returns ``(ca_file, ca_key, cert_file, key_file)``.  The extensions are
    spelled out because Python's ssl module (strict X.509 checks since 3.13)
    rejects CA certificates without critical basicConstraints and leaf
    certificates without an authority key identifier.
    """
    openssl = require_binary("openssl")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        result = subprocess.run(
            [openssl, *args], cwd=directory, capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0:
            raise ServerStartError(
                f"openssl {' '.join(args[:2])} failed ({result.returncode}):\n{result.stderr}"
            )

    if ca is None:
        ca_file, ca_key = directory / "ca.crt", directory / "ca.key"
        run(
            "req", "-x509", "-new", *ec, "-days", "7",
            "-keyout", str(ca_key), "-out", str(ca_file),
            "-subj", "/CN=corral throwaway test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
    else:
        ca_file, ca_key = ca
    cert_file, key_file = directory / "server.crt", directory / "server.key"
    csr, ext = directory / "server.csr", directory / "server.ext"
    ext.write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        "extendedKeyUsage = serverAuth, clientAuth\n"
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n"
    )
    run("req", "-new", *ec, "-keyout", str(key_file), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    run(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_file), "-CAkey", str(ca_key),
        "-set_serial", f"0x{secrets.token_hex(16)}", "-days", "7",
        "-extfile", str(ext), "-out", str(cert_file),
    )  # fmt: skip
    return ca_file, ca_key, cert_file, key_file


class _RedisReplyError(Exception):
    pass


class RedisServer(ServerProcess):
    """A redis-server without persistence, optionally with a password, TLS or a master."""

    kind = "redis"
    #: ACL user created alongside the password, for tests of ``redis://user:pw@``.
    ACL_USERNAME: ClassVar[str] = "corral"

    def __init__(
        self,
        workdir: Path,
        port: int,
        *,
        password: str | None = None,
        tls: bool = False,
        replica_of: RedisServer | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(workdir, port, startup_timeout=startup_timeout)
        self.binary = require_binary("redis-server")
        self.password = password
        self.username: str | None = self.ACL_USERNAME if password else None
        # Redis can only replicate over TLS with a certificate of its own, so
        # a replica of a TLS master is a TLS server too, signed by the same CA.
        self.tls: bool = tls or (replica_of is not None and replica_of.tls)
        self.replica_of = replica_of
        self.ca_file: Path | None = None
        self.cert_file: Path | None = None
        self.key_file: Path | None = None
        self._ca_key: Path | None = None
        if self.tls:
            require_binary("openssl")

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"{scheme}://{auth}{self.host}:{self.port}/0"

    def _prepare(self) -> None:
        if not self.tls:
            return
        master = self.replica_of
        ca = None
        if master is not None and master.tls:
            assert master.ca_file is not None and master._ca_key is not None
            ca = (master.ca_file, master._ca_key)
        self.ca_file, self._ca_key, self.cert_file, self.key_file = _make_tls_files(
            self.workdir, ca=ca
        )

    def _command(self) -> list[str]:
        cmd = [
            self.binary,
            "--bind", LOCALHOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--daemonize", "no",
            # Default 5 s: a master waits that long for more replicas before
            # streaming the snapshot, which would stall every replica start.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if self.tls:
            assert self.cert_file and self.key_file and self.ca_file
            cmd += [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.cert_file),
                "--tls-key-file", str(self.key_file),
                "--tls-ca-cert-file", str(self.ca_file),
                # Clients verify the server; requiring client certificates
                # too would make every test build one.
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        else:
            cmd += ["--port", str(self.port)]
        if self.password:
            cmd += ["--requirepass", self.password]
            cmd += ["--user", self.ACL_USERNAME, "on", f">{self.password}", "~*", "&*", "+@all"]
        master = self.replica_of
        if master is not None:
            cmd += ["--replicaof", master.host, str(master.port)]
            if master.password:
                cmd += ["--masterauth", master.password]
            if master.tls:
                cmd += ["--tls-replication", "yes"]
        return cmd

    def _call(self, *args: str, timeout: float = 2.0) -> bytes:
        """Send one command over a fresh raw connection; return the reply payload.

        Exists so readiness checks need no client library; tests should use
        redis-py.  Handles simple-string, integer and bulk-string replies.
        """
        raw = socket.create_connection((self.host, self.port), timeout=timeout)
        sock: socket.socket = raw
        try:
            if self.tls:
                context = ssl.create_default_context(cafile=str(self.ca_file))
                sock = context.wrap_socket(raw, server_hostname=self.host)
            with sock.makefile("rwb") as stream:
                commands: list[tuple[str, ...]] = []
                if self.password:
                    commands.append(("AUTH", self.password))
                commands.append(args)
                for cmd in commands:
                    stream.write(_resp_encode(cmd))
                stream.flush()
                reply = b""
                for _ in commands:
                    reply = _resp_read(stream)
                return reply
        finally:
            sock.close()

    def _probe(self) -> bool:
        try:
            return self._call("PING", timeout=1.0) == b"PONG"
        except _RedisReplyError:
            return False  # LOADING while a replica takes in the master's data

    def _on_ready(self, deadline: float) -> None:
        if self.replica_of is None:
            return
        # A replica that answers PING may still be connecting or syncing, and a
        # test reading from it then would see an empty dataset.
        info = b""
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError, _RedisReplyError):
                info = self._call("INFO", "replication", timeout=1.0)
                if b"master_link_status:up" in info:
                    return
            time.sleep(0.05)
        raise self._start_error(
            "replica did not report master_link_status:up in time; last INFO replication:\n"
            + info.decode(errors="replace")
        )


def _resp_encode(args: Iterable[str]) -> bytes:
    parts = [arg.encode() for arg in args]
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def _resp_read(stream: io.BufferedIOBase) -> bytes:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"-":
        raise _RedisReplyError(body.decode(errors="replace"))
    if kind in (b"+", b":"):
        return body
    if kind == b"$":
        length = int(body)
        if length < 0:
            return b""
        data = stream.read(length + 2)
        return data[:-2]
    raise ConnectionError(f"unexpected Redis reply {line!r}")


def start_redis(
    workdir: Path,
    *,
    password: str | None = None,
    tls: bool = False,
    replica_of: RedisServer | None = None,
    startup_timeout: float = STARTUP_TIMEOUT,
) -> RedisServer:
    """Start a redis-server in a new directory under ``workdir``.

    With ``replica_of`` this returns only once the replica reports its master
    link up, so reads from it see the master's data.
    """
    server = RedisServer(
        _server_dir(workdir, "redis"),
        free_port(),
        password=password,
        tls=tls,
        replica_of=replica_of,
        startup_timeout=startup_timeout,
    )
    return _start_with_port_retries(server)


# --------------------------------------------------------------------------- memcached


class MemcachedServer(ServerProcess):
    """A memcached listening on loopback TCP only."""

    kind = "memcached"
    # memcached notices SIGTERM only on its once-a-second clock tick, and
    # without -e (restartable cache) a clean exit saves nothing, so a
    # graceful stop would just cost up to a second per test.
    stop_signal = signal.SIGKILL

    def __init__(
        self,
        workdir: Path,
        port: int,
        *,
        memory_mb: int = 64,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(workdir, port, startup_timeout=startup_timeout)
        self.binary = require_binary("memcached")
        self.memory_mb = memory_mb

    @property
    def url(self) -> str:
        return f"memcached://{self.host}:{self.port}"

    def _command(self) -> list[str]:
        cmd = [
            self.binary,
            "-l", LOCALHOST,
            "-p", str(self.port),
            "-U", "0",  # no UDP: nothing uses it, and it is an amplification vector
            "-m", str(self.memory_mb),
        ]  # fmt: skip
        if os.geteuid() == 0:
            cmd += ["-u", "root"]  # memcached refuses root unless told which user to be
        return cmd

    def _probe(self) -> bool:
        with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
            sock.sendall(b"version\r\n")
            with sock.makefile("rb") as stream:
                return stream.readline().startswith(b"VERSION ")


def start_memcached(
    workdir: Path, *, memory_mb: int = 64, startup_timeout: float = STARTUP_TIMEOUT
) -> MemcachedServer:
    """Start memcached with ``memory_mb`` of cache (small values make eviction testable)."""
    server = MemcachedServer(
        _server_dir(workdir, "memcached"),
        free_port(),
        memory_mb=memory_mb,
        startup_timeout=startup_timeout,
    )
    return _start_with_port_retries(server)


# --------------------------------------------------------------------------- etcd


def _http_get_json(url: str, timeout: float) -> object:
    # No proxies: an http_proxy in the environment must not intercept loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return json.loads(response.read())


class EtcdServer(ServerProcess):
    """One etcd member, alone or as part of an `EtcdCluster`."""

    kind = "etcd"

    def __init__(
        self,
        workdir: Path,
        port: int,
        *,
        peer_port: int,
        name: str | None = None,
        cluster_token: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(workdir, port, startup_timeout=startup_timeout)
        self.binary = require_binary("etcd")
        self.peer_port = peer_port
        self.name = name or f"corral-{secrets.token_hex(4)}"
        # Unique per cluster so members of two test clusters can never merge,
        # even if one reuses the other's recycled ports.
        self.cluster_token = cluster_token or f"corral-{secrets.token_hex(8)}"
        self.data_dir = self.workdir / "data"
        self.initial_cluster = f"{self.name}={self.peer_url}"

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def _command(self) -> list[str]:
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.cluster_token,
            # 3.4 defaults to the deprecated capnslog logger and warns about it.
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        env = _env_without("ETCD_")
        # etcd 3.4 refuses to start on architectures other than amd64 and
        # ppc64le (arm64 included) unless this names the running one.
        machine = platform.machine().lower()
        env["ETCD_UNSUPPORTED_ARCH"] = _GOARCH.get(machine, machine)
        return env

    def _probe(self) -> bool:
        # /health is true only once the member sees a leader, i.e. the cluster
        # can actually serve reads and writes.
        body = _http_get_json(f"{self.client_url}/health", timeout=1.0)
        return isinstance(body, dict) and body.get("health") in ("true", True)

    def _reassign_ports(self) -> None:
        self.port, self.peer_port = _free_ports(2)
        self.initial_cluster = f"{self.name}={self.peer_url}"
        # The WAL records the peer URLs; a half-born member must start afresh.
        shutil.rmtree(self.data_dir, ignore_errors=True)


class ServerGroup:
    """Servers started and stopped together (a cluster, a pool, Redlock's masters): what a
    test does to one server (stop, SIGSTOP, SIGCONT, SIGKILL), done to each of them."""

    @property
    def processes(self) -> Sequence[ServerProcess]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the servers one at a time (a cluster member spends a moment handing its
        leadership over as it goes)."""
        for process in self.processes:
            process.stop(timeout)

    def pause(self) -> None:
        """SIGSTOP every server: the whole group stops answering at once."""
        for process in self.processes:
            process.pause()

    def resume(self) -> None:
        for process in self.processes:
            process.resume()

    def kill(self) -> None:
        for process in self.processes:
            process.kill()

    def __enter__(self: _G) -> _G:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


class EtcdCluster(ServerGroup):
    """Several etcd members forming one cluster; stop members to test failover."""

    def __init__(self, members: list[EtcdServer]) -> None:
        self.members = members

    @property
    def url(self) -> str:
        """All members, so a client can fail over: ``etcd://h:p1,h:p2,h:p3``."""
        return "etcd://" + ",".join(f"{m.host}:{m.port}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    @property
    def processes(self) -> list[EtcdServer]:
        return self.members


def start_etcd(workdir: Path, *, startup_timeout: float = STARTUP_TIMEOUT) -> EtcdServer:
    """Start a single-member etcd cluster."""
    client_port, peer_port = _free_ports(2)
    server = EtcdServer(
        _server_dir(workdir, "etcd"),
        client_port,
        peer_port=peer_port,
        startup_timeout=startup_timeout,
    )
    return _start_with_port_retries(server)


def start_etcd_cluster(
    workdir: Path, size: int = 3, *, startup_timeout: float = STARTUP_TIMEOUT
) -> EtcdCluster:
    """Start ``size`` etcd members as one cluster and wait until it is healthy.

    Members are launched together because each blocks until a quorum of its
    peers is reachable; starting them one by one would deadlock.
    """
    if size < 1:
        raise ValueError(f"an etcd cluster needs at least one member, not {size}")
    token = f"corral-{secrets.token_hex(8)}"
    prefix = f"corral-{secrets.token_hex(3)}"
    members = [
        EtcdServer(
            _server_dir(workdir, "etcd"),
            0,
            peer_port=0,
            name=f"{prefix}-{i}",
            cluster_token=token,
            startup_timeout=startup_timeout,
        )
        for i in range(size)
    ]
    for attempt in range(_PORT_ATTEMPTS):
        ports = _free_ports(2 * size)
        for i, member in enumerate(members):
            member.port, member.peer_port = ports[2 * i], ports[2 * i + 1]
            shutil.rmtree(member.data_dir, ignore_errors=True)
        initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
        for member in members:
            member.initial_cluster = initial
        try:
            for member in members:
                member._launch()
            _wait_all_ready(members, time.monotonic() + startup_timeout)
        except ServerStartError as exc:
            for member in members:
                member.kill()
            if not exc.port_in_use or attempt == _PORT_ATTEMPTS - 1:
                raise
        except BaseException:
            for member in members:
                member.kill()
            raise
        else:
            return EtcdCluster(members)
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- PostgreSQL


def _traversable_by(path: Path, uid: int, gids: Iterable[int]) -> bool:
    """Whether user ``uid`` can reach ``path`` (mode bits only, no ACLs)."""
    groups = set(gids)
    for directory in (path, *path.parents):
        try:
            st = directory.stat()
        except OSError:
            return False
        if st.st_uid == uid:
            bit = 0o100
        elif st.st_gid in groups:
            bit = 0o010
        else:
            bit = 0o001
        if not st.st_mode & bit:
            return False
    return True


# Longest path of a Unix socket, including the terminating NUL (Linux).
_UNIX_PATH_MAX = 108


class PostgresServer(ServerProcess):
    """A fresh PostgreSQL cluster tuned for speed over durability.

    fsync, synchronous_commit and full_page_writes are off: the data is
    thrown away after the test, and durability costs seconds per test.
    With ``tls=True`` it also serves TLS (``ssl=on``) with a certificate for
    127.0.0.1 and localhost from a throwaway CA (``ca_file``), and its
    ``url`` asks for ``sslmode=verify-full`` against that CA.
    """

    kind = "postgres"
    # SIGTERM is "smart" shutdown, which waits for every client to leave, so a
    # test holding a connection would hang the stop.  SIGINT is "fast".
    stop_signal = signal.SIGINT
    user: ClassVar[str] = "corral"
    database: ClassVar[str] = "corral"

    def __init__(
        self,
        workdir: Path,
        port: int,
        *,
        tls: bool = False,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(workdir, port, startup_timeout=startup_timeout)
        self.tls = tls
        self.ca_file: Path | None = None
        self._tls_files: tuple[Path, Path] | None = None
        if tls:
            require_binary("openssl")
        # Every tool from the directory holding the server binary, so initdb's
        # catalog version matches the postgres that reads it.
        self.bindir = Path(require_binary("postgres")).resolve().parent
        for tool in ("initdb", "pg_isready", "createdb"):
            if not _executable(self.bindir / tool):
                raise ServerUnavailable(
                    f"{self.bindir} has postgres but no {tool}; install the "
                    "complete server with `sudo apt-get install -y postgresql`"
                )
        self.os_user: str | None = None
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root; Debian's package creates this user.
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise ServerUnavailable(
                    "PostgreSQL refuses to run as root and there is no `postgres` user "
                    "to run it as; install it with `sudo apt-get install -y postgresql`"
                ) from None
            self.os_user = "postgres"
        self.data_dir = self.workdir / "data"
        self.socket_dir = self.workdir / "sock"
        self._database_created = False

    @property
    def url(self) -> str:
        url = f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"
        if self.tls:
            url += f"?sslmode=verify-full&sslrootcert={quote(str(self.ca_file), safe='/')}"
        return url

    def _run_as(self) -> str | None:
        return self.os_user

    def _env(self) -> dict[str, str]:
        env = _env_without("PG")
        # initdb otherwise probes every zone file to guess the local time zone.
        env["TZ"] = "UTC"
        if self.os_user is not None:
            entry = pwd.getpwnam(self.os_user)
            env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
        return env

    def _owned_dir(self, path: Path) -> Path:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.os_user is not None:
            entry = pwd.getpwnam(self.os_user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        return path

    def _external_dir(self, prefix: str) -> Path:
        # A directory the postgres user can reach when the caller's is private.
        for candidate in (tempfile.gettempdir(), "/tmp", "/var/tmp"):
            base = Path(candidate)
            if self.os_user is None or self._reachable(base):
                path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
                _EXTERNAL_DIRS.append((os.getpid(), path))
                return self._owned_dir(path)
        raise ServerStartError(
            "found no temporary directory the `postgres` user can reach for the data directory"
        )

    def _reachable(self, path: Path) -> bool:
        assert self.os_user is not None
        entry = pwd.getpwnam(self.os_user)
        return _traversable_by(path, entry.pw_uid, os.getgrouplist(entry.pw_name, entry.pw_gid))

    def _prepare(self) -> None:
        if self.os_user is not None:
            if self._reachable(self.workdir.parent):
                self._owned_dir(self.workdir)
            else:
                # pytest's tmp_path lives under /tmp/pytest-of-root, mode 0700,
                # and pytest resets that mode on every run, so the postgres user
                # cannot reach it; keep the cluster outside and link to it.
                home = self._external_dir("corral-pg-")
                with contextlib.suppress(OSError):
                    (self.workdir / "pgdata").symlink_to(home, target_is_directory=True)
                self.data_dir = home / "data"
                self.socket_dir = home / "sock"
        if len(str(self.socket_dir)) + len("/.s.PGSQL.65535") >= _UNIX_PATH_MAX:
            self.socket_dir = self._external_dir("corral-pgs-")
        self._owned_dir(self.socket_dir)
        self._initdb()
        if self.tls:
            self._make_tls()

    def _make_tls(self) -> None:
        """A CA and a server certificate; the key readable by the server's user alone."""
        tls_dir = self._owned_dir(self.data_dir.parent / "tls")
        self.ca_file, _, cert_file, key_file = _make_tls_files(tls_dir)
        # The server refuses a key file others may read; and the CA file must be
        # readable by the clients (the tests), who may be another user.
        os.chmod(key_file, 0o600)
        os.chmod(cert_file, 0o644)
        os.chmod(self.ca_file, 0o644)
        if self.os_user is not None:
            entry = pwd.getpwnam(self.os_user)
            for path in (cert_file, key_file):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._tls_files = (cert_file, key_file)

    def _initdb(self) -> None:
        command = [
            str(self.bindir / "initdb"),
            "-D", str(self.data_dir),
            "-U", self.user,
            "-A", "trust",
            "-E", "UTF8",
            # The C locale exists everywhere; a missing en_US.UTF-8 in a slim
            # container is the classic reason initdb fails.
            "--no-locale",
            "--no-sync",
        ]  # fmt: skip
        user = self.os_user
        entry = pwd.getpwnam(user) if user is not None else None
        with self.log_path.open("ab") as log:
            offset = log.tell()
            log.write(f"--- corral: {shlex.join(command)}\n".encode())
            log.flush()
            try:
                result = subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir.parent,
                    env=self._env(),
                    user=user,
                    group=entry.pw_gid if entry else None,
                    extra_groups=os.getgrouplist(entry.pw_name, entry.pw_gid) if entry else None,
                    timeout=max(self.startup_timeout, 60.0),
                )
            except subprocess.TimeoutExpired:
                returncode: int | str = "a timeout"
            else:
                returncode = result.returncode
        if returncode != 0:
            raise ServerStartError(
                f"initdb failed with {returncode}",
                log_path=self.log_path,
                log_tail=_tail(self.log_path, offset=offset),
            )

    def _command(self) -> list[str]:
        return [
            str(self.bindir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            "-k", str(self.socket_dir),
            "-c", f"listen_addresses={LOCALHOST}",
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            # Tests open many stores at once (40 clients each with its own pool in the
            # cache stampede test); the default 100 connections is not enough.
            "-c", "max_connections=300",
            *self._tls_command(),
        ]  # fmt: skip

    def _tls_command(self) -> list[str]:
        if self._tls_files is None:
            return []
        cert_file, key_file = self._tls_files
        return [
            "-c", "ssl=on",
            "-c", f"ssl_cert_file={cert_file}",
            "-c", f"ssl_key_file={key_file}",
        ]  # fmt: skip

    def _client(self, tool: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(self.bindir / tool),
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-U",
                self.user,
                *args,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=_env_without("PG"),
            timeout=timeout,
        )

    def _probe(self) -> bool:
        try:
            result = self._client("pg_isready", "-d", "postgres", "-t", "1", timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0

    def _on_ready(self, deadline: float) -> None:
        if self._database_created:
            return
        try:
            result = self._client(
                "createdb", self.database, timeout=max(5.0, deadline - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            raise self._start_error(f"createdb {self.database} timed out") from None
        if result.returncode != 0:
            raise self._start_error(f"createdb {self.database} failed:\n{result.stderr}")
        self._database_created = True


def start_postgres(
    workdir: Path, *, tls: bool = False, startup_timeout: float = STARTUP_TIMEOUT
) -> PostgresServer:
    """initdb a new cluster under ``workdir``, start it and create database ``corral``.

    ``tls=True``: it serves TLS too (see `PostgresServer`).
    """
    server = PostgresServer(
        _server_dir(workdir, "postgres"), free_port(), tls=tls, startup_timeout=startup_timeout
    )
    return _start_with_port_retries(server)


# --------------------------------------------------------------------------- Redlock


class RedisMaster(RedisServer):
    """A redis-server that keeps its data across a crash: AOF, fsynced at every write.

    Redlock's safety rests on a restarted master remembering the locks (and the
    fencing counters) it granted, so these masters can be SIGKILLed and restarted
    by the fault tests without forgetting anything.
    """

    def _command(self) -> list[str]:
        cmd = super()._command()
        at = cmd.index("--appendonly")
        cmd[at + 1] = "yes"
        return [*cmd, "--appendfsync", "always"]


class RedisMasters(ServerGroup):
    """Independent Redis masters for `redis+redlock://`; each one is in `masters`."""

    def __init__(self, masters: Sequence[RedisMaster]) -> None:
        self.masters = list(masters)

    @property
    def url(self) -> str:
        return "redis+redlock://" + ",".join(f"{m.host}:{m.port}" for m in self.masters)

    @property
    def processes(self) -> list[RedisMaster]:
        return self.masters


def start_redis_masters(
    workdir: Path, n: int = 3, *, startup_timeout: float = STARTUP_TIMEOUT
) -> RedisMasters:
    """Start `n` independent redis-servers (no replication between them), each persistent."""
    started: list[RedisMaster] = []
    try:
        for _ in range(n):
            master = RedisMaster(
                _server_dir(workdir, "redis"), free_port(), startup_timeout=startup_timeout
            )
            started.append(_start_with_port_retries(master))
    except BaseException:
        for master in started:
            master.kill()
        raise
    return RedisMasters(started)


# --------------------------------------------------------------------------- pools


class ServerPool(ServerGroup):
    """Independent servers of one kind that a client spreads keys over (a corral pool)."""

    def __init__(self, members: list[MemcachedServer] | list[RedisServer], url: str) -> None:
        self.members: list[Any] = list(members)
        self._url = url

    @property
    def url(self) -> str:
        """Every member in one URL: ``memcached://h:p1,h:p2`` or ``redis://h:p1,h:p2/0``."""
        return self._url

    @property
    def hosts(self) -> list[str]:
        """Each member as ``host:port``, the name a corral pool's ring gives it."""
        return [f"{member.host}:{member.port}" for member in self.members]

    def member(self, server: str) -> Any:
        """The member a ring names ``host:port``."""
        return self.members[self.hosts.index(server)]

    @property
    def processes(self) -> list[Any]:
        return self.members

    def start(self) -> None:
        """Start every member again (each on its port), as after `stop`."""
        for member in self.members:
            member.start()


def _start_pool(starts: list[Callable[[], Any]]) -> list[Any]:
    started: list[Any] = []
    try:
        for start in starts:
            started.append(start())
    except BaseException:
        for member in started:
            member.stop()
        raise
    return started


def start_memcached_pool(workdir: Path, count: int = 5) -> ServerPool:
    """Start `count` memcached servers, for a ``memcached://a,b,...`` pool."""
    members = _start_pool([lambda: start_memcached(workdir) for _ in range(count)])
    hosts = ",".join(f"{m.host}:{m.port}" for m in members)
    return ServerPool(members, f"memcached://{hosts}")


def start_redis_pool(workdir: Path, count: int = 3) -> ServerPool:
    """Start `count` independent redis servers, for a ``redis://a,b,.../0`` pool."""
    members = _start_pool([lambda: start_redis(workdir) for _ in range(count)])
    hosts = ",".join(f"{m.host}:{m.port}" for m in members)
    return ServerPool(members, f"redis://{hosts}/0")


# --------------------------------------------------------------------------- Redis Cluster

# Slots a cluster divides among its masters (Redis Cluster's fixed number).
REDIS_CLUSTER_SLOTS = 16384


class RedisClusterNode(RedisServer):
    """One redis-server with `cluster-enabled yes`, its cluster bus on a port of its own.

    The bus port is chosen like the client port (Redis would otherwise take
    port + 10000, which may be taken or past 65535). The node timeout is short
    so that a killed master's replica takes over within a few seconds.
    """

    kind = "redis-cluster"

    def __init__(
        self,
        workdir: Path,
        port: int,
        *,
        bus_port: int,
        node_timeout_ms: int = 1000,
        ca: tuple[Path, Path] | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(workdir, port, tls=ca is not None, startup_timeout=startup_timeout)
        self.bus_port = bus_port
        self.node_timeout_ms = node_timeout_ms
        self.node_id = ""
        # With TLS every node's certificate comes from one CA: nodes verify each other.
        self._shared_ca = ca

    def _prepare(self) -> None:
        if self._shared_ca is not None:
            self.ca_file, self._ca_key, self.cert_file, self.key_file = _make_tls_files(
                self.workdir, ca=self._shared_ca
            )

    def _command(self) -> list[str]:
        tls = ["--tls-cluster", "yes", "--tls-replication", "yes"] if self.tls else []
        return [
            *super()._command(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.workdir / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-port", str(self.bus_port),
            *tls,
        ]  # fmt: skip

    def _reassign_ports(self) -> None:
        self.port, self.bus_port = _free_ports(2)

    def call(self, *args: str, timeout: float = 2.0) -> str:
        """One command's reply as text (for the fixture and fault tests)."""
        return self._call(*args, timeout=timeout).decode(errors="replace")

    def cluster_info(self) -> dict[str, str]:
        lines = self.call("CLUSTER", "INFO").splitlines()
        return dict(line.split(":", 1) for line in lines if ":" in line)

    def nodes(self) -> list[list[str]]:
        """`CLUSTER NODES` as this node sees it, a list of fields per node."""
        return [line.split() for line in self.call("CLUSTER", "NODES").splitlines() if line]


class RedisClusterServers(ServerGroup):
    """Masters and replicas forming one Redis Cluster; kill a master to test failover."""

    def __init__(self, masters: list[RedisClusterNode], replicas: list[RedisClusterNode]) -> None:
        self.masters = masters
        self.replicas = replicas

    @property
    def nodes(self) -> list[RedisClusterNode]:
        return [*self.masters, *self.replicas]

    @property
    def processes(self) -> list[RedisClusterNode]:
        return self.nodes

    @property
    def url(self) -> str:
        """Every node as a seed: ``redis+cluster://h:p1,h:p2,...`` (``rediss+cluster://``
        with TLS, whose clients need ``ssl_ca_certs=`` the nodes' ``ca_file``)."""
        scheme = "rediss+cluster" if self.masters[0].tls else "redis+cluster"
        return f"{scheme}://" + ",".join(f"{n.host}:{n.port}" for n in self.nodes)

    @property
    def ca_file(self) -> Path | None:
        """The CA every node's certificate comes from (TLS only)."""
        return self.masters[0].ca_file

    def running(self) -> list[RedisClusterNode]:
        return [node for node in self.nodes if node.is_running]

    def master_of(self, slot: int) -> RedisClusterNode:
        """The node serving `slot` now, as the running nodes see it."""
        by_id = {node.node_id: node for node in self.nodes}
        for line in self.running()[0].nodes():
            if "master" not in line[2] or "fail" in line[2]:
                continue
            for span in line[8:]:
                if span.startswith("["):
                    continue  # a slot being migrated
                low, _, high = span.partition("-")
                if int(low) <= slot <= int(high or low):
                    return by_id[line[0]]
        raise ServerError(f"no master serves slot {slot}")

    def keyslot(self, key: str) -> int:
        return int(self.running()[0].call("CLUSTER", "KEYSLOT", key))

    def wait_ok(self, timeout: float = STARTUP_TIMEOUT) -> None:
        """Wait until every running node sees the cluster whole (`cluster_state:ok`),
        every slot served, and the same masters."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                nodes = self.running()
                infos = [node.cluster_info() for node in nodes]
                views = {
                    tuple(sorted(line[0] for line in node.nodes() if "master" in line[2]
                                 and "fail" not in line[2] and len(line) > 8))
                    for node in nodes
                }  # fmt: skip
                if len(views) == 1 and all(
                    info.get("cluster_state") == "ok"
                    and info.get("cluster_slots_ok") == str(REDIS_CLUSTER_SLOTS)
                    for info in infos
                ):
                    return
                last = repr(infos[0])
            except (OSError, _RedisReplyError) as exc:
                last = repr(exc)
            if time.monotonic() >= deadline:
                raise ServerStartError(f"Redis Cluster not ok within {timeout:g} s: {last}")
            time.sleep(0.05)

    def start(self) -> None:
        """Start every stopped node again on its ports; each reads the cluster's layout
        back from its nodes.conf (the data is gone: no persistence). Returns once the
        cluster is whole again."""
        for node in self.nodes:
            node.start()
        self.wait_ok()


def _form_redis_cluster(masters: list[RedisClusterNode], replicas: list[RedisClusterNode]) -> None:
    """What `redis-cli --cluster create --cluster-replicas 1` does, by hand: slots in equal
    ranges to the masters, distinct config epochs, MEET, then each replica follows one master.
    """
    nodes = [*masters, *replicas]
    for node in nodes:
        node.node_id = node.call("CLUSTER", "MYID")
    share = REDIS_CLUSTER_SLOTS // len(masters)
    for i, master in enumerate(masters):
        low = i * share
        high = REDIS_CLUSTER_SLOTS - 1 if i == len(masters) - 1 else low + share - 1
        master.call("CLUSTER", "ADDSLOTSRANGE", str(low), str(high))
    for epoch, node in enumerate(nodes, start=1):
        node.call("CLUSTER", "SET-CONFIG-EPOCH", str(epoch))
    first = nodes[0]
    for node in nodes[1:]:
        first.call("CLUSTER", "MEET", node.host, str(node.port), str(node.bus_port))
    deadline = time.monotonic() + STARTUP_TIMEOUT
    ids = {node.node_id for node in nodes}
    while True:
        # A replica can follow only a master it knows (the handshake done).
        if all(
            {line[0] for line in node.nodes() if "handshake" not in line[2]} >= ids
            for node in replicas
        ):
            break
        if time.monotonic() >= deadline:
            raise ServerStartError("Redis Cluster nodes did not meet in time")
        time.sleep(0.05)
    for master, replica in zip(masters, replicas, strict=True):
        replica.call("CLUSTER", "REPLICATE", master.node_id)


def start_redis_cluster(
    workdir: Path,
    *,
    masters: int = 3,
    node_timeout_ms: int = 1000,
    tls: bool = False,
    startup_timeout: float = STARTUP_TIMEOUT,
) -> RedisClusterServers:
    """Start a Redis Cluster of `masters` masters, each with one replica, on free ports.

    Returns once every node sees `cluster_state:ok` and every replica's link to its
    master is up, so a failover has a replica to promote. With `tls`, clients, the
    cluster bus and replication all speak TLS, with certificates from one CA.
    """
    count = 2 * masters
    nodes: list[RedisClusterNode] = []
    ca: tuple[Path, Path] | None = None
    if tls:
        ca_dir = _server_dir(workdir, "redis-cluster-ca")
        ca_file, ca_key, _, _ = _make_tls_files(ca_dir)
        ca = (ca_file, ca_key)
    try:
        ports = _free_ports(2 * count)
        for i in range(count):
            nodes.append(
                RedisClusterNode(
                    _server_dir(workdir, "redis-cluster"),
                    ports[2 * i],
                    bus_port=ports[2 * i + 1],
                    node_timeout_ms=node_timeout_ms,
                    ca=ca,
                    startup_timeout=startup_timeout,
                )
            )
        for node in nodes:
            _start_with_port_retries(node)
        cluster = RedisClusterServers(nodes[:masters], nodes[masters:])
        _form_redis_cluster(cluster.masters, cluster.replicas)
        cluster.wait_ok(startup_timeout)
        deadline = time.monotonic() + startup_timeout
        for replica in cluster.replicas:
            while b"master_link_status:up" not in replica._call("INFO", "replication"):
                if time.monotonic() >= deadline:
                    raise replica._start_error("replica's link to its master is not up")
                time.sleep(0.05)
        return cluster
    except BaseException:
        for node in nodes:
            node.kill()
        raise
