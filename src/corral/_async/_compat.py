"""The few concurrency primitives whose async and sync forms differ in more than `await`.

This file and its twin `corral/_sync/_compat.py` are the only hand-written
pair: everything else in `corral._sync` is generated from `corral._async` by
`scripts/unasync.py`. Each name here has the same meaning in both files.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("corral")

__all__ = [
    "Condition",
    "Event",
    "Flights",
    "Gate",
    "Job",
    "Lock",
    "Stream",
    "Worker",
    "call_and_await",
    "call_maybe_async",
    "current_task",
    "current_task_label",
    "finish_anyway",
    "gather",
    "gather_within",
    "open_stream",
    "refuse_coroutine_function",
    "run_sync",
    "scope_key",
    "shield",
    "sleep",
    "spawn",
    "start_job",
    "undo_if_interrupted",
    "wait_readable",
]

Lock = asyncio.Lock


class Event:
    """An event whose `wait` takes a timeout and says whether it was set."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        if self._event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def run_sync(func: Callable[..., T], *args: Any) -> T:
    """Run blocking library code without blocking the event loop."""
    return await asyncio.to_thread(func, *args)


async def shield(awaitable: Awaitable[T]) -> T:
    """Finish clean-up even when the caller is being cancelled."""
    return await asyncio.shield(awaitable)


def current_task() -> object:
    """Who is calling: the running task (a thread's identity in the other flavour)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("corral's asyncio API must be called from a task")
    return task


def current_task_label() -> str:
    task = asyncio.current_task()
    thread = threading.current_thread().name
    return f"{thread}/{task.get_name()}" if task is not None else thread


def scope_key() -> object:
    """What one background worker serves: each event loop gets its own."""
    return asyncio.get_running_loop()


class Worker:
    """A background job: an asyncio task in this flavour, a daemon thread in the other."""

    def __init__(self, target: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(target(), name=name)

    def alive(self) -> bool:
        return not self._task.done()

    async def join(self) -> None:
        if not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)


def spawn(target: Callable[[], Coroutine[Any, Any, None]], name: str) -> Worker:
    return Worker(target, name)


async def call_maybe_async(func: Callable[..., Any], *args: Any) -> None:
    """Call a user's callback, awaiting it when it is a coroutine function."""
    result = func(*args)
    if inspect.isawaitable(result):
        await result


async def call_and_await(func: Callable[[], Any]) -> Any:
    """Call a user's function; await what it returns when that is awaitable."""
    result = func()
    if inspect.isawaitable(result):
        result = await result
    return result


class Flights:
    """One call per key at a time in this process: whoever asks while it runs shares it.

    The call runs as a task of its own, so a caller that is cancelled leaves
    it running for the others (and for its own clean-up: a lock it holds is
    still released), and each caller awaits it shielded. A caller that joins
    a running call waits at most `wait` seconds (None: as long as it takes),
    then gets `TimeoutError`; the call goes on.
    """

    def __init__(self) -> None:
        self._running: dict[object, asyncio.Future[Any]] = {}

    async def run(
        self, key: object, call: Callable[[], Awaitable[T]], wait: float | None = None
    ) -> tuple[T, bool]:
        """The call's result, and whether this caller started it (True) or joined it."""
        flight = self._running.get(key)
        leading = flight is None or flight.get_loop() is not asyncio.get_running_loop()
        if flight is None or leading:
            flight = asyncio.ensure_future(call())
            self._running[key] = flight

            def landed(done: asyncio.Future[Any], key: object = key) -> None:
                if self._running.get(key) is done:
                    del self._running[key]
                if not done.cancelled():
                    done.exception()  # retrieved: every caller has seen it already

            flight.add_done_callback(landed)
            result: T = await asyncio.shield(flight)
            return result, True
        try:
            joined: T = await asyncio.wait_for(asyncio.shield(flight), wait)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the call shared for {key!r} outlasted {wait} s") from None
        return joined, False


def refuse_coroutine_function(func: Callable[..., Any], what: str) -> None:
    """Both kinds of function are welcome here: plain ones are called, coroutines awaited."""


