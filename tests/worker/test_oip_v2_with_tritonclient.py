"""tritonclient.http, as users run it, works against the worker: binary tensors (its default) and JSON."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    store = ballast.catalog(tmp_path_factory.mktemp("models"), {"double": {"size": MiB, "factor": 2.0}, "triple": {"size": MiB, "factor": 3.0}, "idle": {"size": MiB}})
    with serve_in_thread(ballast_app(store, budget=10 * MiB)) as url:
        client = triton_http.InferenceServerClient(url=url.removeprefix("http://"))
        try:
            yield client
        finally:
            client.close()


def input_tensor(values: np.ndarray, binary: bool) -> triton_http.InferInput:
    tensor = triton_http.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=binary)
    return tensor


def test_binary_in_binary_out_by_default(client) -> None:
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.infer("double", [input_tensor(values, binary=True)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values * 2)
    assert result.as_numpy("MODEL").tolist() == [b"double"]
    assert result.get_output("OUTPUT0")["parameters"]["binary_data_size"] == 24  # really binary


def test_json_in_json_out(client) -> None:
    values = np.array([1.5, -2.0], dtype=np.float32)
    outputs = [triton_http.InferRequestedOutput("OUTPUT0", binary_data=False), triton_http.InferRequestedOutput("MODEL", binary_data=False)]
    result = client.infer("triple", [input_tensor(values, binary=False)], outputs=outputs, request_id="r-1")
    assert result.get_output("OUTPUT0")["data"] == [4.5, -6.0]
    assert result.as_numpy("MODEL").tolist() == ["triple"]  # JSON BYTES come back as text
    assert result.get_response()["id"] == "r-1"


def test_mixed_binary_and_json_outputs_only_the_requested_ones(client) -> None:
    values = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    result = client.infer("double", [input_tensor(values, binary=True)], outputs=[triton_http.InferRequestedOutput("OUTPUT0", binary_data=True)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values * 2)
    assert result.as_numpy("MODEL") is None


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client, algorithm) -> None:
    values = np.arange(1000, dtype=np.float32)
    result = client.infer("double", [input_tensor(values, binary=True)], request_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values * 2)


def test_server_and_model_endpoints(client) -> None:
    assert client.is_server_live() and client.is_server_ready()
    client.load_model("triple")
    assert client.is_model_ready("triple")
    metadata = client.get_model_metadata("triple")
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}]
    assert [o["name"] for o in metadata["outputs"]] == ["OUTPUT0", "MODEL"]
    index = {entry["name"]: entry["state"] for entry in client.get_model_repository_index()}
    assert index["triple"] == "READY"
    client.unload_model("triple")
    assert not client.is_model_ready("triple")
    index = {entry["name"]: entry["state"] for entry in client.get_model_repository_index()}
    assert index["triple"] == "UNAVAILABLE"


def test_metadata_never_loads_a_model(client) -> None:
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data", "model_repository"]
    metadata = client.get_model_metadata("idle")
    assert metadata == {"name": "idle", "versions": ["1"], "platform": "torchvision", "inputs": [], "outputs": []}
    assert not client.is_model_ready("idle")
    assert ballast.ATTEMPTS["idle"] == 0


def test_errors_reach_the_client_with_their_message(client) -> None:
    with pytest.raises(InferenceServerException, match="'nope'"):
        client.infer("nope", [input_tensor(np.zeros(1, dtype=np.float32), binary=True)])
    wrong = triton_http.InferInput("INPUT0", [1], "INT32")
    wrong.set_data_from_numpy(np.zeros(1, dtype=np.int32))
    with pytest.raises(InferenceServerException, match="FP32"):
        client.infer("double", [wrong])
