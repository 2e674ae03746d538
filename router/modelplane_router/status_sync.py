"""Keeps the model map fresh from the workers' own ``GET /status`` reports.

Each pod is asked every ``interval_s``; a pod that cannot be reached
(refused, reset, not HTTP) or answers nonsense leaves the map at once and
comes back with its next good report. A pod that is only slow to answer (a
status call that times out: its event loop may be busy with a large body)
stays until ``timeouts_to_leave`` calls in a row time out. Pods that
discovery no longer lists leave the map too. Each report's catalog also
describes its models (catalog.py, for ``GET /models``). One failed pass never
ends the loop.

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
                 catalog: ModelCatalog | None = None, timeouts_to_leave: int = 3) -> None:
        self.model_map = model_map
        self.catalog = catalog if catalog is not None else ModelCatalog()
        self.client = client
        self.discovery = discovery
        self.interval_s = interval_s
        self.timeouts_to_leave = timeouts_to_leave
        self._timeouts: dict[str, int] = {}  # url -> status calls in a row that timed out
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
        except errors.UpstreamTimeout as exc:
            missed = self._timeouts[url] = self._timeouts.get(url, 0) + 1
            if missed < self.timeouts_to_leave:
                log.info("pod %s was slow to report (%d in a row): %s", url, missed, exc)
                return False
            self._leave(url, exc)
            return False
        except (PodUnreachable, WorkerError, pydantic.ValidationError, ValueError) as exc:
            self._leave(url, exc)
            return False
        self._timeouts.pop(url, None)
        self.model_map.apply_status(url, status, node=self.discovery.node_of(url), asked_at=asked_at,
                                    draining=self.discovery.draining(url))
        self.catalog.update(status.catalog)
        return True

    def _leave(self, url: str, why: Exception) -> None:
        if self.model_map.pod(url) is not None:
            log.warning("pod %s leaves the map: %s", url, why)
        self.model_map.remove_pod(url)
        self._timeouts.pop(url, None)

    async def refresh_all(self) -> None:
        urls = self.discovery.urls()
        for gone in set(self.model_map.urls()) - set(urls):
            self.model_map.remove_pod(gone)
        results = await asyncio.gather(*(self.refresh(u) for u in urls), return_exceptions=True)
        for url, result in zip(urls, results):
            if isinstance(result, Exception):  # a report we could not handle: the pod is not usable
                self._leave(url, result)
        self._pulse()

    async def run(self) -> None:
        while True:
            try:
                await self.refresh_all()
            except Exception:  # noqa: BLE001 - the map must keep following the workers after one bad pass
                log.exception("status pass failed; trying again in %.1fs", self.interval_s)
            await asyncio.sleep(self.interval_s)
