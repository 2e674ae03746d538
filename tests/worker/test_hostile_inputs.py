"""Hostile requests to a worker get a 4xx naming the problem, and the worker keeps serving.

Each case was a finding of a review (issue 11): a shape that made numpy raise outside the
checks (500), NaN outputs written as bare ``NaN`` (not JSON), gzip ``/predict`` bodies, large
JSON tensors decoded on the event loop (status polls starved past the router's timeout).
"""
from __future__ import annotations

import concurrent.futures
import gzip
import json
import struct
import time

import httpx
import pytest

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    store = ballast.catalog(root, {"a": {"size": MiB, "memory": MiB}})
    with serve_in_thread(ballast_app(store, budget=8 * MiB)) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client


def strict_json(text: str | bytes):
    """JSON as RFC 8259 defines it: no NaN or Infinity tokens."""
    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def still_serving(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").status_code == 200
    answer = client.post("/predict", json={"model_id": "a", "input_data": [1.0]})
    assert answer.status_code == 200 and answer.json()["predictions"]["scaled"] == [2.0]


@pytest.mark.parametrize("shape", [[0, 10**20], [10**20, 0], [0] * 40])
def test_a_shape_numpy_cannot_hold_is_400_naming_the_tensor(worker, shape) -> None:
    answer = worker.post("/v2/models/a/infer", json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": []}]})
    assert answer.status_code == 400, answer.text
    assert "'INPUT0'" in answer.json()["error"] and "shape" in answer.json()["error"]
    still_serving(worker)


def test_a_binary_tensor_with_an_impossible_shape_is_400(worker) -> None:
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [0, 10**20],
                                     "parameters": {"binary_data_size": 0}}]}).encode()
    answer = worker.post("/v2/models/a/infer", content=header, headers={"Inference-Header-Content-Length": str(len(header))})
    assert answer.status_code == 400, answer.text
    still_serving(worker)


def test_nan_and_infinite_outputs_are_valid_json(worker) -> None:
    values = [float("nan"), float("inf"), 1.5]
    raw = struct.pack("<3f", *values)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3],
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "OUTPUT0"}]}).encode()
    answer = worker.post("/v2/models/a/infer", content=header + raw,
                         headers={"Inference-Header-Content-Length": str(len(header))})
    assert answer.status_code == 200, answer.text
    (output,) = strict_json(answer.content)["outputs"]
    assert output["data"] == [None, None, 3.0]


def test_a_gzip_predict_body_is_read(worker) -> None:
    body = gzip.compress(json.dumps({"model_id": "a", "input_data": [2.0]}).encode())
    answer = worker.post("/predict", content=body, headers={"content-encoding": "gzip", "content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"]["scaled"] == [4.0]


def test_large_json_tensors_are_decoded_off_the_event_loop(worker) -> None:
    """Four 8 MB JSON tensors at once: the worker's own /status (what the router polls, with a 2 s
    timeout) keeps answering promptly while they are decoded and encoded."""
    rows = [[1.2345678] * 800 for _ in range(1000)]
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [800_000],
                                   "data": rows}], "outputs": [{"name": "OUTPUT0"}]}).encode()
    assert len(body) > 8 * 10**6

    def infer() -> int:
        with httpx.Client(base_url=str(worker.base_url), timeout=120) as client:
            return client.post("/v2/models/a/infer", content=body, headers={"content-type": "application/json"}).status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(infer) for _ in range(4)]
        slowest = 0.0
        while not all(f.done() for f in futures):
            started = time.perf_counter()
            assert worker.get("/status").status_code == 200
            slowest = max(slowest, time.perf_counter() - started)
        assert [f.result() for f in futures] == [200] * 4
    assert slowest < 1.0, f"/status took {slowest:.2f}s while bodies were decoded"


@pytest.fixture(scope="module")
def real_models(sample_specs):
    """The real sample models (transformers sentiment, torchvision colors) behind a real worker app."""
    from hotset_worker import api, engine
    from hotset_worker.backends import Backends
    from hotset_worker.frameworks.base import WorkerContext
    from hotset_worker.manager import ModelManager
    from hotset_worker.metrics import WorkerMetrics
    from hotset_worker.store import MemoryModelStore

    store = MemoryModelStore([sample_specs["sentiment"], sample_specs["colors"]])
    backends = Backends([])
    metrics = WorkerMetrics("p", 2**31)
    manager = ModelManager(store, WorkerContext(), 2**31, observer=metrics, create_worker=engine.create)
    with serve_in_thread(api.create_app(manager, metrics, backends, pod_name="p", load_pinned=False)) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


def infer_ms(answer: httpx.Response) -> float:
    timing = dict(part.strip().split(";dur=") for part in answer.headers["Server-Timing"].split(","))
    return float(timing["infer"])


def test_a_huge_text_is_cut_before_tokenizing_not_tokenized_whole(real_models) -> None:
    """4 MiB of text took 6.7 s (tokenized whole, under the model's lock) for 512 tokens kept."""
    words = "a wonderful little model " * (4 * 2**20 // 25)
    short = real_models.post("/predict", json={"model_id": "sentiment", "input_data": words[:4096]})
    huge = real_models.post("/predict", json={"model_id": "sentiment", "input_data": words})
    assert short.status_code == huge.status_code == 200, huge.text
    assert huge.json()["predictions"] == short.json()["predictions"]  # the model keeps the start only anyway
    assert infer_ms(huge) < 10 * infer_ms(short) + 200, (infer_ms(huge), infer_ms(short))


def png(width: int, height: int) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (255, 0, 0)).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode()


def test_images_that_add_up_past_the_request_budget_are_400_before_decoding(real_models) -> None:
    big = png(6000, 6000)  # 36 Mpx: under the per-image limit
    answer = real_models.post("/predict", json={"model_id": "colors", "input_data": [big, big]})
    assert answer.status_code == 400, answer.text
    assert "72000000 pixels" in answer.json()["error"] and "per request" in answer.json()["error"]
    one = real_models.post("/predict", json={"model_id": "colors", "input_data": [big]})
    assert one.status_code == 200 and one.json()["predictions"][0]["label"] == "red"
