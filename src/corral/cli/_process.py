"""The command `corral run` runs: its own process group, signalled as a whole, dying with corral.

A command is often a shell script: `sh -c 'a; b'` or `make` runs its work in children.
Signalling the direct child alone would stop the shell and leave `a` working on without
the lock, so the command runs in a session and process group of its own (created by the
kernel between fork and exec, `start_new_session`, with no Python code there) and every
signal goes to the group. Being in its own session, the command also no longer gets the
terminal's signals: Ctrl-C reaches corral alone, which passes it on once.

When corral dies without cleaning up (SIGKILL, the OOM killer), the command must not run
on while the lock expires and a second instance starts elsewhere: `_launch.py` (see its
docstring) starts a watcher that kills the group then, and on Linux asks the kernel to
kill the command itself too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["CommandGroup", "StartError", "launch"]

LAUNCHER = Path(__file__).with_name("_launch.py")
# Must match _launch.DONE (that module is a script run by path, not imported).
DONE = b"."
# How long to wait for the watcher to leave once told the command is done.
WATCHER_EXIT_TIMEOUT = 5.0


class StartError(Exception):
    """The command could not be started; `status` is what a shell would exit with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _start_error(program: str, code: int, reason: str) -> StartError:
    if code == errno.ENOENT:
        return StartError(f"{program}: command not found", 127)
    return StartError(f"{program}: cannot execute: {reason}", 126)


class CommandGroup:
    """A started command: its process (the group's leader) and its process group.

    Signals go through `signal()`, which stops sending once `close()` has said the
    group is done with: past that point its id could name someone else's group.
    Safe to call from any thread and from signal handlers (the mutex is reentrant).
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        watch: socket.socket | None,
        errors: int | None,
        program: str,
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.pgid = proc.pid  # the leader of a new session leads its group too
        self._watch = watch
        self._errors = errors
        self._program = program
        self._mutex = threading.RLock()
        self._closed = False

    def wait_started(self) -> None:
        """Return once the command runs (its exec succeeded); StartError if it could not."""
        if self._errors is None:
            return
        report = b""
        try:
            while chunk := os.read(self._errors, 1024):
                report += chunk
        finally:
            os.close(self._errors)
            self._errors = None
        if report:
            self.proc.wait()
            self.close()
            code, _, reason = report.decode("utf-8", "replace").partition(" ")
            raise _start_error(self._program, int(code) if code.isdigit() else 0, reason)

    def signal(self, signum: int) -> None:
        """Send `signum` to every process in the command's group."""
        with self._mutex:
            if self._closed:
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signum)

    def alive(self) -> bool:
        """Whether any process of the group still runs (the leader included)."""
        with self._mutex:
            if self._closed:
                return False
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True  # members we may not signal (a setuid program): still there
        # Killed members stay as zombies until their new parent (init) reaps them,
        # which some container inits do only now and then; they run no more code.
        return _has_live_member(self.pgid)

    def close(self) -> None:
        """Done with the group: tell the watcher (so it does not kill it) and wait for it to go."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            watch, self._watch = self._watch, None
        if watch is None:
            return
        try:
            watch.sendall(DONE)
            # The watcher's end closes when it exits: then nothing of the command is left.
            if select.select([watch], [], [], WATCHER_EXIT_TIMEOUT)[0]:
                while watch.recv(64):
                    pass
        except OSError:
            pass
        finally:
            watch.close()


def _has_live_member(pgid: int) -> bool:
    if not sys.platform.startswith("linux"):
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        # After the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def launch(command: list[str], env: dict[str, str]) -> CommandGroup:
    """Start `command` in a new session, through the launcher where it can run."""
    if not sys.executable or not LAUNCHER.is_file():
        return _launch_directly(command, env)
    ours, theirs = socket.socketpair()
    errors_read, errors_write = os.pipe()
    try:
        argv = [sys.executable, "-I", "-S", str(LAUNCHER), str(os.getpid())]
        argv += [str(theirs.fileno()), str(errors_write), "--", *command]
        proc = subprocess.Popen(
            argv,
            env=env,
            start_new_session=True,
            pass_fds=(theirs.fileno(), errors_write),
        )
    except OSError as exc:
        ours.close()
        os.close(errors_read)
        raise StartError(
            f"{command[0]}: cannot start it through {sys.executable}: {exc.strerror or exc}",
            126,
        ) from None
    finally:
        theirs.close()
        os.close(errors_write)
    return CommandGroup(proc, ours, errors_read, command[0])


def _launch_directly(command: list[str], env: dict[str, str]) -> CommandGroup:
    """Without an interpreter to run the launcher: a group of its own, no watcher."""
    try:
        proc = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as exc:
        raise _start_error(command[0], exc.errno or 0, exc.strerror or str(exc)) from None
    return CommandGroup(proc, None, None, command[0])
