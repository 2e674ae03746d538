"""HTTP calls from the router to workers, with failures sorted into what routing must do.

A connection failure means the pod is gone (``PodUnreachable``: leave the
map, retry elsewhere); a timeout is a 504; any answer, even an error, is the
worker's and is passed on untouched.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, AsyncIterator, Callable, Mapping
from urllib.parse import quote

import aiohttp
import yarl

from hotset_common import errors, worker_identity
from hotset_common.worker_identity import BearerToken
from hotset_common.wire import (ROUTER_ID_HEADER, SERVER_TIMING_HEADER, STATUS_LIMIT, STATUS_SINCE, TIMEOUT_HEADER,
                                 SHARE_WEIGHT_HEADER, VARIANT_HEADER, VERSION_HEADER, WorkerStatus)

# Headers a worker's answer keeps on its way back through the router. Content-Encoding goes with
# the body it describes (a client that asked for gzip with Accept-Encoding gets it from Triton).
PASSED_RESPONSE_HEADERS = ("content-type", "inference-header-content-length", "retry-after", SERVER_TIMING_HEADER,
                           "content-encoding", VERSION_HEADER)
# Headers a client's request keeps on its way to a worker: a gzip body (tritonclient's request
# compression) is only readable with its Content-Encoding. SHARE_WEIGHT_HEADER is the router's
# own (forwarding.py replaces a client's).
PASSED_REQUEST_HEADERS = ("content-type", "inference-header-content-length", "accept", TIMEOUT_HEADER, VARIANT_HEADER,
                          "content-encoding", "accept-encoding", SHARE_WEIGHT_HEADER)


class PodUnreachable(Exception):
    """The worker did not answer at all (refused, reset, DNS): it leaves the map. `gone` false: the
    pod is there but cannot take this call (gRPC to a pod that serves none): try elsewhere, ask nothing."""

    def __init__(self, url: str, cause: Exception, gone: bool = True) -> None:
        super().__init__(f"worker {url} unreachable: {cause!r}")
        self.url = url
        self.gone = gone


class WorkerError(errors.HotsetError):
    """A worker answered an admin call with an error; its status and message are kept."""

    def __init__(self, status_code: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.headers = {k: v for k, v in (headers or {}).items() if k.lower() == "retry-after"}


@dataclasses.dataclass(frozen=True)
class UpstreamResponse:
    """A worker's whole answer, read into memory (inference answers are small and bounded)."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def with_headers(self, headers: Mapping[str, str]) -> "UpstreamResponse":
        """The same answer with other headers (the router's Server-Timing added to the worker's)."""
        return dataclasses.replace(self, headers=headers)


class UpstreamStream:
    """A worker's answer whose body is still arriving (server-sent events): passed on chunk by chunk
    as each arrives, never read whole. ``close`` gives the connection back (or drops it when the
    body was not read to its end, so the worker sees the client leave) and runs ``on_close``."""

    def __init__(self, response: aiohttp.ClientResponse, url: str) -> None:
        self.status_code = response.status
        self.headers: Mapping[str, str] = dict(response.headers)
        self.url = url
        self._response = response
        self._on_close: list[Callable[[], None]] = []
        self._closed = False

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    def with_headers(self, headers: Mapping[str, str]) -> "UpstreamStream":
        """This answer with other headers, before they are sent (the router's Server-Timing added)."""
        self.headers = headers
        return self

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; a worker that goes away mid-answer ends it early."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError):
            return  # the answer already started: nothing else can be sent instead

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError):
            return b""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()  # not read to the end: drop the connection, the worker stops generating
        for callback in self._on_close:
            callback()


