"""A Triton sidecar that dies and comes back empty: the worker notices, drops its copies and loads them again.

Real processes throughout: the worker CLI, and tritonserver killed by pid and
started again on the same ports and repository (what a restarted sidecar
container looks like: same address, same shared volume, nothing loaded).
`iris-pinned` is the sample iris under a second id, pinned, so the pinned
loader's reload is seen without any request asking for it.
"""
from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from hotset_testing.triton import TritonServer, start_tritonserver
from hotset_testing.worker_server import wait_until, worker_process

SETOSA = [5.1, 3.5, 1.4, 0.2]


def triton_ready_models(server: TritonServer) -> set[str]:
    try:
        entries = httpx.post(f"{server.http_url}/v2/repository/index", json={}, timeout=5).json()
    except httpx.HTTPError:
        return set()
    return {e["name"] for e in entries if e.get("state") == "READY"}


def worker_ready_triton_models(client: httpx.Client) -> set[str]:
    status = client.get("/status").json()
    return {c["id"] for c in status["models"] if c["framework"] == "triton" and c["state"] == "READY"}


@pytest.fixture
def store_with_pinned_iris(sample_store, tmp_path):
    catalog = json.loads(sample_store.read_text())
    (iris,) = [m for m in catalog["models"] if m["id"] == "iris"]
    catalog["models"].append({**iris, "id": "iris-pinned", "name": "iris-pinned", "pinned": True})
    path = tmp_path / "model-store.json"
    path.write_text(json.dumps(catalog))
    return path


def test_the_worker_follows_a_sidecar_restart(store_with_pinned_iris, tmp_path) -> None:
    repository = tmp_path / "repository"
    servers = [start_tritonserver(repository, log_dir=tmp_path)]
    first = servers[0]
    try:
        args = [
            "--model-store", str(store_with_pinned_iris), "--memory-budget", "2Gi",
            "--triton-url", first.url, "--triton-repository", str(repository),
        ]
        with worker_process(args) as url, httpx.Client(base_url=url, timeout=120) as client:
            assert client.post("/v2/repository/models/iris/load").status_code == 200
            wait_until(lambda: client.get("/v2/health/ready").status_code == 200, timeout_s=60, what="worker readiness")
            assert triton_ready_models(first) == worker_ready_triton_models(client) == {"iris", "iris-pinned"}

            os.kill(first.pid, signal.SIGKILL)  # the sidecar container dies
            first.process.popen.wait(timeout=10)
            first.stop()  # its Python-backend stubs go with it
            wait_until(lambda: client.get("/v2/health/ready").status_code == 503, timeout_s=10, what="readiness 503")
            assert client.get("/v2/health/ready").json()["triton_ready"] is False
            assert client.get("/v2/models/iris/ready").status_code == 503
            assert client.get("/v2/models/iris-pinned/ready").status_code == 503
            assert client.get("/status").json()["ready"] is False

            restart_log = tmp_path / "restarted"
            restart_log.mkdir()
            ports = (first.http_port, first.grpc_port, first.metrics_port)
            second = start_tritonserver(repository, log_dir=restart_log, ports=ports)
            servers.append(second)
            assert triton_ready_models(second) == set()  # it came back empty

            # Without any request: the worker drops what Triton lost and the pinned loader reloads its model.
            wait_until(
                lambda: triton_ready_models(second) == worker_ready_triton_models(client) == {"iris-pinned"},
                timeout_s=30, interval_s=0.2, what="the worker's table to match the restarted sidecar",
            )
            assert client.get("/v2/models/iris/ready").status_code == 503
            wait_until(lambda: client.get("/v2/health/ready").status_code == 200, timeout_s=30, what="readiness again")

            predicted = client.post("/predict", json={"model_id": "iris", "input_data": [SETOSA]})
            assert predicted.status_code == 200, predicted.text
            (probabilities,) = predicted.json()["predictions"].values()
            assert max(range(3), key=lambda i: probabilities[0][i]) == 0  # setosa
            assert triton_ready_models(second) == worker_ready_triton_models(client) == {"iris", "iris-pinned"}
            assert client.get("/v2/models/iris/ready").status_code == 200
            copies = {c["id"]: c for c in client.get("/status").json()["models"]}
            assert copies["iris"]["bytes"] > 0 and copies["iris"]["reason"] == ""
    finally:
        for server in servers:
            server.stop()


def test_a_triton_crash_unreadies_only_its_models_and_they_come_back_without_a_restart(sample_store, tmp_path) -> None:
    """The sidecar as a pod runs it (the operator's loop around tritonserver); tritonserver killed.
    Before, the pod went unready (and a crashed container took it out of every Service) until
    Triton was back: every model of the pod stopped serving for a Triton crash. Now the pod stays
    ready, the sentiment classifier keeps answering, iris is reported not ready (LOADING, so the
    router sends it nowhere) and is served again once the loop has started Triton again."""
    import threading

    repository = tmp_path / "repository"
    server = start_tritonserver(repository, log_dir=tmp_path, supervised=True)
    try:
        args = ["--model-store", str(sample_store), "--memory-budget", "2Gi",
                "--triton-url", server.url, "--triton-repository", str(repository)]
        with worker_process(args) as url, httpx.Client(base_url=url, timeout=120) as client:
            for model, data in (("iris", [SETOSA]), ("sentiment", "a wonderful little model")):
                assert client.post("/predict", json={"model_id": model, "input_data": data}).status_code == 200
            readiness: list[int] = []
            watching = threading.Event()

            def watch() -> None:
                with httpx.Client(base_url=url, timeout=10) as probe:
                    while not watching.is_set():
                        readiness.append(probe.get("/v2/health/ready").status_code)
                        watching.wait(0.1)

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                crashed = server.tritonserver_pid()
                os.kill(crashed, signal.SIGKILL)  # Triton crashes; its container's loop lives on
                wait_until(lambda: client.get("/v2/models/iris/ready").status_code == 503, timeout_s=10,
                           what="iris unready while Triton is down")
                copies = {c["id"]: c for c in client.get("/status").json()["models"]}
                assert copies["sentiment"]["state"] == "READY" and client.get("/status").json()["ready"] is True
                answer = client.post("/predict", json={"model_id": "sentiment", "input_data": "a wonderful little model"})
                assert answer.status_code == 200, answer.text
                wait_until(lambda: server.tritonserver_pid() != crashed
                           and client.get("/v2/health/ready").json()["triton_ready"]
                           and triton_ready_models(server) == worker_ready_triton_models(client) == set(),
                           timeout_s=60, interval_s=0.2, what="the loop to start Triton again, and the worker to see it empty")
                predicted = client.post("/predict", json={"model_id": "iris", "input_data": [SETOSA]})
                assert predicted.status_code == 200, predicted.text  # loaded again into the new Triton
            finally:
                watching.set()
                watcher.join()
            assert readiness and set(readiness) == {200}, f"readiness answers during the crash: {sorted(set(readiness))}"
            assert triton_ready_models(server) == {"iris"} and worker_ready_triton_models(client) == {"iris"}
            assert server.running()  # the same container process throughout
    finally:
        server.stop()
