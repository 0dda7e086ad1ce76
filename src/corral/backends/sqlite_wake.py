"""Wake-ups between the processes that share one SQLite file: a datagram per release.

SQLite cannot notify anyone, but every process that shares the file is on
this machine, and the OS can carry a wake-up between them. Each process that
has waiters for a store opens one Unix datagram socket (a `Doorbell`) and
registers its address in the store's `waiters` table for the names it waits
on; a release reads those addresses in its own transaction and, after the
COMMIT, sends each one datagram (`ring`). The receiving process's listener
wakes the waiters of that name. The address and the registration are the
backend's business (`corral._async.backends.sqlite`); this module is the
socket side, blocking and shared by both flavours.

**Addresses.** On Linux the socket lives in the abstract namespace: it has no
file, and it vanishes with the last descriptor, even when the process is
killed. Elsewhere it is a socket file in a private temporary directory
(mode 0700), removed when the store is closed; a killed process leaves that
directory behind in the temporary folder, as any crashed program does.

**Never blocking a release.** Datagrams are sent without waiting (a
non-blocking socket). An address whose socket is gone (a crashed process)
refuses at once and is reported back, so its registration can be deleted; a
full receive queue (`EAGAIN`) drops the datagram. That loss is detected at
the receiving end instead: Linux queues at most `net.unix.max_dgram_qlen`
datagrams per socket (10 by default) before it refuses more, so a listener
that reads that many in one pass may have missed one and wakes every waiter
it has (`Doorbell.drain`).

**A full send buffer.** `EAGAIN` has a second cause that nobody would
notice: a datagram waiting in a receiver's queue is charged to the socket
that sent it, so a few dozen receivers that do not read (stopped processes,
each holding a full queue) fill the sending socket's buffer, and from then
on every send from it fails, to receivers that read as well. So on `EAGAIN`
the `Ringer` sends once more from a fresh socket, whose buffer is empty: if
that one delivers, it replaces the full one; if it is refused too, the
receiver's own queue is full, and the receiver notices. What bounds the
damage: a receiver's queue holds at most `max_dgram_qlen` + 1 datagrams,
whoever sent them, so a stopped process pins at most that many (a few kB,
freed when it reads or dies), and it stops being sent anything once its
registration lapses (`REGISTRATION_TTL`, as it cannot renew it); until then
each release that names it costs one extra socket. A wake-up therefore never
goes missing without its waiters re-attempting.

**What a datagram says.** One version byte, the 16-byte BLAKE2b digest of
the lock name (names are any `str`, up to megabytes, and a datagram must
stay small), and for a fair lock the digest of the queue's head, so only
that waiter re-attempts; everyone else would only find the lock taken. A
semaphore's name is digested in a domain of its own, so a lock and a
semaphore that share a name never wake each other's waiters; a freed slot
names no head (several waiters may now fit), so every waiter of that
semaphore re-attempts.
A stray datagram, or one for a name nobody here waits on, only wakes a
waiter early: it re-attempts and waits again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading

__all__ = ["Doorbell", "Ringer", "WakeUp", "digest", "wake_up_payload"]

log = logging.getLogger("corral.sqlite")

VERSION = b"\x01"
DIGEST_SIZE = 16
# A datagram is at most this long; anything longer is not ours.
MAX_DATAGRAM = 1 + 2 * DIGEST_SIZE
# Read at most this many datagrams per pass, so a flood cannot keep the listener reading.
MAX_PER_PASS = 1024
_QLEN_FILE = "/proc/sys/net/unix/max_dgram_qlen"
# BLAKE2b's personalization for semaphore names (at most 16 bytes).
_SEMAPHORE_DOMAIN = b"corral-semaphore"
# Errors that say nobody is at an address any more (its registration can go).
_GONE = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK, errno.EPROTOTYPE})


def digest(text: str, *, semaphore: bool = False) -> bytes:
    """A short, fixed-size stand-in for a lock name or an owner, any `str` included.

    A semaphore's name is hashed in a domain of its own (BLAKE2b's personalization),
    so the wake-ups of semaphore "x" and of lock "x" never meet.
    """
    return hashlib.blake2b(
        text.encode("utf-8", "surrogatepass"),
        digest_size=DIGEST_SIZE,
        person=_SEMAPHORE_DOMAIN if semaphore else b"",
    ).digest()


def wake_up_payload(name: str, head: str | None, *, semaphore: bool = False) -> bytes:
    """The datagram for a release of `name`; `head` is the fair queue's live head, if any."""
    return VERSION + digest(name, semaphore=semaphore) + (b"" if head is None else digest(head))


