"""spec.maxConcurrency and spec.timeoutSeconds, enforced by a real worker over HTTP.

One slow model must not starve a shared pod: its requests beyond its limit wait in a bounded
queue (429 with Retry-After when it is full), other models are served meanwhile, and its
timeoutSeconds caps how long any of its requests waits.
"""
from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread, wait_until


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    store = ballast.catalog(root, {"slow": {"predict_delay": 1.0}, "fast": {}, "late": {"delay": 3.0}})
    for model_id, limits in {"slow": {"max_concurrency": 1}, "late": {"timeout_seconds": 0.5}}.items():
        store.put(store.get(model_id).model_copy(update=limits))
    with serve_in_thread(ballast_app(store, budget=16 * MiB, max_model_queue=1)) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client


def metric(client: httpx.Client, name: str, model: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == model:
                return sample.value
    return 0.0


def test_requests_past_the_limit_wait_and_past_the_queue_get_429(worker) -> None:
    def predict() -> httpx.Response:
        with httpx.Client(base_url=str(worker.base_url), timeout=30) as client:
            return client.post("/predict", json={"model_id": "slow", "input_data": [1.0]})

    worker.post("/v2/repository/models/slow/load")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        first = pool.submit(predict)
        wait_until(lambda: metric(worker, "hotset_inflight_requests", "slow") == 1, what="one request in flight")
        second = pool.submit(predict)
        wait_until(lambda: metric(worker, "hotset_model_queued_requests", "slow") == 1, what="one request queued")
        third = predict()  # the queue (1) is full
        assert third.status_code == 429, third.text
        assert "limit of 1 concurrent" in third.json()["error"] and third.headers["Retry-After"] == "1"
        # Another model on the same pod is served at once meanwhile.
        assert worker.post("/predict", json={"model_id": "fast", "input_data": [1.0]}).status_code == 200
        assert first.result().status_code == 200 and second.result().status_code == 200
    assert metric(worker, "hotset_refusals_total", "slow") >= 1


def test_timeout_seconds_caps_the_deadline_with_503_and_retry_after(worker) -> None:
    answer = worker.post("/predict", json={"model_id": "late", "input_data": [1.0]}, headers={"X-Hotset-Timeout": "30"})
    assert answer.status_code == 503, answer.text
    assert "deadline" in answer.json()["error"] and "Retry-After" in answer.headers


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_a_timeout_header_that_is_not_a_positive_number_is_refused_and_names_the_header(worker, value) -> None:
    answer = worker.post("/predict", json={"model_id": "fast", "input_data": [1.0]},
                         headers={"X-Hotset-Timeout": value})
    assert answer.status_code == 400
    assert "x-hotset-timeout must be a positive number of seconds" in answer.text
    assert value in answer.text
    served = worker.post("/predict", json={"model_id": "fast", "input_data": [1.0]},
                         headers={"X-Hotset-Timeout": "2.5"})
    assert served.status_code == 200, served.text  # the next request, with a good budget, is served
