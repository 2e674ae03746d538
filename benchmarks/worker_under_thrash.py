"""More models wanted than fit: hotset beside a server built the way seed 000 describes.

The workload the issue names: twelve small BERT classifiers
(``bench_models``), room for two of them, one seeded Zipf(1.0) sequence of
``--requests`` ``POST /predict`` requests replayed by 1 and by 8 closed-loop
clients (``loadgen``). Targets, each run on a fresh server, alternating
so all see the same machine load:

- ``reference``: ``seed_reference_server.py`` (OrderedDict LRU, ``max_models=2``,
  evict then load inside the request);
- ``worker``: one ``hotset-worker --max-models 2``;
- ``router``: ``hotset-router`` in front of that worker.

Then scale-out: the router in front of 1, 2 and 3 such workers at the high
concurrency. Prints every run and the ratios against the reference; a cold
request's cost over its load and its model's warm latency comes from the
worker's ``Server-Timing`` header.

Usage: .venv/bin/python benchmarks/worker_under_thrash.py [--requests 600] [--rounds 2]
       [--concurrency 1,8] [--targets reference,worker,router] [--scale-out 1,2,3] [--json-out FILE]
       [--baseline-src CHECKOUT --targets reference,worker,worker@before]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_models  # noqa: E402
import loadgen  # noqa: E402
from hotset_testing.processes import free_port, spawn, wait_http  # noqa: E402

VENV_BIN = Path(sys.executable).parent
MAX_MODELS = 2


BASELINE_SUFFIX = "@before"
_baseline_env: dict[str, str] = {}


def use_baseline(source: Path) -> None:
    """Targets named `worker@before` / `router@before` run the code of another checkout (e.g. the last
    landing, from `git worktree add`), so a change is measured against what it replaces in one run."""
    dirs = [source / part for part in ("common", "worker-image", "router", "operator")]
    _baseline_env["PYTHONPATH"] = ":".join(str(d) for d in dirs)


@contextlib.contextmanager
def server(name: str, argv: list[str], port: int, logs: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    url = f"http://127.0.0.1:{port}"
    with spawn(name, argv, logs / f"{name}-{port}.log", url=url, own_session=True, stop_timeout_s=20, env=env) as child:
        wait_http(child, "/v2/health/ready", 180)
        yield url


def worker_argv(store: Path, port: int) -> list[str]:
    return [str(VENV_BIN / "hotset-worker"), "--model-store", str(store), "--port", str(port),
            "--max-models", str(MAX_MODELS), "--memory-budget", "4Gi", "--log-level", "warning"]


@contextlib.contextmanager
def target(kind: str, store: Path, logs: Path, workers: int = 1) -> Iterator[str]:
    """A fresh server of `kind`, its base URL while the block runs."""
    if kind == "reference":
        port = free_port()
        argv = [sys.executable, str(REPO / "benchmarks" / "seed_reference_server.py"), "--store", str(store),
                "--port", str(port), "--max-models", str(MAX_MODELS)]
        with server("reference", argv, port, logs) as url:
            yield url
        return
    env = _baseline_env if kind.endswith(BASELINE_SUFFIX) else None
    kind = kind.removesuffix(BASELINE_SUFFIX)
    with contextlib.ExitStack() as stack:
        urls = []
        for _ in range(workers if kind == "router" else 1):
            port = free_port()
            urls.append(stack.enter_context(server("worker", worker_argv(store, port), port, logs, env)))
            warm_up(urls[-1])  # every worker alike, also those behind the router
        if kind == "worker":
            yield urls[0]
            return
        port = free_port()
        argv = [str(VENV_BIN / "hotset-router"), "--workers", ",".join(urls), "--model-store", str(store),
                "--port", str(port), "--log-level", "warning"]
        yield stack.enter_context(server("router", argv, port, logs, env))


def warm_up(url: str) -> None:
    """First requests pay one-time costs (first inference, lazy imports) on every target alike."""
    asyncio.run(loadgen.replay(url, ["m012", "m011"], 1))


def cold_overheads(result: loadgen.RunResult) -> list[float]:
    """Per cold request: latency - (its load + its model's warm median), from the worker's Server-Timing."""
    warm: dict[str, list[float]] = {}
    cold: list[tuple[str, float, float]] = []
    for outcome in result.ok:
        timing = loadgen.server_timing(outcome.server_timing)
        if timing.get("load", 0.0) > 0:
            cold.append((outcome.model, outcome.seconds, timing["load"]))
        else:
            warm.setdefault(outcome.model, []).append(outcome.seconds)
    return [seconds - load - statistics.median(warm[model]) for model, seconds, load in cold if warm.get(model)]


def run_interleaved(kinds: list[str], store: Path, logs: Path, trace: list[str], concurrency: int,
                    workers: int = 1, segment: int = 60) -> list[dict[str, Any]]:
    """Every target of `kinds` started fresh and kept running; the trace replayed to each in turn,
    `segment` requests at a time (the order rotating), so all of them see the same machine load.
    Each target still sees the whole trace, in order, against its own cache."""
    results: dict[str, list[loadgen.RunResult]] = {kind: [] for kind in kinds}
    with contextlib.ExitStack() as stack:
        urls = {kind: stack.enter_context(target(kind, store, logs, workers)) for kind in kinds}
        for url in urls.values():
            warm_up(url)
        for index, start in enumerate(range(0, len(trace), segment)):
            chunk = trace[start:start + segment]
            order = kinds[index % len(kinds):] + kinds[:index % len(kinds)]
            for kind in order:
                results[kind].append(asyncio.run(loadgen.replay(urls[kind], chunk, concurrency)))
    summaries = []
    for kind, parts in results.items():
        merged = loadgen.RunResult([o for part in parts for o in part.outcomes], sum(part.wall_s for part in parts))
        summary = {"target": kind, "workers": workers, "concurrency": concurrency, **merged.summary()}
        overheads = cold_overheads(merged)
        if overheads:
            summary["cold_overhead_ms_p50"] = round(statistics.median(overheads) * 1000, 1)
            summary["cold_overhead_ms_p90"] = round(sorted(overheads)[int(0.9 * len(overheads))] * 1000, 1)
        print(json.dumps(summary), flush=True)
        summaries.append(summary)
    return summaries


def mean_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(run[key] for run in runs)


def report(runs: list[dict[str, Any]], targets: list[str], concurrencies: list[int]) -> None:
    print("\n| concurrency | target | req/s | ok req/s | p50 ms | p99 ms | failed | x reference ok req/s | p99 / reference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for concurrency in concurrencies:
        reference = [r for r in runs if r["target"] == "reference" and r["concurrency"] == concurrency and r["workers"] == 1]
        for kind in targets:
            mine = [r for r in runs if r["target"] == kind and r["concurrency"] == concurrency and r["workers"] == 1]
            if not mine:
                continue
            ratio = p99 = "-"
            if reference and kind != "reference":
                ratio = f"{mean_of(mine, 'ok_req_s') / mean_of(reference, 'ok_req_s'):.2f}"
                p99 = f"{mean_of(mine, 'p99_ms') / mean_of(reference, 'p99_ms'):.2f}"
            print(f"| {concurrency} | {kind} | {mean_of(mine, 'req_s'):.1f} | {mean_of(mine, 'ok_req_s'):.1f} | "
                  f"{mean_of(mine, 'p50_ms'):.0f} | {mean_of(mine, 'p99_ms'):.0f} | "
                  f"{sum(r['failed'] for r in mine)} of {sum(r['requests'] for r in mine)} | {ratio} | {p99} |")


def report_scale_out(runs: list[dict[str, Any]]) -> None:
    scale = [r for r in runs if r.get("scale_out")]
    if not scale:
        return
    base = [r["ok_req_s"] for r in scale if r["workers"] == 1]
    print("\n| workers behind the router | ok req/s | failed | p99 ms | x 1 worker | x linear |")
    print("|---|---|---|---|---|---|")
    for workers in sorted({r["workers"] for r in scale}):
        mine = [r for r in scale if r["workers"] == workers]
        ok = mean_of(mine, "ok_req_s")
        speedup = ok / statistics.fmean(base) if base else float("nan")
        print(f"| {workers} | {ok:.1f} | {sum(r['failed'] for r in mine)} | {mean_of(mine, 'p99_ms'):.0f} | "
              f"{speedup:.2f} | {speedup / workers:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--targets", default="reference,worker,router")
    parser.add_argument("--scale-out", default="1,2,3", help="worker counts behind the router ('' to skip)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline-src", type=Path, help="another checkout for the worker@before/router@before targets")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if args.baseline_src:
        use_baseline(args.baseline_src.resolve())
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    targets = [t for t in args.targets.split(",") if t]
    store = bench_models.ensure_models()
    trace = bench_models.zipf_trace(bench_models.model_ids(), args.requests, seed=args.seed)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="thrash-") as scratch:
        logs = Path(scratch)
        for _ in range(args.rounds):
            for concurrency in concurrencies:
                runs += run_interleaved(targets, store, logs, trace, concurrency)
        scale = [int(w) for w in args.scale_out.split(",") if w]
        for _ in range(args.rounds if scale else 0):
            for workers in scale:  # one at a time: three workers each can hold a core, interleaving would not share fairly
                for run in run_interleaved(["router"], store, logs, trace, max(concurrencies), workers):
                    run["scale_out"] = True
                    runs.append(run)
    report(runs, targets, concurrencies)
    report_scale_out(runs)
    if args.json_out:
        args.json_out.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
