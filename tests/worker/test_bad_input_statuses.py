"""Every kind of bad input gets its own status and a message naming the problem, over real HTTP."""
from __future__ import annotations

import gzip
import json

import httpx
import pytest

from hotset_common.spec import ModelSpec
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    store = ballast.catalog(
        root,
        {
            "a": {"size": MiB, "memory": MiB},
            "b": {"size": MiB, "memory": MiB},
            "corrupt": {"corrupt": True, "memory": MiB},
            "missing": {"missing": True, "memory": MiB},
            "huge": {"size": MiB, "memory": 100 * MiB},
            "pinned": {"size": 1024, "pinned": True},
        },
    )
    store.put(ModelSpec(id="tri", framework="triton", source=f"file://{root}/tri"))
    with serve_in_thread(ballast_app(store, budget=3 * MiB, max_body_bytes=4096)) as url:
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.post("/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200
            yield client


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]


def infer_body(datatype: str = "FP32", shape=(2,), data=(1.0, 2.0)) -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": list(shape), "data": list(data)}]}


def test_unknown_model_is_404_naming_it(worker) -> None:
    assert "'nope'" in error_of(worker.post("/predict", json={"model_id": "nope", "input_data": [1]}), 404)
    assert "'nope'" in error_of(worker.post("/v2/models/nope/infer", json=infer_body()), 404)
    assert "'nope'" in error_of(worker.get("/v2/models/nope"), 404)
    assert "'nope'" in error_of(worker.post("/v2/repository/models/nope/load"), 404)


def test_unknown_version_is_404(worker) -> None:
    assert "version '7'" in error_of(worker.post("/v2/models/a/versions/7/infer", json=infer_body()), 404)


def test_malformed_json_is_422(worker) -> None:
    message = error_of(worker.post("/predict", content=b'{"model_id": "a", ', headers={"content-type": "application/json"}), 422)
    assert "JSON" in message
    assert "JSON" in error_of(worker.post("/v2/models/a/infer", content=b"not json"), 422)


def test_missing_field_is_422_naming_it(worker) -> None:
    assert "input_data" in error_of(worker.post("/predict", json={"model_id": "a"}), 422)
    assert "inputs" in error_of(worker.post("/v2/models/a/infer", json={"id": "1"}), 422)
    assert "shape" in error_of(worker.post("/v2/models/a/infer", json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1]}]}), 422)


def test_wrong_input_data_is_400(worker) -> None:
    assert "list of numbers" in error_of(worker.post("/predict", json={"model_id": "a", "input_data": "text"}), 400)


def test_wrong_tensor_shape_is_400_naming_the_tensor(worker) -> None:
    message = error_of(worker.post("/v2/models/a/infer", json=infer_body(shape=(3,))), 400)
    assert "'INPUT0'" in message and "3 elements" in message


def test_wrong_tensor_dtype_is_400(worker) -> None:
    assert "FP32" in error_of(worker.post("/v2/models/a/infer", json=infer_body(datatype="INT32", data=(1, 2))), 400)
    assert "'FP99'" in error_of(worker.post("/v2/models/a/infer", json=infer_body(datatype="FP99")), 400)
    assert "not FP32" in error_of(worker.post("/v2/models/a/infer", json=infer_body(data=("x", "y"))), 400)


def test_binary_sizes_that_do_not_add_up_are_400(worker) -> None:
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}).encode()
    short = worker.post("/v2/models/a/infer", content=header + b"\0" * 4, headers={"Inference-Header-Content-Length": str(len(header))})
    assert "runs past the end" in error_of(short, 400)
    bad_length = worker.post("/v2/models/a/infer", content=header, headers={"Inference-Header-Content-Length": "99999"})
    assert "Inference-Header-Content-Length" in error_of(bad_length, 400)


def test_a_body_over_the_limit_is_413(worker) -> None:
    big = {"model_id": "a", "input_data": [1.0] * 2000}
    assert "limit of 4096 bytes" in error_of(worker.post("/predict", json=big), 413)
    assert worker.post("/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200


def test_a_compressed_body_that_inflates_past_the_limit_is_413(worker) -> None:
    bomb = gzip.compress(json.dumps(infer_body(shape=(5000,), data=[0.0] * 5000)).encode())
    assert len(bomb) < 4096
    assert "decompressed" in error_of(worker.post("/v2/models/a/infer", content=bomb, headers={"content-encoding": "gzip"}), 413)
    assert "not valid gzip" in error_of(worker.post("/v2/models/a/infer", content=b"junk", headers={"content-encoding": "gzip"}), 400)


def test_a_corrupt_or_missing_model_is_500_with_its_cause_and_the_cache_unchanged(worker) -> None:
    before = worker.get("/models").json()["loaded_models"]
    assert "corrupt" in error_of(worker.post("/predict", json={"model_id": "corrupt", "input_data": [1]}), 500)
    assert "is missing" in error_of(worker.post("/v2/repository/models/missing/load"), 500)
    assert worker.get("/models").json()["loaded_models"] == before
    assert worker.post("/predict", json={"model_id": "a", "input_data": [3]}).json()["predictions"]["scaled"] == [6.0]
    index = {entry["name"]: entry for entry in worker.post("/v2/repository/index").json()}
    assert index["corrupt"]["state"] == "UNAVAILABLE" and "corrupt" in index["corrupt"]["reason"]


def test_a_model_larger_than_the_budget_is_507_and_evicts_nothing(worker) -> None:
    before = worker.get("/models").json()["loaded_models"]
    assert "whole memory budget" in error_of(worker.post("/predict", json={"model_id": "huge", "input_data": [1]}), 507)
    assert worker.get("/models").json()["loaded_models"] == before


def test_a_triton_model_without_a_sidecar_is_503_and_others_keep_working(worker) -> None:
    response = worker.post("/predict", json={"model_id": "tri", "input_data": [1]})
    assert "Triton sidecar" in error_of(response, 503)
    assert "Retry-After" in response.headers
    assert worker.post("/predict", json={"model_id": "a", "input_data": [1]}).status_code == 200
    assert worker.get("/v2/health/ready").status_code == 200  # no sidecar configured: readiness does not wait for one
    assert worker.get("/status").json()["triton_ready"] is False  # ...but triton models cannot run here


def test_unloading_a_pinned_model_is_409(worker) -> None:
    assert "pinned" in error_of(worker.post("/v2/repository/models/pinned/unload"), 409)
