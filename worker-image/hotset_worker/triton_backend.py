"""The pod's Triton sidecar as one backend: one client, one connection policy, one health record.

Everything the worker says to its sidecar goes through ``TritonBackend``:
whether it is ready, which models it holds, load and unload, model metadata
and statistics, tensor inference and forwarded OIP v2 bodies. The engine, the
data plane and the API ask it through the ``backends.Backend`` interface and
never name Triton; only the triton framework worker uses the rest.

Choices worth knowing:

- **A new connection per request.** Triton 2.51 answers nothing on a
  keep-alive connection opened before a model load until that load ends
  (measured: 1.9 s stalls behind a 1.9 s load of the iris sample, while new
  connections were answered within 0.1 s). So every request opens its own
  (aiohttp ``force_close``); a loopback connect costs well under a millisecond.
- **One library.** aiohttp carries every call (it forwarded an OIP body in
  about half of httpx's time here). Tensors are encoded and decoded by
  tritonclient's own codec (``generate_request_body``, ``InferResult``), so
  the binary data extension is not written twice.
- **Threads and loops.** Framework workers load and infer on threads; their
  calls run on this backend's own event loop thread. Callers already on an
  event loop (health, held models, forwarding) use a session on their loop:
  an aiohttp session belongs to the loop that made it.
- **Health does not flap.** A probe that goes unanswered (a timeout) is not
  proof the sidecar is down: the last answer stands until nothing has
  answered ready for ``unanswered_grace_s``. A refused or reset connection,
  or a non-200 answer, counts at once.
- **Sizes from Triton.** Triton's model statistics carry ``memory_usage``
  for backends that report it (e.g. TensorRT, ONNX Runtime on a GPU);
  ``memory_bytes`` sums it, and says 0 where Triton reports nothing.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, TypeVar
from urllib.parse import quote

import aiohttp

from hotset_common import errors
from hotset_common.spec import Framework, ModelSpec
from hotset_worker.frameworks.base import ForwardedResponse

NAME = "triton"
# Request headers an OIP v2 infer forward passes on to the sidecar, and response headers it drops.
FORWARDED_REQUEST_HEADERS = ("content-type", "inference-header-content-length", "content-encoding", "accept-encoding")
_HOP_BY_HOP_RESPONSE_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
HEADER_LENGTH = "Inference-Header-Content-Length"
CONNECT_TIMEOUT_S = 5.0

T = TypeVar("T")


class TritonRefused(Exception):
    """Triton answered with an error status; `message` is Triton's own text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def address(url: str) -> str:
    """``127.0.0.1:8000`` or ``http://127.0.0.1:8000`` as ``host:port`` ('' stays '')."""
    return url.strip().split("://", 1)[-1].rstrip("/")


def memory_from_statistics(statistics: Mapping[str, Any]) -> int:
    """Bytes Triton reports for a model (``model_stats[].memory_usage[].byte_size``, every device); 0: none."""
    total = 0
    for model in statistics.get("model_stats") or []:
        for usage in model.get("memory_usage") or []:
            try:
                total += max(0, int(usage.get("byte_size", 0)))
            except (TypeError, ValueError):
                continue
    return total


