"""Running a command for exactly as long as a lease is held: what `run` and `elect` share.

A lease is whatever the command was started under: a lock, a slot of a semaphore
(`corral run`), the leadership of an election (`corral elect`). Each is renewed in
the background by the library and can be lost (force-released, or its TTL ran out
while corral was stopped or cut off from the server); then the command is stopped
too, because it no longer has the exclusivity it was started under and the token
it was given is already stale. The commands only say which lease they take and how
to describe it (`Lease`); the supervision of the command is here once.

The command is its whole process group (see `_process`): signals go to the group,
and the lease is given back only once nothing of the group runs any more.

Three threads of control share the command's state: the main thread (which
starts and waits for it), signal handlers (which run on the main thread, between
its bytecodes) and the renewal thread (which reports a loss).
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import corral
from corral.cli._common import EX_LOCK_LOST, EX_UNAVAILABLE, say, seconds
from corral.cli._process import CommandGroup, StartError, launch
from corral.errors import BackendError, CorralError, LockError

__all__ = [
    "FORWARDED",
    "REPORT_TIMEOUT",
    "Interrupted",
    "Lease",
    "SignalHandlers",
    "Supervisor",
    "add_grace_argument",
    "add_ttl_argument",
    "add_wait_argument",
    "give_back",
    "take",
    "wait_seconds",
]

# Signals that mean "stop" (or "do what you do on this signal") to a supervisor: they
# are passed on to the command's group, which decides what to do, and corral follows.
FORWARDED: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)
# Those of them that ask the command to stop, rather than to do something else.
STOPPING = frozenset(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name)
)

# How long to wait for the loss report before going on, so it is never cut off.
REPORT_TIMEOUT = 5.0
# After SIGKILL, how long the group may take to be gone before corral gives up on it.
KILL_TIMEOUT = 5.0
# How often to look whether the command's group is empty, once its leader has exited.
GROUP_POLL = 0.02


# -- options both commands take ------------------------------------------------------------


def wait_seconds(text: str) -> float:
    """`--wait forever` reads better in a crontab than `--wait inf`."""
    if text.strip().lower() in {"forever", "none"}:
        return float("inf")
    return float(text)


def add_ttl_argument(parser: argparse.ArgumentParser, default: float, what: str) -> None:
    parser.add_argument(
        "--ttl",
        type=float,
        default=default,
        metavar="S",
        help=f"lease in seconds, renewed every S/3 while CMD runs; how long the {what} "
        f"outlives a corral that dies without giving it back (default: {default:g})",
    )


def add_wait_argument(parser: argparse.ArgumentParser, default: float, what: str) -> None:
    shown = "forever" if default == float("inf") else f"{default:g}, one attempt"
    parser.add_argument(
        "--wait",
        type=wait_seconds,
        default=default,
        metavar="S",
        help=f"seconds to wait for the {what}, or 'forever' (default: {shown})",
    )


def add_grace_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="S",
        help=f"seconds between SIGTERM and SIGKILL when corral stops CMD's process group "
        f"({what}, processes left behind) (default: 10)",
    )


# -- what a command runs under ---------------------------------------------------------------


class Lease(abc.ABC):
    """A lock, a semaphore's slot or a leadership, as the supervision sees it.

    A subclass makes the library's handle with `self.lost` as its `on_lost`, and
    says how to take it, give it back and describe it in messages.
    """

    token_name = "fencing token"
    """What the token is called in messages ("term" for a leadership)."""

    def __init__(self, store: corral.Store, what: str) -> None:
        self.store = store
        self.what = what
        """How messages name it: "lock 'job'", "a slot of semaphore 'job' (limit 3)"."""
        self.listener: Callable[[], None] | None = None

    def lost(self, handle: object = None) -> None:
        """The handle's on_lost (renewal thread): tell whoever supervises the command."""
        listener = self.listener
        if listener is not None:
            listener()

    @property
    @abc.abstractmethod
    def token(self) -> int | None:
        """The token of the current (or just lost) acquisition, else None."""

    @abc.abstractmethod
    def acquire(self) -> bool:
        """Take it, waiting as the command's --wait says; False when it was busy throughout."""

    @abc.abstractmethod
    def release(self, hold_for: float = 0.0) -> None:
        """Give it back; LockLost/LockExpired when it had been lost meanwhile."""

    @abc.abstractmethod
    def holder(self) -> str:
        """Who keeps it from us now, read from the server, for the message on busy."""

    @abc.abstractmethod
    def why_lost(self) -> str:
        """What the server says now, for the message on a loss."""

    @abc.abstractmethod
    def environment(self) -> dict[str, str]:
        """What the command is told of the lease it runs under."""

    def release_quietly(self) -> None:
        """Give back a lease the command never used (or lost); the TTL frees it if this fails."""
        if self.token is None:
            return
        with contextlib.suppress(CorralError):
            self.release()

    def gone(self) -> str:
        """What a lease the server no longer has went through."""
        return (
            "the server no longer has it: it was force-released (corral release "
            "--force), or its TTL ran out while it could not be renewed (corral "
            "stopped, suspended or cut off from the server)"
        )


