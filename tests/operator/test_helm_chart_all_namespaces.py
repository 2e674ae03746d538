"""The chart with `watchNamespaces: ["*"]` (ClusterRoles: every namespace is served), checked
against the real API server's RBAC and admission: the operator may do its job in the release
namespace and in any other, and nothing a cluster-admin could; its Deployments run worker pods
as the workers' account and no other; the router reads, and writes one annotation.

`kubectl auth can-i --as system:serviceaccount:<release namespace>:<account>` in the release
namespace and in another namespace the test makes, as test_helm_chart.py does for the default
install; the Deployments are sent with `--dry-run=server` under the operator's name, so the
chart's ValidatingAdmissionPolicy judges them as it would the operator's own."""
from __future__ import annotations

import copy
import json
from typing import Any, Iterator

import pytest
import yaml

from hotset_testing import chart
from hotset_testing.operator_harness import Cluster, served_model, wait_for
from test_helm_chart import OPERATOR_NEEDS, _can

# Every namespace, and a node folder for the source cache (the one hostPath worker pods may have).
VALUES = ("--set", "watchNamespaces={*}", "--set", "workers.sources.cache.hostPath=/var/cache/hotset")
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


class Everywhere:
    """The release namespace (`home`), another namespace hotset serves (`other`) and `can`."""

    def __init__(self, cluster: Cluster, other: str) -> None:
        self.cluster, self.home, self.other = cluster, cluster.namespace, other

    def can(self, account: str, *args: str, namespace: str | None = None) -> bool:
        return _can(self.cluster, account, *args, namespace=namespace)

    def namespaces(self) -> tuple[str, str]:
        return self.home, self.other


