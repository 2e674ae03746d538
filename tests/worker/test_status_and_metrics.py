"""/status tells the router what is where; /metrics counts per model and framework; /models and the index agree."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hotset_common import wire
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_status_metrics_models_and_index_describe_the_same_state(tmp_path) -> None:
    store = ballast.catalog(
        tmp_path,
        {"a": {"size": 2 * MiB, "memory": 2 * MiB}, "b": {"size": 2 * MiB, "memory": 2 * MiB}, "c": {"size": MiB, "memory": 3 * MiB}},
    )
    with serve_in_thread(ballast_app(store, budget=4 * MiB, pod_name="pod-1")) as url, httpx.Client(base_url=url) as client:
        for model_id in ["a", "b", "a", "c"]:  # c makes room by evicting b, the least recently used
            assert client.post("/predict", json={"model_id": model_id, "input_data": [1]}).status_code == 200
        assert client.post("/predict", json={"model_id": "a", "input_data": "bad"}).status_code == 400

        status = wire.WorkerStatus.model_validate(client.get("/status").json())
        models = client.get("/models").json()
        index = client.post("/v2/repository/index").json()
        ready_only = client.post("/v2/repository/index", json={"ready": True}).json()
        metrics = samples(client.get("/metrics").text)

    assert status.pod == "pod-1" and status.ready
    assert {(c.id, c.state, c.bytes) for c in status.models} == {("a", wire.CopyState.READY, 2 * MiB), ("c", wire.CopyState.READY, MiB)}
    assert status.memory_budget_bytes == 4 * MiB and status.used_bytes == 3 * MiB and status.free_bytes == MiB
    assert {(e.id, e.memory_bytes) for e in status.catalog} == {("a", 2 * MiB), ("b", 2 * MiB), ("c", MiB)}  # c: measured wins

    assert list(models["available_models"]) == ["a", "b", "c"] and models["loaded_models"] == {"a": "a", "c": "c"}
    assert sorted(e["name"] for e in index if e["state"] == "READY") == list(models["loaded_models"])
    assert sorted(e["name"] for e in ready_only) == list(models["loaded_models"])
    assert {e["name"]: e["state"] for e in index}["b"] == "UNAVAILABLE"

    def metric(name: str, **labels: str) -> float:
        return metrics.get((name, frozenset({"pod": "pod-1", "framework": "torchvision", **labels}.items())), 0.0)

    assert metric("hotset_requests_total", model="a", code="200") == 2
    assert metric("hotset_requests_total", model="a", code="400") == 1
    assert metric("hotset_evictions_total", model="b") == 1
    assert metric("hotset_evictions_total", model="a") == 0
    assert metric("hotset_model_loads_total", model="a", result="success") == 1
    assert metric("hotset_model_bytes", model="c") == MiB
    assert ("hotset_model_bytes", frozenset({"pod": "pod-1", "framework": "torchvision", "model": "b"}.items())) not in metrics
    assert metrics[("hotset_memory_used_bytes", frozenset({"pod": "pod-1"}.items()))] == 3 * MiB
    assert metric("hotset_request_seconds_count", model="a") == 3
