"""A realtime model's latency while a batch model floods the same pool, with latency classes and without.

Seed 002 asks that placement keep real-time models away from batch ones. Starts the real
pieces on loopback: two ``hotset-worker`` processes, each held to one core with
``taskset`` (a pod's CPU limit, on this machine), and a ``hotset-router`` in front. Two
copies of the sample text classifier are served: ``rt`` and ``bulk``. With classes
(``rt: realtime``, ``bulk: batch``) the router keeps them on different pods; without
(both ``standard``) best fit packs both onto one pod, as it does for any two small models.

Each run measures ``rt`` through the router, one text per request, alone and then while
``--flood`` clients (in a process of their own) send ``bulk`` requests of ``--bulk-rows``
texts back to back. Two harnesses measure the same
thing: a closed loop (the next ``rt`` request when the last one answered) and an open loop
(``rt`` requests at ``--rate`` per second on a fixed schedule, each timed from when it was
due, so a stall also counts for the requests it delays). Runs with and without classes
alternate, ``--rounds`` of each; the figure is the p99 under flood over the p99 alone of
the same run (the issue's target: at most 1.5x with classes).

Usage: .venv/bin/python benchmarks/latency_classes.py [--rounds 2] [--requests 300] [--flood 8] [--rate 40]
       (needs ``taskset`` and two cores; builds the sample models once into build/models)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import local_stack  # noqa: E402

SAMPLES = ROOT / "build/models"
BODY = {"input_data": "a wonderful little model"}


def sample_store() -> Path:
    store = SAMPLES / "model-store.json"
    if not store.exists():
        subprocess.run([str(ROOT / ".venv/bin/hotset-samples"), "--out", str(SAMPLES)], check=True)
    return store


def write_store(folder: Path, classes: bool) -> Path:
    """`rt` and `bulk`: the sample text classifier twice, with latency classes or both standard."""
    models = json.loads(sample_store().read_text())["models"]
    base = next(m for m in models if m.get("task") == "text-classification")
    entries = []
    for model_id, latency in (("rt", "realtime"), ("bulk", "batch")):
        entry = {**base, "id": model_id, "name": model_id, "replicas": {"min": 0, "max": 1}}
        entry.pop("pinned", None)
        if classes:
            entry["latency_class"] = latency
        entries.append(entry)
    store = folder / f"store-{'classes' if classes else 'plain'}.json"
    store.write_text(json.dumps({"models": entries}))
    return store


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def closed_loop(client: httpx.AsyncClient, url: str, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        (await client.post(f"{url}/predict", json={"model_id": "rt", **BODY})).raise_for_status()
        samples.append(time.perf_counter() - started)
    return samples


async def open_loop(client: httpx.AsyncClient, url: str, count: int, rate: float) -> list[float]:
    """`count` requests due every 1/rate s; each timed from when it was due (coordinated omission counted)."""
    samples: list[float] = []
    start = time.perf_counter()

    async def one(due: float) -> None:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        (await client.post(f"{url}/predict", json={"model_id": "rt", **BODY})).raise_for_status()
        samples.append(time.perf_counter() - due)

    await asyncio.gather(*(one(start + i / rate) for i in range(count)))
    return samples


async def _flood(url: str, clients: int, rows: int, stop, done) -> None:
    body = {"model_id": "bulk", "input_data": [BODY["input_data"]] * rows}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def loop() -> None:
            while not stop.is_set():
                (await client.post(f"{url}/predict", json=body)).raise_for_status()
                with done.get_lock():
                    done.value += 1

        await asyncio.gather(*(loop() for _ in range(clients)))


def flood_process(url: str, clients: int, rows: int, stop, done) -> None:
    """The batch flood, in a process of its own (in the measuring process its event loop would
    delay the rt requests it measures)."""
    asyncio.run(_flood(url, clients, rows, stop, done))


async def measure(url: str, args: argparse.Namespace) -> dict[str, float]:
    limits = httpx.Limits(max_connections=args.flood + 64, max_keepalive_connections=args.flood + 64)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for model in ("bulk", "rt"):  # both loaded (bulk first: best fit then packs rt beside it if it may)
            for _ in range(20):
                (await client.post(f"{url}/predict", json={"model_id": model, **BODY})).raise_for_status()
        await asyncio.sleep(1.5)  # the router's next look at the pods shows both copies
        pods = (await client.get(f"{url}/router/pods")).json()
        alone_closed = await closed_loop(client, url, args.requests)
        alone_open = await open_loop(client, url, args.requests, args.rate)
        stop, done = multiprocessing.Event(), multiprocessing.Value("l", 0)
        flooder = multiprocessing.Process(target=flood_process, args=(url, args.flood, args.bulk_rows, stop, done))
        flooder.start()
        while done.value < args.flood:  # the flood is under way
            await asyncio.sleep(0.05)
        started, before = time.perf_counter(), done.value
        flooded_closed = await closed_loop(client, url, args.requests)
        flooded_open = await open_loop(client, url, args.requests, args.rate)
        seconds = time.perf_counter() - started
        bulk_done = done.value - before
        stop.set()
        flooder.join(60)
    return {
        "shared_pod": float(_shared(pods)),
        "closed_alone_p99": percentile(alone_closed, 0.99), "closed_flood_p99": percentile(flooded_closed, 0.99),
        "closed_alone_p50": statistics.median(alone_closed), "closed_flood_p50": statistics.median(flooded_closed),
        "open_alone_p99": percentile(alone_open, 0.99), "open_flood_p99": percentile(flooded_open, 0.99),
        "bulk_rate": bulk_done / max(seconds, 1e-9),
    }


def _shared(pods: list[dict]) -> bool:
    """Whether one pod holds both rt and bulk (the router's ``/router/pods``)."""
    return any({"rt", "bulk"} <= set(pod["copies"]) for pod in pods)


def run(folder: Path, classes: bool, args: argparse.Namespace) -> dict[str, float]:
    store = write_store(folder, classes)
    logs = folder / f"logs-{'classes' if classes else 'plain'}"
    workers = []
    router = None
    try:
        for core in (0, 1):
            workers.append(local_stack.start_worker(
                f"pod-{core}", store, logs, "2Gi", launcher=["taskset", "-c", str(core), str(ROOT / ".venv/bin/hotset-worker")],
                extra_args=["--log-level", "warning"]))
        for worker in workers:
            local_stack.wait_http(worker, "/v2/health/ready", 120)
        router = local_stack.start_router([w.url for w in workers], logs, extra_args=["--log-level", "warning"])
        local_stack.wait_http(router, "/v2/health/ready", 60)
        return asyncio.run(measure(router.url, args))
    finally:
        for process in (router, *workers):
            if process is not None:
                process.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating")
    parser.add_argument("--requests", type=int, default=300, help="rt requests per harness and phase")
    parser.add_argument("--flood", type=int, default=8, help="clients sending bulk requests back to back")
    parser.add_argument("--bulk-rows", type=int, default=32, help="texts per bulk request (a batch job's request)")
    parser.add_argument("--rate", type=float, default=40.0, help="open loop: rt requests per second")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        raise SystemExit("needs taskset and at least two cores (one per worker)")
    results: dict[str, list[dict[str, float]]] = {"classes": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="latency-classes-") as tmp:
        for round_ in range(args.rounds):
            order = [True, False] if round_ % 2 == 0 else [False, True]
            for classes in order:
                results["classes" if classes else "plain"].append(run(Path(tmp), classes, args))
    ms = 1000.0
    print(f"latency classes: rt alone vs rt while {args.flood} clients flood bulk; {args.requests} rt requests per "
          f"harness and phase; {args.rounds} runs per mode, alternating; two workers on one core each")
    print(f"{'mode':<9}{'same pod':>9}{'closed p50':>12}{'closed p99':>12}{'flood/alone':>12}"
          f"{'open p99':>10}{'flood/alone':>12}{'bulk req/s':>11}")
    for mode, runs in results.items():
        for r in runs:
            print(f"{mode:<9}{'yes' if r['shared_pod'] else 'no':>9}"
                  f"{r['closed_alone_p50'] * ms:>5.1f}->{r['closed_flood_p50'] * ms:<5.1f}"
                  f"{r['closed_alone_p99'] * ms:>5.1f}->{r['closed_flood_p99'] * ms:<5.1f}"
                  f"{r['closed_flood_p99'] / r['closed_alone_p99']:>11.2f}x"
                  f"{r['open_flood_p99'] * ms:>9.1f} {r['open_flood_p99'] / r['open_alone_p99']:>11.2f}x"
                  f"{r['bulk_rate']:>11.0f}")
    for mode, runs in results.items():
        closed = statistics.median(r["closed_flood_p99"] / r["closed_alone_p99"] for r in runs)
        opened = statistics.median(r["open_flood_p99"] / r["open_alone_p99"] for r in runs)
        print(f"{mode}: p99 under flood / alone, median of runs: closed loop {closed:.2f}x, open loop {opened:.2f}x")
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
