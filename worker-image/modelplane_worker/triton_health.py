"""Is the Triton sidecar up? Asked over its HTTP ``/v2/health/ready``.

Pod readiness and every triton model depend on the answer; in-process
frameworks never do. An empty URL means the pod has no sidecar: triton
models then fail with 503 and readiness does not wait for Triton.

Two things keep the answer from flapping while Triton loads a model (found
by e2e: the pod probe went 503 for about a second on every explicit load):

- Every request opens a new connection. Triton's HTTP server answers nothing
  on a keep-alive connection opened before a load until that load is done
  (measured: 1.9 s stalls during a 1.9 s load of the iris sample, while new
  connections were answered within 0.1 s), so a reused connection made the
  1 s health check time out although Triton was ready. A loopback connect
  costs well under a millisecond.
- A probe that goes unanswered (a timeout) is not proof the sidecar is down:
  the server, or this worker's event loop, may just be busy. The last answer
  stands until nothing has answered ready for `unanswered_grace_s`. A refused
  or reset connection, or a non-200 answer, is proof: it counts at once, so a
  sidecar that died is reported within one probe.
"""
from __future__ import annotations

import asyncio
import time

import httpx

from modelplane_common import errors
from modelplane_common.spec import Framework, ModelSpec


def base_url(url: str) -> str:
    """``127.0.0.1:8000`` or ``http://127.0.0.1:8000`` as an httpx base URL ('' stays '')."""
    url = url.strip().rstrip("/")
    return url if not url or "://" in url else f"http://{url}"


def host_port(url: str) -> str:
    """The ``host:port`` form tritonclient wants."""
    return url.split("://", 1)[-1].rstrip("/")


class TritonHealth:
    def __init__(self, url: str, timeout_s: float = 1.0, cache_s: float = 0.5, unanswered_grace_s: float = 2.0) -> None:
        self.url = base_url(url)
        self._cache_s = cache_s
        self._unanswered_grace_s = unanswered_grace_s
        self._checked_at = float("-inf")
        self._answered_ready_at = float("-inf")
        self._ready = False
        self._probing = asyncio.Lock()
        # No keep-alive: a connection kept across a Triton load stalls until the load ends (see above).
        no_keepalive = httpx.Limits(max_keepalive_connections=0)
        self._client = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, limits=no_keepalive) if self.url else None

    @property
    def configured(self) -> bool:
        return self._client is not None

    async def ready(self) -> bool:
        """Whether the sidecar is ready (cached briefly, one probe at a time: probes and requests may ask often)."""
        if self._client is None:
            return False
        if self._fresh():
            return self._ready
        async with self._probing:
            if not self._fresh():  # else another caller probed while this one waited
                self._ready = await self._probe()
                self._checked_at = time.monotonic()
        return self._ready

    def _fresh(self) -> bool:
        return time.monotonic() - self._checked_at < self._cache_s

    async def _probe(self) -> bool:
        assert self._client is not None
        try:
            response = await self._client.get("/v2/health/ready")
        except httpx.TimeoutException:
            # Unanswered: busy, or hung. Keep saying ready only while it answered ready recently.
            return self._ready and time.monotonic() - self._answered_ready_at < self._unanswered_grace_s
        except httpx.HTTPError:
            return False  # refused or reset: nothing is listening
        if response.status_code != 200:
            return False
        self._answered_ready_at = time.monotonic()
        return True

    async def held_models(self) -> set[str] | None:
        """Names of the models the sidecar has READY (its repository index); None when it does not answer."""
        if self._client is None:
            return None
        try:
            response = await self._client.post("/v2/repository/index", json={"ready": True})
            if response.status_code != 200:
                return None
            return {entry["name"] for entry in response.json() if entry.get("state") == "READY"}
        except (httpx.HTTPError, ValueError, TypeError, KeyError, AttributeError):
            return None  # no answer, or not an index: conclude nothing

    async def require(self, spec: ModelSpec) -> None:
        """Raise 503 for a triton model when the sidecar is missing or down; others pass."""
        if spec.framework is not Framework.TRITON:
            return
        if not self.configured:
            raise errors.BackendUnavailable(f"model {spec.id!r} needs the Triton sidecar, and this worker has none (empty --triton-url)")
        if not await self.ready():
            raise errors.BackendUnavailable(f"model {spec.id!r} needs the Triton sidecar at {self.url}, which is not ready")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
