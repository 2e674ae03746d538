"""Hostile inputs against a real router and worker (the sample models): each one's status, time,
what the servers' memory did, and whether they still serve afterwards.

    .venv/bin/python benchmarks/hostile_inputs.py

Figures in docs/reliability.md. Every case was a finding of issue 11.
"""
from __future__ import annotations

import base64
import concurrent.futures
import gzip
import io
import json
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import local_stack  # noqa: E402
from hotset_worker import samples  # noqa: E402


def png(width: int, height: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (255, 0, 0)).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode()


class Peak:
    """The highest RSS of a process while the block runs."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.start = self.peak = self.process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch)

    def _watch(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._done.wait(0.005)

    def __enter__(self) -> "Peak":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def grew_mib(self) -> float:
        return round((self.peak - self.start) / 2**20, 1)


def timed(call) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    answer = call()
    return answer, round(1000 * (time.perf_counter() - started), 1)


def main() -> int:
    store = samples.generate(REPO / "build" / "models")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as scratch:
        logs = Path(scratch)
        worker = local_stack.start_worker("worker", store, logs, "1Gi")
        router = None
        try:
            local_stack.wait_http(worker, "/v2/health/ready", 180)
            router = local_stack.start_router([worker.url], logs, model_store=store)
            local_stack.wait_http(router, "/v2/health/ready", 60)
            r, w = router.url, worker.url
            http = httpx.Client(timeout=120)
            for model in ("sentiment", "colors"):
                http.post(f"{w}/v2/repository/models/{model}/load")

            def row(case: str, answer: httpx.Response, ms: float, **extra) -> None:
                live = http.get(f"{w}/v2/health/live").status_code == 200 and http.get(f"{r}/v2/health/live").status_code == 200
                body = answer.text
                try:
                    json.loads(body, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
                    valid = True
                except ValueError:
                    valid = False
                rows.append({"case": case, "status": answer.status_code, "ms": ms, "json": valid,
                             "message": (answer.json().get("error", "") if valid and answer.status_code >= 400 else "")[:90],
                             "still_serving": live, **extra})
                print(json.dumps(rows[-1]), flush=True)

            shape = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [0, 10**20], "data": []}]}
            row("shape [0, 10**20]", *timed(lambda: http.post(f"{r}/v2/models/colors/infer", json=shape)))
            nan = struct.pack("<f", float("nan")) * (3 * 64 * 64)
            header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 64, 64],
                                             "parameters": {"binary_data_size": len(nan)}}]}).encode()
            row("NaN outputs (JSON)", *timed(lambda: http.post(f"{r}/v2/models/colors/infer", content=header + nan,
                                                               headers={"Inference-Header-Content-Length": str(len(header))})))
            text = "a wonderful little model " * (4 * 2**20 // 25)
            with Peak(worker.pid) as peak:
                answer, ms = timed(lambda: http.post(f"{r}/predict", json={"model_id": "sentiment", "input_data": text}))
            row("4 MiB text", answer, ms, worker_rss_grew_mib=peak.grew_mib)
            big = png(6000, 6000)
            row("2 images of 36 Mpx", *timed(lambda: http.post(f"{r}/predict", json={"model_id": "colors", "input_data": [big, big]})))
            packed = gzip.compress(json.dumps({"model_id": "sentiment", "input_data": "gzip body"}).encode())
            row("gzip /predict through the router", *timed(lambda: http.post(
                f"{r}/predict", content=packed, headers={"content-encoding": "gzip", "content-type": "application/json"})))
            row("%3F in the version segment", *timed(lambda: http.post(f"{r}/v2/models/colors/versions/1%3Fx/infer", json=shape)))
            numbers = b'{"input_data": [' + b",".join([b"1.25"] * 2_500_000) + b'], "model_id": "nope"}'
            with Peak(router.pid) as peak:
                answer, ms = timed(lambda: http.post(f"{r}/predict", content=numbers))
            row(f"{len(numbers) / 1e6:.0f} MB /predict, model_id last", answer, ms, router_rss_grew_mib=peak.grew_mib)
            flood = json.dumps({"model_id": "nope", "input_data": [1.0] * 1_400_000}).encode()
            with Peak(router.pid) as peak, concurrent.futures.ThreadPoolExecutor(96) as pool:
                started = time.perf_counter()
                answers = list(pool.map(lambda _: httpx.post(f"{r}/predict", content=flood, timeout=120), range(96)))
                ms = round(1000 * (time.perf_counter() - started), 1)
            codes = {str(c): sum(a.status_code == c for a in answers) for c in sorted({a.status_code for a in answers})}
            row(f"96 concurrent {len(flood) / 2**20:.0f} MiB bodies", answers[0], ms, codes=codes, router_rss_grew_mib=peak.grew_mib)
            tensor = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [128, 3, 64, 64],
                                             "data": [[0.5] * 64 * 64 * 3] * 128}]}).encode()
            slowest = 0.0
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(httpx.post, f"{w}/v2/models/colors/infer", content=tensor, timeout=120) for _ in range(4)]
                while not all(f.done() for f in futures):
                    _, ms = timed(lambda: http.get(f"{w}/status"))
                    slowest = max(slowest, ms)
            row(f"4 x {len(tensor) / 1e6:.0f} MB JSON tensors: slowest /status (ms)", futures[0].result(), slowest)
        finally:
            if router is not None:
                router.stop()
            worker.stop()
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
