"""Does a model's load slow down requests to models already loaded? Measured side by side.

Starts the real pieces on loopback: the Triton sidecar (``hotset-triton``,
skipped with --no-triton or when it cannot start) and ``hotset-worker``
with the sample models' store. The first sample model is the warm one: its
warm median is measured alone, then while each other sample model loads from
cold (after an explicit unload), repeated ``--rounds`` times. With the
sidecar, the Triton sample `iris` is also measured alone and while a second
Triton model (`iris-twin`, the same sample under another id) loads in the
same sidecar: Triton once held requests on keep-alive connections opened
before a load until that load was done (docs/worker.md, "Readiness does not
flap while Triton loads a model"). The ratio during/alone should be ~1; the
reference server's was 28 (5 ms -> 140 ms). A request held for the whole
load shows in the slowest one ("max ms") and in how few fit in the load.
Cold/warm latency and load seconds per model: ``benchmarks/worker_cold_warm.py``.

Usage: .venv/bin/python benchmarks/worker_head_of_line.py [--rounds 3] [--warm 30] [--no-triton] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hotset_testing.processes import free_port, spawn, wait_http  # noqa: E402

TRITON_TWIN = "iris-twin"


@contextlib.contextmanager
def process(name: str, command: list[str], url: str, log: Path, timeout_s: float = 120) -> Iterator[None]:
    """`command` in its own session, until `url`/v2/health/ready answers; its group is stopped on exit."""
    with spawn(name, command, log, url=url, own_session=True, stop_timeout_s=20) as child:
        wait_http(child, "/v2/health/ready", timeout_s)
        yield


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
        "during_load_max_ms": max(during) * 1000 if during else None,
        "requests_during_load": len(during),
        "ratio": (statistics.median(during) / statistics.median(alone)) if during else None,
    }


def with_triton_twin(models: list[dict[str, Any]], twin_id: str) -> list[dict[str, Any]]:
    """The catalog plus the first triton model again under `twin_id` (same source: a second model to load)."""
    triton = next(m for m in models if m["framework"] == "triton")
    return [*models, {**triton, "id": twin_id, "name": twin_id}]


def print_report(results: list[dict[str, Any]], triton_note: str) -> None:
    if triton_note:
        print(f"triton: {triton_note}")
    print(f"{'warm model':<12} {'loading':<12} {'alone ms':>9} {'during ms':>10} {'ratio':>6} {'max ms':>8} "
          f"{'requests':>9}")
    for entry in results:
        if entry["ratio"] is None:
            print(f"{entry['warm_model']:<12} {entry['loading_model']:<12} (the load ended before any request)")
            continue
        print(
            f"{entry['warm_model']:<12} {entry['loading_model']:<12} {entry['alone_median_ms']:>9.2f} "
            f"{entry['during_load_median_ms']:>10.2f} {entry['ratio']:>6.2f} {entry['during_load_max_ms']:>8.1f} "
            f"{entry['requests_during_load']:>9}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=30, help="requests for the warm median alone")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per loading model")
    parser.add_argument("--no-triton", action="store_true", help="do not start the Triton sidecar")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO / "worker-image"))
    from hotset_worker import samples

    store = samples.generate(REPO / "build" / "models")
    models = json.loads(store.read_text())["models"]
    scratch = Path(tempfile.mkdtemp(prefix="hotset-bench-"))
    repository = scratch / "triton-repository"
    repository.mkdir()
    python = sys.executable
    with contextlib.ExitStack() as stack:
        triton_url, triton_note = "", "skipped (--no-triton)"
        if not args.no_triton:
            ports = [free_port() for _ in range(3)]
            command = [python, "-m", "hotset_worker.triton_sidecar", "--model-repository", str(repository),
                       "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
            try:
                stack.enter_context(process("triton", command, f"http://127.0.0.1:{ports[0]}", scratch / "triton.log"))
                triton_url, triton_note = f"127.0.0.1:{ports[0]}", ""
            except (RuntimeError, TimeoutError) as exc:
                triton_note = f"sidecar did not start, triton models skipped: {str(exc).splitlines()[0]}"
        if not triton_url:
            models = [m for m in models if m["framework"] != "triton"]
        catalog = with_triton_twin(models, TRITON_TWIN) if triton_url else models
        store = scratch / "model-store.json"
        store.write_text(json.dumps({"models": catalog}))
        port = free_port()
        command = [python, "-m", "hotset_worker.main", "--model-store", str(store), "--host", "127.0.0.1",
                   "--port", str(port), "--memory-budget", "4Gi", "--triton-url", triton_url,
                   "--triton-repository", str(repository), "--pod-name", "bench"]
        stack.enter_context(process("worker", command, f"http://127.0.0.1:{port}", scratch / "worker.log"))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
            warm_model, *others = models
            for other in catalog[1:]:  # first loads pay one-time imports: not what this measures
                timed_predict(client, other["id"], input_for(other))
            pairs = [(warm_model, other) for other in others]
            if triton_url:  # a loaded Triton model while another Triton model loads in the same sidecar
                triton_warm = next(m for m in catalog if m["framework"] == "triton")
                pairs.append((triton_warm, catalog[-1]))
            results = [
                measure_head_of_line(client, warm, loading, args.warm)
                for _ in range(args.rounds)
                for warm, loading in pairs
            ]
    print_report(results, triton_note)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
