"""The two hot inference routes as a plain ASGI layer in front of the FastAPI app.

``POST /predict`` and ``POST /v2/models/{name}[/versions/{v}]/infer`` carry
nearly all traffic and need nothing from FastAPI: read the body (bounded),
find the model name, forward, copy the answer back. Serving them here skips
FastAPI's routing, dependency solving and middleware stack, a large share of
the router's CPU per request. Everything else (lifespan included) goes to
the FastAPI app unchanged, and errors get the same bodies (``http.error_body``).

What keeps a flood of large bodies from exhausting the router (``Limits``):
at most ``max_requests`` inference requests at once and at most
``max_body_bytes_in_flight`` bytes of their bodies held in memory (a request
past either is refused at once: 503 with Retry-After, before its body is
read, or once a body without Content-Length grows past it); a ``/predict`` body's ``model_id`` is read without building its
``input_data`` (msgspec skips it: an 8 MB body took 0.2 s of event loop and
64 MB of Python objects to parse whole); and at most ``max_cold_waiters``
requests per model wait for a model that has no ready copy yet.
Bodies are forwarded untouched, with their Content-Encoding, along the
client's raw (still percent-encoded) path.
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Annotated, Any, Awaitable, Callable, Mapping

import msgspec

from hotset_common import errors, http, wire
from hotset_common.wire import VERSION_HEADER
from hotset_router import telemetry
from hotset_router.routing import Router
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import PASSED_RESPONSE_HEADERS, UpstreamResponse

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNKNOWN_MODEL_LABEL = telemetry.UNKNOWN_MODEL
INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/[^/]+)?/infer$")


class _PredictHead(msgspec.Struct):
    """What the router needs of a ``/predict`` body: its model id. ``input_data`` must be there
    (as ``wire.PredictRequest`` says) but is only checked to be JSON, never built."""

    model_id: Annotated[str, msgspec.Meta(min_length=1)]
    input_data: msgspec.Raw


def model_of_predict(body: bytes) -> str:
    """The model id of a seed ``/predict`` body; 422 naming what is wrong, 400 for a body nested
    past what the parser takes (msgspec raises RecursionError there)."""
    try:
        return wire.requested_model(msgspec.json.decode(body, type=_PredictHead).model_id)
    except msgspec.ValidationError as exc:
        raise errors.InvalidRequest(f"invalid /predict request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise errors.InvalidRequest(f"invalid /predict request: the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise errors.NestedTooDeeply() from None


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much inference traffic the router holds at once (see the module docstring)."""

    max_body_bytes: int = 64 * 2**20
    max_requests: int = 1024
    max_body_bytes_in_flight: int = 512 * 2**20
    max_cold_waiters: int = 256


