"""`corral run NAME -- CMD`: hold a lock for exactly as long as a command runs.

The lock is renewed while the command runs and released when it exits. If it
is lost anyway (force-released, or its TTL ran out while this process was
stopped or cut off from the server), the command is stopped too: it no longer
has the exclusivity it was started under, and the fencing token it was given
is already stale.

The command is its whole process group (see `_process`): signals go to the
group, and the lock is released only once nothing of the group runs any more.

Three threads of control share the command's state: the main thread (which
starts and waits for it), signal handlers (which run on the main thread,
between its bytecodes) and the renewal thread (which calls `on_lost`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import threading
import time
from types import FrameType
from typing import Any

import corral
from corral.cli._common import (
    COMMON_STATUSES,
    EX_CONFIG,
    EX_LOCK_LOST,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    CliError,
    Target,
    add_url_argument,
    choose_store,
    describe_info,
    one_line,
    open_store,
    say,
)
from corral.cli._process import CommandGroup, StartError, launch
from corral.core.validate import check_non_negative, check_ttl, check_wait
from corral.errors import BackendError, ConfigError, CorralError, LockError

__all__ = ["NAME", "TAKES_COMMAND", "add_parser", "run"]

NAME = "run"
TAKES_COMMAND = True

# Signals that mean "stop" (or "do what you do on this signal") to a supervisor: they
# are passed on to the command's group, which decides what to do, and corral follows.
FORWARDED: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)

# How long to wait for the loss report before exiting, so it is never cut off.
REPORT_TIMEOUT = 5.0
# After SIGKILL, how long the group may take to be gone before corral gives up on it.
KILL_TIMEOUT = 5.0
# How often to look whether the command's group is empty, once its leader has exited.
GROUP_POLL = 0.02

EPILOG = f"""\
exit status:
  N    the command's own exit status (a command killed by signal N: 128+N)
{COMMON_STATUSES}
       (2 also for --limit N > 1, not available yet, and for memory:// URLs)
  70   the lock was lost while the command ran (force-released, or its TTL ran
       out while corral was stopped or cut off): the command's process group got
       SIGTERM, then SIGKILL after --grace seconds
  75   the lock was not acquired within --wait: another process holds it
       (-E/--conflict-exit-code N chooses another status)
  126  the command could not be executed
  127  the command was not found
  128+N  corral got signal N before the command started

The command runs in a process group (and session) of its own, which gets every
signal: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to corral are
passed on to the whole group (a Ctrl-C at the terminal reaches corral, which
passes it on once), and Ctrl-Z stops the group with corral. If corral dies
(SIGKILL, out of memory), the group is killed. Processes the command leaves
running in its group when it exits get SIGTERM (SIGKILL after --grace) before
the lock is released.

The command sees CORRAL_LOCK_NAME and CORRAL_LOCK_TOKEN (the fencing token, an
integer that grows with every acquisition: pass it to storage that can refuse
stale writers). The lock is released when the command exits (kept closed for
--hold-for seconds more if given).
"""


def _wait_seconds(text: str) -> float:
    """`--wait forever` reads better in a crontab than `--wait inf`."""
    if text.strip().lower() in {"forever", "none"}:
        return float("inf")
    return float(text)


def _exit_status(text: str) -> int:
    status = int(text)
    if not 0 <= status <= 255:
        raise argparse.ArgumentTypeError(f"an exit status is 0 to 255, not {status}")
    return status


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
        help="seconds between SIGTERM and SIGKILL when corral stops CMD's process group "
        "(lost lock, processes left behind) (default: 10)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=1,
        metavar="N",
        help="up to N holders at once (a semaphore); only 1 is available yet",
    )
    parser.add_argument(
        "-E",
        "--conflict-exit-code",
        type=_exit_status,
        default=EX_TEMPFAIL,
        metavar="N",
        help=f"exit status when the lock is busy (not acquired within --wait) "
        f"(default: {EX_TEMPFAIL}, as flock(1)'s -E)",
    )
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="say nothing when the lock is busy (errors are still printed): for cron, "
        "which mails any output",
    )
    talk.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say on stderr which store is used, and the lock and fencing token acquired",
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
        self.group: CommandGroup | None = None
        self.running = False  # the command itself runs (the launcher has exec'd it)
        self.pending: int | None = None
        self.lost = False
        self.finished = False  # the command (the group's leader) has exited
        self.stopping_since: float | None = None  # SIGTERM sent by corral, SIGKILL armed
        self.killer: threading.Timer | None = None
        self.reported = threading.Event()

    # -- signal handlers (main thread) -----------------------------------------

    def interrupt(self, signum: int, frame: FrameType | None) -> None:
        """Before the lock is acquired: stop waiting, once."""
        # A second signal must not interrupt the clean-up of the first.
        _install(self.forward)
        raise _Interrupted(signum)

    def forward(self, signum: int, frame: FrameType | None) -> None:
        """While the lock is held: the command's group decides how to stop, corral follows.

        The command is in a session of its own, so a Ctrl-C at the terminal reaches
        corral alone: this is the one time the command's group gets it.
        """
        with self.mutex:
            group = self.group
            if group is None or not self.running:
                if self.pending is None:
                    self.pending = signum
                return
        group.signal(signum)

    def suspend(self, signum: int, frame: FrameType | None) -> None:
        """Ctrl-Z: stop the command's group with corral, and continue it with corral.

        Left running, the command would work on while its stopped corral renews
        nothing. SIGSTOP, not SIGTSTP: the group has no terminal, and the kernel
        discards SIGTSTP for such groups.
        """
        with self.mutex:
            group = self.group
        if group is not None:
            group.signal(signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once corral is continued
        if group is not None:
            group.signal(signal.SIGCONT)

    # -- lock lost (renewal thread) --------------------------------------------

    def on_lost(self, lock: corral.Lock) -> None:
        """Stop the command first, then explain: every moment it runs unprotected counts."""
        try:
            with self.mutex:
                if self.lost:
                    return
                self.lost = True
                group = self.group
                if group is not None:
                    self.stop_group(group)
                finished = self.finished
            if group is not None and not finished:
                action = (
                    f"sent SIGTERM to the command's process group ({group.pgid}), SIGKILL "
                    f"follows in {self.grace:g} s if any of it is still running"
                )
            elif group is not None:
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

    # -- any thread ----------------------------------------------------------------

    def stop_group(self, group: CommandGroup) -> None:
        """SIGTERM to the whole group now, SIGKILL after the grace period; once."""
        with self.mutex:
            if self.stopping_since is not None:
                return
            self.stopping_since = time.monotonic()
            group.signal(signal.SIGTERM)
            group.signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
            self.killer = threading.Timer(self.grace, group.signal, (signal.SIGKILL,))
            self.killer.daemon = True
            self.killer.start()

    # -- main thread -------------------------------------------------------------

    def start(self, command: list[str], env: dict[str, str]) -> CommandGroup | int:
        """Start the command, unless a stop signal or the loss of the lock came first."""
        with self.mutex:
            if self.lost:
                return EX_LOCK_LOST
            if self.pending is not None:
                return 128 + self.pending
            try:
                group = launch(command, env)
            except StartError as exc:
                say(str(exc))
                return exc.status
            self.group = group
        try:
            # Outside the mutex: the renewer must be able to stop a slow start.
            group.wait_started()
        except StartError as exc:
            say(str(exc))
            return exc.status
        with self.mutex:
            self.running = True
            pending = self.pending
        if pending is not None:  # arrived while the command was being started
            group.signal(pending)
        return group

    def wait(self, group: CommandGroup) -> int:
        """Wait for the command, then for its whole group; return the command's status."""
        returncode = group.proc.wait()
        with self.mutex:
            self.finished = True
        self._empty_group(group)
        with self.mutex:
            if self.killer is not None:
                self.killer.cancel()
        group.close()
        # As shells report it: 128+N for a command killed by signal N.
        return 128 - returncode if returncode < 0 else returncode

    def _empty_group(self, group: CommandGroup) -> None:
        """Stop what the command left running in its group: it would run without the lock."""
        if not group.alive():
            return
        with self.mutex:
            if self.stopping_since is None:
                say(
                    f"the command exited, but left processes running in its process group "
                    f"({group.pgid}); sending them SIGTERM (SIGKILL in {self.grace:g} s) "
                    f"before releasing lock {self.name!r}, which they would otherwise "
                    "outlive"
                )
                self.stop_group(group)
            since = self.stopping_since
        assert since is not None
        deadline = since + self.grace + KILL_TIMEOUT
        while group.alive():
            if time.monotonic() > deadline:
                say(
                    f"processes of the command's group ({group.pgid}) are still there "
                    f"{KILL_TIMEOUT:g} s after SIGKILL (not ours to signal, or stuck in "
                    "the kernel); going on without them"
                )
                return
            time.sleep(GROUP_POLL)


def _install(handler: Any, signals: tuple[int, ...] = FORWARDED) -> dict[int, Any]:
    """Handle `signals`, except those this process was started ignoring.

    An ignored signal (`nohup` ignores SIGHUP, a shell's background job SIGINT)
    stays ignored, and the command inherits that, as it would without corral.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}  # signals only reach the main thread; embedded callers keep theirs
    previous: dict[int, Any] = {}
    for signum in signals:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN:
            continue
        previous[signum] = signal.signal(signum, handler)
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _release_quietly(lock: corral.Lock) -> None:
    """Give back a lock the command never used; the TTL frees it if this fails."""
    if lock.token is None:
        return
    with contextlib.suppress(CorralError):
        lock.release()


def _not_acquired(store: corral.Store, target: Target, name: str, wait: float | None) -> str:
    waited = "at once (--wait 0)" if wait == 0 else f"within {wait or float('inf'):g} s"
    try:
        info = store.lock_info(name)
    except CorralError as exc:
        holder = f"holder unknown ({one_line(str(exc))})"
    else:
        holder = "it was busy but is free now; try again" if info is None else describe_info(info)
    return (
        f"lock {name!r} on {target.shown} not acquired {waited}: {holder}; "
        f"see {target.command('status', name)}"
    )


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
    target = choose_store(args.url)
    with open_store(target) as store:
        if args.verbose:
            say(f"store {target.describe()}")
        supervisor = _Supervisor(store, args.name, grace)
        previous = _install(supervisor.interrupt)
        try:
            return _run(store, target, supervisor, args, ttl, wait, hold_for, command)
        except _Interrupted as exc:
            return 128 + exc.signum
        finally:
            _restore(previous)


def _run(
    store: corral.Store,
    target: Target,
    supervisor: _Supervisor,
    args: argparse.Namespace,
    ttl: float,
    wait: float | None,
    hold_for: float,
    command: list[str],
) -> int:
    name: str = args.name
    lock = store.lock(name, ttl, wait=wait, auto_renew=True, on_lost=supervisor.on_lost)
    suspend: dict[int, Any] = {}
    try:
        acquired = lock.acquire()
        if acquired:
            _install(supervisor.forward)
            suspend = _install(supervisor.suspend, (signal.SIGTSTP,))
    except _Interrupted:
        # The signal may have landed just after the server granted the lock.
        _release_quietly(lock)
        raise
    try:
        if not acquired:
            if not args.quiet:
                say(_not_acquired(store, target, name, wait))
            return int(args.conflict_exit_code)
        return _hold(store, supervisor, lock, args, ttl, hold_for, command)
    finally:
        _restore(suspend)


def _hold(
    store: corral.Store,
    supervisor: _Supervisor,
    lock: corral.Lock,
    args: argparse.Namespace,
    ttl: float,
    hold_for: float,
    command: list[str],
) -> int:
    name: str = args.name
    token = lock.token
    if args.verbose:
        say(
            f"acquired lock {name!r} on {store.server}: fencing token {token}, owner "
            f"{lock.owner}, ttl {ttl:g} s renewed every {ttl / 3:.3g} s; running "
            f"{shlex.join(command)}"
        )
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
    if args.verbose:
        kept = f", kept closed {hold_for:g} s more (--hold-for)" if hold_for else ""
        say(f"the command exited with status {status}; released lock {name!r}{kept}")
    return status
