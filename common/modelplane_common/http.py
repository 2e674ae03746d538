"""Shared FastAPI wiring: the error body, the error-to-status handler and a body-size guard."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from modelplane_common import errors


def error_body(message: str) -> dict[str, str]:
    """Every error body modelplane sends: FastAPI's ``detail`` (what a seed client reads), and the
    same text as ``error`` (what Triton's clients and earlier modelplane clients read)."""
    return {"detail": message, "error": message}


def install_error_handler(app: FastAPI) -> None:
    """Map every ModelplaneError to its status with a JSON message naming the problem."""

    @app.exception_handler(errors.ModelplaneError)
    async def _handle(_: Request, exc: errors.ModelplaneError) -> JSONResponse:
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