class TritonBackend:
    """The one client of a pod's Triton sidecar (empty `url`: this pod has none)."""

    name = NAME
    frameworks = frozenset({Framework.TRITON})

    def __init__(
        self,
        url: str,
        repository: Path | str = Path("/models"),
        *,
        timeout_s: float = 120.0,
        health_timeout_s: float = 1.0,
        cache_s: float = 0.5,
        unanswered_grace_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address(url)
        self.repository = Path(repository)
        self.timeout_s = timeout_s
        self._health_timeout_s = health_timeout_s
        self._cache_s = cache_s
        self._unanswered_grace_s = unanswered_grace_s
        self._clock = clock
        self._checked_at = float("-inf")
        self._answered_ready_at = float("-inf")
        self._ready = False
        self._probing: asyncio.Lock | None = None
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._own_thread: threading.Thread | None = None
        self._guard = threading.Lock()

    @property
    def thread_name(self) -> str:
        """The name of this backend's own loop thread (one per backend, while it has one)."""
        return f"triton-backend-{id(self):x}"

    @property
    def configured(self) -> bool:
        return bool(self.address)

    @property
    def url(self) -> str:
        return f"http://{self.address}" if self.address else ""

    # ----- the backend interface (asked on the event loop) -----------------------------

    async def ready(self) -> bool:
        """Whether the sidecar is ready (cached briefly, one probe at a time: probes and requests ask often)."""
        if not self.configured:
            return False
        if self._fresh():
            return self._ready
        if self._probing is None:
            self._probing = asyncio.Lock()
        async with self._probing:
            if not self._fresh():  # else another caller probed while this one waited
                self._ready = await self._probe()
                self._checked_at = self._clock()
        return self._ready

    async def held_models(self) -> set[str] | None:
        """Names of the models the sidecar has READY (its repository index); None when it does not answer."""
        if not self.configured:
            return None
        try:
            index = await self._json("POST", "/v2/repository/index", "listing the models of", "", {"ready": True},
                                     timeout_s=self._health_timeout_s * 5)
            return {entry["name"] for entry in index if entry.get("state") == "READY"}
        except (errors.BackendUnavailable, TritonRefused, ValueError, TypeError, KeyError, AttributeError):
            return None  # no answer, or not an index: conclude nothing

    async def require(self, spec: ModelSpec) -> None:
        """503 naming the sidecar when a model of `spec`'s framework cannot run here now."""
        if not self.configured:
            raise errors.BackendUnavailable(
                f"model {spec.id!r} needs the Triton sidecar, and this worker has none (empty --triton-url)")
        if not await self.ready():
            raise errors.BackendUnavailable(f"model {spec.id!r} needs the Triton sidecar at {self.address}, which is not ready")

    async def forward_infer(self, model: str, body: bytes, headers: Mapping[str, str]) -> ForwardedResponse:
        """POST an OIP v2 infer body to ``/v2/models/<model>/infer`` as it came; Triton's answer as it came."""
        outgoing = {name: headers[name] for name in FORWARDED_REQUEST_HEADERS if name in headers}
        status, answer_headers, raw = await self._request(
            "POST", f"/v2/models/{quote(model, safe='')}/infer", "inferring with", model, body, outgoing, self.timeout_s)
        kept = {k: v for k, v in answer_headers.items() if k.lower() not in _HOP_BY_HOP_RESPONSE_HEADERS}
        return ForwardedResponse(status=status, headers=kept, body=raw)

    async def aclose(self) -> None:
        """Close the calling loop's session and the backend's own loop (worker shutdown)."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()
        await asyncio.to_thread(self.close)

    # ----- calls made from threads (framework workers load and infer on threads) --------

    def load(self, model: str) -> None:
        self._blocking(lambda: self._json("POST", f"/v2/repository/models/{quote(model, safe='')}/load", "loading", model, {}))

    def unload(self, model: str) -> None:
        self._blocking(lambda: self._json("POST", f"/v2/repository/models/{quote(model, safe='')}/unload", "unloading", model, {}))

    def metadata(self, model: str) -> dict[str, Any]:
        return self._blocking(lambda: self._json("GET", f"/v2/models/{quote(model, safe='')}", "reading metadata of", model))

    def statistics(self, model: str) -> dict[str, Any]:
        return self._blocking(lambda: self._json("GET", f"/v2/models/{quote(model, safe='')}/stats", "reading statistics of", model))

    def memory_bytes(self, model: str) -> int:
        """What Triton reports `model` occupies (0: it reports nothing, or does not answer)."""
        try:
            return memory_from_statistics(self.statistics(model))
        except (TritonRefused, errors.BackendUnavailable, ValueError, TypeError, AttributeError):
            return 0

    def model_ready(self, model: str) -> bool:
        try:
            status, _, _ = self._blocking(lambda: self._request(
                "GET", f"/v2/models/{quote(model, safe='')}/ready", "checking", model, None, {}, self._health_timeout_s * 5))
        except errors.BackendUnavailable:
            return False
        return status == 200

    def infer(self, model: str, inputs: list[Any], outputs: list[Any]) -> Any:
        """Tensor inference: tritonclient ``InferInput``/``InferRequestedOutput`` in, its ``InferResult`` out."""
        from tritonclient.http import InferenceServerClient, InferResult

        body, json_size = InferenceServerClient.generate_request_body(inputs, outputs=outputs)
        headers = {HEADER_LENGTH: str(json_size)} if json_size is not None else {}
        status, answer_headers, raw = self._blocking(lambda: self._request(
            "POST", f"/v2/models/{quote(model, safe='')}/infer", "inferring with", model, body, headers, self.timeout_s))
        if status != 200:
            raise TritonRefused(status, _error_text(raw))
        header_length = answer_headers.get(HEADER_LENGTH)
        return InferResult.from_response_body(
            raw, header_length=int(header_length) if header_length else None,
            content_encoding=answer_headers.get("Content-Encoding"))

    def close(self) -> None:
        """Stop the backend's own loop thread, closing its session (safe to call twice)."""
        with self._guard:
            loop, thread, self._own_loop, self._own_thread = self._own_loop, self._own_thread, None, None
        if loop is None or thread is None:
            return
        session = self._sessions.pop(loop, None)
        if session is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()

    # ----- transport ---------------------------------------------------------------------

    def _fresh(self) -> bool:
        return self._clock() - self._checked_at < self._cache_s

    async def _probe(self) -> bool:
        try:
            status, _, _ = await self._request("GET", "/v2/health/ready", "probing", "", None, {}, self._health_timeout_s)
        except errors.BackendUnavailable as exc:
            if isinstance(exc.__cause__, asyncio.TimeoutError):
                # Unanswered: busy, or hung. Keep saying ready only while it answered ready recently.
                return self._ready and self._clock() - self._answered_ready_at < self._unanswered_grace_s
            return False  # refused or reset: nothing is listening
        if status != 200:
            return False
        self._answered_ready_at = self._clock()
        return True

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            for stale in [known for known in self._sessions if known.is_closed()]:
                self._sessions.pop(stale, None)
            session = self._sessions[loop] = aiohttp.ClientSession(
                base_url=self.url,
                connector=aiohttp.TCPConnector(force_close=True),  # a connection per request: see the module doc
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=CONNECT_TIMEOUT_S),
                auto_decompress=False,  # a forwarded body goes back with Triton's Content-Encoding
                skip_auto_headers=("Accept-Encoding", "Content-Type", "User-Agent"),  # only the caller's own
            )
        return session

    async def _request(self, method: str, path: str, what: str, model: str, body: bytes | None,
                       headers: Mapping[str, str], timeout_s: float) -> tuple[int, dict[str, str], bytes]:
        """One request on a new connection; a sidecar that does not answer -> BackendUnavailable (503)."""
        if not self.configured:
            raise errors.BackendUnavailable("no Triton sidecar is configured for this worker (--triton-url)")
        try:
            async with self._session().request(
                method, path, data=body, headers=dict(headers), allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
            ) as response:
                raw = await response.read()
                return response.status, dict(response.headers), raw
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError, asyncio.TimeoutError) as exc:
            subject = f" {model!r}" if model else ""
            raise errors.BackendUnavailable(
                f"Triton sidecar at {self.address} is unavailable ({what}{subject}): {type(exc).__name__}: {exc}"
            ) from exc

    async def _json(self, method: str, path: str, what: str, model: str, payload: Any = None,
                    timeout_s: float | None = None) -> Any:
        """A JSON call; Triton's error answer -> TritonRefused with its message."""
        body = json.dumps(payload).encode() if payload is not None else None
        status, _, raw = await self._request(method, path, what, model, body, {}, timeout_s or self.timeout_s)
        if status != 200:
            raise TritonRefused(status, _error_text(raw))
        return json.loads(raw) if raw.strip() else {}

    def _blocking(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call()` on the backend's own loop and wait for it: for worker threads only.

        On a thread that runs an event loop it would stall that loop (or, on the backend's
        own loop, wait forever), so it refuses there."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("a blocking Triton sidecar call on an event loop; run it on a thread")
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(call(), self._loop())  # type: ignore[arg-type]
        return future.result()

    def _loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._own_loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.thread_name, daemon=True)
                thread.start()
                self._own_loop, self._own_thread = loop, thread
            return self._own_loop


def _error_text(raw: bytes) -> str:
    """Triton's ``{"error": "..."}`` text, else the body itself."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace").strip() or "no message"
    if isinstance(value, dict) and "error" in value:
        return str(value["error"])
    return raw.decode("utf-8", "replace").strip()