class WakeUp:
    """A decoded datagram: which name was released and, for a fair lock, whose turn it is."""

    __slots__ = ("head", "name")

    def __init__(self, name: bytes, head: bytes | None) -> None:
        self.name = name
        self.head = head

    @classmethod
    def parse(cls, datagram: bytes) -> WakeUp | None:
        """None for anything that is not a wake-up (the listener's own stop signal included)."""
        if not datagram.startswith(VERSION):
            return None
        if len(datagram) == 1 + DIGEST_SIZE:
            return cls(datagram[1:], None)
        if len(datagram) == MAX_DATAGRAM:
            return cls(datagram[1 : 1 + DIGEST_SIZE], datagram[1 + DIGEST_SIZE :])
        return None


def _queue_limit() -> int:
    """How many datagrams may wait in a socket's queue before senders are refused."""
    try:
        with open(_QLEN_FILE, encoding="ascii") as file:
            return max(1, int(file.read().strip()))
    except (OSError, ValueError):
        # Other systems bound the queue in bytes; a small count errs on the side of
        # waking everyone, which costs a few re-attempts, never a lost wake-up.
        return 8


class Doorbell:
    """This process's receiving socket for one store; see the module docstring."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._dir: str | None = None
        self.overflow_at = min(_queue_limit(), MAX_PER_PASS)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            if sys.platform.startswith("linux"):
                self.address = b"\0corral-" + secrets.token_hex(8).encode("ascii")
                sock.bind(self.address)
            else:
                self._dir = tempfile.mkdtemp(prefix="corral-")
                path = os.path.join(self._dir, "wake")
                sock.bind(path)
                self.address = os.fsencode(path)
        except BaseException:
            sock.close()
            self._remove_dir()
            raise
        self.socket = sock
        self._closed = False
        self._mutex = threading.Lock()

    def drain(self) -> tuple[list[bytes], bool]:
        """Every datagram waiting now, and whether one may have been dropped before them."""
        got: list[bytes] = []
        while len(got) < MAX_PER_PASS:
            try:
                got.append(self.socket.recv(MAX_DATAGRAM + 1))
            except (BlockingIOError, InterruptedError):
                break
        return got, len(got) >= self.overflow_at

    def ring_self(self) -> None:
        """Wake the listener blocked on this socket (it then sees why, e.g. closing)."""
        with contextlib.suppress(OSError):
            self.socket.sendto(b"", self.address)

    def close(self) -> None:
        """Close the socket; only the process that made it removes its file."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
        self.socket.close()
        if self.pid == os.getpid():
            self._remove_dir()

    def forget_in_child(self) -> None:
        """In a forked child: close this copy of the parent's socket, and nothing else.

        No lock is taken: a parent thread may have held it at the fork.
        """
        self._mutex = threading.Lock()
        self._closed = True
        self.socket.close()

    def _remove_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class Ringer:
    """Sends wake-ups from this process: one unbound socket at a time, opened on first use.

    No lock: two threads that race to open or replace it each send on their
    own, and the socket that loses is closed once no thread sends on it any
    more (`_SendingSocket`); a lock held by a parent thread at a fork would
    instead hang the child, which opens a socket of its own.
    """

    def __init__(self) -> None:
        self._socket: socket.socket | None = None
        self._pid = 0

    def ring(self, addresses: list[bytes], payload: bytes) -> list[bytes]:
        """Send `payload` to each address without waiting; return the addresses nobody is at."""
        sock = self._sending_socket()
        if sock is None:
            return []
        gone: list[bytes] = []
        for address in addresses:
            error = _send(sock, payload, address)
            if isinstance(error, BlockingIOError):
                # This socket's buffer or the receiver's queue is full; see "A full
                # send buffer" for why a fresh socket tells them apart.
                fresh = self._open()
                if fresh is not None:
                    error = _send(fresh, payload, address)
                    if error is None:
                        if self._pid == os.getpid():
                            self._socket = fresh
                        sock = fresh
                    else:
                        fresh.close()
            if error is None:
                continue
            if error.errno in _GONE:
                gone.append(address)
            else:
                # EAGAIN from an empty socket: the receiver's queue is full; it notices.
                log.debug("wake-up datagram not sent (%s)", error)
        return gone

    def _sending_socket(self) -> socket.socket | None:
        sock = self._socket
        if sock is None or self._pid != os.getpid():
            # A forked child's copy of the parent's socket is left to the garbage
            # collector: closing a copied descriptor does not touch the parent's.
            sock = self._open()
            if sock is not None:
                self._socket, self._pid = sock, os.getpid()
        return sock

    @staticmethod
    def _open() -> socket.socket | None:
        try:
            sock = _SendingSocket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError as exc:
            log.debug("cannot open a socket to send wake-ups (%s)", exc)
            return None
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()


def _send(sock: socket.socket, payload: bytes, address: bytes) -> OSError | None:
    try:
        sock.sendto(payload, address)
    except OSError as exc:
        return exc
    return None


class _SendingSocket(socket.socket):
    """A socket that other threads may still be sending on when the ringer drops it.

    Closing it then could close a descriptor number that another thread is
    about to use (and that may meanwhile name something else); it is closed
    instead when the last reference to it goes, which no sender still holds.
    """

    def __del__(self) -> None:
        self.close()
