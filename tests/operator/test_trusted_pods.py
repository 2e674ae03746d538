"""Only those who could have an account's tokens anyway can make a pod hotset trusts as that
account (a real API server, its RBAC, its controllers and the chart's ValidatingAdmissionPolicy as
``helm template`` renders it).

The router and the operator find workers by label, the NetworkPolicy admits callers by label,
workers answer the router's and the operator's ServiceAccount tokens, and the router and the
operator accept the workers' account's identity tokens: in a namespace hotset serves, someone who
may create pods but not ``create serviceaccounts/token`` for that account cannot make one that
carries hotset's worker, router or operator labels or runs as one of its ServiceAccounts, directly
or through a Deployment or ReplicaSet. Deployments of those who may (the operator, the installer)
still get their pods from Kubernetes' own controllers.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hotset_common import labels
from hotset_testing.operator_harness import Cluster, wait_for

CHART = Path(__file__).resolve().parents[2] / "charts" / "hotset"
MALLORY = "--as=mallory"


@pytest.fixture
def guarded(cluster: Cluster) -> Cluster:
    """The chart's trusted-pods policy, bound to the test's namespace (its release namespace)."""
    helm = cluster.kube.binaries.helm
    if helm is None:
        pytest.fail("helm is missing; run `make install-k8s`", pytrace=False)
    rendered = subprocess.run([str(helm), "template", "hotset", str(CHART), "--namespace", cluster.namespace,
                               "--show-only", "templates/worker-integrity-policy.yaml"],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    cluster.kube.kubectl("apply", "-f", "-", input=rendered)
    cluster.kubectl("create", "serviceaccount", "hotset-worker")  # as the chart makes it
    cluster.kubectl("create", "role", "deployer", "--verb=get,list,create,update,patch",
                    "--resource=pods,deployments.apps,replicasets.apps")
    cluster.kubectl("create", "rolebinding", "mallory", "--role=deployer", "--user=mallory")
    try:
        yield cluster
    finally:
        cluster.kube.kubectl("delete", "-f", "-", input=rendered, check=False)


def _pod(name: str, pod_labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": pod_labels or {"app": name}},
            "spec": {"containers": [{"name": "c", "image": "registry.example/any:1"}], **spec}}


def _deployment(name: str, pod_labels: dict[str, str]) -> dict[str, Any]:
    pod = _pod(name, pod_labels)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": pod_labels},
                     "template": {"metadata": pod["metadata"] | {"name": None}, "spec": pod["spec"]}}}


def _create(cluster: Cluster, manifest: dict[str, Any], *identity: str, dry_run: bool = True):
    args = ["create", "-f", "-", *identity] + (["--dry-run=server"] if dry_run else [])
    return cluster.kubectl(*args, input=json.dumps(manifest), check=False)


WORKER = {labels.PART_OF: labels.PROJECT, labels.COMPONENT: labels.WORKER, labels.POOL: labels.SHARED_POOL}
ROUTER = {labels.PART_OF: labels.PROJECT, labels.COMPONENT: "router"}


def test_a_pod_that_would_pass_for_hotsets_own_needs_the_right_to_its_accounts_tokens(guarded: Cluster) -> None:
    refused = wait_for(lambda: (r := _create(guarded, _pod("fake-worker", WORKER), MALLORY)).returncode != 0 and r,
                       "the policy in force")
    assert ("mallory may not make a Pod that carries hotset's worker labels: that needs create on "
            f"serviceaccounts/token for hotset-worker in {guarded.namespace}") in refused.stderr
    as_router = _create(guarded, _deployment("fake-router", ROUTER), MALLORY)
    assert as_router.returncode != 0 and "may not make a Deployment that carries hotset's router labels" in as_router.stderr
    assert "serviceaccounts/token for hotset-router" in as_router.stderr
    as_account = _create(guarded, _pod("sa", serviceAccountName="hotset-worker"), MALLORY)
    assert as_account.returncode != 0 and "runs as hotset's ServiceAccount hotset-worker" in as_account.stderr
    # one who may mint the account's tokens could be it anyway: passes
    guarded.kubectl("create", "role", "minter", "--verb=create", "--resource=serviceaccounts/token",
                    "--resource-name=hotset-worker")
    guarded.kubectl("create", "rolebinding", "minter", "--role=minter", "--user=trent")
    guarded.kubectl("create", "rolebinding", "trent-deploys", "--role=deployer", "--user=trent")
    assert _create(guarded, _pod("minted", WORKER, serviceAccountName="hotset-worker"), "--as=trent").returncode == 0
    # anything else she may make as before, but not relabel it as hotset's afterwards
    assert _create(guarded, _pod("plain"), MALLORY, dry_run=False).returncode == 0
    assert _create(guarded, _deployment("plain", {"app": "plain"}), MALLORY).returncode == 0
    relabel = guarded.kubectl("label", "pod", "plain", MALLORY, f"{labels.PART_OF}={labels.PROJECT}",
                              f"{labels.COMPONENT}={labels.WORKER}", check=False)
    assert relabel.returncode != 0 and "carries hotset's worker labels" in relabel.stderr
    assert guarded.kubectl("label", "pod", "plain", MALLORY, "tier=web").returncode == 0


def test_a_deployment_of_someone_who_may_have_the_tokens_gets_its_pods(guarded: Cluster) -> None:
    wait_for(lambda: _create(guarded, _pod("probe", WORKER), MALLORY).returncode != 0, "the policy in force")
    assert _create(guarded, _deployment("pool", WORKER), dry_run=False).returncode == 0  # the admin here
    pods = wait_for(lambda: guarded.items("pods", f"{labels.COMPONENT}={labels.WORKER}"),
                    "the ReplicaSet controller's pod of it")
    assert pods[0]["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    # what controllers and the operator change on it later (not what is judged) passes, whoever it is
    name = pods[0]["metadata"]["name"]
    assert guarded.kubectl("annotate", "pod", name, MALLORY, "hotset.io/draining=1").returncode == 0


def test_the_operator_makes_worker_deployments_but_no_pods_of_its_own(guarded: Cluster) -> None:
    """Its Deployments run as the workers' account (the policy names it); a Pod it made would not pass."""
    wait_for(lambda: _create(guarded, _pod("probe", WORKER), MALLORY).returncode != 0, "the policy in force")
    operator = f"system:serviceaccount:{guarded.namespace}:hotset-operator"
    guarded.kubectl("create", "rolebinding", "operator-deploys", "--role=deployer",
                    f"--serviceaccount={guarded.namespace}:hotset-operator")
    pool = _deployment("pool", WORKER)
    pool["spec"]["template"]["spec"]["serviceAccountName"] = "hotset-worker"
    pool["spec"]["template"]["spec"]["automountServiceAccountToken"] = False  # worker pods mount no API token
    assert _create(guarded, pool, f"--as={operator}").returncode == 0
    # ... and only worker pods: not one as another account (test_helm_chart_all_namespaces.py has the rest)
    pool["spec"]["template"]["spec"]["serviceAccountName"] = "default"
    other = _create(guarded, pool, f"--as={operator}")
    assert other.returncode != 0 and "pool in " + guarded.namespace + " runs as ServiceAccount default" in other.stderr
    pod = _create(guarded, _pod("by-hand", WORKER), f"--as={operator}")
    assert pod.returncode != 0 and "serviceaccounts/token for hotset-worker" in pod.stderr


