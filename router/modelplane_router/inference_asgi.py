"""The two hot inference routes as a plain ASGI layer in front of the FastAPI app.

``POST /predict`` and ``POST /v2/models/{name}[/versions/{v}]/infer`` carry
nearly all traffic and need nothing from FastAPI: read the body (bounded),
find the model name, forward, copy the answer back. Serving them here skips
FastAPI's routing, dependency solving and middleware stack, a large share of
the router's CPU per request. Everything else (lifespan included) goes to
the FastAPI app unchanged, and errors get the same bodies (``http.error_body``).
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Awaitable, Callable, Mapping

import pydantic

from modelplane_common import errors, http
from modelplane_common.wire import PredictRequest
from modelplane_router.routing import Router
from modelplane_router.telemetry import RouterMetrics
from modelplane_router.upstream import PASSED_RESPONSE_HEADERS, UpstreamResponse

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNKNOWN_MODEL_LABEL = "_unknown"
INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/[^/]+)?/infer$")


def model_of_predict(body: bytes) -> str:
    """The model id of a seed ``/predict`` body; 422 naming what is wrong."""
    try:
        return PredictRequest.model_validate_json(body).model_id
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise errors.InvalidRequest(f"invalid /predict request: {problems}") from None


async def read_body(receive: Receive, headers: Mapping[str, str], limit_bytes: int) -> bytes:
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
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def metric_label(router: Router, model: str) -> str:
    """The model's name, or one shared label for names no worker knows (clients must not mint series)."""
    return model if router.model_map.is_known(model) else UNKNOWN_MODEL_LABEL


async def respond(send: Send, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class InferenceRoutes:
    """Serves the inference routes itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, router: Router, metrics: RouterMetrics, max_body_bytes: int) -> None:
        self.app = app
        self.router = router
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

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
        try:
            body = await read_body(receive, headers, self.max_body_bytes)
            if model is None:
                model = model_of_predict(body)
            upstream: UpstreamResponse = await self.router.forward(model, "POST", scope["path"], body, headers)
            code = upstream.status_code
            passed = {k: v for k, v in upstream.headers.items() if k.lower() in PASSED_RESPONSE_HEADERS}
            await respond(send, code, upstream.content, passed)
        except errors.ModelplaneError as exc:
            code = exc.status_code
            payload = json.dumps(http.error_body(exc.message)).encode()
            await respond(send, code, payload, {"content-type": "application/json", **exc.headers})
        finally:
            if model is not None:
                label = metric_label(self.router, model)
                self.metrics.requests.labels(label, str(code)).inc()
                self.metrics.latency.labels(label).observe(time.perf_counter() - started)