@pytest.fixture
def everywhere(cluster: Cluster) -> Iterator[Everywhere]:
    """The chart with watchNamespaces ["*"] applied into the test's namespace, and a second
    namespace; both deleted afterwards with the release's cluster-scoped objects (its policies
    bind every namespace: they must not outlive the test). The CRDs stay: other tests use them."""
    manifest = chart.template(cluster.kube, "--include-crds", *VALUES, namespace=cluster.namespace)
    other = f"{cluster.namespace}-other"
    cluster.kube.kubectl("create", "namespace", other)
    scoped = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] in CLUSTER_SCOPED]
    try:
        cluster.kubectl("apply", "-f", "-", input=manifest)
        yield Everywhere(cluster, other)
    finally:
        cluster.kube.kubectl("delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(scoped), check=False)
        cluster.kube.kubectl("delete", "namespace", other, "--wait=false", check=False)


# What the operator watches across the cluster (kopf runs clusterwide with ["*"]; its indexes).
OPERATOR_WATCHES_EVERYWHERE = ["servedmodels.hotset.io", "workerpools.hotset.io", "modelquotas.hotset.io",
                               "deployments.apps", "replicasets.apps", "pods"]

# What a cluster-admin could do and the operator must not, in any namespace (or the cluster).
CLUSTER_ADMIN = [
    ("list", "secrets"), ("watch", "secrets"), ("delete", "secrets"), ("patch", "secrets"),
    ("create", "pods"), ("delete", "pods"), ("create", "pods", "--subresource=exec"),
    ("create", "pods", "--subresource=attach"), ("create", "pods", "--subresource=eviction"),
    ("patch", "pods", "--subresource=ephemeralcontainers"), ("get", "pods", "--subresource=log"),
    ("delete", "namespaces"), ("create", "namespaces"), ("patch", "namespaces"), ("list", "namespaces"),
    ("create", "roles.rbac.authorization.k8s.io"), ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("create", "clusterroles.rbac.authorization.k8s.io"), ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("escalate", "roles.rbac.authorization.k8s.io"), ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("bind", "roles.rbac.authorization.k8s.io"), ("bind", "clusterroles.rbac.authorization.k8s.io"),
    ("impersonate", "users"), ("impersonate", "groups"), ("impersonate", "serviceaccounts"),
    ("get", "nodes"), ("list", "nodes"), ("patch", "nodes"), ("get", "nodes", "--subresource=proxy"),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("patch", "validatingadmissionpolicies.admissionregistration.k8s.io"),
    ("delete", "validatingadmissionpolicybindings.admissionregistration.k8s.io"),
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("create", "certificatesigningrequests.certificates.k8s.io"),
    ("update", "certificatesigningrequests.certificates.k8s.io", "--subresource=approval"),
    ("create", "persistentvolumes"),
    # no account's tokens, the chart's least of all; its accounts are not the operator's to change
    ("create", "serviceaccounts", "--subresource=token"),
    ("create", "serviceaccounts/hotset-router", "--subresource=token"),
    ("create", "serviceaccounts/hotset-operator", "--subresource=token"),
    ("create", "serviceaccounts/hotset-worker", "--subresource=token"),
    ("create", "serviceaccounts/default", "--subresource=token"),
    ("patch", "serviceaccounts/hotset-router"), ("patch", "serviceaccounts/hotset-operator"),
    ("patch", "serviceaccounts/default"), ("delete", "serviceaccounts"),
    # hotset's own objects, beyond its job
    ("delete", "servedmodels.hotset.io"), ("update", "servedmodels.hotset.io", "--subresource=approval"),
    ("patch", "modelquotas.hotset.io"), ("delete", "workerpools.hotset.io"), ("delete", "configmaps"),
    ("patch", "configmaps/kube-root-ca.crt"), ("delete", "networkpolicies.networking.k8s.io"),
    ("*", "*"),
]


def test_operator_serves_every_namespace_and_holds_no_cluster_admin_right(everywhere: Everywhere) -> None:
    missing = [(namespace, *args) for namespace in everywhere.namespaces() for args in OPERATOR_NEEDS
               if not everywhere.can("hotset-operator", *args, namespace=namespace)]
    missing += [("*", "watch", kind) for kind in OPERATOR_WATCHES_EVERYWHERE
                if not everywhere.can("hotset-operator", "watch", kind, namespace="*")]
    excess = [(namespace, *args) for namespace in (*everywhere.namespaces(), "kube-system", "*") for args in CLUSTER_ADMIN
              if everywhere.can("hotset-operator", *args, namespace=namespace)]
    assert (missing, excess) == ([], [])


ROUTER_READS = [("get", "pods"), ("watch", "pods"), ("watch", "replicasets.apps"), ("list", "deployments.apps"),
                ("watch", "deployments.apps"), ("watch", "servedmodels.hotset.io"), ("watch", "modelquotas.hotset.io"),
                ("create", "tokenreviews.authentication.k8s.io"),
                ("create", "subjectaccessreviews.authorization.k8s.io")]
ROUTER_MUST_NOT = [
    ("get", "secrets"), ("list", "secrets"), ("patch", "pods"), ("create", "pods"), ("delete", "pods"),
    ("create", "deployments.apps"), ("patch", "deployments.apps"), ("patch", "replicasets.apps"),
    ("patch", "servedmodels.hotset.io", "--subresource=status"), ("delete", "servedmodels.hotset.io"),
    ("create", "servedmodels.hotset.io"), ("update", "servedmodels.hotset.io", "--subresource=approval"),
    ("create", "servedmodels.hotset.io", "--subresource=predict"), ("patch", "modelquotas.hotset.io"),
    ("patch", "workerpools.hotset.io"), ("create", "configmaps"), ("create", "serviceaccounts"),
    ("create", "serviceaccounts", "--subresource=token"), ("get", "namespaces"), ("list", "nodes"),
    ("create", "roles.rbac.authorization.k8s.io"), ("impersonate", "serviceaccounts"), ("*", "*"),
]


def test_router_reads_every_namespace_and_writes_one_annotation(everywhere: Everywhere) -> None:
    where = (*everywhere.namespaces(), "*")
    missing = [(namespace, *args) for namespace in where for args in ROUTER_READS
               if not everywhere.can("hotset-router", *args, namespace=namespace)]
    # its one write: the annotation that asks for a pod of a model a request waits for
    missing += [(namespace, "patch", "servedmodels.hotset.io") for namespace in everywhere.namespaces()
                if not everywhere.can("hotset-router", "patch", "servedmodels.hotset.io", namespace=namespace)]
    excess = [(namespace, *args) for namespace in (*where, "kube-system") for args in ROUTER_MUST_NOT
              if everywhere.can("hotset-router", *args, namespace=namespace)]
    # workers: no API access anywhere
    excess += [(namespace, "hotset-worker", *args) for namespace in everywhere.namespaces()
               for args in (("list", "pods"), ("get", "configmaps"), ("create", "tokenreviews.authentication.k8s.io"))
               if everywhere.can("hotset-worker", *args, namespace=namespace)]
    assert (missing, excess) == ([], [])


def _worker_deployment(everywhere: Everywhere, namespace: str) -> dict[str, Any]:
    """A dedicated group's Deployment as the operator writes it for this chart (the shape its pods
    have: the workers' account, no API token, nothing of the node's but the source cache)."""
    from hotset_common import labels
    from hotset_operator import workloads
    from hotset_operator.config import OperatorConfig
    from hotset_common.spec import ModelSpec

    env = chart.env_values(chart.document(chart.render(everywhere.cluster.kube, *VALUES, namespace=everywhere.home), "Deployment", "hotset-operator"))
    config = OperatorConfig.from_env(env, namespace=everywhere.home)
    spec = ModelSpec.from_served_model(served_model("probe", placement="dedicated", replicas={"min": 1, "max": 1}))
    owner = {"apiVersion": "hotset.io/v1alpha1", "kind": "ServedModel", "metadata": {
        "name": "probe", "namespace": namespace, "uid": "00000000-0000-0000-0000-000000000001"}}
    deployment = workloads.build_dedicated_deployment(spec, owner, config, 1)
    assert deployment["spec"]["template"]["metadata"]["labels"][labels.COMPONENT] == labels.WORKER
    deployment["metadata"].pop("ownerReferences", None)  # no such ServedModel: dry-run only
    return deployment


def _send_as_operator(everywhere: Everywhere, deployment: dict[str, Any]):
    namespace = deployment["metadata"]["namespace"]
    return everywhere.cluster.kube.kubectl(
        "create", "-n", namespace, "-f", "-", "--dry-run=server",
        "--as", f"system:serviceaccount:{everywhere.home}:hotset-operator", input=json.dumps(deployment), check=False)


def _changed(deployment: dict[str, Any], change) -> dict[str, Any]:
    other = copy.deepcopy(deployment)
    change(other["spec"]["template"])
    other["spec"]["selector"]["matchLabels"] = dict(other["spec"]["template"]["metadata"]["labels"])
    return other


def _as(account: str):
    def change(template: dict[str, Any]) -> None:
        template["spec"]["serviceAccountName"] = account
    return change


def _privileged(template: dict[str, Any]) -> None:
    template["spec"]["containers"][0]["securityContext"] = {"privileged": True}


def _capability(template: dict[str, Any]) -> None:
    template["spec"]["containers"][0].setdefault("securityContext", {})["capabilities"] = {"add": ["SYS_ADMIN"]}


def _host_network(template: dict[str, Any]) -> None:
    template["spec"]["hostNetwork"] = True


def _host_pid(template: dict[str, Any]) -> None:
    template["spec"]["hostPID"] = True


def _host_root(template: dict[str, Any]) -> None:
    template["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})


def _api_token(template: dict[str, Any]) -> None:
    template["spec"]["automountServiceAccountToken"] = True


def _router_labels(template: dict[str, Any]) -> None:
    template["metadata"]["labels"]["app.kubernetes.io/component"] = "router"  # its account still the workers'


def _init_privileged(template: dict[str, Any]) -> None:
    template["spec"]["initContainers"] = [{"name": "x", "image": "registry.example/any:1",
                                           "securityContext": {"privileged": True}}]


@pytest.mark.parametrize("change, what", [
    (_as("default"), "runs as ServiceAccount default"), (_as("hotset-router"), "runs as ServiceAccount hotset-router"),
    (_as("hotset-operator"), "runs as ServiceAccount hotset-operator"), (_privileged, "privileged"),
    (_init_privileged, "privileged"), (_capability, "adds capabilities"), (_host_network, "host's namespaces"),
    (_host_pid, "host's namespaces"), (_host_root, "mounts hostPath /"), (_api_token, "API token"),
    (_router_labels, "carries hotset's router labels"),
])
def test_operator_deployments_run_worker_pods_as_the_workers_account_and_no_other(
        everywhere: Everywhere, change, what: str) -> None:
    """With ["*"] the operator may create Deployments in any namespace (RBAC cannot limit create by
    name or content): the chart's policy makes those Deployments' pods worker pods, running as the
    workers' account (no API rights, no API token), unprivileged, sharing nothing of the node but
    the source cache folder. So its token cannot run a pod as another namespace's ServiceAccount."""
    for namespace in everywhere.namespaces():
        worker = _worker_deployment(everywhere, namespace)
        refused = wait_for(lambda: (r := _send_as_operator(everywhere, _changed(worker, change))).returncode != 0 and r,
                           f"the policy in force in {namespace}")
        accepted = _send_as_operator(everywhere, worker)
        assert accepted.returncode == 0, accepted.stderr
        assert "hotset-operator may only make Deployments of worker pods" in refused.stderr, refused.stderr
        assert what in refused.stderr, refused.stderr
