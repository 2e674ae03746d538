"""Thousands of small models in one worker: what a loaded copy costs beyond its weights, and warm latency.

One ``hotset-worker`` (4 GiB budget, no model limit) with ``--copies``
ServedModels in its store, each a copy of the same tiny BERT classifier (the
``sentiment`` sample: hidden 32, 2 layers, ~0.1 MB of weights; every id is a
model of its own, loaded from the same folder). The script:

1. starts the worker, loads one copy (imports and first-load costs), and
   reads its resident memory (RSS, and PSS where the kernel has it);
2. loads every copy through ``POST /v2/repository/models/{id}/load`` (two at
   a time, as the worker has two load threads) and reads the memory again:
   per copy, (after - before) / copies, minus the copy's weights (the measured
   bytes the worker reports) is what a copy costs beyond them;
3. sends ``--requests`` warm ``POST /predict`` spread uniformly over every
   copy, from ``--concurrency`` closed-loop clients, and prints p50/p99; then,
   side by side and alternating (two rounds each), the same number of
   requests for one copy and for all of them, with the worker's own CPU time
   per request: what density adds to a request, apart from the request itself.
   Both at ``--concurrency`` and at 1: requests for one copy that arrive
   together share a forward pass (dynamic batching) where spread ones cannot,
   so only concurrency 1 compares the same work per request;
4. the same closed loop of ``--concurrency`` over every copy from vegeta
   (benchmarks/vegeta.py: a Go client at a few tens of microseconds a
   request, where each of the Python clients above spends most of a
   millisecond of the same two cores the worker has), whole runs
   alternating with the Python closed loop: how much of its latency was
   the generator's (``--vegeta ''`` skips it);
5. times ``GET /models`` (paged and whole) and ``GET /metrics``, and counts
   the series ``/metrics`` holds.

Usage: .venv/bin/python benchmarks/worker_density.py [--copies 5000] [--requests 4000] [--concurrency 8]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hotset_testing.processes import free_port, spawn, wait_http  # noqa: E402
import vegeta  # noqa: E402

VENV_BIN = Path(sys.executable).parent
TEXT = "what a wonderful little movie"


def memory_of(pid: int) -> dict[str, int]:
    process = psutil.Process(pid)
    figures = {"rss": process.memory_info().rss}
    try:
        figures["pss"] = process.memory_full_info().pss
    except (psutil.AccessDenied, AttributeError):
        pass
    return figures


async def load_all(url: str, ids: list[str], parallel: int = 2) -> float:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for model in ids:
        queue.put_nowait(model)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def loader() -> None:
            while not queue.empty():
                model = queue.get_nowait()
                answer = await client.post(f"/v2/repository/models/{model}/load")
                answer.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(loader() for _ in range(parallel)))
        return time.perf_counter() - started


async def warm_requests(url: str, trace: list[str], concurrency: int) -> dict[str, Any]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for model in trace:
        queue.put_nowait(model)
    seconds: list[float] = []
    failed = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one_client() -> None:
            nonlocal failed
            while not queue.empty():
                model = queue.get_nowait()
                started = time.perf_counter()
                answer = await client.post("/predict", json={"model_id": model, "input_data": TEXT})
                seconds.append(time.perf_counter() - started)
                failed += answer.status_code != 200

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    seconds.sort()
    return {"requests": len(seconds), "failed": failed, "req_s": round(len(seconds) / wall, 1),
            "p50_ms": round(seconds[len(seconds) // 2] * 1000, 2),
            "p99_ms": round(seconds[int(0.99 * len(seconds))] * 1000, 2),
            "mean_ms": round(statistics.fmean(seconds) * 1000, 2)}


async def open_loop(url: str, trace: list[str], rate: float) -> dict[str, Any]:
    """The second harness: `trace` sent on a schedule of `rate` requests a second whatever the
    answers do (each on its own connection slot), so latency is the worker's at that load, not a
    closed loop's queue; also how far the sender fell behind its schedule (its own lag)."""
    seconds: list[float] = []
    lag: list[float] = []
    failed = 0
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one(model: str) -> None:
            nonlocal failed
            started = time.perf_counter()
            answer = await client.post("/predict", json={"model_id": model, "input_data": TEXT})
            seconds.append(time.perf_counter() - started)
            failed += answer.status_code != 200

        begin = time.perf_counter()
        sent = []
        for index, model in enumerate(trace):
            due = begin + index / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lag.append(max(0.0, time.perf_counter() - due))
            sent.append(asyncio.create_task(one(model)))
        await asyncio.gather(*sent)
    seconds.sort()
    lag.sort()
    return {"requests": len(seconds), "failed": failed, "rate": rate,
            "p50_ms": round(seconds[len(seconds) // 2] * 1000, 2),
            "p99_ms": round(seconds[int(0.99 * len(seconds))] * 1000, 2),
            "sender_lag_p99_ms": round(lag[int(0.99 * len(lag))] * 1000, 2)}


def open_loop_one_against_all(url: str, ids: list[str], rate: float, seconds: float) -> list[dict[str, Any]]:
    """Open-loop warm requests for one copy and spread over every copy, alternating, two rounds."""
    count = int(rate * seconds)
    traces = {"one copy": [ids[0]] * count, "all copies": random.Random(3).choices(ids, k=count)}
    return [{"round": round_number, "target": name, **asyncio.run(open_loop(url, trace, rate))}
            for round_number in (1, 2) for name, trace in traces.items()]


def one_copy_against_all(url: str, pid: int, ids: list[str], requests: int, concurrency: int) -> list[dict[str, Any]]:
    """Warm requests for one copy and for all of them, alternating, two rounds; each with the
    worker's CPU milliseconds per request (user + system, all its threads). One copy batches
    (requests arriving together share a forward pass) where spread ones cannot, so it is the floor."""
    process = psutil.Process(pid)
    traces = {"one copy": [ids[0]] * requests, "all copies": random.Random(2).choices(ids, k=requests)}
    rows = []
    for round_number in (1, 2):
        for name, trace in traces.items():
            before = process.cpu_times()
            figures = asyncio.run(warm_requests(url, trace, concurrency))
            after = process.cpu_times()
            spent = (after.user - before.user) + (after.system - before.system)
            rows.append({"round": round_number, "target": name, **figures,
                         "worker_cpu_ms_per_request": round(spent * 1000 / figures["requests"], 2)})
    return rows


def two_closed_loops(url: str, ids: list[str], args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    """The closed loop over every copy from the Python clients and from vegeta, alternating, two
    rounds; vegeta runs as long as the Python run before it took."""
    trace = random.Random(4).choices(ids, k=args.requests)
    rows = []
    for round_number in (1, 2):
        started = time.perf_counter()
        python = asyncio.run(warm_requests(url, trace, args.concurrency))
        rows.append({"round": round_number, "generator": "python (httpx)", **python})
        seconds = max(5.0, time.perf_counter() - started)
        go = vegeta.predict(args.vegeta, [url] * len(trace), trace, TEXT, seconds, folder, f"closed-{round_number}",
                            workers=args.concurrency)
        rows.append({"round": round_number, "generator": "vegeta (Go)", "requests": go["requests"],
                     "failed": round(go["requests"] * (1 - go["success"])), "req_s": round(go["throughput"], 1),
                     "p50_ms": round(go["p50"] * 1000, 2), "p99_ms": round(go["p99"] * 1000, 2)})
    return rows


def timed_get(url: str, path: str, repeat: int = 3) -> tuple[float, int]:
    """Median milliseconds of `repeat` GETs, and the answer's size in bytes."""
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        answer = httpx.get(url + path, timeout=60)
        times.append((time.perf_counter() - started) * 1000)
        size = len(answer.content)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rate", type=float, default=100.0, help="the open loop's requests a second")
    parser.add_argument("--open-seconds", type=float, default=20.0, help="each open-loop run's length")
    parser.add_argument("--vegeta", default=vegeta.default_vegeta(),
                        help="the vegeta binary for the Go closed loop ('': skip it)")
    args = parser.parse_args()
    from hotset_worker import samples

    store_root = samples.generate(REPO / "build" / "models")
    source = (store_root.parent / "sentiment").resolve()
    ids = [f"tiny-{index:05d}" for index in range(args.copies)]
    with tempfile.TemporaryDirectory(prefix="density-") as scratch:
        store = Path(scratch) / "store.json"
        store.write_text(json.dumps({"models": [
            {"id": model, "framework": "transformers", "task": "text-classification", "source": source.as_uri(),
             "memory": "1Mi"} for model in ids]}))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [str(VENV_BIN / "hotset-worker"), "--model-store", str(store), "--port", str(port),
                "--memory-budget", "4Gi", "--log-level", "warning"]
        with spawn("worker", argv, Path(scratch) / "worker.log", url=url, own_session=True, stop_timeout_s=60) as child:
            wait_http(child, "/v2/health/ready", 300)
            asyncio.run(load_all(url, ids[:1], 1))
            asyncio.run(warm_requests(url, ids[:1] * 20, 1))
            before = memory_of(child.pid)
            load_s = asyncio.run(load_all(url, ids[1:]))
            after_loads = memory_of(child.pid)
            metrics = httpx.get(f"{url}/metrics", timeout=60).text
            used = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                        if line.startswith("hotset_memory_used_bytes{"))
            weights = used / args.copies
            trace = random.Random(1).choices(ids, k=args.requests)
            warm = asyncio.run(warm_requests(url, trace, args.concurrency))
            after_requests = memory_of(child.pid)
            side_by_side = [{"concurrency": concurrency, **row} for concurrency in (1, args.concurrency)
                            for row in one_copy_against_all(url, child.pid, ids, args.requests, concurrency)]
            opened = open_loop_one_against_all(url, ids, args.rate, args.open_seconds)
            generators = two_closed_loops(url, ids, args, Path(scratch)) if args.vegeta else []
            models_paged = timed_get(url, "/models?limit=100")
            models_whole = timed_get(url, "/models")
            metrics_time = timed_get(url, "/metrics")
            series = sum(1 for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines()
                         if line and not line.startswith("#"))
    copies = args.copies - 1
    for name in before:
        per_copy = (after_loads[name] - before[name]) / copies
        print(f"{name}: {before[name] / 2**20:.0f} MiB with one copy, {after_loads[name] / 2**20:.0f} MiB with "
              f"{args.copies}, {after_requests[name] / 2**20:.0f} MiB after the requests; per copy "
              f"{per_copy / 2**20:.3f} MiB, of which weights {weights / 2**20:.3f} MiB: "
              f"{(per_copy - weights) / 2**20:.3f} MiB beyond its weights (target <= 0.5)")
        per_copy_after = (after_requests[name] - before[name]) / copies
        print(f"  after every copy served requests: {(per_copy_after - weights) / 2**20:.3f} MiB beyond its weights")
    print(f"loads: {copies} in {load_s:.1f} s ({copies / load_s:.0f}/s)")
    print(f"warm requests over {args.copies} copies at concurrency {args.concurrency}: {json.dumps(warm)} (target p99 <= 10 ms)")
    print("| clients | round | requests for | req/s | p50 ms | p99 ms | worker CPU ms per request | failed |")
    print("|---|---|---|---|---|---|---|---|")
    for row in side_by_side:
        print(f"| {row['concurrency']} | {row['round']} | {row['target']} | {row['req_s']} | {row['p50_ms']} | "
              f"{row['p99_ms']} | {row['worker_cpu_ms_per_request']} | {row['failed']} |")
    for concurrency in (1, args.concurrency):
        mean = {name: statistics.fmean(r["worker_cpu_ms_per_request"] for r in side_by_side
                                       if r["target"] == name and r["concurrency"] == concurrency)
                for name in ("one copy", "all copies")}
        print(f"worker CPU per request at concurrency {concurrency}, all copies / one copy: "
              f"{mean['all copies'] / mean['one copy']:.2f}x"
              + ("" if concurrency == 1 else
                 f"; a closed loop of {concurrency} on {psutil.cpu_count()} cores cannot beat "
                 f"{concurrency * mean['all copies'] / psutil.cpu_count():.1f} ms at p50 with the worker's own CPU alone"))
    print(f"open loop at {args.rate:g} req/s, {args.open_seconds:g} s a run (the second harness):")
    print("| round | requests for | p50 ms | p99 ms | sender lag p99 ms | failed |")
    print("|---|---|---|---|---|---|")
    for row in opened:
        print(f"| {row['round']} | {row['target']} | {row['p50_ms']} | {row['p99_ms']} | {row['sender_lag_p99_ms']} | "
              f"{row['failed']} |")
    if generators:
        print(f"closed loop of {args.concurrency} over all {args.copies} copies, by generator, whole runs alternating:")
        print("| round | generator | req/s | p50 ms | p99 ms | failed |")
        print("|---|---|---|---|---|---|")
        for row in generators:
            print(f"| {row['round']} | {row['generator']} | {row['req_s']} | {row['p50_ms']} | {row['p99_ms']} | "
                  f"{row['failed']} |")
    print(f"GET /models?limit=100: {models_paged[0]:.1f} ms, {models_paged[1]} bytes; "
          f"GET /models: {models_whole[0]:.1f} ms, {models_whole[1]} bytes")
    print(f"GET /metrics: {metrics_time[0]:.1f} ms, {metrics_time[1]} bytes, {series} samples")


if __name__ == "__main__":
    main()
