"""Open Inference Protocol v2 over gRPC: the contract the worker and the router share.

The service is KServe's and Triton's ``inference.GRPCInferenceService``. Both
components serve it beside their HTTP API, on a port of its own, and answer it
with the same pipeline, limits and messages as HTTP; this module holds what
both must agree on, so they cannot drift:

- the port (``DEFAULT_PORT``, overridable on each side like the HTTP port);
- the one table from a HotsetError's HTTP status to a gRPC status code
  (``code_for``): a client's mistake is never UNKNOWN or INTERNAL;
- the trailing metadata an error carries: ``retry-after`` (as the HTTP
  header) and ``hotset-status``, the HTTP status the same failure has on the
  HTTP API, so the router sorts a worker's gRPC answer exactly as it sorts
  an HTTP one (5xx: retry elsewhere; 4xx: the client's answer);
- how call metadata reads as request headers (``headers_of``): the bearer
  token (``authorization``), the time budget and the canary choice travel
  under the same names as over HTTP.

Only the worker and the router import this module (their extras install
grpcio); what the operator needs of the contract, the port, is
``wire.GRPC_PORT``, so it builds pods without grpcio.

The call's own gRPC deadline is its time budget (``timeout_of``), capped by
``x-hotset-timeout`` when that is sent too; a call refused because that
deadline ran out is DEADLINE_EXCEEDED (``error_of``).
"""
from __future__ import annotations

from typing import Iterable, Mapping

import grpc

from hotset_common import errors, wire

SERVICE = "inference.GRPCInferenceService"
# Where worker pods and the router serve gRPC in a cluster (KServe's model servers use it too).
DEFAULT_PORT = wire.GRPC_PORT
# The HTTP status the same failure would have (the router reads it to decide on a retry).
STATUS_TRAILER = "hotset-status"
RETRY_AFTER = "retry-after"

_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def code_for(status: int) -> grpc.StatusCode:
    """The gRPC status code of an HTTP status (``_CODES``; other 4xx: INVALID_ARGUMENT, 5xx: INTERNAL)."""
    if status in _CODES:
        return _CODES[status]
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= status < 500 else grpc.StatusCode.INTERNAL


_STATUSES = {code: status for status, code in _CODES.items() if status not in (422, 429, 499, 507)}


def status_for(code: grpc.StatusCode) -> int:
    """The HTTP status of a gRPC error that came without ``hotset-status`` (gRPC's own refusals,
    such as a message past the size limit): the inverse of ``code_for``, 500 for the rest."""
    return _STATUSES.get(code, 500)


def trailers(status: int, headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of an error answer: its HTTP status and, when it has one, Retry-After."""
    retry = [v for k, v in headers.items() if k.lower() == RETRY_AFTER]
    return ((STATUS_TRAILER, str(status)), *((RETRY_AFTER, value) for value in retry[:1]))


# A call whose own deadline has run out (to within this) gets DEADLINE_EXCEEDED for a 503: over HTTP
# "the request's deadline passed" is a 503 (retry), but a gRPC client reads the end of its deadline
# as DEADLINE_EXCEEDED, which its own runtime says too when it notices first.
DEADLINE_SLACK_S = 0.05


def error_of(exc: errors.HotsetError, time_remaining: float | None = None,
             ) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """What a HotsetError is over gRPC: its code, its message (the HTTP body's text) and its trailers.
    `time_remaining`: the call's, when it has a deadline (see DEADLINE_SLACK_S)."""
    code = code_for(exc.status_code)
    if code == grpc.StatusCode.UNAVAILABLE and time_remaining is not None and time_remaining <= DEADLINE_SLACK_S:
        code = grpc.StatusCode.DEADLINE_EXCEEDED
    return code, exc.message, trailers(exc.status_code, exc.headers)


def headers_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """Call metadata as the request headers the HTTP API reads (keys are lowercase in gRPC already);
    binary (``-bin``) entries are left out."""
    headers: dict[str, str] = {}
    for key, value in metadata or ():
        if not key.endswith("-bin") and isinstance(value, str):
            headers[key.lower()] = value
    return headers


def timeout_of(time_remaining: float | None, headers: Mapping[str, str]) -> float | None:
    """A call's time budget in seconds: its gRPC deadline, capped by ``x-hotset-timeout`` when sent;
    None when it has neither (the server's default applies)."""
    asked = wire.parse_timeout(headers.get(wire.TIMEOUT_HEADER))
    budgets = [b for b in (time_remaining, asked) if b is not None]
    return max(min(budgets), 0.001) if budgets else None
