"""No ServedModel's name reaches another pool, against the real API server and the real operator.

A ServedModel named `shared` with `placement: dedicated` used to replace the
shared pool's catalog (its model-store key was the pool's) and its
Deployment selected the pool's pods. Now reserved names are refused by the
CRD's CEL rule and by the operator (for objects the rule never saw: Helm
does not upgrade a chart's CRDs), and pools are keyed by placement, so two
pools cannot share a catalog or select each other's pods.
"""
from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest

from hotset_common import labels
from hotset_common.spec import RESERVED_NAMES
from hotset_testing.operator_harness import (CRD, Cluster, catalog_models, operator_config, running_operator,
                                              served_model, wait_for)


def dedicated(name: str, **spec) -> dict:
    return served_model(name, placement="dedicated", replicas={"min": 1, "max": 1}, memory="1Gi", **spec)


@pytest.mark.parametrize("name", sorted(RESERVED_NAMES))
def test_the_api_server_refuses_a_reserved_name(cluster: Cluster, name: str) -> None:
    result = cluster.apply(dedicated(name), check=False)
    assert result.returncode != 0
    assert f"metadata.name: {name} is reserved" in result.stderr, result.stderr
    assert cluster.get("servedmodel", name) is None
    # Names that merely contain a reserved word are fine.
    assert cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(dedicated(f"{name}-model"))).returncode == 0


@pytest.fixture
def crd_without_the_name_rule(cluster: Cluster) -> Iterator[Cluster]:
    """The CRD as an older chart installed it (no CEL rule on names), restored afterwards."""
    cluster.kube.kubectl("patch", "crd", "servedmodels.hotset.io", "--type=json", "-p", json.dumps(
        [{"op": "remove", "path": "/spec/versions/0/schema/openAPIV3Schema/x-kubernetes-validations"}]))
    try:
        yield cluster
    finally:
        cluster.kube.kubectl("apply", "-f", str(CRD))


def test_the_operator_refuses_a_reserved_name_and_the_pool_keeps_its_catalog(crd_without_the_name_rule: Cluster) -> None:
    cluster = crd_without_the_name_rule
    config = operator_config(cluster.namespace)
    with running_operator(config):
        cluster.apply(served_model("small", memory="1Gi", replicas={"min": 1, "max": 1}))
        cluster.apply(dedicated("shared"))
        refused = wait_for(lambda: cluster.condition("shared", "Accepted"), "Accepted on shared")
        assert (refused["status"], refused["reason"]) == ("False", "InvalidSpec")
        assert "metadata.name: 'shared' is reserved" in refused["message"]
        wait_for(lambda: (cluster.condition("small", "Accepted") or {}).get("status") == "True", "small accepted")

        # the pool's catalog is intact, and the refused model has none of its own
        wait_for(lambda: catalog_models(config, cluster.namespace) == ["small"], "small in the pool's catalog")
        assert catalog_models(config, cluster.namespace, "shared") == []
        assert cluster.get("deployment", "shared-dedicated") is None
        pool = wait_for(lambda: cluster.get("deployment", config.pool_name), "the pool's Deployment (the pool loop's)")
        assert pool["spec"]["selector"]["matchLabels"][labels.POOL] == labels.SHARED_POOL
        for name in ("shared", "small"):  # gone while the operator runs, so its finalizer goes too
            cluster.kubectl("delete", "servedmodel", name, "--wait=true", "--timeout=60s")


def test_the_operator_refuses_a_dedicated_group_named_like_the_pool(cluster: Cluster) -> None:
    config = operator_config(cluster.namespace, pool_name="team-dedicated")
    with running_operator(config):
        cluster.apply(dedicated("team"))
        refused = wait_for(lambda: cluster.condition("team", "Accepted"), "Accepted on team")
        assert refused["status"] == "False" and "'team-dedicated', the shared pool's own name" in refused["message"]
        pool = wait_for(lambda: cluster.get("deployment", "team-dedicated"), "the pool's Deployment")
        assert pool["spec"]["selector"]["matchLabels"][labels.POOL] == labels.SHARED_POOL  # still the pool
        cluster.kubectl("delete", "servedmodel", "team", "--wait=true", "--timeout=60s")


def _owned_by(pod: dict, replica_sets: dict[str, str]) -> str:
    (owner,) = pod["metadata"]["ownerReferences"]
    return replica_sets[owner["name"]]


def test_each_pool_selects_only_its_own_pods_and_reads_only_its_own_store(cluster: Cluster, operator) -> None:
    config, _ = operator
    cluster.apply(served_model("small", memory="1Gi", replicas={"min": 1, "max": 1}))
    cluster.apply(dedicated("alpha"))
    cluster.apply(dedicated("beta"))
    deployments = {config.pool_name: None, "alpha-dedicated": "alpha", "beta-dedicated": "beta"}

    def every_pool_has_its_pod() -> list[dict] | None:
        pods = cluster.items("pods", labels.WORKER_SELECTOR)
        return pods if len(pods) == 3 else None

    pods = wait_for(every_pool_has_its_pod, "one pod per pool (made by the real controller-manager)", timeout=60)
    replica_sets = {rs["metadata"]["name"]: rs["metadata"]["ownerReferences"][0]["name"] for rs in cluster.items("replicasets")}
    for name, dedicated_to in deployments.items():
        deployment = cluster.get("deployment", name)
        selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        selected = cluster.items("pods", selector)
        assert [_owned_by(p, replica_sets) for p in selected] == [name], (name, selector)  # its own pod, no other
        worker = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "hotset-worker")
        url = next(e["value"] for e in worker["env"] if e["name"] == "HOTSET_CATALOG_URL")
        catalog = wait_for(lambda: (a := httpx.get(url, timeout=10)).status_code == 200 and a.json()["models"] and a.json(),
                           f"the catalog {name}'s pods follow")
        assert [m["id"] for m in catalog["models"]] == [dedicated_to or "small"]
    assert {labels.pool_of(p["metadata"]["labels"]) for p in pods} == {
        labels.SHARED_POOL, labels.dedicated_pool("alpha"), labels.dedicated_pool("beta")}


def test_a_dedicated_group_made_by_an_older_operator_is_rekeyed(cluster: Cluster, operator) -> None:
    """Older operators labelled a dedicated group's pods hotset.io/pool=<model>; selectors are
    immutable, so the operator replaces such a Deployment instead of failing on it."""
    old_labels = {labels.PART_OF: labels.PROJECT, labels.COMPONENT: labels.WORKER, labels.POOL: "gamma"}
    cluster.apply({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "gamma-dedicated", "labels": {**old_labels, labels.MANAGED_BY: "hotset-operator"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": old_labels}, "template": {
            "metadata": {"labels": old_labels},
            "spec": {"containers": [{"name": "hotset-worker", "image": "registry.example/old:1"}]}}},
    })
    cluster.apply(dedicated("gamma"))

    def rekeyed() -> dict | None:
        deployment = cluster.get("deployment", "gamma-dedicated") or {}
        selector = (deployment.get("spec") or {}).get("selector", {}).get("matchLabels", {})
        return deployment if selector.get(labels.SERVED_MODEL) == "gamma" else None

    deployment = wait_for(rekeyed, "gamma-dedicated with the new selector", timeout=60)
    assert deployment["spec"]["selector"]["matchLabels"][labels.POOL] == labels.DEDICATED_POOL
    accepted = wait_for(lambda: cluster.condition("gamma", "Accepted"), "Accepted on gamma")
    assert accepted["status"] == "True"
