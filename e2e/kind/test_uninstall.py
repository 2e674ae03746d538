"""helm uninstall leaves nothing of hotset behind but its CRD; runs last.

ServedModels are deleted first, as docs/operator.md tells users to. What the
operator made itself (the shared pool's WorkerPool, and its Deployment,
disruption budget and NetworkPolicy) is owned by the operator's Deployment, so
Kubernetes removes it with the release.
"""
from __future__ import annotations

import json

from platform_kind import KindPlatform
from scenarios.chart import RELEASE
from scenarios.platform import wait_for

KINDS = ("deployments,replicasets,pods,services,configmaps,secrets,serviceaccounts,roles,rolebindings,servedmodels,"
         "workerpools,poddisruptionbudgets,networkpolicies")


def remaining(platform: KindPlatform) -> list[str]:
    """Every object of the release namespace except what Kubernetes puts in each namespace."""
    listing = json.loads(platform.kubectl.kubectl("get", KINDS, "-n", platform.namespace, "-o", "json").stdout)
    builtin = {("ConfigMap", "kube-root-ca.crt"), ("ServiceAccount", "default")}
    return [f"{i['kind']}/{i['metadata']['name']}" for i in listing["items"]
            if (i["kind"], i["metadata"]["name"]) not in builtin]


def test_helm_uninstall_leaves_only_the_crd(platform: KindPlatform) -> None:
    kube = platform.kube
    platform.kubectl.kubectl("delete", "servedmodels", "--all", "-n", platform.namespace, "--timeout=180s",
                             timeout=200)
    platform.helm("uninstall", RELEASE, "--wait", "--timeout", "180s", timeout=240)
    wait_for("nothing of hotset left in its namespace", lambda: not remaining(platform), 180, interval=2.0,
             show=lambda: remaining(platform))
    crds = platform.kubectl.kubectl("get", "crd", "-o", "name").stdout.split()
    assert "customresourcedefinition.apiextensions.k8s.io/servedmodels.hotset.io" in crds
    leftovers = [r for r in platform.kubectl.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout.split()
                 if "hotset" in r]
    assert not leftovers, leftovers
    assert not kube.items("pods")