# -- signals ---------------------------------------------------------------------------------


class Interrupted(BaseException):
    """A stop signal before the command started: unwinds the wait for the lease.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on
    the way swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class SignalHandlers:
    """The handlers corral sets while it waits and while the command runs, and the
    ones it was started with, put back at the end.

    A signal corral was started ignoring (`nohup` ignores SIGHUP, a shell's
    background job SIGINT) stays ignored, and the command inherits that, as it
    would without corral.
    """

    def __init__(self) -> None:
        self.saved: dict[int, Any] = {}
        self.ignored: set[int] = set()

    def set(self, handler: Any, signals: tuple[int, ...] = FORWARDED) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals only reach the main thread; embedded callers keep theirs
        for signum in signals:
            if signum not in self.saved and signum not in self.ignored:
                current = signal.getsignal(signum)
                if current is signal.SIG_IGN:
                    self.ignored.add(signum)
                else:
                    self.saved[signum] = current
            if signum not in self.ignored:
                signal.signal(signum, handler)

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)


# -- the command under one acquisition -------------------------------------------------------


class Supervisor:
    """One acquisition's command, shared by the main thread, signal handlers and the renewer.

    The mutex is reentrant because a signal handler runs on the main thread
    and may interrupt it inside its own critical section.
    """

    def __init__(
        self, lease: Lease, grace: float, handlers: SignalHandlers, after_loss: str
    ) -> None:
        self.lease = lease
        self.grace = grace
        self.handlers = handlers
        self.after_loss = after_loss
        """The end of the loss report: what corral does next."""
        self.mutex = threading.RLock()
        self.group: CommandGroup | None = None
        self.running = False  # the command itself runs (the launcher has exec'd it)
        self.pending: int | None = None
        self.stop_forwarded: int | None = None  # a stop signal passed on to the command
        self.lost = False
        self.lost_while_running = False  # lost before the command exited by itself
        self.finished = False  # the command (the group's leader) has exited
        self.stopping_since: float | None = None  # SIGTERM sent by corral, SIGKILL armed
        self.killer: threading.Timer | None = None
        self.reported = threading.Event()
        lease.listener = self.on_lost

    # -- signal handlers (main thread) -----------------------------------------

    def interrupt(self, signum: int, frame: FrameType | None) -> None:
        """Before the lease is taken: stop waiting, once."""
        # A second signal must not interrupt the clean-up of the first.
        self.handlers.set(self.forward)
        raise Interrupted(signum)

    def forward(self, signum: int, frame: FrameType | None) -> None:
        """While the lease is held: the command's group decides how to stop, corral follows.

        The command is in a session of its own, so a Ctrl-C at the terminal reaches
        corral alone: this is the one time the command's group gets it.
        """
        with self.mutex:
            if signum in STOPPING:
                self.stop_forwarded = signum
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

    # -- lease lost (renewal thread) -------------------------------------------

    def on_lost(self) -> None:
        """Stop the command first, then explain: every moment it runs unprotected counts."""
        try:
            with self.mutex:
                if self.lost:
                    return
                self.lost = True
                group = self.group
                finished = self.finished
                self.lost_while_running = group is not None and not finished
                if group is not None:
                    self.stop_group(group)
            if group is not None and not finished:
                action = (
                    f"sent SIGTERM to the command's process group ({group.pgid}), SIGKILL "
                    f"follows in {self.grace:g} s if any of it is still running"
                )
            elif group is not None:
                action = "the command had already exited"
            else:
                action = "the command is not started"
            lease = self.lease
            try:
                why = lease.why_lost()
            except Exception as exc:  # the server may well be what failed
                why = f"it could not be renewed before its TTL ran out ({exc})"
            say(
                f"lost {lease.what} on {lease.store.server} ({lease.token_name} "
                f"{lease.token}): {why}; {action}; {self.after_loss}"
            )
        finally:
            self.reported.set()

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

    def run(self, command: list[str], env: dict[str, str]) -> int:
        """Start the command and wait for its whole group; the command's status."""
        started = self.start(command, env)
        if isinstance(started, int):
            return started
        return self.wait(started)

    def start(self, command: list[str], env: dict[str, str]) -> CommandGroup | int:
        """Start the command, unless a stop signal or the loss of the lease came first."""
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
        """Stop what the command left running in its group: it would run without the lease."""
        if not group.alive():
            return
        with self.mutex:
            if self.stopping_since is None:
                say(
                    f"the command exited, but left processes running in its process group "
                    f"({group.pgid}); sending them SIGTERM (SIGKILL in {self.grace:g} s) "
                    f"before giving back {self.lease.what}, which they would otherwise "
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


def take(supervisor: Supervisor) -> bool:
    """Take the lease, a stop signal unwinding the wait; once taken, signals go to the command.

    Raises `Interrupted` for a stop signal that came before the lease was taken
    (the lease is then given back at once).
    """
    handlers = supervisor.handlers
    handlers.set(supervisor.interrupt)
    try:
        acquired = supervisor.lease.acquire()
        if acquired:
            handlers.set(supervisor.forward)
            handlers.set(supervisor.suspend, (signal.SIGTSTP,))
    except Interrupted:
        # The signal may have landed just after the server granted the lease.
        supervisor.lease.release_quietly()
        raise
    return acquired


def give_back(
    supervisor: Supervisor, status: int, hold_for: float, ttl: float, *, verbose: bool = False
) -> int:
    """After the command: give the lease back; the exit status corral ends with."""
    lease = supervisor.lease
    token = lease.token
    if supervisor.lost or not supervisor.running:
        lease.release_quietly()
        if supervisor.lost:
            supervisor.reported.wait(REPORT_TIMEOUT)
            if supervisor.running:
                return EX_LOCK_LOST
        return status
    try:
        lease.release(hold_for=hold_for)
    except LockError as exc:
        # Lost between the last renewal and the command's exit: part of its work
        # may have overlapped with another holder's.
        say(
            f"{lease.what} on {lease.store.server} ({lease.token_name} {token}) was lost "
            f"before the command exited (with status {status}): {exc}"
        )
        return EX_LOCK_LOST
    except BackendError as exc:
        say(
            f"the command exited with status {status}, but giving back {lease.what} failed: "
            f"{exc}; it frees itself within {seconds(ttl)} (its TTL)"
        )
        return EX_UNAVAILABLE
    if verbose:
        kept = f", kept closed {hold_for:g} s more (--hold-for)" if hold_for else ""
        say(f"the command exited with status {status}; released {lease.what}{kept}")
    return status
