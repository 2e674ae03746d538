"""A second harness for the thrash workload: whole runs, one server at a time, alternating.

The same workload as ``worker_under_thrash.py`` (twelve small BERTs, room for
two, one seeded Zipf(1.0) sequence of ``--requests`` ``POST /predict``), with
a different method, so a headline figure never rests on one harness:

- **One server alive at a time.** Each run starts its target fresh, warms it
  (the same two requests for every target), replays the whole sequence, and
  stops it before the next target starts. ``worker_under_thrash.py`` keeps
  every target alive and feeds them the trace in turn, 60 requests at a time.
- **Clients drain one shared queue.** ``--concurrency`` clients each take the
  next request from one ``asyncio.Queue`` as soon as their last one is
  answered (a closed loop), over keep-alive connections (httpx).
- **Whole runs alternate** between targets (A B A B ... in each round, the
  order flipped every round), so slow drifts of a shared machine hit both.

Prints every run, then per concurrency the mean ok req/s, p50/p99 and the
ratios against the reference, plus the worker's loads per run (its
``hotset_model_loads_total``) and its Server-Timing split (queue, load,
batch, infer per request).

Usage: .venv/bin/python benchmarks/worker_closed_loop.py [--requests 600] [--rounds 2] [--concurrency 1,8]
       [--targets reference,worker] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_models  # noqa: E402
from hotset_testing.processes import free_port, spawn, wait_http  # noqa: E402

VENV_BIN = Path(sys.executable).parent
MAX_MODELS = 2
TEXT = "what a wonderful little movie"
WARM_UP = ["m012", "m011"]
# The reference with torch's intra-op threads at 1: on two busy cores torch's default (one thread
# per core) makes a small BERT's pass 10x slower, which would flatter any comparison with it.
REFERENCE_ONE_THREAD = "reference-1t"


@contextlib.contextmanager
def fresh(kind: str, store: Path, logs: Path) -> Iterator[str]:
    """A new server of `kind` on a free port, stopped (by pid) when the block ends."""
    port = free_port()
    env = None
    if kind.startswith("reference"):
        argv = [sys.executable, str(REPO / "benchmarks" / "seed_reference_server.py"), "--store", str(store),
                "--port", str(port), "--max-models", str(MAX_MODELS)]
        if kind == REFERENCE_ONE_THREAD:  # the same server, torch told to use one thread (OMP_NUM_THREADS)
            env = {"OMP_NUM_THREADS": "1"}
    else:
        argv = [str(VENV_BIN / "hotset-worker"), "--model-store", str(store), "--port", str(port),
                "--max-models", str(MAX_MODELS), "--memory-budget", "4Gi", "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with spawn(kind, argv, logs / f"{kind}-{port}.log", url=url, own_session=True, stop_timeout_s=20, env=env) as child:
        wait_http(child, "/v2/health/ready", 180)
        yield url


async def closed_loop(url: str, trace: list[str], concurrency: int) -> dict[str, Any]:
    """`concurrency` clients drain one queue of `trace`; every answer's status, seconds and timing."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for model in trace:
        queue.put_nowait(model)
    answers: list[tuple[int, float, str]] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
        async def one_client() -> None:
            while True:
                try:
                    model = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                started = time.perf_counter()
                try:
                    response = await client.post("/predict", json={"model_id": model, "input_data": TEXT})
                    answers.append((response.status_code, time.perf_counter() - started,
                                    response.headers.get("server-timing", "")))
                except httpx.HTTPError:
                    answers.append((599, time.perf_counter() - started, ""))

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    latencies = sorted(seconds for _, seconds, _ in answers)
    ok = sum(1 for status, _, _ in answers if status == 200)
    split: dict[str, list[float]] = {}
    for _, _, header in answers:
        for item in filter(None, (part.strip() for part in header.split(","))):
            name, _, duration = item.partition(";dur=")
            split.setdefault(name, []).append(float(duration or 0))
    return {
        "requests": len(answers), "failed": len(answers) - ok, "ok_req_s": round(ok / wall, 2),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000, 1),
        "server_timing_ms": {name: round(statistics.fmean(values), 1) for name, values in split.items()},
    }


def loads_of(url: str) -> int | None:
    """The worker's successful loads so far (its Prometheus counter); None for the reference."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith("hotset_model_loads_total{") and 'result="success"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def one_run(kind: str, store: Path, logs: Path, trace: list[str], concurrency: int) -> dict[str, Any]:
    with fresh(kind, store, logs) as url:
        asyncio.run(closed_loop(url, WARM_UP, 1))  # first-request costs, the same for every target
        before = loads_of(url) if not kind.startswith("reference") else None
        result = asyncio.run(closed_loop(url, trace, concurrency))
        if before is not None:
            result["loads"] = (loads_of(url) or 0) - before
    return {"target": kind, "concurrency": concurrency, **result}


def report(runs: list[dict[str, Any]], targets: list[str], concurrencies: list[int]) -> None:
    print("\n(x reference: against the reference as it is / with one torch thread, where both ran)")
    print("| concurrency | target | ok req/s (runs) | p50 ms | p99 ms | failed | loads | x reference req/s | p99 / reference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for concurrency in concurrencies:
        ref = [r for r in runs if r["target"] == "reference" and r["concurrency"] == concurrency]
        ref_1t = [r for r in runs if r["target"] == REFERENCE_ONE_THREAD and r["concurrency"] == concurrency]
        for kind in targets:
            mine = [r for r in runs if r["target"] == kind and r["concurrency"] == concurrency]
            if not mine:
                continue
            each = ", ".join(f"{r['ok_req_s']:.1f}" for r in mine)
            mean = statistics.fmean(r["ok_req_s"] for r in mine)
            p99 = statistics.fmean(r["p99_ms"] for r in mine)
            loads = ", ".join(str(r["loads"]) for r in mine if "loads" in r) or "-"
            ratio = p99_ratio = "-"
            ratios, p99s = [], []
            for base in (ref, ref_1t):
                if base and not kind.startswith("reference"):
                    ratios.append(f"{mean / statistics.fmean(r['ok_req_s'] for r in base):.2f}")
                    p99s.append(f"{p99 / statistics.fmean(r['p99_ms'] for r in base):.2f}")
            if ratios:
                ratio, p99_ratio = " / ".join(ratios), " / ".join(p99s)
            print(f"| {concurrency} | {kind} | {mean:.1f} ({each}) | {statistics.fmean(r['p50_ms'] for r in mine):.0f} | "
                  f"{p99:.0f} | {sum(r['failed'] for r in mine)} of {sum(r['requests'] for r in mine)} | {loads} | "
                  f"{ratio} | {p99_ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--targets", default=f"reference,{REFERENCE_ONE_THREAD},worker")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    targets = [t for t in args.targets.split(",") if t]
    store = bench_models.ensure_models()
    trace = bench_models.zipf_trace(bench_models.model_ids(), args.requests, seed=args.seed)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="closed-loop-") as scratch:
        for round_index in range(args.rounds):
            for concurrency in concurrencies:
                order = targets if round_index % 2 == 0 else list(reversed(targets))
                for kind in order:
                    run = one_run(kind, store, Path(scratch), trace, concurrency)
                    run["round"] = round_index + 1
                    print(json.dumps(run), flush=True)
                    runs.append(run)
    report(runs, targets, concurrencies)
    if args.json_out:
        args.json_out.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
