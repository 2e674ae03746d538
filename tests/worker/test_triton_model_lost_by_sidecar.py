"""A Triton sidecar that restarted has lost its models: the worker loads its staged copy again.

Found by the e2e tier: after the sidecar container restarts, the worker still
counts the triton model as loaded, and every request failed with 503 until the
model was evicted. The staged folder survives in the shared volume, so the
worker reloads it once and answers.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np

from hotset_common.spec import ModelSpec
from hotset_testing.triton import TritonServer
from hotset_worker import engine
from hotset_worker.triton_backend import TritonBackend

from test_triton_worker import SETOSA, context_for, iris_copy, repository_index


def test_infer_after_the_sidecar_lost_the_model(sample_specs: dict[str, ModelSpec], tritonserver: TritonServer,
                                                triton_backend: TritonBackend, tmp_path: Path) -> None:
    _, spec = iris_copy(sample_specs, tmp_path, "iris-lost")
    worker = engine.create(spec, context_for(triton_backend))
    worker.load()
    try:
        # What a restarted sidecar looks like from the worker: Triton no longer holds the model.
        httpx.post(f"{tritonserver.http_url}/v2/repository/models/iris-lost/unload", json={}, timeout=30).raise_for_status()
        assert repository_index(tritonserver)["iris-lost"]["state"] != "READY"
        outputs = worker.infer({"measurements": np.asarray([SETOSA], dtype=np.float32)}, {})
        (probabilities,) = outputs.values()
        assert probabilities.shape == (1, 3) and np.isclose(probabilities.sum(), 1, atol=1e-4)
        assert repository_index(tritonserver)["iris-lost"]["state"] == "READY"
    finally:
        worker.unload()
