"""Restarting the operator rewrites nothing and duplicates nothing (level-based, idempotent)."""
from __future__ import annotations

from hotset_common import metrics as names
from hotset_operator.metrics import OperatorMetrics
from hotset_testing.operator_harness import (Cluster, catalog_models, operator_config, running_operator, served_model,
                                              wait_for)


def _snapshot(cluster: Cluster) -> dict[str, str]:
    """kind/name -> resourceVersion of everything the operator writes."""
    versions = {}
    for kind in ("deployments", "replicasets", "configmaps", "servedmodels", "workerpools"):
        for item in cluster.items(kind):
            versions[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return versions


def _settled(metrics: OperatorMetrics) -> bool:
    """Nothing left to write, and pool passes that would have changed what they own."""
    sample = metrics.registry.get_sample_value
    return sample(names.OPERATOR_WRITES_PENDING) == 0 and (sample(names.OPERATOR_POOL_PASSES_TOTAL) or 0) >= 3


def test_restart_changes_nothing(cluster: Cluster) -> None:
    config = operator_config(cluster.namespace)
    metrics = OperatorMetrics()
    with running_operator(config, metrics):
        cluster.apply(served_model("pinned", placement="dedicated", replicas={"min": 1, "max": 1}))
        cluster.apply(served_model("shared-a", memory="1Gi", replicas={"min": 2, "max": 2}))
        for name in ("pinned", "shared-a"):
            wait_for(lambda: cluster.condition(name, "Ready"), f"{name} status")
        wait_for(lambda: ((cluster.get("workerpool", config.pool_name) or {}).get("status") or {}).get("desiredReplicas") == 2,
                 "the pool sized for shared-a's two copies")
        wait_for(lambda: _settled(metrics), "the operator settled")
        before = _snapshot(cluster)

    restarted = OperatorMetrics()
    with running_operator(config, restarted):
        wait_for(lambda: catalog_models(config, cluster.namespace) == ["shared-a"], "the restarted operator's catalog")
        wait_for(lambda: _settled(restarted), "the restarted operator settled")
        after = _snapshot(cluster)
        written = restarted.registry.get_sample_value(names.OPERATOR_STATUS_WRITES_TOTAL, {"resource": "servedmodels"})

    assert after == before and not written
    assert sorted(k for k in after if k.startswith("deployments/")) == [
        "deployments/hotset-pool", "deployments/pinned-dedicated"]