class Gate:
    """Lets one task at a time through, in arrival order, waiting up to a timeout.

    The tasks that share one lock handle queue here, so the second one waits
    for the first to release instead of entering beside it. A release hands
    the gate straight to the first waiter, so a task that merely asks with
    `timeout <= 0` is refused while anyone waits, never queued behind them.
    (`asyncio.Lock` would queue such a task behind a waiter it has just woken.)
    """

    def __init__(self) -> None:
        self._taken = False
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self, timeout: float | None) -> bool:
        if not self._taken and not self._waiters:
            self._taken = True
            return True
        if timeout is not None and timeout <= 0:
            return False
        handed = asyncio.get_running_loop().create_future()
        self._waiters.append(handed)
        try:
            if timeout is None:
                await asyncio.shield(handed)
            else:
                await asyncio.wait_for(asyncio.shield(handed), timeout)
        except BaseException as exc:
            if handed.done():
                # Handed over just as this waiter gave up: pass the gate on.
                self.release()
            else:
                handed.cancel()
                self._waiters.remove(handed)
            if isinstance(exc, asyncio.TimeoutError):
                return False
            raise
        return True

    def release(self) -> None:
        while self._waiters:
            first = self._waiters.popleft()
            if not first.done():
                first.set_result(None)  # the gate stays taken: it now belongs to `first`
                return
        self._taken = False


# Jobs run detached from whoever started them; the event loop keeps only weak
# references to tasks, so these keep them alive until they finish.
_JOBS: set[asyncio.Task[Any]] = set()


