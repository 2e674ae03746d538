"""A preemption is told on both ServedModels (seed 002: the eviction's reason names the preempting
model): a real worker, full, evicts a copy for the load of a higher-priority model; its report
carries the preemption and the operator posts an Event on each model, naming the other.

Set up as test_status_from_real_worker.py: a real ``hotset-worker`` process follows the pool's
catalog feed; a Pod object stands for it (no kubelet here; the test writes its status).
"""
from __future__ import annotations

import json

import httpx

from hotset_operator import workloads
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, \
    STAND_IN_TRUST, stand_in_pod, wait_for
from hotset_testing.processes import free_port
from hotset_testing.worker_server import REPO, worker_process
from hotset_worker import samples


def test_a_higher_priority_load_that_evicts_a_copy_is_an_event_on_both_models(cluster: Cluster) -> None:
    store = samples.generate(REPO / "build" / "models")
    sources = {m["id"]: m["source"] for m in json.loads(store.read_text())["models"]}
    port = free_port()
    config = operator_config(cluster.namespace, worker_port=port, worker_trust=STAND_IN_TRUST)
    with running_operator(config):
        cluster.apply(served_model("reports", source={"uri": sources["sentiment"]}, memory="17Mi"))
        cluster.apply(served_model("fraud", source={"uri": sources["sentiment-v2"]}, memory="17Mi", priority=100))
        stand_in_pod(cluster, "pool-pod-a")
        args = ["--catalog-url", workloads.catalog_url(config, cluster.namespace), "--min-residency-s", "0",
                "--max-models", "1"]
        with worker_process(args, env={"HOTSET_POD_NAME": "pool-pod-a", "HF_HUB_OFFLINE": "1"}, port=port) as url:
            wait_for(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, "the worker ready", timeout=60)
            for model in ("reports", "fraud"):
                wait_for(lambda: httpx.get(f"{url}/v2/models/{model}").status_code == 200, f"{model} in its catalog")
                assert httpx.post(f"{url}/v2/repository/models/{model}/load", timeout=120).status_code == 200
            assert list(httpx.get(f"{url}/models").json()["loaded_models"]) == ["fraud"]

            def told(model: str, reason: str) -> str | None:
                return next((e["message"] for e in cluster.events(model) if e["reason"] == reason), None)

            victim = wait_for(lambda: told("reports", "Preempted"), "the Preempted event on reports")
            assert victim == "its copy on pod pool-pod-a (priority 0) was evicted for the load of fraud (priority 100)"
            preemptor = wait_for(lambda: told("fraud", "Preempting"), "the Preempting event on fraud")
            assert preemptor == "its load on pod pool-pod-a (priority 100) evicted the copy of reports (priority 0)"
