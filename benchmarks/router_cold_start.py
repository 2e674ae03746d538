#!/usr/bin/env python3
"""Cold-start rate under a seeded Zipf workload: router placement vs random routing vs whole-cluster LRU vs Belady.

A simulation that drives the router's real placement code
(``placement.place_cold`` over ``PodRoom`` snapshots) over simulated workers
that evict with the worker's own shared cost model (``cache_sim.PolicyPod``),
on the same request sequence as:

- random routing: each request goes to a uniformly random worker, whose own
  LRU cache loads the model on a miss (what a plain load balancer does);
- one LRU cache as large as the whole cluster (the best a single shared
  cache can do online);
- Belady's offline optimum with the same total room (the floor no online
  policy beats).

A "cold start" is a request that needed a load. Models are equal-sized here
so the whole-cluster caches are comparable slot for slot; the router's own
pods still work in bytes.

``--real`` also replays the same trace through real processes: three
``hotset-worker`` processes (test-only ballast models of 1 MiB, budget
= slots x 1 MiB) behind a real ``hotset-router``, and the same workers
hit directly at random; loads are counted from the workers' own
``hotset_model_loads_total`` metrics.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cache_sim  # noqa: E402
from hotset_common.eviction import EvictionPolicy  # noqa: E402

MODEL_BYTES = 100 * 2**20


def zipf_trace(models: int, requests: int, s: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    names = [f"model-{i:02d}" for i in range(models)]
    rng.shuffle(names)  # popularity is not alphabetical
    weights = [1.0 / (rank + 1) ** s for rank in range(models)]
    return rng.choices(names, weights=weights, k=requests)


def models_of(names: Iterable[str]) -> dict[str, cache_sim.Model]:
    return {name: cache_sim.Model(name, MODEL_BYTES, 1.0) for name in names}


def router_loads(trace: Sequence[str], workers: int, slots: int) -> int:
    """Requests go where the model is; a cold model goes where the real placement code says, and each
    worker evicts with the shared cost model (the manager's choose_victims)."""
    models = models_of(trace)
    pods = [cache_sim.PolicyPod(f"http://worker-{i}", slots * MODEL_BYTES, EvictionPolicy(), {}) for i in range(workers)]
    cache_sim.routed(pods, [(float(now), models[name]) for now, name in enumerate(trace)])
    return sum(p.loads for p in pods)


def random_routing_loads(trace: Sequence[str], workers: int, slots: int, seed: int) -> int:
    """A plain load balancer: each request to a random worker, whose own LRU loads on a miss."""
    rng = random.Random(seed + 1)
    models = models_of(trace)
    pods = [cache_sim.LruPod(f"http://worker-{i}", slots * MODEL_BYTES) for i in range(workers)]
    return sum(rng.choice(pods).serve(models[name], float(now)) for now, name in enumerate(trace))


def lru_loads(trace: Sequence[str], capacity: int) -> int:
    models = models_of(trace)
    pod = cache_sim.LruPod("http://cluster", capacity * MODEL_BYTES)
    return sum(pod.serve(models[name], float(now)) for now, name in enumerate(trace))


def belady_loads(trace: Sequence[str], capacity: int) -> int:
    """Offline optimum: on a miss with a full cache, evict the model used furthest in the future."""
    next_use: list[float] = [0.0] * len(trace)
    seen: dict[str, int] = {}
    for i in range(len(trace) - 1, -1, -1):
        next_use[i] = seen.get(trace[i], float("inf"))
        seen[trace[i]] = i
    cache: dict[str, float] = {}
    loads = 0
    for i, model in enumerate(trace):
        if model not in cache:
            loads += 1
            if len(cache) >= capacity:
                victim = max(cache, key=cache.__getitem__)
                del cache[victim]
        cache[model] = next_use[i]
    return loads


def run(models: int, workers: int, slots: int, requests: int, s: float, seed: int) -> dict[str, int]:
    trace = zipf_trace(models, requests, s, seed)
    return {
        "router": router_loads(trace, workers, slots),
        "random": random_routing_loads(trace, workers, slots, seed),
        "lru": lru_loads(trace, workers * slots),
        "belady": belady_loads(trace, workers * slots),
    }


def write_ballast_store(folder: Path, names: Iterable[str], size: int) -> Path:
    entries = []
    for name in sorted(set(names)):
        model = folder / name
        model.mkdir(parents=True, exist_ok=True)
        (model / "ballast.json").write_text(json.dumps({"bytes": size, "load_delay_s": 0, "factor": 2.0}))
        entries.append({"id": name, "framework": "torchvision", "source": f"file://{model}", "memory": size})
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": entries}))
    return store


def worker_loads(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
    return sum(s.value for f in families for s in f.samples
               if s.name == "hotset_model_loads_total" and s.labels.get("result") == "success")


def real_loads(trace: Sequence[str], models: int, workers: int, slots: int, seed: int) -> dict[str, int]:
    """Replay `trace` through a real router and, on fresh workers, at random; loads from the workers' metrics."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import local_stack

    launcher = [sys.executable, str(ROOT / "tests/router/ballast_worker_main.py")]
    size = 2**20
    results: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="router-cold-start-") as tmp:
        folder = Path(tmp)
        store = write_ballast_store(folder, [f"model-{i:02d}" for i in range(models)], size)
        for mode in ("router", "random"):
            started: list = []
            try:
                pool = [local_stack.start_worker(f"worker-{i + 1}", store, folder / "logs", str(slots * size),
                                                 extra_args=["--min-residency-s", "0", "--log-level", "warning"],
                                                 launcher=launcher) for i in range(workers)]
                started += pool
                for worker in pool:
                    local_stack.wait_http(worker, "/v2/health/ready", 90)
                if mode == "router":
                    router = local_stack.start_router([w.url for w in pool], folder / "logs", extra_args=[
                        "--churn-guard-seconds", "0", "--log-level", "warning"])
                    started.append(router)
                    local_stack.wait_http(router, "/v2/health/ready", 60)
                    targets = lambda _rng: router.url  # noqa: E731
                else:
                    targets = lambda rng: rng.choice(pool).url  # noqa: E731
                rng = random.Random(seed + 1)
                with httpx.Client(timeout=60) as client:
                    for model in trace:
                        response = client.post(f"{targets(rng)}/predict", json={"model_id": model, "input_data": [1]})
                        response.raise_for_status()
                results[mode] = int(sum(worker_loads(w.url) for w in pool))
            finally:
                for process in reversed(started):
                    process.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=30)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--real", action="store_true", help="also replay the trace through real worker and router processes")
    parser.add_argument("--real-requests", type=int, default=600)
    parser.add_argument("--real-slots", type=int, default=6)
    args = parser.parse_args()
    print(f"cold-start rate: Zipf({args.zipf}) over {args.models} models, {args.requests} requests, "
          f"{args.workers} workers, seed {args.seed} (simulation driving the router's real placement code)")
    print(f"{'slots/worker':>12}{'router':>10}{'random':>10}{'LRU(all)':>10}{'Belady':>10}{'router/LRU':>12}{'random/router':>15}")
    for slots in (2, 4, 6):
        r = run(args.models, args.workers, slots, args.requests, args.zipf, args.seed)
        share = {k: v / args.requests for k, v in r.items()}
        print(f"{slots:>12}{share['router']:>10.1%}{share['random']:>10.1%}{share['lru']:>10.1%}{share['belady']:>10.1%}"
              f"{r['router'] / r['lru']:>12.2f}{r['random'] / r['router']:>15.2f}")
    check = run(12, 1, 6, 600, 1.0, args.seed)
    print(f"scale check (12 models, 600 requests, 6 slots): LRU {check['lru'] / 600:.1%}, Belady {check['belady'] / 600:.1%}")
    if args.real:
        n, slots = args.real_requests, args.real_slots
        trace = zipf_trace(args.models, n, args.zipf, args.seed)
        real = real_loads(trace, args.models, args.workers, slots, args.seed)
        lru, belady = lru_loads(trace, args.workers * slots), belady_loads(trace, args.workers * slots)
        print(f"real processes: {n} requests, {args.workers} workers x {slots} slots, loads from the workers' metrics")
        print(f"{'router':>10}{'random':>10}{'LRU(all)':>10}{'Belady':>10}{'router/LRU':>12}{'random/router':>15}")
        print(f"{real['router'] / n:>10.1%}{real['random'] / n:>10.1%}{lru / n:>10.1%}{belady / n:>10.1%}"
              f"{real['router'] / lru:>12.2f}{real['random'] / real['router']:>15.2f}")


if __name__ == "__main__":
    main()
