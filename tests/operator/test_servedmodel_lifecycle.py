"""A ServedModel applied with kubectl becomes the right Deployment, follows spec
updates, and on delete its children go (no finalizer: deleting needs no operator)."""
from __future__ import annotations

import json

from hotset_testing.operator_harness import Cluster, catalog_models, served_model, wait_for


def _container(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def test_dedicated_model_gets_its_own_pinned_deployment(cluster: Cluster, operator) -> None:
    config, _ = operator
    cluster.apply(served_model("sentiment", placement="dedicated", replicas={"min": 2, "max": 3}))

    accepted = wait_for(lambda: (c := cluster.condition("sentiment", "Accepted")) and c["status"] == "True" and c,
                        "Accepted=True")
    assert accepted["reason"] == "Valid"
    deployment = wait_for(lambda: cluster.get("deployment", "sentiment-dedicated"), "the dedicated Deployment")
    assert deployment["spec"]["replicas"] == 2
    owner = deployment["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ServedModel", "sentiment", True)

    worker = _container(deployment, "hotset-worker")
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["HOTSET_PINNED_MODELS"] == "sentiment"
    # A transformers model's group runs no Triton sidecar (workers.triton.sidecar: auto).
    assert "HOTSET_TRITON_URL" not in env
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["hotset-worker"]
    assert worker["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert worker["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"

    # Its pods follow a catalog holding only this model; the shared pool's catalog does not list it.
    env = {e["name"]: e.get("value") for e in _container(deployment, "hotset-worker")["env"]}
    assert env["HOTSET_CATALOG_URL"].endswith(f"/v1/catalogs/{cluster.namespace}/dedicated/sentiment")
    wait_for(lambda: catalog_models(config, cluster.namespace, "sentiment") == ["sentiment"], "its own catalog")
    assert catalog_models(config, cluster.namespace) == []

    # The controller-manager turns it into real pods; they carry the worker labels the router selects.
    pods = wait_for(lambda: len(p := cluster.items("pods", "hotset.io/servedmodel=sentiment")) == 2 and p, "2 pods")
    assert all(p["spec"]["securityContext"]["runAsNonRoot"] for p in pods)

    # Nothing runs the pods here, so no copy is ready and status says so.
    ready = wait_for(lambda: cluster.condition("sentiment", "Ready"), "a Ready condition")
    assert (ready["status"], ready["reason"]) == ("False", "WaitingForCopies")
    assert (cluster.get("servedmodel", "sentiment") or {})["status"]["readyReplicas"] == 0

    table = cluster.kubectl("get", "servedmodels").stdout.splitlines()
    assert table[0].split() == ["NAME", "FRAMEWORK", "PLACEMENT", "CLASS", "READY", "ACCEPTED", "AGE"]
    assert table[1].split()[:6] == ["sentiment", "transformers", "dedicated", "standard", "0", "True"]
    wait_for(lambda: "Accepted" in {e["reason"] for e in cluster.events("sentiment")}, "an Accepted event")


def test_spec_update_reaches_the_deployment_and_delete_removes_it(cluster: Cluster, operator) -> None:
    cluster.apply(served_model("ranker", placement="dedicated", replicas={"min": 1, "max": 3}))
    wait_for(lambda: cluster.get("deployment", "ranker-dedicated"), "the dedicated Deployment")

    cluster.kubectl("patch", "servedmodel", "ranker", "--type=merge", "-p", '{"spec": {"replicas": {"min": 3}}}')
    wait_for(lambda: (cluster.get("deployment", "ranker-dedicated") or {}).get("spec", {}).get("replicas") == 3,
             "the Deployment scaled to 3")

    cluster.apply(served_model("ranker", placement="shared", replicas={"min": 1, "max": 3}))
    wait_for(lambda: cluster.get("deployment", "ranker-dedicated") is None, "the dedicated Deployment removed")

    cluster.apply(served_model("ranker", placement="dedicated", replicas={"min": 1, "max": 3}))
    wait_for(lambda: cluster.get("deployment", "ranker-dedicated"), "the dedicated Deployment back")
    assert not cluster.get("servedmodel", "ranker")["metadata"].get("finalizers")  # deleting needs no operator

    cluster.kubectl("delete", "servedmodel", "ranker", "--timeout=30s")
    assert cluster.get("servedmodel", "ranker") is None
    wait_for(lambda: cluster.get("deployment", "ranker-dedicated") is None, "garbage collection of the Deployment")


def test_a_crash_looping_dedicated_pod_shows_in_ready(cluster: Cluster, operator) -> None:
    cluster.apply(served_model("fragile", placement="dedicated", replicas={"min": 1, "max": 1}))
    [pod] = wait_for(lambda: cluster.items("pods", "hotset.io/servedmodel=fragile"), "the dedicated pod")
    # What a kubelet reports when the pinned model's load keeps failing the startup probe.
    crash = {"status": {"phase": "Running", "containerStatuses": [{
        "name": "hotset-worker", "ready": False, "restartCount": 3, "image": "worker:test", "imageID": "",
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}]}}
    cluster.kubectl("patch", "pod", pod["metadata"]["name"], "--subresource=status", "--type=merge",
                    "-p", json.dumps(crash))

    ready = wait_for(lambda: (c := cluster.condition("fragile", "Ready")) and c["reason"] == "PodsFailing" and c,
                     "Ready=False with PodsFailing")
    assert ready["status"] == "False"
    assert pod["metadata"]["name"] in ready["message"] and "CrashLoopBackOff" in ready["message"]
    wait_for(lambda: "PodsFailing" in {e["reason"] for e in cluster.events("fragile")}, "a warning event")
