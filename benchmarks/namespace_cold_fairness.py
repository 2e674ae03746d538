"""Namespace B's cold loads while namespace A thrashes cold models on the same worker pod, tree by
tree, side by side.

The admission queue's half of issue 22's fairness (namespace_fairness.py measures the inference
threads' half, on warm models). Starts one real ``hotset-worker`` held to one core with
``taskset``, with room for ``--room`` copies, serving the sample text classifier under many
ids: ``a0``.. in namespace ``team-a`` and ``b0``.. in ``team-b``. Every request is for a model
with no copy: A's ``--flood`` clients (a process of its own, on the other core) each ask for a
model drawn from A's ``--a-models`` (seeded), so A always has loads queued; B's one client
asks for its models in turn, more of them than there is room, so each of B's requests is a
load. Measured: B's latency alone, then while A floods, with two harnesses: a closed loop (the next
request when the last answered) and an open loop (``--rate`` a second on a fixed schedule, each
timed from when it was due).

With the admission queue first come, first served, B's load waits behind every load A queued
before it; shared by namespace, behind at most the one running and one more.

``--trees label=path,...`` runs the worker of each source tree (its ``common`` and
``worker-image`` on ``PYTHONPATH``), whole runs alternating, ``--rounds`` of each: e.g. this
tree beside a checkout of the commit before the fair queue (``git worktree add /tmp/fifo
<commit>``).

Usage: .venv/bin/python benchmarks/namespace_cold_fairness.py [--trees fair=.,fifo=/tmp/fifo]
       [--rounds 2] [--requests 20] [--flood 8] [--room 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import local_stack  # noqa: E402
from namespace_fairness import TEXT, percentile, sample_store  # noqa: E402


def write_store(folder: Path, a_models: int, b_models: int) -> Path:
    models = json.loads(sample_store().read_text())["models"]
    base = next(m for m in models if m.get("task") == "text-classification")
    entries = []
    for prefix, count, namespace in (("a", a_models, "team-a"), ("b", b_models, "team-b")):
        for number in range(count):
            entry = {**base, "id": f"{prefix}{number}", "name": f"{prefix}{number}",
                     "sourceOptions": {"namespace": namespace}}
            entry.pop("pinned", None)
            entry.pop("warmup", None)
            entries.append(entry)
    store = folder / "store-cold.json"
    store.write_text(json.dumps({"models": entries}))
    return store


async def predict(client: httpx.AsyncClient, url: str, model: str) -> None:
    (await client.post(f"{url}/predict", json={"model_id": model, "input_data": TEXT})).raise_for_status()


async def b_loop(client: httpx.AsyncClient, url: str, count: int, b_models: int, first: int) -> list[float]:
    samples = []
    for number in range(first, first + count):
        started = time.perf_counter()
        await predict(client, url, f"b{number % b_models}")
        samples.append(time.perf_counter() - started)
    return samples


async def b_open_loop(client: httpx.AsyncClient, url: str, count: int, b_models: int, first: int,
                      rate: float) -> list[float]:
    """B's requests on a fixed schedule, `rate` a second, each timed from when it was due (a stall
    counts for every request it delays)."""
    samples: list[float] = []
    start = time.perf_counter()

    async def one(number: int, due: float) -> None:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await predict(client, url, f"b{number % b_models}")
        samples.append(time.perf_counter() - due)

    await asyncio.gather(*(one(first + i, start + i / rate) for i in range(count)))
    return samples


async def _flood(url: str, clients: int, a_models: int, stop, done) -> None:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    draws = random.Random(7)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        async def loop() -> None:
            while not stop.is_set():
                await predict(client, url, f"a{draws.randrange(a_models)}")
                with done.get_lock():
                    done.value += 1

        await asyncio.gather(*(loop() for _ in range(clients)))


def flood_process(url: str, clients: int, a_models: int, stop, done) -> None:
    asyncio.run(_flood(url, clients, a_models, stop, done))


async def measure(url: str, args: argparse.Namespace) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=300) as client:
        await b_loop(client, url, args.b_models, args.b_models, 0)  # every model read once (the page cache)
        alone = await b_loop(client, url, args.requests, args.b_models, 0)
        alone_open = await b_open_loop(client, url, args.requests, args.b_models, 0, args.rate)
        stop, done = multiprocessing.Event(), multiprocessing.Value("l", 0)
        flooder = multiprocessing.Process(target=flood_process, args=(url, args.flood, args.a_models, stop, done))
        flooder.start()
        while done.value < args.flood:
            await asyncio.sleep(0.05)
        started, before = time.perf_counter(), done.value
        flooded = await b_loop(client, url, args.requests, args.b_models, args.requests)
        flooded_open = await b_open_loop(client, url, args.requests, args.b_models, args.requests, args.rate)
        seconds = time.perf_counter() - started
        a_done = done.value - before
        stop.set()
        flooder.join(300)
    return {"closed_alone_p50": statistics.median(alone), "closed_flood_p50": statistics.median(flooded),
            "closed_alone_p99": percentile(alone, 0.99), "closed_flood_p99": percentile(flooded, 0.99),
            "open_alone_p50": statistics.median(alone_open), "open_flood_p50": statistics.median(flooded_open),
            "open_alone_p99": percentile(alone_open, 0.99), "open_flood_p99": percentile(flooded_open, 0.99),
            "a_rate": a_done / max(seconds, 1e-9)}


def run(folder: Path, label: str, tree: Path, args: argparse.Namespace) -> dict[str, float]:
    store = write_store(folder, args.a_models, args.b_models)
    path = os.pathsep.join(str(tree / part) for part in ("common", "worker-image"))
    launcher = ["env", f"PYTHONPATH={path}", "taskset", "-c", str(args.worker_core), str(ROOT / ".venv/bin/hotset-worker")]
    worker = local_stack.start_worker(f"cold-{label}", store, folder / f"logs-{label}", "2Gi", launcher=launcher,
                                      extra_args=["--log-level", "warning", "--max-models", str(args.room),
                                                  "--request-timeout-s", "300"])
    try:
        local_stack.wait_http(worker, "/v2/health/ready", 180)
        return asyncio.run(measure(worker.url, args))
    finally:
        worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=f"this={ROOT}", help="label=path,... of source trees whose workers to run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating")
    parser.add_argument("--requests", type=int, default=20, help="B's requests (each a load) per phase")
    parser.add_argument("--flood", type=int, default=8, help="A's clients sending back to back")
    parser.add_argument("--rate", type=float, default=10.0, help="open loop: B's requests per second")
    parser.add_argument("--a-models", type=int, default=12, help="A's models (drawn at random)")
    parser.add_argument("--b-models", type=int, default=4, help="B's models (asked for in turn)")
    parser.add_argument("--room", type=int, default=2, help="copies the worker holds (--max-models)")
    parser.add_argument("--worker-core", type=int, default=1, help="the core the worker is held to")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        raise SystemExit("needs taskset and at least two cores (the worker on one, the clients on the other)")
    if args.b_models <= args.room:
        raise SystemExit("--b-models must exceed --room, so that each of B's requests is a load")
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    others = set(range(os.cpu_count() or 2)) - {args.worker_core}
    os.sched_setaffinity(0, others)  # the clients (and the flood process) stay off the worker's core
    results: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory(prefix="namespace-cold-fairness-") as tmp:
        for round_ in range(args.rounds):
            labels = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for label in labels:
                results[label].append(run(Path(tmp), label, Path(trees[label]).resolve(), args))
    ms = 1000.0
    print(f"namespace cold fairness: team-b's loads alone vs while team-a's {args.flood} clients thrash "
          f"{args.a_models} models; room for {args.room} copies; {args.requests} of B's requests per phase, each a "
          f"load; {args.rounds} runs per tree, alternating; the worker on one core, load {os.getloadavg()[0]:.1f}")
    print(f"{'tree':<8}{'closed p50 ms':>16}{'closed p99 ms':>16}{'open p50 ms':>16}{'open p99 ms':>16}{'A req/s':>9}"
          "   (B's latency, alone -> while A floods)")
    for label, runs in results.items():
        for r in runs:
            print(f"{label:<8}" + "".join(f"{r[f'{h}_alone_{q}'] * ms:>7.0f}->{r[f'{h}_flood_{q}'] * ms:<7.0f}"
                                          for h in ("closed", "open") for q in ("p50", "p99")) + f"{r['a_rate']:>9.1f}")
    for label, runs in results.items():
        figures = ", ".join(f"{h} {q} {statistics.median(r[f'{h}_flood_{q}'] / r[f'{h}_alone_{q}'] for r in runs):.2f}x"
                            for h in ("closed", "open") for q in ("p50", "p99"))
        print(f"{label}: median flood/alone: {figures}")
    labels = list(results)
    if len(labels) == 2:
        first, second = (results[label] for label in labels)
        for h in ("closed", "open"):
            for q in ("p50", "p99"):
                mine = statistics.median(r[f"{h}_flood_{q}"] for r in first)
                theirs = statistics.median(r[f"{h}_flood_{q}"] for r in second)
                print(f"B's {h} {q} while A floods: {labels[0]} {mine * ms:.0f} ms, {labels[1]} {theirs * ms:.0f} ms "
                      f"({labels[1]}/{labels[0]} {theirs / mine:.2f}x)")
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
