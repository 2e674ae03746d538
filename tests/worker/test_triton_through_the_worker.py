"""A triton model loads, infers and unloads through the worker's HTTP API against a real tritonserver."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http

from hotset_testing.worker_server import wait_until, worker_process


@pytest.fixture(scope="module")
def worker(sample_store, tritonserver):
    args = [
        "--model-store", str(sample_store), "--memory-budget", "2Gi",
        "--triton-url", tritonserver.url, "--triton-repository", str(tritonserver.repository),
    ]
    with worker_process(args) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client


def triton_index(tritonserver) -> dict[str, str]:
    entries = httpx.post(f"{tritonserver.http_url}/v2/repository/index", json={}).json()
    return {entry["name"]: entry.get("state", "") for entry in entries}


def test_load_infer_unload_and_every_view_agrees(worker, tritonserver) -> None:
    # Ready once the sidecar is ready and the store's frameworks are imported (nothing is pinned).
    wait_until(lambda: worker.get("/v2/health/ready").status_code == 200, timeout_s=60, what="worker readiness")
    assert worker.post("/v2/repository/models/iris/load").status_code == 200
    assert triton_index(tritonserver).get("iris") == "READY"  # really loaded in Triton
    assert "iris" in worker.get("/models").json()["loaded_models"]
    worker_index = {e["name"]: e["state"] for e in worker.post("/v2/repository/index").json()}
    assert worker_index["iris"] == "READY"
    assert worker.get("/v2/models/iris/ready").status_code == 200

    predicted = worker.post("/predict", json={"model_id": "iris", "input_data": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]})
    assert predicted.status_code == 200, predicted.text
    (probabilities,) = predicted.json()["predictions"].values()
    assert np.allclose(np.sum(probabilities, axis=1), 1.0, atol=1e-4)

    client = triton_http.InferenceServerClient(url=str(worker.base_url).removeprefix("http://"))
    try:
        metadata = client.get_model_metadata("iris")
        (tensor,) = metadata["inputs"]
        measurements = triton_http.InferInput(tensor["name"], [1, 4], tensor["datatype"])
        measurements.set_data_from_numpy(np.array([[5.1, 3.5, 1.4, 0.2]], dtype=np.float32))
        result = client.infer("iris", [measurements])  # binary through the worker, then on to Triton
        output = result.as_numpy(metadata["outputs"][0]["name"])
        assert output.shape == (1, 3) and abs(float(output.sum()) - 1.0) < 1e-4
    finally:
        client.close()

    assert worker.post("/v2/repository/models/iris/unload").status_code == 200
    assert triton_index(tritonserver).get("iris") != "READY"  # Triton really let it go
    assert "iris" not in worker.get("/models").json()["loaded_models"]
    worker_index = {e["name"]: e["state"] for e in worker.post("/v2/repository/index").json()}
    assert worker_index["iris"] == "UNAVAILABLE"
