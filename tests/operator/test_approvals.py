"""Approval and history (seed 002) against a real API server: its RBAC, the chart's
ValidatingAdmissionPolicy as ``helm template`` renders it, ``hotset-approve`` run as two users
(kubectl impersonation), and the operator's SubjectAccessReview.

A namespace whose ModelQuota requires approval serves nothing unapproved: a new model waits
(Accepted=False, ApprovalPending); an approver's ``hotset-approve`` serves it; an edit of what
is served keeps the approved version in the pool's catalog until that generation is approved too;
``status.history`` and the model's Events say who approved what and how it went. Someone without
the verb cannot approve, nor write an approval in an approver's name. The pure rules:
test_approval_rules.py.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from hotset_testing import chart
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.operator_harness import Cluster, catalog, operator_config, running_operator, served_model, wait_for


@pytest.fixture(scope="module")
def approval_policy(crd_installed: KubeCluster) -> KubeCluster:
    """The chart's ValidatingAdmissionPolicy and binding, rendered by helm and applied."""
    rendered = chart.template(crd_installed, "--show-only", "templates/approval-policy.yaml", namespace="hotset-approvals")
    crd_installed.kubectl("apply", "-f", "-", input=rendered)
    return crd_installed


def _roles(cluster: Cluster) -> None:
    """Editors may change ServedModels; the group `approvers` may also approve them."""
    cluster.kubectl("create", "role", "editor", "--verb=get,list,patch,update,create",
                    "--resource=servedmodels.hotset.io")
    cluster.kubectl("create", "rolebinding", "editors", "--role=editor", "--user=bob", "--group=approvers")
    cluster.kubectl("create", "role", "approver", "--verb=update", "--resource=servedmodels.hotset.io/approval")
    cluster.kubectl("create", "rolebinding", "approvers", "--role=approver", "--group=approvers")


def _approve(cluster: Cluster, model: str, *identity: str) -> subprocess.CompletedProcess[str]:
    """hotset-approve as a user would run it, with kubectl's impersonation flags for `identity`."""
    kube = cluster.kube
    return subprocess.run([sys.executable, "-m", "hotset_operator.approve", model, "-n", cluster.namespace,
                           "--kubectl", str(kube.binaries.kubectl), "--kubeconfig", str(kube.kubeconfig), *identity],
                          capture_output=True, text=True, timeout=60, env=kube.env())


def _served_version(config, namespace: str, model: str) -> str | None:
    found = catalog(config, namespace)
    return next((m["version"] for m in found.models if m["id"] == model), None) if found is not None else None


ALICE = ("--as=alice", "--as-group=approvers")


def test_an_unapproved_model_waits_and_an_approvers_approval_serves_it_with_its_history(
        cluster: Cluster, approval_policy: KubeCluster) -> None:
    _roles(cluster)
    config = operator_config(cluster.namespace)
    with running_operator(config):
        cluster.apply({"apiVersion": "hotset.io/v1alpha1", "kind": "ModelQuota", "metadata": {"name": "gate"},
                       "spec": {"requireApproval": True}})
        cluster.apply(served_model("fraud", version="1"))
        waiting = wait_for(lambda: (c := cluster.condition("fraud", "Accepted")) and c, "Accepted on fraud")
        assert (waiting["status"], waiting["reason"]) == ("False", "ApprovalPending")
        assert f"hotset-approve fraud -n {cluster.namespace}" in waiting["message"]
        assert _served_version(config, cluster.namespace, "fraud") is None

        # bob may edit but not approve: the API server refuses him, in his own name or in alice's
        refused = _approve(cluster, "fraud", "--as=bob")
        assert refused.returncode != 0 and "bob may not approve ServedModels" in refused.stderr
        forged = cluster.kubectl("annotate", "servedmodel", "fraud", "--as=bob", "approval.hotset.io/generation=1",
                                 "approval.hotset.io/user=alice", "approval.hotset.io/groups=approvers", check=False)
        assert forged.returncode != 0 and "must name the identity approving (bob)" in forged.stderr

        done = _approve(cluster, "fraud", *ALICE)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: _served_version(config, cluster.namespace, "fraud") == "1", "fraud served once approved")
        status = cluster.get("servedmodel", "fraud")["status"]
        assert (status["approval"]["generation"], status["approval"]["approvedBy"]) == (1, "alice"), status
        first = wait_for(lambda: (h := cluster.get("servedmodel", "fraud")["status"].get("history")) and
                         h[-1].get("outcome") and h, "the approval's outcome")
        assert [(h["generation"], h["changed"], h["approvedBy"], h["outcome"]) for h in first] == [
            (1, [], "alice", "Served")]  # changed: [] for a new model

        # a new version is not served until approved: the catalog keeps version 1 meanwhile
        cluster.kubectl("patch", "servedmodel", "fraud", "--as=bob", "--type=merge",
                        "-p", '{"spec": {"version": "2", "source": {"uri": "pvc://models/fraud-v2"}}}')
        pending = wait_for(lambda: (c := cluster.condition("fraud", "Accepted")) and "generation 2" in c["message"]
                           and c, "the change waiting")
        assert pending["status"] == "True" and "serving generation 1 as approved by alice" in pending["message"]
        assert "changes source, version" in pending["message"]
        assert _served_version(config, cluster.namespace, "fraud") == "1"
        # an edit approval does not cover (the description) is no approval of the change
        cluster.kubectl("patch", "servedmodel", "fraud", "--type=merge", "-p", '{"spec": {"description": "v2"}}')
        assert _served_version(config, cluster.namespace, "fraud") == "1"

        assert _approve(cluster, "fraud", *ALICE).returncode == 0
        wait_for(lambda: _served_version(config, cluster.namespace, "fraud") == "2", "version 2 served once approved")
        history = wait_for(lambda: (h := cluster.get("servedmodel", "fraud")["status"].get("history")) and
                           len(h) == 2 and h[-1].get("outcome") and h, "the second approval's outcome")
        assert history[-1]["generation"] == 3 and history[-1]["changed"] == ["source", "version"]
        assert history[-1]["approvedBy"] == "alice" and history[-1]["outcome"] == "Served"
        reasons = {e["reason"]: e["message"] for e in cluster.events("fraud")}
        assert reasons.get("Approved", "").endswith("approved by alice")
        assert "ChangeServed" in reasons


def test_a_model_served_before_approval_was_required_keeps_serving_its_approved_baseline(
        cluster: Cluster, approval_policy: KubeCluster) -> None:
    _roles(cluster)
    config = operator_config(cluster.namespace)
    with running_operator(config):
        cluster.apply(served_model("legacy", version="1"))
        wait_for(lambda: _served_version(config, cluster.namespace, "legacy") == "1", "legacy served")
        cluster.apply({"apiVersion": "hotset.io/v1alpha1", "kind": "ModelQuota", "metadata": {"name": "gate"},
                       "spec": {"requireApproval": True}})
        baseline = wait_for(lambda: cluster.get("servedmodel", "legacy")["status"].get("approval"), "the baseline")
        assert baseline["approvedBy"] == "" and baseline["generation"] == 1
        cluster.kubectl("patch", "servedmodel", "legacy", "--type=merge", "-p", '{"spec": {"version": "2"}}')
        wait_for(lambda: "generation 2" in ((cluster.condition("legacy", "Accepted") or {}).get("message") or ""),
                 "the change waiting")
        assert _served_version(config, cluster.namespace, "legacy") == "1"
