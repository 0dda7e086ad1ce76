"""`corral run NAME -- CMD`: hold a lock for exactly as long as a command runs.

The lock is renewed while the command runs and released when it exits. If it
is lost anyway (force-released, or its TTL ran out while this process was
stopped or cut off from the server), the command is stopped too: it no longer
has the exclusivity it was started under, and the fencing token it was given
is already stale.

Three threads of control share the command's state: the main thread (which
starts and waits for it), signal handlers (which run on the main thread,
between its bytecodes) and the renewal thread (which calls `on_lost`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import threading
from types import FrameType
from typing import Any

import corral
from corral.cli._common import (
    COMMON_STATUSES,
    EX_CANNOT_EXECUTE,
    EX_CONFIG,
    EX_LOCK_LOST,
    EX_NOT_FOUND,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    CliError,
    add_url_argument,
    describe_info,
    one_line,
    say,
)
from corral.core.validate import check_non_negative, check_ttl, check_wait
from corral.errors import BackendError, ConfigError, CorralError, LockError

__all__ = ["NAME", "TAKES_COMMAND", "add_parser", "run"]

NAME = "run"
TAKES_COMMAND = True

# Signals that mean "stop" to a supervisor: they are passed on to the command,
# which decides how to stop, and corral then releases the lock.
FORWARDED: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)

# How long to wait for the loss report before exiting, so it is never cut off.
REPORT_TIMEOUT = 5.0

EPILOG = f"""\
exit status:
  N    the command's own exit status (a command killed by signal N: 128+N)
{COMMON_STATUSES}
       (2 also for --limit N > 1, not available yet)
  70   the lock was lost while the command ran (force-released, or its TTL ran
       out while corral was stopped or cut off): the command got SIGTERM, then
       SIGKILL after --grace seconds
  75   the lock was not acquired within --wait: another process holds it
  126  the command could not be executed
  127  the command was not found
  128+N  corral got signal N before the command started

The command sees CORRAL_LOCK_NAME and CORRAL_LOCK_TOKEN (the fencing token, an
integer that grows with every acquisition: pass it to storage that can refuse
stale writers). SIGINT, SIGTERM and SIGHUP sent to corral are passed on to the
command; a Ctrl-C at the terminal reaches the command directly and is not sent
twice. The lock is released when the command exits (kept closed for --hold-for
seconds more if given).
"""


def _wait_seconds(text: str) -> float:
    """`--wait forever` reads better in a crontab than `--wait inf`."""
    if text.strip().lower() in {"forever", "none"}:
        return float("inf")
    return float(text)


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="run a command while holding a lock",
        usage="corral run NAME [options] -- CMD [ARG...]",
        description="Run CMD while holding the lock NAME: at most one such command runs at\n"
        "a time across every process and machine that uses the same server.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("name", metavar="NAME", help="the lock's name")
    add_url_argument(parser)
    parser.add_argument(
        "--ttl",
        type=float,
        default=30.0,
        metavar="S",
        help="lease in seconds, renewed every S/3 while CMD runs; how long the lock "
        "outlives a corral that dies without releasing it (default: 30)",
    )
    parser.add_argument(
        "--wait",
        type=_wait_seconds,
        default=0.0,
        metavar="S",
        help="seconds to wait for the lock, or 'forever' (default: 0, one attempt)",
    )
    parser.add_argument(
        "--hold-for",
        type=float,
        default=0.0,
        metavar="S",
        help="after CMD exits, keep the lock closed S more seconds: at most one run per S",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="S",
        help="if the lock is lost, seconds between SIGTERM and SIGKILL to CMD (default: 10)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=1,
        metavar="N",
        help="up to N holders at once (a semaphore); only 1 is available yet",
    )
    parser.set_defaults(handler=run, takes_command=True)


class _Interrupted(BaseException):
    """A stop signal before the command started: unwinds the wait for the lock.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on
    the way swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminal_sent_it(proc: subprocess.Popen[bytes]) -> bool:
    """Whether a SIGINT most likely came from Ctrl-C, which the command received too.

    The terminal signals its whole foreground process group; when that is
    corral's and the command's, forwarding the signal again would interrupt
    the command's own clean-up.
    """
    try:
        fd = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False
    try:
        group = os.getpgrp()
        return os.tcgetpgrp(fd) == group and os.getpgid(proc.pid) == group
    except OSError:
        return False
    finally:
        os.close(fd)


