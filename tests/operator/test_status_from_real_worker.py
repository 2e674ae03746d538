"""Status comes from what a real worker reports, and a deleted model leaves the workers.

A real `hotset-worker` process follows the catalog feed of the pool, as a
pool pod does (``HOTSET_CATALOG_URL``). A Pod object stands for it in the API
server: with no kubelet here, the test writes the pod's status (Running,
Ready, podIP 127.0.0.1) the way a kubelet would.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx

from hotset_operator import workloads
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, \
    STAND_IN_TRUST, stand_in_pod, wait_for
from hotset_testing.processes import free_port
from hotset_testing.worker_server import REPO, worker_process
from hotset_worker import samples


def test_copies_and_ready_follow_the_worker_and_delete_unloads(cluster: Cluster, tmp_path: Path) -> None:
    store = samples.generate(REPO / "build" / "models")
    source = next(m["source"] for m in json.loads(store.read_text())["models"] if m["id"] == "sentiment")
    port = free_port()
    config = operator_config(cluster.namespace, worker_port=port, worker_trust=STAND_IN_TRUST)
    with running_operator(config):
        cluster.apply(served_model("sentiment", source={"uri": source}, memory="17Mi", replicas={"min": 1, "max": 2}))
        waiting = wait_for(lambda: cluster.condition("sentiment", "Ready"), "a Ready condition")
        assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForCopies")

        stand_in_pod(cluster, "pool-pod-a")
        args = ["--catalog-url", workloads.catalog_url(config, cluster.namespace), "--min-residency-s", "0"]
        with worker_process(args, env={"HOTSET_POD_NAME": "pool-pod-a", "HF_HUB_OFFLINE": "1"}, port=port) as url:
            # Like the router: never place on a pod before it is ready, then ask it to load.
            wait_for(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, "the worker ready", timeout=60)
            wait_for(lambda: httpx.get(f"{url}/v2/models/sentiment").status_code == 200, "sentiment in its catalog")
            assert httpx.post(f"{url}/v2/repository/models/sentiment/load", timeout=120).status_code == 200
            ready = wait_for(lambda: (c := cluster.condition("sentiment", "Ready")) and c["status"] == "True" and c,
                             "Ready=True")
            assert ready["reason"] == "CopiesReady"
            status = cluster.get("servedmodel", "sentiment")["status"]
            assert status["readyReplicas"] == 1
            [copy] = status["copies"]
            assert (copy["pod"], copy["state"]) == ("pool-pod-a", "READY") and copy["bytes"] > 0

            # Deleting needs no operator round trip: the model leaves the pool's catalog, and the
            # worker unloads its idle copy by itself.
            cluster.kubectl("delete", "servedmodel", "sentiment", "--timeout=30s")
            wait_for(lambda: "sentiment" not in httpx.get(f"{url}/models").json()["loaded_models"],
                     "the copy unloaded by the worker", timeout=30)
