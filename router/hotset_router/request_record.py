"""What every inference request leaves behind, however it ends, on every protocol.

Each front end (``inference_asgi``, ``openai_asgi``, ``grpc_gateway``)
serves a request inside one ``RequestRecord``: when the request is over (an
answer, an error, or its client gone: cancelled, 499), its flood-guard ticket
goes back and its model's series count it with its code and seconds. Written
once here, so no protocol can keep a slot or miss a count.
"""
from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Callable

from hotset_common import errors
from hotset_router.flood import FloodGuard, Ticket
from hotset_router.telemetry import RouterMetrics

class RequestRecord:
    """``with RequestRecord(guard, metrics, label) as record:``; set ``ticket`` once admitted, ``model``
    once known and ``code`` once answered (500 until then)."""

    __slots__ = ("guard", "metrics", "label_of", "started", "ticket", "model", "code")

    def __init__(self, guard: FloodGuard, metrics: RouterMetrics, label_of: Callable[[str], str]) -> None:
        """`label_of`: a model's label in the metrics (telemetry.py bounds them)."""
        self.guard = guard
        self.metrics = metrics
        self.label_of = label_of
        self.started = time.perf_counter()
        self.ticket: Ticket | None = None
        self.model: str | None = None
        self.code = 500

    def __enter__(self) -> "RequestRecord":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is not None and issubclass(kind, asyncio.CancelledError):  # its client left (slow_clients.py)
            self.code = errors.ClientClosedRequest.status_code
        if self.ticket is not None:
            self.guard.release(self.ticket)
        if self.model is not None:
            self.metrics.request(self.label_of(self.model), self.code, time.perf_counter() - self.started)
