"""Overload stays bounded: with the admission queue full, refusals are fast and memory stays flat.

One real ``hotset-worker`` (room for 2 of the 12 benchmark BERTs, an
admission queue of ``--max-queue`` requests) flooded by ``--clients``
closed-loop clients replaying a Zipf trace of all twelve models for about
``--seconds``. Prints how many requests were answered and refused, how fast
the refusals (503 with Retry-After) came, and the worker's resident memory
before, at its highest during, and after the flood. Targets: refusals in
under 50 ms; memory flat (the queue holds requests, never models).

Usage: .venv/bin/python benchmarks/worker_overload.py [--clients 64] [--max-queue 8] [--seconds 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_models  # noqa: E402
import loadgen  # noqa: E402
from hotset_testing.processes import free_port, spawn, wait_http  # noqa: E402

VENV_BIN = Path(sys.executable).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    store = bench_models.ensure_models()
    port = free_port()
    argv = [str(VENV_BIN / "hotset-worker"), "--model-store", str(store), "--port", str(port), "--max-models", "2",
            "--memory-budget", "4Gi", "--max-queue", str(args.max_queue), "--log-level", "warning"]
    with tempfile.TemporaryDirectory(prefix="overload-") as scratch, \
            spawn("worker", argv, Path(scratch) / "worker.log", url=f"http://127.0.0.1:{port}", own_session=True) as worker:
        wait_http(worker, "/v2/health/ready", 180)
        process = psutil.Process(worker.pid)
        asyncio.run(loadgen.replay(worker.url, bench_models.model_ids()[:4], 1))  # warm up
        before = process.memory_info().rss
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], process.memory_info().rss)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        trace = bench_models.zipf_trace(bench_models.model_ids(), int(args.seconds * 500), seed=11)
        flood = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "loadgen.py"), worker.url,
                                  "--concurrency", str(args.clients), "--trace", ",".join(trace)],
                                 stdout=subprocess.PIPE, text=True)
        probes = probe_refusals(worker.url, flood)
        flood_summary = json.loads(flood.communicate(timeout=600)[0].strip().splitlines()[-1])
        stop.set()
        sampler.join()
        time.sleep(1.0)
        after = process.memory_info().rss
    print(f"flood: {args.clients} clients, queue of {args.max_queue}: {flood_summary}")
    refused = [seconds for status, seconds in probes if status == 503]
    print(f"probe (a client of its own, one request at a time, models across the catalog): {len(probes)} requests, "
          f"{len(refused)} refused with 503")
    if refused:
        refused.sort()
        print(f"refusals as the probe saw them: p50 {statistics.median(refused) * 1000:.1f} ms, "
              f"p99 {refused[int(0.99 * len(refused))] * 1000:.1f} ms, max {refused[-1] * 1000:.1f} ms (target < 50 ms)")
    print(f"worker RSS: before {before / 2**20:.0f} MiB, peak {peak[0] / 2**20:.0f} MiB, after {after / 2**20:.0f} MiB "
          f"(peak/before {peak[0] / before:.2f})")


def probe_refusals(url: str, flood: subprocess.Popen) -> list[tuple[int, float]]:
    """While the flood runs: one request at a time, cycling over the catalog; (status, seconds) of each."""
    ids = bench_models.model_ids()
    results = []
    with httpx.Client(base_url=url, timeout=60) as client:
        time.sleep(0.5)  # let the flood fill the queue
        index = 0
        while flood.poll() is None:
            started = time.perf_counter()
            response = client.post("/predict", json={"model_id": ids[index % len(ids)], "input_data": "probe"})
            results.append((response.status_code, time.perf_counter() - started))
            index += 1
    return results


if __name__ == "__main__":
    main()
