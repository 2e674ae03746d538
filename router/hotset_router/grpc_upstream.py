"""gRPC calls from the router to workers' OIP v2 service, with answers sorted as HTTP's are.

The router never decodes a tensor: a client's message goes to the worker as
the bytes it came in (a generic unary call, identity serializers) and the
worker's answer comes back the same way. Each worker's address is its HTTP
URL's host and the gRPC port its ``/status`` names (``PodView.grpc_port``);
one channel per address, kept (HTTP/2 multiplexes every call on it).

Sorting, as ``upstream.WorkerClient`` does for HTTP: an answer, error or not,
is the worker's (``GrpcAnswer``, its ``status_code`` the HTTP status the
worker put in ``hotset-status``, so 5xx means "try elsewhere" on both
protocols); no connection is ``PodUnreachable``; the time running out with no
answer is a 504.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping
from urllib.parse import urlsplit

import grpc

from hotset_common import errors, grpc_wire
from hotset_common.worker_identity import BearerToken
from hotset_common.wire import SHARE_WEIGHT_HEADER, TIMEOUT_HEADER, VARIANT_HEADER
from hotset_router.upstream import PodUnreachable

# The metadata a client's call keeps on its way to a worker (as upstream.PASSED_REQUEST_HEADERS).
PASSED_METADATA = (TIMEOUT_HEADER, VARIANT_HEADER, SHARE_WEIGHT_HEADER)


@dataclasses.dataclass(frozen=True)
class GrpcAnswer:
    """A worker's answer to one call: its message (serialized), or its error; as routing reads it."""

    status_code: int  # the HTTP status of the same answer (200: a message)
    headers: Mapping[str, str]  # its trailing metadata
    content: bytes = b""
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""

    def with_headers(self, headers: Mapping[str, str]) -> "GrpcAnswer":
        return dataclasses.replace(self, headers=headers)


class GrpcWorkerClient:
    """Calls workers' ``inference.GRPCInferenceService`` with the router's credential for workers
    (``credential``: its projected ServiceAccount token, read again as the kubelet rotates it; or a
    local stack's fixed token), over kept channels."""

    def __init__(self, port_of: Callable[[str], int | None], credential: BearerToken | None = None,
                 max_message_bytes: int = 64 * 2**20) -> None:
        self.port_of = port_of  # a pod's gRPC port by its url (the map's PodView.grpc_port)
        self.credential = credential or BearerToken()
        self._options = [("grpc.max_receive_message_length", -1),
                         ("grpc.max_send_message_length", max_message_bytes)]
        self._channels: dict[str, grpc.aio.Channel] = {}

    def address(self, url: str) -> str:
        port = self.port_of(url)
        if port is None:
            raise PodUnreachable(url, RuntimeError("it serves no gRPC (its /status names no grpc_port)"), gone=False)
        host = urlsplit(url).hostname or ""
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address, options=self._options)
        return channel

    async def call(self, url: str, method: str, message: bytes, headers: Mapping[str, str],
                   timeout_s: float) -> GrpcAnswer:
        """Call `method` of the worker at `url` with `message` as it came, within `timeout_s`."""
        address = self.address(url)
        token = self.credential.value()
        metadata = tuple((k, v) for k, v in headers.items() if k in PASSED_METADATA) + (
            (("authorization", f"Bearer {token}"),) if token else ())
        stub = self._channel(address).unary_unary(f"/{grpc_wire.SERVICE}/{method}")
        try:
            call = stub(message, metadata=metadata, timeout=max(timeout_s, 0.001))
            content = await call
            trailers = _plain(await call.trailing_metadata())
            return GrpcAnswer(200, trailers, content)
        except grpc.aio.AioRpcError as exc:
            return await self._sorted(url, address, method, exc, timeout_s)

    async def _sorted(self, url: str, address: str, method: str, exc: grpc.aio.AioRpcError,
                      timeout_s: float) -> GrpcAnswer:
        trailers = _plain(exc.trailing_metadata())
        status = trailers.get(grpc_wire.STATUS_TRAILER, "")
        if status.isdigit():  # the worker's own answer
            return GrpcAnswer(int(status), trailers, code=exc.code(), details=exc.details() or "")
        if exc.code() == grpc.StatusCode.UNAVAILABLE:  # refused, reset, not speaking gRPC
            channel = self._channels.pop(address, None)  # a pod that went keeps no channel
            if channel is not None:
                await channel.close()
            raise PodUnreachable(url, exc) from None
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise errors.UpstreamTimeout(f"worker {url} did not answer {method} within {timeout_s:.1f}s") from None
        return GrpcAnswer(grpc_wire.status_for(exc.code()), trailers, code=exc.code(), details=exc.details() or "")

    async def aclose(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def _plain(metadata: object) -> dict[str, str]:
    return grpc_wire.headers_of(metadata)  # type: ignore[arg-type]
