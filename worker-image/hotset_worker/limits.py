"""Per-model concurrency limits (``spec.maxConcurrency``): one slow model cannot starve a shared pod.

At most ``max_concurrency`` requests of a model hold a slot at once (its load and inference run
inside the slot); the next ones wait, first come first served, in a queue of at most
``max_queue`` requests per model. A request that finds the queue full is refused at once (429 with
Retry-After: that one model is overloaded, the pod is not); one whose deadline passes while it
waits gets 503 with Retry-After. Models without a limit never wait here.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_worker.clock import Clock, MonotonicClock, wait_until

DEFAULT_MAX_QUEUE = 64


class LimitObserver(Protocol):
    """What the limiter reports (the worker's metrics implement it)."""

    def concurrency_queue(self, spec: ModelSpec, waiting: int) -> None: ...

    def refused(self, spec: ModelSpec, reason: str) -> None: ...


@dataclass
class _Slots:
    running: int = 0
    waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)


class ModelLimiter:
    def __init__(self, observer: LimitObserver, max_queue: int = DEFAULT_MAX_QUEUE,
                 clock: Clock | None = None) -> None:
        if max_queue < 0:
            raise ValueError(f"per-model queue size must not be negative, got {max_queue}")
        self.max_queue = max_queue
        self._clock = clock or MonotonicClock()
        self._observer = observer
        self._slots: dict[str, _Slots] = {}

    def waiting(self, model_id: str) -> int:
        slots = self._slots.get(model_id)
        return len(slots.waiters) if slots else 0

    @contextlib.asynccontextmanager
    async def slot(self, spec: ModelSpec, deadline: float) -> AsyncIterator[None]:
        """Hold one of `spec`'s slots for the block, waiting until `deadline` (the clock's reading) at most."""
        if spec.max_concurrency is None:
            yield
            return
        slots = self._slots.setdefault(spec.id, _Slots())
        if slots.running >= spec.max_concurrency or slots.waiters:
            await self._wait(spec, slots, deadline)
        else:
            slots.running += 1
        try:
            yield
        finally:
            self._release(spec, slots)

    async def _wait(self, spec: ModelSpec, slots: _Slots, deadline: float) -> None:
        if len(slots.waiters) >= self.max_queue:
            self._observer.refused(spec, "model_queue_full")
            raise errors.TooManyRequests(
                f"model {spec.id!r} is at its limit of {spec.max_concurrency} concurrent requests and "
                f"{len(slots.waiters)} more are waiting (the most this pod queues per model); retry later",
                retry_after_s=1,
            )
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slots.waiters.append(turn)
        self._observer.concurrency_queue(spec, len(slots.waiters))
        try:
            await wait_until(self._clock, turn, deadline)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if turn.done() and not turn.cancelled():
                self._release(spec, slots)  # the slot came at the last moment: pass it on
            else:
                turn.cancel()
            if isinstance(exc, asyncio.CancelledError):
                raise
            self._observer.refused(spec, "model_deadline")
            raise errors.NoCapacity(
                f"model {spec.id!r}: the request's deadline passed while it waited for one of the model's "
                f"{spec.max_concurrency} concurrent slots",
                retry_after_s=max(1, math.ceil(deadline - self._clock.now() + 1)),
            ) from None
        finally:
            with contextlib.suppress(ValueError):
                slots.waiters.remove(turn)
            self._observer.concurrency_queue(spec, len(slots.waiters))

    def _release(self, spec: ModelSpec, slots: _Slots) -> None:
        """Hand the slot to the first waiter still waiting, else free it."""
        while slots.waiters:
            turn = slots.waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot passes on: `running` stays the same
                self._observer.concurrency_queue(spec, len(slots.waiters))
                return
        slots.running -= 1
        if slots.running == 0 and not slots.waiters:
            self._slots.pop(spec.id, None)
