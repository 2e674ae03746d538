"""Is the Triton sidecar up? Asked over its HTTP ``/v2/health/ready``.

Pod readiness and every triton model depend on the answer; in-process
frameworks never do. An empty URL means the pod has no sidecar: triton
models then fail with 503 and readiness does not wait for Triton.
"""
from __future__ import annotations

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
    def __init__(self, url: str, timeout_s: float = 1.0, cache_s: float = 0.5) -> None:
        self.url = base_url(url)
        self._cache_s = cache_s
        self._checked_at = float("-inf")
        self._ready = False
        self._client = httpx.AsyncClient(base_url=self.url, timeout=timeout_s) if self.url else None

    @property
    def configured(self) -> bool:
        return self._client is not None

    async def ready(self) -> bool:
        """Whether the sidecar answers ready (cached briefly: probes and requests may ask often)."""
        if self._client is None:
            return False
        if time.monotonic() - self._checked_at < self._cache_s:
            return self._ready
        try:
            response = await self._client.get("/v2/health/ready")
            self._ready = response.status_code == 200
        except httpx.HTTPError:
            self._ready = False
        self._checked_at = time.monotonic()
        return self._ready

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
