"""The worker's inference threads, shared fairly between namespaces.

A worker pod serves the models of many namespaces, and every forward pass
runs on one of a few inference threads (one per core). With one FIFO queue
in front of them, a namespace that floods its model fills that queue, and a
request of another namespace waits behind every pass queued before it:
its latency grows with the other tenant's load, not its own.

``FairThreads`` keeps one queue per namespace instead and gives the next
free thread to the namespace that has had the least of them for its weight
(start-time fair queueing: each pass gets a start tag, the later of the
shared virtual time and its namespace's previous finish tag; its finish tag
adds ``cost / weight``; the smallest start tag runs next). So:

- **Work-conserving.** A namespace alone gets every thread; nothing waits
  while a thread is free.
- **Weighted.** Of two namespaces both waiting, one of weight 2 gets two
  passes (or rows) for each one of the other. Weights come from the
  namespace's ModelQuota (``servingWeight``), which the router passes on
  with each request (``wire.NAMESPACE_WEIGHT_HEADER``); unknown: 1.
- **A newcomer waits at most for the passes running now**, never for the
  queue of a namespace that floods: its first tag is the current virtual
  time, the smallest any queued pass can have.

Passes are not preempted: a request still waits for one running pass to end.
The lock guards only the queues (no I/O, no model code under it). A pass
cancelled while it waits never runs (its client left), as with the
executor it replaces.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

DEFAULT_WEIGHT = 1.0
MAX_WEIGHT = 1000.0


@dataclass(order=True)
class _Pass:
    start: float
    finish: float = field(compare=False)
    future: concurrent.futures.Future = field(compare=False)
    function: Callable[..., Any] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)


class FairThreads:
    """`threads` inference threads; ``submit`` queues a pass under its namespace (see the module docstring)."""

    def __init__(self, threads: int, thread_name_prefix: str = "inference") -> None:
        self.threads = max(1, threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix=thread_name_prefix)
        self._lock = threading.Lock()
        self._queues: dict[str, collections.deque[_Pass]] = {}
        self._finish: dict[str, float] = {}  # namespace -> finish tag of its last queued pass
        self._weights: dict[str, float] = {}
        self._virtual = 0.0  # the start tag of the pass that started last
        self._running = 0
        self._closed = False

    # --- what callers use ------------------------------------------------------------------
    def set_weight(self, namespace: str, weight: float) -> bool:
        """`namespace`'s share weight from now on (at most MAX_WEIGHT); whether it changed."""
        weight = min(MAX_WEIGHT, float(weight))
        if not weight > 0 or self._weights.get(namespace) == weight:
            return False
        with self._lock:
            self._weights[namespace] = weight
        return True

    def weight(self, namespace: str) -> float:
        return self._weights.get(namespace, DEFAULT_WEIGHT)

    def submit(self, function: Callable[..., Any], *args: Any, namespace: str = "", cost: float = 1.0
               ) -> concurrent.futures.Future:
        """Run ``function(*args)`` on an inference thread when `namespace`'s turn comes; `cost`: its
        rows (a batched pass of 16 rows counts 16). The future can be cancelled until it starts."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the inference threads are shut down")
            start = max(self._virtual, self._finish.get(namespace, 0.0))
            finish = start + max(cost, 1e-6) / self._weights.get(namespace, DEFAULT_WEIGHT)
            self._finish[namespace] = finish
            self._queues.setdefault(namespace, collections.deque()).append(_Pass(start, finish, future, function, args))
            started = self._take()
        for chosen in started:
            self._pool.submit(self._execute, chosen)
        return future

    def queued(self) -> dict[str, int]:
        """Passes waiting for a thread, by namespace (for tests and the status report)."""
        with self._lock:
            return {namespace: len(queue) for namespace, queue in self._queues.items() if queue}

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        with self._lock:
            self._closed = True
            dropped = [item for queue in self._queues.values() for item in queue] if cancel_futures else []
            if cancel_futures:
                self._queues.clear()
        for item in dropped:
            item.future.cancel()
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    # --- the scheduler (under the lock) ----------------------------------------------------------
    def _take(self) -> list[_Pass]:
        """The passes that start now: the smallest start tags, while threads are free."""
        chosen: list[_Pass] = []
        while self._running < self.threads:
            best: str | None = None
            for namespace, queue in self._queues.items():
                while queue and queue[0].future.cancelled():
                    queue.popleft()
                if queue and (best is None or queue[0] < self._queues[best][0]):
                    best = namespace
            if best is None:
                break
            item = self._queues[best].popleft()
            if not self._queues[best]:
                del self._queues[best]
            if not item.future.set_running_or_notify_cancel():
                continue
            self._virtual = max(self._virtual, item.start)
            self._running += 1
            chosen.append(item)
        self._forget_idle()
        return chosen

    def _forget_idle(self) -> None:
        """Drop the finish tags of namespaces with nothing queued that the virtual time has passed:
        they would start at the virtual time anyway (keeps the dict to the active namespaces)."""
        if len(self._finish) > 2 * len(self._queues) + 16:
            for namespace in [ns for ns, tag in self._finish.items() if tag <= self._virtual and ns not in self._queues]:
                del self._finish[namespace]

    def _execute(self, item: _Pass) -> None:
        try:
            result = item.function(*item.args)
        except BaseException as exc:  # the caller's future carries it, as an executor's would
            item.future.set_exception(exc)
        else:
            item.future.set_result(result)
        finally:
            with self._lock:
                self._running -= 1
                started = [] if self._closed else self._take()
            for chosen in started:
                self._pool.submit(self._execute, chosen)
