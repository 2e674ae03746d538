"""Only pods of the operator's Deployments are workers to the router (hotset_common.worker_ownership).

On the session's real control plane (kube-apiserver with its controller
manager: the Deployment and ReplicaSet controllers make the pods). Three
ready pods carry the worker labels:

- a pod of a Deployment labelled ``managed-by=hotset-operator``: a real
  worker process on its loopback "pod IP";
- a pod somebody created by hand with the worker labels;
- a pod of a look-alike Deployment with the worker labels but not the
  operator's label.

The last two are impostors: each IP runs a recording HTTP server (a stand-in
for a pod that would read prompts and forge answers). The router in its
default trust sends them nothing, counts them in
``hotset_router_unowned_worker_pods``, and serves through the owned pod.
"""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from hotset_testing.recording_server import RecordingServer
from gateway_helpers import BALLAST_LAUNCHER, local_stack, wait_for, worker_metric, write_ballast_store
from test_cluster_discovery import SELECTOR, free_port_on, make_pod, set_ready

pytestmark = [pytest.mark.kube, pytest.mark.slow]
NAMESPACE = "default"
OWNED_IP, HAND_MADE_IP, LOOKALIKE_IP = "127.0.0.71", "127.0.0.72", "127.0.0.73"
UNSCHEDULED = "hotset-test-unscheduled"  # a scheduler nobody runs: no kubelet here, the test plays it


def deployment(name: str, operator_label: bool) -> dict[str, Any]:
    pod_labels = {"app.kubernetes.io/part-of": "hotset", "app.kubernetes.io/component": "worker",
                  "hotset.io/pool": "shared", "hotset-test/deployment": name}
    meta_labels = dict(pod_labels)
    if operator_label:
        meta_labels["app.kubernetes.io/managed-by"] = "hotset-operator"
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": meta_labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": pod_labels},
                     "template": {"metadata": {"labels": pod_labels},
                                  "spec": {"schedulerName": UNSCHEDULED,
                                           "containers": [{"name": "worker", "image": "hotset-worker:test"}]}}}}


def pod_of(core, deployment_name: str) -> str:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"hotset-test/deployment={deployment_name}").items
    return pods[0].metadata.name if pods else ""


@pytest.fixture
def pods(kube_cluster, procs, tmp_path):
    """The owned worker, the two impostors' recording servers, and the three Pod objects, Ready."""
    from kubernetes import client, config

    api = config.new_client_from_config(str(kube_cluster.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    port = free_port_on(OWNED_IP, HAND_MADE_IP, LOOKALIKE_IP)
    store = write_ballast_store(tmp_path, {"m": {"mib": 4}})
    worker = local_stack.start_worker("owned-worker", store, procs.log_dir, "50Mi", port=port, host=OWNED_IP,
                                      extra_args=["--min-residency-s", "0"], launcher=BALLAST_LAUNCHER)
    procs.started.append(worker)
    impostors = [RecordingServer(HAND_MADE_IP, port), RecordingServer(LOOKALIKE_IP, port)]
    try:
        local_stack.wait_http(worker, "/v2/health/ready", 90)
        apps.create_namespaced_deployment(NAMESPACE, deployment("owned-pool", operator_label=True))
        apps.create_namespaced_deployment(NAMESPACE, deployment("lookalike", operator_label=False))
        owned = wait_for(lambda: pod_of(core, "owned-pool"), "the owned Deployment's pod", 60)
        lookalike = wait_for(lambda: pod_of(core, "lookalike"), "the look-alike Deployment's pod", 60)
        make_pod(core, "hand-made-worker", None)  # the worker labels, no owner
        for name, ip in ((owned, OWNED_IP), (lookalike, LOOKALIKE_IP), ("hand-made-worker", HAND_MADE_IP)):
            set_ready(core, name, ip, True)
        yield port, impostors
    finally:
        for impostor in impostors:
            impostor.close()
        for name in ("owned-pool", "lookalike"):
            try:
                apps.delete_namespaced_deployment(name, NAMESPACE, propagation_policy="Foreground")
            except client.ApiException:
                pass
        try:
            core.delete_namespaced_pod("hand-made-worker", NAMESPACE, grace_period_seconds=0)
        except client.ApiException:
            pass
        api.close()


def test_the_router_sends_nothing_to_labelled_pods_the_operator_did_not_make(kube_cluster, pods, procs):
    port, impostors = pods
    router = procs.router([], args=["--cluster", "--kubeconfig", str(kube_cluster.kubeconfig), "--namespace",
                                    NAMESPACE, "--worker-selector", SELECTOR, "--worker-port", str(port)],
                          urls=["unused"])
    wait_for(lambda: worker_metric(router.url, "hotset_router_unowned_worker_pods") == 2,
             "both impostors counted as unowned", 60)
    wait_for(lambda: httpx.get(f"{router.url}/v2/health/ready", timeout=5).status_code == 200, "a ready pod", 60)
    for value in range(5):  # cold, then warm: every request lands on the owned pod
        answer = httpx.post(f"{router.url}/predict", json={"model_id": "m", "input_data": [value]}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["predictions"]["scaled"] == [2.0 * value]
    listed = httpx.get(f"{router.url}/router/pods", timeout=10).json()
    assert [p["url"] for p in listed] == [f"http://{OWNED_IP}:{port}"], listed
    # The router has asked the owned pod for its status every second all along; the impostors never.
    assert [r for impostor in impostors for r in impostor.requests] == []
