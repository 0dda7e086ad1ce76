"""Run a piece of test code concurrently: a thread here, a task in the async twin.

Hand-written in both flavours, like corral's own `_compat` modules.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Job:
    def __init__(self, func: Callable[..., Any], *args: Any) -> None:
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(func, *args), daemon=True)
        self._thread.start()

    def _run(self, func: Callable[..., Any], *args: Any) -> None:
        try:
            self._result = func(*args)
        except BaseException as exc:
            self._error = exc

    def result(self, timeout: float = 60.0) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("job did not finish")
        if self._error is not None:
            raise self._error
        return self._result

    def done(self) -> bool:
        return not self._thread.is_alive()


def start(func: Callable[..., Any], *args: Any) -> Job:
    return Job(func, *args)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def on_the_wire(call: Callable[[], Any]) -> Any:
    """Run `call()` as a request already sent (nothing cancels a thread)."""
    return call()
