"""The README's main command: router + two workers, each with its own real tritonserver, and the sample models.

Starts the stack through scripts/local_stack.py's ``start_stack`` (what
``make run`` runs), sends requests through the router with plain HTTP and
with a stock tritonclient (a Triton-side model served by a real
tritonserver), and checks that stopping the stack ends every process.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import triton_to_np_dtype

from gateway_helpers import ROOT, copies, local_stack

pytestmark = [pytest.mark.triton, pytest.mark.slow]
SAMPLES = ROOT / "build/models/model-store.json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not SAMPLES.exists():
        pytest.fail(f"{SAMPLES} is missing: run `.venv/bin/hotset-samples --out build/models` (make install does)")
    stack = local_stack.start_stack(SAMPLES, workers=2, router_port=None, work_dir=tmp_path_factory.mktemp("stack"),
                                    deadline_s=180)
    try:
        yield stack
    finally:
        stack.stop()
        for pid in stack.pids:
            assert not pid_alive(pid), f"pid {pid} still running after stop()"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sample_models_are_served_through_the_router_and_models_shows_where(stack):
    url = stack.router.url
    response = httpx.post(f"{url}/predict", json={"model_id": "sentiment", "input_data": "a wonderful little model"}, timeout=120)
    assert response.status_code == 200, response.text
    prediction = response.json()["predictions"][0]
    assert prediction["label"] in ("positive", "negative")
    assert abs(sum(prediction["probabilities"].values()) - 1.0) < 1e-4
    report = httpx.get(f"{url}/models", timeout=10).json()
    assert {"sentiment", "iris", "colors"} <= set(report["available_models"])
    assert report["loaded_models"] == {"sentiment": "sentiment"}  # the seed's shape: {id: name}
    assert len(copies(url, "sentiment")) == 1


def every_listed_input(metadata: dict) -> list[triton_http.InferInput]:
    """What a generic client (perf_analyzer, a script driven by metadata) sends: each listed input,
    one example (-1 dimensions as 1), filled by its datatype alone."""
    tensors = []
    for spec in metadata["inputs"]:
        shape = [1 if d == -1 else d for d in spec["shape"]]
        if spec["datatype"] == "BYTES":
            data = np.full(shape, b"a generic client wrote this", dtype=np.object_)
        else:
            data = np.zeros(shape, dtype=triton_to_np_dtype(spec["datatype"]))
        tensor = triton_http.InferInput(spec["name"], shape, spec["datatype"])
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def test_a_client_that_builds_every_listed_input_gets_an_answer_from_every_sample_model(stack):
    """OIP metadata lists exactly what infer needs: no alternatives a client would send together."""
    models = sorted(httpx.get(f"{stack.router.url}/models", timeout=10).json()["available_models"])
    assert {"colors", "iris", "sentiment"} <= set(models)
    client = triton_http.InferenceServerClient(stack.router.url.removeprefix("http://"), network_timeout=120)
    try:
        for model in models:
            metadata = client.get_model_metadata(model)  # described from the model's files: loads nothing
            assert metadata["inputs"], f"{model}: metadata lists no input"
            result = client.infer(model, every_listed_input(metadata))  # a 400 raises here, naming the model
            for output in metadata["outputs"]:
                assert result.as_numpy(output["name"]) is not None, f"{model}: no {output['name']} in the answer"
    finally:
        client.close()


def test_tritonclient_infers_a_triton_model_through_the_router(stack):
    client = triton_http.InferenceServerClient(stack.router.url.removeprefix("http://"), network_timeout=120)
    try:
        assert client.is_server_ready()
        metadata = client.get_model_metadata("iris")  # described from its config.pbtxt, loaded or not
        (input_meta,) = metadata["inputs"]
        measurements = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
        tensor = triton_http.InferInput(input_meta["name"], list(measurements.shape), input_meta["datatype"])
        tensor.set_data_from_numpy(measurements)
        result = client.infer("iris", [tensor])
        (output_meta,) = metadata["outputs"]
        probabilities = result.as_numpy(output_meta["name"])
        assert probabilities.shape == (2, 3) and client.is_model_ready("iris")
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-4)
    finally:
        client.close()
    (holder,) = copies(stack.router.url, "iris")
    worker = next(w for w in stack.workers if w.name == holder)
    index = httpx.post(f"{worker.url}/v2/repository/index", timeout=10).json()
    assert {"name": "iris", "state": "READY"}.items() <= next(e for e in index if e["name"] == "iris").items()


def test_the_readmes_openai_example_runs_against_the_local_stack(stack):
    """The README's `openai` client example, run as written (the stack's port in place of 8080)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (example,) = [block for block in blocks if "OpenAI(" in block]
    code = example.replace("http://127.0.0.1:8080", stack.router.url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["the sky is blue.", "hello! how can i help you today?"]
