"""Started by `corral run` in place of the command: ties it to corral's life, then execs it.

    python -I -S _launch.py CORRAL_PID WATCH_FD ERROR_FD -- CMD [ARG...]

corral starts this script in a new session, so the command gets a process group of its
own that corral can signal as a whole. It is a separate, fresh interpreter because code
that runs between fork and exec in a process with threads (corral has its renewal
thread running by then) can deadlock on a lock another thread held at the fork, which
is why `preexec_fn` is unsafe there. Here there is one thread, so fork and prctl are
safe. It imports nothing of corral and only the standard library, and runs with `-I -S`
so that it starts quickly and ignores the user's PYTHON* variables (the command still
gets them).

Before it execs the command (which so keeps this pid, corral as its parent and its own
exit status) it:

1. forks a watcher that stays in the command's session but leaves its process group,
   so that the signals corral sends to the group do not reach it. The watcher reads a
   socket whose other end only corral holds. corral writes one byte when it is done
   with the command; if the socket closes without it, corral died (SIGKILL, the OOM
   killer, a crash) while the command may still run without the lock, and the watcher
   SIGKILLs the command's whole process group, grandchildren included. This needs
   nothing but sockets that close when their process dies, so it works off Linux too.
   While the watcher lives, the command's session (whose id is the group's id) keeps
   that id from being reused, so it never signals a stranger's group;
2. on Linux, sets PR_SET_PDEATHSIG to SIGKILL, so that the kernel kills the command
   itself when corral dies, even if the watcher was killed as well. The death signal
   is only sent for a parent alive at the prctl, so it then compares getppid() with
   corral's pid: if corral is already gone, the command is never started;
3. gives back the signal dispositions that Python changed at its start (SIGPIPE and
   SIGXFSZ ignored, SIGINT handled), so the command starts with those corral was given.

An exec that fails is reported to corral on ERROR_FD ("errno strerror"); the pipe is
close-on-exec, so corral reading end-of-file means the command is running.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys

# corral writes this byte to the watcher once the command and its group are gone.
DONE = b"."

# linux/prctl.h
PR_SET_PDEATHSIG = 1


def _restore_signals() -> None:
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    # Python handles SIGINT unless it was ignored when it started; keep an ignore.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def _watch(corral_pid: int, watch_fd: int) -> None:
    """The watcher's whole life: wait for corral's word, or for its death."""
    group = os.getpgid(0)
    os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # stderr stays: the one line below is for whoever reads corral's
    os.close(null)
    received = b""
    while True:
        try:
            chunk = os.read(watch_fd, 64)
        except OSError:
            chunk = b""
        if not chunk:
            break
        received += chunk
        if DONE in received:
            return
    killed = False
    for _ in range(3):  # a fork racing the first kill is caught by the next
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        killed = True
    if killed:
        message = (
            f"corral: corral (pid {corral_pid}) died while its command ran; killed the "
            f"command's process group ({group}) so it does not run on without the lock\n"
        )
        with contextlib.suppress(OSError):
            os.write(2, message.encode())


def _start_watcher(corral_pid: int, watch_fd: int, error_fd: int) -> None:
    if os.fork() != 0:
        return
    try:
        os.close(error_fd)  # corral's end-of-file must come from the command's exec alone
        _watch(corral_pid, watch_fd)
    finally:
        os._exit(0)


def _die_with(corral_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(
                ctypes.c_int(PR_SET_PDEATHSIG),
                ctypes.c_ulong(signal.SIGKILL),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
            )
        except (ImportError, OSError, AttributeError):
            pass  # the watcher still stops the command when corral dies
    if os.getppid() != corral_pid:
        # corral died before the prctl: nobody would stop the command, so never start it.
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    corral_pid, watch_fd, error_fd = (int(word) for word in argv[1:4])
    if argv[4:5] != ["--"] or len(argv) < 6:
        os.write(2, b"corral: usage: _launch.py CORRAL_PID WATCH_FD ERROR_FD -- CMD [ARG...]\n")
        os._exit(2)
    command = argv[5:]
    _restore_signals()
    os.set_inheritable(error_fd, False)
    _start_watcher(corral_pid, watch_fd, error_fd)
    os.close(watch_fd)
    _die_with(corral_pid)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        report = f"{exc.errno or 0} {exc.strerror or exc}"
        os.write(error_fd, report.encode("utf-8", "replace"))
        os._exit(127 if exc.errno == errno.ENOENT else 126)


if __name__ == "__main__":
    main(sys.argv)