def error_message(response: UpstreamResponse) -> str:
    """The worker's own error text ({"error": ...} or FastAPI's {"detail": ...}), else the raw body."""
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
    """One pooled HTTP client (aiohttp: a fraction of httpx's per-request CPU) for every worker."""

    def __init__(self, request_timeout_s: float = 60.0, load_timeout_s: float = 300.0, status_timeout_s: float = 2.0,
                 credential: BearerToken | None = None, router_id: str = "") -> None:
        self.request_timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.load_timeout = aiohttp.ClientTimeout(total=load_timeout_s)
        self.status_timeout = aiohttp.ClientTimeout(total=status_timeout_s)
        # Workers in cluster mode answer only the router's and the operator's own ServiceAccount tokens
        # (read again as the kubelet rotates the file); a local stack's workers, anyone or one token.
        self.credential = credential or BearerToken()
        self._router = {ROUTER_ID_HEADER: router_id} if router_id else {}  # on status calls: who asks
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running event loop.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=256, keepalive_timeout=3.0)
            # No automatic Accept-Encoding: the answer goes to a client that did not ask for
            # compression, and Content-Encoding is not passed on (a worker forwarding to Triton
            # would otherwise hand back a gzip body the client cannot read).
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  skip_auto_headers=("Accept-Encoding",))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, headers: Mapping[str, str] | None, passed_only: bool = False) -> dict[str, str]:
        """What every call to a worker carries, whole or streamed: the caller's headers (only
        PASSED_REQUEST_HEADERS of a client's, among them the time left, ``X-Hotset-Timeout``) and the
        router's credential. The one place both are added, so no route can reach a worker without them."""
        given = headers or {}
        kept = {k: v for k, v in given.items() if k.lower() in PASSED_REQUEST_HEADERS} if passed_only else dict(given)
        return {**kept, **self.credential.headers()}

    async def _send(self, url: str, method: str, path: str, timeout: aiohttp.ClientTimeout,
                    body: bytes | None = None, headers: Mapping[str, str] | None = None,
                    passed_only: bool = False) -> UpstreamResponse:
        try:
            async with self._http().request(method, yarl.URL(url + path, encoded=True), data=body,
                                            headers=self._headers(headers, passed_only), timeout=timeout,
                                            allow_redirects=False) as response:
                content = await response.read()
                return UpstreamResponse(response.status, dict(response.headers), content)
        except asyncio.TimeoutError as exc:
            raise errors.UpstreamTimeout(f"worker {url} did not answer {method} {path} within {timeout.total}s") from exc
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, or not speaking HTTP at all
            raise PodUnreachable(url, exc) from exc

    async def status(self, url: str, since: str | None = None, limit: int | None = None) -> WorkerStatus:
        """The worker's report: whole, or what changed after the cursor `since` (at most `limit` entries)."""
        query = []
        if since is not None:
            query.append(f"{STATUS_SINCE}={quote(since, safe='')}")
        if limit is not None:
            query.append(f"{STATUS_LIMIT}={limit}")
        path = "/status" + ("?" + "&".join(query) if query else "")
        response = await self._send(url, "GET", path, self.status_timeout, headers=self._router)
        if response.status_code != 200:
            raise WorkerError(response.status_code, f"status of {url}: {error_message(response)}")
        return WorkerStatus.model_validate_json(response.content)

    async def identity(self, url: str) -> str:
        """The pod's identity token (``GET /identity``, asked with no credential: the pod has not
        proved who it is yet); raises WorkerError when it has none, PodUnreachable when it cannot answer."""
        try:
            async with self._http().get(url + worker_identity.IDENTITY_PATH, timeout=self.status_timeout,
                                        allow_redirects=False) as response:
                content = await response.read()
                status = response.status
        except asyncio.TimeoutError as exc:
            raise errors.UpstreamTimeout(f"worker {url} did not answer {worker_identity.IDENTITY_PATH}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise PodUnreachable(url, exc) from exc
        if status != 200:
            raise WorkerError(status, f"{worker_identity.IDENTITY_PATH} of {url} answered {status}: "
                                      f"{errors.excerpt(content.decode('utf-8', 'replace'))}")
        try:
            return worker_identity.token_of_answer(json.loads(content))
        except ValueError:
            raise WorkerError(502, f"{worker_identity.IDENTITY_PATH} of {url} is not JSON") from None

    async def load(self, url: str, model: str, timeout_s: float | None = None, load_timeout_s: float | None = None) -> None:
        """Load `model` on `url` within the load timeout (`load_timeout_s`, the model's own, else the
        router's), or `timeout_s` (a request's time left) if shorter; the worker may wait for room
        within that budget."""
        cap = load_timeout_s if load_timeout_s is not None else self.load_timeout.total
        budget = min(timeout_s, cap or timeout_s) if timeout_s is not None else cap
        budget = max(budget or 0.0, 0.001)
        response = await self._send(url, "POST", f"/v2/repository/models/{quote(model, safe='')}/load", aiohttp.ClientTimeout(total=budget),
                                    headers={TIMEOUT_HEADER: f"{budget:.3f}"})
        if response.status_code >= 400:
            raise WorkerError(response.status_code, f"loading {model!r} on {url} failed: {error_message(response)}", response.headers)

    async def unload(self, url: str, model: str) -> None:
        response = await self._send(url, "POST", f"/v2/repository/models/{quote(model, safe='')}/unload", self.load_timeout)
        if response.status_code >= 400 and response.status_code != 404:
            raise WorkerError(response.status_code, f"unloading {model!r} on {url} failed: {error_message(response)}", response.headers)

    async def open(self, url: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                   timeout_s: float, idle_timeout_s: float) -> UpstreamStream:
        """Send a client's request as it is and return as soon as the worker's answer starts: within
        `timeout_s` for the status and headers, then at most `idle_timeout_s` between two chunks."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout_s)
        try:
            response = await asyncio.wait_for(
                self._http().request(method, url + path, data=body or None, headers=self._headers(headers, passed_only=True),
                                     timeout=timeout, allow_redirects=False),
                max(timeout_s, 0.001))
        except asyncio.TimeoutError as exc:
            raise errors.UpstreamTimeout(f"worker {url} did not start answering {method} {path} within {timeout_s:.1f}s") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            raise PodUnreachable(url, exc) from exc
        return UpstreamStream(response, url)

    async def forward(self, url: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                      timeout_s: float | None = None) -> UpstreamResponse:
        """Send a client's request to a worker as it is, within `timeout_s` (default: the request
        timeout); the worker's answer comes back as it is. `path` is the client's raw path, still
        percent-encoded: a ``%3F`` in a path segment must not become a query upstream."""
        timeout = self.request_timeout if timeout_s is None else aiohttp.ClientTimeout(total=max(timeout_s, 0.001))
        return await self._send(url, method, path, timeout, body or None, headers, passed_only=True)
