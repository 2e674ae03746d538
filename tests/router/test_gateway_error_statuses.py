"""Every error status the gateway answers, with a message naming the problem, against real workers."""
from __future__ import annotations

import time

import httpx
import pytest

from gateway_helpers import copies, write_ballast_store

TOKEN = "s3cret-admin-token"


@pytest.fixture(scope="module")
def stack(module_procs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    store = write_ballast_store(folder, {
        "ok": {"mib": 4}, "slow": {"mib": 4, "delay": 3.0}, "too-big": {"mib": 80}, "slow-answer": {"mib": 4, "predict_delay": 3.0},
    })
    workers = module_procs.workers(store, ["50Mi", "50Mi"])
    open_router = module_procs.router(workers, args=["--max-body-bytes", "2000", "--request-timeout", "1.0"])
    admin_router = module_procs.router(workers, args=["--admin-token", TOKEN])
    return open_router, admin_router


def test_unknown_model_is_404_naming_it(stack):
    router, _ = stack
    response = httpx.post(f"{router.url}/predict", json={"model_id": "no-such-model", "input_data": [1]})
    assert response.status_code == 404 and "no-such-model" in response.json()["error"]
    response = httpx.post(f"{router.url}/v2/models/no-such-model/infer", json={"inputs": []})
    assert response.status_code == 404 and "no-such-model" in response.json()["error"]


def test_no_capacity_anywhere_is_503_with_retry_after(stack):
    router, _ = stack
    response = httpx.post(f"{router.url}/predict", json={"model_id": "too-big", "input_data": [1]})
    assert response.status_code == 503
    assert "too-big" in response.json()["error"] and "room" in response.json()["error"]
    assert int(response.headers["retry-after"]) > 0


def test_a_load_longer_than_the_requests_deadline_is_503_with_retry_after(stack):
    router, _ = stack
    started = time.monotonic()
    response = httpx.post(f"{router.url}/predict", json={"model_id": "slow", "input_data": [1]}, timeout=30)
    assert response.status_code == 503 and "deadline" in response.json()["error"] and "slow" in response.json()["error"]
    assert int(response.headers["retry-after"]) >= 1
    assert time.monotonic() - started < 2.5  # answered at the 1 s deadline, not after the 3 s load


def test_an_inference_longer_than_the_deadline_is_504(stack):
    router, _ = stack
    response = httpx.post(f"{router.url}/predict", json={"model_id": "slow-answer", "input_data": [1]}, timeout=30)
    assert response.status_code == 504 and "did not answer" in response.json()["error"]


def test_bad_input_passes_through_with_the_workers_4xx(stack):
    router, _ = stack
    response = httpx.post(f"{router.url}/predict", json={"model_id": "ok", "input_data": "not numbers"})
    assert response.status_code == 400
    # Readable by a seed client (FastAPI's `detail`) and by one that reads `error`.
    assert response.json() == {"detail": "input_data must be a list of numbers", "error": "input_data must be a list of numbers"}


def test_malformed_requests_are_422_naming_the_field(stack):
    router, _ = stack
    response = httpx.post(f"{router.url}/predict", json={"input_data": [1]})
    assert response.status_code == 422 and "model_id" in response.json()["error"]
    response = httpx.post(f"{router.url}/predict", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422 and "JSON" in response.json()["error"]


def test_oversized_body_is_413(stack):
    router, _ = stack
    response = httpx.post(f"{router.url}/predict", json={"model_id": "ok", "input_data": [1] * 5000})
    assert response.status_code == 413 and "2000" in response.json()["error"]


def test_load_and_unload_need_the_admin_token(stack):
    open_router, admin_router = stack
    response = httpx.post(f"{open_router.url}/v2/repository/models/ok/load")
    assert response.status_code == 403 and "--admin-token" in response.json()["error"]
    response = httpx.post(f"{admin_router.url}/v2/repository/models/ok/load")
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    response = httpx.post(f"{admin_router.url}/v2/repository/models/ok/unload", headers={"Authorization": "Bearer wrong"})
    assert response.status_code == 401

    auth = {"Authorization": f"Bearer {TOKEN}"}
    response = httpx.post(f"{admin_router.url}/v2/repository/models/ok/load", headers=auth, timeout=30)
    assert response.status_code == 200 and len(response.json()["pods"]) == 1
    assert len(copies(admin_router.url, "ok")) == 1
    response = httpx.post(f"{admin_router.url}/v2/repository/models/ok/unload", headers=auth, timeout=30)
    assert response.status_code == 200
    assert copies(admin_router.url, "ok") == []


def test_no_reachable_worker_is_503(module_procs):
    router = module_procs.router([], urls=["http://127.0.0.1:9"], wait_ready=False)
    assert httpx.get(f"{router.url}/v2/health/ready").status_code == 503
    response = httpx.post(f"{router.url}/predict", json={"model_id": "ok", "input_data": [1]})
    assert response.status_code == 503 and "no worker" in response.json()["error"]
    assert "retry-after" in response.headers


def test_router_metrics_count_requests_by_model_and_code(stack):
    from prometheus_client.parser import text_string_to_metric_families

    _, router = stack  # a router no other test sent requests to
    for _ in range(3):
        assert httpx.post(f"{router.url}/predict", json={"model_id": "ok", "input_data": "bad"}).status_code == 400
    for name in ("made-up-1", "made-up-2"):
        assert httpx.post(f"{router.url}/predict", json={"model_id": name, "input_data": [1]}).status_code == 404
    samples = [s for f in text_string_to_metric_families(httpx.get(f"{router.url}/metrics").text) for s in f.samples]
    counts = {(s.labels["model"], s.labels["code"]): s.value for s in samples if s.name == "hotset_router_requests_total"}
    # names no worker knows share one label, so clients cannot create unbounded series
    assert counts == {("ok", "400"): 3, ("_unknown", "404"): 2}
    assert any(s.name == "hotset_router_request_seconds_count" and s.labels.get("model") == "ok" for s in samples)
