"""The operator touches only what it owns, and its aggregate objects stay bounded
(the real API server and controller-manager, the real operator in a thread)."""
from __future__ import annotations

from hotset_common import labels, model_store
from hotset_common.spec import ModelSpec
from hotset_operator import validation
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, wait_for

FOREIGN = {"app": "someone-elses"}


def foreign_deployment(name: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": FOREIGN},
            "spec": {"replicas": 1, "selector": {"matchLabels": FOREIGN}, "template": {
                "metadata": {"labels": FOREIGN}, "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}}}}


def what_the_operator_could_change(deployment: dict | None) -> tuple | None:
    """A Deployment's spec generation, labels, annotations and owners (None: deleted). Not its
    resourceVersion: the controller-manager's status updates change that."""
    if deployment is None:
        return None
    meta = deployment["metadata"]
    return (meta.get("generation"), meta.get("labels"), meta.get("annotations"), meta.get("ownerReferences"))


def test_a_deployment_it_does_not_own_is_never_applied_nor_deleted(cluster: Cluster) -> None:
    config = operator_config(cluster.namespace)
    cluster.apply(foreign_deployment("mine-dedicated"))
    cluster.apply(foreign_deployment("other-dedicated"))
    before = {name: what_the_operator_could_change(cluster.get("deployment", name))
              for name in ("mine-dedicated", "other-dedicated")}
    with running_operator(config):
        cluster.apply(served_model("mine", placement="dedicated", replicas={"min": 1, "max": 1}, memory="1Gi"))
        cluster.apply(served_model("other", memory="1Gi"))  # shared: the old code deleted other-dedicated
        # Admission accepts the spec; the dedicated group's reconcile then finds the Deployment it does not
        # own (an API call, in the background) and the condition turns False: wait for where it settles.
        refused = wait_for(lambda: (c if (c := cluster.condition("mine", "Accepted")) and c["status"] == "False"
                                    else None), "Accepted False on mine")
        assert refused["reason"] == "InvalidSpec"
        assert "Deployment mine-dedicated exists and is not owned" in refused["message"]
        wait_for(lambda: (cluster.condition("other", "Accepted") or {}).get("status") == "True", "other accepted")
    after = {name: what_the_operator_could_change(cluster.get("deployment", name)) for name in before}
    assert after == before


def test_the_shared_pool_gets_a_disruption_budget(cluster: Cluster) -> None:
    config = operator_config(cluster.namespace)
    with running_operator(config):
        budget = wait_for(lambda: cluster.get("poddisruptionbudget", config.pool_name), "the pool's PDB")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"][labels.POOL] == labels.SHARED_POOL


def items(*models: dict) -> list[dict]:
    return [{**m, "metadata": {**m["metadata"], "creationTimestamp": f"2026-11-30T00:00:{i:02d}Z"}} for i, m in enumerate(models)]


def test_dedicated_groups_past_the_cap_are_refused_oldest_first() -> None:
    config = operator_config("ns", max_dedicated_pods=3)
    models = items(*(served_model(f"d{i}", placement="dedicated", replicas={"min": 2, "max": 2}, memory="1Gi") for i in range(3)))
    refused = validation.over_the_caps(models, config)
    assert sorted(refused) == ["d1", "d2"]
    assert "cap is 3" in refused["d1"].message


def test_the_catalog_has_no_size_bound_and_carries_no_registry_fields() -> None:
    """The catalog used to be one ConfigMap, so its size refused models; now each model is an entry
    of its own (docs/architecture.md, "The catalog")."""
    config = operator_config("ns")
    labelled = {f"k{i}": "v" * 200 for i in range(32)}
    models = items(*(served_model(f"m{i}", memory="1Gi", labels=labelled, description="d" * 1000) for i in range(20)))
    assert validation.over_the_caps(models, config) == {}
    entry = model_store.store_entry(ModelSpec.from_served_model(models[0]))
    assert "labels" not in entry and "owner" not in entry and entry["description"] == "d" * 1000
