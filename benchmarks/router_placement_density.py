#!/usr/bin/env python3
"""Placement density: pods used by the router's best-fit placement vs the lower bound and spread-first.

Models of varied sizes (seeded) are placed one after another on a pool of
identical empty pods with the router's real placement functions
(``placement.place_cold`` and ``placement.spread_first``). A pod is "used"
when it holds at least one model; the lower bound is
ceil(total bytes / pod capacity). Prints one table row per scenario.
"""
from __future__ import annotations

import argparse
import math
import random

from hotset_router import placement

MiB = 2**20


def place_all(sizes: list[int], pods: int, capacity: int, choose) -> int | None:
    """Pods used after placing every model with `choose`; None if some model did not fit."""
    free = {f"http://pod-{i}": capacity for i in range(pods)}
    held: dict[str, int] = {url: 0 for url in free}
    for index, size in enumerate(sizes):
        rooms = [placement.PodRoom(url, url, free[url], capacity) for url in free]
        decision = choose(f"model-{index}", size, rooms)
        if decision is None or decision.reason != "fit":
            return None
        free[decision.url] -= size
        held[decision.url] += 1
    return sum(1 for n in held.values() if n)


def scenario(seed: int, models: int, capacity: int, low: int, high: int) -> dict[str, float]:
    rng = random.Random(seed)
    sizes = [rng.randint(low, high) * MiB for _ in range(models)]
    bound = math.ceil(sum(sizes) / capacity)
    pool = bound * 2 + 2
    settings = placement.PlacementSettings(granularity_bytes=MiB)
    best = place_all(sizes, pool, capacity, lambda m, n, r: placement.place_cold(m, n, r, settings))
    spread = place_all(sizes, pool, capacity, placement.spread_first)
    return {"total_gib": sum(sizes) / 2**30, "pool": pool, "bound": bound, "best_fit": best, "spread_first": spread}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    capacity = 16 * 1024 * MiB
    rows = [
        ("40 models 200Mi-3Gi", scenario(args.seed, 40, capacity, 200, 3072)),
        ("100 models 100Mi-2Gi", scenario(args.seed + 1, 100, capacity, 100, 2048)),
        ("60 models 1Gi-6Gi", scenario(args.seed + 2, 60, capacity, 1024, 6144)),
    ]
    print(f"placement density, pods of {capacity // 2**30} GiB, arrival order = seeded random, seed {args.seed}")
    print(f"{'scenario':<24}{'total GiB':>10}{'pool':>6}{'bound':>7}{'best-fit':>10}{'spread':>8}{'best/bound':>12}")
    for name, row in rows:
        print(f"{name:<24}{row['total_gib']:>10.1f}{row['pool']:>6}{row['bound']:>7}{row['best_fit']:>10}{row['spread_first']:>8}"
              f"{row['best_fit'] / row['bound']:>12.2f}")


if __name__ == "__main__":
    main()
