"""Cold versus warm latency per framework, and load seconds per sample model, through the worker's HTTP API.

Starts the real pieces on loopback: a tritonserver through ``hotset-triton``
and ``hotset-worker`` serving ``build/models/model-store.json``. For each
sample model, repeated ``--rounds`` times so one slow moment does not decide
a figure:

- load s: ``POST /v2/repository/models/{id}/load`` after an unload (the first
  load of a framework, which also pays its imports, is shown on its own);
- cold ms: the first ``/predict`` after an unload, load included;
- warm ms: ``/predict`` (JSON) and ``/v2/models/{id}/infer`` through
  tritonclient with binary tensors, medians of ``--warm`` requests each;
- for triton models, the same OIP request sent straight to the sidecar,
  alternating with the worker path, so the worker's forwarding cost is a
  ratio measured side by side.

Usage: .venv/bin/python benchmarks/worker_cold_warm.py [--rounds 3] [--warm 40] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the sidecar and worker start as in the tests

from hotset_testing.processes import free_port, spawn, wait_http  # noqa: E402
from hotset_testing.triton import start_tritonserver  # noqa: E402


@contextlib.contextmanager
def worker_process(store: Path, triton_url: str, repository: Path, log: Path) -> Iterator[str]:
    """hotset-worker on a free loopback port; stopped by pid (its session) on exit."""
    port = free_port()
    command = [sys.executable, "-m", "hotset_worker.main", "--model-store", str(store), "--host", "127.0.0.1",
               "--port", str(port), "--memory-budget", "4Gi", "--triton-url", triton_url,
               "--triton-repository", str(repository), "--pod-name", "bench", "--min-residency-s", "0",
               "--log-level", "warning"]
    with spawn("worker", command, log, env={"HF_HUB_OFFLINE": "1"}, url=f"http://127.0.0.1:{port}",
               own_session=True, stop_timeout_s=20) as worker:
        wait_http(worker, "/v2/health/ready", 180)
        yield worker.url


def png_base64(rgb: tuple[int, int, int]) -> tuple[str, bytes]:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), rgb).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode(), buffer.getvalue()


def requests_for(model: dict[str, Any]) -> tuple[Any, Callable[[], list[Any]]]:
    """A /predict input_data and a factory of tritonclient InferInputs for one sample model."""
    import tritonclient.http as triton_http

    def tensor(name: str, array: np.ndarray, datatype: str) -> list[Any]:
        item = triton_http.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array, binary_data=True)
        return [item]

    task = model["task"]
    if task in ("text-classification", "embedding"):
        text = "what a great movie"
        return [text], lambda: tensor("text", np.array([text.encode()], dtype=np.object_), "BYTES")
    if task == "image-classification":
        encoded, raw = png_base64((255, 0, 0))
        return encoded, lambda: tensor("image", np.array([raw], dtype=np.object_), "BYTES")
    measurements = [[5.1, 3.5, 1.4, 0.2]]
    return measurements, lambda: tensor("measurements", np.array(measurements, dtype=np.float32), "FP32")


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure_model(client: httpx.Client, oip: Any, sidecar: Any, model: dict[str, Any],
                  rounds: int, warm: int) -> dict[str, Any]:
    model_id = model["id"]
    data, oip_inputs = requests_for(model)

    def predict() -> None:
        response = client.post("/predict", json={"model_id": model_id, "input_data": data})
        if response.status_code != 200:
            raise RuntimeError(f"{model_id}: HTTP {response.status_code}: {response.text[:300]}")

    def unload() -> None:
        client.post(f"/v2/repository/models/{model_id}/unload").raise_for_status()

    def load() -> None:
        client.post(f"/v2/repository/models/{model_id}/load").raise_for_status()

    first_load_s = timed(load)  # the first of its framework also imports the framework
    loads, colds = [], []
    for _ in range(rounds):
        unload()
        loads.append(timed(load))
        unload()
        colds.append(timed(predict))
    warm_json = [timed(predict) for _ in range(warm)]
    warm_oip: list[float] = []
    direct: list[float] = []
    for _ in range(warm):  # alternate, so both paths see the same machine load
        warm_oip.append(timed(lambda: oip.infer(model_id, oip_inputs())))
        if model["framework"] == "triton":
            direct.append(timed(lambda: sidecar.infer(model_id, oip_inputs())))
    row = {
        "model": model_id, "framework": model["framework"], "first_load_s": first_load_s,
        "load_s": statistics.median(loads), "cold_ms": statistics.median(colds) * 1000,
        "warm_predict_ms": statistics.median(warm_json) * 1000, "warm_oip_ms": statistics.median(warm_oip) * 1000,
    }
    if direct:
        row["sidecar_direct_ms"] = statistics.median(direct) * 1000
        row["worker_over_direct"] = row["warm_oip_ms"] / row["sidecar_direct_ms"]
    row["cold_over_warm"] = row["cold_ms"] / row["warm_predict_ms"]
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (f"{'model':<11} {'framework':<13} {'1st load s':>10} {'load s':>7} {'cold ms':>8} "
              f"{'warm /predict ms':>16} {'warm OIP ms':>11} {'cold/warm':>9} {'sidecar direct ms':>17}")
    print(header)
    for r in rows:
        direct = f"{r['sidecar_direct_ms']:.2f} (x{r['worker_over_direct']:.2f})" if "sidecar_direct_ms" in r else "-"
        print(f"{r['model']:<11} {r['framework']:<13} {r['first_load_s']:>10.2f} {r['load_s']:>7.2f} {r['cold_ms']:>8.0f} "
              f"{r['warm_predict_ms']:>16.2f} {r['warm_oip_ms']:>11.2f} {r['cold_over_warm']:>9.0f} {direct:>17}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="unload/load and unload/cold-predict rounds per model")
    parser.add_argument("--warm", type=int, default=40, help="warm requests per model and path")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    import tritonclient.http as triton_http

    from hotset_worker import samples

    store = samples.generate(REPO / "build" / "models")
    models = json.loads(store.read_text())["models"]
    scratch = Path(tempfile.mkdtemp(prefix="hotset-cold-warm-"))
    sidecar_server = start_tritonserver(scratch / "repository", log_dir=scratch)
    try:
        with worker_process(store, sidecar_server.url, sidecar_server.repository, scratch / "worker.log") as url, \
                httpx.Client(base_url=url, timeout=300) as client:
            oip = triton_http.InferenceServerClient(url.removeprefix("http://"), network_timeout=300)
            sidecar = triton_http.InferenceServerClient(sidecar_server.url, network_timeout=300)
            rows = [measure_model(client, oip, sidecar, model, args.rounds, args.warm) for model in models]
    finally:
        sidecar_server.stop()
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; logs in {scratch}")
    print_table(rows)
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
