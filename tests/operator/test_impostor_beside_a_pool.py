"""The operator asks only its own Deployments' pods for reports (hotset_common.worker_ownership):
a pod somebody made by hand with a pool's labels, Ready on an IP of its own, gets no report
call and no token, is counted in ``hotset_operator_unowned_worker_pods``, and changes nothing the
pool decides, while the pool's own pod serves and reports as before.

Real API server, controller manager and scheduler, the operator and router commands, a worker
process for the pool's pod (pod_player.py plays the kubelet); the impostor's IP runs a recording
HTTP server (a stand-in for a pod that would report forged queues to grow the pool)."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from hotset_testing import processes
from hotset_testing.operator_harness import Cluster
from hotset_testing.recording_server import RecordingServer
from hotset_testing.scaling_stack import ScalingStack, served_model, write_ballast
from hotset_testing.scrape import metric

pytestmark = [pytest.mark.kube, pytest.mark.slow]
IMPOSTOR_IP = "127.0.0.74"
UNSCHEDULED = "hotset-test-unscheduled"  # a scheduler nobody runs: the pod stays where the test puts it


def impostor_of(pod: dict, name: str) -> dict:
    """A pod with `pod`'s labels and no owner, never scheduled (nothing but this test runs it). All
    but ``pod-template-hash``: an orphan that carries it matches the pool's ReplicaSet, which adopts
    it and, one pod over its count, deletes it at once (the cluster's own defence)."""
    labels = {k: v for k, v in pod["metadata"]["labels"].items() if k != "pod-template-hash"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"schedulerName": UNSCHEDULED, "containers": [{"name": "worker", "image": "hotset-worker:test"}]}}


def test_a_hand_made_pod_with_a_pools_labels_gets_no_report_call_and_no_token(cluster: Cluster, tmp_path: Path):
    metrics_port = processes.free_port()
    settings = {"pool_min_pods": 1, "pool_max_pods": 3, "metrics_port": metrics_port}
    with ScalingStack(cluster.kube, cluster.namespace, tmp_path, settings) as stack:
        operator_metrics = f"http://127.0.0.1:{metrics_port}"
        impostor = RecordingServer(IMPOSTOR_IP, stack.worker_port)
        try:
            write_ballast(stack.models, "a", 10)
            stack.apply(served_model("a", 10))
            stack.wait_for(lambda: len(stack.player.running()) == 1, "the pool's one pod running", timeout=180)
            own = stack.get("pod", stack.player.running()[0])
            stack.apply(impostor_of(own, "impostor"))
            stack.kubectl("patch", "pod", "impostor", "--subresource=status", "--type=merge", "-p", json.dumps({
                "status": {"phase": "Running", "podIP": IMPOSTOR_IP, "podIPs": [{"ip": IMPOSTOR_IP}],
                           "conditions": [{"type": "Ready", "status": "True"},
                                          {"type": "ContainersReady", "status": "True"}]}}))
            stack.wait_for(lambda: metric(operator_metrics, "hotset_operator_unowned_worker_pods") == 1,
                           "the operator counting the impostor as unowned")

            with httpx.Client() as client:  # served through the pool's own pod; its report makes `a` Ready
                for _ in range(3):
                    answer = stack.predict(client, "a")
                    assert answer.status_code == 200, answer.text
            stack.wait_for(lambda: (stack.condition("a", "Ready") or {}).get("status") == "True", "a Ready")
            passes = metric(operator_metrics, "hotset_operator_pool_passes_total")
            stack.wait_for(lambda: metric(operator_metrics, "hotset_operator_pool_passes_total") >= passes + 4,
                           "four more pool passes with the impostor Ready")

            assert impostor.requests == []  # neither the operator nor the router called it, so no token either
            assert metric(operator_metrics, "hotset_operator_unowned_worker_pods") == 1
            pool = stack.pool()
            assert pool["spec"]["replicas"] == 1, pool  # nothing it could have reported grew the pool
            assert stack.player.running() == [own["metadata"]["name"]]
        finally:
            impostor.close()
            stack.kubectl("delete", "pod", "impostor", "--grace-period=0", "--ignore-not-found", check=False)
