# Generated from src/corral/_async/backends/memcached_conn.py by scripts/unasync.py: do not edit.
# Edit the asyncio flavour and run `python scripts/unasync.py`.
"""Connections to one memcached server: the pool, the round trips, failures as corral's errors.

The asyncio flavour; `corral._sync.backends.memcached_conn` is generated from
this file by `scripts/unasync.py`, so both flavours pool, time out and fail in
one way. Only the stream underneath differs: `corral._sync._compat.Stream`
(an asyncio transport, no thread per call) or its blocking twin (a socket).
The bytes sent and the parsing of what comes back are in
`corral.backends.memcached_proto`.

**Connections.** A pool per store and process, bounded by `max_connections` if
given (a caller waits for a free connection within `timeout`), each connection
lent to one caller at a time for a whole operation. `timeout` bounds a whole
operation (waiting for a connection, connecting, TLS, every round trip), not
each socket call. A connection that saw any error or interruption is closed,
never reused, so a reply can never be read by the wrong caller; an idle
connection that turns readable (the server closed it, for instance by
restarting) is dropped before reuse, because resending a command after an
error could apply it twice. After `fork` the child forgets the parent's
connections (closing only its own copies of the descriptors) and opens its
own. Each new connection authenticates if the URL has credentials and checks
the server's version.

**Cancellation** (asyncio). A task cancelled during a round trip stops there:
its request may have reached the server, and its reply may still come, so the
connection is marked broken and closed as the cancellation passes through, and
the next caller gets another connection; nobody ever reads that reply. What a
cancelled request did on the server stays done: for an acquisition that may
be a lock taken. The lock logic never lets that orphan a lock: it runs each
attempt as a task of its own that its caller's cancellation does not stop
(`undo_if_interrupted`), and only once that attempt has finished, granted or
not, does it release what the attempt may have taken, so the release cannot
overtake the acquisition it undoes. A task cancelled while it waits for a
pooled connection takes none. In the blocking flavour nothing is cancelled
(an interrupt such as Ctrl-C breaks the connection the same way).

Connections of a pool belong to the event loop that opened them: one found
idle under another (running) loop is closed, not used. Opening a connection to
a host name (not an IP address) resolves it with the event loop's resolver,
which runs `getaddrinfo` on the default executor: once per new connection,
never per call.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from corral._sync._compat import Condition, Stream, open_stream
from corral.backends.memcached_proto import (
    MIN_VERSION,
    CasDisabled,
    ConnectionClosed,
    MemcachedOptions,
    PoolExhausted,
    ProtocolError,
    Reply,
    ReplyParser,
    ServerRefused,
    StoreClosed,
    TooOld,
    check_version,
    fork_aware,
)
from corral.core.primitives import ClientBusy
from corral.errors import BackendError, BackendUnavailable

__all__ = ["Call", "Connection", "MemcachedClient", "Pool", "Session"]


class Connection:
    """One stream and its reply parser; lent to one caller at a time."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.parser = ReplyParser()
        self.broken = False

    def call(self, deadline: float, *requests: bytes) -> list[Reply]:
        """Send the requests in one write; read exactly one reply each, before `deadline`."""
        with self._whole_or_broken():
            self.stream.send(b"".join(requests), deadline)
            replies = [self._receive(deadline) for _ in requests]
            self._expect_nothing_more()
            return replies

    def call_quiet(self, deadline: float, *requests: bytes) -> list[Reply]:
        """Send quiet-mode requests and a no-op (`mn`) in one write; return every reply
        before the no-op's `MN`: quiet commands answer only what is not routine."""
        with self._whole_or_broken():
            self.stream.send(b"".join((*requests, b"mn\r\n")), deadline)
            replies = []
            while (reply := self._receive(deadline)).code != b"MN":
                replies.append(reply)
            self._expect_nothing_more()
            return replies

    def call_until_end(self, deadline: float, command: bytes) -> list[Reply]:
        """Send a command answered by many lines and `END` (`stats ...`); return the lines."""
        with self._whole_or_broken():
            self.stream.send(command, deadline)
            lines = []
            while (line := self._receive(deadline)).code != b"END":
                lines.append(line)
            self._expect_nothing_more()
            return lines

    @contextlib.contextmanager
    def _whole_or_broken(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            # Unread replies may be on the way: nobody may read them as theirs.
            self.broken = True
            raise

    def _receive(self, deadline: float) -> Reply:
        while (reply := self.parser.next()) is None:
            data = self.stream.recv(deadline)
            if not data:
                raise ConnectionClosed("end of stream")
            self.parser.feed(data)
        return reply

    def _expect_nothing_more(self) -> None:
        if self.parser.pending:
            raise ProtocolError("the server sent more than the replies asked for")

    def idle_and_sound(self) -> bool:
        """Nothing to read while idle: else the server closed it (EOF) or sent garbage."""
        return not self.broken and not self.parser.pending and self.stream.idle_and_sound()

    def close(self) -> None:
        self.stream.close()

    def forget(self) -> None:
        """After fork, in the child: close only this process's copy of the descriptor."""
        self.stream.forget()


class Pool:
    """This process's connections to one server; see the module docstring."""

    def __init__(self, connect: Callable[[float], Connection], max_size: int | None) -> None:
        self._connect = connect
        self._max_size = max_size
        self._closed = False
        self._reset()
        fork_aware(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = Condition()
        self._idle: list[Connection] = []
        self._lent: set[Connection] = set()
        self._opening = 0

    def after_fork(self) -> None:
        """In the child: forget the parent's connections, closing only this process's copies."""
        inherited = [*self._idle, *self._lent]
        self._reset()
        for conn in inherited:
            conn.forget()

    @contextlib.contextmanager
    def connection(self, deadline: float) -> Iterator[Connection]:
        if self._pid != os.getpid():
            self.after_fork()  # a fork that bypassed os.register_at_fork
        conn = self._checkout(deadline)
        try:
            yield conn
        except BaseException:
            conn.broken = True
            raise
        finally:
            self._checkin(conn)

    def _checkout(self, deadline: float) -> Connection:
        with self._cond:
            while True:
                if self._closed:
                    raise StoreClosed
                while self._idle:
                    conn = self._idle.pop()
                    if conn.idle_and_sound():
                        self._lent.add(conn)
                        return conn
                    conn.close()
                size = len(self._idle) + len(self._lent) + self._opening
                if self._max_size is None or size < self._max_size:
                    self._opening += 1  # holds the slot while connecting, outside the lock
                    break
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    raise PoolExhausted
        try:
            conn = self._connect(deadline)
        except BaseException:
            with self._cond:
                self._opening -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._opening -= 1
            self._lent.add(conn)
        return conn

    def _checkin(self, conn: Connection) -> None:
        with self._cond:
            if conn not in self._lent:
                return  # lent before a fork: the child has closed its copy
            self._lent.discard(conn)
            if conn.broken or self._closed:
                conn.close()
            else:
                self._idle.append(conn)
            self._cond.notify()

    def close(self) -> None:
        """Close the idle connections now, and the lent ones when they come back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for conn in idle:
            conn.close()


# -- one server -------------------------------------------------------------------


class Call(Protocol):
    """Send requests in one write on the operation's connection; one reply each."""

    def __call__(self, *requests: bytes) -> list[Reply]: ...


class Session:
    """One operation's connection and deadline: each call is one round trip on it."""

    def __init__(self, conn: Connection, deadline: float) -> None:
        self._conn = conn
        self._deadline = deadline

    def __call__(self, *requests: bytes) -> list[Reply]:
        """Send the requests in one write; one reply each."""
        return self._conn.call(self._deadline, *requests)

    def quiet(self, *requests: bytes) -> list[Reply]:
        """Send quiet-mode requests (flag `q`) in one write; the replies they did not suppress."""
        return self._conn.call_quiet(self._deadline, *requests)


class MemcachedClient:
    """Connections to one memcached server, and its failures as corral's errors."""

    def __init__(self, options: MemcachedOptions) -> None:
        self.options = options
        self.prefix = options.prefix
        self.timeout = options.timeout
        self.server = options.server
        self.item_size_max: int | None = None
        """The server's largest item in bytes (memcached -I), once a connection has read it."""
        self._pool = Pool(self._open, options.max_connections)

    def _open(self, deadline: float) -> Connection:
        o = self.options
        stream = open_stream(o.host, o.port, o.tls_context, deadline)
        try:
            conn = Connection(stream)
            greeting = []
            if o.username is not None and o.password is not None:
                # memcached's text protocol authentication (-Y): a `set` whose data is the
                # credentials. Any key: it is not stored.
                login = f"{o.username} {o.password}".encode()
                greeting.append(b"set corral-auth 0 0 %d\r\n%s\r\n" % (len(login), login))
            greeting.append(b"version\r\n")
            replies = conn.call(deadline, *greeting)
            if o.username is not None and replies[0].code != b"STORED":
                raise ServerRefused(b"CLIENT_ERROR authentication failure")
            check_version(replies[-1])
            # Refuse a server without CAS (-C) before anything is acquired on it.
            for setting in conn.call_until_end(deadline, b"stats settings\r\n"):
                if setting.tokens == (b"cas_enabled", b"no"):
                    raise CasDisabled
                if setting.tokens[:1] == (b"item_size_max",) and setting.tokens[1:2] != ():
                    with contextlib.suppress(ValueError):
                        self.item_size_max = int(setting.tokens[1])
            return conn
        except BaseException:
            stream.close()
            raise

    def session(
        self, name: str, action: str, kind: str = "lock"
    ) -> contextlib.AbstractContextManager[Session]:
        """One connection for one whole operation, its errors as corral's; `timeout` bounds it.

        Every round trip of an operation goes over this one connection, so a
        compare-and-swap never compares a CAS read from one server process with
        another's: a restart in between breaks the connection instead. Errors
        read "<kind> <name> on <server>: could not <action> it: ...".
        """
        return self.session_about(f"{kind} {name!r}", f"{action} it")

    @contextlib.contextmanager
    def session_about(self, subject: str, action: str) -> Iterator[Session]:
        """`session`, for errors that read "<subject> on <server>: could not <action>: ..."."""
        deadline = time.monotonic() + self.timeout
        with self._errors(subject, action), self._pool.connection(deadline) as conn:
            yield Session(conn, deadline)

    @contextlib.contextmanager
    def _errors(self, subject: str, action: str) -> Iterator[None]:
        where = f"{subject} on {self.server}: could not {action}"
        try:
            yield
        except StoreClosed:
            raise BackendError(f"{where}: the store is closed; open a new one") from None
        except PoolExhausted:
            raise ClientBusy(
                f"{where}: all {self.options.max_connections} connections stayed busy for "
                f"{self.timeout:g} s; raise max_connections= or timeout="
            ) from None
        except TooOld as exc:
            raise BackendError(
                f"{where}: the server is memcached {exc}; corral needs memcached >= "
                f"{'.'.join(map(str, MIN_VERSION))} for the meta protocol's compare-and-swap "
                "(Debian 12 has 1.6.18)"
            ) from None
        except CasDisabled:
            raise BackendError(
                f"{where}: the server runs without CAS (memcached -C), so a release or extend "
                "cannot check that the lock is still the caller's; restart it without -C"
            ) from None
        except ServerRefused as exc:
            raise self._refused(where, exc) from None
        except ProtocolError as exc:
            raise BackendError(
                f"{where}: the server's reply made no sense ({exc}); is {self.server} really a "
                "memcached (not a proxy without the meta protocol)?"
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise BackendError(
                f"{where}: the server's TLS certificate is not trusted ({exc.verify_message}); "
                "pass tls_ca_file= with the CA that signed it"
            ) from None
        except ssl.SSLError as exc:
            raise BackendUnavailable(
                f"{where}: the TLS handshake failed ({exc}); does the server serve TLS "
                "(memcached -Z)? Drop tls options for a plain-text server"
            ) from None
        except TimeoutError:
            raise BackendUnavailable(
                f"{where}: the server did not answer within {self.timeout:g} s; check that "
                "memcached is running and reachable from here, or raise timeout="
            ) from None
        except (ConnectionClosed, ConnectionResetError) as exc:
            hint = (
                "; if it serves only TLS (memcached -Z), pass tls=true"
                if self.options.tls_context is None
                else ""
            )
            raise BackendUnavailable(
                f"{where}: the server closed the connection ({exc or 'end of stream'}: "
                f"restarting, or refusing us?){hint}"
            ) from None
        except OSError as exc:
            raise BackendUnavailable(
                f"{where}: the server is unreachable ({exc}); check that memcached is running "
                "and reachable from here"
            ) from None

    def _refused(self, where: str, exc: ServerRefused) -> BackendError:
        line = exc.line.decode("ascii", "replace")
        lowered = line.lower()
        if "unauthenticated" in lowered or "authentication" in lowered:
            if self.options.username is None:
                return BackendError(
                    f"{where}: the server requires authentication ({line}); put "
                    "user:password@ in the URL"
                )
            return BackendError(f"{where}: the server refused the credentials ({line})")
        if line == "ERROR":
            return BackendError(
                f"{where}: the server does not know the meta commands (answered ERROR); corral "
                f"needs memcached >= {'.'.join(map(str, MIN_VERSION))}"
            )
        if "non-numeric" in lowered:
            return BackendError(
                f"{where}: its counter (the fencing tokens', or a cache namespace's generation) "
                f"holds something corral did not write ({line}); another program uses the same "
                "key prefix (choose another prefix=)"
            )
        if "too large" in lowered:
            return BackendError(f"{where}: {self.too_large(line)}")
        if "out of memory" in lowered:
            return BackendError(
                f"{where}: memcached is out of memory and may not evict ({line}); give it more "
                "memory (-m) or fewer keys"
            )
        return BackendError(f"{where}: memcached answered {line!r}; check the server's logs")

    def too_large(self, line: str | None = None, size: int | None = None) -> str:
        """Why memcached refuses a value: its item size limit, and how to raise it."""
        limit = self.item_size_max
        told = f" of {limit} bytes" if limit is not None else ""
        answered = f" ({line})" if line is not None else ""
        have = f"; this value is {size} bytes" if size is not None else ""
        return (
            f"memcached refuses items over its item size limit{told}{answered}{have}; store "
            "smaller values, or start memcached with a larger -I (at most 1024m)"
        )

    def foreign(self, name: str, key: str, value: bytes, kind: str = "lock") -> BackendError:
        """The error for a value under our prefix that corral did not write."""
        return BackendError(
            f"{kind} {name!r} on {self.server}: {key} holds {value[:80]!r}, which corral did not "
            "write; another program uses the same key prefix (choose another prefix=)"
        )

    def close(self) -> None:
        self._pool.close()