def test_only_the_operator_writes_the_keys_workers_verify_the_router_with(guarded: Cluster) -> None:
    """Other keys there would make that namespace's worker pods accept tokens signed by them (the
    chart's second policy, hotset-issuer-keys-<release namespace>)."""
    guarded.kubectl("create", "role", "configurer", "--verb=create,update,patch", "--resource=configmaps")
    for subject in ("--user=mallory", f"--serviceaccount={guarded.namespace}:hotset-operator"):
        guarded.kubectl("create", "rolebinding", f"configures-{subject.split('=')[0][2:]}", "--role=configurer", subject)
    keys = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hotset-issuer-keys"},
            "data": {"issuer": "https://forged.example", "jwks.json": "{\"keys\": []}"}}
    refused = wait_for(lambda: (r := _create(guarded, keys, MALLORY)).returncode != 0 and r, "the policy in force")
    assert (f"mallory may not write ConfigMap hotset-issuer-keys in {guarded.namespace}: worker pods verify the "
            "router's and the operator's tokens with the keys in it") in refused.stderr
    other = {**keys, "metadata": {"name": "settings"}}
    assert _create(guarded, other, MALLORY).returncode == 0
    operator = f"--as=system:serviceaccount:{guarded.namespace}:hotset-operator"
    assert _create(guarded, keys, operator).returncode == 0
