"""What kopf keeps in memory for the operator: one small entry per watched object (``index.py``).

ModelQuotas, WorkerPools, hotset's worker pods, their ReplicaSets (who owns
a labelled pod: hotset_common.worker_ownership) and the Deployments this
operator made: few objects each. kopf watches pods and Deployments in the
served namespaces and keeps only those (it filters by label itself: its
watches take no label selector). ServedModels, which may be tens of
thousands, are not a kopf index (``served.py`` says why).

Index functions are ``async``: kopf runs synchronous ones on a thread pool,
which ten thousand objects at a restart would flood.
"""
from __future__ import annotations

from typing import Any

import kopf

from hotset_common import labels
from hotset_common import worker_ownership as ownership
from hotset_operator import index, kinds, workloads

WORKER_LABELS = {labels.PART_OF: labels.PROJECT, labels.COMPONENT: labels.WORKER}
MANAGED_LABELS = {labels.MANAGED_BY: workloads.MANAGER}


def register(registry: kopf.OperatorRegistry) -> None:

    @kopf.index(**kinds.MODEL_QUOTAS, id="model_quotas", registry=registry)
    async def model_quotas(body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {body["metadata"]["namespace"]: index.quota_entry(body)}

    @kopf.index(**kinds.WORKER_POOLS, id="worker_pools", registry=registry)
    async def worker_pools(body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {(body["metadata"]["namespace"], body["metadata"]["name"]): index.pool_entry(body)}

    @kopf.index(**kinds.PODS, labels=WORKER_LABELS, id="worker_pods", registry=registry)
    async def worker_pods(body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {body["metadata"]["namespace"]: index.pod_entry(body)}

    @kopf.index(**kinds.REPLICA_SETS, labels=WORKER_LABELS, id="worker_replica_sets", registry=registry)
    async def worker_replica_sets(body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {(body["metadata"]["namespace"], body["metadata"]["name"]): ownership.replica_set_entry(body)}

    @kopf.index(**kinds.DEPLOYMENTS, labels=MANAGED_LABELS, id="managed_deployments", registry=registry)
    async def managed_deployments(body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {(body["metadata"]["namespace"], body["metadata"]["name"]): index.deployment_entry(body)}