async def read_body(receive: Receive, headers: Mapping[str, str], limit_bytes: int,
                    on_chunk: Callable[[int], None] = lambda size: None) -> bytes:
    """The whole body, refused (413) past `limit_bytes`; `on_chunk(bytes so far)` may refuse it too."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise errors.PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise errors.BadInput("client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise errors.PayloadTooLarge(f"request body exceeds the limit of {limit_bytes} bytes")
        on_chunk(size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def metric_label(router: Router, model: str) -> str:
    """The model's label: its name while it has series of its own, one shared label past the limit, and
    another for names no worker knows (clients must not mint series; telemetry.py)."""
    return router.metrics.label(model, router.model_map.is_known(model))


async def respond(send: Send, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class InferenceRoutes:
    """Serves the inference routes itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, router: Router, metrics: RouterMetrics, limits: Limits) -> None:
        self.app = app
        self.router = router
        self.metrics = metrics
        self.limits = limits
        self.requests = 0
        self.body_bytes = 0  # declared (or, when undeclared, the limit's worth) bytes of bodies held now
        self.cold_waiters: dict[str, int] = {}  # model -> requests in flight while it had no ready copy

    @property
    def max_body_bytes(self) -> int:
        return self.limits.max_body_bytes

    def _admit(self, headers: Mapping[str, str]) -> list[int]:
        """Count the request in, or refuse it (503, Retry-After) before its body is read. Returns its
        reservation (a one-item list the body's reading grows): its Content-Length, or what arrived
        so far when it declares none (a chunked body is refused once it would pass the budget)."""
        declared = headers.get("content-length", "")
        reserve = min(int(declared), self.max_body_bytes) if declared.isdigit() else 0
        if self.requests >= self.limits.max_requests:
            raise errors.NoCapacity(f"the router is serving {self.requests} requests, its limit; retry shortly", 1)
        self._reserve(reserve)
        self.requests += 1
        return [reserve]

    def _reserve(self, more: int, own: int = 0) -> None:
        """Add `more` bytes to a request holding `own`; refused when that passes the budget while
        other requests hold bodies too (one body alone is bounded by max_body_bytes)."""
        if more > 0 and self.body_bytes + more > self.limits.max_body_bytes_in_flight and self.body_bytes > own:
            raise errors.NoCapacity(
                f"the router holds {self.body_bytes} bytes of request bodies and this one would pass its limit of "
                f"{self.limits.max_body_bytes_in_flight}; retry shortly", 1)
        self.body_bytes += more

    def _grow(self, reserved: list[int], size: int) -> None:
        """A body larger than it declared (or undeclared) reserves what it really holds."""
        if size > reserved[0]:
            self._reserve(size - reserved[0], reserved[0])
            reserved[0] = size

    def _wait_cold(self, model: str) -> bool:
        """Count a request for a model with no ready copy, or refuse it when too many already wait."""
        if self.router.model_map.ready_copies(model):
            return False
        waiting = self.cold_waiters.get(model, 0)
        if waiting >= self.limits.max_cold_waiters:
            raise errors.NoCapacity(
                f"model {model!r} has no ready copy yet and {waiting} requests already wait for it; retry shortly",
                self.router.retry_after_s)
        self.cold_waiters[model] = waiting + 1
        return True

    def _done_cold(self, model: str) -> None:
        left = self.cold_waiters.get(model, 1) - 1
        if left <= 0:
            self.cold_waiters.pop(model, None)
        else:
            self.cold_waiters[model] = left

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if path == "/predict":
                await self.serve(scope, receive, send, None)
                return
            match = INFER_PATH.match(path)
            if match:
                await self.serve(scope, receive, send, match.group("name"))
                return
        await self.app(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send, model: str | None) -> None:
        started = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        code = 500
        reserved: list[int] | None = None
        cold = False
        try:
            reserved = self._admit(headers)
            body = await read_body(receive, headers, self.max_body_bytes, lambda size: self._grow(reserved, size))
            if model is None:
                model = model_of_predict(http.decompress(body, headers.get("content-encoding"), self.max_body_bytes))
            else:
                wire.requested_model(model)
            cold = self._wait_cold(model)
            path = scope.get("raw_path", b"").decode("latin-1") or scope["path"]
            upstream: UpstreamResponse = await self.router.forward(model, "POST", path, body, headers)
            code = upstream.status_code
            passed = {k: v for k, v in upstream.headers.items() if k.lower() in PASSED_RESPONSE_HEADERS}
            if version := passed.get(VERSION_HEADER) or upstream.headers.get(VERSION_HEADER):
                self.metrics.answered_by(metric_label(self.router, model), version)
            await respond(send, code, upstream.content, passed)
        except errors.HotsetError as exc:
            code = exc.status_code
            payload = json.dumps(http.error_body(exc.message)).encode()
            await respond(send, code, payload, {"content-type": "application/json", **exc.headers})
        finally:
            if reserved is not None:
                self.requests -= 1
                self.body_bytes -= reserved[0]
            if cold and model is not None:
                self._done_cold(model)
            if model is not None:
                self.metrics.request(metric_label(self.router, model), code, time.perf_counter() - started)
