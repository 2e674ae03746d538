"""While a slow model loads, requests to a loaded model keep their warm latency."""
from __future__ import annotations

import statistics
import threading
import time

import httpx

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread, wait_until


def median_latency(client: httpx.Client, count: int) -> float:
    samples = []
    for i in range(count):
        started = time.perf_counter()
        response = client.post("/predict", json={"model_id": "warm", "input_data": [i]})
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200
    return statistics.median(samples)


def test_warm_requests_keep_their_latency_during_a_slow_load(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"warm": {"size": MiB}, "slow": {"size": 64 * MiB, "delay": 2.0}})
    with serve_in_thread(ballast_app(store, budget=256 * MiB)) as url, httpx.Client(base_url=url, timeout=30) as client:
        median_latency(client, 5)  # warm up the model and the connection
        warm = median_latency(client, 30)

        load_result: list[int] = []
        loader = threading.Thread(target=lambda: load_result.append(client.post("/v2/repository/models/slow/load").status_code))
        loader.start()
        wait_until(lambda: ballast.ATTEMPTS["slow"] == 1, timeout_s=5, what="the slow load to start")
        during = median_latency(client, 30)
        still_loading = loader.is_alive()
        loader.join(timeout=30)

    assert still_loading, "the slow load ended before the warm requests did: the test measured nothing"
    assert load_result == [200]
    # On a shared 2-core machine a few milliseconds of jitter are noise; a blocked loop costs the whole 2 s.
    assert during <= max(2 * warm, warm + 0.005), f"warm median {warm * 1000:.1f} ms, during the load {during * 1000:.1f} ms"
