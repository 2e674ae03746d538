"""Several namespaces, their pools and their quotas, against the real API server and operator."""
from __future__ import annotations

import json
import uuid
from typing import Iterator

import httpx
import pytest

from hotset_common import labels, worker_identity as identity
from hotset_operator import workloads
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


def catalog_token(team: Cluster, pod: str) -> str:
    """A catalog token bound to `pod`, as the kubelet projects it into the pod."""
    return team.kubectl("create", "token", identity.WORKER_ACCOUNT, "--audience", identity.CATALOG_AUDIENCE,
                        "--bound-object-kind", "Pod", "--bound-object-name", pod).stdout.strip()


def test_each_namespace_can_have_a_pool_of_its_own(cluster: Cluster, teams) -> None:
    """...whose pods can start and prove who they are: the operator makes the workers' ServiceAccount
    and the cluster's ServiceAccount keys there (the chart makes the account in its own namespace
    only), no Secret holds a shared token, both go with the pool, and a pool's catalog answers its
    own pods only."""
    team_a, team_b = teams
    config = operator_config(cluster.namespace, watch_namespaces=(team_a.namespace, team_b.namespace),
                             pool_mode="namespace", worker_identity="pod-token", worker_service_account="hotset-worker")
    with running_operator(config):
        team_a.apply(served_model("a-model", memory="1Gi", replicas={"min": 2, "max": 2}))
        team_b.apply(served_model("b-model", memory="1Gi", replicas={"min": 1, "max": 1}))
        wait_for(lambda: ((team_a.get("deployment", config.pool_name) or {}).get("spec") or {}).get("replicas") == 2,
                 "team-a's pool sized for its two copies")
        wait_for(lambda: ((team_b.get("deployment", config.pool_name) or {}).get("spec") or {}).get("replicas") == 1,
                 "team-b's pool")
        assert cluster.get("deployment", config.pool_name) is None  # the operator's namespace has no models
        pods = {}
        for team in (team_a, team_b):
            account = wait_for(lambda: team.get("serviceaccount", identity.WORKER_ACCOUNT), f"the workers' account in {team.namespace}")
            assert account["automountServiceAccountToken"] is False
            keys = wait_for(lambda: team.get("configmap", identity.KEYS_CONFIGMAP), f"the cluster's keys in {team.namespace}")
            assert keys["data"][identity.ISSUER_KEY] == "https://kubernetes.default.svc.cluster.local"
            assert json.loads(keys["data"][identity.JWKS_KEY])["keys"][0]["kty"] == "RSA"
            # the account exists, so the ReplicaSet controller can make the pods (before, it could not)
            made = wait_for(lambda: team.items("pods", f"{labels.COMPONENT}={labels.WORKER}"), f"pods in {team.namespace}")
            assert {p["spec"]["serviceAccountName"] for p in made} == {identity.WORKER_ACCOUNT}
            pods[team.namespace] = made[0]["metadata"]["name"]
            assert not [s for s in team.items("secrets") if s["metadata"]["name"] == "hotset-worker-token"]
        assert cluster.get("serviceaccount", identity.WORKER_ACCOUNT) is None  # the chart's own, not the operator's

        token = catalog_token(team_a, pods[team_a.namespace])
        wait_for(lambda: catalog_models(config, team_a.namespace, token=token) == ["a-model"],
                 "team-a's pod reading team-a's catalog")
        for namespace, sent, status, words in [
                (team_b.namespace, token, 403, f"follows the catalog of {team_a.namespace}/shared, not {team_b.namespace}/pool"),
                (team_a.namespace, "", 401, "answers only its pool's worker pods"),
                (team_a.namespace, team_a.kubectl("create", "token", identity.WORKER_ACCOUNT, "--audience",
                                                  identity.CATALOG_AUDIENCE).stdout.strip(), 403, "is not a worker pod")]:
            answer = httpx.get(workloads.catalog_url(config, namespace), timeout=10,
                               headers={"Authorization": f"Bearer {sent}"} if sent else {})
            assert answer.status_code == status and words in answer.json()["error"], (namespace, answer.text)

        # The pool goes with the namespace's last shared model (its WorkerPool's owners), and so do they.
        team_b.kubectl("delete", "servedmodel", "b-model", "--timeout=30s")
        wait_for(lambda: team_b.get("workerpool", config.pool_name) is None
                 and team_b.get("deployment", config.pool_name) is None, "team-b's pool gone with its model", 60)
        wait_for(lambda: team_b.get("serviceaccount", identity.WORKER_ACCOUNT) is None
                 and team_b.get("configmap", identity.KEYS_CONFIGMAP) is None, "team-b's account and keys gone with it", 60)
