"""The real ``hotset-worker`` CLI serves the real sample models (transformers, torchvision) over HTTP."""
from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from PIL import Image

from hotset_common.eviction import choose_victims, evictable, policy_of
from hotset_common.wire import WorkerStatus
from hotset_testing.worker_server import REPO, worker_process
from hotset_worker import samples


@pytest.fixture(scope="module")
def worker():
    store = samples.generate(REPO / "build" / "models")  # idempotent: reuses what `make install` built
    # Admission control off: every load here evicts, so the victim can be checked (test_admission_queue covers it).
    args = ["--model-store", str(store), "--max-models", "2", "--min-residency-s", "0", "--admission-control", "off"]
    with worker_process(args, env={"HOTSET_MEMORY_BUDGET": "2Gi", "HOTSET_POD_NAME": "real-pod", "HF_HUB_OFFLINE": "1"}) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


def png(color: tuple[int, int, int]) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (48, 48), color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_text_and_image_models_answer_and_the_policys_victim_is_evicted(worker) -> None:
    text = worker.post("/predict", json={"model_id": "sentiment", "input_data": ["a great film", "dull"]})
    assert text.status_code == 200, text.text
    rows = text.json()["predictions"]
    assert len(rows) == 2 and {row["label"] for row in rows} <= set(rows[0]["probabilities"])
    assert sum(rows[0]["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)

    image = worker.post("/predict", json={"model_id": "colors", "input_data": png((255, 0, 0))})
    assert image.status_code == 200, image.text
    assert len(image.json()["predictions"][0]["probabilities"]) == 5
    assert list(worker.get("/models").json()["loaded_models"]) == ["colors", "sentiment"]

    report = worker.get("/status").json()
    assert (report["pod"], report["memory_budget_bytes"], report["max_models"]) == ("real-pod", 2 * 2**30, 2)  # from env and flags
    status = {copy["id"]: copy for copy in report["models"]}
    assert status["sentiment"]["bytes"] > 0 and status["colors"]["bytes"] > 0  # measured, not the estimate

    # The victim is the one the shared cost model names from this report (the router plans the same way).
    before = WorkerStatus.model_validate(report)
    victim = choose_victims(policy_of(before), evictable(before), bytes_needed=0, slots_needed=1)[0].model_id
    embed = worker.post("/predict", json={"model_id": "mini-embed", "input_data": "hello"})
    assert embed.status_code == 200, embed.text
    vector = np.array(embed.json()["predictions"][0]["embedding"])
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-4)
    assert sorted(worker.get("/models").json()["loaded_models"]) == sorted({"colors", "sentiment", "mini-embed"} - {victim})


def test_tritonclient_infers_text_with_binary_bytes_tensors(worker) -> None:
    client = triton_http.InferenceServerClient(url=str(worker.base_url).removeprefix("http://"))
    try:
        text = triton_http.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array([b"wonderful", b"awful"], dtype=np.object_))
        result = client.infer("sentiment", [text])
        probabilities = result.as_numpy("probabilities")
        assert probabilities.shape == (2, 2) and probabilities.dtype == np.float32
        np.testing.assert_allclose(probabilities.sum(axis=1), [1.0, 1.0], atol=1e-5)
        metadata = client.get_model_metadata("sentiment")
        assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    finally:
        client.close()


def test_an_undecodable_image_is_400_and_the_model_keeps_serving(worker) -> None:
    bad = worker.post("/predict", json={"model_id": "colors", "input_data": base64.b64encode(b"not an image").decode()})
    assert bad.status_code == 400 and "decode image" in bad.json()["error"]
    good = worker.post("/predict", json={"model_id": "colors", "input_data": png((0, 0, 255))})
    assert good.status_code == 200
