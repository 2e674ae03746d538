"""A worker drains on SIGTERM: unready at once, still serving for its drain, then gone, and its
running marker (what the Triton sidecar's preStop waits for) removed last."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import httpx

from hotset_testing import ballast_framework as ballast
from hotset_testing.polling import wait_for
from hotset_testing.processes import free_port, spawn, wait_http
from hotset_worker.main import RUNNING_MARKER

LAUNCHER = Path(__file__).resolve().parents[1] / "router" / "ballast_worker_main.py"


def test_sigterm_drains_then_stops_and_removes_the_marker(tmp_path: Path) -> None:
    folder = ballast.write_model(tmp_path / "a", 1024)
    store = tmp_path / "store.json"
    store.write_text(f'{{"models": [{{"id": "a", "framework": "torchvision", "source": "file://{folder}"}}]}}')
    repository = tmp_path / "repository"
    port = free_port()
    argv = [sys.executable, str(LAUNCHER), "--model-store", str(store), "--port", str(port), "--memory-budget", "16Mi",
            "--triton-url", "127.0.0.1:9", "--triton-repository", str(repository), "--drain-seconds", "2"]
    worker = spawn("worker", argv, tmp_path / "worker.log", url=f"http://127.0.0.1:{port}")
    with worker:
        wait_http(worker, "/v2/health/live", 60)
        assert (repository / RUNNING_MARKER).exists()
        worker.popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        wait_for(lambda: httpx.get(worker.url + "/v2/health/ready").status_code == 503 and
                 httpx.get(worker.url + "/v2/health/ready").json()["draining"], "readiness to say draining", 5)
        answer = httpx.post(worker.url + "/predict", json={"model_id": "a", "input_data": [1.0]}, timeout=10)
        assert answer.status_code == 200, answer.text  # still serving what was already sent its way
        assert httpx.get(worker.url + "/status").json()["ready"] is False
        worker.popen.wait(30)
        assert time.monotonic() - signalled >= 2.0  # it waited for its drain
        assert worker.popen.returncode == 0, worker.log_tail()
        assert not (repository / RUNNING_MARKER).exists()
