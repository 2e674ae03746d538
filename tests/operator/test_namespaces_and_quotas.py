"""Several namespaces, their pools and their quotas, against the real API server and operator."""
from __future__ import annotations

import base64
import uuid
from typing import Iterator

import pytest

from hotset_testing.operator_harness import (Cluster, catalog_models, operator_config, running_operator, served_model,
                                              wait_for)

pytestmark = [pytest.mark.kube]


@pytest.fixture
def teams(cluster: Cluster) -> Iterator[tuple[Cluster, Cluster]]:
    """Two more namespaces beside the operator's own (deleted afterwards)."""
    names = [f"team-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for name in names:
        cluster.kube.kubectl("create", "namespace", name)
    try:
        yield Cluster(cluster.kube, names[0]), Cluster(cluster.kube, names[1])
    finally:
        for name in names:
            cluster.kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def accepted(cluster: Cluster, name: str) -> dict:
    return wait_for(lambda: cluster.condition(name, "Accepted"), f"Accepted on {name} in {cluster.namespace}")


def test_a_model_over_its_namespace_quota_is_refused_with_the_reason_until_the_quota_grows(cluster: Cluster) -> None:
    config = operator_config(cluster.namespace)
    with running_operator(config):
        cluster.apply({"apiVersion": "hotset.io/v1alpha1", "kind": "ModelQuota", "metadata": {"name": "team"},
                       "spec": {"memory": "2Gi", "copies": 4}})
        cluster.apply(served_model("first", memory="1Gi", replicas={"min": 0, "max": 1}))
        assert accepted(cluster, "first")["status"] == "True"
        cluster.apply(served_model("second", memory="1Gi", replicas={"min": 0, "max": 2}))  # 2 GiB more
        refused = accepted(cluster, "second")
        assert (refused["status"], refused["reason"]) == ("False", "QuotaExceeded")
        assert "ModelQuota team allows 2.0Gi of models" in refused["message"] and "1.0Gi are taken" in refused["message"]
        assert "QuotaExceeded" in {e["reason"] for e in cluster.events("second")}
        quota = wait_for(lambda: ((q := cluster.get("modelquota", "team")) or {}).get("status", {}).get("refused") and q,
                         "the quota's status")
        assert quota["status"] == {"used": {"memory": "1.0Gi", "copies": 1, "gpus": 0.25}, "refused": ["second"]}
        wait_for(lambda: catalog_models(config, cluster.namespace) == ["first"],
                 "only the accepted model in the pool's catalog")

        cluster.kubectl("patch", "modelquota", "team", "--type=merge", "-p", '{"spec": {"memory": "4Gi"}}')
        wait_for(lambda: (cluster.condition("second", "Accepted") or {}).get("status") == "True",
                 "second accepted once the quota grew")
        wait_for(lambda: catalog_models(config, cluster.namespace) == ["first", "second"], "second in the catalog")


def test_one_shared_pool_serves_every_watched_namespace_and_names_stay_unique(cluster: Cluster, teams) -> None:
    team_a, team_b = teams
    config = operator_config(cluster.namespace, watch_namespaces=(team_a.namespace, team_b.namespace))
    with running_operator(config):
        team_a.apply(served_model("sentiment", memory="1Gi", replicas={"min": 1, "max": 1}))
        team_b.apply(served_model("vision", memory="1Gi", replicas={"min": 1, "max": 1}))
        wait_for(lambda: catalog_models(config, cluster.namespace) == ["sentiment", "vision"],
                 "both teams' models in the shared pool's catalog")
        wait_for(lambda: ((cluster.get("workerpool", config.pool_name) or {}).get("status") or {}).get("desiredReplicas") == 1,
                 "the shared pool sized for both")
        assert team_a.get("deployment", config.pool_name) is None  # no pool of their own

        team_b.apply(served_model("sentiment", memory="1Gi"))  # the name team-a serves
        clash = accepted(team_b, "sentiment")
        assert (clash["status"], clash["reason"]) == ("False", "NameConflict")
        assert f"already served from namespace '{team_a.namespace}'" in clash["message"]
        assert (team_a.condition("sentiment", "Accepted") or {}).get("status") == "True"


def worker_token_in(team: Cluster, name: str) -> str | None:
    secret = team.get("secret", name)
    return base64.b64decode(secret["data"]["token"]).decode() if secret else None


def test_each_namespace_can_have_a_pool_of_its_own(cluster: Cluster, teams) -> None:
    """...whose pods can start: the workers' token they read is copied into the namespace (the chart
    makes it in its own namespace only), and goes with the pool."""
    team_a, team_b = teams
    config = operator_config(cluster.namespace, watch_namespaces=(team_a.namespace, team_b.namespace),
                             pool_mode="namespace", worker_token="pool-token", worker_token_secret="hotset-worker-token")
    with running_operator(config):
        team_a.apply(served_model("a-model", memory="1Gi", replicas={"min": 2, "max": 2}))
        team_b.apply(served_model("b-model", memory="1Gi", replicas={"min": 1, "max": 1}))
        wait_for(lambda: catalog_models(config, team_a.namespace) == ["a-model"]
                 and catalog_models(config, team_b.namespace) == ["b-model"], "each namespace's catalog listing only its models")
        wait_for(lambda: ((team_a.get("deployment", config.pool_name) or {}).get("spec") or {}).get("replicas") == 2,
                 "team-a's pool sized for its two copies")
        wait_for(lambda: ((team_b.get("deployment", config.pool_name) or {}).get("spec") or {}).get("replicas") == 1,
                 "team-b's pool")
        assert cluster.get("deployment", config.pool_name) is None  # the operator's namespace has no models
        for team in (team_a, team_b):
            wait_for(lambda: worker_token_in(team, "hotset-worker-token") == "pool-token",
                     f"the workers' token in {team.namespace}")
            container = team.get("deployment", config.pool_name)["spec"]["template"]["spec"]["containers"][0]
            assert {"name": "HOTSET_API_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": "hotset-worker-token", "key": "token"}}} in container["env"]
        assert cluster.get("secret", "hotset-worker-token") is None  # the chart's own, not the operator's

        # The pool goes with the namespace's last shared model (its WorkerPool's owners).
        team_b.kubectl("delete", "servedmodel", "b-model", "--timeout=30s")
        wait_for(lambda: team_b.get("workerpool", config.pool_name) is None
                 and team_b.get("deployment", config.pool_name) is None, "team-b's pool gone with its model", 60)
        wait_for(lambda: team_b.get("secret", "hotset-worker-token") is None, "team-b's token copy gone with it", 60)
