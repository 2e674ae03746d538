"""A stock tritonclient.http client pointed at the router: readiness, metadata and infer (binary and JSON)."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from gateway_helpers import copies, write_ballast_store


@pytest.fixture
def router(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"scaler": {"mib": 4}})
    workers = procs.workers(store, ["100Mi", "100Mi"])
    return procs.router(workers)


def test_readiness_metadata_and_binary_infer_through_the_router(router):
    client = triton_http.InferenceServerClient(router.url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert not client.is_model_ready("scaler")  # cold: no copy anywhere yet
        metadata = client.get_model_metadata("scaler")  # a client about to infer: described from its files
        assert metadata["name"] == "scaler" and [i["name"] for i in metadata["inputs"]] == ["INPUT0"]
        assert not client.is_model_ready("scaler") and copies(router.url, "scaler") == []  # ...and nothing loaded
        data = np.array([1.0, -2.5, 4.0], dtype=np.float32)
        for binary in (True, False):
            tensor = triton_http.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data, binary_data=binary)
            result = client.infer("scaler", [tensor], outputs=[triton_http.InferRequestedOutput("OUTPUT0", binary_data=binary)])
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), data * 2)
        assert len(copies(router.url, "scaler")) == 1
        assert client.is_model_ready("scaler")
        assert [i["name"] for i in client.get_model_metadata("scaler")["inputs"]] == ["INPUT0"]  # loaded: its tensors
    finally:
        client.close()


def test_tritonclient_sees_the_workers_errors_through_the_router(router):
    client = triton_http.InferenceServerClient(router.url.removeprefix("http://"))
    try:
        tensor = triton_http.InferInput("WRONG", [2], "FP32")
        tensor.set_data_from_numpy(np.zeros(2, dtype=np.float32))
        with pytest.raises(InferenceServerException, match="INPUT0"):
            client.infer("scaler", [tensor])
        with pytest.raises(InferenceServerException, match="nope"):
            client.get_model_metadata("nope")
    finally:
        client.close()
