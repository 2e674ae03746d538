"""Status comes from what a real worker reports, and the finalizer really unloads.

A real `modelplane-worker` process reads the model store the operator published
(the ConfigMap's models.json, as a pod would mount it). A Pod object stands for
it in the API server: with no kubelet here, the test writes the pod's status
(Running, Ready, podIP 127.0.0.1) the way a kubelet would.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx

from modelplane_common import labels
from modelplane_testing.operator_harness import Cluster, operator_config, running_operator, served_model, wait_for
from modelplane_testing.worker_server import REPO, worker_process
from modelplane_worker import samples


def _stand_in_pod(cluster: Cluster, name: str) -> None:
    pod_labels = {labels.PART_OF: labels.PROJECT, labels.COMPONENT: labels.WORKER, labels.POOL: labels.SHARED_POOL}
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": pod_labels},
                   "spec": {"containers": [{"name": "modelplane-worker", "image": "worker:test"}]}})
    status = {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                         "conditions": [{"type": "Ready", "status": "True"}]}}
    cluster.kubectl("patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))


def test_copies_and_ready_follow_the_worker_and_delete_unloads(cluster: Cluster, tmp_path: Path) -> None:
    store = samples.generate(REPO / "build" / "models")
    source = next(m["source"] for m in json.loads(store.read_text())["models"] if m["id"] == "sentiment")
    config = operator_config(cluster.namespace)
    with running_operator(config):
        cluster.apply(served_model("sentiment", source={"uri": source}, memory="17Mi", replicas={"min": 1, "max": 2}))
        waiting = wait_for(lambda: cluster.condition("sentiment", "Ready"), "a Ready condition")
        assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForCopies")
        published = wait_for(lambda: (cluster.get("configmap", config.model_store_configmap) or {}).get("data"),
                             "the published model store")

    store_file = tmp_path / "models.json"
    store_file.write_text(published["models.json"])
    _stand_in_pod(cluster, "pool-pod-a")
    with worker_process(["--model-store", str(store_file), "--min-residency-s", "0"],
                        env={"MODELPLANE_POD_NAME": "pool-pod-a", "HF_HUB_OFFLINE": "1"}) as url:
        # Like the router: never place on a pod before it is ready, then ask it to load.
        wait_for(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, "the worker ready", timeout=60)
        assert httpx.post(f"{url}/v2/repository/models/sentiment/load", timeout=120).status_code == 200
        with running_operator(operator_config(cluster.namespace, worker_port=int(url.rsplit(":", 1)[1]))):
            ready = wait_for(lambda: (c := cluster.condition("sentiment", "Ready")) and c["status"] == "True" and c,
                             "Ready=True")
            assert ready["reason"] == "CopiesReady"
            status = cluster.get("servedmodel", "sentiment")["status"]
            assert status["readyReplicas"] == 1
            [copy] = status["copies"]
            assert (copy["pod"], copy["state"]) == ("pool-pod-a", "READY") and copy["bytes"] > 0

            cluster.kubectl("delete", "servedmodel", "sentiment", "--timeout=30s")
            assert "sentiment" not in httpx.get(f"{url}/models").json()["loaded_models"]
            wait_for(lambda: "Unloaded" in {e["reason"] for e in cluster.events("sentiment")}, "an Unloaded event")
