"""The worker's Open Inference Protocol v2 over gRPC (``inference.GRPCInferenceService``).

A second wire format onto the one request pipeline: every call goes to the
same ``DataPlane`` the HTTP routes call (admission queue, maxConcurrency
slots, loads, deadlines, canary choice, metrics), and only decoding and
encoding are gRPC's own (grpc_codec.py). Choices worth knowing:

- served in the worker's process and event loop (``grpc.aio``), on a port of
  its own (``hotset_common.grpc_wire.DEFAULT_PORT``; ``--grpc-port``), started
  and stopped with the HTTP app's lifespan;
- ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata,
  ModelInfer, and the repository calls (RepositoryIndex, RepositoryModelLoad,
  RepositoryModelUnload: the HTTP API's ``/v2/repository`` routes, the same
  index, a load within the call's deadline); the rest (statistics, shared
  memory, trace) answers UNIMPLEMENTED;
- errors: the HotsetError the HTTP API would answer, with the same message,
  as the gRPC code of its status (``grpc_wire.code_for``), ``retry-after``
  and ``hotset-status`` in the trailing metadata;
- the call's deadline is the request's time budget (``grpc_wire.timeout_of``),
  and a request refused because it ran out is DEADLINE_EXCEEDED (a shorter
  ``timeoutSeconds`` that ran out is UNAVAILABLE with retry-after, as HTTP's 503);
- a triton model infers on tensors here (its HTTP path forwards the body to
  the sidecar as it came; a protobuf request has no such body);
- with a caller check (callers.py), every call but ServerLive and ServerReady
  (the probes) needs ``authorization: Bearer <token>`` metadata, as over HTTP;
- messages up to the worker's body limit (``--max-body-bytes``); past it,
  gRPC itself answers RESOURCE_EXHAUSTED;
- the HTTP port's slow-client bounds, as gRPC spells them
  (``slow_clients.grpc_server_options``): calls in progress capped
  (RESOURCE_EXHAUSTED past it), metadata capped, idle connections closed,
  connections aged out, keepalive pings enforced.
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from hotset_common import errors, grpc_wire, slow_clients, wire
from hotset_common.slow_clients import ClientLimits
from hotset_worker import grpc_codec
from hotset_worker.callers import CallerCheck
from hotset_worker.dataplane import DataPlane
from hotset_worker.manager import RequestTiming
from hotset_worker.repository import repository_entries

log = logging.getLogger(__name__)

Reply = TypeVar("Reply")
Readiness = Callable[[], Awaitable[dict[str, Any]]]


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The calls of ``inference.GRPCInferenceService`` the worker answers, each onto the data plane."""

    def __init__(self, dataplane: DataPlane, readiness: Readiness, server_name: str, server_version: str,
                 extensions: list[str], callers: CallerCheck | None = None) -> None:
        self.dataplane = dataplane
        self.readiness = readiness  # what /v2/health/ready answers
        self.server_name = server_name
        self.server_version = server_version
        self.extensions = extensions
        self.callers = callers  # who may call (callers.py); None: everyone

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=bool((await self.readiness())["ready"]))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        async def answer(_: dict[str, str]) -> pb.ServerMetadataResponse:
            return pb.ServerMetadataResponse(name=self.server_name, version=self.server_version,
                                             extensions=self.extensions)

        return await self._answer(context, answer)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        async def answer(_: dict[str, str]) -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(ready=await self.dataplane.model_ready(request.name, request.version or None))

        return await self._answer(context, answer)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        async def answer(_: dict[str, str]) -> pb.ModelMetadataResponse:
            return grpc_codec.metadata_response(await self.dataplane.metadata(request.name, request.version or None))

        return await self._answer(context, answer)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        timing = RequestTiming()

        async def answer(headers: dict[str, str]) -> pb.ModelInferResponse:
            def encode(inferred: Any) -> pb.ModelInferResponse:
                return grpc_codec.encode_response(inferred.model_name, inferred.model_version, inferred.request,
                                                  inferred.outputs)

            self.dataplane.note_share_weight(headers.get(wire.SHARE_WEIGHT_HEADER))
            reply = await self.dataplane.infer_tensors(
                request.model_name, request.model_version or None, lambda: grpc_codec.decode_request(request), encode,
                grpc_wire.timeout_of(context.time_remaining(), headers), timing, headers.get(wire.VARIANT_HEADER),
                size=request.ByteSize())
            context.set_trailing_metadata(((wire.SERVER_TIMING_HEADER, timing.header()),
                                           (wire.VERSION_HEADER, timing.version)))
            return reply

        return await self._answer(context, answer)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        async def answer(_: dict[str, str]) -> pb.RepositoryIndexResponse:
            entries = repository_entries(self.dataplane.manager)
            return pb.RepositoryIndexResponse(models=[
                pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in entries
                if not request.ready or entry["state"] == "READY"])

        return await self._answer(context, answer)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: grpc.aio.ServicerContext) -> pb.RepositoryModelLoadResponse:
        async def answer(headers: dict[str, str]) -> pb.RepositoryModelLoadResponse:
            # parameters (config overrides) are not supported, as over HTTP: a ServedModel configures its model
            await self.dataplane.manager.load(request.model_name, grpc_wire.timeout_of(context.time_remaining(), headers))
            return pb.RepositoryModelLoadResponse()

        return await self._answer(context, answer)

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: grpc.aio.ServicerContext) -> pb.RepositoryModelUnloadResponse:
        async def answer(_: dict[str, str]) -> pb.RepositoryModelUnloadResponse:
            await self.dataplane.manager.unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._answer(context, answer)

    async def _answer(self, context: grpc.aio.ServicerContext,
                      answer: Callable[[dict[str, str]], Awaitable[Reply]]) -> Reply:
        """Run one call (its metadata read as headers, the token checked) with errors as gRPC statuses."""
        try:
            headers = grpc_wire.headers_of(context.invocation_metadata())
            if self.callers is not None:
                self.callers.check(headers)
            return await answer(headers)
        except errors.HotsetError as exc:
            code, message, trailers = grpc_wire.error_of(exc, context.time_remaining())
        except RecursionError:  # a value nested past what some step could walk: the input's fault
            code, message, trailers = grpc_wire.error_of(errors.NestedTooDeeply())
        except Exception as exc:  # noqa: BLE001 - a bug, named, not a bare UNKNOWN
            log.exception("unhandled error in a gRPC call")
            code, message, trailers = grpc_wire.error_of(errors.HotsetError(f"internal error: {type(exc).__name__}: {exc}"))
        await context.abort(code, message, trailing_metadata=trailers)
        raise AssertionError("unreachable: abort raises")


def create_server(service: InferenceService, address: str, max_message_bytes: int,
                  limits: ClientLimits | None = None) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server of `service` bound to `address` (host:port; port 0: a free one), not yet
    started; and the port it bound. Messages past `max_message_bytes` are refused by gRPC itself,
    and clients are bounded by the HTTP port's `limits` (``slow_clients.grpc_server_options``)."""
    bounds = slow_clients.grpc_server_options(limits or ClientLimits())
    server = grpc.aio.server(maximum_concurrent_rpcs=bounds["maximum_concurrent_rpcs"],
                             options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", -1),
                                      ("grpc.so_reuseport", 0), *bounds["options"]])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot serve gRPC on {address}")
    return server, port
