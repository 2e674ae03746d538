"""The worker's one clock: what time it is, and waking up at a deadline.

Every time the worker reasons about (a request's deadline, how long a model
has been idle, a failed load's back-off, a batch's window) comes from one
injected ``Clock``, so tests order events by moving a ``ManualClock`` instead
of sleeping: advancing it past a deadline fires exactly the timers that are
due, in order, as the real clock would.

``MonotonicClock`` is the real one (``time.monotonic``, timers on the running
event loop). A plain callable returning seconds (the manager's older
``clock=`` argument) is wrapped by ``as_clock``: its timers wait real time for
what its reading says is left.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from typing import Any, Awaitable, Callable, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock (only differences mean anything)."""

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` on the event loop once the clock reads `when` or later."""


class MonotonicClock:
    """time.monotonic, with the running event loop's timers."""

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), callback)


class _CallableClock:
    """A bare `() -> seconds` as a Clock: timers wait real time for what its reading says is left."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read

    def now(self) -> float:
        return float(self._read())

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, when - self.now()), callback)


class _ManualTimer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told (tests). ``advance`` fires due timers in time order, each on
    the event loop that set it (so a test thread may advance a server's clock safely)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._timers: list[tuple[float, int, _ManualTimer, Callable[[], None], Any]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer()
        loop = asyncio.get_running_loop()
        with self._lock:
            heapq.heappush(self._timers, (when, next(self._order), timer, callback, loop))
        if when <= self._now:
            self.advance(0.0)
        return timer

    def pending(self) -> int:
        """Timers set and neither fired nor cancelled."""
        with self._lock:
            return sum(1 for entry in self._timers if not entry[2].cancelled)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            due = []
            while self._timers and self._timers[0][0] <= self._now:
                due.append(heapq.heappop(self._timers))
        for _, _, timer, callback, loop in due:
            if not timer.cancelled:
                loop.call_soon_threadsafe(_unless_cancelled, timer, callback)


def _unless_cancelled(timer: _ManualTimer, callback: Callable[[], None]) -> None:
    if not timer.cancelled:
        callback()


def as_clock(clock: Clock | Callable[[], float] | None) -> Clock:
    """A Clock from what a caller injected: a Clock, a bare callable, or None (the real one)."""
    if clock is None:
        return MonotonicClock()
    if hasattr(clock, "call_at") and hasattr(clock, "now") and callable(getattr(clock, "now")):
        return clock  # type: ignore[return-value]
    return _CallableClock(clock)  # type: ignore[arg-type]


async def wait_until(clock: Clock, awaitable: "asyncio.Future[Any] | Awaitable[Any]", deadline: float) -> Any:
    """The result of `awaitable` if it finishes before `clock` reads `deadline`; else TimeoutError.

    The awaitable is shielded: a timeout leaves it running (another request may share it)."""
    future = asyncio.ensure_future(awaitable)
    if future.done():
        return future.result()
    if clock.now() >= deadline:
        raise TimeoutError
    loop = asyncio.get_running_loop()
    expired = loop.create_future()
    timer = clock.call_at(deadline, lambda: expired.done() or expired.set_result(None))
    try:
        await asyncio.wait((future, expired), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not expired.done():
            expired.cancel()
    if future.done():
        return future.result()
    raise TimeoutError
