"""OIP v2 infer on a loaded triton model is forwarded to the real sidecar untouched, with the worker's bookkeeping.

One worker and a tritonserver of this module's own (the last test stops it) serve
`iris` and `slow-iris` (iris whose every request takes SLOW_S seconds).
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from hotset_common import metrics as metric_names
from hotset_testing.triton import start_tritonserver
from hotset_testing.worker_server import wait_until, worker_process

SETOSA, VIRGINICA = [5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]
SLOW_S = 1.5


@pytest.fixture(scope="module")
def store(sample_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("forwarded-store")
    catalog = json.loads(sample_store.read_text())
    (iris,) = [m for m in catalog["models"] if m["id"] == "iris"]
    slow = root / "slow-iris"
    shutil.copytree(sample_store.parent / "iris", slow)
    model_py = slow / "1" / "model.py"
    model_py.write_text(model_py.read_text().replace(
        "    def execute(self, requests):\n", f"    def execute(self, requests):\n        import time; time.sleep({SLOW_S})\n", 1))
    catalog["models"] = [iris, {**iris, "id": "slow-iris", "name": "slow-iris", "source": slow.as_uri()}]
    path = root / "model-store.json"
    path.write_text(json.dumps(catalog))
    return path


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("forwarded-triton")
    server = start_tritonserver(root / "repository", log_dir=root)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def worker(store, sidecar):
    args = ["--model-store", str(store), "--memory-budget", "2Gi",
            "--triton-url", sidecar.url, "--triton-repository", str(sidecar.repository)]
    with worker_process(args) as url, httpx.Client(base_url=url, timeout=120) as client:
        wait_until(lambda: client.get("/v2/health/ready").status_code == 200, timeout_s=60, what="worker readiness")
        for model in ("iris", "slow-iris"):
            assert client.post(f"/v2/repository/models/{model}/load").status_code == 200
        yield client


def triton_client(worker: httpx.Client) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(url=str(worker.base_url).removeprefix("http://"), network_timeout=60)


def iris_infer(client: triton_http.InferenceServerClient, model: str, rows: list[list[float]], binary: bool,
               compression: str | None = None) -> np.ndarray:
    measurements = triton_http.InferInput("measurements", [len(rows), 4], "FP32")
    measurements.set_data_from_numpy(np.asarray(rows, dtype=np.float32), binary_data=binary)
    wanted = triton_http.InferRequestedOutput("species_probabilities", binary_data=binary)
    result = client.infer(model, [measurements], outputs=[wanted], request_compression_algorithm=compression,
                          response_compression_algorithm=compression)
    return result.as_numpy("species_probabilities")


def requests_counted(worker: httpx.Client, model: str, code: str) -> float:
    for family in text_string_to_metric_families(worker.get("/metrics").text):
        for sample in family.samples:
            if (sample.name == metric_names.REQUESTS_TOTAL and sample.labels.get("model") == model
                    and sample.labels.get("framework") == "triton" and sample.labels.get("code") == code):
                return sample.value
    return 0.0


@pytest.mark.parametrize(("binary", "compression"), [(True, None), (False, None), (True, "gzip"), (False, "deflate")],
                         ids=["binary", "json", "binary-gzip", "json-deflate"])
def test_tritonclient_gets_the_right_species_and_the_request_is_counted(worker, binary: bool, compression) -> None:
    # The tensor path (seed /predict) first: it once left a header in the sidecar headers it shares with forwards.
    predicted = worker.post("/predict", json={"model_id": "iris", "input_data": [SETOSA]})
    assert predicted.status_code == 200, predicted.text
    before = requests_counted(worker, "iris", "200")
    client = triton_client(worker)
    try:
        probabilities = iris_infer(client, "iris", [SETOSA, VIRGINICA], binary, compression)
    finally:
        client.close()
    assert probabilities.shape == (2, 3) and np.allclose(probabilities.sum(axis=1), 1, atol=1e-4)
    assert list(probabilities.argmax(axis=1)) == [0, 2]  # setosa, virginica
    assert requests_counted(worker, "iris", "200") == before + 1


def test_the_answer_is_tritons_own_bytes(worker, sidecar) -> None:
    body = {"inputs": [{"name": "measurements", "shape": [1, 4], "datatype": "FP32", "data": SETOSA}]}
    direct = httpx.post(f"{sidecar.http_url}/v2/models/iris/infer", json=body, timeout=30)
    through = worker.post("/v2/models/iris/versions/1/infer", json=body)
    assert through.status_code == direct.status_code == 200
    assert through.content == direct.content
    assert through.headers["content-type"] == direct.headers["content-type"]


def test_a_wrong_shape_gets_tritons_400_message(worker) -> None:
    before = requests_counted(worker, "iris", "400")
    client = triton_client(worker)
    try:
        measurements = triton_http.InferInput("measurements", [1, 3], "FP32")
        measurements.set_data_from_numpy(np.asarray([[5.1, 3.5, 1.4]], dtype=np.float32))
        with pytest.raises(InferenceServerException) as raised:
            client.infer("iris", [measurements])
    finally:
        client.close()
    assert str(raised.value.status()) == "400"
    message = raised.value.message()
    assert "measurements" in message and "shape" in message, message
    assert requests_counted(worker, "iris", "400") == before + 1


def test_a_model_serving_a_forwarded_request_is_not_unloaded_under_it(worker) -> None:
    finished: dict[str, float] = {}
    answers: list[np.ndarray] = []

    def infer() -> None:
        client = triton_client(worker)
        try:
            answers.append(iris_infer(client, "slow-iris", [VIRGINICA], binary=True))
        finally:
            client.close()
            finished["infer"] = time.monotonic()

    request = threading.Thread(target=infer)
    request.start()
    try:
        in_flight = lambda: any(c["id"] == "slow-iris" and c["inflight"] == 1 for c in worker.get("/status").json()["models"])
        wait_until(in_flight, timeout_s=10, what="slow-iris serving the forwarded request")
        assert worker.post("/v2/repository/models/slow-iris/unload").status_code == 200
        finished["unload"] = time.monotonic()
    finally:
        request.join(timeout=60)
    (probabilities,) = answers  # Triton still held the model until the answer was back
    assert int(probabilities.argmax()) == 2
    assert finished["infer"] <= finished["unload"]
    assert "slow-iris" not in worker.get("/models").json()["loaded_models"]


def test_a_model_the_sidecar_lost_is_loaded_again(worker, sidecar) -> None:
    httpx.post(f"{sidecar.http_url}/v2/repository/models/iris/unload", json={}, timeout=30).raise_for_status()
    client = triton_client(worker)
    try:
        probabilities = iris_infer(client, "iris", [SETOSA], binary=True)
    finally:
        client.close()
    assert int(probabilities.argmax()) == 0


def test_a_sidecar_that_is_down_gives_503(worker, sidecar) -> None:  # last: it stops this module's sidecar
    sidecar.stop()
    body = {"inputs": [{"name": "measurements", "shape": [1, 4], "datatype": "FP32", "data": SETOSA}]}
    answer = worker.post("/v2/models/iris/infer", json=body)
    assert answer.status_code == 503, answer.text
    assert "Triton" in answer.json()["error"]
