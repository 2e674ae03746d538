"""Pod readiness waits for pinned models (Triton only where a pinned model needs it); liveness waits for nothing."""
from __future__ import annotations

import httpx

from hotset_common.spec import ModelSpec
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, free_port, serve_in_thread, wait_until


def test_ready_only_once_every_pinned_model_is_loaded(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"slow-pinned": {"size": MiB, "delay": 1.0, "pinned": True}, "other": {"size": MiB}})
    with serve_in_thread(ballast_app(store, budget=10 * MiB)) as url, httpx.Client(base_url=url) as client:
        assert client.get("/v2/health/live").status_code == 200
        not_ready = client.get("/v2/health/ready")
        assert not_ready.status_code == 503 and not_ready.json()["pinned_not_loaded"] == ["slow-pinned"]
        assert client.post("/predict", json={"model_id": "other", "input_data": [1]}).status_code == 200
        wait_until(lambda: client.get("/v2/health/ready").status_code == 200, timeout_s=10, what="readiness")
        assert list(client.get("/models").json()["loaded_models"]) == ["other", "slow-pinned"]


def test_a_down_sidecar_fails_its_triton_models_only_and_the_pod_stays_ready(tmp_path) -> None:
    """A Triton crash takes out only the Triton models (issue 18): the pod's other models keep
    serving, so the pod stays in rotation; no pinned model here needs Triton."""
    store = ballast.catalog(tmp_path, {"m": {"size": MiB}})
    store.put(ModelSpec(id="tri", framework="triton", source=f"file://{tmp_path}/tri"))
    nobody_listens = f"127.0.0.1:{free_port()}"
    with serve_in_thread(ballast_app(store, budget=10 * MiB, triton_url=nobody_listens)) as url, httpx.Client(base_url=url) as client:
        assert client.get("/v2/health/live").status_code == 200
        ready = client.get("/v2/health/ready")
        assert ready.status_code == 200 and ready.json()["triton_ready"] is False
        assert ready.json()["down"] == ["triton"]
        assert client.post("/predict", json={"model_id": "m", "input_data": [1]}).status_code == 200  # not a triton model
        down = client.post("/predict", json={"model_id": "tri", "input_data": [1]})
        assert down.status_code == 503 and "not ready" in down.json()["error"]
        status = client.get("/status").json()
        assert status["ready"] is True and status["triton_ready"] is False


def test_a_model_pinned_after_start_is_loaded_and_then_the_pod_is_ready_again(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"first": {"size": MiB}})
    app = ballast_app(store, budget=10 * MiB)
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        assert client.get("/v2/health/ready").status_code == 200
        late = ballast.catalog(tmp_path / "late", {"late": {"size": MiB, "pinned": True}})
        store.put(late.get("late"))  # the store gained a pinned model (e.g. a new ServedModel)
        assert client.get("/v2/health/ready").json()["pinned_not_loaded"] == ["late"]
        wait_until(lambda: client.get("/v2/health/ready").status_code == 200, timeout_s=15, what="the late pinned model")
        assert "late" in client.get("/models").json()["loaded_models"]
