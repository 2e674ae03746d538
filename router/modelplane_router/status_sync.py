"""Keeps the model map fresh from the workers' own ``GET /status`` reports.

Each pod is asked every ``interval_s``; a pod that does not answer (or
answers nonsense) leaves the map at once and comes back with its next good
report. Pods that discovery no longer lists leave the map too. Each report's
catalog also describes its models (catalog.py, for ``GET /models``).

Every request is stamped with the map's clock before it is sent, so a report
that lands after something the router learned itself (a load that finished
meanwhile) does not erase it (model_map.py). After each pass, whoever waits
for the map to change (a request waiting for a pod to start) is woken.
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
        self._changed: asyncio.Future[None] | None = None

    async def changed(self) -> None:
        """Return after the next pass over every pod (the map may then hold pods it did not)."""
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._changed)

    def _pulse(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    async def refresh(self, url: str) -> bool:
        """Ask one pod for its report; True if it answered."""
        asked_at = self.model_map.now()
        try:
            status = await self.client.status(url)
        except (PodUnreachable, errors.UpstreamTimeout, WorkerError, pydantic.ValidationError) as exc:
            if self.model_map.pod(url) is not None:
                log.warning("pod %s leaves the map: %s", url, exc)
            self.model_map.remove_pod(url)
            return False
        self.model_map.apply_status(url, status, node=self.discovery.node_of(url), asked_at=asked_at,
                                    draining=self.discovery.draining(url))
        self.catalog.update(status.catalog)
        return True

    async def refresh_all(self) -> None:
        urls = self.discovery.urls()
        for gone in set(self.model_map.urls()) - set(urls):
            self.model_map.remove_pod(gone)
        await asyncio.gather(*(self.refresh(u) for u in urls))
        self._pulse()

    async def run(self) -> None:
        while True:
            await self.refresh_all()
            await asyncio.sleep(self.interval_s)
