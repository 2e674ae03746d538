"""The gateway's Open Inference Protocol v2 over gRPC (``inference.GRPCInferenceService``).

What the HTTP gateway does for ``/v2/...``, for gRPC clients (tritonclient.grpc,
KServe's generated clients), on a port of its own:

- ModelInfer and ModelMetadata take the HTTP requests' path, the same one:
  the flood guard (infer only, as over HTTP), the model's copies, a load
  started and waited for within the deadline, the canary split, the pod
  wait, one retry elsewhere (forwarding.py ``forward_with``); then the
  message goes, as its bytes, to the chosen worker's gRPC port
  (grpc_upstream.py), and the worker's answer comes back as its bytes;
- ModelReady, ServerReady, ServerLive, ServerMetadata are answered here, as
  the HTTP routes answer them;
- the call's deadline is the request's deadline (``grpc_wire.timeout_of``);
  one that runs out is DEADLINE_EXCEEDED;
- errors carry the HTTP API's message as the gRPC code of its status
  (``grpc_wire.code_for``), with ``retry-after`` in the trailing metadata
  when there is one; a worker's error passes through as it came;
- RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload are the
  HTTP ``/v2/repository`` routes (repository.py): the models this caller may
  see; load and unload with the admin token (``authorization: Bearer``
  metadata), placing or dropping copies cluster-wide;
- the rest of the service (statistics, shared memory, trace) answers
  UNIMPLEMENTED, as grpc does for a method no handler has.

Like the HTTP inference routes, the other calls need no token of the router's
own; the router adds the worker token on its way to a pod.
"""
from __future__ import annotations

import functools
from typing import Awaitable, Callable

import grpc

from hotset_common import errors, grpc_wire, slow_clients, wire
from hotset_common.slow_clients import ClientLimits
from hotset_router import protowire
from hotset_router.flood import FloodGuard
from hotset_router.forwarding import nothing_more
from hotset_router.grpc_upstream import GrpcAnswer, GrpcWorkerClient
from hotset_router.inference_asgi import metric_label
from hotset_router.repository import check_admin, index_rows, models_report
from hotset_router.request_record import RequestRecord
from hotset_router.service import RouterService

SERVER_NAME = "hotset-router"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data", "model_repository")
Handler = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


