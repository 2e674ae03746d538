"""A seed client reads the router: ``GET /models`` for the whole cluster in the seed's shapes
(``{id: metadata}``, ``{id: name}``) with where the copies live beside them, and errors with ``detail``."""
from __future__ import annotations

import json

import httpx

from gateway_helpers import write_ballast_store


def test_models_across_pods_in_the_seed_shapes_and_errors_with_detail(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"spam": {"mib": 2}, "images": {"mib": 2}})
    catalog = json.loads(store.read_text())
    catalog["models"][0].update(name="bert-tiny-spam", version="1.0.0")  # a display name unlike the id
    store.write_text(json.dumps(catalog))
    router = procs.router(procs.workers(store, ["100Mi", "100Mi"]))

    before = httpx.get(f"{router.url}/models", timeout=10).json()
    assert before["loaded_models"] == {}
    assert before["available_models"]["spam"] | {"memory_bytes": 0, "description": ""} == {
        "id": "spam", "name": "bert-tiny-spam", "type": "tensor", "framework": "torchvision", "version": "1.0.0",
        "memory_bytes": 0, "description": ""}
    assert httpx.post(f"{router.url}/predict", json={"model_id": "spam", "input_data": [1]}, timeout=60).status_code == 200

    after = httpx.get(f"{router.url}/models", timeout=10).json()
    assert after["loaded_models"] == {"spam": "bert-tiny-spam"}  # id -> name, as the seed answers
    assert sorted(after["available_models"]) == ["images", "spam"]
    [copy] = after["copies"]["spam"]  # hotset's addition, beside the seed's two keys
    assert copy["state"] == "READY" and copy["url"] in {w.url for w in procs.started[:2]}

    unknown = httpx.post(f"{router.url}/predict", json={"model_id": "nope", "input_data": [1]}, timeout=10)
    bad = httpx.post(f"{router.url}/predict", json={"model_id": "spam", "input_data": "x"}, timeout=10)
    cold = httpx.get(f"{router.url}/v2/models/images/ready", timeout=10)
    for response, status in ((unknown, 404), (bad, 400), (cold, 503)):
        body = response.json()
        assert response.status_code == status and body["detail"] and body["error"] == body["detail"], body
