"""Waiting for a condition in a test: poll with a deadline, never a fixed sleep.

A timeout is a failed assertion naming what never happened and the last
value seen, so the test report says what the system was doing instead.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.05) -> T:
    """Poll `condition()` every `interval` s until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


async def wait_for_async(condition: Callable[[], Awaitable[T]], what: str, timeout: float = 30.0,
                         interval: float = 0.01) -> T:
    """`wait_for` inside a test's event loop: awaits `condition()` every `interval` s (the loop
    keeps serving the requests the test has in flight meanwhile)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await condition()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
