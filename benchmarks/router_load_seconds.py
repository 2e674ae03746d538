#!/usr/bin/env python3
"""Seconds spent loading, on a heterogeneous trace: the router + workers' cost model vs one big LRU vs an offline bound.

The trace the issue names: 30 models whose sizes are 10x apart (200 MiB to
2 GiB) and whose load times are 0.05 to 2 s (both log-uniform, drawn
independently, seeded), requests drawn from Zipf(1.0) with the popularity
order reshuffled halfway through, arriving 20 a second. Compared on the same
trace, with the same total memory:

- ``router``: three simulated workers (``cache_sim.PolicyPod``: the manager's
  accounting, victims by the shared ``choose_victims``) behind the router's
  real placement code;
- ``lru``: one LRU cache as large as the whole cluster (by bytes);
- ``offline``: one cache of the same size that knows the future (Belady's
  rule weighted by load seconds and bytes).

Prints total load seconds and loads for each, and the ratios the targets name.

Usage: .venv/bin/python benchmarks/router_load_seconds.py [--requests 6000] [--seeds 1,2,3]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cache_sim  # noqa: E402
from hotset_common.eviction import DecayedCount, EvictionPolicy  # noqa: E402

MiB = 2**20
WORKERS = 3
WORKER_BUDGET = 3 * 1024 * MiB
ARRIVALS_PER_S = 20.0


def catalog(count: int, rng: random.Random) -> list[cache_sim.Model]:
    return [
        cache_sim.Model(f"model-{i:02d}", int(200 * MiB * 10 ** rng.random()), 0.05 * 40 ** rng.random())
        for i in range(count)
    ]


def shifting_zipf(models: list[cache_sim.Model], requests: int, rng: random.Random) -> list[tuple[float, cache_sim.Model]]:
    """Zipf(1.0) over `models`; halfway through, the popularity order is drawn anew."""
    weights = [1.0 / (rank + 1) for rank in range(len(models))]
    trace: list[tuple[float, cache_sim.Model]] = []
    for half in range(2):
        order = models[:]
        rng.shuffle(order)
        count = requests // 2 if half == 0 else requests - requests // 2
        for model in rng.choices(order, weights=weights, k=count):
            trace.append((len(trace) / ARRIVALS_PER_S, model))
    return trace


def run(seed: int, requests: int) -> dict[str, float]:
    rng = random.Random(seed)
    models = catalog(30, rng)
    trace = shifting_zipf(models, requests, rng)
    demand: dict[str, DecayedCount] = {}
    pods = [cache_sim.PolicyPod(f"http://worker-{i}", WORKER_BUDGET, EvictionPolicy(), demand) for i in range(WORKERS)]
    cache_sim.routed(pods, trace)
    lru = cache_sim.LruPod("http://cluster", WORKERS * WORKER_BUDGET)
    for now, model in trace:
        lru.serve(model, now)
    offline_loads, offline_seconds = cache_sim.offline_bound(trace, WORKERS * WORKER_BUDGET)
    return {
        "router_s": sum(p.load_seconds for p in pods), "router_loads": sum(p.loads for p in pods),
        "lru_s": lru.load_seconds, "lru_loads": lru.loads,
        "offline_s": offline_seconds, "offline_loads": offline_loads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    print(f"{WORKERS} workers x {WORKER_BUDGET // MiB} MiB, 30 models of 200 MiB-2 GiB loading in 0.05-2 s, "
          f"Zipf(1.0) shifting halfway, {args.requests} requests")
    print("| seed | router load s (loads) | one LRU load s (loads) | offline load s (loads) | router vs LRU | router / offline |")
    print("|---|---|---|---|---|---|")
    savings, gaps = [], []
    for seed in (int(s) for s in args.seeds.split(",")):
        r = run(seed, args.requests)
        saving = 1 - r["router_s"] / r["lru_s"]
        gap = r["router_s"] / r["offline_s"]
        savings.append(saving)
        gaps.append(gap)
        print(f"| {seed} | {r['router_s']:.0f} ({r['router_loads']}) | {r['lru_s']:.0f} ({r['lru_loads']}) | "
              f"{r['offline_s']:.0f} ({r['offline_loads']}) | {saving:+.0%} | {gap:.2f} |")
    print(f"mean: router spends {statistics.fmean(savings):.0%} fewer load seconds than one whole-cluster LRU "
          f"(target >= 30%), {statistics.fmean(gaps):.2f}x the offline bound (target <= 1.3)")


if __name__ == "__main__":
    main()
