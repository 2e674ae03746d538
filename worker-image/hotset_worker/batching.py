"""Dynamic batching: requests for one copy that arrive while it is busy share one forward pass.

Each loaded copy of a batchable model (``FrameworkWorker.batchable()``, with
``ModelSpec.batch_limits()`` above one row) gets a ``Batcher``. The rules:

- **A lone request never waits.** A request that finds its copy idle and
  nothing queued starts a forward pass at once, as without batching.
- **What arrives while a pass runs waits for the next one**, which takes
  every queued request up to ``maxBatchSize`` rows (a request is never split;
  one larger than the limit runs alone). A second pass beside a running one
  starts once the batch is full or its oldest request has waited
  ``maxDelayMs``; when no pass runs, what is queued starts at once.
- **One bad input fails only its own request.** Each request's input is
  checked on its own (``rows_for_*``) before it joins; if the joint pass
  fails anyway, each request is run again alone, so only the one that
  cannot run fails.
- **Padding-aware.** A framework groups a batch's rows by length inside its
  ``forward`` (``group_by_length``): rows of very different token counts run
  in separate passes instead of padding every row to the longest.

Passes run on the data plane's inference threads, as many at once per copy
as there are threads (each with its own torch threads, see
``--torch-threads``): while one pass runs, the next gathers requests for up
to ``maxDelayMs`` before it takes a free thread, and once the copy is idle
what is queued starts at once. The event loop only queues and wakes requests. Sizes and delays go to the
metrics (``hotset_batch_rows``, ``hotset_batch_queue_seconds``).
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_worker.clock import Clock
from hotset_worker.fair_threads import FairThreads
from hotset_worker.frameworks.base import FrameworkWorker, Rows

log = logging.getLogger(__name__)


class BatchObserver(Protocol):
    def batch_ran(self, spec: ModelSpec, rows: int, requests: int, queue_seconds: list[float]) -> None: ...


@dataclass(eq=False)
class _Item:
    rows: int
    prepare: Callable[[], Rows]
    answer: "asyncio.Future[Any]"
    arrived: float
    started: float = 0.0  # the clock's reading when its pass started


@dataclass
class BatchTiming:
    """What a batched request reports in Server-Timing: its wait for the pass, and the pass."""

    waited_s: float = 0.0
    pass_s: float = 0.0


class Batcher:
    """The batch queue of one loaded copy: at most `max_passes` passes of it run at once."""

    def __init__(self, worker: FrameworkWorker, max_rows: int, max_delay_s: float,
                 run: Callable[..., concurrent.futures.Future], clock: Clock, observer: BatchObserver | None = None,
                 max_passes: int = 1) -> None:
        self.worker = worker
        self.max_rows = max_rows
        self.max_delay_s = max_delay_s
        self.max_passes = max(1, max_passes)
        self._run = run  # runs a function on an inference thread: run(cost in rows, function, *args) -> its future
        self._clock = clock
        self._observer = observer
        self._queue: collections.deque[_Item] = collections.deque()
        self._queued_rows = 0
        self._running = 0
        self._timer: Any = None  # wakes the queue when its oldest request's window closes
        self.passes = 0  # forward passes run (tests and figures)

    def queued(self) -> int:
        return len(self._queue)

    async def submit(self, rows: int, prepare: Callable[[], Rows], timing: BatchTiming) -> Any:
        """Queue one request (`rows`: an estimate of its rows; `prepare` checks its input on the
        inference thread) and return its answer once its pass ran."""
        loop = asyncio.get_running_loop()
        now = self._clock.now()
        item = _Item(max(1, rows), prepare, loop.create_future(), now)
        self._queue.append(item)
        self._queued_rows += item.rows
        self._start_passes(now)  # the same reading: a request that starts at once records no wait at all
        try:
            answer, pass_s = await asyncio.shield(item.answer)
            timing.pass_s += pass_s
            return answer
        except asyncio.CancelledError:
            if item in self._queue:  # not started: it simply leaves
                self._queue.remove(item)
                self._queued_rows -= item.rows
            else:  # its pass runs on a thread that still uses the model: hold it until the pass ends
                await asyncio.gather(item.answer, return_exceptions=True)
            raise
        finally:
            if item.started:
                timing.waited_s += item.started - item.arrived

    def _start_passes(self, now: float | None = None) -> None:
        """Start every pass that may start now: a slot is free and either no pass of this copy runs
        (a lone request never waits), the batch is full, or the oldest request's window closed;
        otherwise wake up when that window closes. A request's wait ends when its batch is taken
        here (`now`: the clock's reading, when the caller has one), which is also when its pass is
        handed to the inference threads (``_begin``): a lone request's wait is exactly zero in
        Server-Timing and ``hotset_batch_queue_seconds``."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._clock.now() if now is None else now
        while self._queue and self._running < self.max_passes:
            if self._running and self._queued_rows < self.max_rows:
                closes = self._queue[0].arrived + self.max_delay_s
                if now < closes:
                    self._timer = self._clock.call_at(closes, self._start_passes)
                    return
            batch = self._take()
            for item in batch:
                item.started = now
            self._begin(batch)

    def _take(self) -> list[_Item]:
        """The queued requests the next pass takes: in arrival order, up to max_rows (at least one)."""
        batch = [self._queue.popleft()]
        rows = batch[0].rows
        while self._queue and rows + self._queue[0].rows <= self.max_rows:
            item = self._queue.popleft()
            rows += item.rows
            batch.append(item)
        self._queued_rows -= rows
        return batch

    def _begin(self, batch: list[_Item]) -> None:
        """Hand `batch`'s pass to the inference threads now, on this turn of the loop, and have the
        thread's end call ``_finished`` on the loop. No task of its own: a lone request reaches its
        thread as soon as on the direct path (no loop turn for a task's first step), and its answer
        comes back in as many turns as the direct path's (thread to loop, the shield, the request)."""
        loop = asyncio.get_running_loop()
        self._running += 1
        self.passes += 1
        try:
            job = self._run(sum(item.rows for item in batch), run_pass, self.worker, [item.prepare for item in batch])
        except Exception as exc:  # noqa: BLE001 - the threads are shut down: this batch hears it
            self._running -= 1
            _fail(batch, exc)
            return

        def ended(_: concurrent.futures.Future) -> None:  # on the inference thread
            if not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                    loop.call_soon_threadsafe(self._finished, batch, job)

        job.add_done_callback(ended)

    def _finished(self, batch: list[_Item], job: concurrent.futures.Future) -> None:
        """On the loop, once `batch`'s pass ended: each request its answer or its own error, then
        the next passes."""
        self._running -= 1
        try:
            try:
                if job.cancelled():
                    raise errors.BackendUnavailable("the worker is shutting down")
                outcomes, seconds, rows = job.result()
            except BaseException as exc:  # noqa: BLE001 - the pass never ran (shutdown): every waiter hears it
                _fail(batch, exc if isinstance(exc, Exception) else errors.BackendUnavailable(
                    "the worker is shutting down"))
                return
            for item, outcome in zip(batch, outcomes):
                if item.answer.done():
                    continue
                if isinstance(outcome, BaseException):
                    item.answer.set_exception(outcome)
                    item.answer.add_done_callback(_retrieve)
                else:
                    item.answer.set_result((outcome, seconds))
            if self._observer is not None:
                self._observer.batch_ran(self.worker.spec, rows, len(batch),
                                         [item.started - item.arrived for item in batch])
        finally:
            self._start_passes()


def _fail(batch: list[_Item], exc: Exception) -> None:
    for item in batch:
        if not item.answer.done():
            item.answer.set_exception(exc)
            item.answer.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def run_pass(worker: FrameworkWorker, prepares: Sequence[Callable[[], Rows]]) -> tuple[list[Any], float, int]:
    """On an inference thread: check each request's input, run one pass over the good ones, and
    hand each its answer or its own error; (outcomes, seconds of the pass, rows run)."""
    import time

    started = time.perf_counter()
    outcomes: list[Any] = [None] * len(prepares)
    ready: list[tuple[int, Rows]] = []
    for index, prepare in enumerate(prepares):
        try:
            ready.append((index, prepare()))
        except Exception as exc:  # noqa: BLE001 - this request's own problem (BadInput, mostly)
            outcomes[index] = exc
    if ready:
        _forward_and_finish(worker, ready, outcomes)
    return outcomes, time.perf_counter() - started, sum(rows.count for _, rows in ready)


def _forward_and_finish(worker: FrameworkWorker, ready: list[tuple[int, Rows]], outcomes: list[Any]) -> None:
    try:
        results = worker.forward([rows for _, rows in ready])
    except Exception as exc:  # noqa: BLE001
        if len(ready) == 1:
            outcomes[ready[0][0]] = exc
            return
        # The joint pass failed: run each request alone, so only the one that cannot run fails.
        log.info("a batch of %d requests on %s failed (%s: %s); running them one by one",
                 len(ready), worker.spec.id, type(exc).__name__, exc)
        for entry in ready:
            _forward_and_finish(worker, [entry], outcomes)
        return
    for (index, rows), result in zip(ready, results):
        try:
            outcomes[index] = rows.finish(result)
        except Exception as exc:  # noqa: BLE001
            outcomes[index] = exc


def group_by_length(lengths: Sequence[int], max_waste: float = 0.25, min_group: int = 4,
                    min_waste_tokens: int = 256) -> list[list[int]]:
    """Indexes of `lengths` in groups of similar length, each group one forward pass.

    Sorted by length; a group closes when padding the next row (and every row before it) to
    that row's length would waste more than `max_waste` of the group's real tokens and more
    than `min_waste_tokens` in all, once the group has `min_group` rows: a pass has a fixed cost
    (every weight is read once per pass), so short texts of different lengths stay together and
    only a long one among short ones gets a pass of its own."""
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for index in order:
        length = max(1, lengths[index])
        waste = length * (len(current) + 1) - (real + length)
        if current and len(current) >= min_group and waste > max_waste * (real + length) and waste > min_waste_tokens:
            groups.append(current)
            current, real = [], 0
        current.append(index)
        real += length
    if current:
        groups.append(current)
    return groups


class Batchers:
    """The batchers of a worker's loaded copies (one per copy, made on its first batched request,
    gone with the copy) and the threads their passes run on."""

    def __init__(self, threads: FairThreads, clock: Clock, observer: BatchObserver | None = None,
                 max_passes: int = 1) -> None:
        self._threads = threads
        self._max_passes = max_passes
        self._clock = clock
        self._observer = observer

    def for_copy(self, spec: ModelSpec, worker: FrameworkWorker) -> Batcher | None:
        """`worker`'s batcher, or None when its requests run one by one."""
        max_rows, max_delay_ms = spec.batch_limits()
        if max_rows <= 1 or not worker.batchable():
            return None
        batcher: Batcher | None = getattr(worker, "_hotset_batcher", None)
        if batcher is None or batcher.max_rows != max_rows or batcher.max_delay_s != max_delay_ms / 1000:
            batcher = Batcher(worker, max_rows, max_delay_ms / 1000, functools.partial(self._submit, spec.namespace),
                              self._clock, self._observer, self._max_passes)
            worker._hotset_batcher = batcher  # type: ignore[attr-defined]  # lives and goes with the copy
        return batcher

    def _submit(self, namespace: str, rows: int, function: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """A pass on the inference threads, in `namespace`'s turn (fair_threads.py), costing its rows."""
        return self._threads.submit(function, *args, namespace=namespace, cost=rows)


def estimated_rows(value: Any) -> int:
    """Rows a request's input holds, guessed cheaply before it is checked (a list's length, a
    tensor's first dimension; 1 otherwise)."""
    if isinstance(value, list):
        return max(1, len(value)) if value and not isinstance(value[0], (int, float)) else 1
    shape = getattr(value, "shape", None)
    if shape:
        return max(1, int(shape[0]))
    return 1
