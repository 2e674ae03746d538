"""tritonclient.grpc infers through the router on every sample model: each framework the HTTP OIP v2
path serves (transformers, torchvision, and a triton model run by a real tritonserver sidecar).

The local stack (scripts/local_stack.py, what ``make run`` starts) with one worker and its sidecar,
the worker and the router serving gRPC beside HTTP. A generic client builds each listed input from the metadata alone, as the
HTTP test of the same stack does (test_local_stack.py), then a few answers are checked for sense.
"""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import triton_to_np_dtype

from gateway_helpers import ROOT, copies, local_stack
from hotset_testing.grpc_clients import grpc_client
from hotset_testing.processes import free_port
from hotset_worker import samples

pytestmark = [pytest.mark.triton, pytest.mark.slow]
SAMPLES = ROOT / "build/models/model-store.json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    store = samples.generate(ROOT / "build" / "models")  # idempotent: reuses what `make install` built
    port = free_port()
    stack = local_stack.start_stack(store, workers=1, router_port=None, work_dir=tmp_path_factory.mktemp("stack"),
                                    grpc_port=port, deadline_s=180)
    try:
        yield stack, f"127.0.0.1:{port}"
    finally:
        stack.stop()


@pytest.fixture
def client(stack):
    with grpc_client(stack[1]) as client:
        yield client


def listed_inputs(metadata) -> list[triton_grpc.InferInput]:
    """Each input the metadata lists, one example (-1 dimensions as 1), filled by its datatype alone."""
    tensors = []
    for spec in metadata.inputs:
        shape = [1 if d == -1 else d for d in spec.shape]
        if spec.datatype == "BYTES":
            data = np.full(shape, b"a generic client wrote this", dtype=np.object_)
        else:
            data = np.zeros(shape, dtype=triton_to_np_dtype(spec.datatype))
        tensor = triton_grpc.InferInput(spec.name, shape, spec.datatype)
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def test_every_sample_model_answers_a_generic_grpc_client_through_the_router(stack, client) -> None:
    url = stack[0].router.url
    models = sorted(httpx.get(f"{url}/models", timeout=10).json()["available_models"])
    frameworks = {entry["framework"] for entry in json.loads(SAMPLES.read_text())["models"] if entry["id"] in models}
    assert {"transformers", "torchvision", "triton"} <= frameworks
    for model in models:
        metadata = client.get_model_metadata(model)  # described from its files: loads nothing
        assert metadata.inputs, f"{model}: metadata lists no input"
        result = client.infer(model, listed_inputs(metadata), client_timeout=180)
        for output in metadata.outputs:
            assert result.as_numpy(output.name) is not None, f"{model}: no {output.name} in the answer"


def test_a_text_classifier_answers_probabilities(client) -> None:
    metadata = client.get_model_metadata("sentiment")
    (text,) = metadata.inputs
    tensor = triton_grpc.InferInput(text.name, [2], "BYTES")
    tensor.set_data_from_numpy(np.array([b"a wonderful little model", b"awful, broken, useless"], dtype=np.object_))
    result = client.infer("sentiment", [tensor], client_timeout=180)
    answers = {o.name: result.as_numpy(o.name) for o in metadata.outputs}
    assert all(answer is not None and answer.shape[0] == 2 for answer in answers.values()), answers


def test_a_triton_model_answers_through_its_sidecar(stack, client) -> None:
    metadata = client.get_model_metadata("iris")
    (measurements_meta,) = metadata.inputs
    measurements = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
    tensor = triton_grpc.InferInput(measurements_meta.name, list(measurements.shape), measurements_meta.datatype)
    tensor.set_data_from_numpy(measurements)
    result = client.infer("iris", [tensor], client_timeout=180)
    (output_meta,) = metadata.outputs
    probabilities = result.as_numpy(output_meta.name)
    assert probabilities.shape == (2, 3) and client.is_model_ready("iris")
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-4)
    assert copies(stack[0].router.url, "iris")


def test_an_image_classifier_takes_a_float_tensor(client) -> None:
    metadata = client.get_model_metadata("colors")
    tensors = listed_inputs(metadata)
    result = client.infer("colors", tensors, client_timeout=180)
    assert all(result.as_numpy(o.name) is not None for o in metadata.outputs)
