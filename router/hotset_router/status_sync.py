"""Keeps the model map fresh from the workers' own ``GET /status`` reports, in proportion to what changed.

Each pod is asked every ``interval_s`` for what changed since its last
report (``?since=<cursor>``, status_report.py on the worker): an idle pod
answers with its few own figures, however many models it can load or holds.
On first contact, after the pod left the map, or when the worker cannot
answer the cursor (it restarted), the answer is the whole state, in pages
of ``page`` entries fetched one after another, so that no single answer
(its parsing and its application to the map) holds the event loop long.
Each request names this router (``wire.ROUTER_ID_HEADER``): the workers list
the replicas they hear from, and every replica learns the others (replicas.py).

A pod that cannot be reached (refused, reset, not HTTP) or answers nonsense
leaves the map at once and comes back with its next good report. A pod that
is only slow to answer (a status call that times out: its event loop may be
busy with a large body) stays until ``timeouts_to_leave`` calls in a row
time out. Pods that discovery no longer lists leave the map too. Each
report's catalog also describes its models (catalog.py, for ``GET /models``).
One failed pass never ends the loop.

In cluster mode with worker identity on (``proofs``), a pod is asked nothing
and gets nothing until it proved which pod it is: before its status, the pod's
identity token (``GET /identity``, asked with no credential) is reviewed and
checked against the pod discovered at that address
(hotset_common.worker_identity.PodProofs). A pod that cannot prove it is not
asked for its status (which carries the router's token), stays out of the map,
so no request reaches it, and is counted in ``unproven`` (the unowned-pods
gauge); it is asked again on the next pass.

Every request is stamped with the map's clock before it is sent, so a report
that lands after something the router learned itself (a load that finished
meanwhile) does not erase it (model_map.py). One pod's refreshes never
overlap (a second waits for the first). After each pass, whoever waits for
the map to change (a request waiting for a pod to start) is woken.
"""
from __future__ import annotations

import asyncio
import logging

import pydantic

from hotset_common import errors, wire
from hotset_common.worker_identity import PodProofs
from hotset_router.catalog import ModelCatalog
from hotset_router.discovery import Discovery, identity_of
from hotset_router.model_map import ModelMap
from hotset_router.upstream import PodUnreachable, WorkerClient, WorkerError

log = logging.getLogger(__name__)

DEFAULT_PAGE = 200  # entries per status answer: parsing (~2 ms) and applying one stays a few milliseconds
MAX_PAGES = 2500  # pages in one refresh (500,000 entries); the rest waits for the next pass


class StatusSync:
    def __init__(self, model_map: ModelMap, client: WorkerClient, discovery: Discovery, interval_s: float = 1.0,
                 catalog: ModelCatalog | None = None, timeouts_to_leave: int = 3, page: int = DEFAULT_PAGE,
                 proofs: PodProofs | None = None) -> None:
        self.model_map = model_map
        self.catalog = catalog if catalog is not None else ModelCatalog()
        self.client = client
        self.discovery = discovery
        self.interval_s = interval_s
        self.timeouts_to_leave = timeouts_to_leave
        self.page = page
        self.proofs = proofs  # None: pods are not asked to prove who they are (standalone, tests)
        self.unproven: dict[str, str] = {}  # url -> why it did not prove which pod it is (logged once)
        self._timeouts: dict[str, int] = {}  # url -> status calls in a row that timed out
        self._cursors: dict[str, str] = {}  # url -> the cursor of its last report applied
        self._locks: dict[str, asyncio.Lock] = {}  # url -> held while one of its refreshes runs
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
        """Ask one pod for what changed (after any refresh of it in progress); True if it answered."""
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:
            return await self._refresh(url)

    async def _refresh(self, url: str) -> bool:
        if self.proofs is not None and not await self._proven(url):
            return False
        for _ in range(MAX_PAGES):
            if self.model_map.pod(url) is None:
                self._cursors.pop(url, None)  # the map forgot it: start again from the whole state
            asked_at = self.model_map.now()
            try:
                status = await self.client.status(url, self._cursors.get(url, wire.FROM_SCRATCH), self.page)
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
            if not status.delta and status.more:
                log.info("reading the whole state of %s, %d entries at a time", url, self.page)
            self.model_map.apply_status(url, status, node=self.discovery.node_of(url), asked_at=asked_at,
                                        draining=self.discovery.draining(url))
            self.catalog.update(status.catalog)
            if status.cursor:
                self._cursors[url] = status.cursor
            else:  # a worker that does not page: every report is whole
                self._cursors.pop(url, None)
            if not (status.more and status.cursor):
                break
        return True

    async def _proven(self, url: str) -> bool:
        why = await self.proofs.prove(url, identity_of(self.discovery, url),  # type: ignore[union-attr]
                                      lambda: self.client.identity(url))
        if not why:
            self.unproven.pop(url, None)
            return True
        if self.unproven.get(url) != why:
            log.warning("pod %s is sent nothing: it did not prove which pod it is: %s", url, why)
        self.unproven[url] = why
        self.model_map.remove_pod(url)
        self._timeouts.pop(url, None)
        self._cursors.pop(url, None)
        return False

    def _leave(self, url: str, why: Exception) -> None:
        if self.model_map.pod(url) is not None:
            log.warning("pod %s leaves the map: %s", url, why)
        self.model_map.remove_pod(url)
        self._timeouts.pop(url, None)
        self._cursors.pop(url, None)

    def _forget(self, url: str) -> None:
        self.model_map.remove_pod(url)
        self._cursors.pop(url, None)
        self._locks.pop(url, None)

    async def refresh_all(self) -> None:
        urls = self.discovery.urls()
        for gone in (set(self.model_map.urls()) | set(self._locks) | set(self.unproven)) - set(urls):
            self._forget(gone)
            self.unproven.pop(gone, None)
        if self.proofs is not None:
            self.proofs.keep_only(urls)
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
