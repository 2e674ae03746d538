"""What worker pods may reach, and who may reach them (docs/security.md, "Network").

The chart renders the worker network rules once: its own NetworkPolicy holds them in the
release namespace, and the operator, given the same rules as JSON, writes them beside every
worker Deployment it runs (pools in their namespaces, dedicated groups in their models'), owned
by what the Deployment goes with. Rendered with the real helm; applied by the real operator to
the real API server, whose garbage collector removes them. kube-router enforcing them on real
pods is the kind tier's test (e2e/kind/test_real_kubelet.py).
"""
from __future__ import annotations

import json
from typing import Any

from hotset_operator import workloads
from hotset_operator.config import OperatorConfig
from hotset_testing import chart
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, wait_for


def render(kube: KubeCluster, namespace: str, *sets: str) -> list[dict[str, Any]]:
    """The chart rendered into `namespace`, `--set-json` each of `sets`."""
    return chart.render(kube, *[arg for value in sets for arg in ("--set-json", value)], namespace=namespace)


def worker_policies(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == "NetworkPolicy"]


def operator_rules(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The rules the chart hands the operator, read as the operator reads them."""
    operator = chart.document(documents, "Deployment", "hotset-operator")
    return OperatorConfig.from_env(chart.env_values(operator), namespace="ml").worker_network_rules


def egress_to(rules: dict[str, Any], port: int) -> list[dict[str, Any]]:
    return [rule for rule in rules["egress"] if any(p["port"] == port for p in rule["ports"])]


def test_workers_reach_only_dns_the_catalog_and_public_https_and_the_operator_gets_the_same_rules(
        kube_cluster: KubeCluster) -> None:
    documents = render(kube_cluster, "ml")
    (policy,) = worker_policies(documents)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    rules = operator_rules(documents)
    assert rules == {"ingress": policy["spec"]["ingress"], "egress": policy["spec"]["egress"]}
    # Peers name the release namespace, so the rules mean the same beside a pool in another one.
    callers = rules["ingress"][0]["from"]
    assert {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in callers} == {"router", "operator"}
    assert all(p["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ml"}} for p in callers)
    (dns,) = egress_to(rules, 53)
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    (catalog,) = egress_to(rules, 8090)
    assert catalog["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml"}},
                              "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "hotset",
                                                              "app.kubernetes.io/component": "operator"}}}]
    (stores,) = egress_to(rules, 443)
    (block,) = [peer["ipBlock"] for peer in stores["to"]]
    assert block["cidr"] == "0.0.0.0/0"
    # Not the cluster's own networks (pods, Services, nodes, the API server) nor the metadata service.
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(block["except"])
    assert len(rules["egress"]) == 3, "nothing else may be reached"


def test_an_in_cluster_model_store_is_added_and_each_half_turns_off(kube_cluster: KubeCluster) -> None:
    minio = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "storage"}},
                     "podSelector": {"matchLabels": {"app": "minio"}}}], "ports": [{"port": 9000, "protocol": "TCP"}]}
    rules = operator_rules(render(kube_cluster, "ml", f"networkPolicy.workerEgress.modelStores=[{json.dumps(minio)}]"))
    assert egress_to(rules, 9000) == [minio] and egress_to(rules, 443) == []

    documents = render(kube_cluster, "ml", "networkPolicy.workerEgress.enabled=false")
    (policy,) = worker_policies(documents)
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
    assert set(operator_rules(documents)) == {"ingress"}

    documents = render(kube_cluster, "ml", "networkPolicy.enabled=false")
    assert worker_policies(documents) == [] and operator_rules(documents) == {}


def test_every_worker_deployment_gets_the_rules_and_they_go_with_it(cluster: Cluster) -> None:
    rules = operator_rules(render(cluster.kube, cluster.namespace))
    config = operator_config(cluster.namespace, worker_network_rules=rules)
    with running_operator(config):
        cluster.apply(served_model("pinned", placement="dedicated", replicas={"min": 1, "max": 1}, memory="1Gi"))
        pool = wait_for(lambda: cluster.get("networkpolicy", config.pool_name), "the pool's NetworkPolicy")
        dedicated = wait_for(lambda: cluster.get("networkpolicy", "pinned-dedicated"), "the group's NetworkPolicy")
        deployments = {name: wait_for(lambda name=name: cluster.get("deployment", name), name)
                       for name in (config.pool_name, "pinned-dedicated")}
        for policy in (pool, dedicated):
            name = policy["metadata"]["name"]
            assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"], name
            assert {k: policy["spec"][k] for k in ("ingress", "egress")} == rules, name
            # It selects exactly its Deployment's pods.
            pod_labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
            selector = policy["spec"]["podSelector"]["matchLabels"]
            assert selector.items() <= pod_labels.items(), name
        assert pool["spec"]["podSelector"]["matchLabels"] == workloads.worker_labels(None)
        assert dedicated["spec"]["podSelector"]["matchLabels"] == workloads.worker_labels("pinned")
        assert [o["kind"] for o in pool["metadata"]["ownerReferences"]] == ["WorkerPool"]
        assert [(o["kind"], o["name"]) for o in dedicated["metadata"]["ownerReferences"]] == [("ServedModel", "pinned")]
        cluster.kubectl("delete", "servedmodel", "pinned", "--timeout=60s")
        wait_for(lambda: cluster.get("networkpolicy", "pinned-dedicated") is None,
                 "the group's NetworkPolicy gone with its model", timeout=60)