def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(OSError):  # it has just exited: nothing left to stop
        proc.send_signal(signum)


class _Supervisor:
    """The command's state, shared by the main thread, signal handlers and the renewer.

    The mutex is reentrant because a signal handler runs on the main thread
    and may interrupt it inside its own critical section.
    """

    def __init__(self, store: corral.Store, name: str, grace: float) -> None:
        self.store = store
        self.name = name
        self.grace = grace
        self.mutex = threading.RLock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: int | None = None
        self.lost = False
        self.finished = False
        self.killer: threading.Timer | None = None
        self.reported = threading.Event()

    # -- signal handlers (main thread) -----------------------------------------

    def interrupt(self, signum: int, frame: FrameType | None) -> None:
        """Before the lock is acquired: stop waiting, once."""
        # A second signal must not interrupt the clean-up of the first.
        _install(self.forward)
        raise _Interrupted(signum)

    def forward(self, signum: int, frame: FrameType | None) -> None:
        """While the lock is held: the command decides how to stop, corral follows."""
        with self.mutex:
            proc = self.proc
            if proc is None or self.finished:
                if self.pending is None:
                    self.pending = signum
                return
        if signum == signal.SIGINT and _terminal_sent_it(proc):
            return
        _send(proc, signum)

    # -- lock lost (renewal thread) --------------------------------------------

    def on_lost(self, lock: corral.Lock) -> None:
        """Stop the command first, then explain: every moment it runs unprotected counts."""
        try:
            with self.mutex:
                if self.lost:
                    return
                self.lost = True
                proc = None if self.finished else self.proc
                if proc is not None:
                    _send(proc, signal.SIGTERM)
                    self.killer = threading.Timer(self.grace, self._kill, (proc,))
                    self.killer.daemon = True
                    self.killer.start()
                finished = self.finished
            if proc is not None:
                action = (
                    f"sent SIGTERM to the command (pid {proc.pid}), SIGKILL follows in "
                    f"{self.grace:g} s if it is still running"
                )
            elif finished:
                action = "the command had already exited"
            else:
                action = "the command is not started"
            say(
                f"lost lock {self.name!r} on {self.store.server} (fencing token {lock.token}): "
                f"{self._why()}; {action}; exiting with status {EX_LOCK_LOST}"
            )
        finally:
            self.reported.set()

    def _why(self) -> str:
        try:
            info = self.store.lock_info(self.name)
        except Exception as exc:  # the server may well be what failed
            return f"it could not be renewed before its TTL ran out ({one_line(str(exc))})"
        if info is None:
            return (
                "the server no longer has it: it was force-released (corral release "
                "--force), or its TTL ran out while it could not be renewed (corral "
                "stopped, suspended or cut off from the server)"
            )
        return (
            f"it was force-released or its TTL ran out before it could be renewed, and "
            f"it is now {describe_info(info)}"
        )

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        with self.mutex:
            if not self.finished:
                _send(proc, signal.SIGKILL)

    # -- main thread -------------------------------------------------------------

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | int:
        """Start the command, unless a stop signal or the loss of the lock came first."""
        with self.mutex:
            if self.lost:
                return EX_LOCK_LOST
            if self.pending is not None:
                return 128 + self.pending
            try:
                proc = subprocess.Popen(command, env=env)
            except FileNotFoundError:
                say(f"{command[0]}: command not found")
                return EX_NOT_FOUND
            except OSError as exc:
                say(f"{command[0]}: cannot execute: {exc.strerror or exc}")
                return EX_CANNOT_EXECUTE
            self.proc = proc
            pending = self.pending
        if pending is not None:  # arrived while the command was being started
            _send(proc, pending)
        return proc

    def wait(self, proc: subprocess.Popen[bytes]) -> int:
        returncode = proc.wait()
        with self.mutex:
            self.finished = True
            if self.killer is not None:
                self.killer.cancel()
        # As shells report it: 128+N for a command killed by signal N.
        return 128 - returncode if returncode < 0 else returncode


