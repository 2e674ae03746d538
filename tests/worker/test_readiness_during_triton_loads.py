"""The worker's readiness, and inference on loaded Triton models, hold while Triton loads another model.

Found by e2e: during an explicit load, the worker's `/v2/health/ready` and
`/status` said the sidecar was not ready for about a second, while Triton,
asked directly, answered ready throughout. (Triton's HTTP server answers
nothing on a keep-alive connection opened before a load until that load is
done; the worker's health check reused such a connection and timed out.)
A pod whose probe flaps on every load is taken out of its Service: see
../shared/design.md, "avoid Triton's strict readiness as the pod probe".
The same stall held inference on a loaded model for the other model's whole
load, through the triton worker's keep-alive tritonclient connections.

Real processes: the worker CLI and tritonserver. `iris` is the Triton sample;
`iris-slow` is the same model whose `initialize` takes a few seconds more,
as a large model's does, so each load spans several of the worker's health
checks.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import threading

import httpx
import pytest

from hotset_testing.triton import TritonServer, start_tritonserver
from hotset_testing.worker_server import wait_until, worker_process

SLOW_INITIALIZE_S = 2.0
ROUNDS = 2


@pytest.fixture
def store_with_slow_iris(sample_store, tmp_path):
    catalog = json.loads(sample_store.read_text())
    (iris,) = [m for m in catalog["models"] if m["id"] == "iris"]
    slow = tmp_path / "iris-slow"
    shutil.copytree(iris["source"].removeprefix("file://"), slow)
    model = slow / "1" / "model.py"
    model.write_text(model.read_text().replace(
        "    def initialize(self, args):\n",
        f"    def initialize(self, args):\n        import time\n        time.sleep({SLOW_INITIALIZE_S})\n",
    ))
    assert "time.sleep" in model.read_text()
    catalog["models"] = [iris, {**iris, "id": "iris-slow", "name": "iris-slow", "source": slow.as_uri()}]
    path = tmp_path / "model-store.json"
    path.write_text(json.dumps(catalog))
    return path


class ReadinessWatch:
    """Polls the worker's /v2/health/ready and /status every 20 ms on a thread; keeps every non-ready answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers = 0
        self.not_ready: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="readiness-watch", daemon=True)

    def __enter__(self) -> "ReadinessWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _poll(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.is_set():
                ready = client.get("/v2/health/ready")
                status = client.get("/status").json()
                self.answers += 1
                if ready.status_code != 200:
                    self.not_ready.append(f"/v2/health/ready {ready.status_code} {ready.text}")
                if not (status["ready"] and status["triton_ready"]):
                    self.not_ready.append(f"/status ready={status['ready']} triton_ready={status['triton_ready']}")
                self._stop.wait(0.02)


@pytest.fixture
def worker_with_sidecar(store_with_slow_iris, tmp_path):
    """The worker CLI beside a real tritonserver; yields a client of the worker once it is ready."""
    repository = tmp_path / "repository"
    server = start_tritonserver(repository, log_dir=tmp_path)
    try:
        args = [
            "--model-store", str(store_with_slow_iris), "--memory-budget", "2Gi",
            "--triton-url", server.url, "--triton-repository", str(repository), "--min-residency-s", "0",
        ]
        with worker_process(args) as url, httpx.Client(base_url=url, timeout=120) as client:
            wait_until(lambda: client.get("/v2/health/ready").status_code == 200, timeout_s=60, what="worker readiness")
            yield client, server
    finally:
        server.stop()


def test_readiness_never_drops_while_triton_loads(worker_with_sidecar) -> None:
    client, _ = worker_with_sidecar
    with ReadinessWatch(str(client.base_url)) as watch:
        for _ in range(ROUNDS):
            for model in ("iris-slow", "iris"):
                loaded = client.post(f"/v2/repository/models/{model}/load")
                assert loaded.status_code == 200, loaded.text
                assert client.get(f"/v2/models/{model}/ready").status_code == 200
                assert client.post(f"/v2/repository/models/{model}/unload").status_code == 200
    assert watch.answers > 0
    assert watch.not_ready == [], f"{len(watch.not_ready)} of {watch.answers} answers not ready: {watch.not_ready[:6]}"


def triton_state(server: TritonServer, model: str) -> str:
    """The model's state in the sidecar's own repository index (asked directly, on a new connection)."""
    entries = httpx.post(f"{server.http_url}/v2/repository/index", json={}, timeout=10).json()
    return next((entry.get("state", "") for entry in entries if entry["name"] == model), "")


def test_a_loaded_triton_model_answers_while_another_loads(worker_with_sidecar) -> None:
    client, server = worker_with_sidecar
    setosa = {"model_id": "iris", "input_data": [[5.1, 3.5, 1.4, 0.2]]}
    for _ in range(5):  # loads iris and opens the worker's connections to the sidecar
        assert client.post("/predict", json=setosa).status_code == 200

    load_result: list[int] = []
    loader = threading.Thread(
        target=lambda: load_result.append(client.post("/v2/repository/models/iris-slow/load").status_code))
    loader.start()
    answered_while_loading = 0
    try:
        wait_until(lambda: triton_state(server, "iris-slow") == "LOADING", timeout_s=30, what="Triton to load iris-slow")
        while answered_while_loading < 3:
            predicted = client.post("/predict", json=setosa)
            assert predicted.status_code == 200, predicted.text
            if triton_state(server, "iris-slow") != "LOADING":
                break
            answered_while_loading += 1
    finally:
        loader.join(timeout=60)
    assert load_result == [200]
    assert answered_while_loading == 3, f"iris answered {answered_while_loading} times while iris-slow loaded, then waited for the load"


def test_a_frozen_sidecar_is_reported_down_and_the_pod_keeps_serving(worker_with_sidecar) -> None:
    """Unanswered probes are given a grace period, not forever: a hung sidecar is still reported
    (its backend down, its models unready), while the pod, which holds no pinned Triton model,
    stays ready for its other models (issue 18: a Triton failure takes out only Triton's models)."""
    client, server = worker_with_sidecar
    os.kill(server.pid, signal.SIGSTOP)  # alive, port open, answering nothing
    try:
        wait_until(lambda: client.get("/status").json()["triton_ready"] is False, timeout_s=15, what="triton reported down")
        ready = client.get("/v2/health/ready")
        assert ready.status_code == 200 and ready.json()["down"] == ["triton"], ready.text
    finally:
        os.kill(server.pid, signal.SIGCONT)
    wait_until(lambda: client.get("/status").json()["triton_ready"] is True, timeout_s=15, what="triton back")
    assert client.get("/v2/health/ready").json()["down"] == []
