"""Keeps the model map fresh from the workers' own ``GET /status`` reports.

Each pod is asked every ``interval_s``; a pod that does not answer (or
answers nonsense) leaves the map at once and comes back with its next good
report. Pods that discovery no longer lists leave the map too. Each report's
catalog also describes its models (catalog.py, for ``GET /models``).
"""
from __future__ import annotations

import asyncio
import logging

import pydantic

from modelplane_common import errors
from modelplane_router.catalog import ModelCatalog
from modelplane_router.discovery import Discovery
from modelplane_router.model_map import ModelMap
from modelplane_router.upstream import PodUnreachable, WorkerClient, WorkerError

log = logging.getLogger(__name__)


class StatusSync:
    def __init__(self, model_map: ModelMap, client: WorkerClient, discovery: Discovery, interval_s: float = 1.0,
                 catalog: ModelCatalog | None = None) -> None:
        self.model_map = model_map
        self.catalog = catalog if catalog is not None else ModelCatalog()
        self.client = client
        self.discovery = discovery
        self.interval_s = interval_s

    async def refresh(self, url: str) -> bool:
        """Ask one pod for its report; True if it answered."""
        try:
            status = await self.client.status(url)
        except (PodUnreachable, errors.UpstreamTimeout, WorkerError, pydantic.ValidationError) as exc:
            if self.model_map.pod(url) is not None:
                log.warning("pod %s leaves the map: %s", url, exc)
            self.model_map.remove_pod(url)
            return False
        self.model_map.apply_status(url, status, node=self.discovery.node_of(url))
        self.catalog.update(status.catalog)
        return True

    async def refresh_all(self) -> None:
        urls = self.discovery.urls()
        for gone in set(self.model_map.urls()) - set(urls):
            self.model_map.remove_pod(gone)
        await asyncio.gather(*(self.refresh(u) for u in urls))

    async def run(self) -> None:
        while True:
            await self.refresh_all()
            await asyncio.sleep(self.interval_s)
