#!/usr/bin/env python3
"""Router overhead: latency and throughput direct to a worker vs through the router, side by side in one run.

Starts one real worker process (test-only ballast framework: a trivial
model, so the figures are the HTTP path, not inference) and one real router
in front of it, both on loopback. Latency: requests alternate direct/router
one at a time, so both see the same machine load. Throughput: a closed loop
of concurrent clients for a fixed time against each, one after the other,
repeated in alternating order. Prints p50/p99 and requests per second.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import local_stack  # noqa: E402

LAUNCHER = [sys.executable, str(ROOT / "tests/router/ballast_worker_main.py")]
BODY = {"model_id": "trivial", "input_data": [1.0, 2.0, 3.0]}


def write_store(folder: Path) -> Path:
    model = folder / "trivial"
    model.mkdir(parents=True)
    (model / "ballast.json").write_text(json.dumps({"bytes": 1024, "load_delay_s": 0, "factor": 2.0}))
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": [{"id": "trivial", "framework": "torchvision", "source": f"file://{model}", "memory": 1024}]}))
    return store


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latencies(direct: str, routed: str, count: int) -> tuple[list[float], list[float]]:
    samples: dict[str, list[float]] = {direct: [], routed: []}
    async with httpx.AsyncClient(timeout=30) as client:
        for url in (direct, routed):  # warm both paths (connections, the model's load)
            for _ in range(20):
                (await client.post(f"{url}/predict", json=BODY)).raise_for_status()
        for _ in range(count):
            for url in (direct, routed):
                started = time.perf_counter()
                response = await client.post(f"{url}/predict", json=BODY)
                samples[url].append(time.perf_counter() - started)
                response.raise_for_status()
    return samples[direct], samples[routed]


async def throughput(url: str, concurrency: int, seconds: float) -> float:
    done = 0
    end = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < end:
                (await client.post(f"{url}/predict", json=BODY)).raise_for_status()
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="latency samples per path")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=4.0, help="per throughput round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="router-overhead-") as tmp:
        folder = Path(tmp)
        store = write_store(folder)
        worker = local_stack.start_worker("worker-1", store, folder / "logs", "100Mi", launcher=LAUNCHER)
        router = None
        try:
            local_stack.wait_http(worker, "/v2/health/ready", 90)
            router = local_stack.start_router([worker.url], folder / "logs", extra_args=["--log-level", "warning"])
            local_stack.wait_http(router, "/v2/health/ready", 60)
            direct, routed = asyncio.run(latencies(worker.url, router.url, args.requests))
            rates: dict[str, list[float]] = {"direct": [], "router": []}
            for round_ in range(args.rounds):
                order = [("direct", worker.url), ("router", router.url)]
                for name, url in order if round_ % 2 == 0 else reversed(order):
                    rates[name].append(asyncio.run(throughput(url, args.concurrency, args.seconds)))
        finally:
            for process in (router, worker):
                if process is not None:
                    process.stop()
    ms = 1000.0
    p50d, p50r = statistics.median(direct) * ms, statistics.median(routed) * ms
    p99d, p99r = percentile(direct, 0.99) * ms, percentile(routed, 0.99) * ms
    rate_d, rate_r = max(rates["direct"]), max(rates["router"])
    print(f"router overhead: one worker, trivial model, {args.requests} sequential requests per path (alternating), "
          f"throughput best of {args.rounds} x {args.seconds:.0f}s at concurrency {args.concurrency}")
    print(f"{'path':<10}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}")
    print(f"{'direct':<10}{p50d:>10.2f}{p99d:>10.2f}{rate_d:>10.0f}")
    print(f"{'router':<10}{p50r:>10.2f}{p99r:>10.2f}{rate_r:>10.0f}")
    print(f"p50 overhead {p50r - p50d:.2f} ms, p99 overhead {p99r - p99d:.2f} ms, "
          f"throughput through router {rate_r / rate_d:.0%} of direct")


if __name__ == "__main__":
    main()
