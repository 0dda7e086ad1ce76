"""The blocking twin of `corral/_async/_compat.py`; hand-written, like that file.

Each name here has the meaning it has there, with threads in place of tasks.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from corral.core.forks import ProcessLock

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

Lock = threading.Lock


class Event:
    """An event whose `wait` takes a timeout and says whether it was set."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None and timeout <= 0:
            return self._event.is_set()
        return self._event.wait(None if timeout is None else min(timeout, threading.TIMEOUT_MAX))


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def run_sync(func: Callable[..., T], *args: Any) -> T:
    return func(*args)


def shield(value: T) -> T:
    return value


def current_task() -> object:
    """Who is calling: the running thread (a task in the other flavour)."""
    return threading.current_thread()


def current_task_label() -> str:
    return threading.current_thread().name


class _ProcessScope:
    """The one scope of the blocking flavour (an object, so it can be a weak key)."""


_PROCESS_SCOPE = _ProcessScope()


def scope_key() -> object:
    """What one background worker serves: the whole process in this flavour."""
    return _PROCESS_SCOPE


class Worker:
    """A background job: a daemon thread, so it never keeps the interpreter alive."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join()


def spawn(target: Callable[[], None], name: str) -> Worker:
    return Worker(target, name)


def call_maybe_async(func: Callable[..., Any], *args: Any) -> None:
    func(*args)


def call_and_await(func: Callable[[], Any]) -> Any:
    """Call a user's function; a coroutine cannot be awaited in this flavour: say so."""
    result = func()
    if inspect.iscoroutine(result):
        result.close()
        raise TypeError(
            f"{func!r} returned a coroutine; the blocking API cannot await it: use "
            "corral.aio for coroutine functions, or pass a plain function"
        )
    return result


def refuse_coroutine_function(func: Callable[..., Any], what: str) -> None:
    """A coroutine function cannot be called here: say so before it is ever called."""
    if inspect.iscoroutinefunction(func):
        raise TypeError(
            f"{what} {func!r} is a coroutine function; the blocking API cannot await it: "
            "use the same call on a corral.aio store"
        )


