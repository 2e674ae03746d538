"""Namespace B's latency while namespace A floods the same worker pod, tree by tree, side by side.

Issue 22's fairness target: namespace A floods, namespace B's p99 stays within 1.5x of its p99
alone. Starts one real ``hotset-worker`` held to one core with ``taskset`` (a pod's CPU limit,
on this machine), serving the sample text classifier twice: ``a-model`` in namespace
``team-a`` and ``b-model`` in ``team-b``. The measuring client and A's flood (a process of
its own: ``--flood`` clients sending back to back) run on the other core.

Each run measures B alone, then while A floods, with two harnesses: a closed loop (the next
request when the last answered) and an open loop (``--rate`` requests a second on a fixed
schedule, each timed from when it was due, so a stall counts for every request it delays).
A's model runs unbatched (``--a-batching off``, the default here: each of A's requests is a
forward pass of its own, the deepest queue a flood can make) or with the task's default
batching (``on``: A's requests share passes, so at most one of A's passes waits at a time).

``--trees label=path,...`` runs the worker of each source tree (its ``common`` and
``worker-image`` on ``PYTHONPATH``), whole runs alternating, ``--rounds`` of each: e.g. this
tree beside a checkout of the commit before fair shares (``git worktree add /tmp/fifo
532c751~1``), whose inference threads are one FIFO queue.

Usage: .venv/bin/python benchmarks/namespace_fairness.py [--trees fair=.,fifo=/tmp/fifo]
       [--rounds 2] [--requests 200] [--flood 16] [--rate 20] [--a-batching off]
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
TEXT = "a wonderful little model"
TENANTS = {"a-model": "team-a", "b-model": "team-b"}


def sample_store() -> Path:
    store = SAMPLES / "model-store.json"
    if not store.exists():
        subprocess.run([str(ROOT / ".venv/bin/hotset-samples"), "--out", str(SAMPLES)], check=True)
    return store


def write_store(folder: Path, a_batching: bool) -> Path:
    models = json.loads(sample_store().read_text())["models"]
    base = next(m for m in models if m.get("task") == "text-classification")
    entries = []
    for model_id, namespace in TENANTS.items():
        entry = {**base, "id": model_id, "name": model_id, "sourceOptions": {"namespace": namespace}}
        entry.pop("pinned", None)
        if model_id == "a-model" and not a_batching:
            entry["batching"] = {"maxBatchSize": 1}
        entries.append(entry)
    store = folder / f"store-{'batched' if a_batching else 'unbatched'}.json"
    store.write_text(json.dumps({"models": entries}))
    return store


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def predict(client: httpx.AsyncClient, url: str, model: str) -> None:
    (await client.post(f"{url}/predict", json={"model_id": model, "input_data": TEXT})).raise_for_status()


async def closed_loop(client: httpx.AsyncClient, url: str, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await predict(client, url, "b-model")
        samples.append(time.perf_counter() - started)
    return samples


async def open_loop(client: httpx.AsyncClient, url: str, count: int, rate: float) -> list[float]:
    samples: list[float] = []
    start = time.perf_counter()

    async def one(due: float) -> None:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await predict(client, url, "b-model")
        samples.append(time.perf_counter() - due)

    await asyncio.gather(*(one(start + i / rate) for i in range(count)))
    return samples


async def _flood(url: str, clients: int, stop, done) -> None:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def loop() -> None:
            while not stop.is_set():
                await predict(client, url, "a-model")
                with done.get_lock():
                    done.value += 1

        await asyncio.gather(*(loop() for _ in range(clients)))


def flood_process(url: str, clients: int, stop, done) -> None:
    asyncio.run(_flood(url, clients, stop, done))


async def measure(url: str, args: argparse.Namespace) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=120) as client:
        for model in TENANTS:
            for _ in range(20):
                await predict(client, url, model)
        alone_closed = await closed_loop(client, url, args.requests)
        alone_open = await open_loop(client, url, args.requests, args.rate)
        stop, done = multiprocessing.Event(), multiprocessing.Value("l", 0)
        flooder = multiprocessing.Process(target=flood_process, args=(url, args.flood, stop, done))
        flooder.start()
        while done.value < args.flood:
            await asyncio.sleep(0.05)
        started, before = time.perf_counter(), done.value
        flooded_closed = await closed_loop(client, url, args.requests)
        flooded_open = await open_loop(client, url, args.requests, args.rate)
        seconds = time.perf_counter() - started
        a_done = done.value - before
        stop.set()
        flooder.join(120)
    return {
        "closed_alone_p50": statistics.median(alone_closed), "closed_flood_p50": statistics.median(flooded_closed),
        "closed_alone_p99": percentile(alone_closed, 0.99), "closed_flood_p99": percentile(flooded_closed, 0.99),
        "open_alone_p99": percentile(alone_open, 0.99), "open_flood_p99": percentile(flooded_open, 0.99),
        "a_rate": a_done / max(seconds, 1e-9),
    }


def run(folder: Path, label: str, tree: Path, args: argparse.Namespace) -> dict[str, float]:
    store = write_store(folder, args.a_batching == "on")
    path = os.pathsep.join(str(tree / part) for part in ("common", "worker-image"))
    launcher = ["env", f"PYTHONPATH={path}", "taskset", "-c", str(args.worker_core), str(ROOT / ".venv/bin/hotset-worker")]
    worker = local_stack.start_worker(f"fair-{label}", store, folder / f"logs-{label}", "2Gi", launcher=launcher,
                                      extra_args=["--log-level", "warning"])
    try:
        local_stack.wait_http(worker, "/v2/health/ready", 180)
        return asyncio.run(measure(worker.url, args))
    finally:
        worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=f"this={ROOT}", help="label=path,... of source trees whose workers to run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating")
    parser.add_argument("--requests", type=int, default=200, help="B's requests per harness and phase")
    parser.add_argument("--flood", type=int, default=16, help="A's clients sending back to back")
    parser.add_argument("--rate", type=float, default=20.0, help="open loop: B's requests per second")
    parser.add_argument("--a-batching", choices=("on", "off"), default="off", help="A's model batched or not")
    parser.add_argument("--worker-core", type=int, default=1, help="the core the worker is held to")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        raise SystemExit("needs taskset and at least two cores (the worker on one, the clients on the other)")
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    others = set(range(os.cpu_count() or 2)) - {args.worker_core}
    os.sched_setaffinity(0, others)  # the clients (and the flood process) stay off the worker's core
    results: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory(prefix="namespace-fairness-") as tmp:
        for round_ in range(args.rounds):
            labels = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for label in labels:
                results[label].append(run(Path(tmp), label, Path(trees[label]).resolve(), args))
    ms = 1000.0
    print(f"namespace fairness: team-b's requests alone vs while team-a floods with {args.flood} clients "
          f"(A batching {args.a_batching}); {args.requests} requests per harness and phase; {args.rounds} runs "
          f"per tree, alternating; the worker on one core, load {os.getloadavg()[0]:.1f}")
    print(f"{'tree':<8}{'closed p50 ms':>16}{'closed p99 ms':>16}{'flood/alone':>12}"
          f"{'open p99 ms':>16}{'flood/alone':>12}{'A req/s':>9}")
    for label, runs in results.items():
        for r in runs:
            print(f"{label:<8}{r['closed_alone_p50'] * ms:>7.1f}->{r['closed_flood_p50'] * ms:<7.1f}"
                  f"{r['closed_alone_p99'] * ms:>7.1f}->{r['closed_flood_p99'] * ms:<7.1f}"
                  f"{r['closed_flood_p99'] / r['closed_alone_p99']:>11.2f}x"
                  f"{r['open_alone_p99'] * ms:>7.1f}->{r['open_flood_p99'] * ms:<7.1f}"
                  f"{r['open_flood_p99'] / r['open_alone_p99']:>11.2f}x{r['a_rate']:>9.1f}")
    for label, runs in results.items():
        closed = statistics.median(r["closed_flood_p99"] / r["closed_alone_p99"] for r in runs)
        opened = statistics.median(r["open_flood_p99"] / r["open_alone_p99"] for r in runs)
        print(f"{label}: median p99 flood/alone closed {closed:.2f}x, open {opened:.2f}x (target <= 1.5x)")
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
