#!/usr/bin/env python3
"""What checking callers adds to a routed request: ``Callers.check`` off, and on with its answers cached.

The router calls ``Callers.check`` once per request, before routing
(forwarding.py). Off (``--auth none``) it only compares the namespace a
request names; on (``--auth kubernetes``) it also hashes the bearer token and
reads two caches, and asks the API server only on a miss. This times the
check itself in one process, the three ways side by side, rounds alternating
(thread CPU time per check, and wall time per check with the event loop's
overhead of one ``await``):

- off;
- on, every answer cached (the hot path: one token, models of 2 namespaces);
- on, a miss each time (a stand-in for the API server that answers at once:
  what a review costs the router beside the API call itself, a thread hop).

The end-to-end figure with real HTTP is router_overhead.py, whose router
runs with callers off; the API server's own latency on a miss is the real
cluster's (test_callers_kubernetes.py asks a real one).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "common"), str(ROOT / "router")]

from hotset_router.callers import AuthMode, Caller, CallerSettings, Callers  # noqa: E402

OWNERS = {f"m{i}": f"team-{i % 2}" for i in range(1000)}
HEADERS = {"authorization": "Bearer " + "x" * 900, "content-type": "application/json"}  # a token's usual length


class InstantReviews:
    """Stand-in for the API server: everyone is ``app`` and may call everything, answered at once."""

    def who(self, token: str) -> Caller | None:
        return Caller("system:serviceaccount:team-0:app", "uid", ("system:serviceaccounts",))

    def may(self, caller: Caller, namespace: str, name: str | None) -> bool:
        return True


async def time_checks(callers: Callers, count: int) -> tuple[float, float]:
    """(CPU microseconds, wall microseconds) per check, over `count` checks of models in turn."""
    models = list(OWNERS)
    cpu, wall = time.thread_time(), time.perf_counter()
    for i in range(count):
        await callers.check(HEADERS, models[i % len(models)])
    return ((time.thread_time() - cpu) / count * 1e6, (time.perf_counter() - wall) / count * 1e6)


def build(kind: str) -> Callers:
    if kind == "off":
        return Callers(None, OWNERS.get)
    settings = CallerSettings(mode=AuthMode.KUBERNETES,
                              cache_s=3600 if kind == "on-cached" else 0, refused_cache_s=0)
    return Callers(InstantReviews(), OWNERS.get, settings)


async def main_async(args: argparse.Namespace) -> None:
    kinds = ["off", "on-cached", "on-miss"]
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    checkers = {kind: build(kind) for kind in kinds}
    await time_checks(checkers["on-cached"], len(OWNERS))  # fills the cache
    for round_ in range(args.rounds):
        for kind in (kinds if round_ % 2 == 0 else kinds[::-1]):
            count = args.checks if kind != "on-miss" else max(1, args.checks // 20)
            results[kind].append(await time_checks(checkers[kind], count))
    off_cpu = statistics.median(cpu for cpu, _ in results["off"])
    print(f"{'check':<12} {'CPU us/check':>13} {'wall us/check':>14} {'CPU x off':>10}")
    for kind in kinds:
        cpu = statistics.median(c for c, _ in results[kind])
        wall = statistics.median(w for _, w in results[kind])
        print(f"{kind:<12} {cpu:>13.2f} {wall:>14.2f} {cpu / off_cpu:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checks", type=int, default=200_000, help="checks per round (a twentieth for misses)")
    parser.add_argument("--rounds", type=int, default=4)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