class GrpcGateway:
    """The service's calls, each onto the router's one request path."""

    def __init__(self, service: RouterService, guard: FloodGuard, client: GrpcWorkerClient,
                 admin_token: str | None = None) -> None:
        self.service = service
        self.admin_token = admin_token
        self.router = service.router
        self.guard = guard
        self.client = client
        self.label = functools.partial(metric_label, self.router)

    def handler(self) -> grpc.GenericRpcHandler:
        """The service's methods with identity (de)serializers: messages stay bytes."""
        methods: dict[str, Handler] = {
            "ServerLive": self.server_live, "ServerReady": self.server_ready, "ServerMetadata": self.server_metadata,
            "ModelReady": self.model_ready, "ModelMetadata": self.model_metadata, "ModelInfer": self.model_infer,
            "RepositoryIndex": self.repository_index, "RepositoryModelLoad": self.repository_model_load,
            "RepositoryModelUnload": self.repository_model_unload,
        }
        return grpc.method_handlers_generic_handler(
            grpc_wire.SERVICE, {name: grpc.unary_unary_rpc_method_handler(method) for name, method in methods.items()})

    # ----- answered here ---------------------------------------------------------------

    async def server_live(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return protowire.boolean(1, True)

    async def server_ready(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return protowire.boolean(1, bool(self.service.model_map.ready_pods()))

    async def server_metadata(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        extensions = b"".join(protowire.string(3, extension) for extension in EXTENSIONS)
        return protowire.string(1, SERVER_NAME) + protowire.string(2, SERVER_VERSION) + extensions

    async def model_ready(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            name, version = _model_of(request)
            return protowire.boolean(1, await self.service.model_ready(
                name, version, grpc_wire.headers_of(context.invocation_metadata())))
        except errors.HotsetError as exc:
            await _abort(context, exc)
            raise

    async def repository_index(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """RepositoryIndexRequest {repository_name = 1, ready = 2} -> RepositoryIndexResponse {models = 1}."""
        try:
            ready_only = protowire.flag(request, 2)
            rows = index_rows(await models_report(self.service, grpc_wire.headers_of(context.invocation_metadata())))
        except errors.HotsetError as exc:
            await _abort(context, exc)
            raise
        return b"".join(protowire.message(1, protowire.string(1, row["name"]) + protowire.string(3, row["state"]))
                        for row in rows if not ready_only or row["state"] == "READY")

    async def repository_model_load(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """RepositoryModelLoadRequest {repository_name = 1, model_name = 2}: ready copies as the HTTP load makes them."""
        try:
            model = self._admin_call(request, context)
            await self.router.ensure_ready_copies(model)
        except errors.HotsetError as exc:
            await _abort(context, exc)
            raise
        return b""

    async def repository_model_unload(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """RepositoryModelUnloadRequest {repository_name = 1, model_name = 2}: the model's copies dropped everywhere."""
        try:
            await self.router.unload_everywhere(self._admin_call(request, context))
        except errors.HotsetError as exc:
            await _abort(context, exc)
            raise
        return b""

    def _admin_call(self, request: bytes, context: grpc.aio.ServicerContext) -> str:
        """The model a load or unload names, once its caller has shown the admin token."""
        check_admin(grpc_wire.headers_of(context.invocation_metadata()), self.admin_token)
        name = protowire.strings(request, (2,)).get(2, "")
        if not name:
            raise errors.InvalidRequest("the request names no model (its model_name is empty)")
        return wire.requested_model(name)

    # ----- forwarded to a worker ---------------------------------------------------------

    async def model_metadata(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._forward("ModelMetadata", request, context, load=False)

    async def model_infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._forward("ModelInfer", request, context, load=True)

    async def _forward(self, method: str, request: bytes, context: grpc.aio.ServicerContext, load: bool) -> bytes:
        """One call through the router's request path; the worker's answer or error as it came."""
        with RequestRecord(self.guard, self.service.metrics, self.label) as record:
            try:
                headers = grpc_wire.headers_of(context.invocation_metadata())
                timeout = grpc_wire.timeout_of(context.time_remaining(), headers)
                if timeout is not None:
                    headers[wire.TIMEOUT_HEADER] = f"{timeout:.3f}"
                ticket = record.ticket = self.guard.admit_whole(len(request)) if load else None
                model, version = _model_of(request)
                record.model = model

                async def send(url: str, sent: dict[str, str], timeout_s: float) -> GrpcAnswer:
                    return await self.client.call(url, method, request, sent, timeout_s)

                answer = await self.router.forwarding.forward_with(
                    model, headers, send, load, versioned=bool(version),
                    on_admitted=(lambda: self.guard.for_model(ticket, model)) if ticket is not None else nothing_more)
                if ticket is not None:
                    self.guard.done_waiting(ticket)
                record.code = answer.status_code
                if answer.status_code != 200:
                    await context.abort(answer.code, answer.details, trailing_metadata=_kept(answer))
                if served_by := answer.headers.get(wire.VERSION_HEADER):
                    self.service.metrics.answered_by(self.label(model), served_by)
                context.set_trailing_metadata(_kept(answer))
                return answer.content
            except errors.HotsetError as exc:
                record.code = exc.status_code
                await _abort(context, exc)
                raise


def _model_of(request: bytes) -> tuple[str, str]:
    """The model name and version (fields 1 and 2) of an infer, ready or metadata request."""
    fields = protowire.strings(request, (1, 2))
    name = fields.get(1, "")
    if not name:
        raise errors.InvalidRequest("the request names no model (its model name is empty)")
    return wire.requested_model(name), fields.get(2, "")


# Trailing metadata a worker's answer keeps on its way back (as upstream.PASSED_RESPONSE_HEADERS).
_PASSED = (grpc_wire.RETRY_AFTER, grpc_wire.STATUS_TRAILER, wire.SERVER_TIMING_HEADER, wire.VERSION_HEADER)


def _kept(answer: GrpcAnswer) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in answer.headers.items() if k in _PASSED)


async def _abort(context: grpc.aio.ServicerContext, exc: errors.HotsetError) -> None:
    code, message, trailers = grpc_wire.error_of(exc, context.time_remaining())
    await context.abort(code, message, trailing_metadata=trailers)


def create_server(gateway: GrpcGateway, address: str, max_message_bytes: int,
                  limits: ClientLimits | None = None) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server of `gateway` bound to `address` (host:port; port 0: a free one), not yet
    started; its clients bounded by the HTTP port's `limits` (``slow_clients.grpc_server_options``:
    calls in progress, metadata size, idle and aged connections, keepalive pings)."""
    bounds = slow_clients.grpc_server_options(limits or ClientLimits())
    server = grpc.aio.server(maximum_concurrent_rpcs=bounds["maximum_concurrent_rpcs"],
                             options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", -1),
                                      ("grpc.so_reuseport", 0), *bounds["options"]])
    server.add_generic_rpc_handlers((gateway.handler(),))
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot serve gRPC on {address}")
    return server, port
