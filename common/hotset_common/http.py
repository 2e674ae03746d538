"""Shared HTTP wiring: the error body, the error-to-status handler, bounded bodies, compressed
bodies and bearer tokens. The worker and the router both use each, so they answer alike."""
from __future__ import annotations

import hmac
import json
import zlib
from typing import Any, Awaitable, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from hotset_common import errors

# Plain ASGI, for the routes router and workers serve in front of their FastAPI apps.
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Request headers a caller's bearer token travels in.
AUTHORIZATION = "authorization"


def error_body(message: str) -> dict[str, str]:
    """Every error body hotset sends: FastAPI's ``detail`` (what a seed client reads), and the
    same text as ``error`` (what Triton's clients and earlier hotset clients read)."""
    return {"detail": message, "error": message}


def install_error_handler(app: FastAPI) -> None:
    """Map every HotsetError to its status with a JSON message naming the problem."""

    @app.exception_handler(errors.HotsetError)
    async def _handle(_: Request, exc: errors.HotsetError) -> JSONResponse:
        return JSONResponse(error_body(exc.message), status_code=exc.status_code, headers=exc.headers)


async def read_body_limited(request: Request, limit_bytes: int) -> bytes:
    """Read a request body, refusing (413) as soon as it passes `limit_bytes`."""
    return await read_body(request.receive, request.headers.get("content-length"), limit_bytes)


async def read_body(receive: Receive, declared: str | None, limit_bytes: int) -> bytes:
    """The whole body of a plain ASGI request (`declared`: its Content-Length header), refused
    (413) as soon as it passes `limit_bytes`; 400 when the client leaves before sending it all."""
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


async def respond(send: Send, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    """A whole answer over plain ASGI (the inference routes served in front of FastAPI)."""
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def respond_error(send: Send, exc: errors.HotsetError) -> None:
    """`exc` as every hotset server answers it (``error_body``, its status and headers)."""
    payload = json.dumps(error_body(exc.message)).encode()
    await respond(send, exc.status_code, payload, {"content-type": "application/json", **exc.headers})


_ZLIB_WINDOW = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes, encoding: str | None, limit_bytes: int) -> bytes:
    """A gzip/deflate request body (tritonclient's request compression), refused past `limit_bytes`
    once inflated: a small compressed body must not become gigabytes (413)."""
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in _ZLIB_WINDOW:
        raise errors.BadInput(f"Content-Encoding {errors.excerpt(encoding)} is not supported; use gzip, deflate or none")
    inflater = zlib.decompressobj(_ZLIB_WINDOW[encoding])
    try:
        raw = inflater.decompress(body, limit_bytes + 1)
    except zlib.error as exc:
        raise errors.BadInput(f"request body is not valid {encoding}: {exc}") from None
    if len(raw) > limit_bytes or inflater.unconsumed_tail:
        raise errors.PayloadTooLarge(f"decompressed request body exceeds the limit of {limit_bytes} bytes")
    return raw


def bearer_token(headers: Mapping[str, str]) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; "" when there is none."""
    scheme, _, token = headers.get(AUTHORIZATION, "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def check_bearer(headers: Mapping[str, str], expected: str, what: str) -> None:
    """401 unless the request carries `expected` as its bearer token (compared in constant time)."""
    if not hmac.compare_digest(bearer_token(headers).encode(), expected.encode()):
        raise errors.Unauthorized(f"{what} needs 'Authorization: Bearer <token>' with this server's token")
