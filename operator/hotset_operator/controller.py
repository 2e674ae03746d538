"""The operator's running parts, made at startup from kopf's indexes and stopped at cleanup.

- ``ModelReconciler`` (``reconciler.py``): admission, catalogs, model status and
  dedicated groups, in passes driven by ServedModel and ModelQuota events;
- ``Pools`` (``pools.py``): pool and dedicated-group sizing from the workers'
  reports, every ``pool_sync_interval_s``, once every model has been judged;
- ``Writes`` (``writes.py``): the status patches and events they queue;
- the catalog feed (``feed.py``) worker pods follow.

Each is an asyncio task on kopf's event loop. kopf calls no handler before
every index is filled, so the first event any handler forwards here means the
indexes are complete; nothing is judged before that.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Mapping

from hotset_common import worker_identity
from hotset_common.worker_identity import ReviewedTokens, TokenReviews, WorkerIdentity
from hotset_operator import feed, kube
from hotset_operator.approvals import Approvals
from hotset_operator.catalog import Catalogs
from hotset_operator.config import OperatorConfig
from hotset_operator.dedicated import DedicatedGroups
from hotset_operator.fleet import Fleet
from hotset_operator.metrics import OperatorMetrics
from hotset_operator.pools import Pools
from hotset_operator.quota_status import QuotaStatus
from hotset_operator.reconciler import ModelReconciler
from hotset_operator.served import ServedModels
from hotset_operator.worker_proofs import CatalogReaders, ProvenPods
from hotset_operator.writes import Writes

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, config: OperatorConfig, kube_api: kube.Kube, metrics: OperatorMetrics,
                 indexes: Mapping[str, Mapping[Any, Any]]) -> None:
        self.config = config
        self.metrics = metrics
        self.catalogs = Catalogs()
        self.writes = Writes(kube_api, metrics, config.write_concurrency)
        self.fleet = Fleet()
        self.kube = kube_api
        self.served = ServedModels(config)
        self.dedicated = DedicatedGroups(config, kube_api, self.writes, indexes["managed_deployments"],
                                         on_blocked=lambda key: self.models.blocked_changed(key))
        self.models = ModelReconciler(config, metrics, self.catalogs, self.writes, self.fleet, self.served,
                                      indexes["model_quotas"], self.dedicated, QuotaStatus(self.writes, metrics),
                                      Approvals(kube_api, self.writes, lambda key: self.models.blocked_changed(key)))
        proven, readers = None, None
        if config.worker_identity is WorkerIdentity.POD_TOKEN:  # docs/security.md, "Workers that prove who they are"
            account = config.worker_service_account
            proven = ProvenPods(ReviewedTokens(TokenReviews(kube_api.api_client, worker_identity.IDENTITY_AUDIENCE)),
                                account, config.worker_port, config.report_timeout_s)
            readers = CatalogReaders(ReviewedTokens(TokenReviews(kube_api.api_client, worker_identity.CATALOG_AUDIENCE)),
                                     account, lambda: self.pools.trusted_pods(), time.monotonic)
        self.pools = Pools(config, kube_api, metrics, self.writes, self.models, self.fleet, indexes, proven=proven)
        self.feed = feed.FeedServer(feed.build_app(self.catalogs, lambda: self.models.ready, readers),
                                    config.catalog_host, config.catalog_port)
        self.writes.on_failed = self._not_written
        self._tasks: list[asyncio.Task[None]] = []

    def _not_written(self, target: tuple[str, str, str, str]) -> None:
        group, plural, namespace, name = target
        if plural == "servedmodels":
            self.models.status_not_written((namespace, name))

    async def start(self) -> None:
        await self.feed.start()
        self._tasks = [asyncio.create_task(self.writes.run(), name="hotset-writes"),
                       asyncio.create_task(self.models.run(self._list_served), name="hotset-models"),
                       asyncio.create_task(self._pools_when_ready(), name="hotset-pools"),
                       asyncio.create_task(self.dedicated.recheck_blocked(self.models.model), name="hotset-recheck")]

    async def _list_served(self) -> None:
        """What ServedModels exist now (names only): the first pass waits until kopf handed each over."""
        namespaces = self.config.served_namespaces() or None
        while True:
            try:
                self.served.expect(await asyncio.to_thread(self.kube.served_model_keys, namespaces))
                return
            except Exception as exc:  # noqa: BLE001 - the API server not answering yet: ask again
                log.warning("listing ServedModels failed (%s); trying again", exc)
                await asyncio.sleep(1.0)

    async def _pools_when_ready(self) -> None:
        """Pools are sized only from a complete picture: once every model has been judged."""
        while not self.models.ready:
            await asyncio.sleep(0.1)
        await self.pools.run()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.pools.close()
        await self.feed.stop()
