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


def _worker_pod(cluster: Cluster, deployment: str) -> dict:
    return (cluster.get("deployment", deployment) or {}).get("spec", {}).get("template", {}).get("spec", {})


def _worker_image(cluster: Cluster, deployment: str) -> str:
    return next((c["image"] for c in _worker_pod(cluster, deployment).get("containers", [])
                 if c["name"] == "hotset-worker"), "")


def test_an_upgrade_that_changes_what_the_workers_run_rolls_the_dedicated_groups_too(cluster: Cluster) -> None:
    """A helm upgrade to a new worker image restarts the operator with new settings: the shared pool
    and every dedicated group get the new image (a group last rolled for its model's spec is not
    left on the old one), and a restart with the same settings after it changes nothing."""
    old = operator_config(cluster.namespace, worker_image="registry.example/hotset/worker:1.0")
    with running_operator(old):
        cluster.apply(served_model("pinned", placement="dedicated", replicas={"min": 1, "max": 1}))
        cluster.apply(served_model("shared-a", memory="1Gi"))
        wait_for(lambda: _worker_image(cluster, "pinned-dedicated").endswith(":1.0"), "the group on the old image")
        wait_for(lambda: _worker_image(cluster, old.pool_name).endswith(":1.0"), "the pool on the old image")

    new = operator_config(cluster.namespace, worker_image="registry.example/hotset/worker:1.1",
                          catalog_port=old.catalog_port, catalog_url=old.catalog_url)
    with running_operator(new):
        wait_for(lambda: _worker_image(cluster, "pinned-dedicated").endswith(":1.1"), "the group on the new image")
        wait_for(lambda: _worker_image(cluster, new.pool_name).endswith(":1.1"), "the pool on the new image")
        wait_for(lambda: cluster.condition("pinned", "Ready"), "pinned's status")
    upgraded = cluster.get("deployment", "pinned-dedicated")["metadata"]["generation"]

    metrics = OperatorMetrics()
    with running_operator(new, metrics):
        wait_for(lambda: _settled(metrics), "the restarted operator settled")
        assert cluster.get("deployment", "pinned-dedicated")["metadata"]["generation"] == upgraded


def test_an_edit_of_a_dedicated_models_scheduling_moves_its_group(cluster: Cluster) -> None:
    """Scheduling never reaches the catalog, but it is where the group's pods may run: a toleration
    added for a tainted GPU node reaches the group's pod template."""
    taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    with running_operator(operator_config(cluster.namespace)):
        cluster.apply(served_model("pinned", placement="dedicated", replicas={"min": 1, "max": 1}))
        wait_for(lambda: _worker_pod(cluster, "pinned-dedicated"), "the group's Deployment")
        assert "nodeSelector" not in _worker_pod(cluster, "pinned-dedicated")
        cluster.apply(served_model("pinned", placement="dedicated", replicas={"min": 1, "max": 1},
                                   scheduling={"tolerations": [taint], "nodeSelector": {"gpu": "a100"}}))
        wait_for(lambda: _worker_pod(cluster, "pinned-dedicated").get("nodeSelector") == {"gpu": "a100"}
                 and taint in _worker_pod(cluster, "pinned-dedicated").get("tolerations", []),
                 "the group's pods placed as the model now asks")
