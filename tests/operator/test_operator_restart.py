"""Restarting the operator rewrites nothing and duplicates nothing (level-based, idempotent)."""
from __future__ import annotations

import logging

import pytest

from modelplane_testing.operator_harness import Cluster, operator_config, running_operator, served_model, wait_for


def _snapshot(cluster: Cluster) -> dict[str, str]:
    """kind/name -> resourceVersion of everything the operator writes."""
    versions = {}
    for kind in ("deployments", "replicasets", "configmaps", "servedmodels", "workerpools"):
        for item in cluster.items(kind):
            versions[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return versions


def _count(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


def test_restart_changes_nothing(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kopf")
    config = operator_config(cluster.namespace)
    with running_operator(config):
        cluster.apply(served_model("pinned", placement="dedicated", replicas={"min": 1, "max": 1}))
        cluster.apply(served_model("shared-a", memory="1Gi", replicas={"min": 2, "max": 2}))
        for name in ("pinned", "shared-a"):
            wait_for(lambda: cluster.condition(name, "Ready"), f"{name} status")
        wait_for(lambda: ((cluster.get("workerpool", config.pool_name) or {}).get("status") or {}).get("desiredReplicas") == 2,
                 "the pool sized for shared-a's two copies")
        wait_for(lambda: _count(caplog, "Timer") >= 2, "a status refresh of each model")
        before = _snapshot(cluster)

    caplog.clear()
    with running_operator(config):
        wait_for(lambda: _count(caplog, "Resuming is processed") >= 2, "the restarted operator resuming both models")
        wait_for(lambda: _count(caplog, "Timer") >= 2, "a status refresh by the restarted operator")
        after = _snapshot(cluster)

    assert after == before
    assert sorted(k for k in after if k.startswith("deployments/")) == [
        "deployments/modelplane-pool", "deployments/pinned-dedicated"]
