"""The whole control plane with worker identity on, as the chart installs it (docs/security.md,
"Workers that prove who they are"): the operator builds pool pods with projected identity and
catalog tokens and writes the cluster's ServiceAccount keys beside them; the pod player plays the
kubelet (it mints each pod's tokens with the TokenRequest API, bound to the Pod, and copies the
keys ConfigMap into the pod's files); the router and the operator present tokens of their own.

A pool pod proves which pod it is to both, follows its catalog with its own token, verifies both
callers with the keys the operator copied, and serves. A hand-made pod with the pool's labels,
whose address hands out the real pod's identity token (stolen), is trusted by neither, although
both are told to trust every labelled pod (``--worker-trust labelled``: only the proof stands
between it and the traffic): it is asked who it is, with no credential, and nothing else, counted
in both unowned-pods gauges, and the pool keeps its size.

Real API server, controller manager and scheduler, the operator and router commands, worker
processes for the pool's pods; the impostor's address runs a recording server.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from hotset_common import worker_identity as identity
from hotset_testing import processes
from hotset_testing.operator_harness import Cluster
from hotset_testing.recording_server import RecordingServer
from hotset_testing.scaling_stack import ScalingStack, served_model, write_ballast
from hotset_testing.scrape import metric

pytestmark = [pytest.mark.kube, pytest.mark.slow]
IMPOSTOR_IP = "127.0.0.75"
UNSCHEDULED = "hotset-test-unscheduled"


def test_pool_pods_prove_who_they_are_and_a_pod_with_a_stolen_token_gets_nothing(cluster: Cluster,
                                                                                  tmp_path: Path) -> None:
    metrics_port = processes.free_port()
    settings = {"pool_min_pods": 1, "pool_max_pods": 3, "metrics_port": metrics_port, "worker_trust": "labelled"}
    with ScalingStack(cluster.kube, cluster.namespace, tmp_path, settings, identity=True,
                      router_args=("--worker-trust", "labelled")) as stack:
        operator_metrics = f"http://127.0.0.1:{metrics_port}"
        write_ballast(stack.models, "a", 10)
        stack.apply(served_model("a", 10))
        stack.wait_for(lambda: len(stack.player.running()) == 1, "the pool's one pod running", timeout=180)
        keys = stack.wait_for(lambda: stack.get("configmap", identity.KEYS_CONFIGMAP), "the keys beside the pool")
        assert json.loads(keys["data"][identity.JWKS_KEY])["keys"]
        with httpx.Client() as client:  # the router proved the pod, the pod verified the router's token
            for _ in range(3):
                answer = stack.predict(client, "a")
                assert answer.status_code == 200, answer.text
        # the operator proved it too, and its report (asked with the operator's token) makes `a` Ready
        stack.wait_for(lambda: (stack.condition("a", "Ready") or {}).get("status") == "True", "a Ready")

        own = stack.player.running()[0]
        bare = httpx.get(f"{stack.player.url_of(own)}/status", timeout=10)  # the pod checks its callers
        assert bare.status_code == 401 and "hotset-worker" in bare.json()["error"], bare.text
        stolen = (tmp_path / "pods" / f"{cluster.namespace}-{own}-volumes" / "hotset-tokens" /
                  identity.IDENTITY_TOKEN_FILE).read_text()
        pod_labels = {k: v for k, v in stack.get("pod", own)["metadata"]["labels"].items() if k != "pod-template-hash"}
        impostor = RecordingServer(IMPOSTOR_IP, stack.worker_port,
                                   {identity.IDENTITY_PATH: identity.identity_answer("impostor", stolen)})
        try:
            stack.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "impostor", "labels": pod_labels},
                         "spec": {"schedulerName": UNSCHEDULED, "serviceAccountName": identity.WORKER_ACCOUNT,
                                  "containers": [{"name": "worker", "image": "hotset-worker:test"}]}})
            stack.kubectl("patch", "pod", "impostor", "--subresource=status", "--type=merge", "-p", json.dumps({
                "status": {"phase": "Running", "podIP": IMPOSTOR_IP, "podIPs": [{"ip": IMPOSTOR_IP}],
                           "conditions": [{"type": "Ready", "status": "True"},
                                          {"type": "ContainersReady", "status": "True"}]}}))
            stack.wait_for(lambda: metric(operator_metrics, "hotset_operator_unowned_worker_pods") == 1,
                           "the operator counting the impostor as unproven")
            stack.wait_for(lambda: metric(stack.router.url, "hotset_router_unowned_worker_pods") == 1,
                           "the router counting it too")
            passes = metric(operator_metrics, "hotset_operator_pool_passes_total")
            with httpx.Client() as client:
                for _ in range(5):
                    assert stack.predict(client, "a").status_code == 200
            stack.wait_for(lambda: metric(operator_metrics, "hotset_operator_pool_passes_total") >= passes + 4,
                           "four more pool passes with the impostor Ready")
            asked = {(method, path, auth) for method, path, auth in impostor.requests}
            assert asked == {("GET", identity.IDENTITY_PATH, "")}, asked  # no report call, no request, no token
            assert stack.pool()["spec"]["replicas"] == 1
            assert stack.player.running() == [own]
        finally:
            impostor.close()
            stack.kubectl("delete", "pod", "impostor", "--grace-period=0", "--ignore-not-found", check=False)