class Job:
    """A piece of background work: a task here, a pooled thread in the other flavour."""

    def __init__(self, target: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        self._task = asyncio.get_running_loop().create_task(_logged(target, *args))
        _JOBS.add(self._task)
        self._task.add_done_callback(_JOBS.discard)

    def done(self) -> bool:
        return self._task.done()

    def cancel(self) -> None:
        """Stop it at its next await (the other flavour's thread cannot be stopped)."""
        self._task.cancel()


async def _logged(target: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
    try:
        await target(*args)
    except Exception:
        log.exception("a background job of corral failed")


def start_job(target: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Job:
    return Job(target, *args)


async def finish_anyway(call: Callable[[], Awaitable[T]]) -> T:
    """Run `call()` to its end even if the caller is cancelled meanwhile.

    The caller's cancellation still propagates at once; the call finishes in
    the background. For clean-up that must not stop half-way (a release).
    """
    task = asyncio.ensure_future(call())
    _JOBS.add(task)
    task.add_done_callback(_JOBS.discard)
    return await asyncio.shield(task)


async def undo_if_interrupted(
    call: Callable[[], Awaitable[T]], undo: Callable[[T | None], Coroutine[Any, Any, None]]
) -> T:
    """Run `call()`; if the caller is cancelled before it answers, `undo` its outcome.

    The call is not abandoned mid-flight: it runs to its end in the background,
    and only then does `undo(result)` run, so the undo can never reach the
    server before the call it undoes (on another pooled connection, say). The
    cancellation itself propagates at once. An error raised by the call itself
    propagates with nothing undone.
    """
    task = asyncio.ensure_future(call())
    try:
        return await asyncio.shield(task)
    except BaseException:
        if task.done() and (task.cancelled() or task.exception() is not None):
            raise

        def after(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                start_job(undo, done.result())

        task.add_done_callback(after)
        raise


async def wait_readable(sock: socket.socket, timeout: float) -> bool:
    """Wait up to `timeout` s for a non-blocking socket to have data; True when it has."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    fd = sock.fileno()
    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(ready, timeout)
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True


async def gather_within(
    calls: Sequence[Callable[[], Awaitable[T]]],
    timeout: float,
    enough: Callable[[Sequence[T | BaseException | None]], bool] | None = None,
) -> list[T | BaseException | None]:
    """Run `calls` side by side; each one's result, or the exception it raised.

    A call still running after `timeout` seconds is cancelled and answers
    `TimeoutError`, so one silent server costs the caller `timeout`, not its
    socket's timeout. With `enough`, asked at the start and after each answer
    with the answers so far (None where none came yet), the gathering ends as
    soon as it says so: the calls still running then finish in the background
    and answer None. For work spread over independent servers (a quorum).
    """
    tasks = [asyncio.ensure_future(call()) for call in calls]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = set(tasks)
    decided = enough is not None and bool(tasks) and enough([None] * len(tasks))
    try:
        while pending and not decided:
            left = deadline - loop.time()
            if left <= 0:
                break
            _, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            if enough is not None and pending:
                decided = enough([_answer(task) for task in tasks])
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    if decided:
        for task in pending:  # finishing on their own: kept alive, their errors retrieved
            _JOBS.add(task)
            task.add_done_callback(_settled)
        return [_answer(task) for task in tasks]
    for task in pending:
        task.cancel()
    if pending:
        # Cancelled between a command and its answer, a call drops its connection:
        # quick, and awaited so that nothing of this call outlives it.
        await asyncio.wait(pending)
    return [
        TimeoutError(f"no answer within {timeout:g} s")
        if task in pending or task.cancelled()
        else _answer(task)
        for task in tasks
    ]


def _answer(task: asyncio.Future[Any]) -> Any:
    """A finished call's result or exception; None while it runs."""
    if not task.done():
        return None
    if task.cancelled():
        return asyncio.CancelledError()
    error = task.exception()
    return task.result() if error is None else error


def _settled(task: asyncio.Task[Any]) -> None:
    _JOBS.discard(task)
    if not task.cancelled():
        task.exception()


async def gather(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run `calls` at once (one request per server of a pool, say); their results in order.

    Every call runs to its end before this returns or raises, so none is left
    running unseen; then the first error, in the order of `calls`, is raised.
    """
    if len(calls) == 1:
        return [await calls[0]()]
    outcomes = await asyncio.gather(*(call() for call in calls), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes  # type: ignore[return-value]  # no exception left: every item is a T


class Condition:
    """Waiting for a change to shared state, with `with` around the code that reads it.

    In this flavour `with` locks nothing: the event loop runs one task at a time,
    so code without an await in it is already alone, and the one await allowed
    inside the block is `wait`. (The other flavour's twin holds a real lock there.)
    `wait` says whether it was notified (True) or timed out (False); a waiter
    cancelled just after being notified passes the notification on.
    """

    def __init__(self) -> None:
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def __enter__(self) -> Condition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def wait(self, timeout: float) -> bool:
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(woken)
        try:
            await asyncio.wait_for(asyncio.shield(woken), timeout)
        except asyncio.TimeoutError:
            return woken.done() and not woken.cancelled()
        except BaseException:
            if woken.done() and not woken.cancelled():
                self.notify()  # notified, then cancelled: another waiter gets the turn
            raise
        finally:
            if not woken.done():
                woken.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(woken)
        return True

    def notify(self) -> None:
        while self._waiters:
            first = self._waiters.popleft()
            if not first.done():
                first.set_result(None)
                return

    def notify_all(self) -> None:
        while self._waiters:
            first = self._waiters.popleft()
            if not first.done():
                first.set_result(None)


def _time_left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the operation's timeout ran out")
    return left


async def _until(awaitable: Awaitable[T], deadline: float) -> T:
    """Await `awaitable` until the `time.monotonic()` deadline, then raise TimeoutError."""
    left = deadline - time.monotonic()
    if left <= 0:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never started: say nothing of a coroutine never awaited
        raise TimeoutError("the operation's timeout ran out")
    try:
        return await asyncio.wait_for(awaitable, left)
    except asyncio.TimeoutError:  # not the builtin on Python 3.10
        raise TimeoutError("the operation's timeout ran out") from None


class _Inbox(asyncio.Protocol):
    """What a stream's transport received, and futures for whoever waits on it."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ended = False
        self.error: BaseException | None = None
        self._arrival: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    def arrival(self) -> asyncio.Future[None]:
        self._arrival = asyncio.get_running_loop().create_future()
        return self._arrival

    def writable(self) -> asyncio.Future[None] | None:
        """A future done when the transport takes writes again; None when it does now."""
        return self._writable

    def _wake(self) -> None:
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.data += data
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None


# Transports inherited over fork: their descriptors are closed, but the objects are kept
# so that their finalizers never touch a descriptor number the child has since reused.
_ORPHANS: list[object] = []


class Stream:
    """One TCP connection (TLS or not) to a server, read and written before a deadline.

    An asyncio transport on a socket corral opened itself (so that after `fork`
    the child can close its copy of the descriptor without going through the
    event loop, whose epoll set it shares with the parent). The blocking twin
    is a plain socket. Bytes that arrive while nobody reads are kept, so
    `idle_and_sound` can tell a pooled connection the server closed or wrote to.
    """

    def __init__(self, sock: socket.socket, transport: asyncio.Transport, inbox: _Inbox) -> None:
        self.sock = sock
        self._transport = transport
        self._inbox = inbox
        self._loop = asyncio.get_running_loop()

    async def send(self, data: bytes, deadline: float) -> None:
        """Write all of `data`: queued at once, then waited for while the socket is full."""
        self._transport.write(data)
        writable = self._inbox.writable()
        if writable is not None:
            await _until(asyncio.shield(writable), deadline)
        if self._inbox.error is not None:
            raise self._inbox.error

    async def recv(self, deadline: float) -> bytes:
        """What has arrived, waiting for something until the deadline; b"" at end of stream."""
        inbox = self._inbox
        while not inbox.data:
            if inbox.ended:
                if inbox.error is not None:
                    raise inbox.error
                return b""
            await _until(inbox.arrival(), deadline)
        data = bytes(inbox.data)
        inbox.data.clear()
        return data

    def idle_and_sound(self) -> bool:
        """Nothing arrived while idle, and the stream belongs to the running event loop.

        The socket itself is asked too: an end of stream (a restarted server) that the
        event loop has not read yet would otherwise pass for a sound connection.
        """
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if not here or self._inbox.data or self._inbox.ended:
            return False
        try:
            if hasattr(select, "poll"):  # select() fails on descriptors past FD_SETSIZE
                poller = select.poll()
                poller.register(self.sock, select.POLLIN)
                return not poller.poll(0)
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        """Close at once (no TLS close_notify, nothing left unsent is flushed).

        The transport stops watching the descriptor before `abort` returns, so the
        socket is closed here too, not a loop iteration later: a program that closes
        its event loop right after closing the store leaves no descriptor open.
        """
        with contextlib.suppress(RuntimeError):  # its event loop is closed
            self._transport.abort()
        self.sock.close()

    def forget(self) -> None:
        """In a forked child: close this process's copy of the descriptor, nothing else."""
        with contextlib.suppress(OSError):
            os.close(self.sock.detach())
        _ORPHANS.append(self._transport)


async def open_stream(host: str, port: int, tls: ssl.SSLContext | None, deadline: float) -> Stream:
    """Connect to `host:port` (each of its addresses in turn), then TLS if `tls`, by `deadline`.

    A host name (not an address) is resolved by the event loop's resolver, which
    runs `getaddrinfo` on the default executor; an IP address needs no thread.
    """
    loop = asyncio.get_running_loop()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await _until(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), deadline)
    if not infos:
        raise OSError(f"getaddrinfo returned no address for {host}")
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await _until(loop.sock_connect(sock, address), deadline)
            except OSError as exc:
                if isinstance(exc, TimeoutError):
                    raise
                error = exc
                sock.close()
                continue
            transport, inbox = await _until(
                loop.create_connection(
                    _Inbox,
                    sock=sock,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                    ssl_handshake_timeout=_time_left(deadline) if tls is not None else None,
                ),
                deadline,
            )
        except BaseException:
            sock.close()
            raise
        return Stream(sock, transport, inbox)
    assert error is not None
    raise error
