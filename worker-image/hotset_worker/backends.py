"""Servers outside the worker process that run some frameworks' models (today: the Triton sidecar).

The API, the data plane and the manager ask ``Backends`` whether a model's
backend is there and ready, and which models each backend still holds; none
of them names a particular backend. A framework that hands its models to a
server of its own is then one framework class plus one ``Backend``, and pod
readiness, 503s for a down backend and the re-sync after a backend restart
come with it.

A backend that lost its models (a restarted sidecar comes back empty) is
found by comparing what it holds with the manager's table every
``interval_s``; copies it no longer holds are dropped, so the next request,
or the pinned loader, loads them again. A backend that does not answer
proves nothing (it may come back with its models); while it is down the pod
and its models are unready anyway.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterable, Mapping, Protocol

from hotset_common.spec import Framework, ModelSpec
from hotset_worker.manager import ModelManager

log = logging.getLogger(__name__)


class Backend(Protocol):
    """What the pod needs to know about one backend server."""

    name: str
    frameworks: frozenset[Framework]  # whose models run there

    @property
    def configured(self) -> bool:
        """Whether this pod has the server at all (a pod without a sidecar has not)."""

    async def ready(self) -> bool:
        """Whether it can serve now (cheap: asked by probes and requests)."""

    async def held_models(self) -> set[str] | None:
        """Names of the models it holds ready; None when it does not answer."""

    async def require(self, spec: ModelSpec) -> None:
        """Raise BackendUnavailable (503) naming the server when `spec` cannot run there now."""

    async def aclose(self) -> None: ...


class Backends:
    """Every backend this worker knows, configured or not, by the frameworks they serve."""

    def __init__(self, backends: Iterable[Backend] = ()) -> None:
        self._all = list(backends)
        self._by_framework = {framework: backend for backend in self._all for framework in backend.frameworks}

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._all)

    def by_name(self) -> dict[str, Backend]:
        """For ``WorkerContext.backends``: what framework workers look their backend up in."""
        return {backend.name: backend for backend in self._all}

    def get(self, name: str) -> Backend | None:
        return next((backend for backend in self._all if backend.name == name), None)

    def of(self, spec: ModelSpec) -> Backend | None:
        """The backend `spec`'s models run in; None for in-process frameworks."""
        return self._by_framework.get(spec.framework)

    async def readiness(self) -> dict[str, bool]:
        """Each backend's readiness (a backend this pod does not have is not ready)."""
        return {backend.name: await backend.ready() for backend in self._all}

    async def ready(self) -> bool:
        """Whether every backend this pod has is ready."""
        return all([await backend.ready() for backend in self._all if backend.configured])

    def down(self, readiness: Mapping[str, bool]) -> frozenset[Framework]:
        """The frameworks whose backend this pod has but is not ready now (`readiness`: from
        ``readiness()``): their copies cannot serve until it is back, the others' can."""
        return frozenset(framework for backend in self._all if backend.configured and not readiness.get(backend.name)
                         for framework in backend.frameworks)

    async def require(self, spec: ModelSpec) -> None:
        """The manager's preflight: 503 before loading a model whose backend is missing or down."""
        backend = self.of(spec)
        if backend is not None:
            await backend.require(spec)

    async def serves(self, spec: ModelSpec) -> bool:
        """Whether `spec`'s backend (if it has one) is ready now."""
        backend = self.of(spec)
        return backend is None or await backend.ready()

    async def forget_lost_models(self, manager: ModelManager) -> list[str]:
        """One comparison of each backend's models with the manager's table; the ids dropped."""
        dropped: list[str] = []
        for backend in self._all:
            if backend.configured:
                for framework in sorted(backend.frameworks, key=lambda f: f.value):
                    dropped += await manager.forget_lost_copies(framework, backend.held_models)
        return dropped

    async def keep_in_sync(self, manager: ModelManager, interval_s: float = 1.0) -> None:
        """Forever: compare and drop, every `interval_s`."""
        while True:
            try:
                await self.forget_lost_models(manager)
            except Exception:  # noqa: BLE001 - the loop must outlive one bad pass
                log.exception("comparing the backends' models with the table failed")
            await asyncio.sleep(interval_s)

    async def aclose(self) -> None:
        for backend in self._all:
            await backend.aclose()
