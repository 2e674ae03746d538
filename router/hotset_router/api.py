"""The gateway's HTTP API: the worker's inference endpoints, served for the whole cluster.

Inference bodies (seed ``/predict`` and OIP v2 ``infer``, binary extension
included) are forwarded untouched by ``inference_asgi``; the router reads
only the model name (from the path, or ``model_id`` for ``/predict``). Load and unload need the admin
bearer token: 403 when the router has none configured, 401 when the request
does not carry it. OIP v2 over gRPC, on a port of its own, takes the same request
path (grpc_gateway.py). With callers checked (callers.py), every route that names a
model checks its caller first, listings (``/router/pods`` included) show what the caller may call; models are addressed
by namespace under ``/namespaces/<namespace>/`` (namespaced_paths.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any, AsyncIterator

import grpc
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hotset_common import errors, wire
from hotset_common.http import error_body, install_error_handler
from hotset_common.slow_clients import ClientLimits
from hotset_common.spec import DEFAULT_SERVING_WEIGHT
from hotset_router import grpc_gateway
from hotset_router.flood import FloodGuard, Limits
from hotset_router.grpc_gateway import GrpcGateway
from hotset_router.grpc_upstream import GrpcWorkerClient
from hotset_router.inference_asgi import InferenceRoutes, metric_label
from hotset_router.namespaced_paths import NamespacedPaths
from hotset_router.openai_asgi import OpenAIRoutes
from hotset_router.repository import check_admin, index_rows, models_report
from hotset_router.service import RouterService
from hotset_router.upstream import PASSED_RESPONSE_HEADERS, UpstreamResponse

SERVER_NAME = "hotset-router"
DEFAULT_MAX_BODY_BYTES = 64 * 2**20




# The two routes inference_asgi serves in front of this app, described here for clients and the
# fuzzing test (FastAPI never sees their POSTs).
_PREDICT_SCHEMA = wire.PredictRequest.model_json_schema()
_INFER_SCHEMA = {"type": "object", "required": ["inputs"], "properties": {
    "id": {"type": "string"}, "parameters": {"type": "object"},
    "inputs": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["name", "shape", "datatype"],
        "properties": {"name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                       "datatype": {"type": "string"}, "parameters": {"type": "object"}, "data": {}}}},
    "outputs": {"type": "array", "items": {"type": "object", "required": ["name"],
                                           "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}}}}}}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def passed_response(upstream: UpstreamResponse) -> Response:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() in PASSED_RESPONSE_HEADERS}
    return Response(content=upstream.content, status_code=upstream.status_code, headers=headers)


def create_app(service: RouterService, admin_token: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               limits: Limits | None = None, grpc_address: str | None = None,
               client_limits: ClientLimits | None = None) -> NamespacedPaths:
    """The gateway: the inference routes in plain ASGI (openai_asgi.py, inference_asgi.py) in front of a
    FastAPI app for the rest; with `grpc_address` (host:port), OIP v2 over gRPC there too
    (grpc_gateway.py), started and stopped with the app, its clients bounded by `client_limits`
    as the HTTP port's are."""
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        grpc_server = await start_grpc() if grpc_address is not None else None
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(grace=5)
                await grpc_client.aclose()
            await service.stop()

    grpc_client = GrpcWorkerClient(service.grpc_port, service.settings.worker_credential, max_body_bytes)

    async def start_grpc() -> grpc.aio.Server:
        assert grpc_address is not None
        server, port = grpc_gateway.create_server(GrpcGateway(service, guard, grpc_client, admin_token), grpc_address,
                                                  max_body_bytes, client_limits)
        await server.start()
        logging.getLogger(__name__).info("OIP v2 over gRPC on port %d", port)
        return server

    app = FastAPI(title=SERVER_NAME, lifespan=lifespan)
    install_error_handler(app)
    router = service.router
    metrics = service.metrics

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, request: Request, version: str | None = None) -> Response:
        started = time.perf_counter()
        code = "500"
        try:
            path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path  # %3F stays in its segment
            upstream = await router.forward(name, "GET", path, b"", request.headers, load=False)
            code = str(upstream.status_code)
            return passed_response(upstream)
        except errors.HotsetError as exc:
            code = str(exc.status_code)
            raise
        finally:
            metrics.request(metric_label(router, name), code, time.perf_counter() - started)

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, request: Request, version: str | None = None) -> Response:
        if await service.model_ready(name, version, request.headers):
            return Response(status_code=200)
        return JSONResponse(error_body(f"model {name!r} has no ready copy yet; it loads on its first request"), status_code=503)

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        if service.model_map.ready_pods():
            return Response(status_code=200)
        return JSONResponse(error_body("no ready worker pod"), status_code=503)

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": "0.1.0", "extensions": ["binary_tensor_data", "model_repository"]}

    @app.get("/models")
    async def models(request: Request) -> wire.RouterModelsResponse:
        return await models_report(service, request.headers)

    @app.get("/router/pods")
    async def pods(request: Request) -> list[dict[str, Any]]:
        """The map itself, for operators and tests: every pod, its room, and its copies of the models
        this request may see (callers.py)."""
        shown = set(await service.callers.visible(request.headers, service.model_map.known_models()))
        return [
            {
                "url": p.url, "pod": p.name, "node": p.node, "ready": p.ready, "budget_bytes": p.budget_bytes,
                "free_bytes": p.free_bytes, "inflight": service.model_map.inflight(p.url),
                "copies": {m: {"state": c.state.value, "bytes": c.bytes} for m, c in p.copies.items() if m in shown},
            }
            for p in service.model_map.pods()
        ]

    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> list[dict[str, Any]]:
        return index_rows(await models_report(service, request.headers))

    @app.post("/v2/repository/models/{name}/load")
    async def load(name: str, request: Request) -> dict[str, Any]:
        check_admin(request.headers, admin_token)
        urls = await router.ensure_ready_copies(name)
        return {"model": name, "pods": [service.model_map.pod(u).name for u in urls if service.model_map.pod(u)]}

    @app.post("/v2/repository/models/{name}/unload")
    async def unload(name: str, request: Request) -> dict[str, Any]:
        check_admin(request.headers, admin_token)
        return {"model": name, "unloaded_from": await router.unload_everywhere(name)}

    @app.post("/predict", openapi_extra=_body(_PREDICT_SCHEMA), summary="Seed inference (served by inference_asgi)")
    async def predict_described() -> Response:
        raise errors.HotsetError("/predict is served in front of this app")  # never reached

    @app.post("/v2/models/{name}/infer", openapi_extra=_body(_INFER_SCHEMA), summary="OIP v2 inference (served by inference_asgi)")
    @app.post("/v2/models/{name}/versions/{version}/infer", openapi_extra=_body(_INFER_SCHEMA))
    async def infer_described(name: str, version: str | None = None) -> Response:
        raise errors.HotsetError("infer is served in front of this app")  # never reached

    @app.get("/metrics")
    async def prometheus() -> Response:
        unowned = getattr(service.discovery, "unowned_pods", None)  # cluster mode only
        # Labelled pods sent nothing: no operator Deployment owns them, or they did not prove which pod they are.
        metrics.before_scrape(pods=len(service.model_map.pods()),
                              unowned_pods=(unowned() if unowned else 0) + len(service.sync.unproven))
        # On a thread: thousands of bounded per-model series still take long to render, and the
        # event loop carries every request.
        body = await asyncio.to_thread(generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    limits = dataclasses.replace(limits or Limits(), max_body_bytes=max_body_bytes)
    # One guard for every inference route: a flood on one protocol counts against the same bounds.
    discovery = service.discovery
    guard = FloodGuard(limits, lambda model: bool(router.model_map.ready_copies(model)), router.retry_after_s,
                       namespace_of=getattr(discovery, "namespace_of", lambda model: None),
                       weight_of=getattr(discovery, "weight_of", lambda namespace: DEFAULT_SERVING_WEIGHT))
    return NamespacedPaths(OpenAIRoutes(InferenceRoutes(app, router, metrics, guard), service, guard))
