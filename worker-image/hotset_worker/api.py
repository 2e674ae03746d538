"""The worker pod's HTTP API: seed endpoints, Open Inference Protocol v2, status and metrics.

Endpoints are thin: they read the body (refusing oversized ones with 413),
call the data plane or the manager, and shape the answer. Every error is a
HotsetError turned into ``{"detail": message, "error": message}`` with its
status by the one shared handler. Choices worth knowing:

- ``GET /v2/models/{name}`` never loads: a model that is not loaded is
  described from the store with empty ``inputs``/``outputs``; load it first
  (``POST /v2/repository/models/{name}/load``) to see its tensors.
- ``POST /v2/models/{name}/infer`` on a loaded model whose framework forwards
  OIP itself (triton) passes the body on untouched and returns the backend's
  answer untouched (see ``FrameworkWorker.forward_infer``).
- ``GET /v2/models/{name}/ready`` is 200 when loaded and ready, 503 when the
  model is known but not ready, 404 when unknown.
- A load that fails is a 500 naming the cause (missing/corrupt files), 503
  when a backend it needs is down or there is no room beside pinned models,
  507 when it can never fit the budget; the cache is unchanged in each case.
  The failure stays in ``/status`` (a FAILED copy with its reason) and in the
  repository index (UNAVAILABLE with the reason) until a load succeeds or
  the model is unloaded; a retry within the back-off answers it again at once.
- ``/v2/health/ready`` is 200 only when every pinned model is loaded and can
  serve (a pinned Triton model needs its sidecar ready), the start-up
  preparation (importing the store's frameworks) is done and the worker is
  not draining (after SIGTERM); ``/v2/health/live`` depends on nothing but
  the process. A Triton sidecar that is down (it crashed, its loop starts it
  again) unreadies only its models: the pod keeps serving the others, and
  ``/status`` reports those copies LOADING (coming back: the worker drops
  them once the sidecar answers without them, and loads them again), so the
  router sends their requests nowhere they would fail meanwhile.
- The same OIP v2 over gRPC (``inference.GRPCInferenceService``) on a port of
  its own when ``grpc_address`` is given: grpc_api.py, onto the same data plane.
- With a caller check (callers.py: in a cluster, the router's and the operator's
  own ServiceAccount tokens; on a local stack, one fixed token), every endpoint
  but the health probes, ``/metrics``, ``/identity`` and the OpenAPI
  description needs ``Authorization: Bearer <token>`` (401 without one that
  verifies, 403 for another account).
- With ``gateway_port`` (a dedicated vllm group whose pods an InferencePool selects), the
  OpenAI routes, the probes and ``/metrics`` also answer on that port with no caller check, for a
  Gateway API Inference Extension gateway, which sends each request to the pod its endpoint picker
  chose and carries no token of ours; the NetworkPolicy lets only the gateway's peers reach that
  port (docs/llm.md, "Behind an Inference Extension gateway"). Every other path is 404 there.
- ``GET /identity`` hands out the pod's own identity token (bound to the pod)
  to whoever asks: the router and the operator check it before they send the
  pod anything (hotset_common.worker_identity).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from typing import Any, AsyncIterator, Callable

import grpc
import pydantic
from fastapi import FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse

from hotset_common import errors, http, openai_wire, wire, worker_identity
from hotset_common.http import ASGIApp
from hotset_common.slow_clients import ClientLimits
from hotset_common.worker_identity import BearerToken
from hotset_worker import codec, grpc_api, openai_routes, status_report
from hotset_worker.repository import repository_entries
from hotset_worker.backends import Backends
from hotset_worker.callers import CallerCheck
from hotset_worker.dataplane import DataPlane
from hotset_worker.inference_asgi import InferenceRoutes
from hotset_worker.limits import DEFAULT_MAX_QUEUE as DEFAULT_MAX_MODEL_QUEUE, ModelLimiter
from hotset_worker.manager import ModelManager
from hotset_worker.engine_load import EngineLoads
from hotset_worker.metrics import WorkerMetrics
from hotset_worker.models_report import ModelsReport

log = logging.getLogger(__name__)

SERVER_NAME = "hotset-worker"
TRITON = "triton"  # the backend /status reports as triton_ready
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "model_repository"]
DEFAULT_MAX_BODY_BYTES = 64 * 2**20
# Paths that answer any caller: the kubelet's probes, Prometheus, the pod's identity, the API's description.
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics", worker_identity.IDENTITY_PATH,
                        "/openapi.json", "/docs"})
# What the gateway port serves: the OpenAI routes a gateway forwards, what its endpoint picker
# scrapes (/metrics) and the kubelet's probes. GATEWAY_ROUTES names the first kind in messages.
GATEWAY_ROUTES = frozenset({openai_wire.MODELS, openai_wire.COMPLETIONS, openai_wire.CHAT_COMPLETIONS,
                            openai_wire.EMBEDDINGS})
GATEWAY_PATHS = GATEWAY_ROUTES | {"/v2/health/live", "/v2/health/ready", "/metrics"}


def create_app(
    manager: ModelManager,
    metrics: WorkerMetrics,
    backends: Backends,
    *,
    pod_name: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    load_pinned: bool = True,
    pinned_check_s: float = 5.0,
    prepare: Callable[[], None] | None = None,
    backend_sync_s: float = 1.0,
    inference_threads: int | None = None,
    callers: CallerCheck | None = None,
    identity: BearerToken | None = None,
    max_model_queue: int = DEFAULT_MAX_MODEL_QUEUE,
    draining: Callable[[], bool] = lambda: False,
    grpc_address: str | None = None,
    engine_loads: EngineLoads | None = None,
    client_limits: ClientLimits | None = None,
    gateway_port: int | None = None,
) -> ASGIApp:
    """A worker app around an assembled manager; it owns their lifetime from start-up to shutdown.

    `prepare` runs on a thread at start-up without delaying it (e.g. importing
    the frameworks the store uses, so the first cold load does not pay for it).
    Every `backend_sync_s`, what each backend (the Triton sidecar) holds is compared with
    the table (a restarted sidecar comes back empty; see backends). `callers`: who may call
    (None: everyone); `identity`: the pod's identity token for ``/identity`` (see the module docstring). `draining()` says the server is shutting down: readiness answers 503 so that
    no new traffic comes, while requests already sent are still served. `grpc_address` (host:port;
    port 0: a free one): also serve OIP v2 over gRPC there (grpc_api.py), in this app's lifespan,
    its clients bounded by `client_limits` as the HTTP port's are (default: the defaults).
    `engine_loads`: the vLLM engines' own figures, read in this app's lifespan and reported in /status.
    `gateway_port`: the port (served by the same server) where GATEWAY_PATHS answer with no caller check.
    """
    report = ModelsReport(manager)
    reports = status_report.StatusReports(manager, pod_name)
    if engine_loads is not None:
        reports.engine_loads = engine_loads.figures
    dataplane = DataPlane(manager, metrics, backends, ModelLimiter(metrics, max_model_queue, clock=manager.clock),
                          inference_threads)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        preparing = asyncio.create_task(_prepare_then_set(prepare, prepared))
        background = []
        if load_pinned:
            background.append(asyncio.create_task(manager.keep_pinned_loaded(pinned_check_s)))
        background.append(asyncio.create_task(backends.keep_in_sync(manager, backend_sync_s)))
        if engine_loads is not None:
            background.append(asyncio.create_task(engine_loads.keep_sampled()))
        grpc_server = await start_grpc() if grpc_address is not None else None
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(grace=5)  # calls in flight finish, as uvicorn lets requests finish
            await asyncio.gather(preparing, return_exceptions=True)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await manager.close()
            dataplane.close()
            await backends.aclose()

    async def start_grpc() -> grpc.aio.Server:
        assert grpc_address is not None
        service = grpc_api.InferenceService(dataplane, readiness, SERVER_NAME, SERVER_VERSION, EXTENSIONS, callers)
        server, port = grpc_api.create_server(service, grpc_address, max_body_bytes, client_limits)
        await server.start()
        reports.grpc_port = port  # the router learns it from /status
        log.info("OIP v2 over gRPC on port %d", port)
        return server

    app = FastAPI(title="hotset worker", version=SERVER_VERSION, lifespan=lifespan)
    http.install_error_handler(app)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, RecursionError):  # a value nested past what some step could walk: the input's fault
            refused = errors.NestedTooDeeply()
            return JSONResponse(http.error_body(refused.message), status_code=refused.status_code)
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse(http.error_body(f"internal error: {type(exc).__name__}: {exc}"), status_code=500)

    async def body_of(request: Request) -> bytes:
        return await http.read_body_limited(request, max_body_bytes)

    prepared = asyncio.Event()

    async def readiness() -> dict[str, Any]:
        # backends: each backend this pod knows and whether it is ready (its models can run here);
        # the pod waits only for the backends it has. triton_ready: the same for the Triton sidecar.
        each = await backends.readiness()
        down = backends.down(each)
        missing = [key for key in reports.pinned_ids()
                   if not manager.is_loaded(key) or _framework_of(manager, key) in {f.value for f in down}]
        ready = not missing and prepared.is_set() and not draining()
        return {"ready": ready, "triton_ready": each.get(TRITON, False), "backends": each,
                "pinned_not_loaded": missing, "prepared": prepared.is_set(), "draining": draining(),
                "down": sorted(f.value for f in down)}

    # ----- seed API ------------------------------------------------------

    # The two inference routes are served in front of this app (inference_asgi.py); they are
    # declared here only so that the OpenAPI document describes them to clients and to fuzzing.
    @app.post("/predict", openapi_extra=request_body_schema(wire.PredictRequest.model_json_schema()),
              summary="Seed inference (served by inference_asgi)")
    async def predict_described() -> Response:
        raise errors.HotsetError("/predict is served in front of this app")  # never reached

    @app.get("/models")
    async def models(limit: int | None = None, after: str = "") -> Response:
        if limit is not None and limit < 1:
            raise errors.InvalidRequest(f"limit must be at least 1, got {limit}")
        answer = report.whole() if limit is None else report.page(limit, after)
        return Response(answer.model_dump_json(), media_type="application/json")

    # ----- OIP v2: server --------------------------------------------------

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        state = await readiness()
        return JSONResponse(state, status_code=200 if state["ready"] else 503)

    # ----- OIP v2: models --------------------------------------------------

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        return await dataplane.metadata(name, version)

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> JSONResponse:
        is_ready = await dataplane.model_ready(name, version)
        return JSONResponse({"name": name, "ready": is_ready}, status_code=200 if is_ready else 503)

    @app.post("/v2/models/{name}/infer", openapi_extra=request_body_schema(codec.INFER_REQUEST_SCHEMA),
              summary="OIP v2 inference (served by inference_asgi)")
    @app.post("/v2/models/{name}/versions/{version}/infer", openapi_extra=request_body_schema(codec.INFER_REQUEST_SCHEMA))
    async def infer_described(name: str, version: str | None = None) -> Response:
        raise errors.HotsetError("infer is served in front of this app")  # never reached

    # ----- OIP v2: repository ----------------------------------------------

    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> list[dict[str, str]]:
        raw = await body_of(request)
        only_ready = bool(parse_json_object(raw).get("ready", False)) if raw.strip() else False
        entries = repository_entries(manager)
        return [entry for entry in entries if entry["state"] == "READY"] if only_ready else entries

    @app.post("/v2/repository/models/{name}/load")
    async def load(name: str, request: Request) -> dict[str, Any]:
        await body_of(request)  # parameters (config overrides) are not supported; only the size is checked
        await manager.load(name, timeout_of(request))
        return {}

    @app.post("/v2/repository/models/{name}/unload")
    async def unload(name: str, request: Request) -> dict[str, Any]:
        await body_of(request)
        await manager.unload(name)
        return {}

    # ----- hotset ------------------------------------------------------

    @app.get("/status", response_model=wire.WorkerStatus)
    async def status(since: str | None = None, limit: str | None = None,
                     x_hotset_router: str | None = Header(None)) -> Response:
        """The pod's report: whole, or what changed after the report whose ``cursor`` is `since`
        (``0``: from scratch, page by page), at most `limit` entries (status_report.py)."""
        report = reports.report(await readiness(), since, wire.parse_status_limit(limit), x_hotset_router)
        return Response(report.model_dump_json(), media_type="application/json")

    @app.get(worker_identity.IDENTITY_PATH)
    async def pod_identity() -> dict[str, str]:
        """This pod's identity token, for the router and the operator to check before they send it
        anything (it proves which pod answers at this address, nothing more)."""
        token = identity.value() if identity else ""
        if not token:
            raise errors.NotFound("this worker has no identity token (it runs outside a cluster, "
                                       "or its projected token cannot be read)")
        return worker_identity.identity_answer(pod_name, token)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        # Idle models give their series up here, on the event loop (metrics.py; bounded by
        # --max-model-series); then the exposition is rendered on a thread, so a large one (it was
        # 262,000 samples and 5.9 s at 5,000 held copies before the bound) never holds requests.
        metrics.before_scrape()
        body = await asyncio.to_thread(metrics.exposition)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    # ----- OpenAI-compatible API (openai_routes.py) --------------------------
    openai_routes.install(app, dataplane, metrics, max_body_bytes=max_body_bytes, timeout_of=timeout_of)

    served: ASGIApp = InferenceRoutes(app, dataplane, max_body_bytes, functools.partial(parse_json_model,
                                                                                       wire.PredictRequest))
    checked = RequireCaller(served, callers) if callers is not None else served
    return GatewayPort(checked, served, gateway_port) if gateway_port is not None else checked


class GatewayPort:
    """Plain ASGI: a request that came in on the gateway port reaches the app unchecked when its path
    is one of GATEWAY_PATHS, and is 404 otherwise; any other request goes through the caller check.
    The port is the listening socket's (the ASGI scope's ``server``), so no header can claim it."""

    def __init__(self, checked: Any, unchecked: Any, port: int) -> None:
        self.checked = checked
        self.unchecked = unchecked
        self.port = port

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        server = scope.get("server")
        if scope["type"] != "http" or not server or server[1] != self.port:
            await self.checked(scope, receive, send)
        elif scope["path"] in GATEWAY_PATHS:
            await self.unchecked(scope, receive, send)
        else:
            message = (f"{scope['path'][:80]!r} is not served on the gateway port {self.port}: it serves "
                       f"{', '.join(sorted(GATEWAY_ROUTES))}, /metrics and the health probes")
            await JSONResponse(http.error_body(message), status_code=404)(scope, receive, send)


class RequireCaller:
    """Plain ASGI (no per-request middleware stack): the caller check for any request but on
    OPEN_PATHS; its refusal (401, 403, 503) answered here."""

    def __init__(self, app: Any, callers: CallerCheck) -> None:
        self.app = app
        self.callers = callers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            try:
                self.callers.check(headers)
            except errors.HotsetError as exc:
                answer = JSONResponse(http.error_body(exc.message), status_code=exc.status_code, headers=exc.headers)
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _prepare_then_set(prepare: Callable[[], None] | None, done: asyncio.Event) -> None:
    try:
        if prepare is not None:
            await asyncio.to_thread(prepare)
    finally:
        done.set()


def timeout_of(request: Request) -> float | None:
    """The caller's time budget (``X-Hotset-Timeout``, seconds); None: the worker's default."""
    return wire.parse_timeout(request.headers.get(wire.TIMEOUT_HEADER))


def parse_json_model(model: type[pydantic.BaseModel], raw: bytes) -> Any:
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        raise codec.refusal(exc, "invalid request body") from None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise errors.InvalidRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise errors.NestedTooDeeply() from None
    if not isinstance(value, dict):
        raise errors.InvalidRequest("request body must be a JSON object")
    return value


def request_body_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI requestBody for a route that reads its body itself (bounded, maybe compressed):
    clients and the fuzzing test see what it takes."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _framework_of(manager: ModelManager, model_id: str) -> str:
    try:
        return manager.store.get(model_id).framework.value
    except errors.ModelNotFound:
        return ""
