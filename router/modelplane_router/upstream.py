"""HTTP calls from the router to workers, with failures sorted into what routing must do.

A connection failure means the pod is gone (``PodUnreachable``: leave the
map, retry elsewhere); a timeout is a 504; any answer, even an error, is the
worker's and is passed on untouched.
"""
from __future__ import annotations

from typing import Mapping

import httpx

from modelplane_common import errors
from modelplane_common.wire import WorkerStatus

# Headers a worker's answer keeps on its way back through the router.
PASSED_RESPONSE_HEADERS = ("content-type", "inference-header-content-length", "retry-after")
# Headers a client's request keeps on its way to a worker.
PASSED_REQUEST_HEADERS = ("content-type", "inference-header-content-length", "accept")


class PodUnreachable(Exception):
    """The worker did not answer at all (refused, reset, DNS): it leaves the map."""

    def __init__(self, url: str, cause: Exception) -> None:
        super().__init__(f"worker {url} unreachable: {cause!r}")
        self.url = url


class WorkerError(errors.ModelplaneError):
    """A worker answered an admin call with an error; its status and message are kept."""

    def __init__(self, status_code: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.headers = {k: v for k, v in (headers or {}).items() if k.lower() == "retry-after"}


def error_message(response: httpx.Response) -> str:
    """The worker's own error text ({"error": ...} or Triton's {"error": ...}), else the raw body."""
    try:
        body = response.json()
        if isinstance(body, dict) and "error" in body:
            return str(body["error"])
        if isinstance(body, dict) and "detail" in body:
            return str(body["detail"])
    except ValueError:
        pass
    return response.text[:500] or f"HTTP {response.status_code}"


class WorkerClient:
    """One pooled HTTP client for every worker."""

    def __init__(self, request_timeout_s: float = 60.0, load_timeout_s: float = 300.0, status_timeout_s: float = 2.0) -> None:
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=128)
        self._http = httpx.AsyncClient(timeout=request_timeout_s, limits=limits)
        self.load_timeout_s = load_timeout_s
        self.status_timeout_s = status_timeout_s

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, url: str, method: str, path: str, timeout: float | None = None, **kwargs) -> httpx.Response:
        try:
            if timeout is None:
                return await self._http.request(method, url + path, **kwargs)
            return await self._http.request(method, url + path, timeout=timeout, **kwargs)
        except httpx.TimeoutException as exc:
            raise errors.UpstreamTimeout(f"worker {url} did not answer {method} {path} in time: {type(exc).__name__}") from exc
        except (httpx.TransportError, OSError) as exc:
            raise PodUnreachable(url, exc) from exc

    async def status(self, url: str) -> WorkerStatus:
        response = await self._send(url, "GET", "/status", timeout=self.status_timeout_s)
        response.raise_for_status()
        return WorkerStatus.model_validate_json(response.content)

    async def load(self, url: str, model: str) -> None:
        response = await self._send(url, "POST", f"/v2/repository/models/{model}/load", timeout=self.load_timeout_s)
        if response.status_code >= 400:
            raise WorkerError(response.status_code, f"loading {model!r} on {url} failed: {error_message(response)}", response.headers)

    async def unload(self, url: str, model: str) -> None:
        response = await self._send(url, "POST", f"/v2/repository/models/{model}/unload", timeout=self.load_timeout_s)
        if response.status_code >= 400 and response.status_code != 404:
            raise WorkerError(response.status_code, f"unloading {model!r} on {url} failed: {error_message(response)}", response.headers)

    async def forward(self, url: str, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """Send a client's request to a worker as it is; the worker's answer comes back as it is."""
        passed = {k: v for k, v in headers.items() if k.lower() in PASSED_REQUEST_HEADERS}
        return await self._send(url, method, path, content=body, headers=passed)

    async def get(self, url: str, path: str) -> httpx.Response:
        return await self._send(url, "GET", path, timeout=self.status_timeout_s)