def _install(handler: Any) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}  # signals only reach the main thread; embedded callers keep theirs
    return {signum: signal.signal(signum, handler) for signum in FORWARDED}


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _release_quietly(lock: corral.Lock) -> None:
    """Give back a lock the command never used; the TTL frees it if this fails."""
    if lock.token is None:
        return
    with contextlib.suppress(CorralError):
        lock.release()


def _not_acquired(store: corral.Store, name: str, wait: float | None) -> str:
    waited = "at once (--wait 0)" if wait == 0 else f"within {wait or float('inf'):g} s"
    try:
        info = store.lock_info(name)
    except CorralError as exc:
        holder = f"holder unknown ({exc})"
    else:
        holder = "it was busy but is free now; try again" if info is None else describe_info(info)
    return f"lock {name!r} on {store.server} not acquired {waited}: {holder}"


def run(args: argparse.Namespace) -> int:
    ttl = check_ttl(args.ttl, "--ttl")
    wait = check_wait(args.wait, "--wait")
    hold_for = check_non_negative(args.hold_for, "--hold-for")
    grace = check_non_negative(args.grace, "--grace")
    if args.limit < 1:
        raise ConfigError(f"--limit must be an integer >= 1, got {args.limit}")
    if args.limit > 1:
        raise ConfigError(
            f"--limit {args.limit} (a semaphore of {args.limit} holders) is not available in "
            "this version of corral yet; drop --limit to run under an exclusive lock"
        )
    command: list[str] | None = args.command
    if not command:
        raise CliError(
            "nothing to run: give the command after --, as in "
            f"`corral run {args.name} -- CMD [ARG...]`",
            EX_CONFIG,
        )
    with corral.connect(args.url) as store:
        supervisor = _Supervisor(store, args.name, grace)
        previous = _install(supervisor.interrupt)
        try:
            return _run(store, supervisor, args.name, ttl, wait, hold_for, command)
        except _Interrupted as exc:
            return 128 + exc.signum
        finally:
            _restore(previous)


def _run(
    store: corral.Store,
    supervisor: _Supervisor,
    name: str,
    ttl: float,
    wait: float | None,
    hold_for: float,
    command: list[str],
) -> int:
    lock = store.lock(name, ttl, wait=wait, auto_renew=True, on_lost=supervisor.on_lost)
    try:
        acquired = lock.acquire()
        if acquired:
            _install(supervisor.forward)
    except _Interrupted:
        # The signal may have landed just after the server granted the lock.
        _release_quietly(lock)
        raise
    if not acquired:
        say(_not_acquired(store, name, wait))
        return EX_TEMPFAIL
    token = lock.token
    env = {**os.environ, "CORRAL_LOCK_NAME": name, "CORRAL_LOCK_TOKEN": str(token)}
    started = supervisor.start(command, env)
    if isinstance(started, int):
        _release_quietly(lock)
        if supervisor.lost:
            supervisor.reported.wait(REPORT_TIMEOUT)
        return started
    status = supervisor.wait(started)
    if supervisor.lost:
        _release_quietly(lock)
        supervisor.reported.wait(REPORT_TIMEOUT)
        return EX_LOCK_LOST
    try:
        lock.release(hold_for=hold_for)
    except LockError as exc:
        # Lost between the last renewal and the command's exit: part of its work
        # may have overlapped with another holder's.
        say(
            f"lock {name!r} on {store.server} (fencing token {token}) was lost before the "
            f"command exited (with status {status}): {exc}"
        )
        return EX_LOCK_LOST
    except BackendError as exc:
        say(
            f"the command exited with status {status}, but releasing lock {name!r} failed: "
            f"{exc}; the lock frees itself within {ttl:g} s (its TTL)"
        )
        return EX_UNAVAILABLE
    return status
