"""The test control plane is a real one: controllers run, RBAC is enforced."""
from __future__ import annotations

import json

from hotset_testing import kube_cluster as kc
from hotset_testing.polling import wait_for


def test_deployment_gets_scheduled_pods(kube_cluster: kc.KubeCluster) -> None:
    kube_cluster.kubectl("create", "namespace", "cp-check")
    kc.register_node(kube_cluster, "cp-node")
    kube_cluster.kubectl("-n", "cp-check", "create", "deployment", "web", "--image=example.invalid/web", "--replicas=2")

    def scheduled_pods():
        pods = json.loads(kube_cluster.kubectl("-n", "cp-check", "get", "pods", "-o", "json").stdout)["items"]
        return [p for p in pods if p["spec"].get("nodeName") == "cp-node"]

    assert len(wait_for(lambda: len(scheduled_pods()) == 2 and scheduled_pods(), "2 scheduled pods", 60, 0.3)) == 2
    kube_cluster.kubectl("-n", "cp-check", "delete", "deployment", "web")
    # No kubelet confirms the deletion of a bound pod: garbage collection shows as a deletionTimestamp.
    wait_for(lambda: all(p["metadata"].get("deletionTimestamp") for p in scheduled_pods()),
             "garbage collection of the pods", 60, 0.3)
    kube_cluster.kubectl("delete", "namespace", "cp-check", "--wait=false")


def test_rbac_denies_a_service_account_without_bindings(kube_cluster: kc.KubeCluster) -> None:
    nobody = "system:serviceaccount:default:default"
    answer = kube_cluster.kubectl("auth", "can-i", "list", "secrets", "--as", nobody, check=False)
    assert answer.stdout.strip() == "no"
    assert kube_cluster.kubectl("auth", "can-i", "list", "secrets").stdout.strip() == "yes"
