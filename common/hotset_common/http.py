"""Shared HTTP wiring: the error body, the error-to-status handler, bounded bodies, compressed
bodies and bearer tokens. The worker and the router both use each, so they answer alike."""
from __future__ import annotations

import hmac
import zlib
from typing import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from hotset_common import errors

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
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise errors.PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise errors.PayloadTooLarge(f"request body exceeds the limit of {limit_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


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
