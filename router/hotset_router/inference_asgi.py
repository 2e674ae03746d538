"""The two hot inference routes as a plain ASGI layer in front of the FastAPI app.

``POST /predict`` and ``POST /v2/models/{name}[/versions/{v}]/infer`` carry
nearly all traffic and need nothing from FastAPI: read the body (bounded),
find the model name, forward, copy the answer back. Serving them here skips
FastAPI's routing, dependency solving and middleware stack, a large share of
the router's CPU per request. Everything else (lifespan included) goes to
the FastAPI app unchanged, and errors get the same bodies (``http.error_body``).

Every request passes the router's flood guard first (flood.py: requests at
once, body bytes held, waiters per cold model), the same guard the OpenAI
routes use. A ``/predict`` body's ``model_id`` is read without building its
``input_data`` (msgspec skips it: an 8 MB body took 0.2 s of event loop and
64 MB of Python objects to parse whole).
Bodies are forwarded untouched, with their Content-Encoding, along the
client's raw (still percent-encoded) path.
"""
from __future__ import annotations

import functools
from typing import Annotated

import msgspec

from hotset_common import errors, http, wire
from hotset_common.http import ASGIApp, Receive, Scope, Send
from hotset_common.wire import VERSION_HEADER
from hotset_router import telemetry
from hotset_router.flood import FloodGuard
from hotset_router.request_record import RequestRecord
from hotset_router.routing import Router
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import PASSED_RESPONSE_HEADERS, UpstreamResponse


UNKNOWN_MODEL_LABEL = telemetry.UNKNOWN_MODEL


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


def metric_label(router: Router, model: str) -> str:
    """The model's label: its name while it has series of its own, one shared label past the limit, and
    another for names no worker knows (clients must not mint series; telemetry.py)."""
    return router.metrics.label(model, router.model_map.is_known(model))


class InferenceRoutes:
    """Serves the inference routes itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, router: Router, metrics: RouterMetrics, guard: FloodGuard) -> None:
        self.app = app
        self.router = router
        self.metrics = metrics
        self.guard = guard
        self.label = functools.partial(metric_label, router)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if path == "/predict":
                await self.serve(scope, receive, send, None)
                return
            match = wire.INFER_PATH.match(path)
            if match:
                await self.serve(scope, receive, send, match.group("name"))
                return
        await self.app(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send, model: str | None) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        with RequestRecord(self.guard, self.metrics, self.label) as record:
            record.model = model
            try:
                record.ticket = ticket = self.guard.admit(headers)
                body = await self.guard.read_body(ticket, receive, headers)
                if model is None:
                    limit = self.guard.limits.max_body_bytes
                    model = record.model = model_of_predict(http.decompress(body, headers.get("content-encoding"),
                                                                            limit))
                else:
                    wire.requested_model(model)
                path = scope.get("raw_path", b"").decode("latin-1") or scope["path"]
                upstream: UpstreamResponse = await self.router.forward(
                    model, "POST", path, body, headers, on_admitted=lambda: self.guard.for_model(ticket, model))
                self.guard.done_waiting(ticket)
                record.code = upstream.status_code
                passed = {k: v for k, v in upstream.headers.items() if k.lower() in PASSED_RESPONSE_HEADERS}
                if version := passed.get(VERSION_HEADER) or upstream.headers.get(VERSION_HEADER):
                    self.metrics.answered_by(self.label(model), version)
                await http.respond(send, record.code, upstream.content, passed)
            except errors.HotsetError as exc:
                record.code = exc.status_code
                await http.respond_error(send, exc)
