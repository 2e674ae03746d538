"""Cold versus warm latency per sample model, load seconds, and warm latency during another load.

Starts the real pieces on loopback: the Triton sidecar (``modelplane-triton``,
skipped with --no-triton or when it cannot start) and ``modelplane-worker``
with the sample models' store, then measures through the worker's HTTP API:

- cold: the first ``/predict`` of a model, its load included (the first model
  of a framework also pays for that framework's first use);
- reload: the first ``/predict`` again after an explicit unload;
- warm: the median and p90 of the following requests;
- load s: ``modelplane_model_load_seconds`` from ``/metrics``, first load and reload;
- head-of-line: the warm median of the first model measured alone and then
  while each other model loads from cold, side by side in this run (their
  ratio should be ~1; the reference server's was 28: 5 ms became 140 ms).

Usage: .venv/bin/python benchmarks/worker_latency.py [--warm 30] [--no-triton] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[2:4]} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s}s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def process(command: list[str], ready_url: str, log: Path, timeout_s: float = 120) -> Iterator[None]:
    with log.open("w") as out:
        child = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(ready_url, child, timeout_s, log)
        yield
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


def sample_png() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def input_for(model: dict[str, Any]) -> Any:
    """A valid /predict input for a sample model, by its task."""
    task = model.get("task", "tensor")
    if task in ("text-classification", "embedding"):
        return ["what a wonderful afternoon"]
    if task == "image-classification":
        return sample_png()
    return [[5.1, 3.5, 1.4, 0.2]]  # the iris sample: measurements [N, 4]


def timed_predict(client: httpx.Client, model_id: str, data: Any) -> float:
    started = time.perf_counter()
    response = client.post("/predict", json={"model_id": model_id, "input_data": data})
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{model_id}: HTTP {response.status_code}: {response.text[:300]}")
    return elapsed


def load_seconds(client: httpx.Client) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "modelplane_model_load_seconds_sum":
                sums[sample.labels["model"]] = sample.value
    return sums


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure_models(client: httpx.Client, models: list[dict[str, Any]], warm_count: int) -> list[dict[str, Any]]:
    rows = []
    for model in models:
        data = input_for(model)
        try:
            cold = timed_predict(client, model["id"], data)
            warm = [timed_predict(client, model["id"], data) for _ in range(warm_count)]
            first_load = load_seconds(client).get(model["id"], 0.0)
            client.post(f"/v2/repository/models/{model['id']}/unload").raise_for_status()
            reload = timed_predict(client, model["id"], data)  # cold again, without first-use imports
            second_load = load_seconds(client).get(model["id"], 0.0) - first_load
        except (RuntimeError, httpx.HTTPError) as exc:
            rows.append({"model": model["id"], "framework": model["framework"], "error": str(exc)})
            continue
        rows.append({
            "model": model["id"], "framework": model["framework"], "cold_ms": cold * 1000, "reload_ms": reload * 1000,
            "load_s": first_load, "reload_load_s": second_load,
            "warm_median_ms": statistics.median(warm) * 1000, "warm_p90_ms": percentile(warm, 0.9) * 1000,
        })
    return rows


def measure_head_of_line(client: httpx.Client, warm: dict[str, Any], loading: dict[str, Any], count: int) -> dict[str, Any]:
    """Warm median of `warm` alone, then while `loading` loads from cold (side by side, one run)."""
    data = input_for(warm)
    timed_predict(client, warm["id"], data)
    alone = [timed_predict(client, warm["id"], data) for _ in range(count)]
    client.post(f"/v2/repository/models/{loading['id']}/unload")
    done = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=client.base_url, timeout=300) as other:
            other.post(f"/v2/repository/models/{loading['id']}/load")
        done.set()

    loader = threading.Thread(target=load)
    loader.start()
    during: list[float] = []
    while not done.is_set() and len(during) < 10_000:
        during.append(timed_predict(client, warm["id"], data))
    loader.join()
    return {
        "warm_model": warm["id"], "loading_model": loading["id"],
        "alone_median_ms": statistics.median(alone) * 1000,
        "during_load_median_ms": statistics.median(during) * 1000 if during else None,
        "requests_during_load": len(during),
        "ratio": (statistics.median(during) / statistics.median(alone)) if during else None,
    }


def print_report(rows: list[dict[str, Any]], hol: list[dict[str, Any]], triton_note: str) -> None:
    print(f"{'model':<12} {'framework':<13} {'cold ms':>9} {'reload ms':>10} {'warm p50 ms':>12} {'warm p90 ms':>12} {'load s':>7} {'reload s':>9}")
    for row in rows:
        if "error" in row:
            print(f"{row['model']:<12} {row['framework']:<13} error: {row['error']}")
            continue
        print(
            f"{row['model']:<12} {row['framework']:<13} {row['cold_ms']:>9.1f} {row['reload_ms']:>10.1f} "
            f"{row['warm_median_ms']:>12.2f} {row['warm_p90_ms']:>12.2f} {row['load_s']:>7.3f} {row['reload_load_s']:>9.3f}"
        )
    if triton_note:
        print(f"triton: {triton_note}")
    for entry in hol:
        if entry["ratio"] is None:
            continue
        print(
            f"head-of-line: {entry['warm_model']} warm median {entry['alone_median_ms']:.2f} ms alone, "
            f"{entry['during_load_median_ms']:.2f} ms during the load of {entry['loading_model']} "
            f"({entry['requests_during_load']} requests; ratio {entry['ratio']:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=30, help="warm requests per model")
    parser.add_argument("--no-triton", action="store_true", help="do not start the Triton sidecar")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO / "worker-image"))
    from modelplane_worker import samples

    store = samples.generate(REPO / "build" / "models")
    models = json.loads(store.read_text())["models"]
    scratch = Path(tempfile.mkdtemp(prefix="modelplane-bench-"))
    repository = scratch / "triton-repository"
    repository.mkdir()
    python = sys.executable
    with contextlib.ExitStack() as stack:
        triton_url, triton_note = "", "skipped (--no-triton)"
        if not args.no_triton:
            ports = [free_port() for _ in range(3)]
            command = [python, "-m", "modelplane_worker.triton_sidecar", "--model-repository", str(repository),
                       "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
            try:
                stack.enter_context(process(command, f"http://127.0.0.1:{ports[0]}/v2/health/ready", scratch / "triton.log"))
                triton_url, triton_note = f"127.0.0.1:{ports[0]}", ""
            except RuntimeError as exc:
                triton_note = f"sidecar did not start, triton models skipped: {str(exc).splitlines()[0]}"
        if not triton_url:
            models = [m for m in models if m["framework"] != "triton"]
        port = free_port()
        command = [python, "-m", "modelplane_worker.main", "--model-store", str(store), "--host", "127.0.0.1",
                   "--port", str(port), "--memory-budget", "4Gi", "--triton-url", triton_url,
                   "--triton-repository", str(repository), "--pod-name", "bench"]
        stack.enter_context(process(command, f"http://127.0.0.1:{port}/v2/health/ready", scratch / "worker.log"))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
            rows = measure_models(client, models, args.warm)
            warm_model, *others = models
            hol = [measure_head_of_line(client, warm_model, other, args.warm) for other in others]
    print_report(rows, hol, triton_note)
    if args.json_out:
        args.json_out.write_text(json.dumps({"models": rows, "head_of_line": hol}, indent=2) + "\n")


if __name__ == "__main__":
    main()