class _Flight:
    __slots__ = ("abandoned", "done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False


class Flights:
    """One call per key at a time in this process: whoever asks while it runs shares it.

    The first thread runs the call; the others wait for its outcome (the same
    value, or the same exception raised again), at most `wait` seconds, then
    get `TimeoutError`. A call ended by an interrupt (Ctrl-C, SystemExit) is
    not passed on: a waiting thread starts the call afresh instead. Keyed by
    process id as well, so a child forked while a call ran in its parent does
    not wait for it.
    """

    def __init__(self) -> None:
        self._mutex = ProcessLock()
        self._running: dict[tuple[int, object], _Flight] = {}

    def run(self, key: object, call: Callable[[], T], wait: float | None = None) -> tuple[T, bool]:
        """The call's result, and whether this thread ran it (True) or joined it."""
        slot = (os.getpid(), key)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            with self._mutex:
                flight = self._running.get(slot)
                leading = flight is None
                if flight is None:
                    flight = self._running[slot] = _Flight()
            if leading:
                break
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not flight.done.wait(left):
                raise TimeoutError(f"the call shared for {key!r} outlasted {wait} s")
            if flight.abandoned:
                continue
            if flight.error is not None:
                raise flight.error
            result: T = flight.result
            return result, False
        try:
            value = flight.result = call()
        except Exception as exc:
            flight.error = exc
            raise
        except BaseException:
            flight.abandoned = True
            raise
        finally:
            with self._mutex:
                if self._running.get(slot) is flight:
                    del self._running[slot]
            flight.done.set()
        return value, True


class Gate:
    """Lets one thread at a time through, waiting up to a timeout, as `threading.Lock` does.

    The threads that share one lock handle queue here, so the second one waits
    for the first to release instead of entering beside it. In a forked child
    it starts open: the parent's threads are not there to release it.
    """

    def __init__(self) -> None:
        self._lock = ProcessLock()

    def acquire(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout)

    def release(self) -> None:
        self._lock.release()


# How long an idle pooled thread waits for more work before it ends.
_IDLE_SECONDS = 10.0


class _ThreadPool:
    """Daemon threads reused for short background jobs, started when none is idle.

    Unbounded on purpose: a job that blocks (a slow server) must never hold up
    another (a renewal that is due). Threads end after a while without work.
    Each release of `_ready` hands exactly one queued job to one idle thread.
    """

    def __init__(self) -> None:
        self._mutex = ProcessLock()
        self._pid = os.getpid()
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._ready = threading.Semaphore(0)
        self._idle = 0

    def submit(self, work: Callable[[], None]) -> None:
        with self._mutex:
            if self._pid != os.getpid():  # a forked child has none of the parent's threads
                self._pid = os.getpid()
                self._jobs.clear()
                self._ready = threading.Semaphore(0)
                self._idle = 0
            if self._idle > 0:
                self._idle -= 1
                self._jobs.append(work)
                self._ready.release()
                return
        threading.Thread(target=self._serve, args=(work,), name="corral-job", daemon=True).start()

    def _serve(self, work: Callable[[], None]) -> None:
        while True:
            work()
            with self._mutex:
                self._idle += 1
                ready = self._ready
            if not ready.acquire(timeout=_IDLE_SECONDS):
                with self._mutex:
                    # A submit may have counted this thread idle just as the wait ran out.
                    if not ready.acquire(blocking=False):
                        self._idle -= 1
                        return
            with self._mutex:
                work = self._jobs.popleft()


_POOL = _ThreadPool()


class Job:
    """A piece of background work: a pooled thread here, a task in the other flavour."""

    def __init__(self, target: Callable[..., Any], *args: Any) -> None:
        self._done = threading.Event()

        def work() -> None:
            try:
                target(*args)
            except Exception:
                log.exception("a background job of corral failed")
            finally:
                self._done.set()

        _POOL.submit(work)

    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """A blocking call cannot be interrupted: the job runs on and its result is ignored."""


def start_job(target: Callable[..., Any], *args: Any) -> Job:
    return Job(target, *args)


def finish_anyway(call: Callable[[], T]) -> T:
    return call()


def undo_if_interrupted(call: Callable[[], T], undo: Callable[[T | None], None]) -> T:
    """Run `call()`; if an interruption (KeyboardInterrupt...) ends it, undo what it may have done.

    The outcome is unknown then, so `undo(None)` runs. An error raised by the
    call itself (an `Exception`) propagates with nothing undone.
    """
    try:
        return call()
    except Exception:
        raise
    except BaseException:
        undo(None)
        raise


def wait_readable(sock: socket.socket, timeout: float) -> bool:
    """Wait up to `timeout` s for a non-blocking socket to have data; True when it has."""
    if hasattr(select, "poll"):  # no FD_SETSIZE limit, unlike select()
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    readable, _, _ = select.select([sock], [], [], timeout)
    return bool(readable)


def gather_within(
    calls: Sequence[Callable[[], T]],
    timeout: float,
    enough: Callable[[Sequence[T | BaseException | None]], bool] | None = None,
) -> list[T | BaseException | None]:
    """Run `calls` side by side in pooled threads; each one's result, or the exception it raised.

    A call still running after `timeout` seconds answers `TimeoutError`; its
    thread runs on until its socket gives up (a blocking call cannot be
    interrupted) and what it returns then is ignored. With `enough`, asked at
    the start and after each answer with the answers so far (None where none
    came yet), the gathering ends as soon as it says so; the calls still
    running then finish in their threads and answer None.
    """
    results: dict[int, T | BaseException] = {}
    condition = threading.Condition()

    def work(index: int, call: Callable[[], T]) -> None:
        outcome: T | BaseException
        try:
            outcome = call()
        except BaseException as exc:
            outcome = exc
        with condition:
            results[index] = outcome
            condition.notify_all()

    for index, call in enumerate(calls):
        _POOL.submit(functools.partial(work, index, call))
    deadline = time.monotonic() + timeout
    with condition:
        seen = -1
        while len(results) < len(calls):
            if enough is not None and len(results) > seen:
                seen = len(results)
                if enough([results.get(index) for index in range(len(calls))]):
                    return [results.get(index) for index in range(len(calls))]
            left = deadline - time.monotonic()
            if left <= 0:
                break
            condition.wait(left)
        return [
            results[index] if index in results else TimeoutError(f"no answer within {timeout:g} s")
            for index in range(len(calls))
        ]


def gather(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run `calls` at once (one request per server of a pool, say); their results in order.

    The first runs in this thread, the others on pooled threads. Every call runs
    to its end before this returns or raises, so none is left running unseen;
    then the first error, in the order of `calls`, is raised. No calls, no results
    (as in the other flavour: a pool may have no server left to ask).
    """
    if not calls:
        return []
    if len(calls) == 1:
        return [calls[0]()]
    outcomes: list[Any] = [None] * len(calls)
    finished = threading.Semaphore(0)

    def run(at: int) -> None:
        try:
            outcomes[at] = (True, calls[at]())
        except BaseException as exc:
            outcomes[at] = (False, exc)
        finally:
            finished.release()

    for at in range(1, len(calls)):
        _POOL.submit(lambda at=at: run(at))  # type: ignore[misc]
    run(0)
    for _ in calls:
        finished.acquire()
    for ok, value in outcomes:
        if not ok:
            raise value
    return [value for _, value in outcomes]


class Condition:
    """`threading.Condition` whose `wait` says whether it was notified (True) or timed out."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())

    def __enter__(self) -> Condition:
        self._cond.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._cond.__exit__(None, None, None)

    def wait(self, timeout: float) -> bool:
        return self._cond.wait(min(timeout, threading.TIMEOUT_MAX))

    def notify(self) -> None:
        self._cond.notify()

    def notify_all(self) -> None:
        self._cond.notify_all()


_RECV = 65536


def _time_left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the operation's timeout ran out")
    return left


class Stream:
    """One TCP connection (TLS or not) to a server, read and written before a deadline.

    Each socket call gets what is left until the deadline as its timeout, so a
    whole operation of several calls is bounded, not each call.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(_time_left(deadline))
        self.sock.sendall(data)

    def recv(self, deadline: float) -> bytes:
        """What has arrived, waiting for something until the deadline; b"" at end of stream."""
        self.sock.settimeout(_time_left(deadline))
        return self.sock.recv(_RECV)

    def idle_and_sound(self) -> bool:
        """Nothing to read while idle: else the server closed it (EOF) or sent garbage."""
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return False
        try:
            return not wait_readable(self.sock, 0)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        # close(), never shutdown(): after fork this must not end the parent's connection.
        with contextlib.suppress(OSError):
            self.sock.close()

    def forget(self) -> None:
        """In a forked child: close this process's copy of the descriptor, nothing else."""
        self.close()


def open_stream(host: str, port: int, tls: ssl.SSLContext | None, deadline: float) -> Stream:
    """Connect to `host:port` (each of its addresses in turn), then TLS if `tls`, by `deadline`."""
    sock = socket.create_connection((host, port), timeout=_time_left(deadline))
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock.settimeout(_time_left(deadline))
            sock = tls.wrap_socket(sock, server_hostname=host)
    except BaseException:
        with contextlib.suppress(OSError):
            sock.close()
        raise
    return Stream(sock)
